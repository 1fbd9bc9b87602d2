//! The local fast path: the deny cache and batch credits. Pure bookkeeping, no I/O.
//!
//! Times are [`Instant`]s. The rules that keep the fast path from admitting what Redis would
//! deny:
//!
//! * Deny cache. After Redis denies `cost` units of (key, limit) with `retry_after = r`, a
//!   request of the same limit for at least `cost` units is denied locally until `sent + r`,
//!   where `sent` is when the denied request was *sent* (Redis decided at or after that
//!   instant, so the local deadline is never later than Redis's). It only ever denies.
//! * Batch credits. A credit is units already paid for in Redis (one `QUANTITY k` call) and
//!   handed out locally. Window credits are used and refunded only inside the window they
//!   were paid in (a unit paid in one window must not be used or given back in the next, or
//!   that window would admit more than its limit); GCRA leftovers are refunded only while the
//!   bucket cannot have drained past them (before `sent + k·T`), so a refund never gives back
//!   more than was really unused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::decision::{Decision, RetryAfter, Source};
use crate::limits::{Algorithm, Limit};

struct Denial {
    until: Instant,
    reset_until: Instant,
    cost: u64,
    keys: Vec<String>,
    decision: Decision,
}

/// Answers denied keys locally until their `retry_after` runs out.
pub(crate) struct DenyCache {
    entries: Mutex<HashMap<String, Denial>>,
    max_entries: usize,
}

fn ceil_ms(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(ms as u64)
}

