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
        flags: c"write",
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
        let applied = codec::decode_applied(blob.bytes()).map_err(CommandError::BadState)?;
        // The master's event; an effect that does not name one (an AOF rewrite's snapshot, a
        // blob from before version 3) gets the event of the command that writes such a state.
        let event = applied
            .event
            .unwrap_or_else(|| applied.effect.default_event());
        let mut limiter = call.open(*key, Access::Write);
        let deleted = match applied.effect {
            Effect::Replace(state) => {
                limiter.replace(state);
                false
            }
            Effect::Apply(write) => {
                limiter.store(&write);
                limiter.is_emptied()
            }
            Effect::Delete => true,
        };
        if deleted {
            limiter.delete();
        } else if let Some(ms) = applied.expire_at_ms {
            limiter.set_expire_at(ms);
        }
        limiter.signal(event);
        drop(limiter);
        // A replica with its own AOF records the effect as is.
        call.replicate_verbatim();
        call.reply_simple(c"OK");
        Ok(Counted::Allowed)
    }
}
