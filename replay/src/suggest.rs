//! suggest chooses the candidate sizes of a `--suggest` sweep and reads the answer off the
//! swept results: the smallest size under which at most a target share of keys would ever
//! have been denied.

use crate::engine::Limit;
use crate::replay::SweepResult;

/// Which count of a GCRA limit the sweep changes (a window sweeps its `limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Param {
    /// `burst` and `rate` together, keeping their ratio (the size shown is the burst).
    Both,
    /// `burst` only.
    Burst,
    /// `rate` only.
    Rate,
}

/// The swept size of `limit` now.
pub fn size_of(limit: &Limit, param: Param) -> u64 {
    match param {
        Param::Rate if limit.is_gcra() => limit.per_period(),
        _ => limit.capacity(),
    }
}

/// `steps` sizes from `min` to `max` (inclusive), spaced geometrically, rounded, without
/// repeats, ascending.
pub fn sizes(min: u64, max: u64, steps: usize) -> Vec<u64> {
    let (min, max) = (min.max(1), max.max(min.max(1)));
    let steps = steps.max(2);
    let ratio = (max as f64 / min as f64).powf(1.0 / (steps - 1) as f64);
    let mut out: Vec<u64> = (0..steps)
        .map(|i| ((min as f64) * ratio.powi(i as i32)).round() as u64)
        .map(|s| s.clamp(min, max))
        .collect();
    out.push(max);
    out.sort_unstable();
    out.dedup();
    out
}

/// Up to `n` sizes strictly between `lo` and `hi`, evenly spaced, ascending (all of them when
/// there are at most `n`).
pub fn between(lo: u64, hi: u64, n: u64) -> Vec<u64> {
    let gap = hi.saturating_sub(lo);
    if gap <= 1 {
        return Vec::new();
    }
    if gap - 1 <= n {
        return (lo + 1..hi).collect();
    }
    let mut out: Vec<u64> = (1..=n)
        .map(|k| lo + (u128::from(gap) * u128::from(k) / u128::from(n + 1)) as u64)
        .filter(|&s| s > lo && s < hi)
        .collect();
    out.dedup();
    out
}

/// The default sweep around `size`: a tenth of it to ten times it.
pub fn default_range(size: u64) -> (u64, u64) {
    ((size / 10).max(1), size.saturating_mul(10).max(2))
}

