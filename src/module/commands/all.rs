//! `RL.ALL numkeys key [key …] spec [spec …] [QUANTITY n] [PEEK]`: several limits, one atomic
//! decision. Each spec is `GCRA burst rate period` or `WINDOW limit window [FIXED|SLIDING|LOG]`.

use std::ffi::c_int;

use redis_module::raw;

use super::limit::{self, Algorithm, Spec};
use super::window::check_log_limit;
use super::{five, shown, unknown, Args, Options, RequestOptions};
use crate::decision::{combine, Decision};
use crate::module::clock;
use crate::module::error::CommandError;
use crate::module::ffi;
use crate::module::keys::LimiterKey;
use crate::params::{self, GcraParams, WindowParams};

/// A fully validated RL.ALL call.
struct AllCall<'a> {
    keys: Args<'a>,
    specs: Vec<Spec>,
    request: RequestOptions,
}

/// The next argument of a spec; `what` names it in the error (`GCRA period`).
fn spec_value<'a>(args: &mut Options<'a>, what: &'static str) -> Result<&'a [u8], CommandError> {
    args.next_keyword()
        .ok_or_else(|| CommandError::Syntax(format!("spec is missing its {what}")))
}

fn parse(args: Args<'_>) -> Result<AllCall<'_>, CommandError> {
    let [_, numkeys, rest @ ..] = args else {
        return Err(CommandError::Arity("rl.all"));
    };
    let n = params::positive(unsafe { ffi::bytes(*numkeys) }, "numkeys")?;
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= rest.len())
        .ok_or(CommandError::Syntax(
            "numkeys is larger than the number of arguments".into(),
        ))?;
    let (keys, rest) = rest.split_at(n);
    // O(n): a hash set of the key bytes (n is bounded only by the argument count).
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    for &a in keys {
        let a_bytes = unsafe { ffi::bytes(a) };
        if !seen.insert(a_bytes) {
            return Err(CommandError::Syntax(format!(
                "key '{}' given more than once",
                shown(a_bytes)
            )));
        }
    }
    let mut args = Options::new(rest);
    let mut specs = Vec::with_capacity(n);
    for i in 0..n {
        let Some(kind) = args.next_keyword() else {
            return Err(CommandError::Syntax(format!(
                "expected {n} specs (GCRA … or WINDOW …), got {i}"
            )));
        };
        if kind.eq_ignore_ascii_case(b"GCRA") {
            let burst = params::positive(spec_value(&mut args, "GCRA burst")?, "burst")?;
            let rate = params::positive(spec_value(&mut args, "GCRA rate")?, "rate")?;
            let period_ns = params::seconds(spec_value(&mut args, "GCRA period")?, "period")?;
            specs.push(Spec::Gcra {
                params: GcraParams::new(burst, rate, period_ns)?,
                max_wait_ns: None,
            });
        } else if kind.eq_ignore_ascii_case(b"WINDOW") {
            let limit = params::positive(spec_value(&mut args, "WINDOW limit")?, "limit")?;
            let window_ns = params::seconds(spec_value(&mut args, "WINDOW window")?, "window")?;
            let params = WindowParams::new(limit, window_ns)?;
            let algorithm = match args.peek().and_then(Algorithm::parse) {
                Some(a) => {
                    args.next_keyword();
                    a
                }
                None => Algorithm::Sliding,
            };
            check_log_limit(algorithm, limit)?;
            specs.push(Spec::Window { params, algorithm });
        } else {
            return Err(CommandError::Syntax(format!(
                "expected GCRA or WINDOW for key {} of {n}, got '{}'",
                i + 1,
                shown(kind)
            )));
        }
    }
    let mut request = RequestOptions::default();
    while let Some(keyword) = args.next_keyword() {
        if !request.take(keyword, &mut args)? {
            return Err(unknown(keyword));
        }
    }
    Ok(AllCall {
        keys,
        specs,
        request,
    })
}

/// Answers a key-position request (`getkeys-api`: Redis Cluster routing and `COMMAND
/// GETKEYS` on servers that do not use key-specs for movable keys, such as Redis 7.0): the
/// keys are arguments `2 ..= numkeys + 1`. Returns false when this call is a normal one.
pub fn report_key_positions(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> bool {
    let (Some(is_request), Some(key_at)) =
        (unsafe { raw::RedisModule_IsKeysPositionRequest }, unsafe {
            raw::RedisModule_KeyAtPos
        })
    else {
        return false;
    };
    if unsafe { is_request(ctx) } == 0 {
        return false;
    }
    let n = args
        .get(1)
        .and_then(|&a| crate::time::parse_count(unsafe { ffi::bytes(a) }))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    let last = n.saturating_add(1).min(args.len().saturating_sub(1));
    for pos in 2..=last {
        if let Ok(pos) = c_int::try_from(pos) {
            unsafe { key_at(ctx, pos) };
        }
    }
    true
}

/// Runs RL.ALL. The reply is `[combined five, [per-key five, …]]`.
pub fn run(ctx: *mut raw::RedisModuleCtx, args: Args<'_>) -> Result<(c_int, bool), CommandError> {
    let call = parse(args)?;
    let now_ns = clock::now_ns();
    let may_write = call.request.may_write();
    let mut keys: Vec<LimiterKey> = call
        .keys
        .iter()
        .map(|&k| LimiterKey::open(ctx, k, may_write))
        .collect();
    let mut evaluated = Vec::with_capacity(keys.len());
    for (key, spec) in keys.iter_mut().zip(&call.specs) {
        evaluated.push(limit::evaluate(key, spec, now_ns, call.request.quantity)?);
    }
    let decisions: Vec<Decision> = evaluated.iter().map(|e| e.decision).collect();
    let combined = five(&combine(&decisions));
    if may_write && combined[0] == 1 {
        for (key, e) in keys.iter_mut().zip(&evaluated) {
            if let Some(write) = &e.write {
                limit::commit(key, write, e.expire_at_ms, c"rl.all");
            }
        }
    }
    drop(keys);
    let Some(array) = (unsafe { raw::RedisModule_ReplyWithArray }) else {
        return Ok((raw::Status::Err as c_int, false));
    };
    unsafe {
        array(ctx, 2);
        ffi::reply_integers(ctx, &combined);
        array(ctx, decisions.len() as std::ffi::c_long);
    }
    for d in &decisions {
        ffi::reply_integers(ctx, &five(d));
    }
    Ok((raw::Status::Ok as c_int, combined[0] == 1))
}
