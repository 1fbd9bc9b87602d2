//! rl-loggen writes a synthetic access log for rl-replay's tests, demo and benchmark: a seeded
//! mix of ordinary visitors (sessions of page views with their assets, some logged in), an
//! office behind one NAT address, a few crawlers at a steady pace, and one abusive client that
//! hammers the login form and scrapes the API in bursts. The same seed gives the same log.
//!
//! Lines are written when a request ends and stamped with its start, as Apache does, so a few
//! are out of order by up to a few seconds (`--in-order` to avoid it).
//!
//! Output: Combined Log Format (default) or JSON lines in nginx's field names (`--format json`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, BufWriter, Write};

use chrono::DateTime;
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// Write a synthetic access log (Combined Log Format or JSON lines) to standard output.
#[derive(Parser, Debug)]
#[command(name = "rl-loggen", version)]
struct Cli {
    /// Lines to write.
    #[arg(long, default_value_t = 100_000)]
    lines: u64,
    /// Seed of the random mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Clf)]
    format: Format,
    /// Start, seconds since the Unix epoch (default 2025-11-03T00:00:00Z).
    #[arg(long, default_value_t = 1_762_128_000)]
    start: u64,
    /// Average lines per second from ordinary visitors (the log spans lines / (rate + ~6) s).
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Stamp and write lines in the same order (no out-of-order lines).
    #[arg(long)]
    in_order: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// Combined Log Format.
    Clf,
    /// JSON lines (nginx names: msec, remote_addr, request, …).
    Json,
}

const BROWSERS: [&str; 5] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
];
const CRAWLERS: [(&str, &str, u64); 4] = [
    (
        "192.0.2.10",
        "Mozilla/5.0 (compatible; ExampleBot/2.1; +https://bot.example.org/)",
        2,
    ),
    (
        "192.0.2.11",
        "Mozilla/5.0 (compatible; ExampleBot/2.1; +https://bot.example.org/)",
        2,
    ),
    (
        "192.0.2.77",
        "Mozilla/5.0 (compatible; SearchIndexer/1.0; \"polite\" crawler)",
        1,
    ),
    (
        "2001:db8:cafe::b07",
        "feed-fetcher/3.2 (+https://feeds.example.net)",
        1,
    ),
];
const ABUSER: &str = "203.0.113.66";
const OFFICE: &str = "198.51.100.23";
const ASSETS: [&str; 6] = [
    "/static/app.3f9c2b.js",
    "/static/vendor.a81e07.js",
    "/static/style.5d2e1c.css",
    "/favicon.ico",
    "/img/logo.svg",
    "/fonts/inter.woff2",
];

struct Request {
    start: u64,
    end: u64,
    ip: String,
    user: Option<String>,
    method: &'static str,
    target: String,
    status: u16,
    bytes: u64,
    referer: Option<String>,
    ua: String,
}

enum Kind {
    /// Spawns visitors.
    Arrivals,
    /// One visitor's session.
    Visitor {
        ip: String,
        user: Option<String>,
        ua: &'static str,
        pages_left: u32,
        assets_left: u32,
        page: String,
    },
    /// A crawler at a steady pace.
    Crawler { index: usize, next_id: u64 },
    /// The abusive client.
    Abuser { n: u64 },
}

struct Sim {
    rng: StdRng,
    actors: Vec<Option<Kind>>,
    free: Vec<usize>,
    queue: BinaryHeap<Reverse<(u64, usize)>>,
    start: u64,
    span: u64,
    session_gap: f64,
}

fn exp(rng: &mut StdRng, mean_s: f64) -> u64 {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    (-u.ln() * mean_s * 1e9) as u64
}

