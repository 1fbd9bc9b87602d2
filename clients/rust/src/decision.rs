//! The [`Decision`] a limiter returns, and its HTTP header fields.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::limits::Limit;

/// How long until a denied request may be retried, or that it never can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryAfter {
    /// Wait this long. Zero for an admitted request (except a reservation made with
    /// `max_wait`, whose wait before acting this is); at least 1 ms for a denial.
    Wait(Duration),
    /// No wait can admit this request: its cost exceeds the limit (HTTP 413, not 429).
    Never,
}

impl RetryAfter {
    /// The wait, or `None` for [`RetryAfter::Never`].
    pub fn duration(self) -> Option<Duration> {
        match self {
            RetryAfter::Wait(d) => Some(d),
            RetryAfter::Never => None,
        }
    }
}

/// Who answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The redis-rl module's commands.
    Module,
    /// The project's Lua Functions library (the fallback).
    Fallback,
    /// This process: the deny cache, a batch credit, or the failure policy.
    Local,
}

/// The answer to one request.
///
/// ```
/// use std::time::Duration;
/// use redis_rl_client::{Decision, RetryAfter, Source};
///
/// let d = Decision {
///     allowed: false,
///     limit: 10,
///     remaining: 0,
///     retry_after: RetryAfter::Wait(Duration::from_millis(1500)),
///     reset_after: Duration::from_secs(10),
///     degraded: false,
///     blind: false,
///     source: Source::Module,
///     policy: None,
///     key: Some("api:alice".into()),
///     per_key: vec![],
/// };
/// let h = d.headers(Some("api"));
/// assert_eq!(h["retry-after"], "2");
/// assert_eq!(h["ratelimit-policy"], "\"api\";q=10");
/// assert_eq!(h["ratelimit"], "\"api\";r=0;t=10");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The request may go ahead.
    pub allowed: bool,
    /// The most requests an idle key admits at once (burst / limit / slots).
    pub limit: u64,
    /// Requests of cost 1 still allowed right now, after this one.
    pub remaining: u64,
    /// Denied: how long until this same request would be allowed (≥ 1 ms), or
    /// [`RetryAfter::Never`] when its cost exceeds the limit. Allowed: zero, or a
    /// reservation's wait (`max_wait`).
    pub retry_after: RetryAfter,
    /// How long until the key is idle again (zero for an idle key).
    pub reset_after: Duration,
    /// Redis did not answer: the failure policy decided.
    pub degraded: bool,
    /// The failure policy answered without counting anything ("open" or "closed": Redis
    /// did not answer and nothing is known about the key), so the HTTP answer carries no
    /// RateLimit fields. False for every other decision, including a degraded one of the
    /// "local" policy ([`FailurePolicy::Local`](crate::FailurePolicy::Local)), whose
    /// `limit`, `remaining`, `retry_after` and `reset_after` are its in-memory limiter's real
    /// figures (the Python package's `blind`).
    pub blind: bool,
    /// Who decided: the module, the fallback, or this process.
    pub source: Source,
    /// The limit this decision is about (for a combined decision, the binding limit).
    pub policy: Option<Limit>,
    /// The key as sent (with the limiter's prefix); `None` for a combined decision.
    pub key: Option<String>,
    /// For `check_all`: each key's decision, in key order (empty otherwise).
    pub per_key: Vec<Decision>,
}

/// Options of [`Decision::headers_with`].
#[derive(Debug, Clone, Default)]
pub struct HeaderOptions {
    /// The name of a single limit in the fields (default: the limit's name, else
    /// `"default"`).
    pub policy_name: Option<String>,
    /// Names by key (as sent, with the prefix) for a combined decision (default: each
    /// limit's name, else `"limit1"`, `"limit2"`, …).
    pub names: HashMap<String, String>,
    /// Add `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds from
    /// now) of the binding limit.
    pub x_headers: bool,
}

