//! record holds what one log line says, field by field, and the key templates and route
//! selections that read it.
//!
//! A template is text with fields in braces: `{ip}`, `user:{user}`, `{ip}{path:2}`,
//! `{api_key|anonymous}`. Fields: `ip`, `ident`, `user`, `method`, `path` (the request target
//! without its query string; `{path:N}` keeps its first N segments), `uri` (the whole request
//! target), `protocol`, `request` (the request line), `status`, `bytes`, `referer`, `ua`
//! (User-Agent). In JSON lines any other name is a field of the object (dotted names reach into
//! nested objects: `{request.headers.X-Api-Key}`); in Common/Combined lines `{extra:N}` is the
//! N-th field after the Combined ones (e.g. nginx's `"$http_x_forwarded_for"`).
//! A field that is absent, empty or `-` is missing: a template with a missing field and no
//! default (`{user|anon}`) gives no key, and its limit does not apply to that request.

use std::borrow::Cow;
use std::fmt;

/// The most distinct fields the templates of one run may name.
pub const MAX_SLOTS: usize = 24;

/// Field names every format knows, in slot order.
pub const KNOWN: [&str; 12] = [
    "ip", "ident", "user", "method", "path", "uri", "protocol", "request", "status", "bytes",
    "referer", "ua",
];

/// Slot numbers of the known fields.
pub mod slot {
    /// Client address.
    pub const IP: usize = 0;
    /// RFC 1413 identity.
    pub const IDENT: usize = 1;
    /// Authenticated user.
    pub const USER: usize = 2;
    /// Request method.
    pub const METHOD: usize = 3;
    /// Request path without its query.
    pub const PATH: usize = 4;
    /// Request target as sent.
    pub const URI: usize = 5;
    /// Protocol.
    pub const PROTOCOL: usize = 6;
    /// The request line.
    pub const REQUEST: usize = 7;
    /// Status code.
    pub const STATUS: usize = 8;
    /// Response bytes.
    pub const BYTES: usize = 9;
    /// Referer header.
    pub const REFERER: usize = 10;
    /// User-Agent header.
    pub const UA: usize = 11;
}

/// Record is one parsed line: its instant and the fields the run needs.
pub struct Record<'a> {
    /// Nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Field values by slot (None: missing).
    pub slots: [Option<Cow<'a, [u8]>>; MAX_SLOTS],
}

impl<'a> Record<'a> {
    /// An empty record at `time_ns`.
    pub fn new(time_ns: u64) -> Self {
        Self {
            time_ns,
            slots: std::array::from_fn(|_| None),
        }
    }

    /// Sets a slot from borrowed bytes; `-` and empty values are missing.
    #[inline]
    pub fn set(&mut self, slot: usize, value: &'a [u8]) {
        self.slots[slot] = present(value).map(Cow::Borrowed);
    }

    /// The value of a slot.
    #[inline]
    pub fn get(&self, slot: usize) -> Option<&[u8]> {
        self.slots[slot].as_deref()
    }
}

/// `value`, unless it is empty or `-` (the logs' "no value").
#[inline]
pub fn present(value: &[u8]) -> Option<&[u8]> {
    (!value.is_empty() && value != b"-").then_some(value)
}

/// Splits a request line `METHOD TARGET PROTOCOL` into its parts; None when it is not one
/// (`-`, a TLS handshake sent to an HTTP port, …).
pub fn split_request(request: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let sp1 = memchr::memchr(b' ', request)?;
    let rest = &request[sp1 + 1..];
    let (target, protocol) = match memchr::memrchr(b' ', rest) {
        Some(sp2) => (&rest[..sp2], &rest[sp2 + 1..]),
        None => (rest, &b""[..]), // HTTP/0.9: no protocol
    };
    let method = &request[..sp1];
    if method.is_empty() || !method.iter().all(u8::is_ascii_alphabetic) || target.is_empty() {
        return None;
    }
    Some((method, target, protocol))
}

/// The path of a request target: without its query string or fragment.
pub fn path_of(target: &[u8]) -> &[u8] {
    match memchr::memchr2(b'?', b'#', target) {
        Some(i) => &target[..i],
        None => target,
    }
}

/// Schema names the slots a run uses: the known fields, then the other names its templates
/// mention (JSON fields or `extra:N`).
#[derive(Debug, Clone, Default)]
pub struct Schema {
    /// Names of the slots after the known ones.
    pub others: Vec<String>,
    /// Known slots some template or route reads.
    pub used: [bool; KNOWN.len()],
}

