//! `RL.APPLY key blob`: the internal command that carries a write's effect to replicas and
//! the AOF. The blob (see `codec`) holds an optional absolute expiry and the effect: a state
//! (stored exactly) or a LOG append/refund (applied exactly, with its explicit instant); no
//! clock is read. Normal clients get an error: only the master's
//! replication stream and AOF loading may send it.

use std::ffi::c_int;

use redis_module::raw;

use super::Args;
use crate::algo::sliding_log::LogState;
use crate::codec::{self, Effect, State};
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::module::value::Value;
use crate::params::WindowParams;

/// Runs RL.APPLY.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<c_int, CommandError> {
    let gate = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if ffi::context_flags(ctx) & gate == 0 {
        return Err(CommandError::InternalOnly("RL.APPLY"));
    }
    let [_, key, blob] = args else {
        return Err(CommandError::Arity("rl.apply"));
    };
    let (effect, expire_at_ms) =
        codec::decode_applied(unsafe { ffi::bytes(*blob) }).map_err(CommandError::BadState)?;
    let key = *key;
    let mut limiter = LimiterKey::open(ctx, key, true);
    let mut deleted = false;
    match effect {
        Effect::Replace(state) => limiter.put(state),
        Effect::LogAppend(write) => match limiter.load() {
            Ok(Some(Value::Log(log))) => log.apply(&write),
            _ => {
                let params = WindowParams {
                    limit: write.limit,
                    window_ns: write.window_ns,
                };
                let mut state = LogState::new(&params);
                state.apply(&write);
                limiter.set_value(State::Log(Box::new(state)));
            }
        },
        Effect::LogRefund { at_ns, quantity } => {
            if let Ok(Some(Value::Log(log))) = limiter.load() {
                log.refund(at_ns, quantity);
                if log.log.total() == 0 {
                    limiter.delete();
                    deleted = true;
                }
            }
        }
    }
    if let (Some(ms), false) = (expire_at_ms, deleted) {
        limiter.set_expire_at(ms);
    }
    limiter.signal(c"rl.apply");
    drop(limiter);
    // A replica with its own AOF records the effect as is.
    if let Some(verbatim) = unsafe { raw::RedisModule_ReplicateVerbatim } {
        unsafe { verbatim(ctx) };
    }
    Ok(ffi::reply_simple(ctx, c"OK"))
}
