//! The configuration: envoyproxy/ratelimit's YAML format as it is (one domain per file,
//! nested `descriptors` of `key`/`value`, `rate_limit` with `unit` and `requests_per_unit`,
//! `unlimited`, `name`, `replaces`, `shadow_mode`, `detailed_metric`, …), plus optional
//! fields of our own for what that format cannot say (see gateway/README.md): the algorithm
//! of a limit (`algorithm`, `burst`), any window length (`window: 90s`), concurrency limits
//! (`concurrency`, `lease`), the domain's failure policy (`failure_policy`) and the
//! forward-auth rules (`http_rules`).
//!
//! Loading validates everything and refuses a bad file with one [`ConfigError`] naming the
//! file and the problem; nothing in it panics on any input (see the fuzz test).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redis_rl_client::http::PathPattern;
use redis_rl_client::{Algorithm, Gcra, Lease, Limit, Window};
use serde::Deserialize;

/// The most nested descriptor levels a file may have (Envoy's requests have a handful).
pub const MAX_DEPTH: usize = 32;
/// The largest configuration file read, in bytes.
pub const MAX_FILE_BYTES: usize = 4 << 20;

/// A configuration refused: the file and the problem, in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    fn new(file: &str, message: impl fmt::Display) -> ConfigError {
        ConfigError(format!("{file}: {message}"))
    }

    /// The message: `<file>: <problem>`.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

// ---- The YAML as written -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRoot {
    #[serde(default)]
    domain: Option<Scalar>,
    #[serde(default)]
    descriptors: Option<Vec<YamlDescriptor>>,
    /// Ours: `open` (default) or `closed`.
    #[serde(default)]
    failure_policy: Option<String>,
    /// Ours: forward-auth rules.
    #[serde(default)]
    http_rules: Option<Vec<YamlHttpRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlDescriptor {
    #[serde(default)]
    key: Option<Scalar>,
    #[serde(default)]
    value: Option<Scalar>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Option<Vec<YamlDescriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    /// Accepted as theirs is (arbitrary), not used.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<Scalar>,
    #[serde(default)]
    replaces: Option<Vec<YamlReplaces>>,
    // Ours.
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    window: Option<Scalar>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    concurrency: Option<u64>,
    #[serde(default)]
    lease: Option<Scalar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlReplaces {
    #[serde(default)]
    name: Option<Scalar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlHttpRule {
    #[serde(default)]
    name: Option<Scalar>,
    #[serde(default)]
    methods: Option<Vec<String>>,
    #[serde(default)]
    path: Option<String>,
    descriptors: Vec<Vec<YamlHttpEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlHttpEntry {
    key: Scalar,
    #[serde(default)]
    value: Option<Scalar>,
    #[serde(default)]
    from: Option<String>,
}

/// A YAML scalar read as text, whatever its type (`value: 123` is `"123"`, as
/// envoyproxy/ratelimit's YAML library reads it into a string field).
#[derive(Debug, Clone)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar(v))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar(String::new()))
            }
        }
        d.deserialize_any(V)
    }
}

// ---- The loaded configuration ---------------------------------------------------------------

/// Envoy's rate limit units (`RateLimitResponse.RateLimit.Unit`), with their lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days (as envoyproxy/ratelimit counts it).
    Month,
    /// 365 days (as envoyproxy/ratelimit counts it).
    Year,
}

impl Unit {
    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The largest unit not longer than `window_ms` (at least a second): what a limit with
    /// a window of its own reports as its unit to Envoy.
    pub fn at_most_ms(window_ms: u64) -> Unit {
        [
            Unit::Year,
            Unit::Month,
            Unit::Week,
            Unit::Day,
            Unit::Hour,
            Unit::Minute,
        ]
        .into_iter()
        .find(|u| u.seconds().saturating_mul(1000) <= window_ms)
        .unwrap_or(Unit::Second)
    }
}

/// What a matched descriptor does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `unlimited: true`: always OK, nothing counted.
    Unlimited,
    /// A limit decided in Redis.
    Limit {
        /// The limit (GCRA, window or lease) as the client sends it.
        limit: Limit,
        /// The unit reported to Envoy (`current_limit.unit`).
        unit: Unit,
        /// The count reported to Envoy (`current_limit.requests_per_unit`): the limit, the
        /// burst of a GCRA, the slots of a lease.
        requests_per_unit: u64,
    },
}

