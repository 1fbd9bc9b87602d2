//! Thin wrappers over the raw module API that the rest of the glue uses: argument bytes,
//! logging, replies. Every function pointer is checked: a missing API is an error, not a
//! crash.

use std::ffi::{c_char, c_int, CStr, CString};

use redis_module::raw;

/// The bytes of a Redis string argument. Valid while the command runs (argv outlives it).
///
/// # Safety
/// `s` must be a live `RedisModuleString` for the lifetime `'a`.
pub unsafe fn bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let Some(ptr_len) = raw::RedisModule_StringPtrLen else {
        return &[];
    };
    let mut len: usize = 0;
    let ptr = ptr_len(s, &mut len);
    if ptr.is_null() {
        return &[];
    }
    std::slice::from_raw_parts(ptr.cast::<u8>(), len)
}

/// Log levels of the server log.
#[derive(Clone, Copy)]
pub enum Level {
    Notice,
    Warning,
}

/// Writes one line to the server log (`ctx` may be null).
pub fn log(ctx: *mut raw::RedisModuleCtx, level: Level, message: &str) {
    let Some(log) = (unsafe { raw::RedisModule_Log }) else {
        return;
    };
    let level: &CStr = match level {
        Level::Notice => c"notice",
        Level::Warning => c"warning",
    };
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    unsafe { log(ctx, level.as_ptr(), c"%s".as_ptr(), text.as_ptr()) };
}

/// Replies with an error; `message` must start with an error code (`ERR `, `WRONGTYPE `).
pub fn reply_error(ctx: *mut raw::RedisModuleCtx, message: &str) -> c_int {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    if let Some(reply) = unsafe { raw::RedisModule_ReplyWithError } {
        unsafe { reply(ctx, text.as_ptr()) };
    }
    raw::Status::Ok as c_int
}

/// Replies with an array of integers.
pub fn reply_integers(ctx: *mut raw::RedisModuleCtx, values: &[i64]) -> c_int {
    let (Some(array), Some(int)) = (unsafe { raw::RedisModule_ReplyWithArray }, unsafe {
        raw::RedisModule_ReplyWithLongLong
    }) else {
        return raw::Status::Err as c_int;
    };
    unsafe {
        array(ctx, values.len() as std::ffi::c_long);
        for &v in values {
            int(ctx, v);
        }
    }
    raw::Status::Ok as c_int
}

/// Replies with a simple string (`+OK`).
pub fn reply_simple(ctx: *mut raw::RedisModuleCtx, text: &CStr) -> c_int {
    if let Some(reply) = unsafe { raw::RedisModule_ReplyWithSimpleString } {
        unsafe { reply(ctx, text.as_ptr()) };
    }
    raw::Status::Ok as c_int
}

/// Returns the context flags (`REDISMODULE_CTX_FLAGS_*`), 0 if unavailable.
pub fn context_flags(ctx: *mut raw::RedisModuleCtx) -> u32 {
    match unsafe { raw::RedisModule_GetContextFlags } {
        Some(flags) => unsafe { flags(ctx) as u32 },
        None => 0,
    }
}

/// A C string pointer for a static name.
pub const fn cstr(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}
