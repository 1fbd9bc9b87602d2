//! The one versioned encoding of a limiter key's state, used by RDB save/load, AOF rewrite,
//! replication (`RL.APPLY`), `DUMP`/`RESTORE` and `DEBUG DIGEST-VALUE`; and the encoding of
//! the *effects* that replicas and the AOF apply.
//!
//! Layout (all integers little-endian `u64` unless noted; instants and spans in ns):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | encoding version (u8; this build writes [`ENCODING_VERSION`], reads every version from [`VERSION_GCRA_ONLY`] on) |
//! | 1 | tag (u8) |
//! | 2.. | the tag's fields |
//!
//! States (windows from version 2, leases from version 3):
//!
//! * tag 1, GCRA: `tat_ns`, `emission_interval_ns`, `burst`, `updated_ns` (34 bytes; version 1
//!   had no `updated_ns`: 26 bytes).
//! * tag 2, FIXED: `window_ns`, `limit`, `window_start_ns`, `count`, `updated_ns` (42 bytes;
//!   `count` may exceed `limit`: FORCE records usage past it).
//! * tag 3, SLIDING: `window_ns`, `limit`, `window_start_ns`, `prev`, `curr`, `updated_ns`
//!   (50 bytes).
//! * tag 4, LOG: `window_ns`, `limit`, `first_ns`, `last_ns`, `total`, `len`, then `len`
//!   bytes of the log's entries (LEB128: the oldest entry's count, then `delta_ns, count` per
//!   later instant).
//! * tag 5, LEASE: `limit`, `count`, `len`, then `len` bytes of `count` records
//!   `expires_ns, slots, token_len (u8), token`.
//!
//! Effects (only in `RL.APPLY`, never stored), optionally preceded by an event prefix (tag
//! 0x91, one byte: the command that made the write, for the keyspace event replicas emit;
//! version 3) and an expiry prefix (tag 0x90, `expire_at_ms: i64`, the key's absolute
//! expiry), each at most once, in either order:
//!
//! * a state (tags 1–5): replace the key's value with it;
//! * tag 0x81, LOG append: `window_ns`, `limit`, `at_ns`, `quantity`;
//! * tag 0x82, LOG refund: `at_ns`, `quantity`;
//! * tag 0x83, delete the key (version 3);
//! * tag 0x84, lease taken or renewed: `limit`, `at_ns`, `expires_ns`, `slots`, `token_len
//!   (u8)`, `token` (version 3);
//! * tag 0x85, lease released: `at_ns`, `token_len (u8)`, `token` (version 3).
//!
//! The compact form of an effect (tag 0x92, version 3, alone: no prefixes) is what the
//! limiting commands send, at most 44 bytes in the usual case so that the server keeps it in
//! one allocation: the event byte, then a GCRA or FIXED state's tag and fields as above, a
//! SLIDING state's tag with `window_ns`, `window_start_ns`, `updated_ns` and then `limit`,
//! `prev`, `curr` as LEB128 varints, or a LOG append (tag 0x81 and its fields). The key's
//! expiry is not sent: it is the state's idle instant, or the appended request's instant plus
//! the window ([`Compact`]).
//!
//! Decoding validates every field against what a command could have produced and rejects
//! short input, trailing bytes, unknown tags and versions newer than this build: a file or a
//! `RESTORE` payload can never load a value that a command could not have made.

use std::fmt;

use crate::algo::fixed_window::FixedState;
use crate::algo::gcra::GcraState;
use crate::algo::lease::{Lease, LeaseState, LeaseWrite, Token};
use crate::algo::sliding_log::{LogState, LogWrite};
use crate::algo::sliding_window::SlidingState;
use crate::params::{GcraParams, WindowParams};
use crate::request_log::RequestLog;
use crate::state::{Effect, Event, State, StateRef, Write};
use crate::time::{Instant, Span};

/// Version 1: GCRA only, without the instant of the last write.
pub const VERSION_GCRA_ONLY: u8 = 1;
/// Version 2: GCRA with its last write; FIXED, SLIDING and LOG; LOG append/refund effects.
pub const VERSION_WINDOWS: u8 = 2;
/// Version 3: effects name the command that made them (so replicas and AOF loading emit the
/// master's keyspace events) and can delete a key; LEASE states.
pub const VERSION_LEASES: u8 = 3;
/// The newest encoding version this build writes. Every older version stays decodable.
pub const ENCODING_VERSION: u8 = VERSION_LEASES;

const TAG_GCRA: u8 = 1;
const TAG_FIXED: u8 = 2;
const TAG_SLIDING: u8 = 3;
const TAG_LOG: u8 = 4;
const TAG_LEASE: u8 = 5;
const TAG_LOG_APPEND: u8 = 0x81;
const TAG_LOG_REFUND: u8 = 0x82;
const TAG_DELETE: u8 = 0x83;
const TAG_LEASE_ACQUIRE: u8 = 0x84;
const TAG_LEASE_RELEASE: u8 = 0x85;
const TAG_EXPIRY: u8 = 0x90;
const TAG_EVENT: u8 = 0x91;
const TAG_IDLE_EXPIRY: u8 = 0x92;

/// DecodeError says why bytes are not a valid state or effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the layout needs.
    Truncated,
    /// More bytes than the layout needs.
    TrailingBytes,
    /// Written by a newer version of the module (or not ours).
    UnknownVersion(u8),
    /// A tag this version does not know (or not valid in this place).
    UnknownAlgorithm(u8),
    /// A field outside the range a command could produce; names the field.
    OutOfRange(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("truncated state"),
            Self::TrailingBytes => f.write_str("trailing bytes after state"),
            Self::UnknownVersion(v) => write!(
                f,
                "encoding version {v} is newer than this module supports ({ENCODING_VERSION})"
            ),
            Self::UnknownAlgorithm(t) => write!(f, "unknown algorithm tag {t}"),
            Self::OutOfRange(field) => write!(f, "field {field} out of range"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Sink is where an encoding is written: a `Vec<u8>`, or a buffer on the stack for the small
/// effects replicated on every write (no allocation, no thread-local lookup).
pub trait Sink {
    /// Appends `bytes`.
    fn put_bytes(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    #[inline]
    fn put_bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// StackBytes holds an encoding on the stack up to `N` bytes and moves it to the heap only
/// when it grows past them (a large LOG or LEASE write).
pub struct StackBytes<const N: usize> {
    inline: [u8; N],
    len: usize,
    heap: Vec<u8>,
}

impl<const N: usize> StackBytes<N> {
    /// An empty buffer.
    pub fn new() -> Self {
        Self {
            inline: [0; N],
            len: 0,
            heap: Vec::new(),
        }
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        if self.heap.is_empty() {
            self.inline.get(..self.len).unwrap_or_default()
        } else {
            &self.heap
        }
    }
}

impl<const N: usize> Default for StackBytes<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Sink for StackBytes<N> {
    #[inline]
    fn put_bytes(&mut self, bytes: &[u8]) {
        if self.heap.is_empty() {
            let end = self.len.saturating_add(bytes.len());
            if let Some(slot) = self.inline.get_mut(self.len..end) {
                slot.copy_from_slice(bytes);
                self.len = end;
                return;
            }
            let kept = self.inline.get(..self.len).unwrap_or_default();
            self.heap.reserve(end);
            self.heap.extend_from_slice(kept);
        }
        self.heap.extend_from_slice(bytes);
    }
}

fn put<W: Sink + ?Sized>(out: &mut W, fields: &[u64]) {
    for f in fields {
        out.put_bytes(&f.to_le_bytes());
    }
}

fn encode_gcra_into<W: Sink + ?Sized>(g: &GcraState, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION]);
    encode_gcra_body(g, out);
}

fn encode_gcra_body<W: Sink + ?Sized>(g: &GcraState, out: &mut W) {
    out.put_bytes(&[TAG_GCRA]);
    put(
        out,
        &[
            g.tat.as_ns(),
            g.emission_interval.as_ns(),
            g.burst,
            g.updated_at.as_ns(),
        ],
    );
}

fn encode_fixed_into<W: Sink + ?Sized>(s: &FixedState, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION]);
    encode_fixed_body(s, out);
}

