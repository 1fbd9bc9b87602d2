//! Concurrency leases: at most `limit` slots held at once, each group of slots held by a
//! named lease that expires, so a holder that crashes frees its slots when its lease runs
//! out (the counting-semaphore-with-timeouts shape of Stripe's concurrent-requests limiter,
//! in one atomic command instead of a sorted set and a script).
//!
//! A request of `n` slots at `now` for `token`: leases whose expiry is at or before `now` are
//! gone; if `token` holds a live lease the call renews it (expiry `now + lease`, size `n`)
//! provided the *other* live leases plus `n` fit in `limit`; otherwise a new lease
//! `(token, n, now + lease)` is taken if the live leases plus `n` fit. A retried acquire whose
//! reply was lost therefore renews instead of taking a second lease. A renewal only
//! ([`renew`], `RENEW`) refuses to take a new lease: a holder whose lease lapsed learns that
//! it lost its slots instead of being granted them again as a newcomer.
//!
//! Storage: one byte buffer of records `expiry_ns (u64 LE) · slots (u64 LE) · token length
//! (u8) · token`, 17 bytes plus the token per lease, oldest write first.

use crate::decision::{Decision, Outcome, Overflow, Verdict};
use crate::time::{Instant, Span};

/// The longest token: 64 bytes.
pub const MAX_TOKEN_LEN: usize = 64;

/// Bytes of a record besides its token.
const RECORD_OVERHEAD: usize = 17;

/// Token names a lease holder: 1 to 64 bytes, binary-safe, kept inline (no allocation).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    len: u8,
    bytes: [u8; MAX_TOKEN_LEN],
}

impl Token {
    /// Wraps `bytes` if they are 1 to 64 bytes long.
    pub fn new(bytes: &[u8]) -> Option<Token> {
        if bytes.is_empty() || bytes.len() > MAX_TOKEN_LEN {
            return None;
        }
        let mut t = Token {
            len: bytes.len() as u8,
            bytes: [0; MAX_TOKEN_LEN],
        };
        t.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(t)
    }

    /// The token's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// LeaseParams are the validated parameters of one LEASE limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseParams {
    /// Slots held at once; ≥ 1.
    pub limit: u64,
    /// How long a lease lasts without renewal; `1 ns..=MAX_PERIOD`.
    pub lease: Span,
}

/// One lease: who holds how many slots until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The holder.
    pub token: Token,
    /// Slots held (≥ 1).
    pub slots: u64,
    /// When the lease ends unless renewed.
    pub expires_at: Instant,
}

/// LeaseState is what a LEASE key stores: the limit of its last write and the leases held
/// then (expired ones are dropped at the next write).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LeaseState {
    /// The limit of the last write.
    pub limit: u64,
    records: Vec<u8>,
}

/// LeaseWrite is what a write does to a LEASE key, with every instant explicit (so it is also
/// what replicas and the AOF receive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Drop the leases expired at `at`, then take or renew `lease` and adopt `limit`.
    Acquire {
        /// The limit to record.
        limit: u64,
        /// The write's instant.
        at: Instant,
        /// The lease taken or renewed.
        lease: Lease,
    },
    /// Drop the leases expired at `at`, then the lease of `token`.
    Release {
        /// The write's instant.
        at: Instant,
        /// The holder whose slots are freed.
        token: Token,
    },
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(chunk.try_into().ok()?))
}

/// Iterates the records of a buffer; stops at the first malformed one.
fn records(bytes: &[u8]) -> impl Iterator<Item = Lease> + '_ {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let expires = read_u64(bytes, pos)?;
        let slots = read_u64(bytes, pos + 8)?;
        let len = usize::from(*bytes.get(pos + 16)?);
        let token = Token::new(bytes.get(pos + RECORD_OVERHEAD..pos + RECORD_OVERHEAD + len)?)?;
        pos += RECORD_OVERHEAD + len;
        Some(Lease {
            token,
            slots,
            expires_at: Instant::from_ns(expires),
        })
    })
}

fn put(out: &mut Vec<u8>, lease: &Lease) {
    out.extend_from_slice(&lease.expires_at.as_ns().to_le_bytes());
    out.extend_from_slice(&lease.slots.to_le_bytes());
    out.push(lease.token.len);
    out.extend_from_slice(lease.token.as_bytes());
}

