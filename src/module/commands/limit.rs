//! One limit on one key, shared by RL.GCRA, RL.WINDOW and RL.ALL: evaluate (pure decision on
//! the loaded state, no writes), then commit (store, expire, replicate, notify).

use std::ffi::CStr;

use super::expire_at_ms;
use crate::algo::fixed_window::{self, FixedState};
use crate::algo::gcra::{self, GcraRequest, GcraState};
use crate::algo::sliding_log::{self, LogState, LogWrite};
use crate::algo::sliding_window::{self, SlidingState};
use crate::codec::{self, State};
use crate::decision::Decision;
use crate::module::data_type::with_scratch;
use crate::module::error::CommandError;
use crate::module::keys::LimiterKey;
use crate::module::value::Value;
use crate::params::{GcraParams, WindowParams};

/// The window algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Fixed window counter.
    Fixed,
    /// Sliding window counter.
    Sliding,
    /// Exact sliding log.
    Log,
}

impl Algorithm {
    /// Parses `FIXED` / `SLIDING` / `LOG`, case-insensitively.
    pub fn parse(word: &[u8]) -> Option<Self> {
        if word.eq_ignore_ascii_case(b"FIXED") {
            Some(Self::Fixed)
        } else if word.eq_ignore_ascii_case(b"SLIDING") {
            Some(Self::Sliding)
        } else if word.eq_ignore_ascii_case(b"LOG") {
            Some(Self::Log)
        } else {
            None
        }
    }

    /// What a key of this algorithm holds, as errors name it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Fixed => "FIXED window",
            Self::Sliding => "SLIDING window",
            Self::Log => "LOG window",
        }
    }
}

/// One limit: its algorithm and validated parameters.
#[derive(Debug, Clone, Copy)]
pub enum Spec {
    /// GCRA, with an optional reservation horizon.
    Gcra {
        /// Burst and emission interval.
        params: GcraParams,
        /// `MAXWAIT` in ns.
        max_wait_ns: Option<u64>,
    },
    /// A window algorithm.
    Window {
        /// Limit and window length.
        params: WindowParams,
        /// Which window algorithm.
        algorithm: Algorithm,
    },
}

/// A write decided but not yet made.
#[derive(Debug, Clone)]
pub enum Pending {
    /// Store this GCRA state.
    Gcra(GcraState),
    /// Store this FIXED state.
    Fixed(FixedState),
    /// Store this SLIDING state.
    Sliding(SlidingState),
    /// Apply this append to the LOG.
    Log(LogWrite),
}

/// The decision for one key, and the write it implies if the request is admitted.
pub struct Evaluated {
    /// What to reply for this key.
    pub decision: Decision,
    /// The write (None for denials and QUANTITY 0).
    pub write: Option<Pending>,
    /// Absolute expiry for the write, ms since the epoch.
    pub expire_at_ms: i64,
}

fn wrong(key: String, held: &'static str, asked: &'static str) -> CommandError {
    CommandError::WrongAlgorithm { key, held, asked }
}

