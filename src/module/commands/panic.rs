//! `RL.PANIC`: debug builds only. Panics on purpose so the tests can prove that a panic in a
//! command becomes an error reply and the server survives.

use std::ffi::c_int;

use redis_module::raw;

use crate::module::error::CommandError;

/// Panics. Compiled only with `debug_assertions` (never in the release build), and, like
/// every handler, called inside `guard::command`'s `catch_unwind`: the panic becomes an
/// `ERR` reply and a log line, never an abort of the server.
pub fn run(_ctx: *mut raw::RedisModuleCtx, _args: super::Args<'_>) -> Result<c_int, CommandError> {
    panic!("RL.PANIC: deliberate panic (debug builds only)");
}
