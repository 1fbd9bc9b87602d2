//! Whether the server has a `maxmemory` limit, kept current from its config-change event.
//!
//! Without a limit (`maxmemory 0`, the default) the server never refuses a write for memory,
//! so [`Call::is_out_of_memory`](super::call::Call::is_out_of_memory) answers "no" without
//! asking the server anything. The flag starts as "set" and becomes "not set" only after the
//! server's own `CONFIG GET maxmemory` said `0`; every `CONFIG SET` that names `maxmemory`
//! sets it again before reading the new value. If the value cannot be read (`CONFIG` renamed
//! away, an unexpected reply), the flag stays "set" and every write asks the server, as it
//! would without this file.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::raw;

/// Whether `maxmemory` may be non-zero (true until a read says otherwise).
static LIMITED: AtomicBool = AtomicBool::new(true);

/// Whether the server may have a `maxmemory` limit. False only when the server said
/// `maxmemory` is 0 and no `CONFIG SET` has named it since.
pub fn is_limited() -> bool {
    LIMITED.load(Ordering::Relaxed)
}

/// Reads `maxmemory` now and follows its changes (`OnLoad`). A server that cannot tell the
/// module about configuration changes leaves the flag set.
pub fn track(ctx: *mut raw::RedisModuleCtx) {
    // `RedisModuleEvent_Config` is a `static` in redismodule.h (not a symbol to link), so the
    // event is spelled out: its id and the version of the data it passes.
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_CONFIG,
        dataver: 1,
    };
    // SAFETY: the API table is filled at load; `ctx` is the load context and the callback is
    // a plain function that lives as long as the module.
    let subscribed = unsafe {
        raw::RedisModule_SubscribeToServerEvent
            .map(|subscribe| subscribe(ctx, event, Some(on_config_change)))
    };
    if subscribed == Some(raw::Status::Ok as i32) {
        refresh(ctx);
    }
}

/// The config-change callback: re-reads `maxmemory` when the change names it.
extern "C" fn on_config_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    super::guard::callback("config change", (), || {
        if data.is_null() {
            LIMITED.store(true, Ordering::Relaxed);
            return;
        }
        // SAFETY: for REDISMODULE_EVENT_CONFIG the server passes a RedisModuleConfigChange
        // whose `config_names` holds `num_changes` NUL-terminated names, valid during the
        // callback.
        let names: &[*const c_char] = unsafe {
            let change = &*data.cast::<raw::RedisModuleConfigChange>();
            match usize::try_from(change.num_changes) {
                Ok(n) if n > 0 && !change.config_names.is_null() => {
                    std::slice::from_raw_parts(change.config_names, n)
                }
                _ => &[],
            }
        };
        let names_maxmemory = names.iter().any(|&name| {
            // SAFETY: each name is a NUL-terminated string, valid during the callback.
            !name.is_null()
                && unsafe { CStr::from_ptr(name) }
                    .to_bytes()
                    .eq_ignore_ascii_case(b"maxmemory")
        });
        if names_maxmemory {
            refresh(ctx);
        }
    });
}

/// Sets the flag, then clears it if the server says `maxmemory` is 0.
fn refresh(ctx: *mut raw::RedisModuleCtx) {
    LIMITED.store(true, Ordering::Relaxed);
    if super::ffi::config_get(ctx, c"maxmemory").as_deref() == Some(b"0".as_slice()) {
        LIMITED.store(false, Ordering::Relaxed);
    }
}
