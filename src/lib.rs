//! redis-rl: native rate-limit commands for Redis.
//!
//! The crate has two halves. The **pure core** (every module but `module`) holds the
//! algorithms, parameters, decisions and the state codec as plain Rust: time is passed in as
//! nanoseconds since the Unix epoch, nothing reads a clock and nothing names a Redis type, so
//! `cargo test --lib --no-default-features` builds and tests all of it without the Redis crate.
//! The **glue** (`module`, behind the default `module` feature) parses arguments, reads the
//! server's clock once per command, loads and stores the native type, replicates the effect
//! and replies.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod algo;
pub mod codec;
pub mod decision;
pub mod limit;
pub mod params;
pub mod request_log;
pub mod state;
pub mod time;

// The glue is the one place allowed to use `unsafe` (see its module documentation); its
// command handlers forbid it again.
#[cfg(feature = "module")]
#[allow(unsafe_code)]
mod module;
