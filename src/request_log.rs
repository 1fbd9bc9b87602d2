//! A compact queue of request instants: what a LOG key records.
//!
//! The log is one byte string of LEB128 varints: the oldest entry's count, then
//! `(delta_ns, count)` per later instant, with run-length counts for requests at the same
//! instant (two requests at one instant are one entry of count 2). Requests microseconds apart
//! cost about 3–4 bytes each, against about 100 for a sorted-set member.
//!
//! Beside the bytes, an index of *marks* (the position, instant and running request count of
//! every [`MARK_EVERY`]-th entry after the first, about half a byte per entry; the head
//! stands in for entry 0) lets every question be answered by a binary search over the marks
//! and a walk of at most [`MARK_EVERY`] entries, whatever the log holds: the first entry
//! after an instant ([`RequestLog::count_after`], dropping what left the window), the entry
//! holding the n-th request (a denial's `retry_after`), the newest requests (a refund). Two
//! cached cursors make the usual patterns — time moving forward through one or two window
//! lengths — amortised O(1): a scan resumes where the last scan for a nearby cutoff stopped.
//! The marks and cursors are allocated with the first mark: a log of fewer entries is walked
//! from its head (as short a walk) and costs one allocation, its bytes inline up to 16.

use std::cell::Cell;
use std::collections::VecDeque;

use crate::time::Instant;

/// The log's bytes: inline up to 16 (a few entries), then on the heap.
type Bytes = smallvec::SmallVec<[u8; 16]>;

/// Every `MARK_EVERY`-th entry is indexed: a walk between two marks decodes at most this
/// many entries.
pub const MARK_EVERY: u64 = 64;

/// The position of one entry: its absolute number (entries appended since the log was last
/// empty), the absolute byte position of its count varint (bytes written since then), its
/// instant, and the absolute number of requests recorded before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pos {
    entry: u64,
    count_at: usize,
    at_ns: u64,
    before: u64,
}

/// RequestLog is a compact queue of `(instant, count)` entries with strictly increasing
/// instants.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    /// The encoded entries; the live ones start at the head's count varint. A log of a few
    /// entries keeps them inline (one allocation per key, not two).
    buf: Bytes,
    /// Absolute byte position of `buf[0]` (bytes compacted away before it).
    origin: usize,
    /// The oldest entry (meaningful when the log is not empty).
    head: Pos,
    /// The newest entry (meaningful when the log is not empty).
    tail: Pos,
    /// Absolute number of requests recorded up to the newest entry, inclusive.
    end_before: u64,
    /// The marks and cursors, allocated once the log reaches its first mark
    /// ([`MARK_EVERY`] entries): a shorter log is walked from its head, which is as short.
    index: Option<Box<Index>>,
}

/// Index is what speeds up the seeks of a long log.
#[derive(Debug, Clone, Default)]
struct Index {
    /// Every entry whose number is a positive multiple of [`MARK_EVERY`], oldest first.
    marks: VecDeque<Pos>,
    /// Recent scans, most recent first: a cutoff (ns) and the first entry after it. A cache,
    /// not state: not encoded, compared or hashed; checked against the live range before
    /// use, and reset when requests are taken back.
    cursors: Cell<[Option<(u64, Pos)>; 2]>,
}

impl PartialEq for RequestLog {
    fn eq(&self, other: &Self) -> bool {
        self.total() == other.total()
            && self.bytes() == other.bytes()
            && (self.total() == 0
                || (self.head.at_ns == other.head.at_ns && self.tail.at_ns == other.tail.at_ns))
    }
}

impl Eq for RequestLog {}

impl std::hash::Hash for RequestLog {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.total().hash(state);
        self.bytes().hash(state);
    }
}

