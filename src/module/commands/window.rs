//! `RL.WINDOW key limit window [FIXED | SLIDING | LOG] [QUANTITY n] [PEEK] [FORCE]`: a window
//! limit (SLIDING by default). Reply: the five integers.

use super::{decide_and_reply, once, unknown, Options, RequestOptions};
use crate::limit::{Limit, WindowKind};
use crate::params::WindowParams;
use crate::module::call::{Arg, Call};
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, Arg as DocArg, INTEGER, ONEOF, OPTIONAL};
use crate::module::error::{CommandError, FORCE_WITH_LOG};
use crate::module::limits::{check_caps, Check, Mode};
use crate::module::stats::Counters;
use crate::state::Event;

/// RL.WINDOW.
pub struct Window;

static COUNTERS: Counters = Counters::new(c"window");

const ALGORITHMS: &[DocArg] = &[
    docs::token(c"fixed", c"FIXED"),
    docs::token(c"sliding", c"SLIDING"),
    docs::token(c"log", c"LOG"),
];

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(c"limit", INTEGER, c"requests allowed per window"),
    docs::SECONDS_WINDOW,
    DocArg {
        name: c"algorithm",
        kind: ONEOF,
        token: None,
        flags: OPTIONAL,
        subargs: ALGORITHMS,
        summary: Some(c"default SLIDING"),
    },
    docs::QUANTITY,
    docs::PEEK,
    docs::FORCE,
];

/// A fully validated RL.WINDOW call.
struct WindowCall<'a> {
    key: Arg<'a>,
    limit: Limit,
    options: RequestOptions,
}

#[inline(always)]
fn parse<'a>(args: &'a [Arg<'a>]) -> Result<WindowCall<'a>, CommandError> {
    let [_, key, limit, window, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.window"));
    };
    let params = WindowParams::parse(limit.bytes(), window.bytes())?;
    let (mut kind, mut seen_kind) = (WindowKind::Sliding, false);
    let mut options = RequestOptions::default();
    let mut words = Options::new(rest);
    while let Some(keyword) = words.next() {
        if let Some(k) = WindowKind::parse(keyword) {
            once(&mut seen_kind, "the algorithm (FIXED | SLIDING | LOG)")?;
            kind = k;
        } else if !options.take(keyword, &mut words)? {
            return Err(unknown(keyword));
        }
    }
    let limit = kind.with(params);
    check_caps(&limit)?;
    options.check_force()?;
    if options.force && !limit.can_force() {
        return Err(CommandError::CannotForce(FORCE_WITH_LOG));
    }
    Ok(WindowCall {
        key: *key,
        limit,
        options,
    })
}

impl Command for Window {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.WINDOW",
        display: "RL.WINDOW",
        flags: c"write fast",
        arity: -4,
        keys: Keys::First,
        summary:
            c"Window rate limit (FIXED, SLIDING counter or exact LOG): admit or deny a request",
        complexity: c"O(1); LOG: O(1) amortised, O(entries that left the window)",
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
            charge: c.options.quantity,
        };
        let mode = Mode {
            peek: c.options.peek,
            force: c.options.force,
            max_wait: None,
            renew: false,
        };
        decide_and_reply(call, &check, mode, Event::Window)
    }
}
