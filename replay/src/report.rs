//! report turns a replay's results into the summary a person reads and the JSON a program
//! reads.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::{Results, SweepResult, Totals};
use crate::suggest;
use crate::timestamp::format_utc;

/// Writes `n` with thousands separators (`1,234,567`).
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `part / whole` as a percentage with adaptive precision (`0.032 %`, `12.5 %`).
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0 %".to_owned();
    }
    let p = part as f64 * 100.0 / whole as f64;
    if part == 0 {
        "0 %".to_owned()
    } else if p >= 10.0 {
        format!("{p:.1} %")
    } else if p >= 0.1 {
        format!("{p:.2} %")
    } else {
        format!("{p:.3} %")
    }
}

/// `part / whole` as a percentage judged against `target` (a fraction): with the digits of
/// [`percent`], or more, until the figure shown is on the same side of the target as the
/// exact share (`0.104 %` against 0.1 %, where `percent` shows `0.10 %`), up to 9 decimals.
pub fn percent_judged(part: u64, whole: u64, target: f64) -> String {
    let plain = percent(part, whole);
    if whole == 0 || part == 0 {
        return plain;
    }
    let target_pct = target * 100.0;
    let exact = part as f64 * 100.0 / whole as f64;
    // The side of the target the exact share is on, compared without rounding.
    let side = (part as f64).partial_cmp(&(target * whole as f64));
    let shows = |text: &str| -> Option<std::cmp::Ordering> {
        text.trim_end_matches(" %")
            .parse::<f64>()
            .ok()
            .and_then(|v| v.partial_cmp(&target_pct))
    };
    if shows(&plain) == side {
        return plain;
    }
    let decimals = plain
        .trim_end_matches(" %")
        .split_once('.')
        .map_or(0, |(_, d)| d.len());
    for d in decimals + 1..=9 {
        let text = format!("{exact:.d$} %");
        if shows(&text) == side {
            return text;
        }
    }
    format!("{exact:.9} %")
}

fn duration(ns: u64) -> String {
    let s = ns / 1_000_000_000;
    if s >= 2 * 86_400 {
        format!("{:.1} days", s as f64 / 86_400.0)
    } else if s >= 3600 {
        format!("{:.1} h", s as f64 / 3600.0)
    } else if s >= 60 {
        format!("{:.1} min", s as f64 / 60.0)
    } else {
        format!("{s} s")
    }
}

/// One key in the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct TopKey {
    /// The key, lossily decoded.
    pub key: String,
    /// Requests.
    pub requests: u64,
    /// Denied (by any limit).
    pub denied: u64,
    /// Denied by this limit itself.
    pub denied_by_limit: u64,
    /// First denial, RFC 3339 UTC.
    pub first_denied: String,
    /// Last denial, RFC 3339 UTC.
    pub last_denied: String,
    /// Most requests in one period/window of the limit.
    pub peak_per_period: u64,
}

/// One limit in the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct LimitReport {
    /// 1-based, as given.
    pub index: usize,
    /// The spec in the module's grammar.
    pub spec: String,
    /// The key template.
    pub per: String,
    /// The route, if any.
    pub on: Option<String>,
    /// Requests it applied to.
    pub requests: u64,
    /// Of them, allowed.
    pub allowed: u64,
    /// Of them, denied (by any limit).
    pub denied: u64,
    /// Of them, denied by this limit.
    pub denied_by_limit: u64,
    /// Requests without a key (a template field missing).
    pub unkeyed: u64,
    /// Requests off the route.
    pub off_route: u64,
    /// Distinct keys.
    pub keys: u64,
    /// Keys with at least one request denied by this limit itself.
    pub keys_denied: u64,
    /// `keys_denied / keys`.
    pub keys_denied_share: f64,
    /// Keys with at least one request denied by any limit (this one or another).
    pub keys_with_a_denial: u64,
    /// The limit's period/window in seconds (for `peak_per_period`).
    pub period_seconds: f64,
    /// The most limited keys, most denied first.
    pub top: Vec<TopKey>,
}

/// The sweep in the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// 1-based index of the swept limit.
    pub limit: usize,
    /// What was swept.
    pub param: String,
    /// Target share of keys (fraction).
    pub target_key_share: f64,
    /// Candidates, ascending.
    pub candidates: Vec<SweepResult>,
    /// The suggested spec, if any candidate met the target.
    pub suggested: Option<String>,
    /// Extra passes that replayed the sizes below the suggestion (0: not refined).
    pub refine_passes: usize,
}

