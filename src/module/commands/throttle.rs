//! `CL.THROTTLE key max_burst count_per_period period [quantity]`: a drop-in for redis-cell's
//! command, on the same GCRA core, native type, TTL and replication as RL.GCRA (a key written
//! by one is read by the other). redis-cell's meaning of the arguments: capacity
//! `max_burst + 1`, `count_per_period` requests per `period` integer seconds. Reply:
//! `[limited (0 allowed, 1 limited), limit (= max_burst + 1), remaining, retry_after_s (-1 when
//! allowed), reset_after_s]`, seconds rounded up.

use super::as_reply_int;
use crate::decision::Verdict;
use crate::limit::Limit;
use crate::module::call::Call;
use crate::module::clock;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, INTEGER};
use crate::module::error::CommandError;
use crate::module::limits::{self, Check, Mode};
use crate::module::stats::Counters;
use crate::state::Event;
use crate::params::{self, GcraParams, ParamError};
use crate::time::{Span, MAX_PERIOD, NANOS_PER_SEC};

/// CL.THROTTLE.
pub struct Throttle;

static COUNTERS: Counters = Counters::new(c"throttle");

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(c"max_burst", INTEGER, c"capacity is max_burst + 1"),
    arg(c"count_per_period", INTEGER, c"requests per period"),
    arg(c"period", INTEGER, c"whole seconds"),
    DocArg {
        name: c"quantity",
        kind: INTEGER,
        token: None,
        flags: docs::OPTIONAL,
        subargs: &[],
        summary: Some(c"default 1"),
    },
];

impl Command for Throttle {
    const SPEC: CommandSpec = CommandSpec {
        name: c"CL.THROTTLE",
        display: "CL.THROTTLE",
        flags: c"write fast",
        arity: -5,
        keys: Keys::First,
        summary: c"redis-cell compatible GCRA: capacity max_burst + 1, count per period seconds",
        complexity: c"O(1)",
        args: ARGS,
        acl: c"write fast",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    #[inline(always)]
    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let (key, max_burst, count, period, quantity) = match call.args() {
            [_, k, b, c, p] => (*k, *b, *c, *p, None),
            [_, k, b, c, p, q] => (*k, *b, *c, *p, Some(*q)),
            _ => return Err(CommandError::Arity("cl.throttle")),
        };
        let max_burst = params::non_negative(max_burst.bytes(), "max_burst")?;
        let burst = max_burst.checked_add(1).ok_or(ParamError::BurstTooLarge)?;
        let count = params::positive(count.bytes(), "count_per_period")?;
        let period_s = params::positive(period.bytes(), "period")?;
        let period = Span::from_ns(period_s)
            .checked_mul(NANOS_PER_SEC)
            .filter(|&p| p <= MAX_PERIOD)
            .ok_or_else(|| {
                CommandError::Syntax("period must be whole seconds from 1 to 315360000".into())
            })?;
        let quantity = match quantity {
            Some(q) => params::non_negative(q.bytes(), "quantity")?,
            None => 1,
        };
        let limit = Limit::Gcra(GcraParams::new(burst, count, period)?);
        let now = clock::now();
        let check = Check {
            key,
            limit,
            charge: quantity,
        };
        let d = limits::decide_one(call, &check, Mode::default(), now, Event::Throttle)?;
        let retry_after_s = match d.verdict {
            Verdict::Denied { retry_after } => as_reply_int(retry_after.ceil_s().max(1)),
            _ => -1,
        };
        call.reply_integers(&[
            i64::from(!d.verdict.is_allowed()),
            as_reply_int(d.limit),
            as_reply_int(d.remaining),
            retry_after_s,
            as_reply_int(d.reset_after.ceil_s()),
        ]);
        Ok(Counted::from_allowed(d.verdict.is_allowed()))
    }
}
