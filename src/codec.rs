//! The one versioned encoding of a limiter key's state, used by RDB save/load, AOF rewrite,
//! replication (`RL.APPLY`), `DUMP`/`RESTORE` and `DEBUG DIGEST-VALUE`.
//!
//! Layout (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | encoding version (currently [`ENCODING_VERSION`]) |
//! | 1 | algorithm tag (`1` = GCRA) |
//! | 2.. | the algorithm's fields |
//!
//! GCRA (tag 1, version 1): `tat_ns: u64`, `emission_interval_ns: u64`, `burst: u64`;
//! 26 bytes in all.
//!
//! Decoding validates every field against the same ranges that command arguments must meet
//! and rejects short input, trailing bytes, unknown tags and versions newer than this build:
//! a file or a `RESTORE` payload can never load a value that a command could not have made.

use std::fmt;

use crate::algo::gcra::GcraState;
use crate::params::GcraParams;

/// The newest encoding version this build writes. Every older version stays decodable.
pub const ENCODING_VERSION: u8 = 1;

const TAG_GCRA: u8 = 1;
const GCRA_LEN: usize = 2 + 3 * 8;

/// State is the value of one limiter key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum State {
    /// A GCRA key (`RL.GCRA`, `CL.THROTTLE`).
    Gcra(GcraState),
}

impl State {
    /// Returns the algorithm's name as users see it in errors (`GCRA`).
    pub fn algorithm_name(&self) -> &'static str {
        match self {
            Self::Gcra(_) => "GCRA",
        }
    }
}

/// DecodeError says why bytes are not a valid state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the layout needs.
    Truncated,
    /// More bytes than the layout needs.
    TrailingBytes,
    /// Written by a newer version of the module (or not ours).
    UnknownVersion(u8),
    /// An algorithm tag this version does not know.
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

/// Appends the encoding of `state` (newest version) to `out`.
pub fn encode_into(state: &State, out: &mut Vec<u8>) {
    match state {
        State::Gcra(g) => {
            out.reserve(GCRA_LEN);
            out.push(ENCODING_VERSION);
            out.push(TAG_GCRA);
            out.extend_from_slice(&g.tat_ns.to_le_bytes());
            out.extend_from_slice(&g.emission_interval_ns.to_le_bytes());
            out.extend_from_slice(&g.burst.to_le_bytes());
        }
    }
}

/// Returns the encoding of `state` (newest version).
pub fn encode(state: &State) -> Vec<u8> {
    let mut out = Vec::with_capacity(GCRA_LEN);
    encode_into(state, &mut out);
    out
}

/// Reads little-endian u64 fields one after another, failing on short input.
struct Reader<'a> {
    rest: &'a [u8],
}

impl Reader<'_> {
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let (head, tail) = self.rest.split_first_chunk::<8>().ok_or(DecodeError::Truncated)?;
        self.rest = tail;
        Ok(u64::from_le_bytes(*head))
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}

/// Decodes and validates a state written by any version up to [`ENCODING_VERSION`].
///
/// Errors: see [`DecodeError`]. Never panics, whatever the input.
pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
    let [version, tag, rest @ ..] = bytes else { return Err(DecodeError::Truncated) };
    if *version == 0 || *version > ENCODING_VERSION {
        return Err(DecodeError::UnknownVersion(*version));
    }
    let mut reader = Reader { rest };
    let state = match *tag {
        TAG_GCRA => {
            let tat_ns = reader.u64()?;
            let emission_interval_ns = reader.u64()?;
            let burst = reader.u64()?;
            if burst == 0 {
                return Err(DecodeError::OutOfRange("burst"));
            }
            GcraParams::from_interval(burst, emission_interval_ns)
                .map_err(|_| DecodeError::OutOfRange("emission_interval_ns"))?;
            State::Gcra(GcraState { tat_ns, emission_interval_ns, burst })
        }
        other => return Err(DecodeError::UnknownAlgorithm(other)),
    };
    reader.finish()?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gcra(tat_ns: u64, emission_interval_ns: u64, burst: u64) -> State {
        State::Gcra(GcraState { tat_ns, emission_interval_ns, burst })
    }

    #[test]
    fn gcra_layout_is_fixed() {
        let bytes = encode(&gcra(0x0102_0304_0506_0708, 1_000_000_000, 10));
        assert_eq!(bytes.len(), 26);
        assert_eq!(&bytes[..2], &[1, 1]);
        assert_eq!(&bytes[2..10], &[8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn corrupt_input_is_refused() {
        let good = encode(&gcra(5, 7, 3));
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&good[..25]), Err(DecodeError::Truncated));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(DecodeError::TrailingBytes));
        let mut future = good.clone();
        future[0] = ENCODING_VERSION + 1;
        assert_eq!(decode(&future), Err(DecodeError::UnknownVersion(ENCODING_VERSION + 1)));
        let mut tag = good.clone();
        tag[1] = 200;
        assert_eq!(decode(&tag), Err(DecodeError::UnknownAlgorithm(200)));
        assert_eq!(decode(&encode(&gcra(5, 0, 3))), Err(DecodeError::OutOfRange("emission_interval_ns")));
        assert_eq!(decode(&encode(&gcra(5, 7, 0))), Err(DecodeError::OutOfRange("burst")));
        assert_eq!(
            decode(&encode(&gcra(5, 1 << 40, u64::MAX))),
            Err(DecodeError::OutOfRange("emission_interval_ns"))
        );
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_identity(tat in any::<u64>(), t in 1u64..1_000_000_000_000, burst in 1u64..1_000_000) {
            let s = gcra(tat, t, burst);
            prop_assert_eq!(decode(&encode(&s)), Ok(s));
        }

        #[test]
        fn decode_of_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_of_mutated_valid_bytes_never_panics(idx in 0usize..26, val in any::<u8>(), cut in 0usize..27) {
            let mut b = encode(&gcra(1, 2, 3));
            b[idx] = val;
            b.truncate(cut);
            let _ = decode(&b);
        }
    }
}
