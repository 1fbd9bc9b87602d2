//! The one sequence every limiting command runs (RL.GCRA, RL.WINDOW, RL.ALL, CL.THROTTLE):
//! open the keys → load each and decide (pure, nothing written) → if the request is admitted
//! on every key and may write, store each write with its absolute expiry → announce it
//! (replicate the effect, signal WATCH, emit the keyspace event).

use smallvec::SmallVec;

use super::call::{Access, Arg, Call};
use super::error::{CommandError, FORCE_ON_LEASE, FORCE_WITH_LOG};
use super::keys::LimiterKey;
use crate::codec;
use crate::decision::{combine, Decision, Outcome};
use crate::limit::{shown, Limit, LimitError, Request};
use crate::module::config;
use crate::state::{Algorithm, Event, Write};
use crate::time::{Instant, Span};

/// Per-key results, inline for the usual one or two keys.
pub type PerKey<T> = SmallVec<[T; 2]>;

/// One limit of a call: on which key, and what it is charged (the call's `QUANTITY`, or the
/// spec's `COST`).
#[derive(Clone)]
pub struct Check<'a> {
    /// The key.
    pub key: Arg<'a>,
    /// The limit.
    pub limit: Limit,
    /// Requests (slots, tokens, …) this limit is charged; 0 only reports.
    pub charge: u64,
}

/// What a call asks besides its charges.
#[derive(Clone, Copy, Default)]
pub struct Mode {
    /// `PEEK`: decide exactly, write nothing.
    pub peek: bool,
    /// `FORCE`: record usage that has already happened.
    pub force: bool,
    /// `MAXWAIT` (RL.GCRA only).
    pub max_wait: Option<Span>,
    /// `RENEW` (RL.LEASE only): renew the token's live lease, never take a new one.
    pub renew: bool,
}

/// Refuses a limit above its configured cap (`rl.log-max-limit`, `rl.lease-max-limit`).
pub fn check_caps(limit: &Limit) -> Result<(), CommandError> {
    match limit {
        Limit::Log(p) if p.limit > config::log_max_limit() => Err(CommandError::LogLimitTooHigh {
            limit: p.limit,
            max: config::log_max_limit(),
        }),
        Limit::Lease(p, _) if p.limit > config::lease_max_limit() => {
            Err(CommandError::LeaseLimitTooHigh {
                limit: p.limit,
                max: config::lease_max_limit(),
            })
        }
        _ => Ok(()),
    }
}

/// Refuses an RL.ALL whose `numkeys` is above `rl.all-max-keys`: checked as soon as
/// `numkeys` is read, before any key or spec is looked at, so a huge `numkeys` costs nothing.
pub fn check_numkeys(numkeys: u64) -> Result<(), CommandError> {
    let max = config::all_max_keys();
    if numkeys > max {
        return Err(CommandError::TooManyKeys { numkeys, max });
    }
    Ok(())
}

/// The outcome of one limiting call.
pub struct Decided {
    /// The combined decision (the only key's own for a single key).
    pub combined: Decision,
    /// Each key's decision, in key order.
    pub per_key: PerKey<Decision>,
}

