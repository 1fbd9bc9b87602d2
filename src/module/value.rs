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
//! | 4 | [`LogState`] (plus its log buffer) | 64 + log |
//!
//! Everything outside this file sees plain states; the codec's encoding is the same for both
//! GCRA forms.

use std::ffi::c_void;

use super::params_table;
use super::stats::{self, Kind};
use crate::algo::fixed_window::FixedState;
use crate::algo::gcra::GcraState;
use crate::algo::sliding_log::LogState;
use crate::algo::sliding_window::SlidingState;
use crate::codec::{self, State};

const TAG_MASK: usize = 0b111;
const TAG_GCRA_COMPACT: usize = 0;
const TAG_GCRA_WIDE: usize = 1;
const TAG_FIXED: usize = 2;
const TAG_SLIDING: usize = 3;
const TAG_LOG: usize = 4;

/// Bits of [`CompactGcra::packed`] that hold `tat − updated` in ns (about 78 hours).
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
    fn pack(g: &GcraState) -> Option<Self> {
        let in_use = g.tat_ns.checked_sub(g.updated_ns)?;
        if in_use > IN_USE_MASK {
            return None;
        }
        let id = params_table::id_for(g.emission_interval_ns, g.burst)?;
        Some(Self {
            tat_ns: g.tat_ns,
            packed: (u64::from(id) << IN_USE_BITS) | in_use,
        })
    }

    fn unpack(&self) -> Option<GcraState> {
        let id = (self.packed >> IN_USE_BITS) as u16;
        let (emission_interval_ns, burst) = params_table::get(id)?;
        Some(GcraState {
            tat_ns: self.tat_ns,
            emission_interval_ns,
            burst,
            updated_ns: self.tat_ns - (self.packed & IN_USE_MASK),
        })
    }
}

/// A key's value, seen through its tagged pointer. GCRA is a copy (it is rebuilt from the
/// compact form); the others are borrowed in place.
pub enum Value<'a> {
    /// A GCRA state.
    Gcra(GcraState),
    /// A FIXED window state.
    Fixed(&'a mut FixedState),
    /// A SLIDING window state.
    Sliding(&'a mut SlidingState),
    /// A LOG window state.
    Log(&'a mut LogState),
}

impl Value<'_> {
    /// What the key holds, as users see it in errors.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Gcra(_) => "GCRA limiter",
            Self::Fixed(_) => "FIXED window",
            Self::Sliding(_) => "SLIDING window",
            Self::Log(_) => "LOG window",
        }
    }
}

fn tag(raw: *mut c_void) -> usize {
    raw as usize & TAG_MASK
}

fn untag<T>(raw: *mut c_void) -> *mut T {
    (raw as usize & !TAG_MASK) as *mut T
}

fn kind_of(tag: usize) -> Option<Kind> {
    match tag {
        TAG_GCRA_COMPACT | TAG_GCRA_WIDE => Some(Kind::Gcra),
        TAG_FIXED => Some(Kind::Fixed),
        TAG_SLIDING => Some(Kind::Sliding),
        TAG_LOG => Some(Kind::Log),
        _ => None,
    }
}

fn tagged<T>(b: Box<T>, tag: usize) -> *mut c_void {
    if let Some(kind) = kind_of(tag) {
        stats::key_created(kind);
    }
    let p = Box::into_raw(b) as usize;
    debug_assert_eq!(p & TAG_MASK, 0);
    (p | tag) as *mut c_void
}

/// Views a value made by this module.
///
/// # Safety
/// `raw` must be null or a pointer made by [`into_raw`] / [`gcra_into_raw`] and not freed,
/// and nothing else may access it while the result lives.
pub unsafe fn view<'a>(raw: *mut c_void) -> Option<Value<'a>> {
    if raw.is_null() {
        return None;
    }
    match tag(raw) {
        TAG_GCRA_COMPACT => (*untag::<CompactGcra>(raw)).unpack().map(Value::Gcra),
        TAG_GCRA_WIDE => Some(Value::Gcra(*untag::<GcraState>(raw))),
        TAG_FIXED => untag::<FixedState>(raw).as_mut().map(Value::Fixed),
        TAG_SLIDING => untag::<SlidingState>(raw).as_mut().map(Value::Sliding),
        TAG_LOG => untag::<LogState>(raw).as_mut().map(Value::Log),
        _ => None,
    }
}