/// One configured limit (a descriptor with a `rate_limit`).
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSpec {
    /// The descriptor path as envoyproxy/ratelimit names it in its statistics:
    /// `domain.key_value.key` (`key` alone for a key-only descriptor).
    pub path: String,
    /// `rate_limit.name`, if given (what `replaces` names).
    pub name: Option<String>,
    /// What it does.
    pub action: Action,
    /// `shadow_mode`: decided and counted, never denies.
    pub shadow_mode: bool,
    /// `detailed_metric`: metrics per descriptor value, not per configured path.
    pub detailed_metric: bool,
    /// The names of the limits this one replaces (`replaces`).
    pub replaces: Vec<String>,
}

impl LimitSpec {
    /// The name in the RateLimit header fields: `name`, else the path without the domain.
    pub fn header_name(&self) -> String {
        let raw = match &self.name {
            Some(n) => n.as_str(),
            None => self
                .path
                .split_once('.')
                .map_or(self.path.as_str(), |(_, p)| p),
        };
        raw.chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
            .collect()
    }
}

#[derive(Debug, Default)]
struct Node {
    /// Children by `key_value` or `key`.
    children: HashMap<String, Node>,
    /// Children whose `key_value` holds `*`, in file order: (pattern, its parts split on `*`).
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<LimitSpec>>,
    /// `share_threshold`: the wildcard value pattern every matching value shares.
    share_threshold: bool,
}

/// A descriptor entry's source in an HTTP rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A fixed value (`value:`).
    Value(String),
    /// The client address (`from: remote_address`), from `X-Forwarded-For` behind trusted
    /// proxies.
    RemoteAddress,
    /// The forwarded method (`from: method`).
    Method,
    /// The forwarded path, without the query (`from: path`).
    Path,
    /// The forwarded host (`from: host`: `X-Forwarded-Host`, else `Host`).
    Host,
    /// A header of the original request (`from: header:<name>`).
    Header(String),
}

/// A forward-auth rule: which requests it applies to, and the descriptors built for them.
#[derive(Debug, Clone)]
pub struct HttpRule {
    /// The rule's name (for logs), default `rule<N>`.
    pub name: String,
    /// Upper-case methods it applies to; empty: all.
    pub methods: Vec<String>,
    /// The path pattern it applies to (the client crate's: exact, prefix ending in `/`, or
    /// glob with `*`); `None`: all.
    pub path: Option<Arc<PathPattern>>,
    /// The descriptors: lists of (key, source) entries.
    pub descriptors: Vec<Vec<(String, Source)>>,
}

impl HttpRule {
    /// Whether the rule applies to a request of `method` on `path`.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method)))
            && self
                .path
                .as_ref()
                .is_none_or(|p| p.matches(&redis_rl_client::http::normalize_path(path)))
    }
}

/// What Redis does not answer: allow (`open`) or deny (`closed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Allow while Redis does not answer.
    #[default]
    Open,
    /// Deny while Redis does not answer.
    Closed,
}

/// One domain.
#[derive(Debug)]
pub struct Domain {
    /// Its name.
    pub name: String,
    /// Its failure policy.
    pub failure_policy: Policy,
    /// Its forward-auth rules, first match wins.
    pub http_rules: Vec<HttpRule>,
    root: Node,
}

/// What a descriptor matched: the limit, and the key parts under which it counts.
#[derive(Debug, Clone)]
pub struct Matched {
    /// The limit.
    pub spec: Arc<LimitSpec>,
    /// Per entry: `Some(pattern)` when a `share_threshold` wildcard matched it (every value
    /// matching the pattern shares one counter), else `None` (the value counts alone).
    pub shared: Vec<Option<String>>,
}

impl Domain {
    /// The limit of a request descriptor, as envoyproxy/ratelimit finds it: at each level,
    /// `key_value` first, then the wildcard values in file order, then `key` alone; the
    /// limit applies only when found at the descriptor's last entry (a request with more
    /// entries, or fewer, than the configured path has no limit).
    pub fn lookup(&self, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut node = &self.root;
        let mut shared = vec![None; entries.len()];
        let mut found = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            let full = format!("{key}_{value}");
            let mut next = node.children.get(&full);
            if next.is_none() {
                for (pattern, parts) in &node.wildcards {
                    if wildcard_match(parts, &full) {
                        next = node.children.get(pattern);
                        if next.is_some_and(|n| n.share_threshold) {
                            shared[i] = pattern.strip_prefix(&format!("{key}_")).map(str::to_owned);
                        }
                        break;
                    }
                }
            }
            if next.is_none() {
                next = node.children.get(*key);
            }
            let Some(n) = next else { break };
            if i + 1 == entries.len() {
                found = n.limit.clone();
            }
            if n.children.is_empty() {
                break;
            }
            node = n;
        }
        found.map(|spec| Matched { spec, shared })
    }
}

