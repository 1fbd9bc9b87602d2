//! The Redis glue: the only code that names `redis_module`, raw pointers, `unsafe` or a
//! clock. Entry points: `RedisModule_OnLoad`, the command handlers and the type callbacks,
//! each behind the panic boundary in [`guard`].

mod clock;
mod commands;
mod config;
mod data_type;
mod docs;
mod error;
mod ffi;
mod guard;
mod keys;
mod params_table;
mod stats;
mod value;

use std::ffi::{c_int, CStr};
use std::mem::MaybeUninit;

use redis_module::raw;

use ffi::Level;

/// Redis's allocator, so `used_memory` and `MEMORY USAGE` see the module's memory. Unit tests
/// of this crate run without a server, so they keep the system allocator.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: redis_module::alloc::RedisAlloc = redis_module::alloc::RedisAlloc;

/// The module's name as Redis knows it (`MODULE LIST`).
const MODULE_NAME: &CStr = c"rl";

/// The crate version as one integer, `major·10000 + minor·100 + patch` (0.1.0 → 100).
const MODULE_VERSION: c_int = {
    const fn num(s: &str) -> c_int {
        let b = s.as_bytes();
        let mut i = 0;
        let mut v: c_int = 0;
        while i < b.len() {
            v = v * 10 + (b[i] - b'0') as c_int;
            i += 1;
        }
        v
    }
    num(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + num(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + num(env!("CARGO_PKG_VERSION_PATCH"))
};

/// The oldest server this module supports: Redis 7.0 (key-specs, absolute expiry, options).
const MIN_SERVER_VERSION: c_int = 0x0007_0000;

/// Entry point called by `MODULE LOAD` / `loadmodule`.
///
/// # Safety
/// Called by Redis with a valid context and argument vector.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // Nothing may allocate before this call: it installs the allocator's functions.
    if raw::Export_RedisModule_Init(
        ctx,
        MODULE_NAME.as_ptr(),
        MODULE_VERSION,
        raw::REDISMODULE_APIVER_1 as c_int,
    ) == raw::Status::Err as c_int
    {
        // The API table is filled before the name check, so logging works here.
        ffi::log(
            ctx,
            Level::Warning,
            "redis-rl: module not loaded: a module named 'rl' is already loaded",
        );
        return raw::Status::Err as c_int;
    }
    let args = args(argv, argc);
    let loaded = guard::callback("OnLoad", Err("panic during load".to_owned()), || {
        on_load(ctx, args)
    });
    match loaded {
        Ok(()) => {
            ffi::log(
                ctx,
                Level::Notice,
                &format!(
                    "redis-rl {} loaded (rl.log-max-limit {})",
                    env!("CARGO_PKG_VERSION"),
                    config::log_max_limit()
                ),
            );
            raw::Status::Ok as c_int
        }
        Err(why) => {
            ffi::log(
                ctx,
                Level::Warning,
                &format!("redis-rl: module not loaded: {why}"),
            );
            raw::Status::Err as c_int
        }
    }
}

fn args<'a>(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> commands::Args<'a> {
    match usize::try_from(argc) {
        Ok(n) if n > 0 && !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    }
}

fn on_load(ctx: *mut raw::RedisModuleCtx, args: commands::Args<'_>) -> Result<(), String> {
    let version = unsafe { raw::RedisModule_GetServerVersion }.map(|f| unsafe { f() });
    match version {
        Some(v) if v >= MIN_SERVER_VERSION => {}
        Some(v) => {
            return Err(format!(
                "this server is version {}.{}.{}; redis-rl needs Redis 7.0 or newer (or Valkey)",
                v >> 16,
                (v >> 8) & 0xff,
                v & 0xff
            ))
        }
        None => {
            return Err("this server is older than 7.0; redis-rl needs Redis 7.0 or newer".into())
        }
    }
    let arg_bytes: Vec<&[u8]> = args.iter().map(|&a| unsafe { ffi::bytes(a) }).collect();
    config::apply_module_args(&arg_bytes)?;
    if let Some(set_options) = unsafe { raw::RedisModule_SetModuleOptions } {
        let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
            | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED
            | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD;
        unsafe { set_options(ctx, options as c_int) };
    }
    data_type::register(ctx)?;
    config::register(ctx)?;
    stats::register(ctx)?;
    let ratelimit_category = docs::add_acl_category(ctx);
    for spec in COMMANDS {
        register_command(ctx, spec, ratelimit_category)?;
    }
    #[cfg(debug_assertions)]
    register_command(ctx, &PANIC_COMMAND, false)?;
    Ok(())
}

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// No key.
    None,
    /// Argument 1 is the only key.
    First,
    /// Argument 1 is `numkeys`, the keys follow.
    NumKeys,
}