/// The whole JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Whole-input counts.
    pub input: Totals,
    /// First and last instant, RFC 3339.
    pub from: String,
    /// See `from`.
    pub to: String,
    /// Per limit.
    pub limits: Vec<LimitReport>,
    /// The sweep.
    pub suggest: Option<SweepReport>,
    /// Pictures written.
    pub pictures: Vec<String>,
    /// Replay speed.
    pub seconds: f64,
}

/// Builds the JSON report (top `top` keys per limit).
pub fn build(
    res: &Results,
    top: usize,
    sweep: Option<(String, f64, usize)>,
    pictures: Vec<String>,
    seconds: f64,
) -> Report {
    let limits = res
        .defs
        .iter()
        .zip(&res.stats)
        .zip(&res.keys)
        .enumerate()
        .map(|(i, ((def, st), keys))| {
            let mut ranked: Vec<u32> = (0..st.keys.len() as u32)
                .filter(|&k| st.keys[k as usize].denied > 0)
                .collect();
            let keys_with_a_denial = ranked.len() as u64;
            let keys_denied = st.keys.iter().filter(|k| k.by_this > 0).count() as u64;
            // Most denied by this limit first, then by any limit.
            ranked.sort_by_key(|&k| {
                let s = &st.keys[k as usize];
                (
                    std::cmp::Reverse(s.by_this),
                    std::cmp::Reverse(s.denied),
                    std::cmp::Reverse(s.requests),
                    k,
                )
            });
            let top = ranked
                .iter()
                .take(top)
                .map(|&k| {
                    let s = &st.keys[k as usize];
                    TopKey {
                        key: String::from_utf8_lossy(keys.get(k)).into_owned(),
                        requests: u64::from(s.requests),
                        denied: u64::from(s.denied),
                        denied_by_limit: u64::from(s.by_this),
                        first_denied: format_utc(s.first_denied),
                        last_denied: format_utc(s.last_denied),
                        peak_per_period: u64::from(s.peak),
                    }
                })
                .collect();
            let n = keys.len() as u64;
            LimitReport {
                index: i + 1,
                spec: def.limit.to_string(),
                per: def.template.to_string(),
                on: def.route.as_ref().map(ToString::to_string),
                requests: st.requests,
                allowed: st.allowed,
                denied: st.denied,
                denied_by_limit: st.by_this,
                unkeyed: st.unkeyed,
                off_route: st.off_route,
                keys: n,
                keys_denied,
                keys_denied_share: if n == 0 {
                    0.0
                } else {
                    keys_denied as f64 / n as f64
                },
                keys_with_a_denial,
                period_seconds: def.limit.period_ns() as f64 / 1e9,
                top,
            }
        })
        .collect();
    let suggest = match (&res.sweep, sweep) {
        (Some((index, results)), Some((param, target, refine_passes))) => Some(SweepReport {
            limit: index + 1,
            param,
            target_key_share: target,
            refine_passes,
            suggested: suggest::recommend(results, target).map(|i| results[i].spec.clone()),
            candidates: results.clone(),
        }),
        _ => None,
    };
    Report {
        input: res.totals.clone(),
        from: if res.totals.requests == 0 {
            "-".to_owned()
        } else {
            format_utc(res.totals.first_ns)
        },
        to: if res.totals.requests == 0 {
            "-".to_owned()
        } else {
            format_utc(res.totals.last_ns)
        },
        limits,
        suggest,
        pictures,
        seconds,
    }
}