/// Rounds a duration up to whole seconds (as `Retry-After` wants).
pub(crate) fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn value(text: &str) -> HeaderValue {
    // Names are printable ASCII (checked when set), numbers are digits.
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

impl Decision {
    /// Whether the request can never be allowed (its cost exceeds the limit: HTTP 413).
    pub fn never(&self) -> bool {
        self.retry_after == RetryAfter::Never
    }

    /// The decision for `key` (as sent, with the prefix) of a combined decision.
    pub fn get(&self, key: &str) -> Option<&Decision> {
        self.per_key.iter().find(|d| d.key.as_deref() == Some(key))
    }

    /// The HTTP response fields for this decision:
    ///
    /// * `Retry-After` (seconds, rounded up, ≥ 1) when denied and retryable;
    /// * `RateLimit-Policy: "name";q=<limit>;w=<window seconds>` and
    ///   `RateLimit: "name";r=<remaining>;t=<reset seconds>` (IETF
    ///   draft-ietf-httpapi-ratelimit-headers); a combined decision lists every limit, in
    ///   key order, in both fields.
    ///
    /// `policy_name` names a single limit (default: the limit's name, else `"default"`). A
    /// degraded decision of the open or closed policy ([`Decision::blind`]) carries no
    /// RateLimit field, neither `RateLimit` nor `RateLimit-Policy` nor `X-RateLimit-*`
    /// (nothing is known about the key), only `Retry-After` when it denies; one of the local
    /// policy (not [`Decision::blind`]) carries its limiter's figures. See
    /// [`Decision::headers_with`] for the other options.
    pub fn headers(&self, policy_name: Option<&str>) -> HeaderMap {
        self.headers_with(&HeaderOptions {
            policy_name: policy_name.map(str::to_owned),
            ..HeaderOptions::default()
        })
    }

    /// [`Decision::headers`] with names per key and the optional `X-RateLimit-*` fields.
    pub fn headers_with(&self, options: &HeaderOptions) -> HeaderMap {
        let mut out = HeaderMap::new();
        if !self.allowed {
            if let RetryAfter::Wait(d) = self.retry_after {
                out.insert(RETRY_AFTER, value(&ceil_seconds(d).max(1).to_string()));
            }
        }
        if self.blind {
            // The open or closed policy answered: nothing is known about the key, so no
            // RateLimit field at all (docs/clients.md#closed-policy), not even the policy.
            return out;
        }
        let items: Vec<(String, &Decision)> = if self.per_key.is_empty() {
            let name = options
                .policy_name
                .clone()
                .or_else(|| {
                    self.policy
                        .as_ref()
                        .and_then(|p| p.name().map(str::to_owned))
                })
                .unwrap_or_else(|| "default".to_owned());
            vec![(name, self)]
        } else {
            self.per_key
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let name = d
                        .key
                        .as_ref()
                        .and_then(|k| options.names.get(k).cloned())
                        .filter(|n| !n.is_empty())
                        .or_else(|| d.policy.as_ref().and_then(|p| p.name().map(str::to_owned)))
                        .unwrap_or_else(|| format!("limit{}", i + 1));
                    (name, d)
                })
                .collect()
        };
        let policies: Vec<String> = items.iter().filter_map(|(n, d)| d.policy_item(n)).collect();
        if !policies.is_empty() {
            out.insert(
                HeaderName::from_static("ratelimit-policy"),
                value(&policies.join(", ")),
            );
        }
        let fields: Vec<String> = items
            .iter()
            .map(|(n, d)| {
                format!(
                    "{};r={};t={}",
                    sf_string(n),
                    d.remaining,
                    ceil_seconds(d.reset_after)
                )
            })
            .collect();
        out.insert(
            HeaderName::from_static("ratelimit"),
            value(&fields.join(", ")),
        );
        if options.x_headers {
            out.insert(
                HeaderName::from_static("x-ratelimit-limit"),
                value(&self.limit.to_string()),
            );
            out.insert(
                HeaderName::from_static("x-ratelimit-remaining"),
                value(&self.remaining.to_string()),
            );
            out.insert(
                HeaderName::from_static("x-ratelimit-reset"),
                value(&ceil_seconds(self.reset_after).to_string()),
            );
        }
        out
    }

    fn policy_item(&self, name: &str) -> Option<String> {
        let Some(policy) = &self.policy else {
            return (self.limit > 0).then(|| format!("{};q={}", sf_string(name), self.limit));
        };
        let mut item = format!("{};q={}", sf_string(name), policy.capacity());
        match policy.policy_window() {
            Some(w) => {
                let _ = write!(item, ";w={}", ceil_seconds(w).max(1));
            }
            None => item.push_str(";qu=\"concurrent-requests\""),
        }
        Some(item)
    }
}