fn encode_fixed_body<W: Sink + ?Sized>(s: &FixedState, out: &mut W) {
    out.put_bytes(&[TAG_FIXED]);
    put(
        out,
        &[
            s.window.as_ns(),
            s.limit,
            s.window_start.as_ns(),
            s.count,
            s.updated_at.as_ns(),
        ],
    );
}

fn encode_sliding_into<W: Sink + ?Sized>(s: &SlidingState, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_SLIDING]);
    put(
        out,
        &[
            s.window.as_ns(),
            s.limit,
            s.window_start.as_ns(),
            s.prev,
            s.curr,
            s.updated_at.as_ns(),
        ],
    );
}

fn encode_log_into<W: Sink + ?Sized>(s: &LogState, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_LOG]);
    let bytes = s.log.bytes();
    put(
        out,
        &[
            s.window.as_ns(),
            s.limit,
            s.log.first().unwrap_or_default().as_ns(),
            s.log.last().unwrap_or_default().as_ns(),
            s.log.total(),
            bytes.len() as u64,
        ],
    );
    out.put_bytes(bytes);
}

fn encode_lease_into<W: Sink + ?Sized>(s: &LeaseState, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_LEASE]);
    let bytes = s.bytes();
    put(out, &[s.limit, s.len() as u64, bytes.len() as u64]);
    out.put_bytes(bytes);
}

fn put_token<W: Sink + ?Sized>(out: &mut W, token: &Token) {
    let bytes = token.as_bytes();
    out.put_bytes(&[bytes.len() as u8]);
    out.put_bytes(bytes);
}

fn encode_lease_write_into<W: Sink + ?Sized>(w: &LeaseWrite, out: &mut W) {
    match w {
        LeaseWrite::Acquire { limit, at, lease } => {
            out.put_bytes(&[ENCODING_VERSION, TAG_LEASE_ACQUIRE]);
            put(
                out,
                &[*limit, at.as_ns(), lease.expires_at.as_ns(), lease.slots],
            );
            put_token(out, &lease.token);
        }
        LeaseWrite::Release { at, token } => {
            out.put_bytes(&[ENCODING_VERSION, TAG_LEASE_RELEASE]);
            put(out, &[at.as_ns()]);
            put_token(out, token);
        }
    }
}

fn encode_log_append_into<W: Sink + ?Sized>(w: &LogWrite, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_LOG_APPEND]);
    put(out, &[w.window.as_ns(), w.limit, w.at.as_ns(), w.quantity]);
}

fn encode_log_refund_into<W: Sink + ?Sized>(at: Instant, quantity: u64, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_LOG_REFUND]);
    put(out, &[at.as_ns(), quantity]);
}

/// Appends the encoding of a stored value (newest version) to `out`.
pub fn encode_state_into<W: Sink + ?Sized>(state: StateRef<'_>, out: &mut W) {
    match state {
        StateRef::Gcra(g) => encode_gcra_into(&g, out),
        StateRef::Fixed(s) => encode_fixed_into(s, out),
        StateRef::Sliding(s) => encode_sliding_into(s, out),
        StateRef::Log(s) => encode_log_into(s, out),
        StateRef::Lease(s) => encode_lease_into(s, out),
    }
}

/// Returns the encoding of `state` (newest version).
pub fn encode(state: &State) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_state_into(state.as_ref(), &mut out);
    out
}

/// Appends the effect of an admitted request's write to `out`: the new state for GCRA, FIXED
/// and SLIDING (the same bytes as the state's own encoding), the append itself for LOG (a
/// few dozen bytes, whatever the log holds).
pub fn encode_write_into<W: Sink + ?Sized>(write: &Write, out: &mut W) {
    match write {
        Write::Gcra(g) => encode_gcra_into(g, out),
        Write::Fixed(s) => encode_fixed_into(s, out),
        Write::Sliding(s) => encode_sliding_into(s, out),
        Write::Log(w) => encode_log_append_into(w, out),
        Write::LogRefund { at, quantity } => encode_log_refund_into(*at, *quantity, out),
        Write::Lease(w) => encode_lease_write_into(w, out),
    }
}

/// Appends the expiry prefix (tag 0x90): the effect that follows sets the key to expire at
/// `expire_at_ms`, ms since the epoch.
pub fn encode_expiry_prefix_into<W: Sink + ?Sized>(expire_at_ms: i64, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_EXPIRY]);
    out.put_bytes(&expire_at_ms.to_le_bytes());
}

/// Appends the event prefix (tag 0x91): the effect that follows was made by the command
/// whose keyspace event is `event`.
pub fn encode_event_prefix_into<W: Sink + ?Sized>(event: Event, out: &mut W) {
    out.put_bytes(&[ENCODING_VERSION, TAG_EVENT, event.code()]);
}

/// The longest `RL.APPLY` blob the server keeps in one allocation (an embedded string):
/// a compact effect is meant to fit.
pub const COMPACT_FITS: usize = 44;

/// Compact is the short form of a write's `RL.APPLY` blob (tag 0x92), built on the stack:
/// version, 0x92, the event, then the write's tag and fields. The key's expiry is not sent:
/// the reader derives it from the write (a state's idle instant, a LOG request's instant
/// plus its window). GCRA and FIXED carry their state's fields; SLIDING its instants and
/// window in full and `limit`, `prev`, `curr` as LEB128 varints; a LOG request its four
/// fields. In the usual case every one is at most [`COMPACT_FITS`] bytes long.
pub struct Compact {
    bytes: [u8; 64],
    len: usize,
}