fn visitor_ip(rng: &mut StdRng) -> String {
    if rng.gen_bool(0.15) {
        format!(
            "2001:db8:{:x}:{:x}::{:x}",
            rng.gen_range(0..0x40u32),
            rng.gen_range(0..0x10000u32),
            rng.gen_range(1..0x10000u32)
        )
    } else {
        // A pool of ~40,000 addresses, so that visitors come back.
        let n: u32 = rng.gen_range(0..40_000);
        format!("10.{}.{}.{}", 16 + n / 65_536, (n / 256) % 256, n % 256 + 1)
    }
}

impl Sim {
    fn add(&mut self, kind: Kind, at: u64) {
        let id = match self.free.pop() {
            Some(id) => {
                self.actors[id] = Some(kind);
                id
            }
            None => {
                self.actors.push(Some(kind));
                self.actors.len() - 1
            }
        };
        self.queue.push(Reverse((at, id)));
    }

    /// Whether the abuser is in one of its bursts at `t`.
    fn abusing(&self, t: u64) -> bool {
        let f = (t - self.start) as f64 / self.span as f64;
        (0.20..0.23).contains(&f) || (0.55..0.56).contains(&f) || (0.80..0.86).contains(&f)
    }

    /// Runs the actor due at `t`; returns the request it makes, if any, and reschedules it.
    fn step(&mut self, t: u64, id: usize) -> Option<Request> {
        let kind = self.actors[id].take()?;
        let attacking = self.abusing(t);
        let rng = &mut self.rng;
        let duration = |rng: &mut StdRng| {
            if rng.gen_bool(0.01) {
                rng.gen_range(S..6 * S)
            } else {
                rng.gen_range(MS..150 * MS)
            }
        };
        match kind {
            Kind::Arrivals => {
                let ip;
                let user;
                let ua;
                if rng.gen_bool(0.08) {
                    ip = OFFICE.to_owned();
                    user = Some(format!("staff{:02}", rng.gen_range(1..=40)));
                    ua = BROWSERS[rng.gen_range(0..2)];
                } else {
                    ip = visitor_ip(rng);
                    user = rng
                        .gen_bool(0.3)
                        .then(|| format!("user{}", rng.gen_range(1..30_000)));
                    ua = BROWSERS[rng.gen_range(0..BROWSERS.len())];
                }
                let pages = 1 + (exp(rng, 4.0) / S) as u32;
                let gap = exp(rng, self.session_gap);
                self.add(
                    Kind::Visitor {
                        ip,
                        user,
                        ua,
                        pages_left: pages,
                        assets_left: 0,
                        page: String::new(),
                    },
                    t,
                );
                self.actors[id] = Some(Kind::Arrivals);
                self.queue.push(Reverse((t + gap, id)));
                None
            }
            Kind::Visitor {
                ip,
                user,
                ua,
                mut pages_left,
                mut assets_left,
                mut page,
            } => {
                let req;
                let next;
                if assets_left > 0 {
                    assets_left -= 1;
                    let asset = ASSETS[rng.gen_range(0..ASSETS.len())];
                    let status = if rng.gen_bool(0.4) { 304 } else { 200 };
                    req = Request {
                        start: t,
                        end: t + duration(rng),
                        ip: ip.clone(),
                        user: user.clone(),
                        method: "GET",
                        target: asset.to_owned(),
                        status,
                        bytes: if status == 304 {
                            0
                        } else {
                            rng.gen_range(300..90_000)
                        },
                        referer: Some(format!("https://shop.example.com{page}")),
                        ua: ua.to_owned(),
                    };
                    next = if assets_left > 0 {
                        t + rng.gen_range(5 * MS..400 * MS)
                    } else {
                        t + exp(rng, 15.0) + S
                    };
                } else {
                    pages_left -= 1;
                    let (method, target, status) = match rng.gen_range(0..100) {
                        0..=19 => ("GET", "/".to_owned(), 200),
                        20..=49 => (
                            "GET",
                            format!("/products/{}", rng.gen_range(1..5000)),
                            if rng.gen_bool(0.02) { 404 } else { 200 },
                        ),
                        50..=64 => (
                            "GET",
                            format!("/search?q=item+{}&page=1", rng.gen_range(1..300)),
                            200,
                        ),
                        65..=79 => (
                            "GET",
                            format!("/api/v1/items/{}", rng.gen_range(1..5000)),
                            200,
                        ),
                        80..=87 if user.is_some() => ("GET", "/account/orders".to_owned(), 200),
                        80..=87 => ("POST", "/login".to_owned(), 302),
                        88..=93 => ("POST", "/api/v1/cart".to_owned(), 201),
                        _ => ("GET", "/cart".to_owned(), 200),
                    };
                    let referer =
                        (!page.is_empty()).then(|| format!("https://shop.example.com{page}"));
                    page = target.split('?').next().unwrap_or("/").to_owned();
                    req = Request {
                        start: t,
                        end: t + duration(rng),
                        ip: ip.clone(),
                        user: user.clone(),
                        method,
                        target,
                        status,
                        bytes: rng.gen_range(500..60_000),
                        referer,
                        ua: ua.to_owned(),
                    };
                    assets_left = if method == "GET" && !req.target.starts_with("/api") {
                        rng.gen_range(0..7)
                    } else {
                        0
                    };
                    next = if assets_left > 0 {
                        t + rng.gen_range(20 * MS..300 * MS)
                    } else {
                        t + exp(rng, 15.0) + S
                    };
                }
                if pages_left > 0 || assets_left > 0 {
                    self.actors[id] = Some(Kind::Visitor {
                        ip,
                        user,
                        ua,
                        pages_left,
                        assets_left,
                        page,
                    });
                    self.queue.push(Reverse((next, id)));
                } else {
                    self.free.push(id);
                }
                Some(req)
            }
            Kind::Crawler { index, next_id } => {
                let (ip, ua, per_s) = CRAWLERS[index];
                let target = if next_id % 50 == 0 {
                    "/sitemap.xml".to_owned()
                } else {
                    format!("/products/{}", next_id % 5000 + 1)
                };
                let req = Request {
                    start: t,
                    end: t + duration(rng),
                    ip: ip.to_owned(),
                    user: None,
                    method: "GET",
                    target,
                    status: 200,
                    bytes: rng.gen_range(2000..60_000),
                    referer: None,
                    ua: ua.to_owned(),
                };
                // A steady pace with jitter, and now and then a fast run through a sitemap.
                let fast = next_id % 500 < 40;
                let gap = if fast { S / (per_s * 6) } else { S / per_s };
                let jitter = rng.gen_range(0..gap / 2);
                self.actors[id] = Some(Kind::Crawler {
                    index,
                    next_id: next_id + 1,
                });
                self.queue.push(Reverse((t + gap / 2 + jitter, id)));
                Some(req)
            }
            Kind::Abuser { n } => {
                self.actors[id] = Some(Kind::Abuser { n: n + 1 });
                if !attacking {
                    // Idle: look again in a second.
                    self.queue.push(Reverse((t + S, id)));
                    return None;
                }
                let login = n % 10 < 7;
                let req = Request {
                    start: t,
                    end: t + rng.gen_range(MS..40 * MS),
                    ip: ABUSER.to_owned(),
                    user: None,
                    method: if login { "POST" } else { "GET" },
                    target: if login {
                        "/login".to_owned()
                    } else {
                        format!("/api/v1/items/{}", n % 5000 + 1)
                    },
                    status: if login { 401 } else { 200 },
                    bytes: rng.gen_range(100..3000),
                    referer: None,
                    ua: "python-requests/2.31.0".to_owned(),
                };
                // About 25 requests per second.
                self.queue
                    .push(Reverse((t + rng.gen_range(10 * MS..70 * MS), id)));
                Some(req)
            }
        }
    }
}

