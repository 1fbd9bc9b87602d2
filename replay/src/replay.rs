//! replay runs parsed requests, in time order, through the limits: it keys each request,
//! puts lines that arrive out of order back in order (within the allowed skew), decides every
//! request with [`crate::engine::decide_all`] (RL.ALL's rule) and keeps the counts the report
//! needs. A `--suggest` sweep runs alongside as extra lanes: the same requests through the
//! same limits with one limit resized.

use std::collections::VecDeque;
use std::io::Write;

use serde::Serialize;

use crate::engine::{decide_all, Limit, Outcome, Table};
use crate::intern::Interner;
use crate::record::{Record, Route, Template};

/// The most limits one run applies together.
pub const MAX_LIMITS: usize = 8;
const NONE: u32 = u32::MAX;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// LimitDef is one `--limit`: the spec, the key template and an optional route.
#[derive(Debug, Clone)]
pub struct LimitDef {
    /// The spec.
    pub limit: Limit,
    /// How a request's key is built.
    pub template: Template,
    /// Which requests the limit applies to (None: all).
    pub route: Option<Route>,
}

impl std::fmt::Display for LimitDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} per {}", self.limit, self.template)?;
        if let Some(r) = &self.route {
            write!(f, " on {r}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
struct Event {
    t: u64,
    src: u32,
    line: u64,
    keys: [u32; MAX_LIMITS],
}

/// KeyStats are one key's counts under one limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyStats {
    /// Requests with this key.
    pub requests: u32,
    /// Of them, denied (by any limit: RL.ALL denies the whole request).
    pub denied: u32,
    /// Of them, denied by this limit itself.
    pub by_this: u32,
    /// The first and last denied request, ns since the epoch (valid when `denied > 0`).
    pub first_denied: u64,
    /// See `first_denied`.
    pub last_denied: u64,
    bucket: u64,
    in_bucket: u32,
    /// The most requests in one epoch-aligned period (GCRA) or window of the limit.
    pub peak: u32,
}

/// LimitStats are one limit's counts.
#[derive(Debug, Clone, Default)]
pub struct LimitStats {
    /// Requests the limit applied to.
    pub requests: u64,
    /// Of them, allowed.
    pub allowed: u64,
    /// Of them, denied (by any limit).
    pub denied: u64,
    /// Of them, denied by this limit itself.
    pub by_this: u64,
    /// Requests its template could not key (a field missing).
    pub unkeyed: u64,
    /// Requests off its route.
    pub off_route: u64,
    /// Per key, by id.
    pub keys: Vec<KeyStats>,
}

/// Malformed line, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct BadLine {
    /// Input name.
    pub source: String,
    /// 1-based line number.
    pub line: u64,
    /// Why it was refused.
    pub reason: String,
    /// The line's start, lossily decoded.
    pub text: String,
}

/// Totals over the whole input.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Lines read.
    pub lines: u64,
    /// Lines parsed into requests.
    pub requests: u64,
    /// Lines refused.
    pub malformed: u64,
    /// Lines whose time is earlier than an earlier line's.
    pub out_of_order: u64,
    /// Of those, lines earlier than a request already decided (which happens only beyond the
    /// skew): decided at the replay's clock instead of their own.
    pub late: u64,
    /// Requests no limit applied to (allowed).
    pub unlimited: u64,
    /// Requests allowed (including `unlimited`).
    pub allowed: u64,
    /// Requests denied.
    pub denied: u64,
    /// Requests the module would answer with an arithmetic-overflow error.
    pub overflow: u64,
    /// First and last instant replayed, ns since the epoch.
    pub first_ns: u64,
    /// See `first_ns`.
    pub last_ns: u64,
    /// The first few malformed lines.
    pub examples: Vec<BadLine>,
    /// Inputs whose gzip data broke off (cut short or corrupt), where: each is also counted
    /// as one malformed line, and the rest of that input is lost.
    pub damaged: Vec<BadLine>,
}

