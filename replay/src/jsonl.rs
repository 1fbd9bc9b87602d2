//! jsonl reads JSON lines: one object per line, with configurable field names.
//!
//! Each logical field (`time`, `ip`, `user`, `method`, `path`, …) is looked up under the name
//! given with `--field NAME=JSON_NAME`, else under common names (nginx's `remote_addr`,
//! `request_uri`, Caddy's `request.remote_ip`, …). Dotted names reach into nested objects;
//! an array value (Caddy's header lists) gives its first element; numbers and booleans give
//! their text. Times: epoch numbers (unit guessed or given), RFC 3339, or the CLF format.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::record::{path_of, present, slot, split_request, Record, Schema, KNOWN};
use crate::timestamp::{self, Unit};

/// Why a JSON line was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// Not a JSON object.
    NotObject(String),
    /// No time field under any of the names tried.
    NoTime,
    /// The time field's value is not a time.
    BadTime,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotObject(e) => write!(f, "not a JSON object ({e})"),
            Self::NoTime => f.write_str("missing time field"),
            Self::BadTime => f.write_str("bad timestamp"),
        }
    }
}

/// Object is a JSON object's top-level members, in order, values left unparsed (a few
/// members: a linear scan beats hashing).
struct Object<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Object<'a> {
    fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Object<'de>, M::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(entry) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(Object(members))
            }
        }
        d.deserialize_map(Members)
    }
}

/// Names tried, in order, for each logical field when none is configured.
fn defaults(field: &str) -> &'static [&'static str] {
    match field {
        "time" => &[
            "time",
            "timestamp",
            "ts",
            "@timestamp",
            "time_iso8601",
            "time_local",
            "msec",
        ],
        "ip" => &[
            "ip",
            "remote_addr",
            "client_ip",
            "remote_ip",
            "request.client_ip",
            "request.remote_ip",
        ],
        "user" => &["user", "remote_user", "user_id", "request.user"],
        "ident" => &["ident"],
        "method" => &["method", "request_method", "request.method"],
        "path" => &["path", "request_path"],
        "uri" => &["uri", "request_uri", "url", "request.uri"],
        "protocol" => &["protocol", "server_protocol", "request.proto"],
        "request" => &["request"],
        "status" => &["status", "response_status"],
        "bytes" => &["bytes", "body_bytes_sent", "size"],
        "referer" => &[
            "referer",
            "referrer",
            "http_referer",
            "request.headers.Referer",
        ],
        "ua" => &[
            "ua",
            "user_agent",
            "http_user_agent",
            "request.headers.User-Agent",
        ],
        _ => &[],
    }
}

/// Parser reads JSON lines for a schema.
pub struct Parser {
    /// For each slot, the names to try (empty: the run does not read the slot).
    names: Vec<Vec<String>>,
    time_names: Vec<String>,
    unit: Unit,
}

fn text_of(raw: &RawValue) -> Option<Cow<'_, [u8]>> {
    let s = raw.get().trim();
    match s.as_bytes().first()? {
        b'"' => {
            let v: Cow<'_, str> = serde_json::from_str(s).ok()?;
            Some(match v {
                Cow::Borrowed(b) => Cow::Borrowed(b.as_bytes()),
                Cow::Owned(o) => Cow::Owned(o.into_bytes()),
            })
        }
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(s).ok()?;
            text_of(items.first()?)
        }
        b'{' => None,
        b'n' => None, // null
        _ => Some(Cow::Borrowed(s.as_bytes())),
    }
}

/// Finds `name` in `obj`: the whole name first, then dotted steps into nested objects.
fn lookup<'a>(obj: &Object<'a>, name: &str) -> Option<&'a RawValue> {
    if let Some(v) = obj.get(name) {
        return Some(v);
    }
    let (head, rest) = name.split_once('.')?;
    let raw = obj.get(head)?.get();
    if !raw.trim_start().starts_with('{') {
        return None;
    }
    let inner: Object<'a> = serde_json::from_str(raw).ok()?;
    lookup(&inner, rest)
}

