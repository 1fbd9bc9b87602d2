//! `RL.ALL numkeys key [key …] spec [spec …] [QUANTITY n] [PEEK] [FORCE]`: several limits,
//! one atomic decision. Each spec is `GCRA burst rate period`, `WINDOW limit window
//! [FIXED|SLIDING|LOG]` or `LEASE limit lease token`, optionally followed by `COST n`.
//! `numkeys` is at most `rl.all-max-keys`; `RENEW` is refused (a lease is renewed with
//! RL.LEASE alone). Reply: `[combined five, [per-key five, …]]`.

use super::{five, unknown, Options, RequestOptions};
use crate::limit::{parse_spec, shown};
use crate::module::call::{Arg, Call};
use crate::module::clock;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, INTEGER, KEY, MULTIPLE, STRING};
use crate::module::error::{CommandError, FORCE_ON_LEASE, FORCE_WITH_LOG, RENEW_IN_ALL};
use crate::module::limits::{self, check_caps, check_numkeys, Check, Mode, PerKey};
use crate::module::stats::Counters;
use crate::params;
use crate::state::Event;

/// RL.ALL.
pub struct All;

static COUNTERS: Counters = Counters::new(c"all");

const ARGS: &[DocArg] = &[
    arg(c"numkeys", INTEGER, c"number of keys"),
    DocArg {
        name: c"key",
        kind: KEY,
        token: None,
        flags: MULTIPLE,
        subargs: &[],
        summary: Some(c"the limiter keys"),
    },
    DocArg {
        name: c"spec",
        kind: STRING,
        token: None,
        flags: MULTIPLE,
        subargs: &[],
        summary: Some(
            c"one per key: GCRA burst rate period | WINDOW limit window [FIXED|SLIDING|LOG] | \
              LEASE limit lease token, each optionally followed by COST n",
        ),
    },
    docs::QUANTITY,
    docs::PEEK,
    docs::FORCE,
];

/// Words that begin a spec.
fn is_spec_kind(word: &[u8]) -> bool {
    word.eq_ignore_ascii_case(b"GCRA")
        || word.eq_ignore_ascii_case(b"WINDOW")
        || word.eq_ignore_ascii_case(b"LEASE")
}

/// When `numkeys` swallowed spec words as keys: the words after the keys cannot hold one
/// spec per key (each spec has at least 3 words) and a spec keyword stands among the keys.
/// Returns how many keys come before that keyword.
fn specs_start_early(keys: &[Arg<'_>], words_after: usize) -> Option<usize> {
    if words_after >= keys.len().saturating_mul(3) {
        return None;
    }
    keys.iter().position(|k| is_spec_kind(k.bytes()))
}

/// Whether the next word is `RENEW` (where a spec or an option of RL.ALL belongs).
fn is_renew(words: &Options<'_>) -> bool {
    words
        .clone()
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case(b"RENEW"))
}

/// A fully validated RL.ALL call.
struct AllCall<'a> {
    checks: PerKey<Check<'a>>,
    mode: Mode,
}

fn parse<'a>(args: &'a [Arg<'a>]) -> Result<AllCall<'a>, CommandError> {
    let [_, numkeys, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.all"));
    };
    let n = params::positive(numkeys.bytes(), "numkeys")?;
    // Before anything else: a huge numkeys is refused without a look at its arguments.
    check_numkeys(n)?;
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= rest.len())
        .ok_or_else(|| {
            CommandError::Syntax("numkeys is larger than the number of arguments".into())
        })?;
    let (keys, rest) = rest.split_at(n);
    if let Some(after) = specs_start_early(keys, rest.len()) {
        return Err(CommandError::Syntax(format!(
            "numkeys is {n}, but the specs do not match it: the first spec starts after {after} \
             key(s) (give numkeys keys, then one spec per key)"
        )));
    }
    // O(n): a hash set of the key bytes (n is at most rl.all-max-keys).
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    for key in keys {
        if !seen.insert(key.bytes()) {
            return Err(CommandError::Syntax(format!(
                "key '{}' given more than once",
                shown(key.bytes())
            )));
        }
    }
    let mut words = Options::new(rest);
    let mut specs = PerKey::with_capacity(n);
    for (i, key) in keys.iter().enumerate() {
        if words.is_empty() {
            return Err(CommandError::Syntax(format!(
                "expected {n} specs (GCRA … or WINDOW … or LEASE …), got {i}"
            )));
        }
        if is_renew(&words) {
            return Err(CommandError::CannotRenew(RENEW_IN_ALL));
        }
        let spec = parse_spec(&mut words, i + 1, n)?;
        check_caps(&spec.limit)?;
        specs.push((*key, spec));
    }
    let mut options = RequestOptions::default();
    while let Some(keyword) = words.next() {
        if options.take(keyword, &mut words)? {
            continue;
        }
        if keyword.eq_ignore_ascii_case(b"RENEW") {
            return Err(CommandError::CannotRenew(RENEW_IN_ALL));
        }
        return Err(unknown(keyword));
    }
    options.check_force()?;
    if options.force {
        if let Some((_, spec)) = specs.iter().find(|(_, s)| !s.limit.can_force()) {
            return Err(CommandError::CannotForce(match spec.limit.algorithm() {
                crate::state::Algorithm::Lease => FORCE_ON_LEASE,
                _ => FORCE_WITH_LOG,
            }));
        }
    }
    let checks = specs
        .into_iter()
        .map(|(key, spec)| Check {
            key,
            limit: spec.limit,
            charge: spec.cost.unwrap_or(options.quantity),
        })
        .collect();
    Ok(AllCall {
        checks,
        mode: Mode {
            peek: options.peek,
            force: options.force,
            max_wait: None,
            renew: false,
        },
    })
}

impl Command for All {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.ALL",
        display: "RL.ALL",
        flags: c"write getkeys-api",
        arity: -5,
        keys: Keys::AfterNumkeys,
        summary: c"Several limits in one atomic decision: admit on all keys or on none",
        complexity: c"O(N) for N keys (LOG: bounded per key; LEASE: O(leases) per key)",
        args: ARGS,
        acl: c"write",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let c = parse(call.args())?;
        let now = clock::now();
        let decided = limits::decide(call, &c.checks, c.mode, now, Event::All)?;
        call.reply_array(2);
        call.reply_integers(&five(&decided.combined));
        call.reply_array(decided.per_key.len());
        for d in &decided.per_key {
            call.reply_integers(&five(d));
        }
        Ok(Counted::from_allowed(decided.combined.verdict.is_allowed()))
    }

    /// The keys are arguments `2 ..= numkeys + 1` (Redis 7.0 routes movable keys in a
    /// cluster through this callback only). A call whose `numkeys` the arguments cannot hold,
    /// is above `rl.all-max-keys`, or whose specs do not match it, has no keys: it fails with
    /// an error wherever it runs, and no spec word is reported as a key.
    fn key_positions(call: &Call<'_>) {
        let args = call.args();
        let rest = args.get(2..).unwrap_or(&[]);
        let n = args
            .get(1)
            .and_then(|a| crate::time::parse_count(a.bytes()))
            .filter(|&n| check_numkeys(n).is_ok())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= rest.len())
            .unwrap_or(0);
        let keys = rest.get(..n).unwrap_or(&[]);
        if specs_start_early(keys, rest.len().saturating_sub(n)).is_some() {
            return;
        }
        for pos in 2..2 + n {
            call.key_at(pos);
        }
    }
}
