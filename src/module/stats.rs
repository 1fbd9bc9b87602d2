//! Counters for `INFO rl`: per command calls, allowed, denied and errors (for RL.REFUND,
//! "allowed" counts calls that gave something back); limiter keys by algorithm. Relaxed atomics: a few nanoseconds per call, safe from Redis's lazy-free thread
//! (which frees values, and so decrements the key counts).

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use redis_module::raw;

use super::guard;
use super::params_table;

/// The commands with counters, in INFO order.
#[derive(Clone, Copy)]
pub enum Command {
    /// RL.GCRA
    Gcra = 0,
    /// RL.WINDOW
    Window = 1,
    /// RL.ALL
    All = 2,
    /// RL.REFUND
    Refund = 3,
    /// CL.THROTTLE
    Throttle = 4,
}

const NAMES: [&CStr; 5] = [c"gcra", c"window", c"all", c"refund", c"throttle"];

struct Counters {
    calls: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

static COMMANDS: [Counters; 5] = [const {
    Counters {
        calls: AtomicU64::new(0),
        allowed: AtomicU64::new(0),
        denied: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    }
}; 5];

/// The key kinds counted.
#[derive(Clone, Copy)]
pub enum Kind {
    /// GCRA keys.
    Gcra = 0,
    /// FIXED window keys.
    Fixed = 1,
    /// SLIDING window keys.
    Sliding = 2,
    /// LOG window keys.
    Log = 3,
}

const KIND_NAMES: [&CStr; 4] = [c"gcra_keys", c"fixed_keys", c"sliding_keys", c"log_keys"];
static KEYS: [AtomicI64; 4] = [const { AtomicI64::new(0) }; 4];

/// Counts a call (with its outcome: `Some(true)` allowed, `Some(false)` denied, `None` an
/// error reply).
pub fn record(command: Command, allowed: Option<bool>) {
    let c = &COMMANDS[command as usize];
    c.calls.fetch_add(1, Ordering::Relaxed);
    match allowed {
        Some(true) => c.allowed.fetch_add(1, Ordering::Relaxed),
        Some(false) => c.denied.fetch_add(1, Ordering::Relaxed),
        None => c.errors.fetch_add(1, Ordering::Relaxed),
    };
}

/// A value of `kind` was allocated.
pub fn key_created(kind: Kind) {
    KEYS[kind as usize].fetch_add(1, Ordering::Relaxed);
}

/// A value of `kind` was freed.
pub fn key_freed(kind: Kind) {
    KEYS[kind as usize].fetch_sub(1, Ordering::Relaxed);
}

unsafe extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard::callback("info", (), || {
        let (Some(section), Some(dict), Some(end_dict), Some(field)) = (
            raw::RedisModule_InfoAddSection,
            raw::RedisModule_InfoBeginDictField,
            raw::RedisModule_InfoEndDictField,
            raw::RedisModule_InfoAddFieldULongLong,
        ) else {
            return;
        };
        section(ctx, c"commands".as_ptr());
        for (name, c) in NAMES.iter().zip(&COMMANDS) {
            dict(ctx, name.as_ptr());
            field(ctx, c"calls".as_ptr(), c.calls.load(Ordering::Relaxed));
            field(ctx, c"allowed".as_ptr(), c.allowed.load(Ordering::Relaxed));
            field(ctx, c"denied".as_ptr(), c.denied.load(Ordering::Relaxed));
            field(ctx, c"errors".as_ptr(), c.errors.load(Ordering::Relaxed));
            end_dict(ctx);
        }
        section(ctx, c"keys".as_ptr());
        for (name, k) in KIND_NAMES.iter().zip(&KEYS) {
            field(ctx, name.as_ptr(), k.load(Ordering::Relaxed).max(0) as u64);
        }
        field(
            ctx,
            c"gcra_parameter_sets".as_ptr(),
            params_table::len() as u64,
        );
    })
}

/// Registers the INFO callback.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    let register = unsafe { raw::RedisModule_RegisterInfoFunc }.ok_or("no RegisterInfoFunc API")?;
    if unsafe { register(ctx, Some(info)) } != raw::Status::Ok as c_int {
        return Err("cannot register the INFO callback".into());
    }
    Ok(())
}
