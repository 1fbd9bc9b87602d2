//! How a limiter state sits in Redis memory. The value pointer Redis keeps for a key is a
//! tagged pointer: the low 3 bits (always 0 in an 8-aligned allocation) say what it points
//! to, so each algorithm gets an allocation of exactly its own size:
//!
//! | tag | points to | bytes |
//! |---|---|---|
//! | 0 | [`CompactGcra`]: TAT, parameter id, capacity in use at the last write | 16 |
//! | 1 | [`GcraState`], for parameters or spans the compact form cannot hold | 32 |
//! | 2 | [`FixedState`] | 40 |
//! | 3 | [`SlidingState`] | 48 |
//! | 4 | [`LogState`] (plus its log buffer and index) | 128 + log |
//! | 5 | [`LeaseState`] (plus its lease records) | 32 + 17 per lease + tokens |
//!
//! Everything outside this file sees [`StateRef`]s, [`Write`]s and [`State`]s; the codec's
//! encoding is the same for both GCRA forms.
//!
//! A value is a `*mut c_void` made here and handed to Redis, which gives it back to the type
//! callbacks and to `ModuleTypeGetValue` until it frees it through [`free`]. The functions
//! that take one are `unsafe` with one contract, stated once: **`raw` is null or a live value
//! made by this file (by [`new_value`] or [`from_state`]), not freed, and not accessed by
//! anything else while the call (and any reference it returns) lasts.**

use std::ffi::c_void;

use super::params_table;
use super::stats;
use crate::algo::fixed_window::FixedState;
use crate::algo::gcra::GcraState;
use crate::algo::lease::{LeaseState, LeaseWrite};
use crate::algo::sliding_log::LogState;
use crate::algo::sliding_window::SlidingState;
use crate::params::WindowParams;
use crate::state::{Algorithm, State, StateRef, Write};
use crate::time::Span;

const TAG_MASK: usize = 0b111;
const TAG_GCRA_COMPACT: usize = 0;
const TAG_GCRA_WIDE: usize = 1;
const TAG_FIXED: usize = 2;
const TAG_SLIDING: usize = 3;
const TAG_LOG: usize = 4;
const TAG_LEASE: usize = 5;

/// Bits of [`CompactGcra::packed`] that hold `tat − updated_at` in ns (about 78 hours).
const IN_USE_BITS: u32 = 48;
const IN_USE_MASK: u64 = (1 << IN_USE_BITS) - 1;

/// CompactGcra is a GCRA state in 16 bytes: the TAT, and the parameter id (high 16 bits)
/// with the time between the last write and the TAT (low 48 bits).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct CompactGcra {
    tat_ns: u64,
    packed: u64,
}

impl CompactGcra {
    #[inline(always)]
    fn pack(g: &GcraState) -> Option<Self> {
        let in_use = g.tat.checked_since(g.updated_at)?.as_ns();
        if in_use > IN_USE_MASK {
            return None;
        }
        let id = params_table::id_for(g.emission_interval.as_ns(), g.burst)?;
        Some(Self {
            tat_ns: g.tat.as_ns(),
            packed: (u64::from(id) << IN_USE_BITS) | in_use,
        })
    }

    #[inline(always)]
    fn unpack(&self) -> Option<GcraState> {
        let id = (self.packed >> IN_USE_BITS) as u16;
        let (emission_interval_ns, burst) = params_table::get(id)?;
        let tat = crate::time::Instant::from_ns(self.tat_ns);
        Some(GcraState {
            tat,
            emission_interval: Span::from_ns(emission_interval_ns),
            burst,
            updated_at: tat.saturating_sub(Span::from_ns(self.packed & IN_USE_MASK)),
        })
    }
}

fn tag(raw: *mut c_void) -> usize {
    raw as usize & TAG_MASK
}

fn untag<T>(raw: *mut c_void) -> *mut T {
    (raw as usize & !TAG_MASK) as *mut T
}

