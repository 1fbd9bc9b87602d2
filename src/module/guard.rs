//! The panic boundary: every entry point from Redis runs inside `catch_unwind`, so a bug
//! becomes an error reply (or a failed load) and a log line, never a dead server.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

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

/// Runs a command body; a caught panic is logged and becomes [`CommandError::Panic`].
#[inline(always)]
pub fn command<T>(
    name: &'static str,
    body: impl FnOnce() -> Result<T, CommandError>,
) -> Result<T, CommandError> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            ffi::log(
                std::ptr::null_mut(),
                Level::Warning,
                &format!("redis-rl: panic in {name}: {msg}"),
            );
            Err(CommandError::Panic(msg))
        }
    }
}

/// Runs a callback (type callbacks, INFO, load); a caught panic is logged and `fallback` is
/// returned.
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
