//! Counters for `INFO rl`: per command calls, allowed, denied and errors (for RL.REFUND,
//! "allowed" counts calls that gave something back), each command's [`Counters`] living in
//! its own file; limiter keys by algorithm.
//!
//! Only the server's main thread runs commands and creates values, so those counts are
//! bumped with a relaxed load and store ([`bump`]) instead of a locked read-modify-write,
//! which costs tens of cycles per counter on every call. Values are also freed by the
//! lazy-free thread, so the freed-key counts keep a locked add; a key count is created minus
//! freed.

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

use super::command::Counted;
use super::guard;
use super::params_table;
use crate::state::Algorithm;

/// Counters of one command, shown in `INFO rl` as `rl_<name>:calls=…,allowed=…,…`.
pub struct Counters {
    name: &'static CStr,
    calls: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    /// Zeroed counters shown under `name`.
    pub const fn new(name: &'static CStr) -> Self {
        Self {
            name,
            calls: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }
}

/// Adds 1 to a counter that only the main thread changes.
#[inline(always)]
fn bump(counter: &AtomicU64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// Counts a finished call (main thread).
#[inline(always)]
pub fn record(counters: &Counters, counted: Counted) {
    bump(&counters.calls);
    let field = match counted {
        Counted::Allowed => &counters.allowed,
        Counted::Denied => &counters.denied,
        Counted::Error => &counters.errors,
    };
    bump(field);
}

const KIND_NAMES: [&CStr; 5] = [
    c"gcra_keys",
    c"fixed_keys",
    c"sliding_keys",
    c"log_keys",
    c"lease_keys",
];
/// Values made, by algorithm (main thread only).
static CREATED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
/// Values freed, by algorithm (any thread).
static FREED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

fn kind_index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::Gcra => 0,
        Algorithm::Fixed => 1,
        Algorithm::Sliding => 2,
        Algorithm::Log => 3,
        Algorithm::Lease => 4,
    }
}

/// A value of `algorithm` was allocated (main thread).
#[inline(always)]
pub fn key_created(algorithm: Algorithm) {
    bump(&CREATED[kind_index(algorithm)]);
}

/// A value of `algorithm` was freed (any thread).
pub fn key_freed(algorithm: Algorithm) {
    FREED[kind_index(algorithm)].fetch_add(1, Ordering::Relaxed);
}

extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard::callback("info", (), || {
        // SAFETY: `ctx` is the INFO context Redis passes to this callback; every name is a
        // NUL-terminated static; sections and dict fields are opened and closed in order.
        unsafe {
            let (Some(section), Some(dict), Some(end_dict), Some(field)) = (
                raw::RedisModule_InfoAddSection,
                raw::RedisModule_InfoBeginDictField,
                raw::RedisModule_InfoEndDictField,
                raw::RedisModule_InfoAddFieldULongLong,
            ) else {
                return;
            };
            section(ctx, c"commands".as_ptr());
            for c in super::commands::counters() {
                dict(ctx, c.name.as_ptr());
                field(ctx, c"calls".as_ptr(), c.calls.load(Ordering::Relaxed));
                field(ctx, c"allowed".as_ptr(), c.allowed.load(Ordering::Relaxed));
                field(ctx, c"denied".as_ptr(), c.denied.load(Ordering::Relaxed));
                field(ctx, c"errors".as_ptr(), c.errors.load(Ordering::Relaxed));
                end_dict(ctx);
            }
            section(ctx, c"keys".as_ptr());
            for ((name, created), freed) in KIND_NAMES.iter().zip(&CREATED).zip(&FREED) {
                let alive = created
                    .load(Ordering::Relaxed)
                    .saturating_sub(freed.load(Ordering::Relaxed));
                field(ctx, name.as_ptr(), alive);
            }
            field(
                ctx,
                c"gcra_parameter_sets".as_ptr(),
                params_table::len() as u64,
            );
            field(
                ctx,
                c"gcra_parameter_table_static_bytes".as_ptr(),
                params_table::STATIC_BYTES as u64,
            );
        }
    })
}

/// Registers the INFO callback.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: `ctx` is the load context; `info` has the signature Redis expects.
    let status = unsafe {
        let register = raw::RedisModule_RegisterInfoFunc.ok_or("no RegisterInfoFunc API")?;
        register(ctx, Some(info))
    };
    if status != raw::Status::Ok as c_int {
        return Err("cannot register the INFO callback".into());
    }
    Ok(())
}
