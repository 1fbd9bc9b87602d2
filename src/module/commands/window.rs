//! `RL.WINDOW key limit window [FIXED | SLIDING | LOG] [QUANTITY n] [PEEK]`.

use std::ffi::c_int;

use redis_module::raw;

use super::limit::{self, Algorithm, Spec};
use super::{five, once, unknown, Args, Options, RequestOptions};
use crate::module::clock;
use crate::module::config;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::params::{self, WindowParams};

/// Checks LOG's limit against `rl.log-max-limit`.
pub fn check_log_limit(algorithm: Algorithm, limit: u64) -> Result<(), CommandError> {
    let max = config::log_max_limit();
    if algorithm == Algorithm::Log && limit > max {
        return Err(CommandError::LogLimitTooHigh { limit, max });
    }
    Ok(())
}

/// A fully validated RL.WINDOW call.
struct WindowCall {
    key: *mut raw::RedisModuleString,
    spec: Spec,
    request: RequestOptions,
}

fn parse(args: Args<'_>) -> Result<WindowCall, CommandError> {
    let [_, key, limit, window, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.window"));
    };
    let limit = params::positive(unsafe { ffi::bytes(*limit) }, "limit")?;
    let window_ns = params::seconds(unsafe { ffi::bytes(*window) }, "window")?;
    let params = WindowParams::new(limit, window_ns)?;
    let (mut algorithm, mut seen_algorithm) = (None, false);
    let mut request = RequestOptions::default();
    let mut options = Options::new(rest);
    while let Some(keyword) = options.next_keyword() {
        if let Some(a) = Algorithm::parse(keyword) {
            once(&mut seen_algorithm, "the algorithm (FIXED | SLIDING | LOG)")?;
            algorithm = Some(a);
        } else if !request.take(keyword, &mut options)? {
            return Err(unknown(keyword));
        }
    }
    let algorithm = algorithm.unwrap_or(Algorithm::Sliding);
    check_log_limit(algorithm, limit)?;
    Ok(WindowCall {
        key: *key,
        spec: Spec::Window { params, algorithm },
        request,
    })
}

/// Runs RL.WINDOW (see SPEC.md). The reply is the five-integer array.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<(c_int, bool), CommandError> {
    let call = parse(args)?;
    let now_ns = clock::now_ns();
    let may_write = call.request.may_write();
    let mut key = LimiterKey::open(ctx, call.key, may_write);
    let evaluated = limit::evaluate(&mut key, &call.spec, now_ns, call.request.quantity)?;
    if let (true, Some(write)) = (may_write, &evaluated.write) {
        limit::commit(&mut key, write, evaluated.expire_at_ms, c"rl.window");
    }
    drop(key);
    let status = ffi::reply_integers(ctx, &five(&evaluated.decision));
    Ok((status, evaluated.decision.verdict.is_allowed()))
}