/// Decides every check at `now` and, unless `mode.peek`, commits the writes when every
/// charged limit admits the request, emitting `event` for each key written.
///
/// Errors (nothing is written): WRONGTYPE, a key of another algorithm, FORCE where it cannot
/// apply, arithmetic overflow, a RENEW of a lease not held, a state that would not load
/// back, out of memory for a write.
pub fn decide<'a>(
    call: &Call<'a>,
    checks: &[Check<'a>],
    mode: Mode,
    now: Instant,
    event: Event,
) -> Result<Decided, CommandError> {
    if let [check] = checks {
        let decision = decide_one(call, check, mode, now, event)?;
        let mut per_key = PerKey::new();
        per_key.push(decision);
        return Ok(Decided {
            combined: decision,
            per_key,
        });
    }
    let may_write = !mode.peek && checks.iter().any(|c| c.charge > 0);
    // Memory is judged as the command starts (as the server judges `deny-oom` commands,
    // after its eviction attempt), before this call's own allocations (the server's key
    // handles among them).
    let out_of_memory = may_write && call.is_out_of_memory();
    let access = access(may_write);
    let mut keys: PerKey<LimiterKey<'a>> = checks
        .iter()
        .map(|check| call.open(check.key, access))
        .collect();
    let mut per_key = PerKey::new();
    let mut writes: PerKey<Option<(Write, i64)>> = PerKey::new();
    for (key, check) in keys.iter().zip(checks) {
        let (decision, write) = decide_key(key, check, mode, now)?;
        per_key.push(decision);
        writes.push(write);
    }
    let combined = match per_key.as_slice() {
        [only] => *only,
        all => {
            let charged: PerKey<_> = all
                .iter()
                .zip(checks)
                .map(|(d, c)| (*d, c.charge))
                .collect();
            combine(&charged)
        }
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

/// [`decide`] for one key (RL.GCRA, RL.WINDOW, CL.THROTTLE, RL.LEASE, a one-spec RL.ALL):
/// the same steps, without the per-key collections. Returns the key's decision.
#[inline(always)]
pub fn decide_one(
    call: &Call<'_>,
    check: &Check<'_>,
    mode: Mode,
    now: Instant,
    event: Event,
) -> Result<Decision, CommandError> {
    let may_write = !mode.peek && check.charge > 0;
    // Judged before opening the key: the server allocates the key handle, which right after
    // an eviction pass can be what crosses `maxmemory`.
    let out_of_memory = may_write && call.is_out_of_memory();
    let mut key = call.open(check.key, access(may_write));
    let outcome = decide_on(&key, check, mode, now)?;
    let decision = outcome.decision;
    if may_write && decision.verdict.is_allowed() {
        if let Some(write) = &outcome.write {
            check_storable(write)?;
            if out_of_memory {
                return Err(CommandError::OutOfMemory);
            }
            let expire_at_ms = now.saturating_add(decision.reset_after).ceil_unix_ms();
            commit(&mut key, write, expire_at_ms, event);
        }
    }
    Ok(decision)
}

fn access(may_write: bool) -> Access {
    if may_write {
        Access::Write
    } else {
        Access::Read
    }
}

/// Loads `key` and decides `check` on it at `now`. Writes nothing.
#[inline(always)]
fn decide_on(
    key: &LimiterKey<'_>,
    check: &Check<'_>,
    mode: Mode,
    now: Instant,
) -> Result<Outcome<Write>, CommandError> {
    let stored = key.load()?;
    let request = Request {
        quantity: check.charge,
        max_wait: mode.max_wait,
        force: mode.force,
        renew: mode.renew,
    };
    check
        .limit
        .decide(stored, now, request)
        .map_err(|e| match e {
            LimitError::WrongAlgorithm { held, asked } => CommandError::WrongAlgorithm {
                key: key.display_name(),
                held,
                asked,
            },
            LimitError::Overflow(o) => CommandError::overflow(o, now),
            LimitError::CannotForce(Algorithm::Lease) => CommandError::CannotForce(FORCE_ON_LEASE),
            LimitError::CannotForce(_) => CommandError::CannotForce(FORCE_WITH_LOG),
            LimitError::LeaseLost => CommandError::LeaseLost {
                key: key.display_name(),
                token: match &check.limit {
                    Limit::Lease(_, token) => shown(token.as_bytes()),
                    _ => String::new(),
                },
            },
        })
}

/// [`decide_on`], with the write checked storable and paired with its absolute expiry in
/// Unix milliseconds.
fn decide_key(
    key: &LimiterKey<'_>,
    check: &Check<'_>,
    mode: Mode,
    now: Instant,
) -> Result<(Decision, Option<(Write, i64)>), CommandError> {
    let outcome = decide_on(key, check, mode, now)?;
    let write = match outcome.write {
        Some(write) => {
            check_storable(&write)?;
            let expire_at_ms = now
                .saturating_add(outcome.decision.reset_after)
                .ceil_unix_ms();
            Some((write, expire_at_ms))
        }
        None => None,
    };
    Ok((outcome.decision, write))
}

/// Makes a decided write: stores it (in place where possible), sets the absolute expiry,
/// replicates the effect and emits the keyspace event `event`.
#[inline(always)]
pub fn commit(key: &mut LimiterKey<'_>, write: &Write, expire_at_ms: i64, event: Event) {
    key.store(write);
    key.set_expire_at(expire_at_ms);
    key.announce(write, expire_at_ms, event);
}

/// Refuses a write whose state would not load back (RDB, replica, AOF): a safety net under
/// the algorithms' own invariants, so that no bug can make a file unloadable. It checks the
/// state against the decoder's own rules (`codec::check_write`) without encoding it.
#[inline(always)]
pub fn check_storable(write: &Write) -> Result<(), CommandError> {
    codec::check_write(write).map_err(|e| {
        CommandError::Internal(format!(
            "refusing to store a state that would not load back ({e})"
        ))
    })
}