/// Parses `MIN..MAX` (positive integers, MIN ≤ MAX).
pub fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("--sweep '{text}': expected MIN..MAX, e.g. 5..500"))?;
    let parse = |s: &str| -> Result<u64, String> {
        s.trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("--sweep '{text}': '{s}' is not a positive integer"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a > b {
        return Err(format!("--sweep '{text}': MIN is above MAX"));
    }
    Ok((a, b))
}

/// The candidate limits for `sizes`: `limit` resized as `param` says (with `Both`, the rate
/// follows the burst in proportion, rounded, at least 1). Sizes the module would refuse are
/// left out.
pub fn candidates(limit: &Limit, param: Param, sizes: &[u64], log_max: u64) -> Vec<(u64, Limit)> {
    let (burst, rate) = (limit.capacity(), limit.per_period());
    sizes
        .iter()
        .filter_map(|&s| {
            let (b, r) = match param {
                _ if !limit.is_gcra() => (s, 0),
                Param::Both => {
                    let r = (u128::from(rate) * u128::from(s) + u128::from(burst) / 2)
                        / u128::from(burst);
                    (s, u64::try_from(r).ok()?.max(1))
                }
                Param::Burst => (s, rate),
                Param::Rate => (burst, s),
            };
            Some((s, limit.resized(b, r, log_max).ok()?))
        })
        .collect()
}

/// Share of keys denied in `r` (0 when there are no keys).
pub fn key_share(r: &SweepResult) -> f64 {
    if r.keys == 0 {
        0.0
    } else {
        r.keys_denied as f64 / r.keys as f64
    }
}

/// Share of the swept limit's requests it denied.
pub fn request_share(r: &SweepResult) -> f64 {
    if r.requests == 0 {
        0.0
    } else {
        r.denied_by_limit as f64 / r.requests as f64
    }
}

/// The index of the smallest candidate from which on every larger candidate denies at most
/// `target` (a fraction) of the keys; None if even the largest denies more, or if the limit
/// applied to no request (no keys: nothing to judge a size by).
pub fn recommend(results: &[SweepResult], target: f64) -> Option<usize> {
    if results.iter().all(|r| r.keys == 0) {
        return None;
    }
    let mut pick = None;
    for (i, r) in results.iter().enumerate().rev() {
        // keys_denied ≤ target · keys, compared without rounding the share.
        if (r.keys_denied as f64) <= target * r.keys as f64 + 1e-9 {
            pick = Some(i);
        } else {
            break;
        }
    }
    pick
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LOG_MAX_LIMIT_DEFAULT;

    fn limit(text: &str) -> Limit {
        let words: Vec<&str> = text.split_whitespace().collect();
        Limit::parse(&words, LOG_MAX_LIMIT_DEFAULT).unwrap().0
    }

    #[test]
    fn sizes_are_geometric_distinct_and_inclusive() {
        assert_eq!(sizes(1, 1000, 4), [1, 10, 100, 1000]);
        assert_eq!(sizes(1, 4, 10), [1, 2, 3, 4]);
        assert_eq!(sizes(5, 5, 3), [5]);
        let s = sizes(2, 200, 24);
        assert_eq!((s[0], *s.last().unwrap()), (2, 200));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(default_range(20), (2, 200));
        assert_eq!(default_range(3), (1, 30));
    }

    #[test]
    fn refinement_fills_the_gap() {
        assert_eq!(between(4, 5, 16), Vec::<u64>::new());
        assert_eq!(between(4, 8, 16), [5, 6, 7]);
        let b = between(100, 200, 16);
        assert_eq!(b.len(), 16);
        assert!(b.windows(2).all(|w| w[0] < w[1]) && b[0] > 100 && b[15] < 200);
        // Two passes of 16 close any gap up to 17 · 17.
        let first = between(0, 289, 16);
        let step = first[1] - first[0];
        assert!(step <= 17);
        assert!(between(first[0], first[1], 16).len() as u64 == step - 1);
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("5..500"), Ok((5, 500)));
        assert!(parse_range("0..5").is_err());
        assert!(parse_range("9..5").is_err());
        assert!(parse_range("5-9").is_err());
    }

    #[test]
    fn candidates_resize_the_right_count() {
        let g = limit("GCRA 20 10 1");
        let texts = |p: Param| -> Vec<String> {
            candidates(&g, p, &[1, 4, 40], 100)
                .iter()
                .map(|(_, l)| l.to_string())
                .collect()
        };
        assert_eq!(
            texts(Param::Both),
            ["GCRA 1 1 1", "GCRA 4 2 1", "GCRA 40 20 1"]
        );
        assert_eq!(
            texts(Param::Burst),
            ["GCRA 1 10 1", "GCRA 4 10 1", "GCRA 40 10 1"]
        );
        assert_eq!(
            texts(Param::Rate),
            ["GCRA 20 1 1", "GCRA 20 4 1", "GCRA 20 40 1"]
        );
        assert_eq!(size_of(&g, Param::Rate), 10);
        let w = limit("WINDOW 100 60 LOG");
        let c = candidates(&w, Param::Rate, &[50, 150], 120);
        assert_eq!(c.len(), 1); // 150 is above the LOG cap of 120
        assert_eq!(c[0].1.to_string(), "WINDOW 50 60 LOG");
    }

    fn result(size: u64, keys_denied: u64) -> SweepResult {
        SweepResult {
            size,
            spec: String::new(),
            requests: 1000,
            denied_by_limit: keys_denied * 3,
            denied_overall: keys_denied * 3,
            keys: 1000,
            keys_denied,
        }
    }

    #[test]
    fn recommendation_is_the_smallest_size_that_stays_under_the_target() {
        let r = [result(1, 500), result(2, 20), result(4, 1), result(8, 0)];
        assert_eq!(recommend(&r, 0.001), Some(2)); // 1 of 1000 keys is 0.1 %
        assert_eq!(recommend(&r, 0.0), Some(3));
        assert_eq!(recommend(&r, 0.5), Some(0));
        // A larger size that is worse again moves the answer past it.
        let r = [result(1, 0), result(2, 5), result(4, 0)];
        assert_eq!(recommend(&r, 0.001), Some(2));
        assert_eq!(recommend(&[result(1, 9)], 0.001), None);
    }

    #[test]
    fn no_keys_no_recommendation() {
        let none = |size| SweepResult {
            keys: 0,
            requests: 0,
            ..result(size, 0)
        };
        assert_eq!(recommend(&[none(1), none(2)], 0.001), None);
        assert_eq!(recommend(&[none(1)], 1.0), None);
    }
}