fn algorithm_of(tag: usize) -> Option<Algorithm> {
    match tag {
        TAG_GCRA_COMPACT | TAG_GCRA_WIDE => Some(Algorithm::Gcra),
        TAG_FIXED => Some(Algorithm::Fixed),
        TAG_SLIDING => Some(Algorithm::Sliding),
        TAG_LOG => Some(Algorithm::Log),
        TAG_LEASE => Some(Algorithm::Lease),
        _ => None,
    }
}

#[inline(always)]
fn tagged<T>(b: Box<T>, tag: usize) -> *mut c_void {
    if let Some(algorithm) = algorithm_of(tag) {
        stats::key_created(algorithm);
    }
    if tag == TAG_GCRA_COMPACT {
        params_table::value_created();
    }
    let p = Box::into_raw(b) as usize;
    debug_assert_eq!(p & TAG_MASK, 0);
    (p | tag) as *mut c_void
}

/// Views a value where it lies (None for null).
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn view<'a>(raw: *mut c_void) -> Option<StateRef<'a>> {
    if raw.is_null() {
        return None;
    }
    // SAFETY: per the contract, `raw` was made by `tagged` with this tag, so the untagged
    // pointer addresses a live, aligned allocation of the tag's type, not aliased mutably.
    unsafe {
        match tag(raw) {
            TAG_GCRA_COMPACT => (*untag::<CompactGcra>(raw)).unpack().map(StateRef::Gcra),
            TAG_GCRA_WIDE => Some(StateRef::Gcra(*untag::<GcraState>(raw))),
            TAG_FIXED => untag::<FixedState>(raw).as_ref().map(StateRef::Fixed),
            TAG_SLIDING => untag::<SlidingState>(raw).as_ref().map(StateRef::Sliding),
            TAG_LOG => untag::<LogState>(raw).as_ref().map(StateRef::Log),
            TAG_LEASE => untag::<LeaseState>(raw).as_ref().map(StateRef::Lease),
            _ => None,
        }
    }
}

/// Allocates the value for a GCRA state: compact when it fits, else wide.
#[inline(always)]
fn gcra_value(g: &GcraState) -> *mut c_void {
    match CompactGcra::pack(g) {
        Some(c) => tagged(Box::new(c), TAG_GCRA_COMPACT),
        None => tagged(Box::new(*g), TAG_GCRA_WIDE),
    }
}

/// Applies `write` to the value in place when the value can hold the result; returns false
/// otherwise (another algorithm, or a GCRA state the compact form cannot hold), and the
/// caller replaces the value with [`new_value`].
///
/// # Safety
/// See the module documentation; `raw` must not be null.
#[inline(always)]
pub unsafe fn write_in_place(raw: *mut c_void, write: &Write) -> bool {
    // SAFETY: per the contract, the untagged pointer addresses a live allocation of the
    // tag's type that nothing else accesses during this call.
    unsafe {
        match (tag(raw), write) {
            (TAG_GCRA_COMPACT, Write::Gcra(g)) => match CompactGcra::pack(g) {
                Some(c) => {
                    *untag::<CompactGcra>(raw) = c;
                    true
                }
                None => false,
            },
            (TAG_GCRA_WIDE, Write::Gcra(g)) => {
                *untag::<GcraState>(raw) = *g;
                true
            }
            (TAG_FIXED, Write::Fixed(s)) => {
                *untag::<FixedState>(raw) = *s;
                true
            }
            (TAG_SLIDING, Write::Sliding(s)) => {
                *untag::<SlidingState>(raw) = *s;
                true
            }
            (TAG_LOG, Write::Log(w)) => {
                (*untag::<LogState>(raw)).apply(w);
                true
            }
            (TAG_LOG, Write::LogRefund { at, quantity }) => {
                (*untag::<LogState>(raw)).refund(*at, *quantity);
                true
            }
            (TAG_LEASE, Write::Lease(w)) => {
                (*untag::<LeaseState>(raw)).apply(w);
                true
            }
            _ => false,
        }
    }
}