/// Allocates the value for a GCRA state: compact when it fits, else wide.
pub fn gcra_into_raw(g: &GcraState) -> *mut c_void {
    match CompactGcra::pack(g) {
        Some(c) => tagged(Box::new(c), TAG_GCRA_COMPACT),
        None => tagged(Box::new(*g), TAG_GCRA_WIDE),
    }
}

/// Overwrites a GCRA value in place when its form can hold `g`; returns false otherwise (the
/// caller then replaces the value).
///
/// # Safety
/// As for [`view`].
pub unsafe fn update_gcra(raw: *mut c_void, g: &GcraState) -> bool {
    match tag(raw) {
        TAG_GCRA_COMPACT => match CompactGcra::pack(g) {
            Some(c) => {
                *untag::<CompactGcra>(raw) = c;
                true
            }
            None => false,
        },
        TAG_GCRA_WIDE => {
            *untag::<GcraState>(raw) = *g;
            true
        }
        _ => false,
    }
}

/// Allocates the value for any state.
pub fn into_raw(state: State) -> *mut c_void {
    match state {
        State::Gcra(g) => gcra_into_raw(&g),
        State::Fixed(b) => tagged(b, TAG_FIXED),
        State::Sliding(b) => tagged(b, TAG_SLIDING),
        State::Log(b) => tagged(b, TAG_LOG),
    }
}

/// Frees a value. Needs no shared state, so it is safe from Redis's lazy-free thread.
///
/// # Safety
/// `raw` must be null or a live value made by this module; it is invalid afterwards.
pub unsafe fn free(raw: *mut c_void) {
    if raw.is_null() {
        return;
    }
    if let Some(kind) = kind_of(tag(raw)) {
        stats::key_freed(kind);
    }
    match tag(raw) {
        TAG_GCRA_COMPACT => drop(Box::from_raw(untag::<CompactGcra>(raw))),
        TAG_GCRA_WIDE => drop(Box::from_raw(untag::<GcraState>(raw))),
        TAG_FIXED => drop(Box::from_raw(untag::<FixedState>(raw))),
        TAG_SLIDING => drop(Box::from_raw(untag::<SlidingState>(raw))),
        TAG_LOG => drop(Box::from_raw(untag::<LogState>(raw))),
        _ => {}
    }
}

/// Bytes allocated for a value.
///
/// # Safety
/// As for [`view`].
pub unsafe fn heap_bytes(raw: *mut c_void) -> usize {
    match tag(raw) {
        TAG_GCRA_COMPACT => std::mem::size_of::<CompactGcra>(),
        TAG_GCRA_WIDE => std::mem::size_of::<GcraState>(),
        TAG_FIXED => std::mem::size_of::<FixedState>(),
        TAG_SLIDING => std::mem::size_of::<SlidingState>(),
        TAG_LOG => match untag::<LogState>(raw).as_ref() {
            Some(l) => std::mem::size_of::<LogState>() + l.log.allocated_bytes(),
            None => 0,
        },
        _ => 0,
    }
}

/// Appends the codec encoding of a value.
///
/// # Safety
/// As for [`view`].
pub unsafe fn encode_into(raw: *mut c_void, out: &mut Vec<u8>) {
    match view(raw) {
        Some(Value::Gcra(g)) => codec::encode_gcra_into(&g, out),
        Some(Value::Fixed(s)) => codec::encode_fixed_into(s, out),
        Some(Value::Sliding(s)) => codec::encode_sliding_into(s, out),
        Some(Value::Log(s)) => codec::encode_log_into(s, out),
        None => {}
    }
}

/// Returns an owned copy of a value.
///
/// # Safety
/// As for [`view`].
pub unsafe fn to_state(raw: *mut c_void) -> Option<State> {
    Some(match view(raw)? {
        Value::Gcra(g) => State::Gcra(g),
        Value::Fixed(s) => State::Fixed(Box::new(*s)),
        Value::Sliding(s) => State::Sliding(Box::new(*s)),
        Value::Log(s) => State::Log(Box::new(s.clone())),
    })
}