/// SweepSpec asks for one limit to be replayed at several sizes.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// Which limit (index into the defs).
    pub index: usize,
    /// `(size, limit)` candidates, ascending.
    pub candidates: Vec<(u64, Limit)>,
}

/// SweepResult is one candidate's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// The swept size (burst, rate or limit).
    pub size: u64,
    /// The candidate spec.
    pub spec: String,
    /// Requests the swept limit applied to.
    pub requests: u64,
    /// Of them, denied by the swept limit itself.
    pub denied_by_limit: u64,
    /// Requests denied overall (any limit).
    pub denied_overall: u64,
    /// Keys of the swept limit.
    pub keys: u64,
    /// Keys that had at least one request denied by the swept limit.
    pub keys_denied: u64,
}

struct Lane {
    limits: Vec<Limit>,
    tables: Vec<Table>,
    out: Outcome,
}

impl Lane {
    fn new(limits: Vec<Limit>) -> Self {
        let tables = limits.iter().map(Table::new).collect();
        Self {
            limits,
            tables,
            out: Outcome::default(),
        }
    }
}

struct SweepLane {
    lane: Lane,
    result: SweepResult,
    keys_denied: Vec<u64>, // bit set by key id
}

/// SeriesSpec asks for per-bucket counts of some keys (a second pass, once the top keys are
/// known).
#[derive(Debug, Clone)]
pub struct SeriesSpec {
    /// Start of bucket 0, ns since the epoch.
    pub start_ns: u64,
    /// Bucket width, ns.
    pub width_ns: u64,
    /// Number of buckets.
    pub buckets: usize,
    /// `(limit index, key id)` of each key to follow.
    pub keys: Vec<(usize, u32)>,
}

/// Series holds per-bucket requests and admitted counts, and the denials of each limit.
#[derive(Debug, Clone)]
pub struct Series {
    /// What was recorded.
    pub spec: SeriesSpec,
    /// All requests, per bucket.
    pub total: Vec<u64>,
    /// All admitted requests, per bucket.
    pub total_admitted: Vec<u64>,
    /// Per limit: the requests it denied, per bucket (a request that two limits deny is
    /// counted under both).
    pub total_denied_by: Vec<Vec<u64>>,
    /// Per followed key: requests per bucket.
    pub requests: Vec<Vec<u64>>,
    /// Per followed key: admitted per bucket.
    pub admitted: Vec<Vec<u64>>,
    /// Per followed key, per limit: that key's requests the limit denied, per bucket.
    pub denied_by: Vec<Vec<Vec<u64>>>,
}

impl Series {
    fn new(spec: SeriesSpec, limits: usize) -> Self {
        let b = spec.buckets;
        let k = spec.keys.len();
        Self {
            total: vec![0; b],
            total_admitted: vec![0; b],
            total_denied_by: vec![vec![0; b]; limits],
            requests: vec![vec![0; b]; k],
            admitted: vec![vec![0; b]; k],
            denied_by: vec![vec![vec![0; b]; limits]; k],
            spec,
        }
    }

    fn bucket(&self, t: u64) -> usize {
        let i = t.saturating_sub(self.spec.start_ns) / self.spec.width_ns;
        (i as usize).min(self.spec.buckets - 1)
    }
}

/// Options of a replay.
pub struct Options {
    /// Lines up to this much earlier than the latest line seen are put back in order.
    pub skew_ns: u64,
    /// Spread requests that share one whole-second timestamp evenly over that second.
    pub spread: bool,
    /// Malformed lines to keep as examples.
    pub examples: usize,
    /// Write every decision as a JSON line here.
    pub decisions: Option<Box<dyn Write>>,
    /// Sweep one limit.
    pub sweep: Option<SweepSpec>,
    /// Record per-bucket series.
    pub series: Option<SeriesSpec>,
}

