//! `RL.LEASE key limit lease token [QUANTITY n] [PEEK] [RENEW]`: a concurrency limit. At most
//! `limit` slots are held at once, by named leases that end `lease` seconds after their last
//! acquire unless renewed; the same `token` renews instead of taking a second lease. `RENEW`
//! makes the call a renewal only: a token that holds no live lease gets the `LEASELOST` error
//! and nothing is written. Reply: the five integers.

use super::{decide_and_reply, once, unknown, Options, RequestOptions};
use crate::algo::lease::LeaseParams;
use crate::limit::Limit;
use crate::module::call::{Arg, Call};
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::docs::{self, arg, opt, Arg as DocArg, INTEGER, STRING, TOKEN};
use crate::module::error::{CommandError, FORCE_ON_LEASE, RENEW_WITH_QUANTITY_ZERO};
use crate::module::limits::{check_caps, Check, Mode};
use crate::module::stats::Counters;
use crate::params;
use crate::state::Event;

/// RL.LEASE.
pub struct Lease;

static COUNTERS: Counters = Counters::new(c"lease");

const ARGS: &[DocArg] = &[
    docs::KEY_ARG,
    arg(c"limit", INTEGER, c"slots held at once"),
    docs::SECONDS_LEASE,
    arg(c"token", STRING, c"the holder's name, 1 to 64 bytes"),
    docs::QUANTITY,
    docs::PEEK,
    opt(
        c"renew",
        TOKEN,
        c"RENEW",
        c"renew the token's live lease only: LEASELOST when it holds none",
    ),
];

/// A fully validated RL.LEASE call.
struct LeaseCall<'a> {
    key: Arg<'a>,
    limit: Limit,
    options: RequestOptions,
    /// `RENEW`: a renewal only.
    renew: bool,
}

fn parse<'a>(args: &'a [Arg<'a>]) -> Result<LeaseCall<'a>, CommandError> {
    let [_, key, limit, lease, token, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.lease"));
    };
    let params = LeaseParams::parse(limit.bytes(), lease.bytes())?;
    let token = params::token(token.bytes())?;
    let limit = Limit::Lease(params, Box::new(token));
    check_caps(&limit)?;
    let mut options = RequestOptions::default();
    let mut renew = false;
    let mut words = Options::new(rest);
    while let Some(keyword) = words.next() {
        if options.take(keyword, &mut words)? {
            continue;
        }
        if keyword.eq_ignore_ascii_case(b"RENEW") {
            once(&mut renew, "RENEW")?;
            continue;
        }
        return Err(unknown(keyword));
    }
    if options.force {
        return Err(CommandError::CannotForce(FORCE_ON_LEASE));
    }
    if renew && options.quantity == 0 {
        return Err(CommandError::CannotRenew(RENEW_WITH_QUANTITY_ZERO));
    }
    Ok(LeaseCall {
        key: *key,
        limit,
        options,
        renew,
    })
}

impl Command for Lease {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.LEASE",
        display: "RL.LEASE",
        flags: c"write fast",
        arity: -5,
        keys: Keys::First,
        summary: c"Concurrency limit: take or renew a lease on some of at most limit slots",
        complexity: c"O(N) for the N leases stored",
        args: ARGS,
        acl: c"write fast",
        in_ratelimit_category: true,
        counters: Some(&COUNTERS),
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        let c = parse(call.args())?;
        let check = Check {
            key: c.key,
            limit: c.limit,
            charge: c.options.quantity,
        };
        let mode = Mode {
            peek: c.options.peek,
            renew: c.renew,
            ..Mode::default()
        };
        decide_and_reply(call, &check, mode, Event::Lease)
    }
}
