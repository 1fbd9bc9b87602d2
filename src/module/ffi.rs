//! Thin wrappers over the raw module API that several parts of the glue use: argument bytes,
//! logging, replies, context flags. Every function pointer is checked: a missing API is a
//! no-op or an error, never a crash.
//!
//! The API table (`raw::RedisModule_*`) is filled once by `RedisModule_Init` in `OnLoad`,
//! before any other code of the module runs, and never changed afterwards: reading an entry
//! is a plain load of an initialised pointer.

use std::ffi::{c_int, c_long, CStr, CString};

use redis_module::raw;

/// Returns the bytes of a Redis string (empty if the API is missing).
///
/// # Safety
/// `s` must be a live `RedisModuleString` that is not modified for the lifetime `'a`.
pub unsafe fn bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len: usize = 0;
    // SAFETY: the caller guarantees `s` is live; `len` is a valid out-pointer. The returned
    // pointer addresses `len` bytes owned by `s`, which the caller keeps alive for `'a`.
    unsafe {
        let Some(ptr_len) = raw::RedisModule_StringPtrLen else {
            return &[];
        };
        let ptr = ptr_len(s, &mut len);
        if ptr.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(ptr.cast::<u8>(), len)
    }
}

/// Log levels of the server log.
#[derive(Clone, Copy)]
pub enum Level {
    /// `notice`
    Notice,
    /// `warning`
    Warning,
}

/// Writes one line to the server log. `ctx` may be null (the server then logs without the
/// module's name).
pub fn log(ctx: *mut raw::RedisModuleCtx, level: Level, message: &str) {
    let level: &CStr = match level {
        Level::Notice => c"notice",
        Level::Warning => c"warning",
    };
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: RedisModule_Log accepts a null or live context; the format is a constant "%s"
    // whose one argument is a NUL-terminated string that outlives the call.
    unsafe {
        if let Some(log) = raw::RedisModule_Log {
            log(ctx, level.as_ptr(), c"%s".as_ptr(), text.as_ptr());
        }
    }
}

/// Replies with an error; `message` must start with an error code (`ERR `, `WRONGTYPE `).
pub fn reply_error(ctx: *mut raw::RedisModuleCtx, message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: `ctx` is the live context of the running command (every caller passes the
    // context Redis gave it); the message is NUL-terminated and outlives the call.
    unsafe {
        if let Some(reply) = raw::RedisModule_ReplyWithError {
            reply(ctx, text.as_ptr());
        }
    }
}

/// Replies with an array of integers.
pub fn reply_integers(ctx: *mut raw::RedisModuleCtx, values: &[i64]) {
    let len = c_long::try_from(values.len()).unwrap_or(c_long::MAX);
    // SAFETY: `ctx` is the live context of the running command; an array of `len` elements
    // is followed by exactly `len` integer replies.
    unsafe {
        let (Some(array), Some(int)) = (
            raw::RedisModule_ReplyWithArray,
            raw::RedisModule_ReplyWithLongLong,
        ) else {
            return;
        };
        array(ctx, len);
        for &v in values {
            int(ctx, v);
        }
    }
}

/// Replies with a simple string (`+OK`).
pub fn reply_simple(ctx: *mut raw::RedisModuleCtx, text: &CStr) {
    // SAFETY: `ctx` is the live context of the running command; `text` is NUL-terminated.
    unsafe {
        if let Some(reply) = raw::RedisModule_ReplyWithSimpleString {
            reply(ctx, text.as_ptr());
        }
    }
}

/// The server's used memory (less replica and AOF buffers) as a fraction of `maxmemory`: 0
/// without `maxmemory`, above 1 past it; 0 if the API is unavailable.
pub fn used_memory_ratio() -> f32 {
    // SAFETY: the API table is filled at load and never changed; the call reads server
    // state on the main thread, where commands run.
    unsafe {
        match raw::RedisModule_GetUsedMemoryRatio {
            Some(ratio) => ratio(),
            None => 0.0,
        }
    }
}

/// Whether the server refuses `deny-oom` commands for the running command: it calls the
/// `deny-oom` command `probe` (which must do nothing) with `RedisModule_Call`'s `M` flag,
/// which refuses it on the server's own out-of-memory verdict, taken as the running command
/// started, after its eviction pass. True also when the call fails for any other reason.
pub fn server_refuses_deny_oom(ctx: *mut raw::RedisModuleCtx, probe: &CStr) -> bool {
    // SAFETY: `ctx` is the live context of the running command; the command name and the
    // format are NUL-terminated statics, and the format names no argument, so the variadic
    // call passes none. A returned reply is ours and freed exactly once, here.
    unsafe {
        let (Some(call), Some(free)) = (raw::RedisModule_Call, raw::RedisModule_FreeCallReply)
        else {
            return true;
        };
        let reply = call(ctx, probe.as_ptr(), c"M".as_ptr());
        if reply.is_null() {
            return true;
        }
        free(reply);
        false
    }
}

/// The value of the server configuration parameter `name` (`CONFIG GET name`), or None when
/// it cannot be read (the command renamed away, an unknown name, an unexpected reply).
pub fn config_get(ctx: *mut raw::RedisModuleCtx, name: &CStr) -> Option<Vec<u8>> {
    // SAFETY: `ctx` is a live context (load or event callback); the command name, format and
    // argument are NUL-terminated, and the format "cc" names exactly the two C strings
    // passed. The reply is ours and freed exactly once, here; its elements and their bytes
    // are read before that and copied out.
    unsafe {
        let call = raw::RedisModule_Call?;
        let free = raw::RedisModule_FreeCallReply?;
        let reply = call(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        let value = (|| {
            let length = raw::RedisModule_CallReplyLength?(reply);
            if length != 2 {
                return None;
            }
            let element = raw::RedisModule_CallReplyArrayElement?(reply, 1);
            if element.is_null() {
                return None;
            }
            let mut len = 0usize;
            let ptr = raw::RedisModule_CallReplyStringPtr?(element, &mut len);
            if ptr.is_null() {
                return None;
            }
            Some(std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec())
        })();
        free(reply);
        value
    }
}

/// Returns the context flags (`REDISMODULE_CTX_FLAGS_*`), 0 if unavailable.
pub fn context_flags(ctx: *mut raw::RedisModuleCtx) -> u32 {
    // SAFETY: `ctx` is the live context of the running command.
    let flags: c_int = unsafe {
        match raw::RedisModule_GetContextFlags {
            Some(flags) => flags(ctx),
            None => 0,
        }
    };
    flags as u32
}