impl Compact {
    #[inline(always)]
    fn new(event: Event, tag: u8) -> Self {
        let mut bytes = [0; 64];
        bytes[..4].copy_from_slice(&[ENCODING_VERSION, TAG_IDLE_EXPIRY, event.code(), tag]);
        Self { bytes, len: 4 }
    }

    // The layouts above take at most 4 + 3 × 8 + 3 × 10 = 58 bytes, so neither put runs
    // out of room; if one ever did, `as_slice` would not match the layout and the reader
    // would refuse it, so nothing wrong could be applied.
    #[inline(always)]
    fn u64(&mut self, value: u64) {
        if let Some(slot) = self.bytes.get_mut(self.len..self.len + 8) {
            slot.copy_from_slice(&value.to_le_bytes());
            self.len += 8;
        }
    }

    fn varint(&mut self, mut value: u64) {
        loop {
            let Some(slot) = self.bytes.get_mut(self.len) else {
                return;
            };
            self.len += 1;
            if value < 0x80 {
                *slot = value as u8;
                return;
            }
            *slot = (value as u8) | 0x80;
            value >>= 7;
        }
    }

    /// The blob.
    #[inline(always)]
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

/// The compact `RL.APPLY` blob of `write` announced as `event`, when the write's expiry
/// `expire_at_ms` is the one a reader derives from it (always, for the writes the limiting
/// commands make); None for other writes (LOG refunds, leases), which use
/// [`encode_announcement_into`].
#[inline(always)]
pub fn compact_announcement(event: Event, write: &Write, expire_at_ms: i64) -> Option<Compact> {
    let derived = match write {
        Write::Gcra(g) => StateRef::Gcra(*g).idle_at(),
        Write::Fixed(f) => StateRef::Fixed(f).idle_at(),
        Write::Sliding(s) => StateRef::Sliding(s).idle_at(),
        Write::Log(w) => Some(log_write_expiry(w)),
        _ => None,
    }?;
    if derived.ceil_unix_ms() != expire_at_ms {
        return None;
    }
    Some(match write {
        Write::Gcra(g) => {
            let mut c = Compact::new(event, TAG_GCRA);
            c.u64(g.tat.as_ns());
            c.u64(g.emission_interval.as_ns());
            c.u64(g.burst);
            c.u64(g.updated_at.as_ns());
            c
        }
        Write::Fixed(f) => {
            let mut c = Compact::new(event, TAG_FIXED);
            c.u64(f.window.as_ns());
            c.u64(f.limit);
            c.u64(f.window_start.as_ns());
            c.u64(f.count);
            c.u64(f.updated_at.as_ns());
            c
        }
        Write::Sliding(s) => {
            let mut c = Compact::new(event, TAG_SLIDING);
            c.u64(s.window.as_ns());
            c.u64(s.window_start.as_ns());
            c.u64(s.updated_at.as_ns());
            c.varint(s.limit);
            c.varint(s.prev);
            c.varint(s.curr);
            c
        }
        Write::Log(w) => {
            let mut c = Compact::new(event, TAG_LOG_APPEND);
            c.u64(w.window.as_ns());
            c.u64(w.limit);
            c.u64(w.at.as_ns());
            c.u64(w.quantity);
            c
        }
        _ => return None,
    })
}

/// The instant a LOG is idle after `w`: its request leaves the window.
fn log_write_expiry(w: &LogWrite) -> Instant {
    w.at.saturating_add(w.window)
}

/// Appends what `RL.APPLY` carries for `write` stored with the expiry `expire_at_ms` and
/// announced as `event`, in the general form: the event and expiry prefixes, then the write.
pub fn encode_announcement_into<W: Sink + ?Sized>(
    event: Event,
    write: &Write,
    expire_at_ms: i64,
    out: &mut W,
) {
    encode_event_prefix_into(event, out);
    encode_expiry_prefix_into(expire_at_ms, out);
    encode_write_into(write, out);
}

/// Appends the encoding of `effect` to `out`.
pub fn encode_effect_into<W: Sink + ?Sized>(effect: &Effect, out: &mut W) {
    match effect {
        Effect::Replace(state) => encode_state_into(state.as_ref(), out),
        Effect::Apply(write) => encode_write_into(write, out),
        Effect::Delete => out.put_bytes(&[ENCODING_VERSION, TAG_DELETE]),
    }
}

/// Reads little-endian u64 fields one after another, failing on short input.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let (head, tail) = self
            .rest
            .split_first_chunk::<8>()
            .ok_or(DecodeError::Truncated)?;
        self.rest = tail;
        Ok(u64::from_le_bytes(*head))
    }

    fn bytes(&mut self, len: u64) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(len).map_err(|_| DecodeError::Truncated)?;
        if len > self.rest.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Ok(head)
    }

    fn token(&mut self) -> Result<Token, DecodeError> {
        let [len, rest @ ..] = self.rest else {
            return Err(DecodeError::Truncated);
        };
        self.rest = rest;
        let bytes = self.bytes(u64::from(*len))?;
        Token::new(bytes).ok_or(DecodeError::OutOfRange("token"))
    }

    /// A LEB128 varint in its shortest form, at most `u64::MAX`.
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let [byte, rest @ ..] = self.rest else {
                return Err(DecodeError::Truncated);
            };
            self.rest = rest;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(DecodeError::OutOfRange("varint"));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                if *byte == 0 && shift > 0 {
                    return Err(DecodeError::OutOfRange("varint"));
                }
                return Ok(value);
            }
        }
        Err(DecodeError::OutOfRange("varint"))
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}

fn window_params(window_ns: u64, limit: u64) -> Result<WindowParams, DecodeError> {
    WindowParams::new(limit, Span::from_ns(window_ns)).map_err(|e| match e {
        crate::params::ParamError::NotPositiveInteger(_) => DecodeError::OutOfRange("limit"),
        _ => DecodeError::OutOfRange("window_ns"),
    })
}

fn check_window_start(start: u64, updated: u64, window_ns: u64) -> Result<(), DecodeError> {
    if start % window_ns != 0 {
        return Err(DecodeError::OutOfRange("window_start_ns"));
    }
    if updated < start || updated - start >= window_ns {
        return Err(DecodeError::OutOfRange("updated_ns"));
    }
    Ok(())
}

