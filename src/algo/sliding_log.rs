//! Sliding window log: the exact algorithm. The key records the instants of the admitted
//! requests inside the trailing window; a request of quantity `n` at `now` is admitted iff
//! `requests in (now − window, now] + n ≤ limit`.
//!
//! Exact, at the price of memory per recorded request. In Lua this is usually a sorted set
//! with one member per request (~100 bytes each); here the log is one byte string of LEB128
//! varints: the oldest entry's count, then `(delta_ns, count)` per later instant, with
//! run-length counts for requests at the same instant. Requests microseconds apart cost about
//! 3–4 bytes each. Appending is O(1) amortised; dropping expired entries is O(entries
//! dropped); calls that do not write skip expired entries from where the last scan stopped
//! (amortised O(1)); a denial's `retry_after` walks at most the entries that must leave.

use crate::decision::{Decision, Outcome, Overflow, Verdict};
use crate::params::WindowParams;

/// RequestLog is a compact queue of `(instant_ns, count)` entries with strictly increasing
/// instants.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    /// Instant of the oldest entry (meaningless when empty).
    first_ns: u64,
    /// Instant of the newest entry (meaningless when empty).
    last_ns: u64,
    /// Requests recorded (sum of counts).
    total: u64,
    /// Number of entries (distinct instants).
    entries: u64,
    /// The encoded entries start at `head`.
    buf: Vec<u8>,
    head: usize,
    /// Where the last scan for expired entries stopped, so that calls which do not write
    /// (PEEK, QUANTITY 0, denials) resume there instead of re-reading entries that already
    /// left the window: amortised O(1) per call while time moves forward. A cache, not state:
    /// it is not encoded, compared or hashed, and any change but an append resets it.
    cursor: std::cell::Cell<Cursor>,
}

/// A position at the start of an entry: byte offset from `head`, the instant of the entry
/// before it, and the requests recorded before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cursor {
    offset: usize,
    prev_at: u64,
    before: u64,
}

impl PartialEq for RequestLog {
    fn eq(&self, other: &Self) -> bool {
        self.total == other.total
            && self.bytes() == other.bytes()
            && (self.total == 0
                || (self.first_ns == other.first_ns && self.last_ns == other.last_ns))
    }
}

impl Eq for RequestLog {}

impl std::hash::Hash for RequestLog {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.total.hash(state);
        self.bytes().hash(state);
    }
}

