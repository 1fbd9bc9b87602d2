//! `RL.ALL numkeys key [key …] spec [spec …] [QUANTITY n] [PEEK]`: several limits, one atomic
//! decision. Each spec is `GCRA burst rate period` or `WINDOW limit window [FIXED|SLIDING|LOG]`.
//! Reply: `[combined five, [per-key five, …]]`.

use super::window::check_log_limit;
use super::{five, unknown, Options, RequestOptions};
use crate::limit::{parse_spec, shown, Limit, Request};
use crate::module::call::{Arg, Call};
use crate::module::clock;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, INTEGER, KEY, MULTIPLE, STRING};
use crate::module::error::CommandError;
use crate::module::limits::{self, PerKey};
use crate::module::stats::Counters;
use crate::params;

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
            c"one per key: GCRA burst rate period | WINDOW limit window [FIXED|SLIDING|LOG]",
        ),
    },
    docs::QUANTITY,
    docs::PEEK,
];

/// A fully validated RL.ALL call.
struct AllCall<'a> {
    checks: PerKey<(Arg<'a>, Limit)>,
    options: RequestOptions,
}

fn parse<'a>(args: &'a [Arg<'a>]) -> Result<AllCall<'a>, CommandError> {
    let [_, numkeys, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.all"));
    };
    let n = params::positive(numkeys.bytes(), "numkeys")?;
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= rest.len())
        .ok_or(CommandError::Syntax(
            "numkeys is larger than the number of arguments".into(),
        ))?;
    let (keys, rest) = rest.split_at(n);
    // O(n): a hash set of the key bytes (n is bounded only by the argument count).
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
    let mut checks = PerKey::with_capacity(n);
    for (i, key) in keys.iter().enumerate() {
        if words.is_empty() {
            return Err(CommandError::Syntax(format!(
                "expected {n} specs (GCRA … or WINDOW …), got {i}"
            )));
        }
        let limit = parse_spec(&mut words, i + 1, n)?;
        check_log_limit(&limit)?;
        checks.push((*key, limit));
    }
    let mut request = RequestOptions::default();
    while let Some(keyword) = words.next() {
        if !request.take(keyword, &mut words)? {
            return Err(unknown(keyword));
        }
    }
    Ok(AllCall {
        checks,
        options: request,
    })
}

impl Command for All {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.ALL",
        display: "RL.ALL",
        flags: c"write deny-oom getkeys-api",
        arity: -5,
        keys: Keys::AfterNumkeys,
        summary: c"Several limits in one atomic decision: admit on all keys or on none",
        complexity: c"O(N) for N keys (LOG: plus the entries that left the window)",
        args: ARGS,
        acl: c"write",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let c = parse(call.args())?;
        let now = clock::now();
        let request = Request::of(c.options.quantity);
        let decided = limits::decide(call, &c.checks, request, c.options.peek, now, c"rl.all")?;
        call.reply_array(2);
        call.reply_integers(&five(&decided.combined));
        call.reply_array(decided.per_key.len());
        for d in &decided.per_key {
            call.reply_integers(&five(d));
        }
        Ok(Counted::from_allowed(decided.combined.verdict.is_allowed()))
    }

    /// The keys are arguments `2 ..= numkeys + 1` (Redis 7.0 routes movable keys in a
    /// cluster through this callback only).
    fn key_positions(call: &Call<'_>) {
        let args = call.args();
        let n = args
            .get(1)
            .and_then(|a| crate::time::parse_count(a.bytes()))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let last = n.saturating_add(1).min(args.len().saturating_sub(1));
        for pos in 2..=last {
            call.key_at(pos);
        }
    }
}
