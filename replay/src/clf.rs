//! clf parses the Common Log Format and the Combined Log Format (the defaults of Apache's
//! `common`/`combined` and nginx's `combined`), by hand: no regex, one pass over the line.
//!
//! `host ident user [dd/Mon/yyyy:HH:MM:SS ±zzzz] "request" status bytes` then, in Combined,
//! `"referer" "user-agent"`, then any further fields (quoted or not), which templates reach as
//! `{extra:N}`. Quoted fields may hold escapes: Apache writes `\"` and `\\`, nginx `\x22`; the
//! values are kept as logged (a key is an identity, not a display string).

use crate::record::{path_of, slot, split_request, Record};
use crate::timestamp::ClfCache;

/// Why a line is not a Common/Combined line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// The line is empty.
    Empty,
    /// A field is missing (named).
    Missing(&'static str),
    /// The time is not `dd/Mon/yyyy:HH:MM:SS ±zzzz`.
    BadTime,
    /// A quoted field has no closing quote (named).
    Unterminated(&'static str),
    /// The status is not a number.
    BadStatus,
    /// The byte count is neither a number nor `-`.
    BadBytes,
    /// Something follows a field where a space should (named).
    Junk(&'static str),
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("empty line"),
            Self::Missing(what) => write!(f, "missing {what}"),
            Self::BadTime => f.write_str("bad timestamp"),
            Self::Unterminated(what) => write!(f, "unterminated quote in {what}"),
            Self::BadStatus => f.write_str("bad status"),
            Self::BadBytes => f.write_str("bad byte count"),
            Self::Junk(what) => write!(f, "unexpected text after {what}"),
        }
    }
}

/// Parser reads Common/Combined lines; it caches the last times it parsed.
#[derive(Default)]
pub struct Parser {
    cache: ClfCache,
    /// `(slot, N)` for each `{extra:N}` the templates use.
    extras: Vec<(usize, usize)>,
}

/// Returns the index just past the closing quote of a quoted field that starts at
/// `line[start] == '"'`, honouring backslash escapes.
#[inline]
fn quoted_end(line: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        let j = i + memchr::memchr2(b'"', b'\\', &line[i..])?;
        if line[j] == b'"' {
            return Some(j + 1);
        }
        i = j + 2; // skip the escaped byte
        if i > line.len() {
            return None;
        }
    }
}

#[inline]
fn is_digits(b: &[u8]) -> bool {
    !b.is_empty() && b.iter().all(u8::is_ascii_digit)
}

impl Parser {
    /// A parser that also reads the `{extra:N}` fields listed as `(slot, N)`.
    pub fn new(extras: Vec<(usize, usize)>) -> Self {
        Self {
            cache: ClfCache::default(),
            extras,
        }
    }