/// Allocates a value holding what `write` makes of a missing key (a LOG refund of a missing
/// key makes nothing: null).
#[inline(always)]
pub fn new_value(write: &Write) -> *mut c_void {
    match write {
        Write::Gcra(g) => gcra_value(g),
        Write::Fixed(s) => tagged(Box::new(*s), TAG_FIXED),
        Write::Sliding(s) => tagged(Box::new(*s), TAG_SLIDING),
        Write::Log(w) => {
            let mut state = LogState::new(&WindowParams {
                limit: w.limit,
                window: w.window,
            });
            state.apply(w);
            tagged(Box::new(state), TAG_LOG)
        }
        Write::Lease(w) if matches!(**w, LeaseWrite::Acquire { .. }) => {
            let mut state = LeaseState::default();
            state.apply(w);
            tagged(Box::new(state), TAG_LEASE)
        }
        Write::LogRefund { .. } | Write::Lease(_) => std::ptr::null_mut(),
    }
}

/// Allocates the value for an owned state.
pub fn from_state(state: State) -> *mut c_void {
    match state {
        State::Gcra(g) => gcra_value(&g),
        State::Fixed(b) => tagged(b, TAG_FIXED),
        State::Sliding(b) => tagged(b, TAG_SLIDING),
        State::Log(b) => tagged(b, TAG_LOG),
        State::Lease(b) => tagged(b, TAG_LEASE),
    }
}

/// Whether a LOG value holds no request, or a LEASE value no lease, any more (a key to
/// delete).
///
/// # Safety
/// See the module documentation.
pub unsafe fn is_emptied(raw: *mut c_void) -> bool {
    // SAFETY: per the contract.
    match unsafe { view(raw) } {
        Some(StateRef::Log(s)) => s.log.total() == 0,
        Some(StateRef::Lease(s)) => s.is_empty(),
        _ => false,
    }
}

/// Frees a value. Needs no shared state, so it is safe from Redis's lazy-free thread.
///
/// # Safety
/// See the module documentation; `raw` is invalid afterwards.
pub unsafe fn free(raw: *mut c_void) {
    if raw.is_null() {
        return;
    }
    if let Some(algorithm) = algorithm_of(tag(raw)) {
        stats::key_freed(algorithm);
    }
    if tag(raw) == TAG_GCRA_COMPACT {
        params_table::value_freed();
    }
    // SAFETY: per the contract, the untagged pointer came from `Box::into_raw` of the tag's
    // type in `tagged`, and this is its only release.
    unsafe {
        match tag(raw) {
            TAG_GCRA_COMPACT => drop(Box::from_raw(untag::<CompactGcra>(raw))),
            TAG_GCRA_WIDE => drop(Box::from_raw(untag::<GcraState>(raw))),
            TAG_FIXED => drop(Box::from_raw(untag::<FixedState>(raw))),
            TAG_SLIDING => drop(Box::from_raw(untag::<SlidingState>(raw))),
            TAG_LOG => drop(Box::from_raw(untag::<LogState>(raw))),
            TAG_LEASE => drop(Box::from_raw(untag::<LeaseState>(raw))),
            _ => {}
        }
    }
}

/// Bytes allocated for a value.
///
/// # Safety
/// See the module documentation.
pub unsafe fn heap_bytes(raw: *mut c_void) -> usize {
    match tag(raw) {
        TAG_GCRA_COMPACT => std::mem::size_of::<CompactGcra>(),
        TAG_GCRA_WIDE => std::mem::size_of::<GcraState>(),
        TAG_FIXED => std::mem::size_of::<FixedState>(),
        TAG_SLIDING => std::mem::size_of::<SlidingState>(),
        // SAFETY: per the contract, a LOG tag addresses a live `LogState`.
        TAG_LOG => match unsafe { untag::<LogState>(raw).as_ref() } {
            Some(l) => std::mem::size_of::<LogState>() + l.log.allocated_bytes(),
            None => 0,
        },
        // SAFETY: per the contract, a LEASE tag addresses a live `LeaseState`.
        TAG_LEASE => match unsafe { untag::<LeaseState>(raw).as_ref() } {
            Some(l) => std::mem::size_of::<LeaseState>() + l.allocated_bytes(),
            None => 0,
        },
        _ => 0,
    }
}