/// Appends `v` as LEB128.
fn put_varint(out: &mut Bytes, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one LEB128 value at `*pos`, advancing it. None on truncation, overflow or a
/// non-minimal encoding (so every log has exactly one byte form).
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

impl RequestLog {
    /// Requests recorded.
    pub fn total(&self) -> u64 {
        self.end_before - self.head.before
    }

    /// Distinct instants recorded.
    pub fn entries(&self) -> u64 {
        if self.total() == 0 {
            0
        } else {
            self.tail.entry - self.head.entry + 1
        }
    }

    /// Instant of the newest entry, if any.
    pub fn last(&self) -> Option<Instant> {
        (self.total() > 0).then_some(Instant::from_ns(self.tail.at_ns))
    }

    /// Instant of the oldest entry, if any.
    pub fn first(&self) -> Option<Instant> {
        (self.total() > 0).then_some(Instant::from_ns(self.head.at_ns))
    }

    /// The encoded entries (the codec stores exactly these bytes).
    pub fn bytes(&self) -> &[u8] {
        if self.total() == 0 {
            return &[];
        }
        self.buf.get(self.index(self.head)..).unwrap_or(&[])
    }

    /// Bytes allocated for the log (entries and index).
    pub fn allocated_bytes(&self) -> usize {
        let heap_buf = if self.buf.spilled() {
            self.buf.capacity()
        } else {
            0
        };
        let index = self.index.as_ref().map_or(0, |index| {
            std::mem::size_of::<Index>() + index.marks.capacity() * std::mem::size_of::<Pos>()
        });
        heap_buf + index
    }

    /// Index into `buf` of an entry's count varint.
    fn index(&self, p: Pos) -> usize {
        p.count_at.saturating_sub(self.origin)
    }

    /// The count of the entry at `p`, and the index just after it.
    fn count_of(&self, p: Pos) -> (u64, usize) {
        let mut i = self.index(p);
        let count = get_varint(&self.buf, &mut i).unwrap_or(0);
        (count, i)
    }

    /// The entry after `p`, if `p` is not the newest.
    fn next(&self, p: Pos) -> Option<Pos> {
        if p.entry >= self.tail.entry {
            return None;
        }
        #[cfg(test)]
        tests::DECODED.with(|d| d.set(d.get() + 1));
        let (count, mut i) = self.count_of(p);
        let delta = get_varint(&self.buf, &mut i)?;
        Some(Pos {
            entry: p.entry + 1,
            count_at: self.origin + i,
            at_ns: p.at_ns.saturating_add(delta),
            before: p.before.saturating_add(count),
        })
    }

    /// Whether a cached position still names a live entry.
    fn is_live(&self, p: Pos) -> bool {
        self.total() > 0 && p.entry >= self.head.entry && p.entry <= self.tail.entry
    }

    /// The first entry after `cutoff_ns`, or None when every entry is at or before it.
    /// Resumes from a cached cursor when one is close, else searches the marks; decodes at
    /// most about 2 × [`MARK_EVERY`] entries.
    fn seek_after(&self, cutoff_ns: u64) -> Option<Pos> {
        if self.total() == 0 || self.tail.at_ns <= cutoff_ns {
            return None;
        }
        if self.head.at_ns > cutoff_ns {
            return Some(self.head);
        }
        // Here head.at ≤ cutoff < tail.at: the answer exists and is not the head. Every
        // entry before a cursor's answer is at or before the cursor's cutoff, so for any
        // later cutoff the answer is that entry or after it.
        let cursors = self
            .index
            .as_ref()
            .map_or([None, None], |index| index.cursors.get());
        let resume = cursors
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.map(|(cut, p)| (slot, cut, p)))
            .filter(|&(_, cut, p)| cut <= cutoff_ns && self.is_live(p))
            .max_by_key(|&(_, _, p)| p.entry);
        // Walks forward from `p` (every entry before `p` at or before the cutoff) to the
        // first entry after the cutoff, giving up after `steps`.
        let walk = |mut p: Pos, steps: u64| -> Option<Pos> {
            for _ in 0..=steps {
                if p.at_ns > cutoff_ns {
                    return Some(p);
                }
                p = self.next(p)?;
            }
            None
        };
        let used = resume.map(|(slot, _, _)| slot);
        let found = resume
            .and_then(|(_, _, p)| walk(p, MARK_EVERY))
            .or_else(|| {
                let start = self
                    .last_mark(|m| m.at_ns <= cutoff_ns)
                    .filter(|m| m.entry >= self.head.entry)
                    .unwrap_or(self.head);
                walk(start, MARK_EVERY + 1)
            })?;
        // Most recent first; a new stream of cutoffs evicts the older cursor.
        let other = match used {
            Some(0) => cursors[1],
            _ => cursors[0],
        };
        if let Some(index) = &self.index {
            index.cursors.set([Some((cutoff_ns, found)), other]);
        }
        Some(found)
    }

    /// The last mark satisfying `pred`, which must be monotone (true, then false).
    fn last_mark(&self, pred: impl Fn(&Pos) -> bool) -> Option<Pos> {
        let marks = &self.index.as_ref()?.marks;
        let n = marks.partition_point(|m| pred(m));
        n.checked_sub(1).and_then(|i| marks.get(i)).copied()
    }

    /// The entry holding the request of absolute number `r` (`head.before < r ≤ end`).
    fn entry_holding(&self, r: u64) -> Option<Pos> {
        if r <= self.head.before || r > self.end_before {
            return None;
        }
        let mut p = self
            .last_mark(|m| m.before < r)
            .filter(|m| m.entry >= self.head.entry)
            .unwrap_or(self.head);
        loop {
            let (count, _) = self.count_of(p);
            if p.before.saturating_add(count) >= r {
                return Some(p);
            }
            p = self.next(p)?;
        }
    }

    /// Iterates `(instant, count)` from the oldest entry.
    pub fn iter(&self) -> impl Iterator<Item = (Instant, u64)> + '_ {
        let mut p = (self.total() > 0).then_some(self.head);
        std::iter::from_fn(move || {
            let here = p?;
            p = self.next(here);
            Some((Instant::from_ns(here.at_ns), self.count_of(here).0))
        })
    }

    /// Requests recorded at instants after `cutoff` (None: all).
    pub fn count_after(&self, cutoff: Option<Instant>) -> u64 {
        let Some(cutoff) = cutoff else {
            return self.total();
        };
        match self.seek_after(cutoff.as_ns()) {
            Some(p) => self.end_before - p.before,
            None => 0,
        }
    }

    /// The instant of the `n`-th request (1-based, oldest first) among those recorded after
    /// `cutoff` (None: all), if there are that many.
    pub fn nth_after(&self, cutoff: Option<Instant>, n: u64) -> Option<Instant> {
        let first = match cutoff {
            Some(c) => self.seek_after(c.as_ns())?,
            None if self.total() > 0 => self.head,
            None => return None,
        };
        let p = self.entry_holding(first.before.checked_add(n)?)?;
        Some(Instant::from_ns(p.at_ns))
    }

    /// Removes every entry at or before `cutoff`.
    pub fn drop_until(&mut self, cutoff: Instant) {
        let cutoff_ns = cutoff.as_ns();
        if self.total() == 0 || self.head.at_ns > cutoff_ns {
            return;
        }
        let Some(first_kept) = self.seek_after(cutoff_ns) else {
            // Everything left the window: O(1), whatever the log held.
            self.clear();
            return;
        };
        self.head = first_kept;
        if let Some(index) = &mut self.index {
            while index
                .marks
                .front()
                .is_some_and(|m| m.entry < first_kept.entry)
            {
                index.marks.pop_front();
            }
        }
        self.compact();
    }

    /// Empties the log and gives its memory back.
    fn clear(&mut self) {
        *self = Self::default();
    }

    /// Moves the live bytes to the front once the dead prefix is at least half the buffer,
    /// and gives back memory when the log shrank a lot. Amortised O(1) per byte dropped.
    fn compact(&mut self) {
        let head = self.index(self.head);
        if head > 0 && head * 2 >= self.buf.len() {
            self.buf.drain(..head);
            self.origin += head;
        }
        let len = self.buf.len();
        if self.buf.capacity() > 2 * len + 64 {
            // Never below the length: a shrink, moving the bytes inline when they fit.
            self.buf.grow(len + len / 2 + 16);
        }
        if let Some(index) = &mut self.index {
            let marks = &mut index.marks;
            if marks.capacity() > 2 * marks.len() + 8 {
                marks.shrink_to(marks.len() + marks.len() / 2 + 4);
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
        if count == 0 {
            return;
        }
        let at_ns = at.as_ns();
        if self.total() == 0 {
            self.clear();
            self.reserve(10);
            put_varint(&mut self.buf, count);
            self.head = Pos {
                entry: 0,
                count_at: 0,
                at_ns,
                before: 0,
            };
            self.tail = self.head;
            self.end_before = count;
            return;
        }
        if at_ns <= self.tail.at_ns {
            let i = self.index(self.tail);
            let (old, _) = self.count_of(self.tail);
            self.buf.truncate(i);
            self.reserve(10);
            put_varint(&mut self.buf, old.saturating_add(count));
        } else {
            self.reserve(20);
            put_varint(&mut self.buf, at_ns - self.tail.at_ns);
            let count_at = self.origin + self.buf.len();
            put_varint(&mut self.buf, count);
            self.tail = Pos {
                entry: self.tail.entry + 1,
                count_at,
                at_ns,
                before: self.end_before,
            };
            if self.tail.entry % MARK_EVERY == 0 {
                let tail = self.tail;
                self.index
                    .get_or_insert_with(Box::default)
                    .marks
                    .push_back(tail);
            }
        }
        self.end_before = self.end_before.saturating_add(count);
    }

    /// Removes up to `count` of the most recent requests; returns how many were removed.
    pub fn pop_back(&mut self, count: u64) -> u64 {
        let total = self.total();
        if count >= total {
            self.clear();
            return total;
        }
        if let Some(index) = &self.index {
            index.cursors.set([None, None]);
        }
        let keep_through = self.end_before - count;
        let Some(last) = self.entry_holding(keep_through) else {
            self.clear();
            return total;
        };
        let i = self.index(last);
        self.buf.truncate(i);
        put_varint(&mut self.buf, keep_through - last.before);
        self.tail = last;
        self.end_before = keep_through;
        if let Some(index) = &mut self.index {
            while index.marks.back().is_some_and(|m| m.entry > last.entry) {
                index.marks.pop_back();
            }
        }
        self.compact();
        count
    }

    /// Rebuilds a log from its codec fields, validating everything: entries parse exactly,
    /// counts ≥ 1, instants strictly increasing and ending at `last`, counts summing to
    /// `total`. Returns None for anything else.
    pub fn from_parts(first: Instant, last: Instant, total: u64, bytes: &[u8]) -> Option<Self> {
        if total == 0 {
            return bytes.is_empty().then(Self::default);
        }
        let mut log = Self {
            buf: Bytes::with_capacity(bytes.len()),
            ..Self::default()
        };
        log.buf.extend_from_slice(bytes);
        let mut pos = 0usize;
        let head = Pos {
            entry: 0,
            count_at: 0,
            at_ns: first.as_ns(),
            before: 0,
        };
        let mut p = head;
        loop {
            let count = get_varint(bytes, &mut pos)?;
            if count == 0 {
                return None;
            }
            if p.entry > 0 && p.entry % MARK_EVERY == 0 {
                log.index
                    .get_or_insert_with(Box::default)
                    .marks
                    .push_back(p);
            }
            let end = p.before.checked_add(count)?;
            if pos == bytes.len() {
                log.head = head;
                log.tail = p;
                log.end_before = end;
                break;
            }
            let delta = get_varint(bytes, &mut pos)?;
            if delta == 0 {
                return None;
            }
            p = Pos {
                entry: p.entry + 1,
                count_at: pos,
                at_ns: p.at_ns.checked_add(delta)?,
                before: end,
            };
        }
        (log.end_before == total && log.tail.at_ns == last.as_ns()).then_some(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    thread_local! {
        /// Entries stepped over by `next`, to prove the work bounds.
        pub static DECODED: Cell<u64> = const { Cell::new(0) };
    }

    /// Entries decoded by `f`.
    fn decoded_by<R>(f: impl FnOnce() -> R) -> (R, u64) {
        DECODED.with(|d| d.set(0));
        let r = f();
        (r, DECODED.with(Cell::get))
    }

    fn t(ns: u64) -> Instant {
        Instant::from_ns(ns)
    }

    /// 200,000 entries 1 ms apart: an hour-long window of a busy key.
    fn long_log() -> RequestLog {
        let mut log = RequestLog::default();
        for i in 0..200_000u64 {
            log.push(t(1_000_000_000 + i * 1_000_000), 1);
        }
        log
    }

    #[test]
    fn any_seek_decodes_a_bounded_number_of_entries_whatever_the_log_holds() {
        let log = long_log();
        let last = log.last().unwrap().as_ns();
        for cut_ms in [0u64, 1, 63, 64, 65, 99_999, 150_000, 199_998] {
            let cut = t(1_000_000_000 + cut_ms * 1_000_000);
            let (n, work) = decoded_by(|| log.count_after(Some(cut)));
            assert_eq!(n, 199_999 - cut_ms);
            assert!(work <= 2 * MARK_EVERY + 2, "count_after: {work} entries");
            // The n-th request after the cutoff, for any n (a lowered limit's denial).
            for nth in [1u64, 2, 1_000, 99_000] {
                let (at, work) = decoded_by(|| log.nth_after(Some(cut), nth));
                let expected =
                    (cut_ms + nth < 200_000).then(|| t(1_000_000_000 + (cut_ms + nth) * 1_000_000));
                assert_eq!(at, expected);
                assert!(work <= 3 * MARK_EVERY + 4, "nth_after: {work} entries");
            }
        }
        assert!(last > 0);
    }

    #[test]
    fn reading_through_two_windows_alternately_is_amortised_constant() {
        let log = long_log();
        let start = 1_000_000_000 + 100_000 * 1_000_000;
        let (_, work) = decoded_by(|| {
            for step in 0..10_000u64 {
                let now = start + step * 1_000_000;
                log.count_after(Some(t(now - 60_000 * 1_000_000))); // the last minute
                log.count_after(Some(t(now - 3_600_000 * 1_000_000 / 40))); // 90 s
            }
        });
        // 20,000 reads moving 10,000 entries forward in each window.
        assert!(
            work <= 3 * 10_000 + 4 * MARK_EVERY,
            "{work} entries for 20,000 reads"
        );
    }

    #[test]
    fn refunds_and_drops_touch_a_bounded_number_of_entries() {
        let mut log = long_log();
        let (_, work) = decoded_by(|| log.pop_back(150_000));
        assert!(work <= 2 * MARK_EVERY + 2, "pop_back: {work} entries");
        assert_eq!(log.total(), 50_000);
        let (_, work) = decoded_by(|| log.drop_until(t(1_000_000_000 + 30_000 * 1_000_000)));
        assert!(work <= 2 * MARK_EVERY + 2, "drop_until: {work} entries");
        assert_eq!(log.total(), 19_999);
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
        // Entries, slack under one third, and the index at about half a byte per entry.
        assert!(
            log.allocated_bytes() <= 4 * 10_000 * 3 / 2 + 10_000 / 2 + 64,
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

    #[test]
    fn dropping_a_whole_log_gives_its_memory_back() {
        let mut log = RequestLog::default();
        for i in 0..100_000u64 {
            log.push(t(1_000 + i * 1_000), 1);
        }
        assert!(log.allocated_bytes() > 200_000);
        log.drop_until(t(u64::MAX / 2));
        assert_eq!(log.total(), 0);
        assert_eq!(log.allocated_bytes(), 0);
    }

    /// A brute-force model: one `(instant, count)` per entry.
    #[derive(Default, Debug)]
    struct Model(Vec<(u64, u64)>);

    impl Model {
        fn push(&mut self, at: u64, c: u64) {
            match self.0.last_mut() {
                Some(last) if at <= last.0 => last.1 += c,
                _ => self.0.push((at, c)),
            }
        }
        fn total(&self) -> u64 {
            self.0.iter().map(|e| e.1).sum()
        }
        fn after(&self, cutoff: u64) -> Vec<(u64, u64)> {
            self.0.iter().copied().filter(|e| e.0 > cutoff).collect()
        }
        fn drop_until(&mut self, cutoff: u64) {
            self.0.retain(|e| e.0 > cutoff);
        }
        fn pop_back(&mut self, mut n: u64) -> u64 {
            let mut removed = 0;
            while n > 0 {
                let Some(last) = self.0.last_mut() else { break };
                let k = n.min(last.1);
                last.1 -= k;
                n -= k;
                removed += k;
                if last.1 == 0 {
                    self.0.pop();
                }
            }
            removed
        }
    }

    fn check(log: &RequestLog, model: &Model) -> Result<(), TestCaseError> {
        let listed: Vec<(u64, u64)> = log.iter().map(|(a, c)| (a.as_ns(), c)).collect();
        prop_assert_eq!(&listed, &model.0);
        prop_assert_eq!(log.total(), model.total());
        prop_assert_eq!(log.entries(), model.0.len() as u64);
        let rebuilt = RequestLog::from_parts(
            log.first().unwrap_or_default(),
            log.last().unwrap_or_default(),
            log.total(),
            log.bytes(),
        );
        prop_assert_eq!(rebuilt.as_ref(), Some(log));
        Ok(())
    }

    proptest! {
        /// Every operation, with cutoffs that go back and forth (the cursor cache and the
        /// marks in play), agrees with a brute-force model.
        #[test]
        fn every_operation_agrees_with_a_brute_force_model(
            ops in prop::collection::vec((0u8..6, 0u64..4_000, 1u64..4), 1..400),
        ) {
            let mut log = RequestLog::default();
            let mut model = Model::default();
            let mut now = 10_000u64;
            for (op, x, c) in ops {
                match op {
                    0 | 1 => { now += x % 50; log.push(t(now), c); model.push(now, c); }
                    2 => { prop_assert_eq!(log.pop_back(c), model.pop_back(c)); }
                    3 => { let cut = now.saturating_sub(x); log.drop_until(t(cut)); model.drop_until(cut); }
                    4 => {
                        let cut = now.saturating_sub(x);
                        let after = model.after(cut);
                        prop_assert_eq!(log.count_after(Some(t(cut))), after.iter().map(|e| e.1).sum::<u64>());
                    }
                    _ => {
                        let cut = now.saturating_sub(x);
                        let after = model.after(cut);
                        let n = 1 + x % 7;
                        let mut seen = 0;
                        let expected = after.iter().find(|e| { seen += e.1; seen >= n }).map(|e| t(e.0));
                        prop_assert_eq!(log.nth_after(Some(t(cut)), n), expected);
                    }
                }
                check(&log, &model)?;
            }
        }

        /// Logs around and past the index (63 to a few hundred entries, so marks, cursors and
        /// the head standing in for entry 0 are all in play): pushes, drops of a few entries,
        /// refunds back below 64 and to empty, reads through two windows, and rebuilds from
        /// the codec's fields (as after an RDB load, which renumbers the entries), against the
        /// brute-force model.
        #[test]
        fn logs_across_the_index_boundary_agree_with_a_brute_force_model(
            fill in 60u64..300,
            ops in prop::collection::vec((0u8..8, 0u64..200, 1u64..70), 1..300),
        ) {
            let mut log = RequestLog::default();
            let mut model = Model::default();
            let mut now = 1_000_000u64;
            for _ in 0..fill { now += 10; log.push(t(now), 1); model.push(now, 1); }
            check(&log, &model)?;
            for (op, x, c) in ops {
                match op {
                    0 | 1 => { now += 1 + x % 20; log.push(t(now), 1 + c % 3); model.push(now, 1 + c % 3); }
                    2 => { prop_assert_eq!(log.pop_back(c), model.pop_back(c)); }
                    3 => {
                        // Drop the oldest few entries: the head moves off the marks.
                        let cut = model.0.get((x % 8) as usize).map_or(now, |e| e.0);
                        log.drop_until(t(cut));
                        model.drop_until(cut);
                    }
                    4 | 5 => {
                        let span = if op == 4 { 50 + x } else { 700 + 3 * x };
                        let cut = now.saturating_sub(span);
                        let after = model.after(cut);
                        prop_assert_eq!(log.count_after(Some(t(cut))), after.iter().map(|e| e.1).sum::<u64>());
                        let n = 1 + (x * 7 + c) % 200;
                        let mut seen = 0;
                        let expected = after.iter().find(|e| { seen += e.1; seen >= n }).map(|e| t(e.0));
                        prop_assert_eq!(log.nth_after(Some(t(cut)), n), expected);
                    }
                    6 => {
                        // An earlier instant (a clock step back) joins the newest entry.
                        let at = now.saturating_sub(x);
                        log.push(t(at), c);
                        model.push(at, c);
                    }
                    _ => {
                        log = RequestLog::from_parts(
                            log.first().unwrap_or_default(),
                            log.last().unwrap_or_default(),
                            log.total(),
                            log.bytes(),
                        ).unwrap();
                    }
                }
                check(&log, &model)?;
            }
        }

        /// Long logs (many marks) with two window lengths read alternately.
        #[test]
        fn alternating_cutoffs_on_a_long_log_count_exactly(
            gaps in prop::collection::vec(1u64..1_000, 200..3_000),
            reads in prop::collection::vec((0u64..3, 0u64..2_000_000), 1..60),
        ) {
            let mut log = RequestLog::default();
            let mut model = Model::default();
            let mut now = 1_000_000u64;
            for g in gaps { now += g; log.push(t(now), 1); model.push(now, 1); }
            for (which, back) in reads {
                let cut = now.saturating_sub(match which { 0 => 1_000 + back / 100, 1 => 500_000 + back / 10, _ => back });
                prop_assert_eq!(log.count_after(Some(t(cut))), model.after(cut).len() as u64);
            }
        }
    }
}