/// Checks a GCRA state against what a command can write: burst ≥ 1, an emission interval of
/// 1 ns to ten years whose tolerance fits in 64 bits, the last write not after the TAT.
pub fn validate_gcra(g: &GcraState) -> Result<(), DecodeError> {
    if g.burst == 0 {
        return Err(DecodeError::OutOfRange("burst"));
    }
    GcraParams::from_interval(g.burst, g.emission_interval)
        .map_err(|_| DecodeError::OutOfRange("emission_interval_ns"))?;
    if g.updated_at > g.tat {
        return Err(DecodeError::OutOfRange("updated_ns"));
    }
    Ok(())
}

/// Checks a FIXED state against what a command can write: valid parameters, a window start
/// aligned to its length, the last write inside that window, a count of at least 1 (FORCE
/// records usage past the limit, so any count above 0 can be stored).
pub fn validate_fixed(s: &FixedState) -> Result<(), DecodeError> {
    window_params(s.window.as_ns(), s.limit)?;
    check_window_start(
        s.window_start.as_ns(),
        s.updated_at.as_ns(),
        s.window.as_ns(),
    )?;
    if s.count == 0 {
        return Err(DecodeError::OutOfRange("count"));
    }
    Ok(())
}

/// Checks a SLIDING state against what a command can write: as FIXED, with two counts not
/// both 0.
pub fn validate_sliding(s: &SlidingState) -> Result<(), DecodeError> {
    window_params(s.window.as_ns(), s.limit)?;
    check_window_start(
        s.window_start.as_ns(),
        s.updated_at.as_ns(),
        s.window.as_ns(),
    )?;
    if s.prev == 0 && s.curr == 0 {
        return Err(DecodeError::OutOfRange("prev"));
    }
    Ok(())
}

/// Checks that a write's state is one the decoder accepts (so RDB files, replicas and the AOF
/// can load it), without encoding it. LOG and LEASE writes change a stored collection whose
/// invariants the algorithms keep (property-tested); they are accepted here.
#[inline(always)]
pub fn check_write(write: &Write) -> Result<(), DecodeError> {
    match write {
        Write::Gcra(g) => validate_gcra(g),
        Write::Fixed(s) => validate_fixed(s),
        Write::Sliding(s) => validate_sliding(s),
        Write::Log(_) | Write::LogRefund { .. } | Write::Lease(_) => Ok(()),
    }
}

fn decode_state(version: u8, tag: u8, r: &mut Reader<'_>) -> Result<State, DecodeError> {
    match (version, tag) {
        (_, TAG_GCRA) => {
            let tat_ns = r.u64()?;
            let emission_interval_ns = r.u64()?;
            let burst = r.u64()?;
            if burst == 0 {
                return Err(DecodeError::OutOfRange("burst"));
            }
            let params = GcraParams::from_interval(burst, Span::from_ns(emission_interval_ns))
                .map_err(|_| DecodeError::OutOfRange("emission_interval_ns"))?;
            let updated_ns = if version == VERSION_GCRA_ONLY {
                // Version 1 did not record the last write: assume it filled the bucket, the
                // most capacity in use it can have had.
                tat_ns.saturating_sub(params.tolerance.as_ns())
            } else {
                r.u64()?
            };
            let state = GcraState {
                tat: Instant::from_ns(tat_ns),
                emission_interval: params.emission_interval,
                burst,
                updated_at: Instant::from_ns(updated_ns),
            };
            validate_gcra(&state)?;
            Ok(State::Gcra(state))
        }
        (VERSION_WINDOWS.., TAG_FIXED) => {
            let (window_ns, limit, window_start_ns, count, updated_ns) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let state = FixedState {
                window: Span::from_ns(window_ns),
                limit,
                window_start: Instant::from_ns(window_start_ns),
                count,
                updated_at: Instant::from_ns(updated_ns),
            };
            validate_fixed(&state)?;
            Ok(State::Fixed(Box::new(state)))
        }
        (VERSION_WINDOWS.., TAG_SLIDING) => {
            let (window_ns, limit, window_start_ns, prev, curr, updated_ns) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let state = SlidingState {
                window: Span::from_ns(window_ns),
                limit,
                window_start: Instant::from_ns(window_start_ns),
                prev,
                curr,
                updated_at: Instant::from_ns(updated_ns),
            };
            validate_sliding(&state)?;
            Ok(State::Sliding(Box::new(state)))
        }
        (VERSION_WINDOWS.., TAG_LOG) => {
            let (window_ns, limit, first_ns, last_ns, total, len) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            window_params(window_ns, limit)?;
            // An empty log is idle (the key would be deleted), but harmless: accept it, so a
            // file can never be refused for it.
            if total > limit {
                return Err(DecodeError::OutOfRange("total"));
            }
            if total == 0 && (first_ns != 0 || last_ns != 0) {
                return Err(DecodeError::OutOfRange("first_ns"));
            }
            let bytes = r.bytes(len)?;
            let log = RequestLog::from_parts(
                Instant::from_ns(first_ns),
                Instant::from_ns(last_ns),
                total,
                bytes,
            )
            .ok_or(DecodeError::OutOfRange("log"))?;
            Ok(State::Log(Box::new(LogState {
                window: Span::from_ns(window_ns),
                limit,
                log,
            })))
        }
        (VERSION_LEASES.., TAG_LEASE) => {
            let (limit, count, len) = (r.u64()?, r.u64()?, r.u64()?);
            let bytes = r.bytes(len)?;
            let state = LeaseState::from_parts(limit, count, bytes)
                .ok_or(DecodeError::OutOfRange("leases"))?;
            Ok(State::Lease(Box::new(state)))
        }
        (_, other) => Err(DecodeError::UnknownAlgorithm(other)),
    }
}

fn header(bytes: &[u8]) -> Result<(u8, u8, Reader<'_>), DecodeError> {
    let [version, tag, rest @ ..] = bytes else {
        return Err(DecodeError::Truncated);
    };
    if *version == 0 || *version > ENCODING_VERSION {
        return Err(DecodeError::UnknownVersion(*version));
    }
    Ok((*version, *tag, Reader { rest }))
}

/// Decodes and validates a state written by any version up to [`ENCODING_VERSION`].
///
/// Errors: see [`DecodeError`]. Never panics, whatever the input.
pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
    let (version, tag, mut reader) = header(bytes)?;
    let state = decode_state(version, tag, &mut reader)?;
    reader.finish()?;
    Ok(state)
}

/// Applied is a decoded `RL.APPLY` blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// What to do to the key.
    pub effect: Effect,
    /// The key's absolute expiry, ms since the epoch, if the blob sets one.
    pub expire_at_ms: Option<i64>,
    /// The command that made the effect, if the blob names it (version 3 on).
    pub event: Option<Event>,
}