/// Reads the five-integer reply into a Decision: `-1` becomes a zero wait when allowed,
/// [`RetryAfter::Never`] when denied; with `reservation` (MAXWAIT) an allowed reply's retry
/// field is the wait before acting.
pub(crate) fn decision_from_reply(
    reply: [i64; 5],
    policy: Option<Limit>,
    key: Option<String>,
    source: Source,
    reservation: bool,
) -> Decision {
    let allowed = reply[0] == 1;
    let retry_ms = reply[3];
    let retry_after = if allowed {
        if reservation && retry_ms > 0 {
            RetryAfter::Wait(Duration::from_millis(retry_ms as u64))
        } else {
            RetryAfter::Wait(Duration::ZERO)
        }
    } else if retry_ms < 0 {
        RetryAfter::Never
    } else {
        RetryAfter::Wait(Duration::from_millis(retry_ms as u64))
    };
    Decision {
        allowed,
        limit: reply[1].max(0) as u64,
        remaining: reply[2].max(0) as u64,
        retry_after,
        reset_after: Duration::from_millis(reply[4].max(0) as u64),
        degraded: false,
        blind: false,
        source,
        policy,
        key,
        per_key: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gcra;

    #[test]
    fn reply_to_decision() {
        let allowed = decision_from_reply([1, 10, 9, -1, 100], None, None, Source::Module, false);
        assert!(allowed.allowed && allowed.retry_after == RetryAfter::Wait(Duration::ZERO));
        let denied = decision_from_reply([0, 10, 0, 1234, 5000], None, None, Source::Module, false);
        assert_eq!(
            denied.retry_after,
            RetryAfter::Wait(Duration::from_millis(1234))
        );
        let never = decision_from_reply([0, 10, 3, -1, 0], None, None, Source::Module, false);
        assert!(never.never());
        let reserved = decision_from_reply([1, 1, 0, 950, 2000], None, None, Source::Module, true);
        assert_eq!(
            reserved.retry_after,
            RetryAfter::Wait(Duration::from_millis(950))
        );
    }

    #[test]
    fn headers_of_the_longest_durations_do_not_overflow() {
        // Decision is a plain struct: a caller may fill it with any Duration.
        let d = Decision {
            allowed: false,
            limit: 1,
            remaining: 0,
            retry_after: RetryAfter::Wait(Duration::MAX),
            reset_after: Duration::MAX,
            degraded: false,
            blind: false,
            source: Source::Module,
            policy: None,
            key: None,
            per_key: vec![],
        };
        let h = d.headers(None);
        assert_eq!(h["retry-after"], u64::MAX.to_string().as_str());
        assert_eq!(
            h["ratelimit"],
            format!("\"default\";r=0;t={}", u64::MAX).as_str()
        );
    }

    #[test]
    fn gcra_window_is_the_fill_time() {
        let g: Limit = Gcra::new(10, 3, 1).unwrap().into();
        assert_eq!(g.policy_window(), Some(Duration::from_nanos(3_333_333_330)));
        let d = Decision {
            allowed: true,
            limit: 10,
            remaining: 3,
            retry_after: RetryAfter::Wait(Duration::ZERO),
            reset_after: Duration::from_millis(7200),
            degraded: false,
            blind: false,
            source: Source::Module,
            policy: Some(g),
            key: None,
            per_key: vec![],
        };
        let h = d.headers(Some("api"));
        assert_eq!(h["ratelimit-policy"], "\"api\";q=10;w=4");
        assert_eq!(h["ratelimit"], "\"api\";r=3;t=8");
        assert!(h.get("retry-after").is_none());
    }
}
