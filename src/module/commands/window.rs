//! `RL.WINDOW key limit window [FIXED | SLIDING | LOG] [QUANTITY n] [PEEK]`.

use std::ffi::c_int;

use redis_module::raw;

use super::{expire_at_ms, five, once, unknown, Args, Options};
use crate::algo::sliding_log::LogState;
use crate::algo::{fixed_window, sliding_log, sliding_window};
use crate::codec::{self, State};
use crate::decision::Decision;
use crate::module::clock;
use crate::module::config;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::module::value::Value;
use crate::params::{self, WindowParams};

/// The window algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Fixed,
    Sliding,
    Log,
}

impl Algorithm {
    fn describe(self) -> &'static str {
        match self {
            Self::Fixed => "FIXED window",
            Self::Sliding => "SLIDING window",
            Self::Log => "LOG window",
        }
    }
}

/// A fully validated RL.WINDOW call.
struct WindowCall {
    key: *mut raw::RedisModuleString,
    params: WindowParams,
    algorithm: Algorithm,
    quantity: u64,
    peek: bool,
}

fn parse(args: Args<'_>) -> Result<WindowCall, CommandError> {
    let [_, key, limit, window, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.window"));
    };
    let limit = params::positive(unsafe { ffi::bytes(*limit) }, "limit")?;
    let window_ns = params::seconds(unsafe { ffi::bytes(*window) }, "window")?;
    let params = WindowParams::new(limit, window_ns)?;
    let (mut algorithm, mut quantity, mut peek) = (None, 1, false);
    let (mut seen_algorithm, mut seen_quantity) = (false, false);
    let mut options = Options::new(rest);
    while let Some(keyword) = options.next_keyword() {
        let chosen = if keyword.eq_ignore_ascii_case(b"FIXED") {
            Some(Algorithm::Fixed)
        } else if keyword.eq_ignore_ascii_case(b"SLIDING") {
            Some(Algorithm::Sliding)
        } else if keyword.eq_ignore_ascii_case(b"LOG") {
            Some(Algorithm::Log)
        } else {
            None
        };
        if let Some(a) = chosen {
            once(&mut seen_algorithm, "the algorithm (FIXED | SLIDING | LOG)")?;
            algorithm = Some(a);
        } else if keyword.eq_ignore_ascii_case(b"QUANTITY") {
            once(&mut seen_quantity, "QUANTITY")?;
            quantity = params::non_negative(options.value("QUANTITY")?, "QUANTITY")?;
        } else if keyword.eq_ignore_ascii_case(b"PEEK") {
            once(&mut peek, "PEEK")?;
        } else {
            return Err(unknown(keyword));
        }
    }
    let algorithm = algorithm.unwrap_or(Algorithm::Sliding);
    if algorithm == Algorithm::Log && limit > config::log_max_limit() {
        return Err(CommandError::LogLimitTooHigh { limit, max: config::log_max_limit() });
    }
    Ok(WindowCall { key: *key, params, algorithm, quantity, peek })
}

fn wrong(held: &Value<'_>, asked: Algorithm) -> CommandError {
    CommandError::WrongAlgorithm { held: held.describe(), asked: asked.describe() }
}

/// Runs RL.WINDOW (see SPEC.md). The reply is the five-integer array.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<c_int, CommandError> {
    let call = parse(args)?;
    let now_ns = clock::now_ns();
    let may_write = !call.peek && call.quantity > 0;
    let mut key = LimiterKey::open(ctx, call.key, may_write);
    let (p, n) = (&call.params, call.quantity);
    let decision: Decision = match call.algorithm {
        Algorithm::Fixed => {
            let stored = match key.load()? {
                None => None,
                Some(Value::Fixed(s)) => Some(*s),
                Some(other) => return Err(wrong(&other, call.algorithm)),
            };
            let out = fixed_window::decide(p, stored.as_ref(), now_ns, n)?;
            if let (true, Some(w)) = (may_write, out.write) {
                let expire = expire_at_ms(now_ns.saturating_add(out.decision.reset_after_ns));
                match key.load()? {
                    Some(Value::Fixed(s)) => *s = w,
                    _ => key.set_value(State::Fixed(Box::new(w))),
                }
                key.set_expire_at(expire);
                key.announce(|buf| codec::encode_fixed_into(&w, buf), expire, c"rl.window");
            }
            out.decision
        }
        Algorithm::Sliding => {
            let stored = match key.load()? {
                None => None,
                Some(Value::Sliding(s)) => Some(*s),
                Some(other) => return Err(wrong(&other, call.algorithm)),
            };
            let out = sliding_window::decide(p, stored.as_ref(), now_ns, n)?;
            if let (true, Some(w)) = (may_write, out.write) {
                let expire = expire_at_ms(now_ns.saturating_add(out.decision.reset_after_ns));
                match key.load()? {
                    Some(Value::Sliding(s)) => *s = w,
                    _ => key.set_value(State::Sliding(Box::new(w))),
                }
                key.set_expire_at(expire);
                key.announce(|buf| codec::encode_sliding_into(&w, buf), expire, c"rl.window");
            }
            out.decision
        }
        Algorithm::Log => {
            let out = match key.load()? {
                None => sliding_log::decide(p, None, now_ns, n)?,
                Some(Value::Log(s)) => sliding_log::decide(p, Some(s), now_ns, n)?,
                Some(other) => return Err(wrong(&other, call.algorithm)),
            };
            if let (true, Some(w)) = (may_write, out.write) {
                let expire = expire_at_ms(now_ns.saturating_add(out.decision.reset_after_ns));
                match key.load()? {
                    Some(Value::Log(s)) => s.apply(&w),
                    _ => {
                        let mut state = LogState::new(p);
                        state.apply(&w);
                        key.set_value(State::Log(Box::new(state)));
                    }
                }
                key.set_expire_at(expire);
                // The effect is the append itself (deterministic, O(1) bytes), not the log.
                key.announce(|buf| codec::encode_log_append_into(&w, buf), expire, c"rl.window");
            }
            out.decision
        }
    };
    drop(key);
    Ok(ffi::reply_integers(ctx, &five(&decision)))
}