struct Writer<W: Write> {
    out: W,
    format: Format,
    second: u64,
    stamp: String,
}

impl<W: Write> Writer<W> {
    fn write(&mut self, r: &Request) -> io::Result<()> {
        match self.format {
            Format::Clf => {
                let sec = r.start / S;
                if sec != self.second || self.stamp.is_empty() {
                    self.second = sec;
                    self.stamp = DateTime::from_timestamp(sec as i64, 0)
                        .map(|t| t.format("%d/%b/%Y:%H:%M:%S +0000").to_string())
                        .unwrap_or_default();
                }
                writeln!(
                    self.out,
                    "{} - {} [{}] \"{} {} HTTP/1.1\" {} {} \"{}\" \"{}\"",
                    r.ip,
                    r.user.as_deref().unwrap_or("-"),
                    self.stamp,
                    r.method,
                    r.target,
                    r.status,
                    r.bytes,
                    r.referer.as_deref().unwrap_or("-"),
                    r.ua.replace('"', "\\\"")
                )
            }
            Format::Json => {
                let line = serde_json::json!({
                    "msec": format!("{}.{:03}", r.start / S, (r.start % S) / MS),
                    "remote_addr": r.ip,
                    "remote_user": r.user.as_deref().unwrap_or(""),
                    "request": format!("{} {} HTTP/1.1", r.method, r.target),
                    "status": r.status,
                    "body_bytes_sent": r.bytes,
                    "http_referer": r.referer.as_deref().unwrap_or(""),
                    "http_user_agent": r.ua,
                });
                serde_json::to_writer(&mut self.out, &line)?;
                self.out.write_all(b"\n")
            }
        }
    }
}

