//! `RL.APPLY key effect [PXAT ms]`: the internal command that carries a write's effect to
//! replicas and the AOF. The effect is a codec-encoded state (stored exactly) or a LOG
//! append/refund (applied exactly, with its explicit instant); no clock is read. With `PXAT`
//! the key gets that absolute expiry. Normal clients get an error: only the master's
//! replication stream and AOF loading may send it.

use std::ffi::c_int;

use redis_module::raw;

use super::Args;
use crate::algo::sliding_log::LogState;
use crate::codec::{self, Effect, State};
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::params::{ParamError, WindowParams};
use crate::time::parse_count;

/// Runs RL.APPLY.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<c_int, CommandError> {
    let gate = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if ffi::context_flags(ctx) & gate == 0 {
        return Err(CommandError::InternalOnly("RL.APPLY"));
    }
    let (key, effect, expire_at_ms) = match args {
        [_, key, effect] => (*key, *effect, None),
        [_, key, effect, keyword, ms]
            if unsafe { ffi::bytes(*keyword) }.eq_ignore_ascii_case(b"PXAT") =>
        {
            let ms = parse_count(unsafe { ffi::bytes(*ms) })
                .and_then(|v| i64::try_from(v).ok())
                .ok_or(CommandError::Param(ParamError::NotNonNegativeInteger("PXAT")))?;
            (*key, *effect, Some(ms))
        }
        [_, _, _, keyword, ..] => return Err(super::unknown(unsafe { ffi::bytes(*keyword) })),
        _ => return Err(CommandError::Arity("rl.apply")),
    };
    let effect = codec::decode_effect(unsafe { ffi::bytes(effect) }).map_err(CommandError::BadState)?;
    let mut limiter = LimiterKey::open(ctx, key, true);
    let mut deleted = false;
    match effect {
        Effect::Replace(state) => limiter.put(state),
        Effect::LogAppend(write) => match limiter.load() {
            Ok(Some(State::Log(log))) => log.apply(&write),
            _ => {
                let params = WindowParams { limit: write.limit, window_ns: write.window_ns };
                let mut state = LogState::new(&params);
                state.apply(&write);
                limiter.set_value(State::Log(Box::new(state)));
            }
        },
        Effect::LogRefund { at_ns, quantity } => {
            if let Ok(Some(State::Log(log))) = limiter.load() {
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