/// `*` matches any run of characters (also none), as in envoyproxy/ratelimit.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let Some((first, rest)) = parts.split_first() else {
        return false;
    };
    let Some(mut left) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for part in middle {
        match left.find(part.as_str()) {
            Some(at) => left = &left[at + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last.as_str())
}

/// The whole configuration: every domain.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Domain>,
    /// The files it was loaded from.
    pub files: Vec<PathBuf>,
    /// A hash of the files' names and texts (a reload of unchanged files does nothing).
    pub fingerprint: u64,
}

impl Config {
    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The domains' names, sorted.
    pub fn domain_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Loads `path`: one YAML file (one domain), or a directory whose `*.yaml` / `*.yml`
    /// files are each one domain (in name order; a domain in two files is refused).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| ConfigError::new(&shown, e))?;
        let mut files = Vec::new();
        if meta.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| ConfigError::new(&shown, e))?;
            for e in entries.flatten() {
                let p = e.path();
                let yaml = p
                    .extension()
                    .and_then(|x| x.to_str())
                    .is_some_and(|x| x == "yaml" || x == "yml");
                if yaml && p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(ConfigError::new(
                    &shown,
                    "no *.yaml or *.yml file in the directory",
                ));
            }
        } else {
            files.push(path.to_path_buf());
        }
        let mut texts = Vec::new();
        for f in &files {
            let name = f.display().to_string();
            let bytes = std::fs::read(f).map_err(|e| ConfigError::new(&name, e))?;
            if bytes.len() > MAX_FILE_BYTES {
                return Err(ConfigError::new(
                    &name,
                    format!("larger than {MAX_FILE_BYTES} bytes"),
                ));
            }
            let text =
                String::from_utf8(bytes).map_err(|_| ConfigError::new(&name, "not UTF-8 text"))?;
            texts.push((name, text));
        }
        let refs: Vec<(&str, &str)> = texts
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        let mut config = Config::from_texts(&refs)?;
        config.files = files;
        Ok(config)
    }

    /// Builds a configuration from (file name, YAML text) pairs, one domain each.
    pub fn from_texts(texts: &[(&str, &str)]) -> Result<Config, ConfigError> {
        use std::hash::{Hash, Hasher};
        let mut config = Config::default();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        texts.hash(&mut hasher);
        config.fingerprint = hasher.finish();
        let mut seen: HashMap<String, &str> = HashMap::new();
        for (file, text) in texts {
            let domain = parse_domain(file, text)?;
            if let Some(first) = seen.get(&domain.name) {
                return Err(ConfigError::new(
                    file,
                    format!("duplicate domain '{}' (already in {first})", domain.name),
                ));
            }
            seen.insert(domain.name.clone(), file);
            config.domains.insert(domain.name.clone(), domain);
        }
        Ok(config)
    }
}

/// Parses one file's text into its domain.
pub fn parse_domain(file: &str, text: &str) -> Result<Domain, ConfigError> {
    // The parser's budgets (nesting, aliases, events) bound what any text can cost.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = 4 * MAX_DEPTH + 16;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    let root: YamlRoot = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let msg = e.to_string();
        let line = msg.lines().next().unwrap_or("invalid YAML");
        let line = line.strip_prefix("error: ").unwrap_or(line).to_owned();
        ConfigError::new(file, format!("error loading config file: {line}"))
    })?;
    let err = |m: String| ConfigError::new(file, m);
    let name = root.domain.map(|s| s.0).unwrap_or_default();
    if name.is_empty() {
        return Err(err("config file cannot have empty domain".into()));
    }
    let failure_policy = match root.failure_policy.as_deref() {
        None | Some("open") => Policy::Open,
        Some("closed") => Policy::Closed,
        Some(other) => {
            return Err(err(format!(
                "domain '{name}': failure_policy must be 'open' or 'closed', not '{other}'"
            )))
        }
    };
    let mut root_node = Node::default();
    let mut names = Vec::new();
    load_descriptors(
        &mut root_node,
        &format!("{name}."),
        root.descriptors.unwrap_or_default(),
        0,
        &mut names,
    )
    .map_err(|m| err(format!("domain '{name}': {m}")))?;
    check_replaces(&names).map_err(|m| err(format!("domain '{name}': {m}")))?;
    let mut http_rules = Vec::new();
    for (i, r) in root.http_rules.unwrap_or_default().into_iter().enumerate() {
        let rule = http_rule(i, r).map_err(|m| err(format!("domain '{name}': {m}")))?;
        http_rules.push(rule);
    }
    Ok(Domain {
        name,
        failure_policy,
        http_rules,
        root: root_node,
    })
}

