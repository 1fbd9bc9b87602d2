//! The commands, one file each: its handler (parse → now → decide → commit → reply), its
//! `COMMAND DOCS` metadata and its `INFO rl` counters. Handlers are safe code: they see the
//! call only through [`Call`](super::call::Call) and [`Arg`](super::call::Arg).
//!
//! Adding a command: a file implementing [`Command`](super::command::Command), and one line
//! in the list below.

#![forbid(unsafe_code)]

use super::call::{Arg, Call};
use super::clock;
use super::command::{Command, Counted};
use super::error::{CommandError, FORCE_WITH_PEEK};
use super::limits::{self, Check, Mode};
use super::stats::Counters;
use crate::decision::{Decision, Verdict};
use crate::limit::shown;
use crate::state::Event;

/// Declares the command files and the list of commands registered at load.
macro_rules! commands {
    ($($(#[$attr:meta])* $file:ident :: $command:ident,)*) => {
        $($(#[$attr])* mod $file;)*

        /// Registers every command with the server (`OnLoad`).
        pub fn register_all(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            ratelimit_category: bool,
        ) -> Result<(), String> {
            $(
                $(#[$attr])*
                super::command::register::<$file::$command>(ctx, ratelimit_category)?;
            )*
            Ok(())
        }

        /// The `INFO rl` counters of every counted command, in registration order.
        pub fn counters() -> impl Iterator<Item = &'static Counters> {
            [$($(#[$attr])* <$file::$command as Command>::SPEC.counters,)*]
                .into_iter()
                .flatten()
        }
    };
}

commands! {
    gcra::Gcra,
    window::Window,
    all::All,
    refund::Refund,
    throttle::Throttle,
    lease::Lease,
    release::Release,
    apply::Apply,
    oom_check::OomCheck,
    #[cfg(debug_assertions)]
    panic::Panic,
}

/// Reads the optional trailing keywords of a command (each may come once, in any order,
/// case-insensitively), or any other run of words: an iterator over the arguments' bytes.
#[derive(Clone)]
pub struct Options<'a> {
    rest: std::slice::Iter<'a, Arg<'a>>,
}

impl<'a> Iterator for Options<'a> {
    type Item = &'a [u8];

    #[inline(always)]
    fn next(&mut self) -> Option<&'a [u8]> {
        self.rest.next().map(|a| a.bytes())
    }
}

impl<'a> Options<'a> {
    /// Starts reading at `args` (the part after the positional arguments).
    pub fn new(args: &'a [Arg<'a>]) -> Self {
        Self { rest: args.iter() }
    }

    /// Returns the value following `keyword`.
    pub fn value(&mut self, keyword: &'static str) -> Result<&'a [u8], CommandError> {
        self.next().ok_or(CommandError::MissingValue(keyword))
    }

    /// Whether no argument is left.
    pub fn is_empty(&self) -> bool {
        self.rest.len() == 0
    }
}

/// The options every limiting command shares: `QUANTITY n`, `PEEK` and `FORCE`.
pub struct RequestOptions {
    /// Requests at once (default 1).
    pub quantity: u64,
    /// Evaluate without writing.
    pub peek: bool,
    /// Record usage that has already happened.
    pub force: bool,
    seen_quantity: bool,
}

impl Default for RequestOptions {
    fn default() -> Self {
        Self {
            quantity: 1,
            peek: false,
            force: false,
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
        } else if keyword.eq_ignore_ascii_case(b"FORCE") {
            once(&mut self.force, "FORCE")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Refuses `FORCE` with `PEEK` (a forced request records usage, a peek records nothing).
    pub fn check_force(&self) -> Result<(), CommandError> {
        if self.force && self.peek {
            return Err(CommandError::CannotForce(FORCE_WITH_PEEK));
        }
        Ok(())
    }
}

/// Marks a keyword as seen, failing if it was already.
pub fn once(seen: &mut bool, keyword: &'static str) -> Result<(), CommandError> {
    if std::mem::replace(seen, true) {
        return Err(CommandError::Duplicate(keyword));
    }
    Ok(())
}

/// The error for an argument that is no keyword of the command.
pub fn unknown(arg: &[u8]) -> CommandError {
    CommandError::UnknownArgument(shown(arg))
}

/// Saturating conversion for reply integers.
pub fn as_reply_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Decides a one-key call at the server's current time and replies the five integers
/// ([`five`]): the whole of RL.GCRA, RL.WINDOW and RL.LEASE after parsing.
#[inline(always)]
pub fn decide_and_reply(
    call: &Call<'_>,
    check: &Check<'_>,
    mode: Mode,
    event: Event,
) -> Result<Counted, CommandError> {
    let decision = limits::decide_one(call, check, mode, clock::now(), event)?;
    call.reply_integers(&five(&decision));
    Ok(Counted::from_allowed(decision.verdict.is_allowed()))
}

/// The five-integer reply: allowed, limit, remaining, retry_after_ms, reset_after_ms.
#[inline(always)]
pub fn five(decision: &Decision) -> [i64; 5] {
    let retry_after_ms = match decision.verdict {
        Verdict::Allowed | Verdict::Never => -1,
        Verdict::Denied { retry_after } => as_reply_int(retry_after.ceil_ms().max(1)),
        Verdict::Reserved { delay } => as_reply_int(delay.ceil_ms()),
    };
    [
        i64::from(decision.verdict.is_allowed()),
        as_reply_int(decision.limit),
        as_reply_int(decision.remaining),
        retry_after_ms,
        as_reply_int(decision.reset_after.ceil_ms()),
    ]
}