/// Decides `quantity` on `key` under `spec` at `now_ns`. Reads only.
///
/// Errors: WRONGTYPE, another algorithm on the key, or arithmetic overflow.
pub fn evaluate(
    key: &mut LimiterKey,
    spec: &Spec,
    now_ns: u64,
    quantity: u64,
) -> Result<Evaluated, CommandError> {
    let (decision, write) = match spec {
        Spec::Gcra {
            params,
            max_wait_ns,
        } => {
            let stored = match key.load()? {
                None => None,
                Some(Value::Gcra(g)) => Some(g),
                Some(other) => {
                    let held = other.describe();
                    return Err(wrong(key.display_name(), held, "GCRA limiter"));
                }
            };
            let request = GcraRequest {
                quantity,
                max_wait_ns: *max_wait_ns,
            };
            let out = gcra::decide(params, stored.as_ref(), now_ns, request)?;
            (out.decision, out.write.map(Pending::Gcra))
        }
        Spec::Window {
            params,
            algorithm: Algorithm::Fixed,
        } => {
            let stored = match key.load()? {
                None => None,
                Some(Value::Fixed(s)) => Some(*s),
                Some(other) => {
                    let held = other.describe();
                    return Err(wrong(key.display_name(), held, Algorithm::Fixed.describe()));
                }
            };
            let out = fixed_window::decide(params, stored.as_ref(), now_ns, quantity)?;
            (out.decision, out.write.map(Pending::Fixed))
        }
        Spec::Window {
            params,
            algorithm: Algorithm::Sliding,
        } => {
            let stored = match key.load()? {
                None => None,
                Some(Value::Sliding(s)) => Some(*s),
                Some(other) => {
                    let held = other.describe();
                    return Err(wrong(
                        key.display_name(),
                        held,
                        Algorithm::Sliding.describe(),
                    ));
                }
            };
            let out = sliding_window::decide(params, stored.as_ref(), now_ns, quantity)?;
            (out.decision, out.write.map(Pending::Sliding))
        }
        Spec::Window {
            params,
            algorithm: Algorithm::Log,
        } => {
            let out = match key.load()? {
                None => sliding_log::decide(params, None, now_ns, quantity)?,
                Some(Value::Log(s)) => sliding_log::decide(params, Some(s), now_ns, quantity)?,
                Some(other) => {
                    let held = other.describe();
                    return Err(wrong(key.display_name(), held, Algorithm::Log.describe()));
                }
            };
            (out.decision, out.write.map(Pending::Log))
        }
    };
    if let Some(w) = &write {
        check_storable(w)?;
    }
    let expire_at_ms = expire_at_ms(now_ns.saturating_add(decision.reset_after_ns));
    Ok(Evaluated {
        decision,
        write,
        expire_at_ms,
    })
}

/// Refuses a write whose state would not load back (RDB, replica, AOF): a safety net under
/// the algorithms' own invariants, so that no bug can make a file unloadable. LOG appends
/// are not re-encoded here (that would cost O(log) per request); their invariants are
/// property-tested.
fn check_storable(write: &Pending) -> Result<(), CommandError> {
    let encode = |buf: &mut Vec<u8>| match write {
        Pending::Gcra(g) => codec::encode_gcra_into(g, buf),
        Pending::Fixed(f) => codec::encode_fixed_into(f, buf),
        Pending::Sliding(s) => codec::encode_sliding_into(s, buf),
        Pending::Log(_) => {}
    };
    if matches!(write, Pending::Log(_)) {
        return Ok(());
    }
    with_scratch(encode, |bytes| codec::decode(bytes).map(|_| ())).map_err(|e| {
        CommandError::Internal(format!(
            "refusing to store a state that would not load back ({e})"
        ))
    })
}

/// Makes a decided write: stores it (in place where possible), sets the absolute expiry,
/// replicates the effect and emits the keyspace event `event`.
pub fn commit(key: &mut LimiterKey, write: &Pending, expire_at_ms: i64, event: &CStr) {
    match write {
        Pending::Gcra(g) => {
            key.put_gcra(g);
            key.set_expire_at(expire_at_ms);
            key.announce(|buf| codec::encode_gcra_into(g, buf), expire_at_ms, event);
        }
        Pending::Fixed(w) => {
            match key.load() {
                Ok(Some(Value::Fixed(s))) => *s = *w,
                _ => key.set_value(State::Fixed(Box::new(*w))),
            }
            key.set_expire_at(expire_at_ms);
            key.announce(|buf| codec::encode_fixed_into(w, buf), expire_at_ms, event);
        }
        Pending::Sliding(w) => {
            match key.load() {
                Ok(Some(Value::Sliding(s))) => *s = *w,
                _ => key.set_value(State::Sliding(Box::new(*w))),
            }
            key.set_expire_at(expire_at_ms);
            key.announce(
                |buf| codec::encode_sliding_into(w, buf),
                expire_at_ms,
                event,
            );
        }
        Pending::Log(w) => {
            match key.load() {
                Ok(Some(Value::Log(s))) => s.apply(w),
                _ => {
                    let params = WindowParams {
                        limit: w.limit,
                        window_ns: w.window_ns,
                    };
                    let mut state = LogState::new(&params);
                    state.apply(w);
                    key.set_value(State::Log(Box::new(state)));
                }
            }
            key.set_expire_at(expire_at_ms);
            // The effect is the append itself (deterministic, O(1) bytes), not the log.
            key.announce(
                |buf| codec::encode_log_append_into(w, buf),
                expire_at_ms,
                event,
            );
        }
    }
}
