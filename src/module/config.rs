//! Module configuration: `rl.log-max-limit`, settable with `CONFIG SET`, `MODULE LOADEX …
//! CONFIG`, and `MODULE LOAD path log-max-limit N`.

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

/// Default of `rl.log-max-limit`: the largest `limit` RL.WINDOW … LOG accepts.
pub const LOG_MAX_LIMIT_DEFAULT: u64 = 100_000;
/// Range of `rl.log-max-limit`. At the maximum a LOG key holds at most 10 M requests
/// (roughly 40 MB at 4 bytes per request).
pub const LOG_MAX_LIMIT_RANGE: (u64, u64) = (1, 10_000_000);

static LOG_MAX_LIMIT: AtomicU64 = AtomicU64::new(LOG_MAX_LIMIT_DEFAULT);

/// The current `rl.log-max-limit`.
pub fn log_max_limit() -> u64 {
    LOG_MAX_LIMIT.load(Ordering::Relaxed)
}

extern "C" fn get_log_max_limit(_name: *const c_char, _priv: *mut c_void) -> c_longlong {
    log_max_limit() as c_longlong
}

extern "C" fn set_log_max_limit(
    _name: *const c_char,
    val: c_longlong,
    _priv: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // Redis checks the range registered below before calling this.
    match u64::try_from(val) {
        Ok(v) => {
            LOG_MAX_LIMIT.store(v, Ordering::Relaxed);
            raw::Status::Ok as c_int
        }
        Err(_) => raw::Status::Err as c_int,
    }
}

/// Reads the module arguments (`log-max-limit N`, name case-insensitive, optionally with the
/// `rl.` prefix) into the defaults. Errors name the bad argument.
pub fn apply_module_args(args: &[&[u8]]) -> Result<(), String> {
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        let shown = String::from_utf8_lossy(name).into_owned();
        let plain = name.strip_prefix(b"rl.").unwrap_or(name);
        if !plain.eq_ignore_ascii_case(b"log-max-limit") {
            return Err(format!(
                "unknown module argument '{shown}' (known: log-max-limit N)"
            ));
        }
        let value = rest
            .next()
            .ok_or_else(|| format!("module argument '{shown}' needs a value"))?;
        let (lo, hi) = LOG_MAX_LIMIT_RANGE;
        match crate::time::parse_count(value) {
            Some(v) if (lo..=hi).contains(&v) => LOG_MAX_LIMIT.store(v, Ordering::Relaxed),
            _ => {
                return Err(format!(
                    "module argument log-max-limit must be an integer from {lo} to {hi}, got '{}'",
                    String::from_utf8_lossy(value)
                ))
            }
        }
    }
    Ok(())
}

/// Registers the configs (defaults from the module arguments) and loads values given with
/// `MODULE LOADEX … CONFIG` or in the config file.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    let name: &CStr = c"log-max-limit";
    let (lo, hi) = LOG_MAX_LIMIT_RANGE;
    // SAFETY: `ctx` is the load context; the name is a NUL-terminated static; the getter and
    // setter have the signatures Redis expects and need no private data.
    let status = unsafe {
        let register = raw::RedisModule_RegisterNumericConfig
            .ok_or("this server has no module configuration API")?;
        register(
            ctx,
            name.as_ptr(),
            log_max_limit() as c_longlong,
            raw::REDISMODULE_CONFIG_DEFAULT,
            lo as c_longlong,
            hi as c_longlong,
            Some(get_log_max_limit),
            Some(set_log_max_limit),
            None,
            std::ptr::null_mut(),
        )
    };
    if status != raw::Status::Ok as c_int {
        return Err("cannot register config rl.log-max-limit".into());
    }
    // SAFETY: `ctx` is the load context, after every config is registered.
    let loaded = unsafe { raw::RedisModule_LoadConfigs.map(|load| load(ctx)) };
    if loaded.is_some_and(|status| status != raw::Status::Ok as c_int) {
        return Err("invalid value for a rl.* config (see the lines above)".into());
    }
    Ok(())
}
