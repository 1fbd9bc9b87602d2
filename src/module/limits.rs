//! The one sequence every limiting command runs (RL.GCRA, RL.WINDOW, RL.ALL, CL.THROTTLE):
//! open the keys → load each and decide (pure, nothing written) → if the request is admitted
//! on every key and may write, store each write with its absolute expiry → announce it
//! (replicate the effect, signal WATCH, emit the keyspace event).

use smallvec::SmallVec;

use super::call::{Access, Arg, Call};
use super::data_type::with_scratch;
use super::error::CommandError;
use super::keys::LimiterKey;
use crate::codec;
use crate::decision::{combine, Decision};
use crate::limit::{Limit, LimitError, Request};
use crate::state::{Event, Write};
use crate::time::Instant;

/// Per-key results, inline for the usual one or two keys.
pub type PerKey<T> = SmallVec<[T; 2]>;

/// The outcome of one limiting call.
pub struct Decided {
    /// The combined decision (the only key's own for a single key).
    pub combined: Decision,
    /// Each key's decision, in key order.
    pub per_key: PerKey<Decision>,
}

/// Decides `request` on every `(key, limit)` at `now` and, unless `peek`, commits the
/// writes when every limit admits it, emitting `event` for each key written.
///
/// Errors (nothing is written): WRONGTYPE, a key of another algorithm, arithmetic overflow,
/// a state that would not load back, out of memory for a write.
pub fn decide<'a>(
    call: &Call<'a>,
    checks: &[(Arg<'a>, Limit)],
    request: Request,
    peek: bool,
    now: Instant,
    event: Event,
) -> Result<Decided, CommandError> {
    let may_write = !peek && request.quantity > 0;
    // Memory is judged as the command starts (as the server judges `deny-oom` commands,
    // after its eviction attempt), before this call's own allocations.
    let out_of_memory = may_write && call.is_out_of_memory();
    let access = if may_write {
        Access::Write
    } else {
        Access::Read
    };
    let mut keys: PerKey<LimiterKey<'a>> = checks
        .iter()
        .map(|(key, _)| call.open(*key, access))
        .collect();
    let mut per_key = PerKey::new();
    let mut writes: PerKey<Option<(Write, i64)>> = PerKey::new();
    for (key, (_, limit)) in keys.iter().zip(checks) {
        let stored = key.load()?;
        let outcome = limit.decide(stored, now, request).map_err(|e| match e {
            LimitError::WrongAlgorithm { held, asked } => CommandError::WrongAlgorithm {
                key: key.display_name(),
                held,
                asked,
            },
            LimitError::Overflow(o) => CommandError::overflow(o, now),
        })?;
        if let Some(write) = &outcome.write {
            check_storable(write)?;
        }
        let expire_at_ms = now
            .saturating_add(outcome.decision.reset_after)
            .ceil_unix_ms();
        per_key.push(outcome.decision);
        writes.push(outcome.write.map(|w| (w, expire_at_ms)));
    }
    let combined = match per_key.as_slice() {
        [only] => *only,
        all => combine(all),
    };
    if may_write && combined.verdict.is_allowed() {
        // Out of memory, a limiter still denies (above, as usual) but refuses to write: a
        // fail-open client would otherwise admit everyone exactly when Redis is full.
        if out_of_memory && writes.iter().any(Option::is_some) {
            return Err(CommandError::OutOfMemory);
        }
        for (key, write) in keys.iter_mut().zip(&writes) {
            if let Some((write, expire_at_ms)) = write {
                commit(key, write, *expire_at_ms, event);
            }
        }
    }
    Ok(Decided { combined, per_key })
}

/// Makes a decided write: stores it (in place where possible), sets the absolute expiry,
/// replicates the effect and emits the keyspace event `event`.
pub fn commit(key: &mut LimiterKey<'_>, write: &Write, expire_at_ms: i64, event: Event) {
    key.store(write);
    key.set_expire_at(expire_at_ms);
    key.announce(write, expire_at_ms, event);
}

/// Refuses a write whose state would not load back (RDB, replica, AOF): a safety net under
/// the algorithms' own invariants, so that no bug can make a file unloadable. LOG appends
/// are not re-encoded here (that would cost O(log) per request); their invariants are
/// property-tested.
pub fn check_storable(write: &Write) -> Result<(), CommandError> {
    if matches!(write, Write::Log(_) | Write::LogRefund { .. }) {
        return Ok(());
    }
    with_scratch(
        |buf| codec::encode_write_into(write, buf),
        |bytes| codec::decode(bytes).map(|_| ()),
    )
    .map_err(|e| {
        CommandError::Internal(format!(
            "refusing to store a state that would not load back ({e})"
        ))
    })
}
