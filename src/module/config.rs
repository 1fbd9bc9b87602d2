//! Module configuration: `rl.log-max-limit`, `rl.lease-max-limit` and `rl.all-max-keys`,
//! settable with `CONFIG SET`, `MODULE LOADEX … CONFIG`, and module arguments (`MODULE LOAD
//! path log-max-limit N`).

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

/// One numeric configuration.
struct Config {
    /// Its name without the module's `rl.` prefix.
    name: &'static CStr,
    default: u64,
    range: (u64, u64),
    value: AtomicU64,
}

impl Config {
    const fn new(name: &'static CStr, default: u64, range: (u64, u64)) -> Self {
        Self {
            name,
            default,
            range,
            value: AtomicU64::new(default),
        }
    }
}

const LOG: usize = 0;
const LEASE: usize = 1;
const ALL: usize = 2;

/// The configurations, in registration order.
///
/// * `rl.log-max-limit` (default 100,000, 1 to 10,000,000): the largest `limit` RL.WINDOW …
///   LOG accepts; at the maximum a LOG key holds 10 M requests (about 40 MB).
/// * `rl.lease-max-limit` (default 10,000, 1 to 1,000,000): the largest `limit` RL.LEASE (and
///   `LEASE` specs) accept; a LEASE key holds at most that many leases, 17 bytes plus the
///   token each.
/// * `rl.all-max-keys` (default 64, 1 to 10,000): the largest `numkeys` RL.ALL accepts, so
///   that no single call holds the server for long.
static CONFIGS: [Config; 3] = [
    Config::new(c"log-max-limit", 100_000, (1, 10_000_000)),
    Config::new(c"lease-max-limit", 10_000, (1, 1_000_000)),
    Config::new(c"all-max-keys", 64, (1, 10_000)),
];

/// The current `rl.log-max-limit`.
pub fn log_max_limit() -> u64 {
    CONFIGS[LOG].value.load(Ordering::Relaxed)
}

/// The current `rl.lease-max-limit`.
pub fn lease_max_limit() -> u64 {
    CONFIGS[LEASE].value.load(Ordering::Relaxed)
}

/// The current `rl.all-max-keys`.
pub fn all_max_keys() -> u64 {
    CONFIGS[ALL].value.load(Ordering::Relaxed)
}

extern "C" fn get<const I: usize>(_name: *const c_char, _priv: *mut c_void) -> c_longlong {
    CONFIGS[I].value.load(Ordering::Relaxed) as c_longlong
}

extern "C" fn set<const I: usize>(
    _name: *const c_char,
    val: c_longlong,
    _priv: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // Redis checks the range registered below before calling this.
    match u64::try_from(val) {
        Ok(v) => {
            CONFIGS[I].value.store(v, Ordering::Relaxed);
            raw::Status::Ok as c_int
        }
        Err(_) => raw::Status::Err as c_int,
    }
}

/// Reads the module arguments (`log-max-limit N`, `lease-max-limit N`, `all-max-keys N`; names
/// case-insensitive, optionally with the `rl.` prefix) into the defaults. Errors name the
/// bad argument.
pub fn apply_module_args(args: &[&[u8]]) -> Result<(), String> {
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        let shown = String::from_utf8_lossy(name).into_owned();
        let plain = name.strip_prefix(b"rl.").unwrap_or(name);
        let Some(config) = CONFIGS
            .iter()
            .find(|c| plain.eq_ignore_ascii_case(c.name.to_bytes()))
        else {
            return Err(format!(
                "unknown module argument '{shown}' (known: log-max-limit N, lease-max-limit N, \
                 all-max-keys N)"
            ));
        };
        let value = rest
            .next()
            .ok_or_else(|| format!("module argument '{shown}' needs a value"))?;
        let (lo, hi) = config.range;
        match crate::time::parse_count(value) {
            Some(v) if (lo..=hi).contains(&v) => config.value.store(v, Ordering::Relaxed),
            _ => {
                return Err(format!(
                    "module argument {} must be an integer from {lo} to {hi}, got '{}'",
                    config.name.to_string_lossy(),
                    String::from_utf8_lossy(value)
                ))
            }
        }
    }
    Ok(())
}

/// Registers one config, its default taken from the module arguments.
fn register_one<const I: usize>(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    let config = &CONFIGS[I];
    let (lo, hi) = config.range;
    let initial = config.value.load(Ordering::Relaxed);
    debug_assert!((lo..=hi).contains(&config.default));
    // SAFETY: `ctx` is the load context; the name is a NUL-terminated static; the getter and
    // setter have the signatures Redis expects and need no private data.
    let status = unsafe {
        let register = raw::RedisModule_RegisterNumericConfig
            .ok_or("this server has no module configuration API")?;
        register(
            ctx,
            config.name.as_ptr(),
            initial as c_longlong,
            raw::REDISMODULE_CONFIG_DEFAULT,
            lo as c_longlong,
            hi as c_longlong,
            Some(get::<I>),
            Some(set::<I>),
            None,
            std::ptr::null_mut(),
        )
    };
    if status != raw::Status::Ok as c_int {
        return Err(format!(
            "cannot register config rl.{}",
            config.name.to_string_lossy()
        ));
    }
    Ok(())
}

/// Registers the configs (defaults from the module arguments) and loads values given with
/// `MODULE LOADEX … CONFIG` or in the config file.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    register_one::<LOG>(ctx)?;
    register_one::<LEASE>(ctx)?;
    register_one::<ALL>(ctx)?;
    // SAFETY: `ctx` is the load context, after every config is registered.
    let loaded = unsafe { raw::RedisModule_LoadConfigs.map(|load| load(ctx)) };
    if loaded.is_some_and(|status| status != raw::Status::Ok as c_int) {
        return Err("invalid value for a rl.* config (see the lines above)".into());
    }
    Ok(())
}
