//! `RL.GCRA key burst rate period [QUANTITY n] [PEEK] [MAXWAIT ms] [FORCE]`: a GCRA (token
//! bucket) limit. Reply: the five integers.

use super::{decide_and_reply, once, unknown, Options, RequestOptions};
use crate::limit::Limit;
use crate::module::call::{Arg, Call};
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, opt, Arg as DocArg, INTEGER};
use crate::module::error::{CommandError, FORCE_WITH_MAXWAIT};
use crate::module::limits::{Check, Mode};
use crate::module::stats::Counters;
use crate::state::Event;
use crate::params::{self, GcraParams};
use crate::time::Span;

/// RL.GCRA.
pub struct Gcra;

static COUNTERS: Counters = Counters::new(c"gcra");

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(c"burst", INTEGER, c"requests an idle key admits at once"),
    arg(c"rate", INTEGER, c"requests per period"),
    docs::SECONDS_PERIOD,
    docs::QUANTITY,
    docs::PEEK,
    opt(
        c"maxwait",
        INTEGER,
        c"MAXWAIT",
        c"reserve a slot that frees within this many ms",
    ),
    docs::FORCE,
];

/// A fully validated RL.GCRA call.
struct GcraCall<'a> {
    key: Arg<'a>,
    limit: Limit,
    quantity: u64,
    mode: Mode,
}

#[inline(always)]
fn parse<'a>(args: &'a [Arg<'a>]) -> Result<GcraCall<'a>, CommandError> {
    let [_, key, burst, rate, period, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.gcra"));
    };
    let limit = Limit::Gcra(GcraParams::parse(burst.bytes(), rate.bytes(), period.bytes())?);
    let (mut max_wait, mut seen_max_wait) = (None, false);
    let mut options = RequestOptions::default();
    let mut words = Options::new(rest);
    while let Some(keyword) = words.next() {
        if options.take(keyword, &mut words)? {
            continue;
        } else if keyword.eq_ignore_ascii_case(b"MAXWAIT") {
            once(&mut seen_max_wait, "MAXWAIT")?;
            let ms = params::non_negative(words.value("MAXWAIT")?, "MAXWAIT")?;
            max_wait = Some(Span::from_ms_saturating(ms));
        } else {
            return Err(unknown(keyword));
        }
    }
    options.check_force()?;
    if options.force && max_wait.is_some() {
        return Err(CommandError::CannotForce(FORCE_WITH_MAXWAIT));
    }
    Ok(GcraCall {
        key: *key,
        limit,
        quantity: options.quantity,
        mode: Mode {
            peek: options.peek,
            force: options.force,
            max_wait,
            renew: false,
        },
    })
}

impl Command for Gcra {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.GCRA",
        display: "RL.GCRA",
        flags: c"write fast",
        arity: -5,
        keys: Keys::First,
        summary: c"GCRA (token bucket) rate limit: admit or deny a request of QUANTITY",
        complexity: c"O(1)",
        args: ARGS,
        acl: c"write fast",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    #[inline(always)]
    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let c = parse(call.args())?;
        let check = Check {
            key: c.key,
            limit: c.limit,
            charge: c.quantity,
        };
        decide_and_reply(call, &check, c.mode, Event::Gcra)
    }
}
