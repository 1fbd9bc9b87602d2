//! The GCRA parameter table: distinct `(emission_interval_ns, burst)` pairs get a 16-bit id,
//! so that a GCRA key can live in a 16-byte allocation (TAT + id + in-use) instead of 32.
//! Keys share parameters in practice (one table entry per configured limit).
//!
//! The table only grows (at most 65 536 entries, 1 MiB of static memory, none of it counted
//! by `used_memory`); when it is full, new parameter pairs use the wide 32-byte form, which
//! needs no id. Entries are written once, by the main thread, before their id is published;
//! reads (any thread, including the fork child that writes an RDB) see a complete entry.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Number of ids.
pub const CAPACITY: usize = 1 << 16;

static INTERVALS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static BURSTS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static LEN: AtomicUsize = AtomicUsize::new(0);
static INDEX: Mutex<Option<HashMap<(u64, u64), u16>>> = Mutex::new(None);

thread_local! {
    /// The last pair looked up, and its id: nearly every lookup hits it.
    static LAST: Cell<(u64, u64, u16)> = const { Cell::new((0, 0, 0)) };
}

/// Returns the `(emission_interval_ns, burst)` of `id`, if assigned.
pub fn get(id: u16) -> Option<(u64, u64)> {
    if usize::from(id) >= LEN.load(Ordering::Acquire) {
        return None;
    }
    let i = usize::from(id);
    Some((
        INTERVALS[i].load(Ordering::Relaxed),
        BURSTS[i].load(Ordering::Relaxed),
    ))
}

/// Returns the id of the pair, assigning one if needed; `None` when the table is full.
pub fn id_for(emission_interval_ns: u64, burst: u64) -> Option<u16> {
    let (t, b, id) = LAST.with(Cell::get);
    if t == emission_interval_ns && b == burst && t != 0 {
        return Some(id);
    }
    let mut guard = INDEX
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let index = guard.get_or_insert_with(HashMap::new);
    let id = match index.get(&(emission_interval_ns, burst)) {
        Some(&id) => id,
        None => {
            let len = LEN.load(Ordering::Acquire);
            if len >= CAPACITY {
                return None;
            }
            INTERVALS[len].store(emission_interval_ns, Ordering::Relaxed);
            BURSTS[len].store(burst, Ordering::Relaxed);
            LEN.store(len + 1, Ordering::Release);
            let id = u16::try_from(len).ok()?;
            index.insert((emission_interval_ns, burst), id);
            id
        }
    };
    LAST.with(|c| c.set((emission_interval_ns, burst, id)));
    Some(id)
}

/// Number of assigned ids (for INFO).
pub fn len() -> usize {
    LEN.load(Ordering::Acquire)
}