/// Appends `v` as LEB128.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one LEB128 value at `*pos`, advancing it. None on truncation or overflow.
fn get_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits.checked_shl(shift)?;
        if byte & 0x80 == 0 {
            // Reject non-minimal encodings so every log has exactly one byte form.
            if byte == 0 && shift > 0 {
                return None;
            }
            return Some(value);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

/// Start index of the varint that ends at `end` (exclusive), not before `floor`.
fn varint_start(buf: &[u8], floor: usize, end: usize) -> usize {
    let mut i = end - 1;
    while i > floor && buf[i - 1] & 0x80 != 0 {
        i -= 1;
    }
    i
}

impl RequestLog {
    /// Requests recorded.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Distinct instants recorded.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Instant of the newest entry, if any.
    pub fn last_ns(&self) -> Option<u64> {
        (self.total > 0).then_some(self.last_ns)
    }

    /// Instant of the oldest entry, if any.
    pub fn first_ns(&self) -> Option<u64> {
        (self.total > 0).then_some(self.first_ns)
    }

    /// The encoded entries (the codec stores exactly these bytes).
    pub fn bytes(&self) -> &[u8] {
        self.buf.get(self.head..).unwrap_or(&[])
    }

    /// Bytes allocated for the log.
    pub fn allocated_bytes(&self) -> usize {
        self.buf.capacity()
    }

    /// Iterates `(instant_ns, count)` from the oldest entry.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let bytes = self.bytes();
        let mut pos = 0usize;
        let mut at = self.first_ns;
        let mut first = true;
        std::iter::from_fn(move || {
            if pos >= bytes.len() {
                return None;
            }
            if !first {
                at = at.saturating_add(get_varint(bytes, &mut pos)?);
            }
            first = false;
            let count = get_varint(bytes, &mut pos)?;
            Some((at, count))
        })
    }

    /// Requests recorded at instants after `cutoff_ns` (None: all). O(entries at or before it).
    pub fn count_after(&self, cutoff_ns: Option<u64>) -> u64 {
        let Some(cutoff) = cutoff_ns else {
            return self.total;
        };
        self.total.saturating_sub(self.seek(cutoff).before)
    }

    /// Returns the position of the first entry after `cutoff_ns`, resuming from the last
    /// scan when time has not gone back.
    fn seek(&self, cutoff_ns: u64) -> Cursor {
        let bytes = self.bytes();
        let mut c = self.cursor.get();
        if c.offset > bytes.len() || (c.offset > 0 && c.prev_at > cutoff_ns) {
            c = Cursor::default();
        }
        while c.offset < bytes.len() {
            let mut pos = c.offset;
            let at = if c.offset == 0 {
                self.first_ns
            } else {
                match get_varint(bytes, &mut pos) {
                    Some(delta) => c.prev_at.saturating_add(delta),
                    None => break,
                }
            };
            if at > cutoff_ns {
                break;
            }
            let Some(count) = get_varint(bytes, &mut pos) else {
                break;
            };
            c = Cursor {
                offset: pos,
                prev_at: at,
                before: c.before.saturating_add(count),
            };
        }
        self.cursor.set(c);
        c
    }

    /// Iterates `(instant_ns, count)` of the entries after `cutoff_ns` (all with `None`).
    pub fn iter_after(&self, cutoff_ns: Option<u64>) -> impl Iterator<Item = (u64, u64)> + '_ {
        let start = cutoff_ns.map_or(Cursor::default(), |c| self.seek(c));
        let bytes = self.bytes();
        let mut pos = start.offset;
        let mut prev = start.prev_at;
        std::iter::from_fn(move || {
            if pos >= bytes.len() {
                return None;
            }
            let at = if pos == 0 {
                self.first_ns
            } else {
                prev.saturating_add(get_varint(bytes, &mut pos)?)
            };
            let count = get_varint(bytes, &mut pos)?;
            prev = at;
            Some((at, count))
        })
    }

    fn reset_cursor(&self) {
        self.cursor.set(Cursor::default());
    }

    /// Removes every entry at or before `cutoff_ns`. O(entries removed), amortised.
    pub fn drop_until(&mut self, cutoff_ns: u64) {
        if self.total > 0 && self.first_ns <= cutoff_ns {
            self.reset_cursor();
        }
        while self.total > 0 && self.first_ns <= cutoff_ns {
            let mut pos = self.head;
            let Some(count) = get_varint(&self.buf, &mut pos) else {
                self.clear();
                return;
            };
            self.total = self.total.saturating_sub(count);
            self.entries = self.entries.saturating_sub(1);
            if self.total == 0 || pos >= self.buf.len() {
                self.clear();
                return;
            }
            let Some(delta) = get_varint(&self.buf, &mut pos) else {
                self.clear();
                return;
            };
            self.first_ns = self.first_ns.saturating_add(delta);
            self.head = pos;
        }
        self.compact();
    }

    fn clear(&mut self) {
        self.reset_cursor();
        self.total = 0;
        self.entries = 0;
        self.head = 0;
        self.buf.clear();
        self.buf.shrink_to(16);
    }

    /// Moves the live bytes to the front once the dead prefix is at least half the buffer, and
    /// gives back memory when the log shrank a lot. O(1) amortised.
    fn compact(&mut self) {
        if self.head > 0 && self.head * 2 >= self.buf.len() {
            self.reset_cursor();
            self.buf.drain(..self.head);
            self.head = 0;
            let len = self.buf.len();
            if self.buf.capacity() > 2 * len + 64 {
                self.buf.shrink_to(len + len / 2 + 16);
            }
        }
    }

    /// Grows the buffer by about half its size (not double), keeping slack under one third.
    fn reserve(&mut self, needed: usize) {
        if self.buf.len() + needed > self.buf.capacity() {
            let extra = needed.max(self.buf.capacity() / 2).max(16);
            self.buf.reserve_exact(extra);
        }
    }

    /// Records `count` requests at `at_ns`. An instant not after the newest entry (equal, or
    /// earlier after a clock step back) joins the newest entry, which keeps instants strictly
    /// increasing and never lets a request leave the window early.
    pub fn push(&mut self, at_ns: u64, count: u64) {
        if count == 0 {
            return;
        }
        if self.total == 0 {
            self.clear();
            self.reserve(10);
            put_varint(&mut self.buf, count);
            self.first_ns = at_ns;
            self.last_ns = at_ns;
            self.total = count;
            self.entries = 1;
            return;
        }
        if at_ns <= self.last_ns {
            // Merging rewrites the last entry's count, which a cursor may have passed.
            self.reset_cursor();
            let start = varint_start(&self.buf, self.head, self.buf.len());
            let mut pos = start;
            let old = get_varint(&self.buf, &mut pos).unwrap_or(0);
            self.buf.truncate(start);
            self.reserve(10);
            put_varint(&mut self.buf, old.saturating_add(count));
        } else {
            self.reserve(20);
            put_varint(&mut self.buf, at_ns - self.last_ns);
            put_varint(&mut self.buf, count);
            self.last_ns = at_ns;
            self.entries += 1;
        }
        self.total = self.total.saturating_add(count);
    }

    /// Removes up to `count` of the most recent requests; returns how many were removed.
    pub fn pop_back(&mut self, mut count: u64) -> u64 {
        self.reset_cursor();
        let mut removed = 0;
        while count > 0 && self.total > 0 {
            let end = self.buf.len();
            let count_start = varint_start(&self.buf, self.head, end);
            let mut pos = count_start;
            let last = get_varint(&self.buf, &mut pos).unwrap_or(0);
            if last > count {
                self.buf.truncate(count_start);
                put_varint(&mut self.buf, last - count);
                self.total -= count;
                removed += count;
                break;
            }
            removed += last;
            count -= last;
            self.total = self.total.saturating_sub(last);
            self.entries = self.entries.saturating_sub(1);
            if count_start <= self.head || self.total == 0 {
                self.clear();
                break;
            }
            let delta_start = varint_start(&self.buf, self.head, count_start);
            let mut pos = delta_start;
            let delta = get_varint(&self.buf, &mut pos).unwrap_or(0);
            self.buf.truncate(delta_start);
            self.last_ns = self.last_ns.saturating_sub(delta);
        }
        removed
    }

    /// Rebuilds a log from its codec fields, validating everything: entries parse exactly,
    /// counts ≥ 1, instants strictly increasing and ending at `last_ns`, counts summing to
    /// `total`. Returns None for anything else.
    pub fn from_parts(first_ns: u64, last_ns: u64, total: u64, bytes: &[u8]) -> Option<Self> {
        if total == 0 {
            return bytes.is_empty().then(Self::default);
        }
        let mut pos = 0usize;
        let mut at = first_ns;
        let mut sum = 0u64;
        let mut entries = 0u64;
        while pos < bytes.len() {
            if entries > 0 {
                let delta = get_varint(bytes, &mut pos)?;
                if delta == 0 {
                    return None;
                }
                at = at.checked_add(delta)?;
            }
            let count = get_varint(bytes, &mut pos)?;
            if count == 0 {
                return None;
            }
            sum = sum.checked_add(count)?;
            entries += 1;
        }
        if sum != total || at != last_ns {
            return None;
        }
        let mut buf = Vec::new();
        buf.reserve_exact(bytes.len());
        buf.extend_from_slice(bytes);
        Some(Self {
            first_ns,
            last_ns,
            total,
            entries,
            buf,
            head: 0,
            cursor: Default::default(),
        })
    }
}