/// (limit name, the names it replaces) of every named or replacing limit.
type Names = Vec<(Option<String>, Vec<String>, String)>;

fn load_descriptors(
    node: &mut Node,
    parent: &str,
    descriptors: Vec<YamlDescriptor>,
    depth: usize,
    names: &mut Names,
) -> Result<(), String> {
    if depth >= MAX_DEPTH && !descriptors.is_empty() {
        return Err(format!("descriptors nested deeper than {MAX_DEPTH} levels"));
    }
    for d in descriptors {
        let key = d.key.map(|s| s.0).unwrap_or_default();
        if key.is_empty() {
            return Err(format!("descriptor under '{parent}' has empty key"));
        }
        let value = d.value.map(|s| s.0).unwrap_or_default();
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let path = format!("{parent}{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(format!("duplicate descriptor composite key '{path}'"));
        }
        if d.quota_mode {
            return Err(format!(
                "descriptor '{path}': quota_mode is not supported by rl-gateway"
            ));
        }
        let _ = d.value_to_metric; // a metrics naming option: accepted, metrics stay per path
        if d.share_threshold && !final_key.contains('*') {
            return Err(format!(
                "descriptor '{path}': share_threshold can only be used with wildcard values \
                 (containing '*')"
            ));
        }
        let limit = match d.rate_limit {
            None => None,
            Some(rl) => {
                let spec = limit_spec(&path, rl, d.shadow_mode, d.detailed_metric)
                    .map_err(|m| format!("descriptor '{path}': {m}"))?;
                names.push((spec.name.clone(), spec.replaces.clone(), path.clone()));
                Some(Arc::new(spec))
            }
        };
        let mut child = Node {
            limit,
            share_threshold: d.share_threshold,
            ..Node::default()
        };
        load_descriptors(
            &mut child,
            &format!("{path}."),
            d.descriptors.unwrap_or_default(),
            depth + 1,
            names,
        )?;
        if final_key.contains('*') {
            let parts = final_key.split('*').map(str::to_owned).collect();
            node.wildcards.push((final_key.clone(), parts));
        }
        node.children.insert(final_key, child);
    }
    Ok(())
}