impl LeaseState {
    /// The leases, oldest write first (expired ones included until the next write).
    pub fn leases(&self) -> impl Iterator<Item = Lease> + '_ {
        records(&self.records)
    }

    /// The records' bytes (the codec stores exactly these).
    pub fn bytes(&self) -> &[u8] {
        &self.records
    }

    /// Number of leases stored.
    pub fn len(&self) -> usize {
        self.leases().count()
    }

    /// Whether no lease is stored.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes allocated for the leases.
    pub fn allocated_bytes(&self) -> usize {
        self.records.capacity()
    }

    /// Rebuilds a state from its codec fields, validating everything: records parse
    /// exactly, slots ≥ 1, tokens 1 to 64 bytes and distinct, slots summing to at most
    /// `limit` (≥ 1). Returns None for anything else.
    pub fn from_parts(limit: u64, count: u64, bytes: &[u8]) -> Option<LeaseState> {
        if limit == 0 {
            return None;
        }
        let mut pos = 0usize;
        let mut held = 0u64;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..count {
            let slots = read_u64(bytes, pos + 8)?;
            let len = usize::from(*bytes.get(pos + 16)?);
            let token = bytes.get(pos + RECORD_OVERHEAD..pos + RECORD_OVERHEAD + len)?;
            if slots == 0 || Token::new(token).is_none() || !seen.insert(token) {
                return None;
            }
            held = held.checked_add(slots)?;
            pos += RECORD_OVERHEAD + len;
        }
        if pos != bytes.len() || held > limit {
            return None;
        }
        let mut records = Vec::with_capacity(bytes.len());
        records.extend_from_slice(bytes);
        Some(LeaseState { limit, records })
    }

    /// Applies a write: drops the leases expired at its instant, then takes, renews or
    /// releases. O(stored leases).
    pub fn apply(&mut self, write: &LeaseWrite) {
        let (at, token, new) = match write {
            LeaseWrite::Acquire { limit, at, lease } => {
                self.limit = *limit;
                (*at, lease.token, Some(*lease))
            }
            LeaseWrite::Release { at, token } => (*at, *token, None),
        };
        let mut kept = Vec::with_capacity(self.records.len() + RECORD_OVERHEAD + MAX_TOKEN_LEN);
        for l in self.leases() {
            if l.expires_at > at && l.token != token {
                put(&mut kept, &l);
            }
        }
        if let Some(lease) = new {
            put(&mut kept, &lease);
        }
        kept.shrink_to_fit();
        self.records = kept;
    }

    /// The instant the last stored lease live at `now` ends, if any.
    pub fn last_expiry(&self, now: Instant) -> Option<Instant> {
        self.leases()
            .filter(|l| l.expires_at > now)
            .map(|l| l.expires_at)
            .max()
    }

    /// Slots held at `now` by live leases (other than `except`).
    fn held(&self, now: Instant, except: Option<&Token>) -> u64 {
        self.leases()
            .filter(|l| l.expires_at > now && Some(&l.token) != except)
            .fold(0u64, |sum, l| sum.saturating_add(l.slots))
    }

    /// The live lease of `token` at `now`.
    pub fn live(&self, token: &Token, now: Instant) -> Option<Lease> {
        self.leases()
            .find(|l| &l.token == token && l.expires_at > now)
    }

    /// What the key reports at `now` under `limit`: slots remaining and time to idle.
    pub fn report(&self, limit: u64, now: Instant) -> Decision {
        Decision {
            verdict: Verdict::Allowed,
            limit,
            remaining: limit.saturating_sub(self.held(now, None)),
            reset_after: self
                .last_expiry(now)
                .map_or(Span::ZERO, |t| t.saturating_since(now)),
        }
    }
}

/// The earliest instant at which `need` slots held by the live leases `others` (expiry,
/// slots) have expired: a weighted selection, O(leases) expected.
fn frees_at(others: &mut [(Instant, u64)], mut need: u64) -> Option<Instant> {
    let (mut lo, mut hi) = (0usize, others.len());
    if need == 0 {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        others[lo..hi].select_nth_unstable_by_key(mid - lo, |e| e.0);
        let left: u64 = others[lo..mid]
            .iter()
            .fold(0u64, |s, e| s.saturating_add(e.1));
        if left >= need {
            hi = mid;
        } else {
            need -= left;
            lo = mid;
        }
    }
    let (at, slots) = *others.get(lo)?;
    (slots >= need).then_some(at)
}