fn main() -> io::Result<()> {
    let cli = Cli::parse();
    let start = cli.start * S;
    // Crawlers add ~6 lines/s, the abuser ~25/s for 10 % of the time.
    let total_rate = cli.rate as f64 + 6.0 + 2.5;
    let span = ((cli.lines as f64 / total_rate) * 1e9) as u64 + S;
    // A session makes ~5 pages × ~4 requests: sessions arrive at rate / 20 per second.
    let session_gap = 20.0 / cli.rate.max(1) as f64;
    let mut sim = Sim {
        rng: StdRng::seed_from_u64(cli.seed),
        actors: Vec::new(),
        free: Vec::new(),
        queue: BinaryHeap::new(),
        start,
        span,
        session_gap,
    };
    sim.add(Kind::Arrivals, start);
    for index in 0..CRAWLERS.len() {
        sim.add(
            Kind::Crawler {
                index,
                next_id: index as u64 * 777,
            },
            start + index as u64 * 137 * MS,
        );
    }
    sim.add(Kind::Abuser { n: 0 }, start);
    let stdout = io::stdout().lock();
    let mut w = Writer {
        out: BufWriter::with_capacity(1 << 20, stdout),
        format: cli.format,
        second: 0,
        stamp: String::new(),
    };
    // Requests wait here until they end (lines are written at the end, stamped with the start).
    let mut ending: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut pending: Vec<Option<Request>> = Vec::new();
    let mut free_slots: Vec<usize> = Vec::new();
    let mut written = 0u64;
    let mut seq = 0u64;
    while written < cli.lines {
        let Some(Reverse((t, id))) = sim.queue.pop() else {
            break;
        };
        while let Some(&Reverse((end, _, slot))) = ending.peek() {
            if end > t || written >= cli.lines {
                break;
            }
            ending.pop();
            if let Some(r) = pending[slot].take() {
                w.write(&r)?;
                written += 1;
            }
            free_slots.push(slot);
        }
        if let Some(req) = sim.step(t, id) {
            if cli.in_order {
                w.write(&req)?;
                written += 1;
            } else {
                let slot = free_slots.pop().unwrap_or_else(|| {
                    pending.push(None);
                    pending.len() - 1
                });
                seq += 1;
                ending.push(Reverse((req.end, seq, slot)));
                pending[slot] = Some(req);
            }
        }
    }
    w.out.flush()
}
