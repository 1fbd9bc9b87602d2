//! A compact queue of request instants: what a LOG key records.
//!
//! The log is one byte string of LEB128 varints: the oldest entry's count, then
//! `(delta_ns, count)` per later instant, with run-length counts for requests at the same
//! instant (two requests at one instant are one entry of count 2). Requests microseconds apart
//! cost about 3–4 bytes each, against about 100 for a sorted-set member. Appending is O(1)
//! amortised; dropping expired entries is O(entries dropped); scans for the first entry after
//! a cutoff resume where the last one stopped (amortised O(1) while time moves forward).

use crate::time::Instant;

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
    pub fn last(&self) -> Option<Instant> {
        (self.total > 0).then_some(Instant::from_ns(self.last_ns))
    }

    /// Instant of the oldest entry, if any.
    pub fn first(&self) -> Option<Instant> {
        (self.total > 0).then_some(Instant::from_ns(self.first_ns))
    }

    /// The encoded entries (the codec stores exactly these bytes).
    pub fn bytes(&self) -> &[u8] {
        self.buf.get(self.head..).unwrap_or(&[])
    }

    /// Bytes allocated for the log.
    pub fn allocated_bytes(&self) -> usize {
        self.buf.capacity()
    }

    /// Iterates `(instant, count)` from the oldest entry.
    pub fn iter(&self) -> impl Iterator<Item = (Instant, u64)> + '_ {
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
            Some((Instant::from_ns(at), count))
        })
    }

    /// Requests recorded at instants after `cutoff` (None: all). O(entries at or before it),
    /// amortised O(1) while cutoffs move forward.
    pub fn count_after(&self, cutoff: Option<Instant>) -> u64 {
        let Some(cutoff) = cutoff else {
            return self.total;
        };
        self.total.saturating_sub(self.seek(cutoff.as_ns()).before)
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

    /// Iterates `(instant, count)` of the entries after `cutoff` (all with `None`).
    pub fn iter_after(&self, cutoff: Option<Instant>) -> impl Iterator<Item = (Instant, u64)> + '_ {
        let start = cutoff.map_or(Cursor::default(), |c| self.seek(c.as_ns()));
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
            Some((Instant::from_ns(at), count))
        })
    }

    fn reset_cursor(&self) {
        self.cursor.set(Cursor::default());
    }

    /// Removes every entry at or before `cutoff`. O(entries removed), amortised.
    pub fn drop_until(&mut self, cutoff: Instant) {
        let cutoff_ns = cutoff.as_ns();
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

    /// Records `count` requests at `at`. An instant not after the newest entry (equal, or
    /// earlier after a clock step back) joins the newest entry, which keeps instants strictly
    /// increasing and never lets a request leave the window early.
    pub fn push(&mut self, at: Instant, count: u64) {
        let at_ns = at.as_ns();
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
    /// counts ≥ 1, instants strictly increasing and ending at `last`, counts summing to
    /// `total`. Returns None for anything else.
    pub fn from_parts(first: Instant, last: Instant, total: u64, bytes: &[u8]) -> Option<Self> {
        if total == 0 {
            return bytes.is_empty().then(Self::default);
        }
        let (first_ns, last_ns) = (first.as_ns(), last.as_ns());
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(ns: u64) -> Instant {
        Instant::from_ns(ns)
    }

    #[test]
    fn pop_back_removes_most_recent() {
        let mut log = RequestLog::default();
        log.push(t(10), 2);
        log.push(t(20), 3);
        log.push(t(300), 1);
        assert_eq!(log.pop_back(2), 2);
        assert_eq!(log.iter().collect::<Vec<_>>(), vec![(t(10), 2), (t(20), 2)]);
        assert_eq!(log.last(), Some(t(20)));
        assert_eq!(log.pop_back(10), 4);
        assert_eq!(log.total(), 0);
        log.push(t(5), 1);
        assert_eq!(log.iter().collect::<Vec<_>>(), vec![(t(5), 1)]);
    }

    #[test]
    fn same_or_earlier_instants_join_the_newest_entry() {
        let mut log = RequestLog::default();
        log.push(t(100), 1);
        log.push(t(100), 2);
        log.push(t(50), 1); // a clock step back: counted at the newest instant
        assert_eq!((log.total(), log.entries()), (4, 1));
        assert_eq!(log.iter().collect::<Vec<_>>(), vec![(t(100), 4)]);
    }

    #[test]
    fn encoding_is_compact() {
        let mut log = RequestLog::default();
        for i in 0..10_000u64 {
            log.push(t(1_000_000_000 + i * 37_000), 1);
        }
        // 37 µs apart: 3 bytes of delta + 1 byte of count.
        assert_eq!(log.bytes().len(), 40_000 - 3);
        assert!(
            log.allocated_bytes() <= 4 * 10_000 * 3 / 2 + 64,
            "{}",
            log.allocated_bytes()
        );
    }

    #[test]
    fn from_parts_validates() {
        let mut log = RequestLog::default();
        log.push(t(100), 1);
        log.push(t(300), 2);
        let b = log.bytes().to_vec();
        assert_eq!(
            RequestLog::from_parts(t(100), t(300), 3, &b),
            Some(log.clone())
        );
        assert_eq!(RequestLog::from_parts(t(100), t(301), 3, &b), None);
        assert_eq!(RequestLog::from_parts(t(100), t(300), 4, &b), None);
        assert_eq!(
            RequestLog::from_parts(t(100), t(300), 3, &b[..b.len() - 1]),
            None
        );
        assert_eq!(RequestLog::from_parts(t(100), t(300), 3, &[1, 0, 2]), None); // zero delta
        assert_eq!(
            RequestLog::from_parts(t(100), t(300), 3, &[0x81, 0x00, 200, 1, 2]),
            None
        ); // non-minimal
    }

    proptest! {
        #[test]
        fn scans_that_resume_count_like_a_full_scan(
            ops in prop::collection::vec((0u8..4, 0u64..2_000, 1u64..4), 1..120),
        ) {
            // Pushes, pops, drops and count queries with cutoffs that go back and forth: the
            // resumable scan always agrees with counting from the start.
            let mut log = RequestLog::default();
            let mut now = 10_000u64;
            for (op, x, c) in ops {
                match op {
                    0 => { now += x % 50; log.push(t(now), c); }
                    1 => { log.pop_back(c); }
                    2 => { log.drop_until(t(now.saturating_sub(x))); }
                    _ => {
                        let cutoff = t(now.saturating_sub(x));
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
            let mut now = 1_000u64;
            for (gap, c) in pushes { now += gap; log.push(t(now), c); }
            log.drop_until(t(drop_at));
            log.pop_back(pops);
            let (first, last) = (log.first().unwrap_or_default(), log.last().unwrap_or_default());
            let rebuilt = RequestLog::from_parts(first, last, log.total(), log.bytes());
            prop_assert_eq!(rebuilt.as_ref(), Some(&log));
            prop_assert_eq!(log.iter().map(|e| e.1).sum::<u64>(), log.total());
        }
    }
}