/// Replayer is one pass over the input.
pub struct Replayer {
    defs: Vec<LimitDef>,
    periods: Vec<u64>,
    interners: Vec<Interner>,
    key_buf: Vec<u8>,
    main: Lane,
    stats: Vec<LimitStats>,
    totals: Totals,
    sweep_index: usize,
    sweep: Vec<SweepLane>,
    queue: VecDeque<Event>,
    max_t: u64,
    last_decided: Option<u64>,
    opts: Options,
    series: Option<Series>,
    sources: Vec<String>,
    write_error: Option<std::io::Error>,
}

/// Results of a pass.
pub struct Results {
    /// The limits, as given.
    pub defs: Vec<LimitDef>,
    /// Per limit.
    pub stats: Vec<LimitStats>,
    /// Per limit, its keys.
    pub keys: Vec<Interner>,
    /// Whole-input counts.
    pub totals: Totals,
    /// The sweep, if asked.
    pub sweep: Option<(usize, Vec<SweepResult>)>,
    /// The series, if asked.
    pub series: Option<Series>,
}

impl Replayer {
    /// A replay of `defs` (at most [`MAX_LIMITS`]).
    pub fn new(defs: Vec<LimitDef>, mut opts: Options) -> Self {
        assert!(!defs.is_empty() && defs.len() <= MAX_LIMITS);
        let limits: Vec<Limit> = defs.iter().map(|d| d.limit.clone()).collect();
        let (sweep_index, sweep) = match opts.sweep.take() {
            Some(spec) => {
                let lanes = spec
                    .candidates
                    .iter()
                    .map(|(size, candidate)| {
                        let mut ls = limits.clone();
                        ls[spec.index] = candidate.clone();
                        SweepLane {
                            lane: Lane::new(ls),
                            result: SweepResult {
                                size: *size,
                                spec: candidate.to_string(),
                                requests: 0,
                                denied_by_limit: 0,
                                denied_overall: 0,
                                keys: 0,
                                keys_denied: 0,
                            },
                            keys_denied: Vec::new(),
                        }
                    })
                    .collect();
                (spec.index, lanes)
            }
            None => (0, Vec::new()),
        };
        let series = opts.series.take().map(|spec| Series::new(spec, defs.len()));
        Self {
            periods: defs.iter().map(|d| d.limit.period_ns()).collect(),
            interners: defs.iter().map(|_| Interner::default()).collect(),
            stats: vec![LimitStats::default(); defs.len()],
            main: Lane::new(limits),
            defs,
            key_buf: Vec::with_capacity(256),
            totals: Totals::default(),
            sweep_index,
            sweep,
            queue: VecDeque::new(),
            max_t: 0,
            last_decided: None,
            opts,
            series,
            sources: Vec::new(),
            write_error: None,
        }
    }

    /// Names the next input (for messages); returns its index.
    pub fn begin_source(&mut self, name: String) -> u32 {
        self.sources.push(name);
        (self.sources.len() - 1) as u32
    }

    /// Counts a line that could not be parsed.
    pub fn malformed(&mut self, src: u32, line: u64, reason: &dyn std::fmt::Display, text: &[u8]) {
        self.totals.lines += 1;
        self.totals.malformed += 1;
        if self.totals.examples.len() < self.opts.examples {
            let mut text = String::from_utf8_lossy(&text[..text.len().min(200)]).into_owned();
            if text.ends_with('\r') {
                text.pop();
            }
            self.totals.examples.push(BadLine {
                source: self.sources[src as usize].clone(),
                line,
                reason: reason.to_string(),
                text,
            });
        }
    }

    /// Counts input `src` as broken off at line `line` (its gzip data cut short or corrupt),
    /// as a malformed line, and keeps it for the report (apart from the examples).
    pub fn damaged(&mut self, src: u32, line: u64, reason: &str) {
        self.totals.lines += 1;
        self.totals.malformed += 1;
        self.totals.damaged.push(BadLine {
            source: self.sources[src as usize].clone(),
            line,
            reason: reason.to_owned(),
            text: String::new(),
        });
    }