/// Reads a compact write (tag 0x92, after the event byte): its effect and the instant the
/// key expires.
fn decode_compact(
    version: u8,
    tag: u8,
    r: &mut Reader<'_>,
) -> Result<(Effect, Instant), DecodeError> {
    let state = match tag {
        TAG_GCRA | TAG_FIXED => decode_state(version, tag, r)?,
        TAG_SLIDING => {
            let (window_ns, window_start_ns, updated_ns) = (r.u64()?, r.u64()?, r.u64()?);
            let (limit, prev, curr) = (r.varint()?, r.varint()?, r.varint()?);
            let state = SlidingState {
                window: Span::from_ns(window_ns),
                limit,
                window_start: Instant::from_ns(window_start_ns),
                prev,
                curr,
                updated_at: Instant::from_ns(updated_ns),
            };
            validate_sliding(&state)?;
            State::Sliding(Box::new(state))
        }
        TAG_LOG_APPEND => {
            let write = decode_log_append(r)?;
            return Ok((Effect::Apply(Write::Log(write)), log_write_expiry(&write)));
        }
        _ => return Err(DecodeError::UnknownAlgorithm(tag)),
    };
    let idle_at = state.as_ref().idle_at().unwrap_or(Instant::EPOCH);
    Ok((Effect::Replace(state), idle_at))
}

fn decode_log_append(r: &mut Reader<'_>) -> Result<LogWrite, DecodeError> {
    let (window_ns, limit, at_ns, quantity) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    window_params(window_ns, limit)?;
    if quantity == 0 || quantity > limit {
        return Err(DecodeError::OutOfRange("quantity"));
    }
    Ok(LogWrite {
        window: Span::from_ns(window_ns),
        limit,
        at: Instant::from_ns(at_ns),
        quantity,
    })
}
/// Decodes an `RL.APPLY` blob: optional prefixes (an expiry, an event; each at most once, in
/// any order), then an effect.
///
/// Errors: see [`DecodeError`]. Never panics, whatever the input.
pub fn decode_applied(bytes: &[u8]) -> Result<Applied, DecodeError> {
    let mut rest = bytes;
    let (mut expire_at_ms, mut event) = (None, None);
    loop {
        let (version, tag, mut r) = header(rest)?;
        match tag {
            TAG_EXPIRY if expire_at_ms.is_none() => {
                let ms = r.u64()? as i64;
                if ms < 0 {
                    return Err(DecodeError::OutOfRange("expire_at_ms"));
                }
                expire_at_ms = Some(ms);
            }
            TAG_EVENT if version >= VERSION_LEASES && event.is_none() => {
                let [code, tail @ ..] = r.rest else {
                    return Err(DecodeError::Truncated);
                };
                event = Some(Event::from_code(*code).ok_or(DecodeError::OutOfRange("event"))?);
                r.rest = tail;
            }
            TAG_IDLE_EXPIRY if version >= VERSION_LEASES && event.is_none() => {
                // The compact form (see `Compact`): the event, then the write; the expiry
                // is derived from the write.
                if expire_at_ms.is_some() {
                    return Err(DecodeError::UnknownAlgorithm(tag));
                }
                let [code, tag, tail @ ..] = r.rest else {
                    return Err(DecodeError::Truncated);
                };
                let event = Event::from_code(*code).ok_or(DecodeError::OutOfRange("event"))?;
                let mut body = Reader { rest: tail };
                let (effect, expiry) = decode_compact(version, *tag, &mut body)?;
                body.finish()?;
                return Ok(Applied {
                    effect,
                    expire_at_ms: Some(expiry.ceil_unix_ms()),
                    event: Some(event),
                });
            }
            TAG_EXPIRY | TAG_EVENT | TAG_IDLE_EXPIRY => {
                return Err(DecodeError::UnknownAlgorithm(tag))
            }
            _ => {
                return Ok(Applied {
                    effect: decode_effect(rest)?,
                    expire_at_ms,
                    event,
                })
            }
        }
        rest = r.rest;
    }
}