impl Parser {
    /// A parser for `schema`, with `fields` mapping logical names to JSON names
    /// (`("ip", "client.address")`), and `unit` for numeric times.
    pub fn new(schema: &Schema, fields: &[(String, String)], unit: Unit) -> Self {
        let configured = |field: &str| -> Vec<String> {
            match fields.iter().rev().find(|(k, _)| k == field) {
                Some((_, v)) => vec![v.clone()],
                None => {
                    let d = defaults(field);
                    if d.is_empty() {
                        vec![field.to_owned()]
                    } else {
                        d.iter().map(|s| (*s).to_owned()).collect()
                    }
                }
            }
        };
        // Look up only what templates and routes read, plus what the path, method and
        // protocol can be derived from.
        let used = &schema.used;
        let derived = used[slot::PATH] || used[slot::METHOD] || used[slot::PROTOCOL];
        let wanted = |i: usize| {
            used[i]
                || (i == slot::URI && used[slot::PATH])
                || (i == slot::REQUEST && (derived || used[slot::URI]))
        };
        let names = KNOWN
            .iter()
            .enumerate()
            .map(|(i, k)| if wanted(i) { configured(k) } else { Vec::new() })
            .chain(schema.others.iter().map(|o| configured(o)))
            .collect();
        Self {
            names,
            time_names: configured("time"),
            unit,
        }
    }

