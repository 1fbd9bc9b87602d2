//! `CL.THROTTLE key max_burst count_per_period period [quantity]`: a drop-in for redis-cell's
//! command, on the same GCRA core, native type, TTL and replication as RL.GCRA (a key written
//! by one is read by the other). redis-cell's meaning of the arguments: capacity
//! `max_burst + 1`, `count_per_period` requests per `period` integer seconds. Reply:
//! `[limited (0 allowed, 1 limited), limit (= max_burst + 1), remaining, retry_after_s (-1 when
//! allowed), reset_after_s]`, seconds rounded up.

use std::ffi::c_int;

use redis_module::raw;

use super::limit::{self, Spec};
use super::{as_reply_int, Args};
use crate::decision::Verdict;
use crate::module::clock;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::params::{self, GcraParams, ParamError};
use crate::time::{ceil_s, MAX_PERIOD_NS, NANOS_PER_SEC};

/// Runs CL.THROTTLE.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<(c_int, bool), CommandError> {
    let (key, max_burst, count, period, quantity) = match args {
        [_, k, b, c, p] => (*k, *b, *c, *p, None),
        [_, k, b, c, p, q] => (*k, *b, *c, *p, Some(*q)),
        _ => return Err(CommandError::Arity("cl.throttle")),
    };
    let max_burst = params::non_negative(unsafe { ffi::bytes(max_burst) }, "max_burst")?;
    let burst = max_burst.checked_add(1).ok_or(ParamError::BurstTooLarge)?;
    let count = params::positive(unsafe { ffi::bytes(count) }, "count_per_period")?;
    let period_s = params::positive(unsafe { ffi::bytes(period) }, "period")?;
    let period_ns = period_s
        .checked_mul(NANOS_PER_SEC)
        .filter(|&ns| ns <= MAX_PERIOD_NS)
        .ok_or(CommandError::Syntax(
            "period must be whole seconds from 1 to 315360000".into(),
        ))?;
    let quantity = match quantity {
        Some(q) => params::non_negative(unsafe { ffi::bytes(q) }, "quantity")?,
        None => 1,
    };
    let params = GcraParams::new(burst, count, period_ns)?;
    let now_ns = clock::now_ns();
    let may_write = quantity > 0;
    let mut key = LimiterKey::open(ctx, key, may_write);
    let evaluated = limit::evaluate(
        &mut key,
        &Spec::Gcra {
            params,
            max_wait_ns: None,
        },
        now_ns,
        quantity,
    )?;
    if let (true, Some(write)) = (may_write, &evaluated.write) {
        limit::commit(&mut key, write, evaluated.expire_at_ms, c"cl.throttle");
    }
    drop(key);
    let d = evaluated.decision;
    let retry_after_s = match d.verdict {
        Verdict::Denied { retry_after_ns } => as_reply_int(ceil_s(retry_after_ns).max(1)),
        _ => -1,
    };
    let status = ffi::reply_integers(
        ctx,
        &[
            i64::from(!d.verdict.is_allowed()),
            as_reply_int(d.limit),
            as_reply_int(d.remaining),
            retry_after_s,
            as_reply_int(ceil_s(d.reset_after_ns)),
        ],
    );
    Ok((status, d.verdict.is_allowed()))
}
