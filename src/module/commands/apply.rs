//! `RL.APPLY key blob`: the internal command that carries a write's effect to replicas and
//! the AOF. The blob (see `codec`) holds an optional absolute expiry and the effect: a state
//! (stored exactly) or a LOG append/refund (applied exactly, with its explicit instant); no
//! clock is read. Normal clients get an error: only the master's replication stream and AOF
//! loading may send it.

use crate::codec;
use crate::module::call::{Access, Call};
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, STRING};
use crate::module::error::CommandError;
use crate::state::Effect;

/// RL.APPLY.
pub struct Apply;

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(
        c"effect",
        STRING,
        c"encoded effect (replication and AOF only)",
    ),
];

impl Command for Apply {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.APPLY",
        display: "RL.APPLY",
        flags: c"write deny-oom",
        arity: 3,
        keys: Keys::First,
        summary: c"Internal: stores a limiter state from the replication stream or AOF",
        complexity: c"O(1)",
        args: ARGS,
        acl: c"write",
        in_ratelimit_category: false,
        counters: None,
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        if !call.is_replicated_or_loading() {
            return Err(CommandError::InternalOnly("RL.APPLY"));
        }
        let [_, key, blob] = call.args() else {
            return Err(CommandError::Arity("rl.apply"));
        };
        let (effect, expire_at_ms) =
            codec::decode_applied(blob.bytes()).map_err(CommandError::BadState)?;
        let mut limiter = call.open(*key, Access::Write);
        match effect {
            Effect::Replace(state) => limiter.replace(state),
            Effect::Apply(write) => limiter.store(&write),
        }
        let deleted = limiter.is_empty_log();
        if deleted {
            limiter.delete();
        } else if let Some(ms) = expire_at_ms {
            limiter.set_expire_at(ms);
        }
        limiter.signal(c"rl.apply");
        drop(limiter);
        // A replica with its own AOF records the effect as is.
        call.replicate_verbatim();
        call.reply_simple(c"OK");
        Ok(Counted::Allowed)
    }
}