    /// Takes one parsed request from line `line` of input `src`.
    #[inline]
    pub fn offer(&mut self, src: u32, line: u64, record: &Record<'_>) {
        self.totals.lines += 1;
        self.totals.requests += 1;
        let mut ev = Event {
            t: record.time_ns,
            src,
            line,
            keys: [NONE; MAX_LIMITS],
        };
        for (i, def) in self.defs.iter().enumerate() {
            if let Some(route) = &def.route {
                if !route.matches(record) {
                    self.stats[i].off_route += 1;
                    continue;
                }
            }
            if !def.template.render(record, &mut self.key_buf) {
                self.stats[i].unkeyed += 1;
                continue;
            }
            ev.keys[i] = self.interners[i].intern(&self.key_buf);
        }
        self.push(ev);
    }

    fn push(&mut self, mut ev: Event) {
        if ev.t < self.max_t {
            self.totals.out_of_order += 1;
            if let Some(last) = self.last_decided {
                if ev.t < last {
                    // Beyond the skew: its turn has passed. Decide it at the replay's clock.
                    self.totals.late += 1;
                    ev.t = last;
                }
            }
        }
        match self.queue.back() {
            Some(back) if back.t > ev.t => {
                let at = self.queue.partition_point(|e| e.t <= ev.t);
                self.queue.insert(at, ev);
            }
            _ => self.queue.push_back(ev),
        }
        self.max_t = self.max_t.max(ev.t);
        let horizon = self.max_t.saturating_sub(self.opts.skew_ns);
        while let Some(front) = self.queue.front() {
            if front.t >= horizon {
                break;
            }
            self.release_run();
        }
    }

    /// Decides the run of queued requests that share the front's timestamp.
    fn release_run(&mut self) {
        let Some(t) = self.queue.front().map(|e| e.t) else {
            return;
        };
        // Only whole-second stamps are spread: finer ones already say when within the second.
        if !self.opts.spread || t % NANOS_PER_SEC != 0 {
            let ev = self.queue.pop_front().expect("front exists");
            self.decide(&ev, t);
            return;
        }
        let n = self.queue.iter().take_while(|e| e.t == t).count() as u64;
        for i in 0..n {
            let ev = self.queue.pop_front().expect("counted");
            let at = t + i * NANOS_PER_SEC / n;
            self.decide(&ev, at);
        }
    }