/// One command's registration data.
struct CommandSpec {
    name: &'static CStr,
    handler: unsafe extern "C" fn(
        *mut raw::RedisModuleCtx,
        *mut *mut raw::RedisModuleString,
        c_int,
    ) -> c_int,
    flags: &'static CStr,
    /// Redis arity: positive = exact, negative = at least.
    arity: c_int,
    /// Where the keys are.
    keys: Keys,
    summary: &'static CStr,
    complexity: &'static CStr,
    /// Arguments for COMMAND DOCS.
    args: &'static [docs::Arg],
    /// ACL categories where the server supports setting them (`ratelimit` is added when the
    /// server could register it).
    acl: &'static CStr,
}

macro_rules! handler {
    ($name:literal, $run:path) => {{
        unsafe extern "C" fn handle(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            guard::command(ctx, $name, || $run(ctx, args(argv, argc)))
        }
        handle
    }};
    ($name:literal, $run:path, $stat:expr) => {{
        unsafe extern "C" fn handle(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            guard::command(ctx, $name, || {
                let outcome = $run(ctx, args(argv, argc));
                stats::record($stat, outcome.as_ref().ok().map(|(_, allowed)| *allowed));
                outcome.map(|(status, _)| status)
            })
        }
        handle
    }};
}

/// RL.ALL's entry point: key-position requests (cluster routing on Redis 7.0) are answered
/// before anything else and are not counted as calls.
unsafe extern "C" fn rl_all(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let counted = handler!("RL.ALL", commands::all::run, stats::Command::All);
    let positions = guard::callback("RL.ALL keys", false, || {
        commands::all::report_key_positions(ctx, args(argv, argc))
    });
    if positions {
        return raw::Status::Ok as c_int;
    }
    counted(ctx, argv, argc)
}

const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: c"RL.GCRA",
        handler: handler!("RL.GCRA", commands::gcra::run, stats::Command::Gcra),
        flags: c"write deny-oom fast",
        arity: -5,
        keys: Keys::First,
        summary: c"GCRA (token bucket) rate limit: admit or deny a request of QUANTITY",
        complexity: c"O(1)",
        args: docs::GCRA,
        acl: c"write fast",
    },
    CommandSpec {
        name: c"RL.WINDOW",
        handler: handler!("RL.WINDOW", commands::window::run, stats::Command::Window),
        flags: c"write deny-oom fast",
        arity: -4,
        keys: Keys::First,
        summary:
            c"Window rate limit (FIXED, SLIDING counter or exact LOG): admit or deny a request",
        complexity: c"O(1); LOG: O(1) amortised, O(entries that left the window)",
        args: docs::WINDOW,
        acl: c"write fast",
    },
    CommandSpec {
        name: c"RL.ALL",
        handler: rl_all,
        flags: c"write deny-oom getkeys-api",
        arity: -5,
        keys: Keys::NumKeys,
        summary: c"Several limits in one atomic decision: admit on all keys or on none",
        complexity: c"O(N) for N keys (LOG: plus the entries that left the window)",
        args: docs::ALL,
        acl: c"write",
    },
    CommandSpec {
        name: c"RL.REFUND",
        handler: handler!("RL.REFUND", commands::refund::run, stats::Command::Refund),
        flags: c"write deny-oom fast",
        arity: 3,
        keys: Keys::First,
        summary: c"Gives back requests to a limiter key of any algorithm",
        complexity: c"O(1); LOG: O(requests given back)",
        args: docs::REFUND,
        acl: c"write fast",
    },
    CommandSpec {
        name: c"CL.THROTTLE",
        handler: handler!(
            "CL.THROTTLE",
            commands::throttle::run,
            stats::Command::Throttle
        ),
        flags: c"write deny-oom fast",
        arity: -5,
        keys: Keys::First,
        summary: c"redis-cell compatible GCRA: capacity max_burst + 1, count per period seconds",
        complexity: c"O(1)",
        args: docs::THROTTLE,
        acl: c"write fast",
    },
    CommandSpec {
        name: c"RL.APPLY",
        handler: handler!("RL.APPLY", commands::apply::run),
        flags: c"write deny-oom",
        arity: 3,
        keys: Keys::First,
        summary: c"Internal: stores a limiter state from the replication stream or AOF",
        complexity: c"O(1)",
        args: docs::APPLY,
        acl: c"write",
    },
];