impl Schema {
    /// The slot of `name`, adding it when new.
    pub fn slot(&mut self, name: &str) -> Result<usize, String> {
        let name = if name == "user_agent" { "ua" } else { name };
        if let Some(i) = KNOWN.iter().position(|k| *k == name) {
            self.used[i] = true;
            return Ok(i);
        }
        if let Some(i) = self.others.iter().position(|o| o == name) {
            return Ok(KNOWN.len() + i);
        }
        if KNOWN.len() + self.others.len() >= MAX_SLOTS {
            return Err(format!(
                "too many distinct fields in the templates (at most {})",
                MAX_SLOTS - KNOWN.len()
            ));
        }
        self.others.push(name.to_owned());
        Ok(KNOWN.len() + self.others.len() - 1)
    }

    /// Positions N of the `extra:N` names, by slot (Common/Combined lines).
    pub fn extras(&self) -> Vec<(usize, usize)> {
        self.others
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                let n: usize = name.strip_prefix("extra:")?.parse().ok()?;
                Some((KNOWN.len() + i, n))
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(Vec<u8>),
    Field {
        slot: usize,
        segments: Option<usize>,
        default: Option<Vec<u8>>,
    },
}

/// Template builds a key from a record's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// The first `n` segments of a path: `/a/b/c` with 2 → `/a/b`; `/a` with 2 → `/a`.
pub fn first_segments(path: &[u8], n: usize) -> &[u8] {
    let mut seen = 0;
    for (i, &b) in path.iter().enumerate() {
        if b == b'/' && i > 0 {
            seen += 1;
            if seen == n {
                return &path[..i];
            }
        }
    }
    path
}

impl Template {
    /// Compiles `source`, registering its fields in `schema`.
    ///
    /// Errors: unbalanced braces, an empty field name, `{path:N}` with N not a positive
    /// integer, or too many fields.
    pub fn parse(source: &str, schema: &mut Schema) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = source;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Text(rest.as_bytes().to_vec()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(format!("template '{source}': '}}' without '{{'"));
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Text(rest.as_bytes()[..i].to_vec()));
                    }
                    let close = rest[i..]
                        .find('}')
                        .ok_or_else(|| format!("template '{source}': '{{' without '}}'"))?;
                    let inner = &rest[i + 1..i + close];
                    parts.push(Self::field(inner, source, schema)?);
                    rest = &rest[i + close + 1..];
                }
            }
        }
        if !parts.iter().any(|p| matches!(p, Part::Field { .. })) {
            return Err(format!(
                "template '{source}' names no field: every request would share one key \
                 (write e.g. '{{ip}}')"
            ));
        }
        Ok(Self {
            source: source.to_owned(),
            parts,
        })
    }

    fn field(inner: &str, source: &str, schema: &mut Schema) -> Result<Part, String> {
        let (spec, default) = match inner.split_once('|') {
            Some((s, d)) => (s, Some(d.as_bytes().to_vec())),
            None => (inner, None),
        };
        let bad = |why: &str| format!("template '{source}': {why}");
        if spec.is_empty() || spec.contains('{') {
            return Err(bad("empty field name"));
        }
        let (name, segments) = match spec.split_once(':') {
            Some(("path", n)) => {
                let n: usize = n
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("{path:N} needs N ≥ 1"))?;
                ("path", Some(n))
            }
            Some(("extra", n)) => {
                if n.parse::<usize>().ok().filter(|&n| n >= 1).is_none() {
                    return Err(bad("{extra:N} needs N ≥ 1"));
                }
                (spec, None)
            }
            _ => (spec, None),
        };
        Ok(Part::Field {
            slot: schema.slot(name)?,
            segments,
            default,
        })
    }

    /// Writes the key for `record` into `out` (cleared first). Returns false when a field
    /// is missing and has no default: the template gives no key.
    #[inline]
    pub fn render(&self, record: &Record<'_>, out: &mut Vec<u8>) -> bool {
        out.clear();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.extend_from_slice(t),
                Part::Field {
                    slot,
                    segments,
                    default,
                } => match (record.get(*slot), default) {
                    (Some(v), _) => match segments {
                        Some(n) => out.extend_from_slice(first_segments(v, *n)),
                        None => out.extend_from_slice(v),
                    },
                    (None, Some(d)) => out.extend_from_slice(d),
                    (None, None) => return false,
                },
            }
        }
        true
    }
}

/// Route selects the requests a limit applies to: an optional method and a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Method, upper case (None: any).
    pub method: Option<Vec<u8>>,
    /// The path must start with this.
    pub prefix: Vec<u8>,
}