    fn decide(&mut self, ev: &Event, t: u64) {
        let n = self.defs.len();
        let mut keys = [None; MAX_LIMITS];
        for (k, &id) in keys.iter_mut().zip(&ev.keys[..n]) {
            *k = (id != NONE).then_some(id);
        }
        let keys = &keys[..n];
        if self.last_decided.is_none() {
            self.totals.first_ns = t;
        }
        self.last_decided = Some(t);
        self.totals.last_ns = t;
        let main = &mut self.main;
        decide_all(&main.limits, &mut main.tables, keys, t, 1, &mut main.out);
        let allowed = match main.out.combined {
            Some(d) => d.allowed(),
            None if main.out.overflow => {
                self.totals.overflow += 1;
                false
            }
            None => {
                self.totals.unlimited += 1;
                true
            }
        };
        if allowed {
            self.totals.allowed += 1;
        } else if !main.out.overflow {
            self.totals.denied += 1;
        }
        for (i, key) in keys.iter().enumerate() {
            let Some(key) = *key else { continue };
            let st = &mut self.stats[i];
            let k = key as usize;
            if st.keys.len() <= k {
                st.keys.resize(k + 1, KeyStats::default());
            }
            let ks = &mut st.keys[k];
            st.requests += 1;
            ks.requests = ks.requests.saturating_add(1);
            let bucket = t / self.periods[i];
            if bucket != ks.bucket || ks.in_bucket == 0 {
                ks.bucket = bucket;
                ks.in_bucket = 0;
            }
            ks.in_bucket += 1;
            ks.peak = ks.peak.max(ks.in_bucket);
            if allowed {
                st.allowed += 1;
            } else if !main.out.overflow {
                st.denied += 1;
                if ks.denied == 0 {
                    ks.first_denied = t;
                }
                ks.denied = ks.denied.saturating_add(1);
                ks.last_denied = t;
                if main.out.each[i].is_some_and(|d| !d.allowed()) {
                    st.by_this += 1;
                    ks.by_this = ks.by_this.saturating_add(1);
                }
            }
        }
        for sl in &mut self.sweep {
            let lane = &mut sl.lane;
            decide_all(&lane.limits, &mut lane.tables, keys, t, 1, &mut lane.out);
            if lane.out.combined.is_some_and(|d| !d.allowed()) {
                sl.result.denied_overall += 1;
            }
            if let Some(key) = keys[self.sweep_index] {
                sl.result.requests += 1;
                if lane.out.each[self.sweep_index].is_some_and(|d| !d.allowed()) {
                    sl.result.denied_by_limit += 1;
                    let (word, bit) = (key as usize / 64, key % 64);
                    if sl.keys_denied.len() <= word {
                        sl.keys_denied.resize(word + 1, 0);
                    }
                    if sl.keys_denied[word] & (1 << bit) == 0 {
                        sl.keys_denied[word] |= 1 << bit;
                        sl.result.keys_denied += 1;
                    }
                }
            }
        }
        if let Some(series) = &mut self.series {
            let b = series.bucket(t);
            series.total[b] += 1;
            series.total_admitted[b] += u64::from(allowed);
            let out = &self.main.out;
            let denied_by = |l: usize| !allowed && out.each[l].is_some_and(|d| !d.allowed());
            for l in 0..n {
                series.total_denied_by[l][b] += u64::from(denied_by(l));
            }
            for (j, &(li, kid)) in series.spec.keys.iter().enumerate() {
                if keys[li] == Some(kid) {
                    series.requests[j][b] += 1;
                    series.admitted[j][b] += u64::from(allowed);
                    for l in 0..n {
                        series.denied_by[j][l][b] += u64::from(denied_by(l));
                    }
                }
            }
        }
        if self.opts.decisions.is_some() {
            self.write_decision(ev, t, keys);
        }
    }