fn limit_spec(
    path: &str,
    rl: YamlRateLimit,
    shadow_mode: bool,
    detailed_metric: bool,
) -> Result<LimitSpec, String> {
    let unit = match rl.unit.as_deref() {
        None | Some("") => None,
        Some(u) => match Unit::parse(u) {
            Some(unit) => Some(unit),
            None => return Err(format!("invalid rate limit unit '{u}'")),
        },
    };
    let name = rl.name.map(|s| s.0).filter(|n| !n.is_empty());
    let mut replaces = Vec::new();
    for r in rl.replaces.unwrap_or_default() {
        let n = r.name.map(|s| s.0).unwrap_or_default();
        if n.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if name.as_deref() == Some(n.as_str()) {
            return Err("replaces should not contain name of same descriptor".into());
        }
        replaces.push(n);
    }
    let ours = rl.algorithm.is_some()
        || rl.window.is_some()
        || rl.burst.is_some()
        || rl.concurrency.is_some()
        || rl.lease.is_some();
    let action = if rl.unlimited {
        if unit.is_some() {
            return Err("should not specify rate limit unit when unlimited".into());
        }
        if ours || rl.requests_per_unit.is_some_and(|n| n > 0) {
            return Err("an unlimited limit takes no count, window, algorithm or lease".into());
        }
        Action::Unlimited
    } else if let Some(slots) = rl.concurrency {
        if unit.is_some() || rl.requests_per_unit.is_some() || rl.window.is_some() {
            return Err(
                "a concurrency limit takes 'concurrency' and 'lease', not 'unit', \
                 'requests_per_unit' or 'window'"
                    .into(),
            );
        }
        if rl.algorithm.is_some() || rl.burst.is_some() {
            return Err("a concurrency limit takes no algorithm or burst".into());
        }
        let lease_ms = match &rl.lease {
            Some(s) => parse_duration_ms(&s.0).map_err(|m| format!("lease: {m}"))?,
            None => 60_000,
        };
        let lease =
            Lease::new(slots, Duration::from_millis(lease_ms)).map_err(|e| e.to_string())?;
        Action::Limit {
            limit: lease.into(),
            unit: Unit::at_most_ms(lease_ms),
            requests_per_unit: slots,
        }
    } else {
        if rl.lease.is_some() {
            return Err("'lease' goes with 'concurrency'".into());
        }
        let window_ms = match (&rl.window, unit) {
            (Some(w), _) => parse_duration_ms(&w.0).map_err(|m| format!("window: {m}"))?,
            (None, Some(u)) => u.seconds() * 1000,
            (None, None) => {
                let shown = rl.unit.as_deref().unwrap_or("");
                return Err(format!("invalid rate limit unit '{shown}'"));
            }
        };
        let count = rl.requests_per_unit.unwrap_or(0);
        if count == 0 {
            return Err("requests_per_unit must be a positive integer".into());
        }
        if count > u64::from(u32::MAX) {
            return Err(format!("requests_per_unit must be at most {}", u32::MAX));
        }
        let algorithm = rl
            .algorithm
            .as_deref()
            .unwrap_or("fixed")
            .to_ascii_lowercase();
        let window = Duration::from_millis(window_ms);
        let (limit, shown): (Limit, u64) = match algorithm.as_str() {
            "gcra" => {
                let burst = rl.burst.unwrap_or(count);
                let g = Gcra::new(burst, count, window).map_err(|e| e.to_string())?;
                (g.into(), burst)
            }
            other => {
                if rl.burst.is_some() {
                    return Err("'burst' is for algorithm: gcra".into());
                }
                let a = match other {
                    "fixed" => Algorithm::Fixed,
                    "sliding" => Algorithm::Sliding,
                    "log" => Algorithm::Log,
                    _ => {
                        return Err(format!(
                            "unknown algorithm '{other}' (fixed, sliding, log or gcra)"
                        ))
                    }
                };
                let w = Window::new(count, window, a).map_err(|e| e.to_string())?;
                (w.into(), count)
            }
        };
        Action::Limit {
            limit,
            unit: unit.unwrap_or_else(|| Unit::at_most_ms(window_ms)),
            requests_per_unit: shown,
        }
    };
    let action = match action {
        Action::Limit {
            limit,
            unit,
            requests_per_unit,
        } => {
            let limit = match &name {
                Some(n) => named(limit, n)?,
                None => limit,
            };
            Action::Limit {
                limit,
                unit,
                requests_per_unit,
            }
        }
        a => a,
    };
    Ok(LimitSpec {
        path: path.to_owned(),
        name,
        action,
        shadow_mode,
        detailed_metric,
        replaces,
    })
}

/// Names the limit for the HTTP fields when the name is printable ASCII (else unnamed: the
/// header name is sanitised from the path instead).
fn named(limit: Limit, name: &str) -> Result<Limit, String> {
    if !name.chars().all(|c| (' '..='~').contains(&c)) {
        return Ok(limit);
    }
    let out = match &limit {
        Limit::Gcra(g) => g.clone().named(name).map(Limit::from),
        Limit::Window(w) => w.clone().named(name).map(Limit::from),
        Limit::Lease(l) => l.clone().named(name).map(Limit::from),
    };
    Ok(out.unwrap_or(limit))
}