/// Decides one LEASE request of `quantity` slots for `token` at `now` (the RL.LEASE rules,
/// `docs/reference.md#r-lease-2` to `docs/reference.md#r-lease-6`).
///
/// Errors: [`Overflow`] when `now + lease` leaves 64-bit nanoseconds.
pub fn decide(
    params: &LeaseParams,
    stored: Option<&LeaseState>,
    now: Instant,
    token: &Token,
    quantity: u64,
) -> Result<Outcome<LeaseWrite>, Overflow> {
    let empty = LeaseState::default();
    let state = stored.unwrap_or(&empty);
    let own = state.live(token, now);
    let others = state.held(now, Some(token));
    let held_now = others.saturating_add(own.map_or(0, |l| l.slots));
    let report = |verdict: Verdict, held: u64, last: Option<Instant>| Decision {
        verdict,
        limit: params.limit,
        remaining: params.limit.saturating_sub(held),
        reset_after: last.map_or(Span::ZERO, |t| t.saturating_since(now)),
    };
    let last_now = state.last_expiry(now);
    if quantity == 0 {
        return Ok(Outcome {
            decision: report(Verdict::Allowed, held_now, last_now),
            write: None,
        });
    }
    if quantity > params.limit {
        return Ok(Outcome {
            decision: report(Verdict::Never, held_now, last_now),
            write: None,
        });
    }
    if others <= params.limit - quantity {
        let expires_at = now.checked_add(params.lease).ok_or(Overflow)?;
        let last_others = state
            .leases()
            .filter(|l| l.expires_at > now && &l.token != token)
            .map(|l| l.expires_at)
            .max();
        let last = Some(last_others.map_or(expires_at, |t| t.max(expires_at)));
        return Ok(Outcome {
            decision: report(Verdict::Allowed, others + quantity, last),
            write: Some(LeaseWrite::Acquire {
                limit: params.limit,
                at: now,
                lease: Lease {
                    token: *token,
                    slots: quantity,
                    expires_at,
                },
            }),
        });
    }
    // Denied: wait until enough of the other live leases expire (none released early).
    let mut live: Vec<(Instant, u64)> = state
        .leases()
        .filter(|l| l.expires_at > now && &l.token != token)
        .map(|l| (l.expires_at, l.slots))
        .collect();
    let need = others - (params.limit - quantity);
    let at = frees_at(&mut live, need).unwrap_or_else(|| now.saturating_add(params.lease));
    let verdict = Verdict::Denied {
        retry_after: at.saturating_since(now).max(Span::from_ns(1)),
    };
    Ok(Outcome {
        decision: report(verdict, held_now, last_now),
        write: None,
    })
}

/// LeaseError is why a LEASE request cannot be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseError {
    /// `now + lease` leaves 64-bit nanoseconds.
    Overflow(Overflow),
    /// A renewal only ([`renew`]), and the token holds no live lease: it expired, was
    /// released, or never existed.
    Lost,
}

impl From<Overflow> for LeaseError {
    fn from(e: Overflow) -> Self {
        Self::Overflow(e)
    }
}

/// Decides a renewal only (`RL.LEASE … RENEW`, `docs/reference.md#r-lease-9`): when `token`
/// holds a live lease at `now`, exactly [`decide`] (a renewal, denied if the others plus
/// `quantity` do not fit); otherwise [`LeaseError::Lost`], with nothing to write, even if a
/// free slot would admit a new lease.
///
/// Errors: [`LeaseError::Lost`]; [`LeaseError::Overflow`] as for [`decide`].
pub fn renew(
    params: &LeaseParams,
    stored: Option<&LeaseState>,
    now: Instant,
    token: &Token,
    quantity: u64,
) -> Result<Outcome<LeaseWrite>, LeaseError> {
    if stored.and_then(|s| s.live(token, now)).is_none() {
        return Err(LeaseError::Lost);
    }
    Ok(decide(params, stored, now, token, quantity)?)
}

