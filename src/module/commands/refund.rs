//! `RL.REFUND key quantity`: gives back up to `quantity` requests to a limiter key of any
//! algorithm. Reply: `[refunded, remaining, reset_after_ms]`.

use super::as_reply_int;
use crate::module::call::{Access, Call};
use crate::module::clock;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, INTEGER};
use crate::module::error::CommandError;
use crate::module::limits::check_storable;
use crate::module::stats::Counters;
use crate::params;
use crate::state::{Event, RefundAction};

/// RL.REFUND.
pub struct Refund;

static COUNTERS: Counters = Counters::new(c"refund");

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(c"quantity", INTEGER, c"requests to give back (>= 1)"),
];

impl Command for Refund {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.REFUND",
        display: "RL.REFUND",
        flags: c"write fast",
        arity: 3,
        keys: Keys::First,
        summary: c"Gives back requests to a limiter key of any algorithm",
        complexity: c"O(1); LOG: O(requests given back)",
        args: ARGS,
        acl: c"write fast",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let [_, key, quantity] = call.args() else {
            return Err(CommandError::Arity("rl.refund"));
        };
        let quantity = params::positive(quantity.bytes(), "quantity")?;
        let now = clock::now();
        let mut key = call.open(*key, Access::Write);
        let Some(stored) = key.load()? else {
            call.reply_integers(&[0, 0, 0]);
            return Ok(Counted::Denied);
        };
        let Some(refund) = stored.refund(now, quantity) else {
            return Err(CommandError::RefundOnLease {
                key: key.display_name(),
            });
        };
        let limit = stored.limit();
        let before = stored
            .report(now)
            .map_err(|o| CommandError::overflow(o, now))?;
        let reply = |refunded: u64, remaining: u64, reset_after: crate::time::Span| {
            call.reply_integers(&[
                as_reply_int(refunded),
                as_reply_int(remaining),
                as_reply_int(reset_after.ceil_ms()),
            ]);
        };
        match refund.action {
            RefundAction::Nothing => {
                reply(0, before.remaining, before.reset_after);
                Ok(Counted::Denied)
            }
            RefundAction::Delete => {
                // Back to idle: the key goes, exactly as if it had expired.
                key.delete();
                key.announce_delete(Event::Refund);
                reply(refund.refunded, limit, crate::time::Span::ZERO);
                Ok(Counted::Allowed)
            }
            RefundAction::Store(write) => {
                // The same safety net as for every other write: never store what would not
                // load back.
                check_storable(&write)?;
                key.store(&write);
                let after = match key.load()? {
                    Some(state) => state
                        .report(now)
                        .map_err(|o| CommandError::overflow(o, now))?,
                    None => before,
                };
                let expire_at_ms = now.saturating_add(after.reset_after).ceil_unix_ms();
                key.set_expire_at(expire_at_ms);
                key.announce(&write, expire_at_ms, Event::Refund);
                reply(refund.refunded, after.remaining, after.reset_after);
                Ok(Counted::Allowed)
            }
        }
    }
}