/// Refuses a cycle in `replaces` (a limit that, through the limits it replaces, replaces
/// itself), which envoyproxy/ratelimit would silently resolve by dropping every limit in it.
fn check_replaces(names: &Names) -> Result<(), String> {
    let mut edges: HashMap<&str, Vec<&str>> = HashMap::new();
    for (name, replaces, _) in names {
        if let Some(n) = name {
            edges
                .entry(n.as_str())
                .or_default()
                .extend(replaces.iter().map(String::as_str));
        }
    }
    // Iterative depth-first search with colours: 1 = on the stack, 2 = done.
    let mut colour: HashMap<&str, u8> = HashMap::new();
    let mut starts: Vec<&str> = edges.keys().copied().collect();
    starts.sort_unstable();
    for start in starts {
        if colour.contains_key(start) {
            continue;
        }
        let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
        colour.insert(start, 1);
        while let Some((node, i)) = stack.pop() {
            let next = edges.get(node).and_then(|v| v.get(i)).copied();
            match next {
                None => {
                    colour.insert(node, 2);
                }
                Some(n) => {
                    stack.push((node, i + 1));
                    match colour.get(n) {
                        Some(1) => {
                            let mut cycle: Vec<&str> = stack.iter().map(|(s, _)| *s).collect();
                            if let Some(at) = cycle.iter().position(|s| *s == n) {
                                cycle.drain(..at);
                            }
                            cycle.push(n);
                            return Err(format!("cycle in replaces: {}", cycle.join(" -> ")));
                        }
                        Some(_) => {}
                        None => {
                            colour.insert(n, 1);
                            stack.push((n, 0));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn http_rule(i: usize, r: YamlHttpRule) -> Result<HttpRule, String> {
    let name = r
        .name
        .map(|s| s.0)
        .unwrap_or_else(|| format!("rule{}", i + 1));
    let methods: Vec<String> = r
        .methods
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.to_ascii_uppercase())
        .collect();
    if let Some(bad) = methods
        .iter()
        .find(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()))
    {
        return Err(format!(
            "http rule '{name}': method '{bad}' is not a method"
        ));
    }
    let path = r.path.map(|p| Arc::new(PathPattern::from(p.as_str())));
    if r.descriptors.is_empty() {
        return Err(format!("http rule '{name}': no descriptors"));
    }
    let mut descriptors = Vec::new();
    for d in r.descriptors {
        if d.is_empty() {
            return Err(format!("http rule '{name}': a descriptor with no entries"));
        }
        let mut entries = Vec::new();
        for e in d {
            let key = e.key.0;
            if key.is_empty() {
                return Err(format!("http rule '{name}': an entry with an empty key"));
            }
            let source = match (e.value, e.from.as_deref()) {
                (Some(v), None) => Source::Value(v.0),
                (None, Some("remote_address")) => Source::RemoteAddress,
                (None, Some("method")) => Source::Method,
                (None, Some("path")) => Source::Path,
                (None, Some("host")) => Source::Host,
                (None, Some(f)) if f.starts_with("header:") && f.len() > 7 => {
                    let h = &f[7..];
                    if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                        return Err(format!("http rule '{name}': '{h}' is not a header name"));
                    }
                    Source::Header(h.to_ascii_lowercase())
                }
                (None, Some(f)) => {
                    return Err(format!(
                        "http rule '{name}': unknown source '{f}' (remote_address, method, \
                         path, host or header:<name>)"
                    ))
                }
                _ => {
                    return Err(format!(
                        "http rule '{name}': entry '{key}' needs exactly one of 'value' and 'from'"
                    ))
                }
            };
            entries.push((key, source));
        }
        descriptors.push(entries);
    }
    Ok(HttpRule {
        name,
        methods,
        path,
        descriptors,
    })
}

/// Parses a duration: a decimal number and a unit, `ms`, `s`, `m`, `h` or `d` (`90s`,
/// `1.5s`, `500ms`, `2h`); a bare number is seconds. Returns milliseconds (≥ 1).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{t}' (ms, s, m, h or d)"
            ))
        }
    };
    let ok = !num.is_empty()
        && num.matches('.').count() <= 1
        && !num.starts_with('.')
        && !num.ends_with('.');
    let value: f64 = if ok {
        num.parse()
            .map_err(|_| format!("'{t}' is not a duration"))?
    } else {
        return Err(format!("'{t}' is not a duration (e.g. 90s, 500ms, 2h)"));
    };
    let ms = (value * scale).round();
    if !(1.0..=315_360_000_000.0).contains(&ms) {
        return Err(format!("'{t}' must be from 1ms to 10 years"));
    }
    Ok(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(text: &str) -> Domain {
        parse_domain("t.yaml", text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn refused(text: &str) -> String {
        parse_domain("t.yaml", text)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    }

    fn path_of(d: &Domain, entries: &[(&str, &str)]) -> Option<String> {
        d.lookup(entries).map(|m| m.spec.path.clone())
    }

    const EXAMPLE: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    rate_limit:
      unit: second
      requests_per_unit: 100
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 50}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bar
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    value: "vip*"
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: bucket
    value: "b*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;

    #[test]
    fn value_before_wildcard_before_key() {
        let d = domain(EXAMPLE);
        assert_eq!(
            path_of(&d, &[("database", "users")]).unwrap(),
            "mongo_cps.database_users"
        );
        assert_eq!(
            path_of(&d, &[("database", "other")]).unwrap(),
            "mongo_cps.database"
        );
        assert_eq!(
            path_of(&d, &[("user", "vip-7")]).unwrap(),
            "mongo_cps.user_vip*"
        );
        assert_eq!(path_of(&d, &[("user", "bob")]).unwrap(), "mongo_cps.user");
        assert_eq!(
            path_of(&d, &[("remote_address", "1.2.3.4"), ("path", "/login")]).unwrap(),
            "mongo_cps.remote_address.path_/login"
        );
        assert_eq!(
            path_of(&d, &[("remote_address", "1.2.3.4"), ("path", "/x")]).unwrap(),
            "mongo_cps.remote_address.path"
        );
    }

    #[test]
    fn partial_matches_have_no_limit() {
        let d = domain(EXAMPLE);
        // Fewer entries than the configured path, more, or an unknown key: no limit.
        assert!(path_of(&d, &[("source_cluster", "proxy")]).is_none());
        assert!(path_of(&d, &[("remote_address", "1.2.3.4")]).is_none());
        assert!(path_of(&d, &[("database", "users"), ("extra", "x")]).is_none());
        assert!(path_of(&d, &[("nothing", "x")]).is_none());
        assert!(path_of(
            &d,
            &[("source_cluster", "other"), ("destination_cluster", "bar")]
        )
        .is_none());
        assert!(path_of(&d, &[]).is_none());
    }

    #[test]
    fn share_threshold_shares_the_pattern() {
        let d = domain(EXAMPLE);
        let m = d.lookup(&[("bucket", "b1")]).unwrap();
        assert_eq!(m.shared, vec![Some("b*".to_owned())]);
        let m = d.lookup(&[("user", "vip-1")]).unwrap();
        assert_eq!(m.shared, vec![None]);
    }

    #[test]
    fn wildcards() {
        let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&parts("k_a*"), "k_abc"));
        assert!(wildcard_match(&parts("k_a*"), "k_a"));
        assert!(!wildcard_match(&parts("k_a*"), "k_b"));
        assert!(wildcard_match(&parts("k_a*c*e"), "k_abcde"));
        assert!(!wildcard_match(&parts("k_a*c*e"), "k_abde"));
        assert!(!wildcard_match(&parts("k_ab*ba"), "k_aba"));
        assert!(wildcard_match(&parts("k_x"), "k_x"));
    }

    #[test]
    fn our_fields() {
        let d = domain(
            r#"
domain: d
failure_policy: closed
descriptors:
  - key: a
    rate_limit: {requests_per_unit: 100, window: 90s, algorithm: sliding}
  - key: b
    rate_limit: {requests_per_unit: 10, unit: minute, algorithm: gcra, burst: 20}
  - key: c
    rate_limit: {concurrency: 4, lease: 30s}
  - key: e
    rate_limit: {unlimited: true}
  - key: f
    rate_limit: {requests_per_unit: 3, unit: day, algorithm: LOG}
"#,
        );
        assert_eq!(d.failure_policy, Policy::Closed);
        let action = |k: &str| d.lookup(&[(k, "v")]).unwrap().spec.action.clone();
        assert_eq!(
            action("a"),
            Action::Limit {
                limit: Window::new(100, 90, Algorithm::Sliding).unwrap().into(),
                unit: Unit::Minute,
                requests_per_unit: 100
            }
        );
        assert_eq!(
            action("b"),
            Action::Limit {
                limit: Gcra::new(20, 10, 60).unwrap().into(),
                unit: Unit::Minute,
                requests_per_unit: 20
            }
        );
        assert_eq!(
            action("c"),
            Action::Limit {
                limit: Lease::new(4, 30).unwrap().into(),
                unit: Unit::Second,
                requests_per_unit: 4
            }
        );
        assert_eq!(action("e"), Action::Unlimited);
        assert_eq!(
            action("f"),
            Action::Limit {
                limit: Window::new(3, 86_400, Algorithm::Log).unwrap().into(),
                unit: Unit::Day,
                requests_per_unit: 3
            }
        );
    }

    #[test]
    fn their_units_and_scalars() {
        for u in ["second", "MINUTE", "Hour", "day", "week", "month", "year"] {
            domain(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {u}, requests_per_unit: 1}}\n"
            ));
        }
        // A numeric value is its text, as theirs reads it.
        let d = domain(
            "domain: 7\ndescriptors:\n  - key: port\n    value: 443\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert_eq!(d.name, "7");
        assert!(d.lookup(&[("port", "443")]).is_some());
        // Their other keys are accepted.
        domain(
            "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    value_to_metric: true\n    metadata: {a: [1, 2]}\n    rate_limit: {unit: second, requests_per_unit: 1, name: n}\n",
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        let cases = [
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", "invalid rate limit unit ''"),
            ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "duplicate descriptor composite key 'd.k'"),
            ("domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - {key: x}\n      - {key: x}\n", "duplicate descriptor composite key 'd.k_v.x'"),
            ("domain: d\ndescriptors:\n  - key: k\n    colour: red\n", "colour"),
            ("domain: d\nnope: 1\n", "nope"),
            ("descriptors: []\n", "config file cannot have empty domain"),
            ("domain: d\ndescriptors:\n  - value: v\n", "has empty key"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "should not specify rate limit unit when unlimited"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n", "replaces should not contain name of same descriptor"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "empty replaces entry"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0}\n", "requests_per_unit must be a positive integer"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}\n", "unknown algorithm 'leaky'"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, window: 5 fortnights}\n", "window: unknown unit"),
            ("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n", "quota_mode is not supported"),
            ("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n", "share_threshold can only be used with wildcard"),
            ("domain: d\nfailure_policy: maybe\n", "failure_policy must be 'open' or 'closed'"),
            ("domain: d\ndescriptors: [\n", "error loading config file"),
        ];
        for (text, want) in cases {
            let e = refused(text);
            assert!(e.starts_with("t.yaml: "), "{e}");
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e:?}");
        }
    }

    #[test]
    fn cycles_in_replaces_are_refused() {
        let text = r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: b}]}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, name: b, replaces: [{name: c}]}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, name: c, replaces: [{name: a}]}
