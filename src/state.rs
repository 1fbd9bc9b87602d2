//! The stored value of one limiter key, in every form the rest of the crate needs: owned
//! ([`State`]), borrowed where it lies ([`StateRef`]), the writes a decision makes
//! ([`Write`]) and the effects replicas and the AOF apply ([`Effect`]).
//!
//! Every question about a stored value that does not depend on its algorithm (which
//! algorithm, its limit, what it reports at `now`) is answered here, once.

use crate::algo::fixed_window::{self, FixedState};
use crate::algo::gcra::{self, GcraRequest, GcraState};
use crate::algo::lease::{LeaseState, LeaseWrite};
use crate::algo::sliding_log::{self, LogState, LogWrite};
use crate::algo::sliding_window::{self, SlidingState};
use crate::decision::{Decision, Overflow};
use crate::params::{GcraParams, WindowParams};
use crate::time::Instant;

/// Algorithm names what a key holds: it is part of the key's state, and a call with another
/// algorithm is an error, never a silent reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// GCRA (`RL.GCRA`, `CL.THROTTLE`, `GCRA` specs).
    Gcra,
    /// Fixed window counter.
    Fixed,
    /// Sliding window counter.
    Sliding,
    /// Exact sliding log.
    Log,
    /// Concurrency leases.
    Lease,
}

impl Algorithm {
    /// What a key of this algorithm holds, as errors name it (`FIXED window`).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Gcra => "GCRA limiter",
            Self::Fixed => "FIXED window",
            Self::Sliding => "SLIDING window",
            Self::Log => "LOG window",
            Self::Lease => "LEASE limit",
        }
    }
}

/// State is the owned value of one limiter key. The window states are boxed so that a GCRA
/// key, the most common, stays small.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum State {
    /// A GCRA key.
    Gcra(GcraState),
    /// A FIXED window key.
    Fixed(Box<FixedState>),
    /// A SLIDING window key.
    Sliding(Box<SlidingState>),
    /// A LOG window key.
    Log(Box<LogState>),
    /// A LEASE key.
    Lease(Box<LeaseState>),
}