/// Frees the lease of `token` at `now` (RL.RELEASE): returns the slots freed (0 when the
/// token holds no live lease) and the write to make (None when nothing changes).
pub fn release(state: &LeaseState, now: Instant, token: &Token) -> (u64, Option<LeaseWrite>) {
    match state.live(token, now) {
        Some(lease) => (
            lease.slots,
            Some(LeaseWrite::Release {
                at: now,
                token: *token,
            }),
        ),
        None => (0, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{at, denied, span, BASE, MS, S};
    use proptest::prelude::*;

    fn t(s: &str) -> Token {
        Token::new(s.as_bytes()).unwrap()
    }

    fn params(limit: u64, lease_s: u64) -> LeaseParams {
        LeaseParams {
            limit,
            lease: span(lease_s * S),
        }
    }

    /// Runs a request and applies its write; returns the decision.
    fn run(
        p: &LeaseParams,
        state: &mut Option<LeaseState>,
        now: Instant,
        token: &str,
        n: u64,
    ) -> Decision {
        let out = decide(p, state.as_ref(), now, &t(token), n).unwrap();
        if let Some(w) = out.write {
            state.get_or_insert_with(LeaseState::default).apply(&w);
        }
        out.decision
    }

    #[test]
    fn at_most_limit_slots_are_held_at_once() {
        let p = params(3, 30);
        let mut s = None;
        assert_eq!(run(&p, &mut s, BASE, "a", 1).remaining, 2);
        assert_eq!(run(&p, &mut s, BASE, "b", 2).remaining, 0);
        let d = run(&p, &mut s, at(S), "c", 1);
        // Denied until the first lease expires, 29 s from now.
        assert_eq!(d.verdict, denied(29 * S));
        assert_eq!((d.remaining, d.reset_after), (0, span(29 * S)));
    }

    #[test]
    fn a_retried_acquire_renews_instead_of_taking_a_second_lease() {
        let p = params(2, 30);
        let mut s = None;
        run(&p, &mut s, BASE, "job-1", 1);
        let again = run(&p, &mut s, at(10 * S), "job-1", 1);
        assert!(again.verdict.is_allowed());
        assert_eq!(again.remaining, 1);
        assert_eq!(again.reset_after, span(30 * S));
        assert_eq!(s.as_ref().unwrap().len(), 1);
        // Renewal may resize, if the others fit.
        assert_eq!(run(&p, &mut s, at(11 * S), "job-1", 2).remaining, 0);
        run(&p, &mut s, at(11 * S), "job-2", 1); // denied: no room
        let resize = run(&p, &mut s, at(12 * S), "job-1", 3);
        assert_eq!(resize.verdict, Verdict::Never);
    }

    #[test]
    fn a_crashed_holder_frees_its_slots_when_its_lease_ends() {
        let p = params(1, 5);
        let mut s = None;
        run(&p, &mut s, BASE, "crashed", 1);
        assert_eq!(
            run(&p, &mut s, at(4_999 * MS), "next", 1).verdict,
            denied(MS)
        );
        assert!(run(&p, &mut s, at(5 * S), "next", 1).verdict.is_allowed());
        // The expired lease was dropped by that write.
        assert_eq!(s.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_denied_renewal_leaves_the_lease_as_it_was() {
        let p = params(2, 30);
        let mut s = None;
        run(&p, &mut s, BASE, "a", 1);
        run(&p, &mut s, BASE, "b", 1);
        let d = run(&p, &mut s, at(S), "a", 2);
        assert!(!d.verdict.is_allowed());
        let a = s.as_ref().unwrap().live(&t("a"), at(S)).unwrap();
        assert_eq!((a.slots, a.expires_at), (1, at(30 * S)));
    }

    #[test]
    fn a_renewal_only_renews_a_live_lease_and_reports_a_lost_one() {
        let p = params(1, 10);
        let mut s = None;
        // Never held: lost, even with the slot free.
        assert_eq!(
            renew(&p, s.as_ref(), BASE, &t("a"), 1),
            Err(LeaseError::Lost)
        );
        run(&p, &mut s, BASE, "a", 1);
        // Live: exactly a renewal (expiry moves, size may change within the limit).
        let out = renew(&p, s.as_ref(), at(4 * S), &t("a"), 1).unwrap();
        assert_eq!(out, decide(&p, s.as_ref(), at(4 * S), &t("a"), 1).unwrap());
        assert_eq!(out.decision.reset_after, span(10 * S));
        s.as_mut().unwrap().apply(&out.write.unwrap());
        let bigger = params(3, 10);
        let out = renew(&bigger, s.as_ref(), at(5 * S), &t("a"), 2).unwrap();
        assert_eq!((out.decision.remaining, out.write.is_some()), (1, true));
        // A renewal past the limit is denied and writes nothing; one that can never pass too.
        run(&bigger, &mut s, at(5 * S), "b", 2);
        let out = renew(&bigger, s.as_ref(), at(5 * S), &t("a"), 2).unwrap();
        assert_eq!(
            (out.decision.verdict.is_allowed(), out.write),
            (false, None)
        );
        let out = renew(&bigger, s.as_ref(), at(5 * S), &t("a"), 4).unwrap();
        assert_eq!((out.decision.verdict, out.write), (Verdict::Never, None));
        // Expired (at or after its end): lost, though a slot is free again.
        assert_eq!(
            renew(&p, s.as_ref(), at(14 * S), &t("a"), 1),
            Err(LeaseError::Lost)
        );
        // Released: lost.
        let state = s.as_ref().unwrap();
        let (_, write) = release(state, at(6 * S), &t("b"));
        let mut after = state.clone();
        after.apply(&write.unwrap());
        assert_eq!(
            renew(&bigger, Some(&after), at(6 * S), &t("b"), 1),
            Err(LeaseError::Lost)
        );
    }

    /// The lapse: A holds the only slot for 0.3 s, is stalled past it, B acquires
    /// and releases, then A's renewal arrives: lost, not granted as a newcomer.
    #[test]
    fn regression_a_lapsed_holder_is_told_it_lost_its_slot() {
        let p = LeaseParams {
            limit: 1,
            lease: span(300 * MS),
        };
        let mut s = None;
        assert!(run(&p, &mut s, BASE, "A", 1).verdict.is_allowed());
        assert!(run(&p, &mut s, at(900 * MS), "B", 1).verdict.is_allowed());
        let (freed, write) = release(s.as_ref().unwrap(), at(950 * MS), &t("B"));
        assert_eq!(freed, 1);
        s.as_mut().unwrap().apply(&write.unwrap());
        assert_eq!(
            renew(&p, s.as_ref(), at(MS * 1_000), &t("A"), 1),
            Err(LeaseError::Lost)
        );
        // Without RENEW the same call is a fresh acquire, and is granted.
        assert!(decide(&p, s.as_ref(), at(MS * 1_000), &t("A"), 1)
            .unwrap()
            .decision
            .verdict
            .is_allowed());
    }

    #[test]
    fn release_frees_the_slots_and_is_harmless_twice() {
        let p = params(2, 30);
        let mut s = None;
        run(&p, &mut s, BASE, "a", 2);
        let state = s.as_ref().unwrap();
        let (freed, write) = release(state, at(S), &t("a"));
        assert_eq!(freed, 2);
        let mut after = state.clone();
        after.apply(&write.unwrap());
        assert!(after.is_empty());
        assert_eq!(release(&after, at(S), &t("a")), (0, None));
    }

    #[test]
    fn quantity_zero_reports_and_quantity_above_limit_never_passes() {
        let p = params(2, 30);
        let mut s = None;
        run(&p, &mut s, BASE, "a", 1);
        let d = decide(&p, s.as_ref(), at(S), &t("a"), 0).unwrap();
        assert_eq!((d.decision.remaining, d.write), (1, None));
        let d = decide(&p, s.as_ref(), at(S), &t("z"), 3).unwrap();
        assert_eq!((d.decision.verdict, d.write), (Verdict::Never, None));
    }

    #[test]
    fn a_lowered_limit_reports_no_negative_remaining() {
        let mut s = None;
        run(&params(5, 30), &mut s, BASE, "a", 4);
        let d = run(&params(2, 30), &mut s, at(S), "b", 1);
        assert!(!d.verdict.is_allowed());
        assert_eq!(d.remaining, 0);
        assert_eq!(d.verdict, denied(29 * S));
    }

    #[test]
    fn tokens_are_one_to_sixty_four_bytes() {
        assert!(Token::new(b"").is_none());
        assert!(Token::new(&[7; 64]).is_some());
        assert!(Token::new(&[7; 65]).is_none());
        assert_eq!(Token::new(b"\0\xff").unwrap().as_bytes(), b"\0\xff");
    }

    #[test]
    fn from_parts_validates() {
        let mut s = LeaseState::default();
        s.apply(&LeaseWrite::Acquire {
            limit: 3,
            at: BASE,
            lease: Lease {
                token: t("a"),
                slots: 2,
                expires_at: at(S),
            },
        });
        let b = s.bytes().to_vec();
        assert_eq!(LeaseState::from_parts(3, 1, &b), Some(s.clone()));
        assert_eq!(LeaseState::from_parts(1, 1, &b), None); // slots above the limit
        assert_eq!(LeaseState::from_parts(3, 2, &b), None); // a record missing
        assert_eq!(LeaseState::from_parts(0, 1, &b), None);
        let twice = [b.clone(), b.clone()].concat();
        assert_eq!(LeaseState::from_parts(9, 2, &twice), None); // the same token twice
        let mut zero = b.clone();
        zero[8..16].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(LeaseState::from_parts(3, 1, &zero), None);
    }

    proptest! {
        /// Never more than `limit` slots held at once; retry_after honest (the same request
        /// passes at now + retry_after and not 1 ns before); memory bounded by the leases.
        #[test]
        fn leases_never_exceed_the_limit_and_retry_is_honest(
            limit in 1u64..8, lease_ms in 1u64..3000,
            steps in prop::collection::vec((0u64..500_000_000, 0u8..6, 0u64..4), 1..80),
        ) {
            let p = LeaseParams { limit, lease: span(lease_ms * MS) };
            let mut s: Option<LeaseState> = None;
            let mut now = BASE;
            for (gap, who, q) in steps {
                now = now.saturating_add(span(gap));
                let token = t(&format!("holder-{who}"));
                let out = decide(&p, s.as_ref(), now, &token, q).unwrap();
                prop_assert!(out.decision.remaining <= limit);
                if let Verdict::Denied { retry_after } = out.decision.verdict {
                    let later = now.saturating_add(retry_after);
                    prop_assert!(decide(&p, s.as_ref(), later, &token, q).unwrap().decision.verdict.is_allowed());
                    let before = later.saturating_sub(span(1));
                    prop_assert!(!decide(&p, s.as_ref(), before, &token, q).unwrap().decision.verdict.is_allowed());
                }
                if let Some(w) = out.write {
                    let st = s.get_or_insert_with(LeaseState::default);
                    st.apply(&w);
                    let held: u64 = st.leases().filter(|l| l.expires_at > now).map(|l| l.slots).sum();
                    prop_assert!(held <= limit);
                    prop_assert!(st.len() as u64 <= limit);
                    let again = LeaseState::from_parts(st.limit, st.len() as u64, st.bytes());
                    prop_assert_eq!(again.as_ref(), Some(&*st));
                }
            }
        }

        /// A renewal only answers Lost exactly when the token holds no live lease, and
        /// otherwise exactly what the plain call answers: it never takes a new lease.
        #[test]
        fn a_renewal_is_the_plain_call_on_a_live_lease_and_lost_otherwise(
            limit in 1u64..5, lease_ms in 1u64..2000,
            steps in prop::collection::vec((0u64..800_000_000, 0u8..4, 0u64..4, any::<bool>()), 1..60),
        ) {
            let p = LeaseParams { limit, lease: span(lease_ms * MS) };
            let mut s: Option<LeaseState> = None;
            let mut now = BASE;
            for (gap, who, q, renewal) in steps {
                now = now.saturating_add(span(gap));
                let token = t(&format!("holder-{who}"));
                let plain = decide(&p, s.as_ref(), now, &token, q).unwrap();
                let held = s.as_ref().and_then(|st| st.live(&token, now)).is_some();
                let out = match renew(&p, s.as_ref(), now, &token, q) {
                    Err(e) => {
                        prop_assert_eq!(e, LeaseError::Lost);
                        prop_assert!(!held);
                        continue;
                    }
                    Ok(out) => {
                        prop_assert!(held);
                        prop_assert_eq!(&out, &plain);
                        out
                    }
                };
                let chosen = if renewal { out } else { plain };
                if let Some(w) = chosen.write {
                    s.get_or_insert_with(LeaseState::default).apply(&w);
                }
            }
        }
    }
}
