//! CommandError, and the one place that spells every error reply.

use crate::codec::DecodeError;
use crate::decision::Overflow;
use crate::limit::SpecError;
use crate::params::ParamError;
use crate::state::Algorithm;

/// Everything a command can fail with. Each becomes exactly one reply string in
/// [`CommandError::reply_text`].
#[derive(Debug)]
pub enum CommandError {
    /// A bad argument value; the error names it.
    Param(ParamError),
    /// Time arithmetic would overflow 64-bit nanoseconds.
    Overflow(Overflow),
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

impl From<Overflow> for CommandError {
    fn from(e: Overflow) -> Self {
        Self::Overflow(e)
    }
}

impl CommandError {
    /// Returns the full error reply, code included.
    pub fn reply_text(&self) -> String {
        match self {
            Self::Param(e) => format!("ERR {e}"),
            Self::Overflow(e) => format!("ERR {e}"),
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
            Self::LogLimitTooHigh { limit, max } => format!(
                "ERR limit {limit} is above rl.log-max-limit ({max}) for LOG, which stores every \
                 request: use SLIDING for large limits, or raise rl.log-max-limit"
            ),
            Self::UnknownArgument(arg) => format!("ERR syntax error: unknown argument '{arg}'"),
            Self::Duplicate(kw) => format!("ERR syntax error: {kw} given more than once"),
            Self::Syntax(what) => format!("ERR syntax error: {what}"),
            Self::MissingValue(kw) => format!("ERR syntax error: {kw} needs a value"),
            Self::Arity(cmd) => format!("ERR wrong number of arguments for '{cmd}' command"),
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