/// Renders the summary a person reads.
pub fn text(r: &Report) -> String {
    let mut o = String::new();
    let t = &r.input;
    let _ = writeln!(
        o,
        "rl-replay: {} lines, {} requests from {} to {} ({}); replayed in {:.2} s",
        thousands(t.lines),
        thousands(t.requests),
        r.from,
        r.to,
        duration(t.last_ns.saturating_sub(t.first_ns)),
        r.seconds
    );
    let _ = writeln!(
        o,
        "  malformed {}, out of order {} (late, decided at the replay's clock: {}){}",
        thousands(t.malformed),
        thousands(t.out_of_order),
        thousands(t.late),
        if t.overflow > 0 {
            format!(", arithmetic errors {}", thousands(t.overflow))
        } else {
            String::new()
        }
    );
    for d in &t.damaged {
        let _ = writeln!(o, "  damaged input: {}:{}: {}", d.source, d.line, d.reason);
    }
    if !t.examples.is_empty() {
        let _ = writeln!(
            o,
            "  first malformed lines ({} of {}):",
            t.examples.len(),
            thousands(t.malformed)
        );
        for e in &t.examples {
            let mut text: String = e.text.chars().take(100).collect();
            if e.text.chars().count() > 100 {
                text.push('…');
            }
            let _ = writeln!(o, "    {}:{}: {}: {}", e.source, e.line, e.reason, text);
        }
    }
    let _ = writeln!(o);
    let rows: Vec<[String; 7]> = r
        .limits
        .iter()
        .map(|l| {
            let mut name = format!("#{} {} per {}", l.index, l.spec, l.per);
            if let Some(on) = &l.on {
                let _ = write!(name, " on {on}");
            }
            [
                name,
                thousands(l.requests),
                thousands(l.allowed),
                format!(
                    "{} ({})",
                    thousands(l.denied),
                    percent(l.denied, l.requests)
                ),
                thousands(l.denied_by_limit),
                thousands(l.keys),
                format!(
                    "{} ({})",
                    thousands(l.keys_denied),
                    percent(l.keys_denied, l.keys)
                ),
            ]
        })
        .chain(std::iter::once([
            "all limits together (RL.ALL)".to_owned(),
            thousands(t.requests),
            thousands(t.allowed),
            format!(
                "{} ({})",
                thousands(t.denied),
                percent(t.denied, t.requests)
            ),
            String::new(),
            String::new(),
            String::new(),
        ]))
        .collect();
    table(
        &mut o,
        &[
            "limit",
            "requests",
            "allowed",
            "denied",
            "by this limit",
            "keys",
            "keys it denied",
        ],
        &rows,
    );
    let _ = writeln!(
        o,
        "  (denied: by any of the limits, RL.ALL's rule; by this limit, keys it denied: its own)"
    );
    for l in &r.limits {
        if l.unkeyed + l.off_route > 0 {
            let _ = writeln!(
                o,
                "  #{}: not applied to {} requests ({} without a key, {} off its route)",
                l.index,
                thousands(l.unkeyed + l.off_route),
                thousands(l.unkeyed),
                thousands(l.off_route)
            );
        }
    }
    for l in &r.limits {
        if l.top.is_empty() {
            continue;
        }
        let _ = writeln!(
            o,
            "\nMost limited keys of #{} {} per {} (peak: most requests in one {} s):",
            l.index, l.spec, l.per, l.period_seconds
        );
        let rows: Vec<[String; 7]> = l
            .top
            .iter()
            .map(|k| {
                [
                    k.key.chars().take(48).collect(),
                    thousands(k.requests),
                    format!(
                        "{} ({})",
                        thousands(k.denied),
                        percent(k.denied, k.requests)
                    ),
                    thousands(k.denied_by_limit),
                    k.first_denied.clone(),
                    k.last_denied.clone(),
                    thousands(k.peak_per_period),
                ]
            })
            .collect();
        table(
            &mut o,
            &[
                "key",
                "requests",
                "denied",
                "by this limit",
                "first denied",
                "last denied",
                "peak",
            ],
            &rows,
        );
    }
    if let Some(s) = &r.suggest {
        let l = &r.limits[s.limit - 1];
        let _ = writeln!(
            o,
            "\nSweep of #{} ({} per {}; {}): requests and keys it would deny",
            s.limit, l.spec, l.per, s.param
        );
        let rows: Vec<[String; 4]> = s
            .candidates
            .iter()
            .map(|c| {
                [
                    c.spec.clone(),
                    format!(
                        "{} ({})",
                        thousands(c.keys_denied),
                        percent_judged(c.keys_denied, c.keys, s.target_key_share)
                    ),
                    format!(
                        "{} ({})",
                        thousands(c.denied_by_limit),
                        percent(c.denied_by_limit, c.requests)
                    ),
                    format!(
                        "{} ({})",
                        thousands(c.denied_overall),
                        percent(c.denied_overall, t.requests)
                    ),
                ]
            })
            .collect();
        table(
            &mut o,
            &[
                "candidate",
                "keys denied by it",
                "requests denied by it",
                "denied overall",
            ],
            &rows,
        );
        let target = format!("{}", s.target_key_share * 100.0);
        match &s.suggested {
            Some(spec) => {
                let c = s.candidates.iter().find(|c| &c.spec == spec);
                let (kd, k, rd, r) = c.map_or((0, 0, 0, 0), |c| {
                    (c.keys_denied, c.keys, c.denied_by_limit, c.requests)
                });
                let _ = writeln!(
                    o,
                    "Suggested: {spec} per {} — the smallest candidate from which on at most \
                     {target} % of keys would ever have been denied ({} of {} keys; it denies \
                     {} of the requests it applies to).",
                    l.per,
                    thousands(kd),
                    thousands(k),
                    percent(rd, r)
                );
                if s.refine_passes > 0 {
                    let _ = writeln!(
                        o,
                        "  (exact: the sizes below it were replayed too, in {} more pass{})",
                        s.refine_passes,
                        if s.refine_passes == 1 { "" } else { "es" }
                    );
                }
                if s.candidates
                    .first()
                    .is_some_and(|c| &c.spec == spec && c.size > 1)
                {
                    let _ = writeln!(
                        o,
                        "  (the smallest candidate of the sweep: a smaller one may do; widen \
                         it with --sweep)"
                    );
                }
            }
            None if s.candidates.iter().all(|c| c.keys == 0) => {
                let _ = writeln!(
                    o,
                    "No suggestion: limit #{} applied to no request: nothing to suggest.",
                    s.limit
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "No candidate keeps the keys denied at or under {target} %: widen the \
                     sweep with --sweep MIN..MAX."
                );
            }
        }
    }
    if !r.pictures.is_empty() {
        let _ = writeln!(o, "\nPictures: {}", r.pictures.join(", "));
    }
    o
}

