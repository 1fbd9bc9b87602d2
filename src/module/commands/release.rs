//! `RL.RELEASE key token`: frees the lease named `token`. Reply: `[released, remaining,
//! reset_after_ms]`; releasing a lease that is not held (twice, or after it expired) frees 0
//! and changes nothing. A key whose last lease is released is deleted.

use super::as_reply_int;
use crate::algo::lease;
use crate::module::call::{Access, Call};
use crate::module::clock;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, STRING};
use crate::module::error::CommandError;
use crate::module::limits::check_storable;
use crate::module::stats::Counters;
use crate::params;
use crate::state::{Algorithm, Event, StateRef, Write};
use crate::time::Span;

/// RL.RELEASE.
pub struct Release;

static COUNTERS: Counters = Counters::new(c"release");

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(c"token", STRING, c"the holder whose lease ends"),
];

impl Command for Release {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.RELEASE",
        display: "RL.RELEASE",
        flags: c"write fast",
        arity: 3,
        keys: Keys::First,
        summary: c"Ends a lease of a concurrency limit, freeing its slots",
        complexity: c"O(N) for the N leases stored",
        args: ARGS,
        acl: c"write fast",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let [_, key, token] = call.args() else {
            return Err(CommandError::Arity("rl.release"));
        };
        let token = params::token(token.bytes())?;
        let now = clock::now();
        let mut key = call.open(*key, Access::Write);
        let state = match key.load()? {
            None => {
                call.reply_integers(&[0, 0, 0]);
                return Ok(Counted::Denied);
            }
            Some(StateRef::Lease(state)) => state,
            Some(other) => {
                return Err(CommandError::WrongAlgorithm {
                    key: key.display_name(),
                    held: other.algorithm(),
                    asked: Algorithm::Lease,
                })
            }
        };
        let limit = state.limit;
        let (released, write) = lease::release(state, now, &token);
        let Some(write) = write else {
            let report = state.report(limit, now);
            call.reply_integers(&[
                0,
                as_reply_int(report.remaining),
                as_reply_int(report.reset_after.ceil_ms()),
            ]);
            return Ok(Counted::Denied);
        };
        let write = Write::Lease(Box::new(write));
        check_storable(&write)?;
        key.store(&write);
        let (remaining, reset_after) = if key.is_emptied() {
            // The last lease is gone: the key goes, exactly as if it had expired.
            key.delete();
            key.announce_delete(Event::Release);
            (limit, Span::ZERO)
        } else {
            let report = match key.load()? {
                Some(StateRef::Lease(s)) => s.report(limit, now),
                _ => return Err(CommandError::Internal("a released lease key vanished".into())),
            };
            let expire_at_ms = now.saturating_add(report.reset_after).ceil_unix_ms();
            key.set_expire_at(expire_at_ms);
            key.announce(&write, expire_at_ms, Event::Release);
            (report.remaining, report.reset_after)
        };
        call.reply_integers(&[
            as_reply_int(released),
            as_reply_int(remaining),
            as_reply_int(reset_after.ceil_ms()),
        ]);
        Ok(Counted::Allowed)
    }
}