    /// Parses one line.
    pub fn parse<'a>(&mut self, line: &'a [u8]) -> Result<Record<'a>, Malformed> {
        let obj: Object<'a> =
            serde_json::from_slice(line).map_err(|e| Malformed::NotObject(e.to_string()))?;
        let raw_time = self
            .time_names
            .iter()
            .find_map(|n| lookup(&obj, n))
            .ok_or(Malformed::NoTime)?;
        let time_text = text_of(raw_time).ok_or(Malformed::BadTime)?;
        let time_text = std::str::from_utf8(&time_text).map_err(|_| Malformed::BadTime)?;
        let time_ns = timestamp::parse_any(time_text, self.unit).ok_or(Malformed::BadTime)?;
        let mut rec = Record::new(time_ns);
        for (s, names) in self.names.iter().enumerate() {
            let value = names.iter().find_map(|n| lookup(&obj, n)).and_then(text_of);
            rec.slots[s] = value.filter(|v| present(v).is_some());
        }
        // Fill what the request line or the target tells when the log has no own field.
        if let Some(request) = rec.slots[slot::REQUEST].clone() {
            if let Some((m, target, p)) = split_request(&request) {
                for (s, v) in [(slot::METHOD, m), (slot::URI, target), (slot::PROTOCOL, p)] {
                    if rec.slots[s].is_none() && present(v).is_some() {
                        rec.slots[s] = Some(Cow::Owned(v.to_vec()));
                    }
                }
            }
        }
        if rec.slots[slot::PATH].is_none() {
            if let Some(uri) = &rec.slots[slot::URI] {
                rec.slots[slot::PATH] = Some(Cow::Owned(path_of(uri).to_vec()));
            }
        } else if let Some(p) = &rec.slots[slot::PATH] {
            // A path field may still carry a query string.
            let cut = path_of(p).len();
            if cut < p.len() {
                rec.slots[slot::PATH] = Some(Cow::Owned(p[..cut].to_vec()));
            }
        }
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// A schema that reads every known field.
    fn everything() -> Schema {
        let mut schema = Schema::default();
        for k in KNOWN {
            schema.slot(k).unwrap();
        }
        schema
    }

    fn get(r: &Record<'_>, s: usize) -> Option<String> {
        r.get(s).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn nginx_style_json() {
        let p = &mut Parser::new(&everything(), &[], Unit::Auto);
        let r = p
            .parse(
                br#"{"msec":"1764567890.123","remote_addr":"2001:db8::1","remote_user":"","request":"GET /a/b?x=1 HTTP/1.1","status":200,"http_user_agent":"say \"hi\""}"#,
            )
            .unwrap();
        assert_eq!(r.time_ns, 1_764_567_890 * S + 123_000_000);
        assert_eq!(get(&r, slot::IP).as_deref(), Some("2001:db8::1"));
        assert_eq!(get(&r, slot::USER), None);
        assert_eq!(get(&r, slot::METHOD).as_deref(), Some("GET"));
        assert_eq!(get(&r, slot::PATH).as_deref(), Some("/a/b"));
        assert_eq!(get(&r, slot::STATUS).as_deref(), Some("200"));
        assert_eq!(get(&r, slot::UA).as_deref(), Some("say \"hi\""));
    }

    #[test]
    fn caddy_style_nested_json() {
        let mut schema = everything();
        let key = schema.slot("request.headers.X-Api-Key").unwrap();
        let p = &mut Parser::new(&schema, &[], Unit::Auto);
        let r = p
            .parse(
                br#"{"ts":1646861401.5241024,"request":{"remote_ip":"10.0.0.5","method":"POST","uri":"/login?next=/","headers":{"X-Api-Key":["k-1"],"User-Agent":["curl/8"]}},"status":401}"#,
            )
            .unwrap();
        assert_eq!(r.time_ns, 1_646_861_401 * S + 524_102_400);
        assert_eq!(get(&r, slot::IP).as_deref(), Some("10.0.0.5"));
        assert_eq!(get(&r, slot::PATH).as_deref(), Some("/login"));
        assert_eq!(get(&r, slot::UA).as_deref(), Some("curl/8"));
        assert_eq!(get(&r, key).as_deref(), Some("k-1"));
    }

    #[test]
    fn configured_names_and_units() {
        let mut schema = everything();
        let tenant = schema.slot("tenant").unwrap();
        let fields = vec![
            ("time".to_owned(), "when".to_owned()),
            ("ip".to_owned(), "client".to_owned()),
            ("tenant".to_owned(), "org.id".to_owned()),
        ];
        let p = &mut Parser::new(&schema, &fields, Unit::Ms);
        let r = p
            .parse(br#"{"when":1764567890123,"client":"::1","org":{"id":42},"ip":"nope"}"#)
            .unwrap();
        assert_eq!(r.time_ns, 1_764_567_890_123 * 1_000_000);
        assert_eq!(get(&r, slot::IP).as_deref(), Some("::1"));
        assert_eq!(get(&r, tenant).as_deref(), Some("42"));
        let r = p
            .parse(br#"{"when":"2025-12-01T05:24:50.5+00:00","client":"::1"}"#)
            .unwrap();
        assert_eq!(r.time_ns, 1_764_566_690 * S + S / 2);
    }

    #[test]
    fn only_the_fields_a_run_reads_are_looked_up() {
        let mut schema = Schema::default();
        schema.slot("path").unwrap();
        let p = &mut Parser::new(&schema, &[], Unit::Auto);
        let r = p
            .parse(br#"{"time":1,"ip":"::1","request":"POST /a/b?c HTTP/1.1","ua":"x"}"#)
            .unwrap();
        assert_eq!(get(&r, slot::PATH).as_deref(), Some("/a/b"));
        assert_eq!(get(&r, slot::IP), None);
        assert_eq!(get(&r, slot::UA), None);
    }

    #[test]
    fn bad_json_lines() {
        let p = &mut Parser::new(&Schema::default(), &[], Unit::Auto);
        assert!(matches!(p.parse(b"[1,2]"), Err(Malformed::NotObject(_))));
        assert!(matches!(
            p.parse(b"{\"time\":1"),
            Err(Malformed::NotObject(_))
        ));
        assert_eq!(
            p.parse(br#"{"ip":"1.2.3.4"}"#).err(),
            Some(Malformed::NoTime)
        );
        assert_eq!(
            p.parse(br#"{"time":"yesterday"}"#).err(),
            Some(Malformed::BadTime)
        );
        assert_eq!(p.parse(br#"{"time":-5}"#).err(), Some(Malformed::BadTime));
        assert_eq!(p.parse(br#"{"time":null}"#).err(), Some(Malformed::BadTime));
        assert_eq!(
            p.parse(br#"{"time":"10/Oct/2000:13:55:36 -0700"}"#)
                .unwrap()
                .time_ns,
            971_211_336 * S
        );
    }
}