    fn write_decision(&mut self, ev: &Event, t: u64, keys: &[Option<u32>]) {
        #[derive(Serialize)]
        struct PerLimit {
            key: String,
            reply: [i64; 5],
        }
        #[derive(Serialize)]
        struct Line<'a> {
            source: &'a str,
            line: u64,
            time_ns: u64,
            allowed: bool,
            reply: Option<[i64; 5]>,
            limits: Vec<Option<PerLimit>>,
        }
        let out = &self.main.out;
        let limits = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let d = out.each.get(i).copied().flatten()?;
                let key = String::from_utf8_lossy(self.interners[i].get((*k)?)).into_owned();
                Some(PerLimit {
                    key,
                    reply: d.reply(),
                })
            })
            .collect();
        let line = Line {
            source: &self.sources[ev.src as usize],
            line: ev.line,
            time_ns: t,
            allowed: out.combined.is_none_or(|d| d.allowed()) && !out.overflow,
            reply: out.combined.map(|d| d.reply()),
            limits,
        };
        if let Some(w) = &mut self.opts.decisions {
            let r = serde_json::to_writer(&mut *w, &line)
                .map_err(std::io::Error::other)
                .and_then(|()| w.write_all(b"\n"));
            if let Err(e) = r {
                self.write_error.get_or_insert(e);
            }
        }
    }

    /// Decides what is still queued and returns the results.
    pub fn finish(mut self) -> std::io::Result<Results> {
        while !self.queue.is_empty() {
            self.release_run();
        }
        if let Some(w) = &mut self.opts.decisions {
            w.flush()?;
        }
        if let Some(e) = self.write_error {
            return Err(e);
        }
        let sweep = if self.sweep.is_empty() {
            None
        } else {
            let keys = self.interners[self.sweep_index].len() as u64;
            let results = self
                .sweep
                .into_iter()
                .map(|mut sl| {
                    sl.result.keys = keys;
                    sl.result
                })
                .collect();
            Some((self.sweep_index, results))
        };
        Ok(Results {
            defs: self.defs,
            stats: self.stats,
            keys: self.interners,
            totals: self.totals,
            sweep,
            series: self.series,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LOG_MAX_LIMIT_DEFAULT;
    use crate::record::{slot, Schema};

    const S: u64 = NANOS_PER_SEC;
    const T0: u64 = 1_764_000_000 * S;

    fn def(spec: &str, template: &str, schema: &mut Schema) -> LimitDef {
        let words: Vec<&str> = spec.split_whitespace().collect();
        let (limit, _) = Limit::parse(&words, LOG_MAX_LIMIT_DEFAULT).unwrap();
        LimitDef {
            limit,
            template: Template::parse(template, schema).unwrap(),
            route: None,
        }
    }

    fn opts(skew_ns: u64, spread: bool) -> Options {
        Options {
            skew_ns,
            spread,
            examples: 5,
            decisions: None,
            sweep: None,
            series: None,
        }
    }

    fn offer(r: &mut Replayer, line: u64, t: u64, ip: &str) {
        let mut rec = Record::new(t);
        rec.set(slot::IP, ip.as_bytes());
        r.offer(0, line, &rec);
    }

    #[test]
    fn out_of_order_within_skew_is_put_back_in_order() {
        let mut schema = Schema::default();
        // One request per 10 s per IP, no burst beyond 1.
        let defs = vec![def("GCRA 1 1 10", "{ip}", &mut schema)];
        let mut r = Replayer::new(defs.clone(), opts(5 * S, false));
        r.begin_source("t".into());
        // Logged at +0, +4, +3 s (the last one 1 s out of order, within the 5 s skew).
        offer(&mut r, 1, T0, "a");
        offer(&mut r, 2, T0 + 4 * S, "a");
        offer(&mut r, 3, T0 + 3 * S, "a");
        let res = r.finish().unwrap();
        assert_eq!(res.totals.out_of_order, 1);
        assert_eq!(res.totals.late, 0);
        let k = res.stats[0].keys[0];
        assert_eq!((k.requests, k.denied), (3, 2));
        // The first denial is the request at +3 s, decided before the one at +4 s.
        assert_eq!(k.first_denied, T0 + 3 * S);
        assert_eq!(k.last_denied, T0 + 4 * S);
    }

    #[test]
    fn beyond_the_skew_is_late_and_decided_at_the_clock() {
        let mut schema = Schema::default();
        let defs = vec![def("GCRA 1 1 10", "{ip}", &mut schema)];
        let mut r = Replayer::new(defs, opts(2 * S, false));
        r.begin_source("t".into());
        offer(&mut r, 1, T0, "a");
        offer(&mut r, 2, T0 + 20 * S, "b"); // releases a@0
        offer(&mut r, 3, T0 + 21 * S, "b"); // b@20 stays: within 2 s of the latest
        offer(&mut r, 4, T0 + 30 * S, "c"); // releases b@20, b@21
        offer(&mut r, 5, T0 + 5 * S, "a"); // 25 s before the latest: late
        let res = r.finish().unwrap();
        assert_eq!(res.totals.out_of_order, 1);
        assert_eq!(res.totals.late, 1);
        // Decided at +21 s, 21 s after a's first request: allowed.
        assert_eq!(res.stats[0].keys[0].denied, 0);
        assert_eq!(res.totals.denied, 1); // b@21
    }

    #[test]
    fn beyond_the_skew_but_before_any_decision_is_put_back_in_order_not_late() {
        let mut schema = Schema::default();
        let defs = vec![def("GCRA 1 1 10", "{ip}", &mut schema)];
        let mut r = Replayer::new(defs, opts(5 * S, false));
        r.begin_source("t".into());
        offer(&mut r, 1, T0 + 20 * S, "a"); // nothing decided yet: it waits for the skew
        offer(&mut r, 2, T0, "a"); // 20 s back, beyond the skew, but its turn has not passed
        let res = r.finish().unwrap();
        assert_eq!((res.totals.out_of_order, res.totals.late), (1, 0));
        // Decided in time order at their own instants: 20 s apart, both allowed.
        assert_eq!(res.totals.denied, 0);
        assert_eq!(res.totals.first_ns, T0);
    }

    #[test]
    fn spread_puts_same_second_requests_apart() {
        let mut schema = Schema::default();
        // 4 per second, burst 1: four requests logged in one second pass only when spread.
        let defs = vec![def("GCRA 1 4 1", "{ip}", &mut schema)];
        for (spread, denied) in [(false, 3), (true, 0)] {
            let mut r = Replayer::new(defs.clone(), opts(0, spread));
            r.begin_source("t".into());
            for line in 1..=4 {
                offer(&mut r, line, T0, "a");
            }
            let res = r.finish().unwrap();
            assert_eq!(res.totals.denied, denied, "spread {spread}");
        }
        // A stamp finer than the second is taken as it is.
        let mut r = Replayer::new(defs.clone(), opts(0, true));
        r.begin_source("t".into());
        for line in 1..=4 {
            offer(&mut r, line, T0 + 1_000_000, "a");
        }
        assert_eq!(r.finish().unwrap().totals.denied, 3);
    }

    #[test]
    fn a_denial_by_one_limit_is_a_denial_for_every_key_of_the_request() {
        let mut schema = Schema::default();
        let defs = vec![
            def("WINDOW 100 60 FIXED", "{ip}", &mut schema),
            def("WINDOW 2 60 FIXED", "all:{path|/}", &mut schema),
        ];
        let mut r = Replayer::new(defs, opts(0, false));
        r.begin_source("t".into());
        for (i, ip) in ["a", "b", "c", "d"].iter().enumerate() {
            offer(&mut r, i as u64 + 1, T0 + i as u64, ip);
        }
        let res = r.finish().unwrap();
        let (ip, all) = (&res.stats[0], &res.stats[1]);
        assert_eq!((ip.requests, ip.denied, ip.by_this), (4, 2, 0));
        assert_eq!((all.requests, all.denied, all.by_this), (4, 2, 2));
        assert_eq!(res.keys[1].len(), 1);
        assert_eq!(res.stats[0].keys.iter().filter(|k| k.denied > 0).count(), 2);
    }

    #[test]
    fn sweep_lanes_decide_independently() {
        let mut schema = Schema::default();
        let defs = vec![def("WINDOW 3 60 LOG", "{ip}", &mut schema)];
        let candidates = [1u64, 2, 3, 5]
            .iter()
            .map(|&n| (n, defs[0].limit.resized(n, 0, 100).unwrap()))
            .collect();
        let mut o = opts(0, false);
        o.sweep = Some(SweepSpec {
            index: 0,
            candidates,
        });
        let mut r = Replayer::new(defs, o);
        r.begin_source("t".into());
        // a: 4 requests, b: 2, c: 1, all in one minute.
        let mut line = 0;
        for (ip, n) in [("a", 4), ("b", 2), ("c", 1)] {
            for _ in 0..n {
                line += 1;
                offer(&mut r, line, T0 + line, ip);
            }
        }
        let res = r.finish().unwrap();
        let (_, sweep) = res.sweep.unwrap();
        let got: Vec<(u64, u64, u64)> = sweep
            .iter()
            .map(|s| (s.size, s.denied_by_limit, s.keys_denied))
            .collect();
        assert_eq!(got, [(1, 4, 2), (2, 2, 1), (3, 1, 1), (5, 0, 0)]);
        assert!(sweep.iter().all(|s| s.keys == 3 && s.requests == 7));
        assert_eq!(res.totals.denied, 1); // the main lane: 3 per minute
    }
}