/// Decodes and validates an effect (a state, or a LOG append/refund).
///
/// Errors: see [`DecodeError`]. Never panics, whatever the input.
pub fn decode_effect(bytes: &[u8]) -> Result<Effect, DecodeError> {
    let (version, tag, mut r) = header(bytes)?;
    let effect = match (version, tag) {
        (VERSION_WINDOWS.., TAG_LOG_APPEND) => {
            Effect::Apply(Write::Log(decode_log_append(&mut r)?))
        }
        (VERSION_LEASES.., TAG_DELETE) => Effect::Delete,
        (VERSION_LEASES.., TAG_LEASE_ACQUIRE) => {
            let (limit, at, expires_at, slots) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let token = r.token()?;
            if limit == 0 {
                return Err(DecodeError::OutOfRange("limit"));
            }
            if slots == 0 || slots > limit {
                return Err(DecodeError::OutOfRange("slots"));
            }
            Effect::Apply(Write::Lease(Box::new(LeaseWrite::Acquire {
                limit,
                at: Instant::from_ns(at),
                lease: Lease {
                    token,
                    slots,
                    expires_at: Instant::from_ns(expires_at),
                },
            })))
        }
        (VERSION_LEASES.., TAG_LEASE_RELEASE) => {
            let at = Instant::from_ns(r.u64()?);
            let token = r.token()?;
            Effect::Apply(Write::Lease(Box::new(LeaseWrite::Release { at, token })))
        }
        (VERSION_WINDOWS.., TAG_LOG_REFUND) => {
            let (at_ns, quantity) = (r.u64()?, r.u64()?);
            Effect::Apply(Write::LogRefund {
                at: Instant::from_ns(at_ns),
                quantity,
            })
        }
        _ => Effect::Replace(decode_state(version, tag, &mut r)?),
    };
    r.finish()?;
    Ok(effect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gcra(tat_ns: u64, emission_interval_ns: u64, burst: u64) -> State {
        State::Gcra(GcraState {
            tat: Instant::from_ns(tat_ns),
            emission_interval: Span::from_ns(emission_interval_ns),
            burst,
            updated_at: Instant::from_ns(tat_ns / 2),
        })
    }

    #[test]
    fn stack_bytes_spill_to_the_heap_keeping_their_order() {
        let mut small = StackBytes::<4>::new();
        small.put_bytes(b"ab");
        small.put_bytes(b"");
        small.put_bytes(b"cd");
        assert_eq!(small.as_slice(), b"abcd");
        small.put_bytes(b"e");
        small.put_bytes(b"fgh");
        assert_eq!(small.as_slice(), b"abcdefgh");
        let mut big = StackBytes::<2>::new();
        big.put_bytes(b"abc");
        assert_eq!(big.as_slice(), b"abc");
        assert_eq!(StackBytes::<8>::new().as_slice(), b"");
    }

    #[test]
    fn gcra_layout_is_fixed() {
        let bytes = encode(&gcra(0x0102_0304_0506_0708, 1_000_000_000, 10));
        assert_eq!(bytes.len(), 34);
        assert_eq!(&bytes[..2], &[ENCODING_VERSION, 1]);
        assert_eq!(&bytes[2..10], &[8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn version_1_gcra_still_decodes() {
        let mut v1 = encode(&gcra(50, 7, 3));
        v1[0] = 1;
        v1.truncate(26);
        let expected = State::Gcra(GcraState {
            tat: Instant::from_ns(50),
            emission_interval: Span::from_ns(7),
            burst: 3,
            updated_at: Instant::from_ns(29),
        });
        assert_eq!(decode(&v1), Ok(expected));
        // Version 1 knew no windows.
        let mut fixed = encode(&State::Fixed(Box::new(FixedState {
            window: Span::from_ns(10),
            limit: 5,
            window_start: Instant::from_ns(100),
            count: 1,
            updated_at: Instant::from_ns(105),
        })));
        assert!(decode(&fixed).is_ok());
        fixed[0] = 1;
        assert_eq!(
            decode(&fixed),
            Err(DecodeError::UnknownAlgorithm(TAG_FIXED))
        );
    }

    #[test]
    fn corrupt_input_is_refused() {
        let good = encode(&gcra(5, 7, 3));
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&good[..33]), Err(DecodeError::Truncated));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(DecodeError::TrailingBytes));
        let mut future = good.clone();
        future[0] = ENCODING_VERSION + 1;
        assert_eq!(
            decode(&future),
            Err(DecodeError::UnknownVersion(ENCODING_VERSION + 1))
        );
        let mut tag = good.clone();
        tag[1] = 200;
        assert_eq!(decode(&tag), Err(DecodeError::UnknownAlgorithm(200)));
        assert_eq!(
            decode(&encode(&gcra(5, 0, 3))),
            Err(DecodeError::OutOfRange("emission_interval_ns"))
        );
        assert_eq!(
            decode(&encode(&gcra(5, 7, 0))),
            Err(DecodeError::OutOfRange("burst"))
        );
        let fixed = |count, start, updated| {
            encode(&State::Fixed(Box::new(FixedState {
                window: Span::from_ns(10),
                limit: 5,
                window_start: Instant::from_ns(start),
                count,
                updated_at: Instant::from_ns(updated),
            })))
        };
        // A count above the limit is what FORCE records: it loads.
        assert!(decode(&fixed(6, 100, 105)).is_ok());
        assert_eq!(
            decode(&fixed(0, 100, 105)),
            Err(DecodeError::OutOfRange("count"))
        );
        assert_eq!(
            decode(&fixed(1, 101, 105)),
            Err(DecodeError::OutOfRange("window_start_ns"))
        );
        assert_eq!(
            decode(&fixed(1, 100, 110)),
            Err(DecodeError::OutOfRange("updated_ns"))
        );
        // A log longer than its limit.
        let mut log = LogState {
            window: Span::from_ns(1000),
            limit: 2,
            log: RequestLog::default(),
        };
        log.log.push(Instant::from_ns(10), 2);
        let ok = encode(&State::Log(Box::new(log.clone())));
        assert!(decode(&ok).is_ok());
        log.limit = 1;
        assert_eq!(
            decode(&encode(&State::Log(Box::new(log)))),
            Err(DecodeError::OutOfRange("total"))
        );
        // Effects are not states.
        let mut effect = Vec::new();
        encode_effect_into(
            &Effect::Apply(Write::LogRefund {
                at: Instant::from_ns(1),
                quantity: 1,
            }),
            &mut effect,
        );
        assert_eq!(
            decode(&effect),
            Err(DecodeError::UnknownAlgorithm(TAG_LOG_REFUND))
        );
        assert_eq!(
            decode_effect(&effect),
            Ok(Effect::Apply(Write::LogRefund {
                at: Instant::from_ns(1),
                quantity: 1
            }))
        );
        let refund = Effect::Apply(Write::LogRefund {
            at: Instant::from_ns(1),
            quantity: 1,
        });
        let mut applied = Vec::new();
        encode_expiry_prefix_into(1234, &mut applied);
        applied.extend_from_slice(&effect);
        assert_eq!(
            decode_applied(&applied),
            Ok(Applied {
                effect: refund.clone(),
                expire_at_ms: Some(1234),
                event: None
            })
        );
        assert_eq!(
            decode_applied(&effect),
            Ok(Applied {
                effect: refund.clone(),
                expire_at_ms: None,
                event: None
            })
        );
        // Version 3: the event, in either order with the expiry; each prefix once.
        let mut named = Vec::new();
        encode_event_prefix_into(Event::Refund, &mut named);
        named.extend_from_slice(&applied);
        assert_eq!(
            decode_applied(&named),
            Ok(Applied {
                effect: refund,
                expire_at_ms: Some(1234),
                event: Some(Event::Refund)
            })
        );
        let mut twice = Vec::new();
        encode_event_prefix_into(Event::Refund, &mut twice);
        twice.extend_from_slice(&named);
        assert!(decode_applied(&twice).is_err());
        let mut deleted = Vec::new();
        encode_event_prefix_into(Event::Refund, &mut deleted);
        encode_effect_into(&Effect::Delete, &mut deleted);
        assert_eq!(
            decode_applied(&deleted).map(|a| a.effect),
            Ok(Effect::Delete)
        );
        assert_eq!(
            decode(&deleted[3..]),
            Err(DecodeError::UnknownAlgorithm(TAG_DELETE))
        );
        deleted[2] = 200;
        assert_eq!(
            decode_applied(&deleted),
            Err(DecodeError::OutOfRange("event"))
        );
        assert_eq!(decode_applied(&applied[..12]), Err(DecodeError::Truncated));
    }

    #[test]
    fn compact_writes_fit_one_allocation_and_carry_their_expiry() {
        let g = GcraState {
            tat: Instant::from_ns(1_800_000_000_123_456_789),
            emission_interval: Span::from_ns(1_000_000),
            burst: 5,
            updated_at: Instant::from_ns(1_800_000_000_000_000_000),
        };
        let f = FixedState {
            window: Span::from_ns(60_000_000_000),
            limit: 10,
            window_start: Instant::from_ns(1_799_999_940_000_000_000),
            count: 12,
            updated_at: Instant::from_ns(1_799_999_999_000_000_000),
        };
        let s = SlidingState {
            window: Span::from_ns(3_600_000_000_000),
            limit: 1_000_000,
            window_start: Instant::from_ns(1_800_000_000_000_000_000),
            prev: 999_999,
            curr: 130,
            updated_at: Instant::from_ns(1_800_000_001_000_000_000),
        };
        let l = LogWrite {
            window: Span::from_ns(2_500_000),
            limit: 3,
            at: Instant::from_ns(1_800_000_000_000_000_001),
            quantity: 2,
        };
        for (write, effect, expire_at_ms) in [
            (
                Write::Gcra(g),
                Effect::Replace(State::Gcra(g)),
                1_800_000_000_124,
            ),
            (
                Write::Fixed(f),
                Effect::Replace(State::Fixed(Box::new(f))),
                1_800_000_000_000,
            ),
            (
                Write::Sliding(s),
                Effect::Replace(State::Sliding(Box::new(s))),
                1_800_007_200_000,
            ),
            (
                Write::Log(l),
                Effect::Apply(Write::Log(l)),
                1_800_000_000_003,
            ),
        ] {
            // Another expiry than the derived one: no compact form.
            assert!(compact_announcement(Event::Window, &write, expire_at_ms + 1).is_none());
            let compact = compact_announcement(Event::Window, &write, expire_at_ms).unwrap();
            let mut out = compact.as_slice().to_vec();
            assert!(out.len() <= COMPACT_FITS, "{} bytes", out.len());
            let applied = Applied {
                effect,
                expire_at_ms: Some(expire_at_ms),
                event: Some(Event::Window),
            };
            assert_eq!(decode_applied(&out), Ok(applied.clone()));
            // The general form says the same.
            let mut general = Vec::new();
            encode_announcement_into(Event::Window, &write, expire_at_ms, &mut general);
            let general = decode_applied(&general).unwrap();
            assert_eq!(general.expire_at_ms, applied.expire_at_ms);
            assert_eq!(general.event, applied.event);
            // Truncated or with a byte too many: refused.
            assert!(decode_applied(&out[..out.len() - 1]).is_err());
            out.push(0);
            assert!(decode_applied(&out).is_err());
        }
        let log = Write::LogRefund {
            at: Instant::from_ns(1),
            quantity: 1,
        };
        assert!(compact_announcement(Event::Refund, &log, 0).is_none());
    }

    #[test]
    fn compact_varints_are_shortest_and_bounded() {
        let read = |bytes: &[u8]| Reader { rest: bytes }.varint();
        assert_eq!(read(&[0]), Ok(0));
        assert_eq!(read(&[0x7f]), Ok(127));
        assert_eq!(read(&[0x80, 0x01]), Ok(128));
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(read(&max), Ok(u64::MAX));
        let mut too_big = max;
        too_big[9] = 0x02;
        assert!(read(&too_big).is_err());
        assert!(read(&[0x80, 0x00]).is_err(), "overlong");
        assert_eq!(read(&[0x80]), Err(DecodeError::Truncated));
        let mut c = Compact::new(Event::Window, TAG_SLIDING);
        for value in [0, 1, 127, 128, 300, u64::MAX] {
            c.len = 4;
            c.varint(value);
            assert_eq!(read(&c.as_slice()[4..]), Ok(value));
        }
    }

    #[test]
    fn regression_empty_log_has_one_encoding() {
        // Found by cargo-fuzz: an empty log with stray instants decoded, then re-encoded to
        // other bytes. The only encoding of an empty log has zero instants.
        let mut bytes = vec![2u8, 4];
        for f in [60_000_000_000u64, 5, 0x0005_8300_0000_0df8, 0, 0, 0] {
            bytes.extend_from_slice(&f.to_le_bytes());
        }
        assert_eq!(decode(&bytes), Err(DecodeError::OutOfRange("first_ns")));
        let empty = State::Log(Box::new(LogState {
            window: Span::from_ns(60_000_000_000),
            limit: 5,
            log: RequestLog::default(),
        }));
        assert_eq!(decode(&encode(&empty)), Ok(empty.clone()));
    }

    /// Every state that a write can produce, under any parameters and with the clock
    /// stepping back and forth, must decode: a state the decoder refuses would make RDB files,
    /// replicas and AOF replay fail.
    fn every_written_state_decodes(ops: &[(u8, u64, u64, u64)]) -> Result<(), TestCaseError> {
        use crate::algo::gcra::{self, GcraRequest};
        use crate::algo::{fixed_window, sliding_log, sliding_window};
        use crate::params::{GcraParams, WindowParams};
        let s1 = 1_000_000_000u64;
        let mut now = Instant::from_ns(1_800_000_000 * s1);
        let (mut g, mut f, mut sl, mut lg): (
            Option<GcraState>,
            Option<FixedState>,
            Option<SlidingState>,
            Option<LogState>,
        ) = (None, None, None, None);
        let mut ls: Option<LeaseState> = None;
        let check = |state: State| -> Result<(), TestCaseError> {
            prop_assert_eq!(
                decode(&encode(&state)),
                Ok(state.clone()),
                "undecodable: {:?}",
                state
            );
            Ok(())
        };
        for &(op, a, b, q) in ops {
            // Time mostly moves forward, sometimes steps back up to 3 s.
            now = if a % 7 == 0 {
                now.saturating_sub(Span::from_ns(b % (3 * s1)))
            } else {
                now.saturating_add(Span::from_ns(b % (2 * s1)))
            };
            let limit = 1 + a % 5;
            let window = Span::from_ns((1 + b % 3) * s1 / 2);
            let wp = WindowParams::new(limit, window).unwrap();
            let gp = GcraParams::new(limit, 1 + a % 3, window).unwrap();
            match op % 13 {
                0 => {
                    if let Ok(o) = gcra::decide(
                        &gp,
                        g.as_ref(),
                        now,
                        GcraRequest {
                            quantity: q % 4,
                            max_wait: (a % 2 == 0).then_some(Span::from_ns(s1)),
                        },
                    ) {
                        if let Some(w) = o.write {
                            check(State::Gcra(w))?;
                            g = Some(w);
                        }
                    }
                }
                1 => {
                    if let Some(st) = g {
                        let (n, _) = gcra::refund(&st, now, q);
                        if let Some(w) = n {
                            check(State::Gcra(w))?;
                        }
                        g = n;
                    }
                }
                2 => {
                    if let Some(w) = fixed_window::decide(&wp, f.as_ref(), now, q % 4)
                        .unwrap()
                        .write
                    {
                        check(State::Fixed(Box::new(w)))?;
                        f = Some(w);
                    }
                }
                3 => {
                    if let Some(st) = f {
                        let (n, _) = fixed_window::refund(&st, now, q);
                        if let Some(w) = n {
                            check(State::Fixed(Box::new(w)))?;
                        }
                        f = n;
                    }
                }
                4 => {
                    if let Some(w) = sliding_window::decide(&wp, sl.as_ref(), now, q % 4)
                        .unwrap()
                        .write
                    {
                        check(State::Sliding(Box::new(w)))?;
                        sl = Some(w);
                    }
                }
                5 => {
                    if let Some(st) = sl {
                        let (n, _) = sliding_window::refund(&st, now, q);
                        if let Some(w) = n {
                            check(State::Sliding(Box::new(w)))?;
                        }
                        sl = n;
                    }
                }
                6 => {
                    if let Some(w) = sliding_log::decide(&wp, lg.as_ref(), now, q % 4)
                        .unwrap()
                        .write
                    {
                        let st = lg.get_or_insert_with(|| LogState::new(&wp));
                        st.apply(&w);
                        check(State::Log(Box::new(st.clone())))?;
                    }
                }
                8 => {
                    if let Ok(o) = gcra::force(&gp, g.as_ref(), now, q) {
                        if let Some(w) = o.write {
                            check(State::Gcra(w))?;
                            g = Some(w);
                        }
                    }
                }
                9 => {
                    if let Ok(Some(w)) =
                        fixed_window::force(&wp, f.as_ref(), now, q).map(|o| o.write)
                    {
                        check(State::Fixed(Box::new(w)))?;
                        f = Some(w);
                    }
                }
                10 => {
                    if let Ok(Some(w)) =
                        sliding_window::force(&wp, sl.as_ref(), now, q).map(|o| o.write)
                    {
                        check(State::Sliding(Box::new(w)))?;
                        sl = Some(w);
                    }
                }
                11 | 12 => {
                    use crate::algo::lease::{self, LeaseParams, Token};
                    let token = Token::new(format!("t{}", a % 4).as_bytes()).unwrap();
                    let write = if op % 13 == 11 {
                        let p = LeaseParams {
                            limit,
                            lease: window,
                        };
                        lease::decide(&p, ls.as_ref(), now, &token, q % 4)
                            .unwrap()
                            .write
                    } else {
                        ls.as_ref().and_then(|st| lease::release(st, now, &token).1)
                    };
                    if let Some(w) = write {
                        let st = ls.get_or_insert_with(LeaseState::default);
                        st.apply(&w);
                        check(State::Lease(Box::new(st.clone())))?;
                    }
                }
                _ => {
                    if let Some(st) = lg.as_mut() {
                        if st.in_window(now) > 0 {
                            st.refund(now, q);
                            if st.log.total() == 0 {
                                lg = None;
                            } else {
                                check(State::Log(Box::new(st.clone())))?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn writes_under_clock_steps_always_decode(ops in prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>(), 0u64..6), 1..80)) {
            every_written_state_decodes(&ops)?;
        }
    }

    #[test]
    fn regression_sliding_refund_of_a_state_from_a_later_window_stays_valid() {
        // Found by attack testing: a refund rebuilt a SLIDING state written in a later window
        // (a clock that stepped back) into the current window, with its last write outside it:
        // the decoder refused the result, which broke replicas, RDB loads and AOF replay.
        let s1 = 1_000_000_000u64;
        let w = crate::params::WindowParams::new(10, Span::from_ns(s1)).unwrap();
        let later = 1_800_000_000 * s1;
        let st =
            crate::algo::sliding_window::decide(&w, None, Instant::from_ns(later + s1 / 10), 3)
                .unwrap()
                .write
                .unwrap();
        let (after, n) =
            crate::algo::sliding_window::refund(&st, Instant::from_ns(later - 2 * s1 / 10), 1);
        assert_eq!(n, 1);
        let after = after.unwrap();
        let state = State::Sliding(Box::new(after));
        assert_eq!(decode(&encode(&state)), Ok(state));
    }

    fn arb_state() -> impl Strategy<Value = State> {
        let w = 1u64..1_000_000_000_000;
        prop_oneof![
            (any::<u64>(), 1u64..1_000_000_000_000, 1u64..1_000_000)
                .prop_map(|(t, i, b)| gcra(t, i, b)),
            (w.clone(), 1u64..1000, 0u64..1 << 20, 0u64..1000).prop_map(|(w, l, k, o)| {
                State::Fixed(Box::new(FixedState {
                    window: Span::from_ns(w),
                    limit: l,
                    window_start: Instant::from_ns(k * w),
                    count: 1 + o % l,
                    updated_at: Instant::from_ns(k * w + o % w),
                }))
            }),
            (
                w.clone(),
                1u64..1000,
                0u64..1 << 20,
                any::<u16>(),
                0u64..1000
            )
                .prop_map(|(w, l, k, p, c)| {
                    State::Sliding(Box::new(SlidingState {
                        window: Span::from_ns(w),
                        limit: l,
                        window_start: Instant::from_ns(k * w),
                        prev: u64::from(p) + 1,
                        curr: c % (l + 1),
                        updated_at: Instant::from_ns(k * w + c % w),
                    }))
                }),
            (w, prop::collection::vec((1u64..1_000_000, 1u64..4), 1..30)).prop_map(
                |(w, pushes)| {
                    let mut log = RequestLog::default();
                    let mut t = 1u64 << 50;
                    for (gap, c) in &pushes {
                        t += gap;
                        log.push(Instant::from_ns(t), *c);
                    }
                    let limit = log.total();
                    State::Log(Box::new(LogState {
                        window: Span::from_ns(w),
                        limit,
                        log,
                    }))
                }
            ),
            prop::collection::vec(
                (
                    any::<u64>(),
                    1u64..5,
                    prop::collection::vec(any::<u8>(), 1..65)
                ),
                0..8
            )
            .prop_map(|leases| {
                let mut st = LeaseState::default();
                let limit = 5 * leases.len() as u64 + 1;
                for (expires, slots, token) in leases {
                    st.apply(&LeaseWrite::Acquire {
                        limit,
                        at: Instant::EPOCH,
                        lease: Lease {
                            token: Token::new(&token).unwrap(),
                            slots,
                            expires_at: Instant::from_ns(expires.max(1)),
                        },
                    });
                }
                st.limit = limit;
                State::Lease(Box::new(st))
            }),
        ]
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_identity(s in arb_state()) {
            prop_assert_eq!(decode(&encode(&s)), Ok(s.clone()));
            let mut e = Vec::new();
            encode_effect_into(&Effect::Replace(s.clone()), &mut e);
            prop_assert_eq!(decode_effect(&e), Ok(Effect::Replace(s)));
        }

        #[test]
        fn decode_of_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode(&bytes);
            let _ = decode_effect(&bytes);
            let _ = decode_applied(&bytes);
        }

        #[test]
        fn decode_of_mutated_valid_bytes_never_panics(s in arb_state(), idx in any::<prop::sample::Index>(),
                                                      val in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let mut b = encode(&s);
            let i = idx.index(b.len());
            b[i] = val;
            let c = cut.index(b.len() + 1);
            b.truncate(c);
            let _ = decode(&b);
            let _ = decode_effect(&b);
            let _ = decode_applied(&b);
        }
    }
}
