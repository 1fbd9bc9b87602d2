//! The command handlers: parse → now → load → decide → store/replicate/notify → reply.

pub mod all;
pub mod apply;
pub mod gcra;
pub mod limit;
#[cfg(debug_assertions)]
pub mod panic;
pub mod refund;
pub mod throttle;
pub mod window;

use redis_module::raw;

use super::error::CommandError;
use super::ffi;
use crate::decision::{Decision, Verdict};
use crate::time::ceil_ms;

/// The arguments of one call, `args[0]` being the command name.
pub type Args<'a> = &'a [*mut raw::RedisModuleString];

/// Reads the optional trailing keywords of a command: each may come once, in any order,
/// case-insensitively.
pub struct Options<'a> {
    rest: std::slice::Iter<'a, *mut raw::RedisModuleString>,
}

impl<'a> Options<'a> {
    /// Starts reading at `args` (the part after the positional arguments).
    pub fn new(args: Args<'a>) -> Self {
        Self { rest: args.iter() }
    }

    /// Returns the next keyword's bytes, or `None` at the end.
    pub fn next_keyword(&mut self) -> Option<&'a [u8]> {
        self.rest.next().map(|&s| unsafe { ffi::bytes(s) })
    }

    /// Returns the value following `keyword`.
    pub fn value(&mut self, keyword: &'static str) -> Result<&'a [u8], CommandError> {
        self.next_keyword()
            .ok_or(CommandError::MissingValue(keyword))
    }

    /// Returns the next argument without taking it.
    pub fn peek(&self) -> Option<&'a [u8]> {
        self.rest
            .as_slice()
            .first()
            .map(|&s| unsafe { ffi::bytes(s) })
    }
}

/// The options every limiting command shares: `QUANTITY n` and `PEEK`.
pub struct RequestOptions {
    /// Requests at once (default 1).
    pub quantity: u64,
    /// Evaluate without writing.
    pub peek: bool,
    seen_quantity: bool,
}

impl Default for RequestOptions {
    fn default() -> Self {
        Self {
            quantity: 1,
            peek: false,
            seen_quantity: false,
        }
    }
}

impl RequestOptions {
    /// Takes `keyword` (and its value from `options`) if it is QUANTITY or PEEK; returns
    /// false for any other keyword.
    pub fn take(
        &mut self,
        keyword: &[u8],
        options: &mut Options<'_>,
    ) -> Result<bool, CommandError> {
        if keyword.eq_ignore_ascii_case(b"QUANTITY") {
            once(&mut self.seen_quantity, "QUANTITY")?;
            self.quantity = crate::params::non_negative(options.value("QUANTITY")?, "QUANTITY")?;
            Ok(true)
        } else if keyword.eq_ignore_ascii_case(b"PEEK") {
            once(&mut self.peek, "PEEK")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Whether the request may write (not a PEEK, not QUANTITY 0).
    pub fn may_write(&self) -> bool {
        !self.peek && self.quantity > 0
    }
}

/// Marks a keyword as seen, failing if it was already.
pub fn once(seen: &mut bool, keyword: &'static str) -> Result<(), CommandError> {
    if std::mem::replace(seen, true) {
        return Err(CommandError::Duplicate(keyword));
    }
    Ok(())
}

/// Client bytes as they appear in an error: lossy UTF-8, at most 64 characters.
pub fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).chars().take(64).collect()
}

/// The error for an argument that is no keyword of the command.
pub fn unknown(arg: &[u8]) -> CommandError {
    CommandError::UnknownArgument(shown(arg))
}

/// Saturating conversion for reply integers.
pub fn as_reply_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The SPEC five-integer reply: allowed, limit, remaining, retry_after_ms, reset_after_ms.
pub fn five(decision: &Decision) -> [i64; 5] {
    let retry_after_ms = match decision.verdict {
        Verdict::Allowed | Verdict::Never => -1,
        Verdict::Denied { retry_after_ns } => as_reply_int(ceil_ms(retry_after_ns).max(1)),
        Verdict::Reserved { delay_ns } => as_reply_int(ceil_ms(delay_ns)),
    };
    [
        i64::from(decision.verdict.is_allowed()),
        as_reply_int(decision.limit),
        as_reply_int(decision.remaining),
        retry_after_ms,
        as_reply_int(ceil_ms(decision.reset_after_ns)),
    ]
}

/// The absolute expiry for a key that is idle at `idle_at_ns`: ms since the epoch, rounded up.
pub fn expire_at_ms(idle_at_ns: u64) -> i64 {
    i64::try_from(ceil_ms(idle_at_ns)).unwrap_or(i64::MAX)
}