/// StateRef is a key's value seen where it lies (GCRA by value: its stored form is packed).
#[derive(Debug, Clone, Copy)]
pub enum StateRef<'a> {
    /// A GCRA key.
    Gcra(GcraState),
    /// A FIXED window key.
    Fixed(&'a FixedState),
    /// A SLIDING window key.
    Sliding(&'a SlidingState),
    /// A LOG window key.
    Log(&'a LogState),
    /// A LEASE key.
    Lease(&'a LeaseState),
}

impl State {
    /// The state `write` makes of a missing key (None for a refund or release, which leave a
    /// missing key missing).
    pub fn from_write(write: &Write) -> Option<State> {
        let mut state = match write {
            Write::Gcra(g) => return Some(State::Gcra(*g)),
            Write::Fixed(s) => return Some(State::Fixed(Box::new(*s))),
            Write::Sliding(s) => return Some(State::Sliding(Box::new(*s))),
            Write::Log(w) => State::Log(Box::new(LogState::new(&crate::params::WindowParams {
                limit: w.limit,
                window: w.window,
            }))),
            Write::Lease(w) => match **w {
                LeaseWrite::Acquire { .. } => State::Lease(Box::default()),
                LeaseWrite::Release { .. } => return None,
            },
            Write::LogRefund { .. } => return None,
        };
        state.apply(write);
        Some(state)
    }

    /// Applies `write` in place: stores a new GCRA/FIXED/SLIDING state, appends to or refunds
    /// a LOG, takes or releases a lease. Returns false, changing nothing, when the write is
    /// for another algorithm.
    pub fn apply(&mut self, write: &Write) -> bool {
        match (self, write) {
            (State::Gcra(g), Write::Gcra(w)) => *g = *w,
            (State::Fixed(s), Write::Fixed(w)) => **s = *w,
            (State::Sliding(s), Write::Sliding(w)) => **s = *w,
            (State::Log(s), Write::Log(w)) => s.apply(w),
            (State::Log(s), Write::LogRefund { at, quantity }) => {
                s.refund(*at, *quantity);
            }
            (State::Lease(s), Write::Lease(w)) => s.apply(w),
            _ => return false,
        }
        true
    }

    /// Whether a LOG holds no request, or a LEASE no lease, any more (the key goes).
    pub fn is_emptied(&self) -> bool {
        match self {
            State::Log(s) => s.log.total() == 0,
            State::Lease(s) => s.is_empty(),
            _ => false,
        }
    }

    /// Returns a borrowed view.
    pub fn as_ref(&self) -> StateRef<'_> {
        match self {
            Self::Gcra(g) => StateRef::Gcra(*g),
            Self::Fixed(s) => StateRef::Fixed(s),
            Self::Sliding(s) => StateRef::Sliding(s),
            Self::Log(s) => StateRef::Log(s),
            Self::Lease(s) => StateRef::Lease(s),
        }
    }
}

impl StateRef<'_> {
    /// Which algorithm the key holds.
    pub fn algorithm(self) -> Algorithm {
        match self {
            Self::Gcra(_) => Algorithm::Gcra,
            Self::Fixed(_) => Algorithm::Fixed,
            Self::Sliding(_) => Algorithm::Sliding,
            Self::Log(_) => Algorithm::Log,
            Self::Lease(_) => Algorithm::Lease,
        }
    }

    /// The limit (burst for GCRA) of the key's last write.
    pub fn limit(self) -> u64 {
        match self {
            Self::Gcra(g) => g.burst,
            Self::Fixed(s) => s.limit,
            Self::Sliding(s) => s.limit,
            Self::Log(s) => s.limit,
            Self::Lease(s) => s.limit,
        }
    }

    /// The instant the key is idle again as written (a missing key's equal): GCRA's TAT, the
    /// end of FIXED's window, the end of SLIDING's next window while its current count is not
    /// zero (else of its window), when LOG's newest request leaves its window, when the last
    /// lease ends. None for an empty LOG or LEASE. It does not depend on the time it is asked:
    /// a key's expiry is this instant.
    #[inline(always)]
    pub fn idle_at(self) -> Option<Instant> {
        match self {
            Self::Gcra(g) => Some(g.tat),
            Self::Fixed(s) => Some(s.window_start.saturating_add(s.window)),
            Self::Sliding(s) => {
                let windows = if s.curr > 0 { 2 } else { 1 };
                Some(
                    s.window_start
                        .saturating_add(s.window.saturating_mul(windows)),
                )
            }
            Self::Log(s) => s.log.last().map(|t| t.saturating_add(s.window)),
            Self::Lease(s) => s.leases().map(|l| l.expires_at).max(),
        }
    }

    /// What `QUANTITY 0` would report at `now` under the parameters of the key's last write
    /// (used where a command has no parameters of its own, e.g. RL.REFUND).
    ///
    /// Errors: [`Overflow`] if the stored state's arithmetic leaves 64-bit nanoseconds (not
    /// possible for a state that decodes).
    pub fn report(self, now: Instant) -> Result<Decision, Overflow> {
        let window = |limit, window| WindowParams::new(limit, window).map_err(|_| Overflow);
        Ok(match self {
            Self::Gcra(g) => {
                let p = GcraParams::from_interval(g.burst, g.emission_interval)
                    .map_err(|_| Overflow)?;
                gcra::decide(&p, Some(&g), now, GcraRequest::of(0))?.decision
            }
            Self::Fixed(s) => {
                fixed_window::decide(&window(s.limit, s.window)?, Some(s), now, 0)?.decision
            }
            Self::Sliding(s) => {
                sliding_window::decide(&window(s.limit, s.window)?, Some(s), now, 0)?.decision
            }
            Self::Log(s) => {
                sliding_log::decide(&window(s.limit, s.window)?, Some(s), now, 0)?.decision
            }
            Self::Lease(s) => s.report(s.limit, now),
        })
    }

    /// Gives back up to `quantity` requests at `now` (RL.REFUND): GCRA moves its TAT back,
    /// FIXED and SLIDING lower the current window's count, LOG removes its most recent
    /// requests. Pure: the returned action is the caller's to carry out. None for a LEASE
    /// key, whose slots are given back by releasing the lease that holds them.
    pub fn refund(self, now: Instant, quantity: u64) -> Option<Refund> {
        let decided = |refunded: u64, after: Option<Write>| Refund {
            refunded,
            action: match (refunded, after) {
                (0, _) => RefundAction::Nothing,
                (_, None) => RefundAction::Delete,
                (_, Some(write)) => RefundAction::Store(write),
            },
        };
        Some(match self {
            Self::Gcra(g) => {
                let (after, n) = gcra::refund(&g, now, quantity);
                decided(n, after.map(Write::Gcra))
            }
            Self::Fixed(s) => {
                let (after, n) = fixed_window::refund(s, now, quantity);
                decided(n, after.map(Write::Fixed))
            }
            Self::Sliding(s) => {
                let (after, n) = sliding_window::refund(s, now, quantity);
                decided(n, after.map(Write::Sliding))
            }
            Self::Log(s) => {
                // Requests already out of the window are dropped by the refund; nothing in
                // the window means nothing to give back and nothing touched (so master and
                // replicas keep identical logs).
                let in_window = s.in_window(now);
                let refunded = quantity.min(in_window);
                let after =
                    (refunded < in_window).then_some(Write::LogRefund { at: now, quantity });
                decided(refunded, after)
            }
            Self::Lease(_) => return None,
        })
    }

    /// Returns an owned copy.
    pub fn to_state(self) -> State {
        match self {
            Self::Gcra(g) => State::Gcra(g),
            Self::Fixed(s) => State::Fixed(Box::new(*s)),
            Self::Sliding(s) => State::Sliding(Box::new(*s)),
            Self::Log(s) => State::Log(Box::new(s.clone())),
            Self::Lease(s) => State::Lease(Box::new(s.clone())),
        }
    }
}

/// Refund is what RL.REFUND does to a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// Requests actually given back.
    pub refunded: u64,
    /// What to do to the key.
    pub action: RefundAction,
}

