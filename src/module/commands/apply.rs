//! `RL.APPLY key state [PXAT ms]`: the internal command that carries a write's effect to
//! replicas and the AOF. It stores the encoded state exactly (no clock is read) and, with
//! `PXAT`, the absolute expiry. Normal clients get an error: only the master's replication
//! stream and AOF loading may send it.

use std::ffi::c_int;

use redis_module::raw;

use crate::codec;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::time::parse_count;

/// Runs RL.APPLY.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<c_int, CommandError> {
    let gate = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if ffi::context_flags(ctx) & gate == 0 {
        return Err(CommandError::InternalOnly("RL.APPLY"));
    }
    let (key, state, expire_at_ms) = match args {
        [_, key, state] => (*key, *state, None),
        [_, key, state, keyword, ms] if unsafe { ffi::bytes(*keyword) }.eq_ignore_ascii_case(b"PXAT") => {
            let ms = parse_count(unsafe { ffi::bytes(*ms) })
                .and_then(|v| i64::try_from(v).ok())
                .ok_or(CommandError::Param(crate::params::ParamError::NotNonNegativeInteger("PXAT")))?;
            (*key, *state, Some(ms))
        }
        [_, _, _, keyword, ..] => return Err(super::unknown(unsafe { ffi::bytes(*keyword) })),
        _ => return Err(CommandError::Arity("rl.apply")),
    };
    let state = codec::decode(unsafe { ffi::bytes(state) }).map_err(CommandError::BadState)?;
    let mut limiter = LimiterKey::open(ctx, key, true);
    match expire_at_ms {
        Some(ms) => limiter.store(state, ms),
        None => limiter.store_keep_ttl(state),
    }
    limiter.signal(c"rl.apply");
    drop(limiter);
    // A replica with its own AOF (and its sub-replicas' backlog) records the effect as is.
    if let Some(verbatim) = unsafe { raw::RedisModule_ReplicateVerbatim } {
        unsafe { verbatim(ctx) };
    }
    Ok(ffi::reply_simple(ctx, c"OK"))
}

use super::Args;