impl Route {
    /// Whether `record` is on this route.
    #[inline]
    pub fn matches(&self, record: &Record<'_>) -> bool {
        if let Some(m) = &self.method {
            match record.get(slot::METHOD) {
                Some(method) if method.eq_ignore_ascii_case(m) => {}
                _ => return false,
            }
        }
        record
            .get(slot::PATH)
            .is_some_and(|p| p.starts_with(&self.prefix))
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(m) = &self.method {
            write!(f, "{} ", String::from_utf8_lossy(m))?;
        }
        f.write_str(&String::from_utf8_lossy(&self.prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(fields: &[(usize, &'a str)]) -> Record<'a> {
        let mut r = Record::new(0);
        for (s, v) in fields {
            r.set(*s, v.as_bytes());
        }
        r
    }

    fn key(t: &Template, r: &Record<'_>) -> Option<String> {
        let mut out = Vec::new();
        t.render(r, &mut out)
            .then(|| String::from_utf8(out).unwrap())
    }

    #[test]
    fn templates_join_fields_and_text() {
        let mut schema = Schema::default();
        let r = rec(&[
            (slot::IP, "2001:db8::1"),
            (slot::USER, "alice"),
            (slot::PATH, "/api/v1/items/42"),
        ]);
        let t = Template::parse("{ip}", &mut schema).unwrap();
        assert_eq!(key(&t, &r).as_deref(), Some("2001:db8::1"));
        let t = Template::parse("u:{user}:{path:2}", &mut schema).unwrap();
        assert_eq!(key(&t, &r).as_deref(), Some("u:alice:/api/v1"));
        let t = Template::parse("{path:9}", &mut schema).unwrap();
        assert_eq!(key(&t, &r).as_deref(), Some("/api/v1/items/42"));
        let t = Template::parse("{path:1}", &mut schema).unwrap();
        assert_eq!(key(&t, &r).as_deref(), Some("/api"));
        assert!(schema.others.is_empty());
    }

    #[test]
    fn missing_fields_give_no_key_unless_defaulted() {
        let mut schema = Schema::default();
        let r = rec(&[(slot::IP, "10.0.0.1"), (slot::USER, "-")]);
        let t = Template::parse("{user}", &mut schema).unwrap();
        assert_eq!(key(&t, &r), None);
        let t = Template::parse("{user|anon}/{ip}", &mut schema).unwrap();
        assert_eq!(key(&t, &r).as_deref(), Some("anon/10.0.0.1"));
        let t = Template::parse("{ua}", &mut schema).unwrap();
        assert_eq!(key(&t, &r), None);
    }

    #[test]
    fn other_names_get_their_own_slots() {
        let mut schema = Schema::default();
        let t = Template::parse("{api_key}", &mut schema).unwrap();
        let t2 = Template::parse("{extra:1}-{api_key}", &mut schema).unwrap();
        assert_eq!(schema.others, ["api_key", "extra:1"]);
        assert_eq!(schema.extras(), vec![(KNOWN.len() + 1, 1)]);
        let mut r = Record::new(0);
        r.set(KNOWN.len(), b"k1");
        r.set(KNOWN.len() + 1, b"1.2.3.4");
        assert_eq!(key(&t, &r).as_deref(), Some("k1"));
        assert_eq!(key(&t2, &r).as_deref(), Some("1.2.3.4-k1"));
        assert_eq!(schema.slot("user_agent"), Ok(slot::UA));
    }

    #[test]
    fn bad_templates_are_refused() {
        let mut schema = Schema::default();
        for bad in [
            "",
            "ip",
            "{ip",
            "ip}",
            "{}",
            "{path:0}",
            "{path:x}",
            "{extra:0}",
        ] {
            assert!(Template::parse(bad, &mut schema).is_err(), "{bad}");
        }
    }

    #[test]
    fn routes_match_method_and_prefix() {
        let r = rec(&[(slot::METHOD, "POST"), (slot::PATH, "/login/form")]);
        let login = Route {
            method: Some(b"POST".to_vec()),
            prefix: b"/login".to_vec(),
        };
        assert!(login.matches(&r));
        let get = Route {
            method: Some(b"GET".to_vec()),
            prefix: b"/".to_vec(),
        };
        assert!(!get.matches(&r));
        let api = Route {
            method: None,
            prefix: b"/api".to_vec(),
        };
        assert!(!api.matches(&r));
        assert!(!api.matches(&rec(&[])));
    }

    #[test]
    fn request_lines_split() {
        assert_eq!(
            split_request(b"GET /a?b=1 HTTP/1.1"),
            Some((&b"GET"[..], &b"/a?b=1"[..], &b"HTTP/1.1"[..]))
        );
        assert_eq!(
            split_request(b"GET /a b HTTP/1.1"),
            Some((&b"GET"[..], &b"/a b"[..], &b"HTTP/1.1"[..]))
        );
        assert_eq!(
            split_request(b"GET /old"),
            Some((&b"GET"[..], &b"/old"[..], &b""[..]))
        );
        assert_eq!(split_request(b"-"), None);
        assert_eq!(split_request(b"\\x16\\x03\\x01 x"), None);
        assert_eq!(path_of(b"/a/b?c=d#e"), b"/a/b");
    }
}
