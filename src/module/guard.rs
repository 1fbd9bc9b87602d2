//! The panic boundary: every entry point from Redis runs inside `catch_unwind`, so a bug
//! becomes an error reply (or a failed load) and a log line, never a dead server.

use std::any::Any;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use super::error::CommandError;
use super::ffi::{self, Level};

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_owned()
    }
}

/// Runs a command body; its error (or a caught panic) becomes the error reply.
pub fn command(
    ctx: *mut raw::RedisModuleCtx,
    name: &'static str,
    body: impl FnOnce() -> Result<c_int, CommandError>,
) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => ffi::reply_error(ctx, &e.reply_text()),
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            ffi::log(
                ctx,
                Level::Warning,
                &format!("redis-rl: panic in {name}: {msg}"),
            );
            ffi::reply_error(ctx, &CommandError::Panic(msg).reply_text())
        }
    }
}

/// Runs a type callback; a caught panic is logged and `fallback` is returned.
pub fn callback<T>(name: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            ffi::log(
                std::ptr::null_mut(),
                Level::Warning,
                &format!("redis-rl: panic in {name}: {msg}"),
            );
            fallback
        }
    }
}
