//! The GCRA parameter table: distinct `(emission_interval_ns, burst)` pairs get a 16-bit id,
//! so that a GCRA key can live in a 16-byte allocation (TAT + id + in-use) instead of 32.
//! Keys share parameters in practice (one table entry per configured limit).
//!
//! Memory: the table is static (`.bss`), [`STATIC_BYTES`] in all (1.5 MiB: the pairs, and an
//! open-addressed index of twice as many slots); none of it is allocated through Redis, so
//! none of it shows in `used_memory`, and only the pages touched become resident. `INFO rl`
//! reports the pairs in use and these bytes.
//!
//! When the table is full, new parameter pairs use the wide 32-byte form, which needs no id.
//! When no compact value is left (after `FLUSHALL`, or once every such key expired), the
//! next lookup empties the table, so ids come back. Only the main thread assigns ids (every
//! write happens there); values are read by the main thread and by the fork child that writes
//! an RDB (a copy of memory), and freed by the lazy-free thread, which reads no id.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Number of ids.
pub const CAPACITY: usize = 1 << 16;
/// Index slots: twice the ids, so a lookup probes few slots even when the table is full.
const SLOTS: usize = 2 * CAPACITY;
/// Static bytes of the table (pairs and index).
pub const STATIC_BYTES: usize = CAPACITY * 16 + SLOTS * 4;

static INTERVALS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static BURSTS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
/// `id + 1` of the pair hashed to the slot (linear probing), 0 for an empty slot.
static INDEX: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Compact values alive (they hold ids).
static LIVE: AtomicI64 = AtomicI64::new(0);

/// `id + 1` of the last pair looked up (0: none): nearly every lookup hits it. Checked
/// against the table itself, whose assigned pairs never change until [`clear`].
static LAST: AtomicU32 = AtomicU32::new(0);

/// Returns the `(emission_interval_ns, burst)` of `id`, if assigned.
pub fn get(id: u16) -> Option<(u64, u64)> {
    let i = usize::from(id);
    if i >= LEN.load(Ordering::Acquire) {
        return None;
    }
    Some((
        INTERVALS[i].load(Ordering::Relaxed),
        BURSTS[i].load(Ordering::Relaxed),
    ))
}

fn slot_of(emission_interval_ns: u64, burst: u64) -> usize {
    // A multiplicative hash of both words; the high bits pick the slot.
    let h = (emission_interval_ns ^ burst.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - SLOTS.trailing_zeros())) as usize
}

/// Returns the id of the pair, assigning one if needed; `None` when the table is full.
/// Main thread only.
pub fn id_for(emission_interval_ns: u64, burst: u64) -> Option<u16> {
    if let Some(last) = LAST.load(Ordering::Relaxed).checked_sub(1) {
        let id = u16::try_from(last).ok()?;
        if get(id) == Some((emission_interval_ns, burst)) {
            return Some(id);
        }
    }
    if LIVE.load(Ordering::Acquire) <= 0 && LEN.load(Ordering::Relaxed) > 0 {
        clear();
    }
    let mut slot = slot_of(emission_interval_ns, burst);
    let id = loop {
        let held = INDEX[slot].load(Ordering::Relaxed);
        if held == 0 {
            let len = LEN.load(Ordering::Relaxed);
            if len >= CAPACITY {
                return None;
            }
            INTERVALS[len].store(emission_interval_ns, Ordering::Relaxed);
            BURSTS[len].store(burst, Ordering::Relaxed);
            LEN.store(len + 1, Ordering::Release);
            let id = u16::try_from(len).ok()?;
            INDEX[slot].store(u32::from(id) + 1, Ordering::Relaxed);
            break id;
        }
        let id = u16::try_from(held - 1).ok()?;
        if get(id) == Some((emission_interval_ns, burst)) {
            break id;
        }
        slot = (slot + 1) % SLOTS;
    };
    LAST.store(u32::from(id) + 1, Ordering::Relaxed);
    Some(id)
}

/// Empties the table (no compact value holds an id): O(ids assigned).
fn clear() {
    let len = LEN.load(Ordering::Relaxed);
    for id in 0..len {
        let pair = (
            INTERVALS[id].load(Ordering::Relaxed),
            BURSTS[id].load(Ordering::Relaxed),
        );
        let mut slot = slot_of(pair.0, pair.1);
        for _ in 0..SLOTS {
            if INDEX[slot].load(Ordering::Relaxed) as usize == id + 1 {
                INDEX[slot].store(0, Ordering::Relaxed);
                break;
            }
            slot = (slot + 1) % SLOTS;
        }
    }
    LEN.store(0, Ordering::Release);
    LAST.store(0, Ordering::Relaxed);
}

/// A compact value was made (it holds an id).
pub fn value_created() {
    LIVE.fetch_add(1, Ordering::AcqRel);
}

/// A compact value was freed (any thread).
pub fn value_freed() {
    LIVE.fetch_sub(1, Ordering::AcqRel);
}

/// Number of assigned ids (for INFO).
pub fn len() -> usize {
    LEN.load(Ordering::Acquire)
}
