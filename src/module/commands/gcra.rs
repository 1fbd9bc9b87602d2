//! `RL.GCRA key burst rate period [QUANTITY n] [PEEK] [MAXWAIT ms]`.

use std::ffi::c_int;

use redis_module::raw;

use super::limit::{self, Spec};
use super::{five, once, unknown, Args, Options, RequestOptions};
use crate::algo::gcra::GcraRequest;
use crate::module::clock;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::params::{self, GcraParams};
use crate::time::NANOS_PER_MILLI;

/// A fully validated RL.GCRA call.
struct GcraCall {
    key: *mut raw::RedisModuleString,
    params: GcraParams,
    request: GcraRequest,
    peek: bool,
}

fn parse(args: Args<'_>) -> Result<GcraCall, CommandError> {
    let [_, key, burst, rate, period, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.gcra"));
    };
    let burst = params::positive(unsafe { ffi::bytes(*burst) }, "burst")?;
    let rate = params::positive(unsafe { ffi::bytes(*rate) }, "rate")?;
    let period_ns = params::seconds(unsafe { ffi::bytes(*period) }, "period")?;
    let params = GcraParams::new(burst, rate, period_ns)?;
    let (mut max_wait_ns, mut seen_max_wait) = (None, false);
    let mut request = RequestOptions::default();
    let mut options = Options::new(rest);
    while let Some(keyword) = options.next_keyword() {
        if request.take(keyword, &mut options)? {
            continue;
        } else if keyword.eq_ignore_ascii_case(b"MAXWAIT") {
            once(&mut seen_max_wait, "MAXWAIT")?;
            let ms = params::non_negative(options.value("MAXWAIT")?, "MAXWAIT")?;
            max_wait_ns = Some(ms.saturating_mul(NANOS_PER_MILLI));
        } else {
            return Err(unknown(keyword));
        }
    }
    let gcra_request = GcraRequest {
        quantity: request.quantity,
        max_wait_ns,
    };
    Ok(GcraCall {
        key: *key,
        params,
        request: gcra_request,
        peek: request.peek,
    })
}

/// Runs RL.GCRA (see SPEC.md). The reply is the five-integer array.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<(c_int, bool), CommandError> {
    let call = parse(args)?;
    let now_ns = clock::now_ns();
    let may_write = !call.peek && call.request.quantity > 0;
    let mut key = LimiterKey::open(ctx, call.key, may_write);
    let spec = Spec::Gcra {
        params: call.params,
        max_wait_ns: call.request.max_wait_ns,
    };
    let evaluated = limit::evaluate(&mut key, &spec, now_ns, call.request.quantity)?;
    if let (true, Some(write)) = (may_write, &evaluated.write) {
        limit::commit(&mut key, write, evaluated.expire_at_ms, c"rl.gcra");
    }
    drop(key);
    let status = ffi::reply_integers(ctx, &five(&evaluated.decision));
    Ok((status, evaluated.decision.verdict.is_allowed()))
}