/// LogState is what a LOG key stores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogState {
    /// The window of the last write, ns.
    pub window_ns: u64,
    /// The limit of the last write; the log never holds more requests than this.
    pub limit: u64,
    /// The admitted requests inside the window of the last write.
    pub log: RequestLog,
}

/// LogWrite describes an admitted request: drop what left the window at `at_ns`, record
/// `quantity` requests at `at_ns`, adopt `window_ns` and `limit`. It is deterministic, so it
/// is also what replicas and the AOF receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogWrite {
    /// The window to keep, ns.
    pub window_ns: u64,
    /// The limit to record.
    pub limit: u64,
    /// The request's instant, ns since the epoch.
    pub at_ns: u64,
    /// Requests admitted at that instant (≥ 1).
    pub quantity: u64,
}

impl LogState {
    /// An empty log under `params`.
    pub fn new(params: &WindowParams) -> Self {
        Self {
            window_ns: params.window_ns,
            limit: params.limit,
            log: RequestLog::default(),
        }
    }

    /// Applies an admitted request. O(entries dropped), amortised.
    pub fn apply(&mut self, write: &LogWrite) {
        self.window_ns = write.window_ns;
        self.limit = write.limit;
        if let Some(cutoff) = write.at_ns.checked_sub(write.window_ns) {
            self.log.drop_until(cutoff);
        }
        self.log.push(write.at_ns, write.quantity);
    }

