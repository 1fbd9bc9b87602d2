//! The in-memory limiter of [`FailurePolicy::Local`](crate::FailurePolicy::Local): while
//! Redis is unreachable, this process decides with the module's own algorithms (the
//! project's core crate, `redis-rl` without its Redis glue), each limit optionally divided by
//! the fleet size.
//!
//! Keys are the keys as sent (with the prefix); state lives in a map bounded by
//! [`MAX_KEYS`]: when full, keys idle by now are dropped first, then the map is cleared (which
//! only forgets local usage, like a restart of the process).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_rl::algo::lease::LeaseParams;
use redis_rl::decision::{combine, Decision as CoreDecision, Verdict};
use redis_rl::limit::{Limit as CoreLimit, Request};
use redis_rl::params::{GcraParams, WindowParams};
use redis_rl::state::{RefundAction, State, Write};
use redis_rl::time::{Instant as CoreInstant, Span};

use crate::decision::{Decision, RetryAfter, Source};
use crate::error::Error;
use crate::limits::{Algorithm, Gcra, Lease, Limit, Window};

/// The most keys one process keeps in memory during an outage.
pub(crate) const MAX_KEYS: usize = 100_000;

/// One limit of a local decision: the key as sent, the limit, what it is charged, and the
/// holder's token for a lease.
pub(crate) struct LocalItem<'a> {
    pub(crate) key: &'a str,
    pub(crate) limit: &'a Limit,
    pub(crate) cost: u64,
    pub(crate) token: Option<&'a [u8]>,
}

/// What one local call asks (the same options as the Redis commands).
#[derive(Clone, Copy, Default)]
pub(crate) struct LocalOptions {
    pub(crate) peek: bool,
    pub(crate) force: bool,
    pub(crate) max_wait: Option<Duration>,
    /// A lease renewal only (`RENEW`): a token holding no live lease is not granted anew.
    pub(crate) renew: bool,
}

pub(crate) struct Memory {
    fleet: u64,
    states: Mutex<Store>,
}

/// The keys' states, and what each rate key owes: the units this limiter charged it (checks,
/// `FORCE`, reservations) and has not been given back yet. A refund after Redis answers
/// again gives them back here, where they were taken ([`Memory::refund_owed`]). An owed count
/// lives as long as its key's state: it is forgotten once the key is idle (as its Redis twin
/// would expire) or dropped.
#[derive(Default)]
struct Store {
    states: HashMap<String, State>,
    owed: HashMap<String, u64>,
}

/// The state is not idle at `at` (an idle one is gone, as an expired Redis key).
fn live(state: &State, at: CoreInstant) -> bool {
    state.as_ref().idle_at().is_some_and(|t| t > at)
}

fn now() -> CoreInstant {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64);
    CoreInstant::from_ns(ns)
}

fn share(n: u64, fleet: u64) -> u64 {
    (n / fleet).max(1)
}

fn usage(message: impl Into<String>) -> Error {
    Error::Usage(message.into())
}

/// Rounds up to whole milliseconds, at least 1 ms (as the module replies).
fn wait_ms(span: Span) -> Duration {
    let ms = span.as_ns().div_ceil(1_000_000).max(1);
    Duration::from_millis(ms)
}

fn ceil_ms(span: Span) -> Duration {
    Duration::from_millis(span.as_ns().div_ceil(1_000_000))
}

/// What a refund did in memory ([`Memory::refund_owed`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MemoryRefund {
    /// The part of the refund's `n` memory answered for (see `refund_owed`).
    pub(crate) taken: u64,
    /// Units given back.
    pub(crate) refunded: u64,
    /// Requests of cost 1 the key admits after the refund.
    pub(crate) remaining: u64,
    /// Time until the key is idle again, rounded up to whole milliseconds.
    pub(crate) reset_after: Duration,
}