/// Writes every key that saw a denial, per limit, as JSON lines.
pub fn write_denied_keys(res: &Results, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Line<'a> {
        limit: usize,
        spec: &'a str,
        key: String,
        requests: u32,
        denied: u32,
        denied_by_limit: u32,
        first_denied: String,
        last_denied: String,
        peak_per_period: u32,
    }
    for (i, ((def, st), keys)) in res.defs.iter().zip(&res.stats).zip(&res.keys).enumerate() {
        let spec = def.limit.to_string();
        for (k, s) in st.keys.iter().enumerate().filter(|(_, s)| s.denied > 0) {
            let line = Line {
                limit: i + 1,
                spec: &spec,
                key: String::from_utf8_lossy(keys.get(k as u32)).into_owned(),
                requests: s.requests,
                denied: s.denied,
                denied_by_limit: s.by_this,
                first_denied: format_utc(s.first_denied),
                last_denied: format_utc(s.last_denied),
                peak_per_period: s.peak,
            };
            serde_json::to_writer(&mut *out, &line).map_err(std::io::Error::other)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

fn table<const N: usize>(o: &mut String, head: &[&str; N], rows: &[[String; N]]) {
    let mut width = [0usize; N];
    for (i, h) in head.iter().enumerate() {
        width[i] = h.chars().count();
    }
    for row in rows {
        for (i, c) in row.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |o: &mut String, cells: &[&str]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            if i == 0 {
                let _ = write!(s, "  {c}{}", " ".repeat(pad));
            } else {
                let _ = write!(s, "  {}{c}", " ".repeat(pad));
            }
        }
        let _ = writeln!(o, "{}", s.trim_end());
    };
    line(o, head);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(o, &cells);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(12_345_678), "12,345,678");
        assert_eq!(percent(1, 3), "33.3 %");
        assert_eq!(percent(1, 1000), "0.10 %");
        assert_eq!(percent(1, 100_000), "0.001 %");
        assert_eq!(percent(0, 5), "0 %");
        assert_eq!(percent(3, 0), "0 %");
        assert_eq!(duration(90 * 1_000_000_000), "1.5 min");
    }

    #[test]
    fn a_share_judged_against_a_target_shows_which_side_it_is_on() {
        // 11 of 10,577 keys is 0.104 %: above a 0.1 % target, not "0.10 %".
        assert_eq!(percent(11, 10_577), "0.10 %");
        assert_eq!(percent_judged(11, 10_577, 0.001), "0.104 %");
        // Just under the target: 0.0999 %, not "0.100 %".
        assert_eq!(percent(999, 1_000_000), "0.100 %");
        assert_eq!(percent_judged(999, 1_000_000, 0.001), "0.0999 %");
        // Exactly on it, or clearly off it: the usual digits.
        assert_eq!(percent_judged(1, 1000, 0.001), "0.10 %");
        assert_eq!(percent_judged(7, 14_520, 0.001), "0.048 %");
        assert_eq!(percent_judged(320, 14_520, 0.001), "2.20 %");
        assert_eq!(percent_judged(0, 14_520, 0.001), "0 %");
        // A share a hair above the target gets the digits that show it.
        assert_eq!(
            percent_judged(1_000_001, 1_000_000_000, 0.001),
            "0.1000001 %"
        );
    }
}