/// RefundAction is the change a refund makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundAction {
    /// Nothing to give back: the key is not touched.
    Nothing,
    /// The key is idle again: delete it, exactly as if it had expired.
    Delete,
    /// Store this write.
    Store(Write),
}

/// Write is what a command does to one key: a new state for GCRA and the counters (stored in
/// place), an append or a refund for a LOG (applied in place). It is deterministic (every
/// instant explicit), so it is also the effect replicas and the AOF apply. A lease write
/// (with its holder's token) is kept on the heap, so that the others are small values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Store this GCRA state.
    Gcra(GcraState),
    /// Store this FIXED state.
    Fixed(FixedState),
    /// Store this SLIDING state.
    Sliding(SlidingState),
    /// Apply this admitted request to the LOG (creating it if missing).
    Log(LogWrite),
    /// Give back up to `quantity` of the most recent requests of a LOG at `at` (a missing
    /// key stays missing).
    LogRefund {
        /// The refund's instant.
        at: Instant,
        /// Requests to give back.
        quantity: u64,
    },
    /// Take, renew or release a lease (a release on a missing key leaves it missing).
    Lease(Box<LeaseWrite>),
}

/// Effect is what replicas and the AOF apply to a key (`RL.APPLY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Replace the key's value with a whole state (AOF rewrite, and writes of GCRA and the
    /// counters, whose encoding is their whole state).
    Replace(State),
    /// Apply a LOG write (append or refund) to the key's log.
    Apply(Write),
    /// Delete the key (a refund back to idle).
    Delete,
}

impl Effect {
    /// The keyspace event for an effect that does not name the command that made it (an
    /// AOF rewrite's snapshot of a key, or a blob from a version before events were
    /// recorded): the command that writes such a state.
    pub fn default_event(&self) -> Event {
        match self {
            Self::Replace(State::Gcra(_)) => Event::Gcra,
            Self::Replace(State::Lease(_)) => Event::Lease,
            Self::Replace(_) | Self::Apply(Write::Log(_)) => Event::Window,
            Self::Apply(Write::Gcra(_)) => Event::Gcra,
            Self::Apply(Write::Fixed(_) | Write::Sliding(_)) => Event::Window,
            Self::Apply(Write::LogRefund { .. }) | Self::Delete => Event::Refund,
            Self::Apply(Write::Lease(w)) => match **w {
                LeaseWrite::Acquire { .. } => Event::Lease,
                LeaseWrite::Release { .. } => Event::Release,
            },
        }
    }
}

/// Event is the keyspace notification a write emits, named after the command that made it;
/// replicas and AOF loading emit the same (the effect carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `rl.gcra`
    Gcra,
    /// `rl.window`
    Window,
    /// `rl.all`
    All,
    /// `rl.refund`
    Refund,
    /// `cl.throttle`
    Throttle,
    /// `rl.lease`
    Lease,
    /// `rl.release`
    Release,
}

impl Event {
    /// Every event, by its code.
    const ALL: [Event; 7] = [
        Event::Gcra,
        Event::Window,
        Event::All,
        Event::Refund,
        Event::Throttle,
        Event::Lease,
        Event::Release,
    ];

    /// The event's name, as subscribers see it.
    pub fn name(self) -> &'static std::ffi::CStr {
        match self {
            Self::Gcra => c"rl.gcra",
            Self::Window => c"rl.window",
            Self::All => c"rl.all",
            Self::Refund => c"rl.refund",
            Self::Throttle => c"cl.throttle",
            Self::Lease => c"rl.lease",
            Self::Release => c"rl.release",
        }
    }

    /// The event's one-byte code in effects (stable: written to AOF files).
    pub fn code(self) -> u8 {
        match self {
            Self::Gcra => 1,
            Self::Window => 2,
            Self::All => 3,
            Self::Refund => 4,
            Self::Throttle => 5,
            Self::Lease => 6,
            Self::Release => 7,
        }
    }

    /// The event of a code, if known.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.code() == code)
    }
}
