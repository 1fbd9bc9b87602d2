//! `RL.REFUND key quantity`: gives back up to `quantity` requests to a limiter key of any
//! algorithm. Reply: `[refunded, remaining, reset_after_ms]`.

use std::ffi::c_int;

use redis_module::raw;

use super::{as_reply_int, expire_at_ms, Args};
use crate::algo::{fixed_window, gcra, sliding_log, sliding_window};
use crate::codec::{self, State};
use crate::decision::Decision;
use crate::module::clock;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::module::value::Value;
use crate::params::{self, GcraParams, WindowParams};
use crate::time::ceil_ms;

const EVENT: &std::ffi::CStr = c"rl.refund";

fn reply(ctx: *mut raw::RedisModuleCtx, refunded: u64, status: Option<Decision>) -> c_int {
    let (remaining, reset) = status.map_or((0, 0), |d| (d.remaining, d.reset_after_ns));
    ffi::reply_integers(
        ctx,
        &[
            as_reply_int(refunded),
            as_reply_int(remaining),
            as_reply_int(ceil_ms(reset)),
        ],
    )
}

/// The state's own report (remaining, reset) at `now_ns`, under the parameters it stores.
fn status(state: &State, now_ns: u64) -> Option<Decision> {
    match state {
        State::Gcra(g) => {
            let p = GcraParams::from_interval(g.burst, g.emission_interval_ns).ok()?;
            gcra::decide(&p, Some(g), now_ns, gcra::GcraRequest::of(0))
                .ok()
                .map(|o| o.decision)
        }
        State::Fixed(s) => {
            let p = WindowParams::new(s.limit, s.window_ns).ok()?;
            fixed_window::decide(&p, Some(s), now_ns, 0)
                .ok()
                .map(|o| o.decision)
        }
        State::Sliding(s) => {
            let p = WindowParams::new(s.limit, s.window_ns).ok()?;
            sliding_window::decide(&p, Some(s), now_ns, 0)
                .ok()
                .map(|o| o.decision)
        }
        State::Log(s) => {
            let p = WindowParams::new(s.limit, s.window_ns).ok()?;
            sliding_log::decide(&p, Some(s), now_ns, 0)
                .ok()
                .map(|o| o.decision)
        }
    }
}

/// Runs RL.REFUND (see SPEC.md).
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<(c_int, bool), CommandError> {
    let [_, key, quantity] = args else {
        return Err(CommandError::Arity("rl.refund"));
    };
    let quantity = params::positive(unsafe { ffi::bytes(*quantity) }, "quantity")?;
    let now_ns = clock::now_ns();
    let mut key = LimiterKey::open(ctx, *key, true);
    // LOG refunds in place; the others compute a new state.
    let (refunded, new_state) = match key.load()? {
        None => return Ok((reply(ctx, 0, None), false)),
        Some(Value::Log(log)) => {
            // Nothing in the window: nothing to give back, and nothing is touched (so master
            // and replicas keep identical logs).
            let p = WindowParams {
                limit: log.limit,
                window_ns: log.window_ns,
            };
            if log.log.count_after(now_ns.checked_sub(log.window_ns)) == 0 {
                let report = sliding_log::decide(&p, Some(log), now_ns, 0)?.decision;
                return Ok((reply(ctx, 0, Some(report)), false));
            }
            let refunded = log.refund(now_ns, quantity);
            if log.log.total() == 0 {
                key.delete();
                key.announce_delete(EVENT);
                return Ok((reply_idle(ctx, refunded, p.limit), true));
            }
            let reset = sliding_log::decide(&p, Some(log), now_ns, 0)?.decision;
            let expire = expire_at_ms(now_ns.saturating_add(reset.reset_after_ns));
            key.set_expire_at(expire);
            key.announce(
                |buf| codec::encode_log_refund_into(now_ns, quantity, buf),
                expire,
                EVENT,
            );
            return Ok((reply(ctx, refunded, Some(reset)), true));
        }
        Some(Value::Gcra(g)) => {
            let (after, n) = gcra::refund(&g, now_ns, quantity);
            (n, (State::Gcra(g), after.map(State::Gcra)))
        }
        Some(Value::Fixed(s)) => {
            let (after, n) = fixed_window::refund(s, now_ns, quantity);
            (
                n,
                (
                    State::Fixed(Box::new(*s)),
                    after.map(|a| State::Fixed(Box::new(a))),
                ),
            )
        }
        Some(Value::Sliding(s)) => {
            let (after, n) = sliding_window::refund(s, now_ns, quantity);
            (
                n,
                (
                    State::Sliding(Box::new(*s)),
                    after.map(|a| State::Sliding(Box::new(a))),
                ),
            )
        }
    };
    let (before, after) = new_state;
    if refunded == 0 {
        return Ok((reply(ctx, 0, status(&before, now_ns)), false));
    }
    match after {
        None => {
            // Back to idle: the key goes, exactly as if it had expired.
            key.delete();
            key.announce_delete(EVENT);
            Ok((reply_idle(ctx, refunded, limit_of(&before)), true))
        }
        Some(state) => {
            // The same safety net as for every other write: never store what would not load.
            // The bytes checked are the bytes replicated.
            let bytes = codec::encode(&state);
            codec::decode(&bytes).map_err(|e| {
                CommandError::Internal(format!(
                    "refusing to store a state that would not load back ({e})"
                ))
            })?;
            let report = status(&state, now_ns);
            let reset_ns = report.map_or(0, |d| d.reset_after_ns);
            let expire = expire_at_ms(now_ns.saturating_add(reset_ns));
            key.put(state);
            key.set_expire_at(expire);
            key.announce(|buf| buf.extend_from_slice(&bytes), expire, EVENT);
            Ok((reply(ctx, refunded, report), true))
        }
    }
}

/// The reply for a key refunded back to idle (and deleted): everything remains.
fn reply_idle(ctx: *mut raw::RedisModuleCtx, refunded: u64, limit: u64) -> c_int {
    ffi::reply_integers(ctx, &[as_reply_int(refunded), as_reply_int(limit), 0])
}

/// The limit a state was last written under.
fn limit_of(state: &State) -> u64 {
    match state {
        State::Gcra(g) => g.burst,
        State::Fixed(s) => s.limit,
        State::Sliding(s) => s.limit,
        State::Log(s) => s.limit,
    }
}
