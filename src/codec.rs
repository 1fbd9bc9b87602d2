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

fn put(out: &mut Vec<u8>, fields: &[u64]) {
    for f in fields {
        out.extend_from_slice(&f.to_le_bytes());
    }
}

fn encode_gcra_into(g: &GcraState, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_GCRA]);
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

fn encode_fixed_into(s: &FixedState, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_FIXED]);
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

fn encode_sliding_into(s: &SlidingState, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_SLIDING]);
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

fn encode_log_into(s: &LogState, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_LOG]);
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
    out.extend_from_slice(bytes);
}

fn encode_lease_into(s: &LeaseState, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_LEASE]);
    let bytes = s.bytes();
    put(out, &[s.limit, s.len() as u64, bytes.len() as u64]);
    out.extend_from_slice(bytes);
}

fn put_token(out: &mut Vec<u8>, token: &Token) {
    let bytes = token.as_bytes();
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

fn encode_lease_write_into(w: &LeaseWrite, out: &mut Vec<u8>) {
    match w {
        LeaseWrite::Acquire { limit, at, lease } => {
            out.extend_from_slice(&[ENCODING_VERSION, TAG_LEASE_ACQUIRE]);
            put(
                out,
                &[*limit, at.as_ns(), lease.expires_at.as_ns(), lease.slots],
            );
            put_token(out, &lease.token);
        }
        LeaseWrite::Release { at, token } => {
            out.extend_from_slice(&[ENCODING_VERSION, TAG_LEASE_RELEASE]);
            put(out, &[at.as_ns()]);
            put_token(out, token);
        }
    }
}

fn encode_log_append_into(w: &LogWrite, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_LOG_APPEND]);
    put(out, &[w.window.as_ns(), w.limit, w.at.as_ns(), w.quantity]);
}

fn encode_log_refund_into(at: Instant, quantity: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_LOG_REFUND]);
    put(out, &[at.as_ns(), quantity]);
}

/// Appends the encoding of a stored value (newest version) to `out`.
pub fn encode_state_into(state: StateRef<'_>, out: &mut Vec<u8>) {
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
pub fn encode_write_into(write: &Write, out: &mut Vec<u8>) {
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
pub fn encode_expiry_prefix_into(expire_at_ms: i64, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_EXPIRY]);
    out.extend_from_slice(&expire_at_ms.to_le_bytes());
}

/// Appends the event prefix (tag 0x91): the effect that follows was made by the command
/// whose keyspace event is `event`.
pub fn encode_event_prefix_into(event: Event, out: &mut Vec<u8>) {
    out.extend_from_slice(&[ENCODING_VERSION, TAG_EVENT, event.code()]);
}

/// Appends the encoding of `effect` to `out`.
pub fn encode_effect_into(effect: &Effect, out: &mut Vec<u8>) {
    match effect {
        Effect::Replace(state) => encode_state_into(state.as_ref(), out),
        Effect::Apply(write) => encode_write_into(write, out),
        Effect::Delete => out.extend_from_slice(&[ENCODING_VERSION, TAG_DELETE]),
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
            if updated_ns > tat_ns {
                return Err(DecodeError::OutOfRange("updated_ns"));
            }
            Ok(State::Gcra(GcraState {
                tat: Instant::from_ns(tat_ns),
                emission_interval: params.emission_interval,
                burst,
                updated_at: Instant::from_ns(updated_ns),
            }))
        }
        (VERSION_WINDOWS.., TAG_FIXED) => {
            let (window_ns, limit, window_start_ns, count, updated_ns) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            window_params(window_ns, limit)?;
            check_window_start(window_start_ns, updated_ns, window_ns)?;
            // FORCE records usage past the limit: any count but 0 can be stored.
            if count == 0 {
                return Err(DecodeError::OutOfRange("count"));
            }
            Ok(State::Fixed(Box::new(FixedState {
                window: Span::from_ns(window_ns),
                limit,
                window_start: Instant::from_ns(window_start_ns),
                count,
                updated_at: Instant::from_ns(updated_ns),
            })))
        }
        (VERSION_WINDOWS.., TAG_SLIDING) => {
            let (window_ns, limit, window_start_ns, prev, curr, updated_ns) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            window_params(window_ns, limit)?;
            check_window_start(window_start_ns, updated_ns, window_ns)?;
            // FORCE records usage past the limit: counts above it can be stored.
            if prev == 0 && curr == 0 {
                return Err(DecodeError::OutOfRange("prev"));
            }
            Ok(State::Sliding(Box::new(SlidingState {
                window: Span::from_ns(window_ns),
                limit,
                window_start: Instant::from_ns(window_start_ns),
                prev,
                curr,
                updated_at: Instant::from_ns(updated_ns),
            })))
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
            TAG_EXPIRY | TAG_EVENT => return Err(DecodeError::UnknownAlgorithm(tag)),
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
            let (window_ns, limit, at_ns, quantity) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            window_params(window_ns, limit)?;
            if quantity == 0 || quantity > limit {
                return Err(DecodeError::OutOfRange("quantity"));
            }
            Effect::Apply(Write::Log(LogWrite {
                window: Span::from_ns(window_ns),
                limit,
                at: Instant::from_ns(at_ns),
                quantity,
            }))
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
            Effect::Apply(Write::Lease(LeaseWrite::Acquire {
                limit,
                at: Instant::from_ns(at),
                lease: Lease {
                    token,
                    slots,
                    expires_at: Instant::from_ns(expires_at),
                },
            }))
        }
        (VERSION_LEASES.., TAG_LEASE_RELEASE) => {
            let at = Instant::from_ns(r.u64()?);
            let token = r.token()?;
            Effect::Apply(Write::Lease(LeaseWrite::Release { at, token }))
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
