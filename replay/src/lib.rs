//! rl-replay: replay an access log through candidate rate limits and see who would have been
//! limited, with the module's own decide functions (the `redis_rl` pure core, called from
//! [`engine`] only).

pub mod clf;
pub mod engine;
pub mod input;
pub mod intern;
pub mod jsonl;
pub mod plot;
pub mod record;
pub mod replay;
pub mod report;
pub mod run;
pub mod suggest;
pub mod timestamp;