impl DenyCache {
    pub(crate) fn new(max_entries: usize) -> DenyCache {
        DenyCache {
            entries: Mutex::new(HashMap::new()),
            max_entries,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Denial>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A local denial for `cost` units of `ck` at `now`, or `None`.
    pub(crate) fn lookup(&self, ck: &str, cost: u64, now: Instant) -> Option<Decision> {
        let mut entries = self.lock();
        let entry = entries.get(ck)?;
        if now >= entry.until {
            entries.remove(ck);
            return None;
        }
        if cost < entry.cost {
            return None; // a smaller request may pass sooner: ask Redis
        }
        let d = &entry.decision;
        let retry = ceil_ms(entry.until - now).max(Duration::from_millis(1));
        let reset = entry.reset_until.saturating_duration_since(now);
        Some(Decision {
            allowed: false,
            limit: d.limit,
            remaining: 0,
            retry_after: RetryAfter::Wait(retry),
            reset_after: reset.max(retry),
            degraded: false,
            blind: false,
            source: Source::Local,
            policy: d.policy.clone(),
            key: d.key.clone(),
            per_key: d.per_key.clone(),
        })
    }

    /// Remembers a retryable denial decided no earlier than `sent`.
    pub(crate) fn store(
        &self,
        ck: &str,
        keys: &[&str],
        cost: u64,
        decision: &Decision,
        sent: Instant,
    ) {
        let RetryAfter::Wait(retry) = decision.retry_after else {
            return;
        };
        if decision.allowed || decision.degraded {
            return;
        }
        let now = Instant::now();
        let mut entries = self.lock();
        if entries.len() >= self.max_entries && !entries.contains_key(ck) {
            entries.retain(|_, e| e.until > now);
            if entries.len() >= self.max_entries {
                // Forgetting a denial only costs a round trip: never admits anything.
                entries.clear();
            }
        }
        entries.insert(
            ck.to_owned(),
            Denial {
                until: sent + retry,
                reset_until: sent + decision.reset_after,
                cost,
                keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                decision: decision.clone(),
            },
        );
    }

    /// Drops every entry that involves `key` (after a local refund).
    pub(crate) fn forget(&self, key: &str) {
        self.lock().retain(|_, e| !e.keys.iter().any(|k| k == key));
    }
}

/// Units paid for in Redis and not yet handed out.
#[derive(Debug, Clone)]
pub(crate) struct Credit {
    pub(crate) key: String,
    pub(crate) units: u64,
    pub(crate) use_until: Instant,
    pub(crate) refund_until: Instant,
    pub(crate) remaining_seen: u64,
}

/// `(use_until, refund_until)` for `taken` units paid at `sent`.
///
/// GCRA: use within the hold; refund only before `sent + taken·T − margin`.
/// FIXED: the window ends `reset_after` after Redis decided (≥ sent).
/// SLIDING: after a write the key is idle at the end of the *next* window, so the current one
/// ends `reset_after − window` after Redis decided.
pub(crate) fn credit_deadlines(
    limit: &Limit,
    taken: u64,
    sent: Instant,
    reset_after: Duration,
    hold: Duration,
    margin: Duration,
) -> (Instant, Instant) {
    match limit {
        Limit::Gcra(g) => {
            let drain = Duration::from_nanos(taken.saturating_mul(g.interval_ns()));
            let refund_until = (sent + drain).checked_sub(margin).unwrap_or(sent);
            (sent + hold, refund_until)
        }
        Limit::Window(w) => {
            let mut end = reset_after;
            if w.algorithm() == Algorithm::Sliding {
                end = end.saturating_sub(w.window());
            }
            let boundary = (sent + end).checked_sub(margin).unwrap_or(sent);
            ((sent + hold).min(boundary), boundary)
        }
        Limit::Lease(_) => (sent, sent),
    }
}

/// The batch credits of one limiter, keyed like the deny cache.
pub(crate) struct Credits {
    credits: Mutex<HashMap<String, Credit>>,
}

impl Credits {
    pub(crate) fn new() -> Credits {
        Credits {
            credits: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Credit>> {
        self.credits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands out `cost` units from a live credit; returns it (after) or `None`. A credit
    /// past its use time stays for [`Credits::expired`] to refund.
    pub(crate) fn take(&self, ck: &str, cost: u64, now: Instant) -> Option<Credit> {
        let mut credits = self.lock();
        let credit = credits.get_mut(ck)?;
        if now >= credit.use_until || credit.units < cost {
            return None;
        }
        credit.units -= cost;
        Some(credit.clone())
    }

    /// Stores a new credit. A live one it meets (another task's batch of the same key and
    /// limit, taken at about the same time) is merged into it with the earlier of the two
    /// deadlines each (before both, both sets of units may be used and refunded), so that its
    /// units stay usable; returns one past its use time that still holds units (to refund).
    pub(crate) fn put(&self, ck: &str, mut credit: Credit, now: Instant) -> Option<Credit> {
        let mut credits = self.lock();
        if let Some(old) = credits.get(ck) {
            if old.units > 0 && now < old.use_until {
                credit.units += old.units;
                credit.remaining_seen = credit.remaining_seen.min(old.remaining_seen);
                credit.use_until = credit.use_until.min(old.use_until);
                credit.refund_until = credit.refund_until.min(old.refund_until);
            }
        }
        credits
            .insert(ck.to_owned(), credit)
            .filter(|old| old.units > 0 && now >= old.use_until)
    }

    /// Removes and returns credits past their use time that still hold units.
    pub(crate) fn expired(&self, now: Instant) -> Vec<Credit> {
        let mut out = Vec::new();
        self.lock().retain(|_, c| {
            if now >= c.use_until {
                if c.units > 0 {
                    out.push(c.clone());
                }
                false
            } else {
                true
            }
        });
        out
    }

    /// Removes and returns every credit holding units (on close).
    pub(crate) fn drain(&self) -> Vec<Credit> {
        self.lock()
            .drain()
            .map(|(_, c)| c)
            .filter(|c| c.units > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gcra;

    fn denial(retry_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 1,
            remaining: 0,
            retry_after: RetryAfter::Wait(Duration::from_millis(retry_ms)),
            reset_after: Duration::from_millis(retry_ms),
            degraded: false,
            blind: false,
            source: Source::Module,
            policy: Some(Gcra::new(1, 1, 1).unwrap().into()),
            key: Some("k".into()),
            per_key: vec![],
        }
    }

    #[test]
    fn deny_cache_denies_until_sent_plus_retry_and_only_for_as_much() {
        let c = DenyCache::new(10);
        let sent = Instant::now();
        c.store("ck", &["k"], 2, &denial(100), sent);
        let d = c.lookup("ck", 2, sent + Duration::from_millis(40)).unwrap();
        assert_eq!(d.retry_after, RetryAfter::Wait(Duration::from_millis(60)));
        assert_eq!(d.source, Source::Local);
        assert!(c.lookup("ck", 1, sent).is_none(), "smaller cost asks Redis");
        assert!(c
            .lookup("ck", 2, sent + Duration::from_millis(100))
            .is_none());
        c.store("ck", &["k"], 1, &denial(100), sent);
        c.forget("k");
        assert!(c.lookup("ck", 1, sent).is_none());
    }

    #[test]
    fn a_concurrent_batch_merges_into_the_live_credit() {
        let c = Credits::new();
        let now = Instant::now();
        let credit = |units, use_s, refund_s, seen| Credit {
            key: "k".into(),
            units,
            use_until: now + Duration::from_secs(use_s),
            refund_until: now + Duration::from_secs(refund_s),
            remaining_seen: seen,
        };
        assert!(c.put("ck", credit(9, 10, 20, 30), now).is_none());
        assert!(c.put("ck", credit(9, 12, 18, 21), now).is_none());
        let got = c.take("ck", 1, now).unwrap();
        assert_eq!(got.units, 17);
        assert_eq!(got.use_until, now + Duration::from_secs(10));
        assert_eq!(got.refund_until, now + Duration::from_secs(18));
        assert_eq!(got.remaining_seen, 21);
        // Past its use time, the old one is not merged: it is returned to be refunded.
        let later = now + Duration::from_secs(11);
        let old = c.put("ck", credit(4, 30, 40, 5), later).unwrap();
        assert_eq!(old.units, 17);
        assert_eq!(c.take("ck", 1, later).unwrap().units, 3);
    }

    #[test]
    fn deny_cache_stays_bounded() {
        let c = DenyCache::new(3);
        let sent = Instant::now();
        for i in 0..10 {
            c.store(&format!("ck{i}"), &["k"], 1, &denial(1000), sent);
        }
        assert!(c.lock().len() <= 3);
    }
}
