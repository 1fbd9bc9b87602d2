//! CommandError, and the one place that spells every error reply.

use crate::codec::DecodeError;
use crate::decision::Overflow;
use crate::limit::SpecError;
use crate::params::ParamError;
use crate::state::Algorithm;
use crate::time::{Instant, NANOS_PER_SEC};

/// Everything a command can fail with. Each becomes exactly one reply string in
/// [`CommandError::reply_text`].
#[derive(Debug)]
pub enum CommandError {
    /// A bad argument value; the error names it.
    Param(ParamError),
    /// Time arithmetic would overflow 64-bit nanoseconds because of the request's parameters.
    Overflow(Overflow),
    /// Time arithmetic would overflow because the server's clock reads a time within 20 years
    /// of the end of 64-bit nanosecond time (the year 2554).
    ClockOverflow {
        /// The clock's reading, seconds since the epoch.
        now_s: u64,
    },
    /// The key holds another Redis type.
    WrongType,
    /// The key holds a limiter of another algorithm.
    WrongAlgorithm {
        /// The key, for the message (lossy UTF-8, at most 64 characters).
        key: String,
        /// What the key holds.
        held: Algorithm,
        /// What the call asked for.
        asked: Algorithm,
    },
    /// An RL.ALL spec that does not parse.
    Spec(SpecError),
    /// RL.WINDOW … LOG with a limit above `rl.log-max-limit`.
    LogLimitTooHigh {
        /// The limit asked for.
        limit: u64,
        /// The configured maximum.
        max: u64,
    },
    /// RL.LEASE (or a `LEASE` spec) with a limit above `rl.lease-max-limit`.
    LeaseLimitTooHigh {
        /// The limit asked for.
        limit: u64,
        /// The configured maximum.
        max: u64,
    },
    /// `FORCE` where usage cannot be recorded past the limit: with `LOG`, on a `LEASE`
    /// limit, with `PEEK` or `MAXWAIT`; the text says which, and why.
    CannotForce(&'static str),
    /// `RENEW` where a renewal cannot be made: with `QUANTITY 0`, in RL.ALL; the text says
    /// which, and why.
    CannotRenew(&'static str),
    /// RL.LEASE … RENEW whose token holds no live lease on the key (expired, released, never
    /// taken): the `LEASELOST` error; nothing is written.
    LeaseLost {
        /// The key, for the message (lossy UTF-8, at most 64 characters).
        key: String,
        /// The token, shown the same way.
        token: String,
    },
    /// RL.ALL with `numkeys` above `rl.all-max-keys`.
    TooManyKeys {
        /// The `numkeys` asked for.
        numkeys: u64,
        /// The configured maximum.
        max: u64,
    },
    /// RL.REFUND on a LEASE key.
    RefundOnLease {
        /// The key, for the message.
        key: String,
    },
    /// An argument that is not a known keyword of this command.
    UnknownArgument(String),
    /// A keyword given twice.
    Duplicate(&'static str),
    /// A syntax problem described in full.
    Syntax(String),
    /// A keyword given without its value.
    MissingValue(&'static str),
    /// Wrong number of arguments (checked again here although Redis checks the arity).
    Arity(&'static str),
    /// A write refused because the server is out of memory (`maxmemory` reached, nothing to
    /// evict).
    OutOfMemory,
    /// An internal command sent by a normal client.
    InternalOnly(&'static str),
    /// A replicated state that does not decode.
    BadState(DecodeError),
    /// A write refused because its state would not load back (a bug caught by the safety net).
    Internal(String),
    /// A panic caught at the module boundary.
    Panic(String),
}

impl From<ParamError> for CommandError {
    fn from(e: ParamError) -> Self {
        Self::Param(e)
    }
}

impl From<SpecError> for CommandError {
    fn from(e: SpecError) -> Self {
        Self::Spec(e)
    }
}

/// `FORCE` with `LOG`.
pub const FORCE_WITH_LOG: &str = "with LOG: a LOG records each admitted request and never holds \
     more than its limit; use FIXED or SLIDING to record usage after the fact";
/// `FORCE` on a LEASE limit or spec.
pub const FORCE_ON_LEASE: &str = "on a LEASE limit: its slots are taken with RL.LEASE and given \
     back with RL.RELEASE";
/// `FORCE` with `PEEK`.
pub const FORCE_WITH_PEEK: &str = "with PEEK: FORCE records usage, PEEK records nothing";
/// `RENEW` with `QUANTITY 0`.
pub const RENEW_WITH_QUANTITY_ZERO: &str =
    "with QUANTITY 0: a renewal holds at least one slot, QUANTITY 0 only reports";
/// `RENEW` in RL.ALL.
pub const RENEW_IN_ALL: &str =
    "in RL.ALL: renew a lease on its own with RL.LEASE key limit lease token RENEW";
/// `FORCE` with `MAXWAIT`.
pub const FORCE_WITH_MAXWAIT: &str =
    "with MAXWAIT: FORCE records usage that already happened, MAXWAIT reserves a later start";

impl CommandError {
    /// The error for an arithmetic overflow at `now`: the clock's fault when it reads a time
    /// near the end of 64-bit nanosecond time, else the request's.
    pub fn overflow(overflow: Overflow, now: Instant) -> Self {
        if now.is_near_the_end_of_time() {
            Self::ClockOverflow {
                now_s: now.as_ns() / NANOS_PER_SEC,
            }
        } else {
            Self::Overflow(overflow)
        }
    }

    /// Returns the full error reply, code included.
    pub fn reply_text(&self) -> String {
        match self {
            Self::Param(e) => format!("ERR {e}"),
            Self::Overflow(e) => format!("ERR {e}"),
            Self::ClockOverflow { now_s } => format!(
                "ERR arithmetic overflow: the server's clock reads {now_s} s since the epoch, too \
                 close to the year 2554 where 64-bit nanosecond time ends; check the server's \
                 clock"
            ),
            Self::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value".to_owned()
            }
            Self::WrongAlgorithm { key, held, asked } => format!(
                "ERR key '{key}' holds a {}, not a {}: use the same algorithm for a key, or \
                 another key",
                held.describe(),
                asked.describe()
            ),
            Self::Spec(e) => format!("ERR {e}"),
            Self::LeaseLimitTooHigh { limit, max } => format!(
                "ERR limit {limit} is above rl.lease-max-limit ({max}) for LEASE, which stores \
                 every lease: raise rl.lease-max-limit for larger concurrency limits"
            ),
            Self::CannotForce(reason) => format!("ERR FORCE cannot be used {reason}"),
            Self::CannotRenew(reason) => format!("ERR RENEW cannot be used {reason}"),
            Self::LeaseLost { key, token } => {
                format!("LEASELOST lease '{token}' on key '{key}' is not held")
            }
            Self::TooManyKeys { numkeys, max } => format!(
                "ERR numkeys {numkeys} is above rl.all-max-keys ({max}): give fewer keys per \
                 call, or raise rl.all-max-keys"
            ),
            Self::RefundOnLease { key } => format!(
                "ERR key '{key}' holds a LEASE limit: give its slots back with RL.RELEASE key \
                 token"
            ),
            Self::LogLimitTooHigh { limit, max } => format!(
                "ERR limit {limit} is above rl.log-max-limit ({max}) for LOG, which stores every \
                 request: use SLIDING for large limits, or raise rl.log-max-limit"
            ),
            Self::UnknownArgument(arg) => format!("ERR syntax error: unknown argument '{arg}'"),
            Self::Duplicate(kw) => format!("ERR syntax error: {kw} given more than once"),
            Self::Syntax(what) => format!("ERR syntax error: {what}"),
            Self::MissingValue(kw) => format!("ERR syntax error: {kw} needs a value"),
            Self::Arity(cmd) => format!("ERR wrong number of arguments for '{cmd}' command"),
            // The server's own text for commands refused under `maxmemory`.
            Self::OutOfMemory => {
                "OOM command not allowed when used memory > 'maxmemory'.".to_owned()
            }
            Self::InternalOnly(cmd) => format!(
                "ERR {cmd} is internal: it is accepted only from the replication stream or AOF"
            ),
            Self::BadState(e) => format!("ERR invalid limiter state: {e}"),
            Self::Internal(msg) => format!("ERR internal error in redis-rl: {msg}"),
            Self::Panic(msg) => {
                format!("ERR internal error in redis-rl (see the server log): {msg}")
            }
        }
    }
}