#[cfg(debug_assertions)]
const PANIC_COMMAND: CommandSpec = CommandSpec {
    name: c"RL.PANIC",
    handler: handler!("RL.PANIC", commands::panic::run),
    flags: c"readonly",
    arity: 1,
    keys: Keys::None,
    summary: c"Debug builds only: panics on purpose",
    complexity: c"O(1)",
    args: &[],
    acl: c"",
};

fn register_command(
    ctx: *mut raw::RedisModuleCtx,
    spec: &CommandSpec,
    ratelimit_category: bool,
) -> Result<(), String> {
    let name = spec.name.to_string_lossy();
    let create = unsafe { raw::RedisModule_CreateCommand }.ok_or("no CreateCommand API")?;
    let key_pos = c_int::from(spec.keys == Keys::First);
    let status = unsafe {
        create(
            ctx,
            spec.name.as_ptr(),
            Some(spec.handler),
            spec.flags.as_ptr(),
            key_pos,
            key_pos,
            key_pos,
        )
    };
    if status != raw::Status::Ok as c_int {
        return Err(format!("cannot create command {name}"));
    }
    let (Some(get), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Err("no SetCommandInfo API".into());
    };
    let command = unsafe { get(ctx, spec.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("cannot find command {name} after creating it"));
    }
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // SAFETY: all-zero is the API's "end of array" marker and a valid bit pattern for these
    // plain C structs.
    let mut key_specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe {
        [
            MaybeUninit::zeroed().assume_init(),
            MaybeUninit::zeroed().assume_init(),
        ]
    };
    if spec.keys != Keys::None {
        let ks = &mut key_specs[0];
        ks.flags = u64::from(
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_ACCESS
                | raw::REDISMODULE_CMD_KEY_UPDATE,
        );
        ks.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        ks.bs.index.pos = 1;
        if spec.keys == Keys::First {
            ks.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            ks.fk.range.lastkey = 0;
            ks.fk.range.keystep = 1;
            ks.fk.range.limit = 0;
        } else {
            // numkeys at the begin index (offset 0), the first key right after it.
            ks.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            ks.fk.keynum.keynumidx = 0;
            ks.fk.keynum.firstkey = 1;
            ks.fk.keynum.keystep = 1;
        }
    }
    let mut info: raw::RedisModuleCommandInfo = unsafe { MaybeUninit::zeroed().assume_init() };
    info.version = &version;
    info.summary = spec.summary.as_ptr();
    info.complexity = spec.complexity.as_ptr();
    info.since = c"0.1.0".as_ptr();
    info.arity = spec.arity;
    info.key_specs = if spec.keys != Keys::None {
        key_specs.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    let mut arena = Vec::new();
    info.args = if spec.args.is_empty() {
        std::ptr::null_mut()
    } else {
        docs::build(spec.args, 0, &mut arena)
    };
    if unsafe { set_info(command, &info) } != raw::Status::Ok as c_int {
        return Err(format!("cannot set command info of {name}"));
    }
    drop(arena);
    if !spec.acl.is_empty() {
        let categories = if ratelimit_category && spec.name != c"RL.APPLY" {
            std::ffi::CString::new(format!("{} ratelimit", spec.acl.to_string_lossy()))
                .unwrap_or_default()
        } else {
            spec.acl.to_owned()
        };
        docs::set_acl_categories(ctx, command, &categories);
    }
    Ok(())
}