impl Memory {
    pub(crate) fn new(fleet: u64) -> Memory {
        Memory {
            fleet: fleet.max(1),
            states: Mutex::new(Store::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limit this process enforces for `limit`: divided by the fleet size, rounding
    /// down, at least 1 (GCRA: its burst and its rate).
    pub(crate) fn local_limit(
        &self,
        limit: &Limit,
        token: Option<&[u8]>,
    ) -> Result<CoreLimit, Error> {
        let bad = |e: redis_rl::params::ParamError| usage(format!("local limit: {e}"));
        Ok(match limit {
            Limit::Gcra(g) => {
                let burst = share(g.burst(), self.fleet);
                let rate = share(g.rate(), self.fleet);
                let period = Span::from_ns(g.period().as_nanos() as u64);
                CoreLimit::Gcra(GcraParams::new(burst, rate, period).map_err(bad)?)
            }
            Limit::Window(w) => {
                let params = WindowParams::new(
                    share(w.limit(), self.fleet),
                    Span::from_ns(w.window().as_nanos() as u64),
                )
                .map_err(bad)?;
                match w.algorithm() {
                    Algorithm::Fixed => CoreLimit::Fixed(params),
                    Algorithm::Sliding => CoreLimit::Sliding(params),
                    Algorithm::Log => CoreLimit::Log(params),
                }
            }
            Limit::Lease(l) => {
                let token = token.ok_or_else(|| usage("a lease needs a token"))?;
                let token = redis_rl::params::token(token).map_err(bad)?;
                let params = LeaseParams {
                    limit: share(l.limit(), self.fleet),
                    lease: Span::from_ns(l.lease().as_nanos() as u64),
                };
                CoreLimit::Lease(params, Box::new(token))
            }
        })
    }

    /// The limit as this process enforces it (for the decision's `policy` and HTTP fields):
    /// divided by the fleet size, its name kept.
    fn share_of(&self, limit: &Limit) -> Limit {
        if self.fleet == 1 {
            return limit.clone();
        }
        let named = |l: Limit| match limit.name() {
            Some(n) => match l {
                Limit::Gcra(g) => g
                    .clone()
                    .named(n)
                    .map(Limit::from)
                    .unwrap_or(Limit::Gcra(g)),
                Limit::Window(w) => w
                    .clone()
                    .named(n)
                    .map(Limit::from)
                    .unwrap_or(Limit::Window(w)),
                Limit::Lease(e) => e
                    .clone()
                    .named(n)
                    .map(Limit::from)
                    .unwrap_or(Limit::Lease(e)),
            },
            None => l,
        };
        let shared = match limit {
            Limit::Gcra(g) => Gcra::new(
                share(g.burst(), self.fleet),
                share(g.rate(), self.fleet),
                g.period(),
            )
            .map(Limit::from),
            Limit::Window(w) => {
                Window::new(share(w.limit(), self.fleet), w.window(), w.algorithm())
                    .map(Limit::from)
            }
            Limit::Lease(l) => Lease::new(share(l.limit(), self.fleet), l.lease()).map(Limit::from),
        };
        shared.map_or_else(|_| limit.clone(), named)
    }

    /// Decides `items` together, as `RL.ALL` does (one item: as the single command does):
    /// the request is admitted only if every limit admits it, and then every limit is
    /// charged; otherwise nothing is written. Returns the combined decision and the per-item
    /// ones (empty `per_key` for one item).
    pub(crate) fn decide(
        &self,
        items: &[LocalItem<'_>],
        options: LocalOptions,
    ) -> Result<Decision, Error> {
        let at = now();
        let limits: Vec<CoreLimit> = items
            .iter()
            .map(|i| self.local_limit(i.limit, i.token))
            .collect::<Result<_, _>>()?;
        let mut store = self.lock();
        let mut outcomes = Vec::with_capacity(items.len());
        for (item, limit) in items.iter().zip(&limits) {
            let stored = store.states.get(item.key);
            let request = Request {
                quantity: item.cost,
                max_wait: options
                    .max_wait
                    .map(|w| Span::from_ns(w.as_nanos().min(u128::from(u64::MAX)) as u64)),
                force: options.force,
                renew: options.renew,
            };
            let outcome = limit
                .decide(stored.map(State::as_ref), at, request)
                .map_err(|e| usage(format!("local limiter: {e:?}")))?;
            outcomes.push(outcome);
        }
        let allowed = outcomes.iter().all(|o| o.decision.verdict.is_allowed());
        if allowed && !options.peek {
            let Store { states, owed } = &mut *store;
            if states.len() + items.len() > MAX_KEYS {
                states.retain(|_, s| live(s, at));
                if states.len() + items.len() > MAX_KEYS {
                    states.clear();
                }
                owed.retain(|k, _| states.contains_key(k));
            }
            for (item, o) in items.iter().zip(&outcomes) {
                if let Some(w) = &o.write {
                    let was_live = states.get(item.key).is_some_and(|s| live(s, at));
                    apply(states, item.key, w);
                    if !states.contains_key(item.key) || matches!(item.limit, Limit::Lease(_)) {
                        owed.remove(item.key);
                        continue;
                    }
                    let n = owed.entry(item.key.to_owned()).or_insert(0);
                    if !was_live {
                        *n = 0; // what an idle key owed is forgotten with its state
                    }
                    *n = n.saturating_add(item.cost);
                }
            }
        }
        drop(store);
        let reservation = options.max_wait.is_some();
        let per: Vec<Decision> = items
            .iter()
            .zip(&outcomes)
            .map(|(i, o)| {
                convert(
                    &o.decision,
                    Some(self.share_of(i.limit)),
                    Some(i.key.to_owned()),
                    reservation,
                )
            })
            .collect();
        if items.len() == 1 {
            let mut d = per.into_iter().next().ok_or_else(|| usage("no limit"))?;
            d.allowed = allowed;
            return Ok(d);
        }
        let charged: Vec<(CoreDecision, u64)> = items
            .iter()
            .zip(&outcomes)
            .map(|(i, o)| (o.decision, i.cost))
            .collect();
        let combined = combine(&charged);
        let binding = per
            .iter()
            .find(|d| d.limit == combined.limit && d.remaining == combined.remaining)
            .and_then(|d| d.policy.clone());
        let mut d = convert(&combined, binding, None, false);
        d.per_key = per;
        Ok(d)
    }

    /// Gives back up to `n` units of `key` (as `RL.REFUND`).
    pub(crate) fn refund(&self, key: &str, n: u64) -> MemoryRefund {
        self.refund_owed(key, n, false)
    }

    /// [`Memory::refund`] that also settles what `key` owes: `(taken, refunded)`. With
    /// `owed_only` it takes at most the units this limiter charged the key and has not given
    /// back (none owed: `(0, 0)`, nothing done), so that a refund of charges taken here comes
    /// back here and the rest can go to Redis; `taken` is the part of `n` it answered for
    /// (all of `n` without `owed_only`, once it holds the key; 0 when it does not).
    pub(crate) fn refund_owed(&self, key: &str, n: u64, owed_only: bool) -> MemoryRefund {
        let at = now();
        let mut store = self.lock();
        let Store { states, owed } = &mut *store;
        let Some(state) = states.get(key) else {
            return MemoryRefund::default();
        };
        let owes = if live(state, at) {
            owed.get(key).copied().unwrap_or(0)
        } else {
            0
        };
        let take = if owed_only { n.min(owes) } else { n };
        if take == 0 {
            return MemoryRefund::default();
        }
        let Some(refund) = state.as_ref().refund(at, take) else {
            return MemoryRefund::default(); // a lease: released, not refunded
        };
        // The key's figures after the refund, as RL.REFUND replies them: an idle key has
        // its whole limit and nothing to reset.
        let limit = state.as_ref().report(at).map_or(0, |d| d.limit);
        let left = owes - take.min(owes);
        match refund.action {
            RefundAction::Nothing => {}
            RefundAction::Delete => {
                states.remove(key);
            }
            RefundAction::Store(w) => apply(states, key, &w),
        }
        if left > 0 && states.contains_key(key) {
            owed.insert(key.to_owned(), left);
        } else {
            owed.remove(key);
        }
        let (remaining, reset_after) = match states.get(key).map(|s| s.as_ref().report(at)) {
            Some(Ok(d)) => (d.remaining, ceil_ms(d.reset_after)),
            Some(Err(_)) => (0, Duration::ZERO),
            None => (limit, Duration::ZERO),
        };
        MemoryRefund {
            taken: take,
            refunded: refund.refunded,
            remaining,
            reset_after,
        }
    }

    /// Frees the lease `token` holds on `key`; returns the slots freed.
    pub(crate) fn release(&self, key: &str, token: &[u8]) -> u64 {
        let at = now();
        let Some(token) = redis_rl::algo::lease::Token::new(token) else {
            return 0;
        };
        let mut store = self.lock();
        let Some(State::Lease(s)) = store.states.get(key) else {
            return 0;
        };
        let (freed, write) = redis_rl::algo::lease::release(s, at, &token);
        if let Some(w) = write {
            apply(&mut store.states, key, &Write::Lease(Box::new(w)));
        }
        freed
    }

    /// Keys held in memory (for tests and metrics).
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.lock().states.len()
    }
}

fn apply(states: &mut HashMap<String, State>, key: &str, w: &Write) {
    match states.get_mut(key) {
        Some(s) => {
            if !s.apply(w) {
                if let Some(fresh) = State::from_write(w) {
                    *s = fresh;
                }
            }
            if s.is_emptied() {
                states.remove(key);
            }
        }
        None => {
            if let Some(fresh) = State::from_write(w) {
                if !fresh.is_emptied() {
                    states.insert(key.to_owned(), fresh);
                }
            }
        }
    }
}

fn convert(
    d: &CoreDecision,
    policy: Option<Limit>,
    key: Option<String>,
    reservation: bool,
) -> Decision {
    let (allowed, retry_after) = match d.verdict {
        Verdict::Allowed => (true, RetryAfter::Wait(Duration::ZERO)),
        Verdict::Reserved { delay } => (
            true,
            RetryAfter::Wait(if reservation {
                ceil_ms(delay)
            } else {
                Duration::ZERO
            }),
        ),
        Verdict::Denied { retry_after } => (false, RetryAfter::Wait(wait_ms(retry_after))),
        Verdict::Never => (false, RetryAfter::Never),
    };
    Decision {
        allowed,
        limit: d.limit,
        remaining: d.remaining,
        retry_after,
        reset_after: ceil_ms(d.reset_after),
        degraded: true,
        blind: false,
        source: Source::Local,
        policy,
        key,
        per_key: Vec::new(),
    }
}