    /// Parses one line (without its newline; a trailing `\r` is ignored).
    pub fn parse<'a>(&mut self, line: &'a [u8]) -> Result<Record<'a>, Malformed> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return Err(Malformed::Empty);
        }
        // host ident user [
        let sp1 = memchr::memchr(b' ', line).ok_or(Malformed::Missing("ident"))?;
        let host = &line[..sp1];
        if host.is_empty() {
            return Err(Malformed::Missing("host"));
        }
        let after_host = sp1 + 1;
        let sp2 = after_host
            + memchr::memchr(b' ', &line[after_host..]).ok_or(Malformed::Missing("user"))?;
        let ident = &line[after_host..sp2];
        // The user runs to " [" (user names may hold spaces).
        let open = sp2
            + 1
            + memchr::memmem::find(&line[sp2 + 1..], b" [").ok_or(Malformed::Missing("time"))?;
        let user = &line[sp2 + 1..open];
        let t_start = open + 2;
        let close = t_start + 26;
        if line.get(close) != Some(&b']') {
            return Err(Malformed::BadTime);
        }
        let time_ns = self
            .cache
            .parse(&line[t_start..close])
            .ok_or(Malformed::BadTime)?;
        let mut rec = Record::new(time_ns);
        rec.set(slot::IP, host);
        rec.set(slot::IDENT, ident);
        rec.set(slot::USER, user);
        // "request"
        let mut i = close + 1;
        if line.get(i) != Some(&b' ') || line.get(i + 1) != Some(&b'"') {
            return Err(Malformed::Missing("request"));
        }
        let r_end = quoted_end(line, i + 1).ok_or(Malformed::Unterminated("request"))?;
        let request = &line[i + 2..r_end - 1];
        rec.set(slot::REQUEST, request);
        if let Some((method, target, protocol)) = split_request(request) {
            rec.set(slot::METHOD, method);
            rec.set(slot::URI, target);
            rec.set(slot::PATH, path_of(target));
            rec.set(slot::PROTOCOL, protocol);
        }
        // status bytes
        i = r_end;
        if line.get(i) != Some(&b' ') {
            return Err(if i >= line.len() {
                Malformed::Missing("status")
            } else {
                Malformed::Junk("request")
            });
        }
        let s_start = i + 1;
        let s_end = memchr::memchr(b' ', &line[s_start..]).map_or(line.len(), |p| s_start + p);
        let status = &line[s_start..s_end];
        if !is_digits(status) {
            return Err(if status.is_empty() {
                Malformed::Missing("status")
            } else {
                Malformed::BadStatus
            });
        }
        rec.set(slot::STATUS, status);
        if s_end >= line.len() {
            return Err(Malformed::Missing("bytes"));
        }
        let b_start = s_end + 1;
        let b_end = memchr::memchr(b' ', &line[b_start..]).map_or(line.len(), |p| b_start + p);
        let bytes = &line[b_start..b_end];
        if !(is_digits(bytes) || bytes == b"-") {
            return Err(Malformed::BadBytes);
        }
        rec.set(slot::BYTES, bytes);
        // Combined: "referer" "user-agent"; then anything.
        i = b_end;
        let mut field = 0usize;
        while i < line.len() {
            // line[i] is the space before the next field.
            let start = i + 1;
            if start >= line.len() {
                break; // a trailing space
            }
            let (value, end, what) = if line[start] == b'"' {
                let what = match field {
                    0 => "referer",
                    1 => "user agent",
                    _ => "an extra field",
                };
                let end = quoted_end(line, start).ok_or(Malformed::Unterminated(what))?;
                (&line[start + 1..end - 1], end, what)
            } else {
                let end = memchr::memchr(b' ', &line[start..]).map_or(line.len(), |p| start + p);
                (&line[start..end], end, "a field")
            };
            if end < line.len() && line[end] != b' ' {
                return Err(Malformed::Junk(what));
            }
            match field {
                0 => rec.set(slot::REFERER, value),
                1 => rec.set(slot::UA, value),
                n => {
                    for &(s, want) in &self.extras {
                        if want == n - 1 {
                            rec.set(s, value);
                        }
                    }
                }
            }
            field += 1;
            i = end;
        }
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::KNOWN;

    const T: u64 = 971_211_336_000_000_000; // 10/Oct/2000:13:55:36 -0700

    fn get(r: &Record<'_>, s: usize) -> Option<String> {
        r.get(s).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    fn parse(line: &str) -> Result<Record<'_>, Malformed> {
        Parser::new(vec![(KNOWN.len(), 1)]).parse(line.as_bytes())
    }

    #[test]
    fn common_log_format() {
        let r = parse(
            r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326"#,
        )
        .unwrap();
        assert_eq!(r.time_ns, T);
        assert_eq!(get(&r, slot::IP).as_deref(), Some("127.0.0.1"));
        assert_eq!(get(&r, slot::IDENT), None);
        assert_eq!(get(&r, slot::USER).as_deref(), Some("frank"));
        assert_eq!(get(&r, slot::METHOD).as_deref(), Some("GET"));
        assert_eq!(get(&r, slot::PATH).as_deref(), Some("/apache_pb.gif"));
        assert_eq!(get(&r, slot::PROTOCOL).as_deref(), Some("HTTP/1.0"));
        assert_eq!(get(&r, slot::STATUS).as_deref(), Some("200"));
        assert_eq!(get(&r, slot::BYTES).as_deref(), Some("2326"));
        assert_eq!(get(&r, slot::UA), None);
    }

    #[test]
    fn combined_with_ipv6_query_and_extra() {
        let r = parse(
            "2001:db8::7 - - [10/Oct/2000:13:55:36 -0700] \"POST /api/v1/x?id=3 HTTP/2.0\" 429 0 \
             \"https://example.com/\" \"curl/8.0\" \"203.0.113.9\"\r",
        )
        .unwrap();
        assert_eq!(get(&r, slot::IP).as_deref(), Some("2001:db8::7"));
        assert_eq!(get(&r, slot::USER), None);
        assert_eq!(get(&r, slot::PATH).as_deref(), Some("/api/v1/x"));
        assert_eq!(get(&r, slot::URI).as_deref(), Some("/api/v1/x?id=3"));
        assert_eq!(
            get(&r, slot::REFERER).as_deref(),
            Some("https://example.com/")
        );
        assert_eq!(get(&r, slot::UA).as_deref(), Some("curl/8.0"));
        assert_eq!(get(&r, KNOWN.len()).as_deref(), Some("203.0.113.9"));
    }

    #[test]
    fn escaped_quotes_apache_and_nginx() {
        // Apache: \" inside the request and the user agent.
        let r = parse(
            r#"::1 - - [10/Oct/2000:13:55:36 -0700] "GET /a\"b HTTP/1.1" 404 - "-" "Mozilla \"x\" \\""#,
        )
        .unwrap();
        assert_eq!(get(&r, slot::PATH).as_deref(), Some(r#"/a\"b"#));
        assert_eq!(get(&r, slot::UA).as_deref(), Some(r#"Mozilla \"x\" \\"#));
        assert_eq!(get(&r, slot::REFERER), None);
        assert_eq!(get(&r, slot::BYTES), None);
        // nginx: \x22 for a quote, and binary junk as the request line.
        let r = parse(
            r#"10.1.1.1 - - [10/Oct/2000:13:55:36 -0700] "\x16\x03\x01\x00\xA5" 400 157 "-" "say \x22hi\x22""#,
        )
        .unwrap();
        assert_eq!(get(&r, slot::METHOD), None);
        assert_eq!(get(&r, slot::PATH), None);
        assert_eq!(
            get(&r, slot::REQUEST).as_deref(),
            Some(r"\x16\x03\x01\x00\xA5")
        );
        assert_eq!(get(&r, slot::UA).as_deref(), Some(r"say \x22hi\x22"));
    }

    #[test]
    fn dash_fields_and_spaces_in_user() {
        let r = parse(r#"- - john smith [10/Oct/2000:13:55:36 -0700] "-" 408 -"#).unwrap();
        assert_eq!(get(&r, slot::IP), None);
        assert_eq!(get(&r, slot::USER).as_deref(), Some("john smith"));
        assert_eq!(get(&r, slot::REQUEST), None);
    }

    #[test]
    fn malformed_lines_say_why() {
        let table: &[(&str, Malformed)] = &[
            ("", Malformed::Empty),
            ("garbage", Malformed::Missing("ident")),
            ("1.2.3.4 - -", Malformed::Missing("time")),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36] "GET / HTTP/1.1" 200 1"#,
                Malformed::BadTime,
            ),
            (
                r#"1.2.3.4 - - [32/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1"#,
                Malformed::BadTime,
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] GET / 200 1"#,
                Malformed::Missing("request"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1 200 1"#,
                Malformed::Unterminated("request"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET \" 200 1"#,
                Malformed::Unterminated("request"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1""#,
                Malformed::Missing("status"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200"#,
                Malformed::Missing("bytes"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" OK 1"#,
                Malformed::BadStatus,
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1k"#,
                Malformed::BadBytes,
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-" "curl"#,
                Malformed::Unterminated("user agent"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1"x 200 1"#,
                Malformed::Junk("request"),
            ),
            (
                r#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-"x "ua""#,
                Malformed::Junk("referer"),
            ),
        ];
        for (line, want) in table {
            assert_eq!(parse(line).err(), Some(*want), "{line}");
        }
    }
}