    /// Gives back up to `quantity` of the most recent requests still inside the window at
    /// `now_ns`; returns how many were given back.
    pub fn refund(&mut self, now_ns: u64, quantity: u64) -> u64 {
        if let Some(cutoff) = now_ns.checked_sub(self.window_ns) {
            self.log.drop_until(cutoff);
        }
        self.log.pop_back(quantity)
    }

    /// Nanoseconds from `now_ns` until the newest request leaves the window (0 if none).
    pub fn reset_after_ns(&self, now_ns: u64) -> u64 {
        match self.log.last_ns() {
            Some(last) => last.saturating_add(self.window_ns).saturating_sub(now_ns),
            None => 0,
        }
    }
}

/// Decides one LOG request of `quantity` at `now_ns` (SPEC.md, RL.WINDOW LOG).
///
/// Errors: [`Overflow`] if the window's arithmetic leaves `u64` nanoseconds.
pub fn decide(
    params: &WindowParams,
    stored: Option<&LogState>,
    now_ns: u64,
    quantity: u64,
) -> Result<Outcome<LogWrite>, Overflow> {
    let cutoff = now_ns.checked_sub(params.window_ns);
    let log = stored.map(|s| &s.log);
    let in_window = log.map_or(0, |l| l.count_after(cutoff));
    let newest = log
        .and_then(RequestLog::last_ns)
        .filter(|&t| cutoff.is_none_or(|c| t > c));
    let reset_for = |newest: Option<u64>| -> Result<u64, Overflow> {
        match newest {
            Some(t) => Ok(t
                .checked_add(params.window_ns)
                .ok_or(Overflow)?
                .saturating_sub(now_ns)),
            None => Ok(0),
        }
    };
    let report =
        |verdict: Verdict, count: u64, newest: Option<u64>| -> Result<Decision, Overflow> {
            Ok(Decision {
                verdict,
                limit: params.limit,
                remaining: params.limit.saturating_sub(count),
                reset_after_ns: reset_for(newest)?,
            })
        };
    if quantity == 0 {
        return Ok(Outcome {
            decision: report(Verdict::Allowed, in_window, newest)?,
            write: None,
        });
    }
    if quantity > params.limit {
        return Ok(Outcome {
            decision: report(Verdict::Never, in_window, newest)?,
            write: None,
        });
    }
    let after = in_window.checked_add(quantity).ok_or(Overflow)?;
    if after <= params.limit {
        let write = LogWrite {
            window_ns: params.window_ns,
            limit: params.limit,
            at_ns: now_ns,
            quantity,
        };
        let newest_after = Some(newest.map_or(now_ns, |t| t.max(now_ns)));
        return Ok(Outcome {
            decision: report(Verdict::Allowed, after, newest_after)?,
            write: Some(write),
        });
    }
    // Denied: wait until `need` of the oldest requests in the window have left it.
    let need = after - params.limit;
    let mut freed = 0u64;
    let mut leaves_at = None;
    if let Some(l) = log {
        for (at, count) in l.iter_after(cutoff) {
            freed += count;
            if freed >= need {
                leaves_at = Some(at.checked_add(params.window_ns).ok_or(Overflow)?);
                break;
            }
        }
    }
    // `need` ≤ in_window, so some entry frees enough; the fallback is only defensive.
    let at = leaves_at.unwrap_or(now_ns.saturating_add(params.window_ns));
    let verdict = Verdict::Denied {
        retry_after_ns: at.saturating_sub(now_ns).max(1),
    };
    Ok(Outcome {
        decision: report(verdict, in_window, newest)?,
        write: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{check_retry_honest, timeline};
    use crate::time::{NANOS_PER_MILLI, NANOS_PER_SEC};
    use proptest::prelude::*;

    const MS: u64 = NANOS_PER_MILLI;
    const S: u64 = NANOS_PER_SEC;
    const BASE: u64 = 1_795_996_800 * S;

    fn run_log(p: &WindowParams, state: &mut Option<LogState>, now: u64, q: u64) -> Decision {
        let out = decide(p, state.as_ref(), now, q).unwrap();
        if let Some(w) = out.write {
            state.get_or_insert_with(|| LogState::new(p)).apply(&w);
        }
        out.decision
    }

    #[test]
    fn exact_trailing_window_timeline() {
        let p = WindowParams::new(3, 10 * S).unwrap();
        let mut s = None;
        let d = run_log(&p, &mut s, BASE, 1);
        assert_eq!(
            (d.verdict, d.remaining, d.reset_after_ns),
            (Verdict::Allowed, 2, 10 * S)
        );
        run_log(&p, &mut s, BASE + 4 * S, 1);
        run_log(&p, &mut s, BASE + 8 * S, 1);
        let d = run_log(&p, &mut s, BASE + 9 * S, 1);
        assert_eq!(d.verdict, Verdict::Denied { retry_after_ns: S });
        assert_eq!(d.reset_after_ns, 9 * S);
        // At exactly BASE + 10 s the first request is at the window's open end: it left.
        let d = run_log(&p, &mut s, BASE + 10 * S, 1);
        assert_eq!((d.verdict, d.remaining), (Verdict::Allowed, 0));
        // Needing two to leave: the ones at 4 s and 8 s → retry at 18 s.
        let d = run_log(&p, &mut s, BASE + 10 * S, 2);
        assert_eq!(
            d.verdict,
            Verdict::Denied {
                retry_after_ns: 8 * S
            }
        );
        assert_eq!(s.as_ref().unwrap().log.total(), 3);
    }

    #[test]
    fn same_instant_requests_are_counted_each() {
        let p = WindowParams::new(5, S).unwrap();
        let mut s = None;
        run_log(&p, &mut s, BASE, 2);
        run_log(&p, &mut s, BASE, 1);
        run_log(&p, &mut s, BASE, 1);
        let log = &s.as_ref().unwrap().log;
        assert_eq!((log.total(), log.entries()), (4, 1));
        assert_eq!(
            run_log(&p, &mut s, BASE, 2).verdict,
            Verdict::Denied { retry_after_ns: S }
        );
    }

    #[test]
    fn quantity_zero_and_oversize_do_not_write() {
        let p = WindowParams::new(2, S).unwrap();
        assert!(decide(&p, None, BASE, 0).unwrap().write.is_none());
        let out = decide(&p, None, BASE, 3).unwrap();
        assert_eq!((out.decision.verdict, out.write), (Verdict::Never, None));
    }

    #[test]
    fn log_layout_is_compact() {
        let p = WindowParams::new(100_000, 3600 * S).unwrap();
        let mut s = LogState::new(&p);
        for i in 0..10_000u64 {
            s.apply(&LogWrite {
                window_ns: p.window_ns,
                limit: p.limit,
                at_ns: BASE + i * 37_000,
                quantity: 1,
            });
        }
        // 37 µs apart: 3 bytes of delta + 1 byte of count.
        assert_eq!(s.log.bytes().len(), 40_000 - 3);
        assert!(
            s.log.allocated_bytes() <= 4 * 10_000 * 3 / 2 + 64,
            "{}",
            s.log.allocated_bytes()
        );
    }

    #[test]
    fn pop_back_removes_most_recent() {
        let mut log = RequestLog::default();
        log.push(10, 2);
        log.push(20, 3);
        log.push(300, 1);
        assert_eq!(log.pop_back(2), 2);
        assert_eq!(log.iter().collect::<Vec<_>>(), vec![(10, 2), (20, 2)]);
        assert_eq!(log.last_ns(), Some(20));
        assert_eq!(log.pop_back(10), 4);
        assert_eq!(log.total(), 0);
        log.push(5, 1);
        assert_eq!(log.iter().collect::<Vec<_>>(), vec![(5, 1)]);
    }

    #[test]
    fn from_parts_validates() {
        let mut log = RequestLog::default();
        log.push(100, 1);
        log.push(300, 2);
        let b = log.bytes().to_vec();
        assert_eq!(RequestLog::from_parts(100, 300, 3, &b), Some(log.clone()));
        assert_eq!(RequestLog::from_parts(100, 301, 3, &b), None);
        assert_eq!(RequestLog::from_parts(100, 300, 4, &b), None);
        assert_eq!(RequestLog::from_parts(100, 300, 3, &b[..b.len() - 1]), None);
        assert_eq!(RequestLog::from_parts(100, 300, 3, &[1, 0, 2]), None); // zero delta
        assert_eq!(
            RequestLog::from_parts(100, 300, 3, &[0x81, 0x00, 200, 1, 2]),
            None
        ); // non-minimal
    }

    proptest! {
        #[test]
        fn never_more_than_limit_in_any_trailing_window(
            limit in 1u64..12, window_ms in 1u64..3000,
            steps in prop::collection::vec((0u64..1_000_000_000, 0u64..5), 1..80),
        ) {
            let p = WindowParams::new(limit, window_ms * MS).unwrap();
            let mut s = None;
            let mut now = BASE;
            let mut admitted: Vec<u64> = Vec::new(); // brute force: one timestamp per request
            for (gap, q) in steps {
                now += gap;
                let d = run_log(&p, &mut s, now, q);
                let brute_in_window = admitted.iter().filter(|&&t| t + p.window_ns > now).count() as u64;
                let brute_allowed = q == 0 || (q <= limit && brute_in_window + q <= limit);
                prop_assert_eq!(d.verdict.is_allowed(), brute_allowed);
                if d.verdict.is_allowed() {
                    for _ in 0..q { admitted.push(now); }
                }
                prop_assert_eq!(d.remaining, limit - (brute_in_window + if d.verdict.is_allowed() { q } else { 0 }).min(limit));
            }
            // Every trailing window (ending at any admitted instant) holds ≤ limit.
            for &end in &admitted {
                let n = admitted.iter().filter(|&&t| t <= end && t + p.window_ns > end).count() as u64;
                prop_assert!(n <= limit);
            }
        }

        #[test]
        fn retry_after_is_honest(limit in 1u64..12, window_ms in 1u64..3000,
                                 steps in timeline(1_000_000_000, 5, 60), qty in 1u64..5) {
            let p = WindowParams::new(limit, window_ms * MS).unwrap();
            let mut s = None;
            let mut now = BASE;
            for (gap, q) in steps {
                now += gap;
                run_log(&p, &mut s, now, q);
            }
            let out = decide(&p, s.as_ref(), now, qty).unwrap();
            check_retry_honest(out.decision.verdict, now, |t| decide(&p, s.as_ref(), t, qty).unwrap().decision.verdict)?;
        }

        #[test]
        fn scans_that_resume_count_like_a_full_scan(
            ops in prop::collection::vec((0u8..4, 0u64..2_000, 1u64..4), 1..120),
        ) {
            // Pushes, pops, drops and count queries with cutoffs that go back and forth: the
            // resumable scan always agrees with counting from the start.
            let mut log = RequestLog::default();
            let mut t = 10_000u64;
            for (op, x, c) in ops {
                match op {
                    0 => { t += x % 50; log.push(t, c); }
                    1 => { log.pop_back(c); }
                    2 => { log.drop_until(t.saturating_sub(x)); }
                    _ => {
                        let cutoff = t.saturating_sub(x);
                        let brute: u64 = log.iter().filter(|e| e.0 > cutoff).map(|e| e.1).sum();
                        prop_assert_eq!(log.count_after(Some(cutoff)), brute);
                        let listed: Vec<_> = log.iter_after(Some(cutoff)).collect();
                        let expected: Vec<_> = log.iter().filter(|e| e.0 > cutoff).collect();
                        prop_assert_eq!(listed, expected);
                    }
                }
            }
        }

        #[test]
        fn log_round_trips_through_parts(pushes in prop::collection::vec((0u64..1_000_000, 1u64..4), 0..50),
                                         pops in 0u64..20, drop_at in 0u64..30_000_000) {
            let mut log = RequestLog::default();
            let mut t = 1_000u64;
            for (gap, c) in pushes { t += gap; log.push(t, c); }
            log.drop_until(drop_at);
            log.pop_back(pops);
            let rebuilt = RequestLog::from_parts(log.first_ns, log.last_ns, log.total(), log.bytes());
            prop_assert_eq!(rebuilt.as_ref(), Some(&log));
            prop_assert_eq!(log.iter().map(|e| e.1).sum::<u64>(), log.total());
        }
    }
}
