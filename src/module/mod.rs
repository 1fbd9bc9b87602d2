//! The Redis glue: the only code that names `redis_module`, raw pointers, `unsafe` or a
//! clock. Entry points: `RedisModule_OnLoad`, one trampoline per command ([`call`]), and the
//! type callbacks ([`data_type`]), each behind the panic boundary in [`guard`].
//!
//! # Why the raw module API
//!
//! The `redis-module` crate supplies the bindings (`raw::`) and the allocator; the glue calls
//! the raw API directly instead of the crate's safe wrappers where those cost or cannot do
//! what the module needs:
//!
//! * **Arguments.** The crate turns every argument into a retained `RedisString` in a `Vec`:
//!   an allocation and a reference count per argument per call. Here arguments are borrowed
//!   byte slices ([`call::Arg`]) for the command's duration.
//! * **Panics.** The crate's command wrapper has no `catch_unwind`, so a panic would abort
//!   the server (a Rust panic cannot unwind through C). Every entry point here runs inside
//!   [`guard`].
//! * **Registration.** The crate's `#[command]` macro makes the module fail to load on Redis
//!   7.0 (it needs `SetCommandACLCategories`, a 7.2 API). Commands are registered with
//!   `CreateCommand` + `SetCommandInfo` (key-specs, `COMMAND DOCS`), and ACL categories are
//!   set only where the server has the API ([`command`], [`docs`]).
//! * **Values.** A key's value is a tagged pointer to an allocation of exactly its
//!   algorithm's size (16 bytes for most GCRA keys), which the crate's typed
//!   `get_value`/`set_value` cannot express ([`value`]).
//! * **Keys.** Absolute expiry (`SetAbsExpire`), explicit `SignalModifiedKey` under
//!   `NO_IMPLICIT_SIGNAL_MODIFIED` (denials must not touch `WATCH`), `WRONGTYPE` rather than
//!   the crate's generic error, and effect replication with two arguments ([`keys`]).
//!
//! `unsafe` is confined to the files that touch the raw API (`call`, `keys`, `value`,
//! `data_type`, `command`, `docs`, `ffi`, `clock`, `config`, `maxmemory`, `stats` and this
//! one), each block with a `// SAFETY:` comment; the command handlers under `commands/` are
//! compiled with `#![forbid(unsafe_code)]`.
//!
//! # Speed
//!
//! `make bench-cost` counts the server's instructions per call next to a floor module that
//! does the least any native GCRA limiter must do (BENCHMARKS.md). The steps of the one
//! sequence (parse, decide, store, announce, reply) and the core functions they call are
//! marked `#[inline(always)]`, so that each command's trampoline compiles to one function in
//! which the algorithm and the shape of its write are known: no run-time dispatch over the
//! algorithms and no large values copied from step to step. That saved about 480 of the
//! ~10,100 instructions of an RL.GCRA call; measure before and after changing it.

mod call;
mod clock;
mod command;
mod commands;
mod config;
mod data_type;
mod docs;
mod error;
mod ffi;
mod guard;
mod keys;
mod limits;
mod maxmemory;
mod params_table;
mod stats;
mod value;

use std::ffi::{c_int, CStr};

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
/// Called by Redis with a valid context and `argc` module arguments at `argv`.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // Nothing may allocate before this call: it installs the allocator's functions and fills
    // the API table.
    // SAFETY: `ctx` is the load context; the name is a NUL-terminated static.
    let init = unsafe {
        raw::Export_RedisModule_Init(
            ctx,
            MODULE_NAME.as_ptr(),
            MODULE_VERSION,
            raw::REDISMODULE_APIVER_1 as c_int,
        )
    };
    if init == raw::Status::Err as c_int {
        // The API table is filled before the name check, so logging works here.
        ffi::log(
            ctx,
            Level::Warning,
            "redis-rl: module not loaded: a module named 'rl' is already loaded",
        );
        return raw::Status::Err as c_int;
    }
    let args: Vec<&[u8]> = match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` live module arguments at `argv`, valid during OnLoad.
        Ok(n) if n > 0 && !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) }
            .iter()
            // SAFETY: each entry is a live argument string, unmodified during OnLoad.
            .map(|&a| unsafe { ffi::bytes(a) })
            .collect(),
        _ => Vec::new(),
    };
    let loaded = guard::callback("OnLoad", Err("panic during load".to_owned()), || {
        on_load(ctx, &args)
    });
    match loaded {
        Ok(()) => {
            ffi::log(
                ctx,
                Level::Notice,
                &format!(
                    "redis-rl {} loaded (rl.log-max-limit {}, rl.lease-max-limit {}, \
                     rl.all-max-keys {})",
                    env!("CARGO_PKG_VERSION"),
                    config::log_max_limit(),
                    config::lease_max_limit(),
                    config::all_max_keys()
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

fn on_load(ctx: *mut raw::RedisModuleCtx, args: &[&[u8]]) -> Result<(), String> {
    // SAFETY: the API table is filled; GetServerVersion takes no arguments.
    let version = unsafe { raw::RedisModule_GetServerVersion.map(|f| f()) };
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
    config::apply_module_args(args)?;
    let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED
        | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD;
    // SAFETY: `ctx` is the load context; the options are flags this server version knows.
    unsafe {
        if let Some(set_options) = raw::RedisModule_SetModuleOptions {
            set_options(ctx, options as c_int);
        }
    }
    data_type::register(ctx)?;
    config::register(ctx)?;
    stats::register(ctx)?;
    maxmemory::track(ctx);
    let ratelimit_category = docs::add_acl_category(ctx);
    commands::register_all(ctx, ratelimit_category)
}