"#;
        let e = refused(text);
        assert!(e.contains("cycle in replaces: a -> b -> c -> a"), "{e}");
        // A chain without a cycle is fine.
        domain(&text.replace("replaces: [{name: a}]", "replaces: [{name: z}]"));
    }

    #[test]
    fn duplicate_domains_across_files() {
        let a = "domain: d\n";
        let e = Config::from_texts(&[("a.yaml", a), ("b.yaml", a)]).unwrap_err();
        assert_eq!(
            e.message(),
            "b.yaml: duplicate domain 'd' (already in a.yaml)"
        );
    }

    #[test]
    fn http_rules() {
        let d = domain(
            r#"
domain: web
http_rules:
  - name: login
    methods: [post]
    path: /login
    descriptors:
      - [{key: remote_address, from: remote_address}, {key: path, from: path}]
  - path: /api/
    descriptors:
      - [{key: api_key, from: "header:X-Api-Key"}]
      - [{key: generic_key, value: api}]
"#,
        );
        assert_eq!(d.http_rules.len(), 2);
        assert!(d.http_rules[0].matches("POST", "/login"));
        assert!(!d.http_rules[0].matches("GET", "/login"));
        assert!(d.http_rules[1].matches("GET", "/api/x"));
        assert_eq!(
            d.http_rules[1].descriptors[0][0].1,
            Source::Header("x-api-key".into())
        );
        let e = refused("domain: w\nhttp_rules:\n  - descriptors: [[{key: k, from: cookie}]]\n");
        assert!(e.contains("unknown source 'cookie'"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("90s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1.5s"), Ok(1500));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("10"), Ok(10_000));
        for bad in [
            "",
            "s",
            ".5s",
            "1..2s",
            "-1s",
            "0s",
            "1e3s",
            "1 fortnight",
            "99999999999d",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any text: an answer, never a panic.
        #[test]
        fn any_text_never_panics(text in "\\PC{0,300}") {
            let _ = parse_domain("f.yaml", &text);
        }

        /// YAML-shaped text built from the format's own words: never a panic, and a refusal
        /// is one line naming the file.
        #[test]
        fn yaml_shaped_text_never_panics(
            lines in proptest::collection::vec(
                (0usize..6, proptest::sample::select(vec![
                    "domain: d", "descriptors:", "- key: k", "- key: remote_address", "value: v",
                    "value: \"a*\"", "rate_limit:", "unit: second", "unit: fortnight",
                    "requests_per_unit: 5", "requests_per_unit: -1", "unlimited: true",
                    "name: a", "replaces:", "- name: a", "- name: b", "shadow_mode: true",
                    "window: 90s", "algorithm: gcra", "burst: 0", "concurrency: 3", "lease: 1s",
                    "share_threshold: true", "http_rules:", "- descriptors: [[{key: k, from: path}]]",
                    "[", "{", "&a x", "*a", "!!binary aGk=", "? x", "- ", ":", "'", "\t",
                ])),
                0..25,
            )
        ) {
            let text: String = lines
                .iter()
                .map(|(indent, l)| format!("{}{l}\n", "  ".repeat(*indent)))
                .collect();
            if let Err(e) = parse_domain("f.yaml", &text) {
                let m = e.to_string();
                proptest::prop_assert!(m.starts_with("f.yaml: "), "{}", m);
                proptest::prop_assert!(!m.contains('\n'), "{:?}", m);
            }
        }
    }
}
