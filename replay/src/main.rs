//! rl-replay: run an access log through candidate rate limits and see who would have been
//! limited. See `rl-replay --help` and replay/README.md.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use rl_replay::engine::{Limit, LOG_MAX_LIMIT_DEFAULT};
use rl_replay::input::Source;
use rl_replay::record::{Route, Schema, Template};
use rl_replay::replay::{LimitDef, Options, Replayer, Results, SeriesSpec, SweepSpec, MAX_LIMITS};
use rl_replay::run::{self, Format, InputSpec};
use rl_replay::suggest::{self, Param};
use rl_replay::timestamp::{parse_epoch, Unit};
use rl_replay::{plot, report};

const EXAMPLES: &str = "\
Examples:
  rl-replay access.log -l 'GCRA 20 10 1 per {ip}'
  zcat access.log.2.gz access.log.1.gz | rl-replay -l 'GCRA 20 10 1' -l 'WINDOW 5 60 LOG per {ip} on POST /login'
  rl-replay access.log.gz -l 'WINDOW 600 60 SLIDING per {user}' --suggest --target 0.1 --out-dir pics
  rl-replay app.jsonl --field time=ts --field ip=request.remote_ip -l 'GCRA 50 25 1 per {ip}'

Give rotated logs oldest first, as one timeline (a glob such as access.log.*.gz lists them
newest first, and every line of the older logs would then come too late to be put back in
order).

A limit is `SPEC [per TEMPLATE] [on [METHOD] PATH_PREFIX]`. SPEC is the module's own:
`GCRA burst rate period` or `WINDOW limit window [FIXED|SLIDING|LOG]` (period and window in
seconds). TEMPLATE builds the key (default {ip}): fields ip, user, ident, method, path,
path:N (first N segments), uri, protocol, request, status, bytes, referer, ua, extra:N (CLF
fields after the Combined ones), any JSON field (dotted names reach into objects), with a
default as {user|anon}. Several limits apply together, as RL.ALL: a request passes only if
every limit that applies to it admits it, and only then does it count against them.";

/// Replay an access log through candidate rate limits, with the module's own algorithms, and
/// see who would have been limited.
#[derive(Parser, Debug)]
#[command(name = "rl-replay", version, after_help = EXAMPLES)]
struct Cli {
    /// Logs to replay, oldest first (gzip accepted). None or `-`: standard input.
    inputs: Vec<String>,

    /// A limit: `SPEC [per TEMPLATE] [on [METHOD] PATH_PREFIX]`; repeat for several (up to 8).
    #[arg(short, long = "limit", required = true, value_name = "LIMIT")]
    limits: Vec<String>,

    /// Log format.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,

    /// JSON lines: where a field is, as NAME=JSON_NAME (e.g. time=ts, ip=request.remote_ip).
    #[arg(long = "field", value_name = "NAME=JSON_NAME", value_parser = parse_field)]
    fields: Vec<(String, String)>,

    /// JSON lines: the unit of numeric times.
    #[arg(long, value_enum, default_value_t = Unit::Auto)]
    time_unit: Unit,

    /// Seconds by which a line may be earlier than the latest line before it and still be put
    /// back in order. A line earlier than a request already decided (which happens only
    /// beyond the skew) is counted as late and decided at the replay's clock.
    #[arg(long, default_value = "10", value_name = "SECONDS")]
    skew: String,

    /// Spread requests that share one whole-second timestamp evenly over that second (CLF
    /// times have 1 s resolution; without this they all arrive at the second's start).
    #[arg(long)]
    spread: bool,

    /// Most limited keys to list per limit.
    #[arg(long, default_value_t = 10)]
    top: usize,

    /// Keys to draw in the timeline (the most denied across limits).
    #[arg(long, default_value_t = 4)]
    plot_keys: usize,

    /// Malformed lines to show (all are counted).
    #[arg(long, default_value_t = 5, value_name = "N")]
    show_malformed: usize,

    /// Write the report as JSON to this file (`-`: standard output, the summary then goes to
    /// standard error). Its fields, and those of --keys and --decisions: replay/docs/json.md.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Write the pictures (SVG) into this directory: timeline.svg, peaks.svg, sweep.svg.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,

    /// Write every request's decision as a JSON line (with the module's five-integer replies;
    /// `-`: standard output, the summary then goes to standard error).
    #[arg(long, value_name = "FILE")]
    decisions: Option<PathBuf>,

    /// Sweep the size of limit N (1-based; default 1) and suggest the smallest that denies at
    /// most --target percent of its keys.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "1")]
    suggest: Option<usize>,

    /// Sizes to sweep, MIN..MAX (default: a tenth to ten times the limit's size).
    #[arg(long, value_name = "MIN..MAX")]
    sweep: Option<String>,

    /// Candidates in the sweep (spaced geometrically).
    #[arg(long, default_value_t = 24)]
    steps: usize,

    /// Percent of keys that may ever be denied, for --suggest.
    #[arg(long, default_value_t = 0.1, value_name = "PERCENT")]
    target: f64,

    /// What a GCRA sweep changes: burst and rate together, or one of them.
    #[arg(long, value_enum, default_value_t = Param::Both)]
    param: Param,

    /// Do not refine the suggestion: by default, when the input can be read again, the sizes
    /// between the suggested candidate and the one below it are replayed too (up to 16 per
    /// extra pass) until the suggestion is the exact smallest integer size.
    #[arg(long)]
    no_refine: bool,

    /// Write every key that saw a denial, per limit, as JSON lines (key, counts, first and
    /// last denial, peak; `-`: standard output, the summary then goes to standard error).
    #[arg(long, value_name = "FILE")]
    keys: Option<PathBuf>,

    /// The module's rl.log-max-limit: the largest LOG limit.
    #[arg(long, default_value_t = LOG_MAX_LIMIT_DEFAULT)]
    log_max_limit: u64,

    /// Print no summary.
    #[arg(short, long)]
    quiet: bool,
}

fn parse_field(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}': expected NAME=JSON_NAME"))?;
    if k.is_empty() || v.is_empty() {
        return Err(format!("'{text}': expected NAME=JSON_NAME"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Parses `SPEC [per TEMPLATE] [on [METHOD] PATH_PREFIX]`.
fn parse_limit(text: &str, schema: &mut Schema, log_max: u64) -> Result<LimitDef, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let (limit, mut i) =
        Limit::parse(&words, log_max).map_err(|e| format!("limit '{text}': {e}"))?;
    let mut template = None;
    let mut route = None;
    while i < words.len() {
        let word = words[i];
        if word.eq_ignore_ascii_case("per") && template.is_none() {
            let t = words
                .get(i + 1)
                .ok_or_else(|| format!("limit '{text}': 'per' needs a template"))?;
            template =
                Some(Template::parse(t, schema).map_err(|e| format!("limit '{text}': {e}"))?);
            i += 2;
        } else if word.eq_ignore_ascii_case("on") && route.is_none() {
            let mut j = i + 1;
            let mut method = None;
            if let Some(m) = words.get(j).filter(|w| !w.starts_with('/')) {
                if !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                    return Err(format!("limit '{text}': '{m}' is not a method"));
                }
                method = Some(m.to_ascii_uppercase().into_bytes());
                j += 1;
            }
            let prefix = words.get(j).filter(|p| p.starts_with('/')).ok_or_else(|| {
                format!("limit '{text}': 'on' needs a path prefix starting with /")
            })?;
            route = Some(Route {
                method,
                prefix: prefix.as_bytes().to_vec(),
            });
            // Route matching reads the method and path slots, which every format fills.
            schema.slot("method")?;
            schema.slot("path")?;
            i = j + 1;
        } else {
            return Err(format!(
                "limit '{text}': unexpected '{word}' (after the spec: per TEMPLATE, on [METHOD] /PREFIX)"
            ));
        }
    }
    let template = match template {
        Some(t) => t,
        None => Template::parse("{ip}", schema)?,
    };
    Ok(LimitDef {
        limit,
        template,
        route,
    })
}

struct Plan {
    defs: Vec<LimitDef>,
    schema: Schema,
    input: InputSpec,
    skew_ns: u64,
    sweep: Option<(SweepSpec, String)>,
}

fn plan(cli: &Cli) -> Result<Plan, String> {
    if cli.limits.len() > MAX_LIMITS {
        return Err(format!("at most {MAX_LIMITS} limits"));
    }
    let mut schema = Schema::default();
    let defs = cli
        .limits
        .iter()
        .map(|l| parse_limit(l, &mut schema, cli.log_max_limit))
        .collect::<Result<Vec<_>, _>>()?;
    let skew_ns = parse_epoch(cli.skew.as_bytes(), Unit::S)
        .ok_or_else(|| format!("--skew '{}': expected seconds (e.g. 10, 0.5)", cli.skew))?;
    let mut sources: Vec<Source> = cli.inputs.iter().map(|s| Source::from_arg(s)).collect();
    if sources.is_empty() {
        sources.push(Source::Stdin);
    }
    if sources.iter().filter(|s| **s == Source::Stdin).count() > 1 {
        return Err("standard input given more than once".into());
    }
    if cli.outputs_to_stdout() > 1 {
        return Err("standard output named by more than one of --json, --keys, --decisions".into());
    }
    if !(0.0..=100.0).contains(&cli.target) {
        return Err("--target is a percentage between 0 and 100".into());
    }
    let sweep = match cli.suggest {
        None => None,
        Some(n) => {
            let index = n
                .checked_sub(1)
                .filter(|&i| i < defs.len())
                .ok_or_else(|| format!("--suggest {n}: there are {} limits", defs.len()))?;
            let limit = defs[index].limit.clone();
            let (min, max) = match &cli.sweep {
                Some(r) => suggest::parse_range(r)?,
                None => suggest::default_range(suggest::size_of(&limit, cli.param)),
            };
            let sizes = suggest::sizes(min, max, cli.steps);
            let candidates = suggest::candidates(&limit, cli.param, &sizes, cli.log_max_limit);
            if candidates.is_empty() {
                return Err(format!(
                    "--suggest: no size in {min}..{max} makes a limit the module accepts"
                ));
            }
            let what = if !limit.is_gcra() {
                "limit swept".to_owned()
            } else {
                match cli.param {
                    Param::Both => "burst swept, rate in proportion".to_owned(),
                    Param::Burst => "burst swept".to_owned(),
                    Param::Rate => "rate swept".to_owned(),
                }
            };
            Some((SweepSpec { index, candidates }, what))
        }
    };
    Ok(Plan {
        input: InputSpec {
            sources,
            format: cli.format,
            fields: cli.fields.clone(),
            unit: cli.time_unit,
        },
        defs,
        schema,
        skew_ns,
        sweep,
    })
}

/// `-` names standard output in --json, --keys and --decisions.
fn is_stdout(path: Option<&PathBuf>) -> bool {
    path.is_some_and(|p| p.as_os_str() == "-")
}

impl Cli {
    /// How many of the output options name standard output.
    fn outputs_to_stdout(&self) -> usize {
        [&self.json, &self.keys, &self.decisions]
            .into_iter()
            .filter(|p| is_stdout(p.as_ref()))
            .count()
    }
}

/// Opens an output: the file at `path`, or standard output for `-`.
fn create(path: &PathBuf) -> io::Result<BufWriter<Box<dyn Write>>> {
    let sink: Box<dyn Write> = if is_stdout(Some(path)) {
        Box::new(io::stdout())
    } else {
        File::create(path)
            .map(|f| Box::new(f) as Box<dyn Write>)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
    };
    Ok(BufWriter::with_capacity(1 << 16, sink))
}

/// The keys the timeline follows: the most denied by their own limit, across all limits.
fn followed_keys(res: &Results, n: usize) -> Vec<(usize, u32)> {
    let mut all: Vec<(u32, u32, u32, usize, u32)> = Vec::new();
    for (li, st) in res.stats.iter().enumerate() {
        for (k, ks) in st.keys.iter().enumerate() {
            if ks.by_this > 0 {
                all.push((ks.by_this, ks.denied, ks.requests, li, k as u32));
            }
        }
    }
    all.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then(b.2.cmp(&a.2))
            .then(a.3.cmp(&b.3))
            .then(a.4.cmp(&b.4))
    });
    let all: Vec<(usize, u32)> = all.into_iter().map(|e| (e.3, e.4)).collect();
    // One panel per key text: a key limited under two limits is shown once, under the one
    // that denied it most.
    let mut seen: Vec<&[u8]> = Vec::new();
    let mut out = Vec::new();
    for (li, k) in all {
        if out.len() == n {
            break;
        }
        let text = res.keys[li].get(k);
        if !seen.contains(&text) {
            seen.push(text);
            out.push((li, k));
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let plan = match plan(&cli) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rl-replay: {e}");
            return ExitCode::from(2);
        }
    };
    match execute(&cli, plan) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rl-replay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: &Cli, plan: Plan) -> Result<(), Box<dyn std::error::Error>> {
    let Plan {
        defs,
        schema,
        input,
        skew_ns,
        sweep,
    } = plan;
    let (sweep_spec, sweep_what) = match sweep {
        Some((s, w)) => (Some(s), Some(w)),
        None => (None, None),
    };
    let decisions: Option<Box<dyn Write>> = match &cli.decisions {
        Some(p) => Some(Box::new(create(p)?)),
        None => None,
    };
    // Pictures and the refined suggestion need more passes; standard input is kept in a
    // temporary file for them.
    let needs_second = cli.out_dir.is_some() || (sweep_spec.is_some() && !cli.no_refine);
    let sweep_limit = sweep_spec
        .as_ref()
        .map(|s| (s.index, defs[s.index].limit.clone()));
    let mut spool = if needs_second && input.sources.contains(&Source::Stdin) {
        Some(tempfile::NamedTempFile::new()?)
    } else {
        None
    };
    let started = Instant::now();
    let opts = Options {
        skew_ns,
        spread: cli.spread,
        examples: cli.show_malformed,
        decisions,
        sweep: sweep_spec,
        series: None,
    };
    let mut replayer = Replayer::new(defs.clone(), opts);
    {
        let mut spool_writer = spool
            .as_mut()
            .map(|f| BufWriter::with_capacity(1 << 20, f.as_file_mut()));
        run::pass(
            &input,
            &schema,
            &mut replayer,
            spool_writer.as_mut().map(|w| w as &mut dyn Write),
        )?;
        if let Some(mut w) = spool_writer {
            w.flush()?;
        }
    }
    let mut results = replayer.finish()?;
    let reread = InputSpec {
        sources: input
            .sources
            .iter()
            .map(|s| match (s, &spool) {
                (Source::Stdin, Some(f)) => Source::File(f.path().to_path_buf()),
                (s, _) => s.clone(),
            })
            .collect(),
        ..input.clone()
    };
    let target = cli.target / 100.0;
    let mut refine_passes = 0;
    if let (Some((index, limit)), false) = (sweep_limit, cli.no_refine) {
        // Replay the sizes between the suggestion and the candidate below it, up to 16 at a
        // time, until they are adjacent integers.
        while let Some((_, sweep)) = &mut results.sweep {
            let Some(j) = suggest::recommend(sweep, target).filter(|&j| j > 0) else {
                break;
            };
            let sizes = suggest::between(sweep[j - 1].size, sweep[j].size, 16);
            let candidates = suggest::candidates(&limit, cli.param, &sizes, cli.log_max_limit);
            if candidates.is_empty() || refine_passes >= 8 {
                break;
            }
            let opts = Options {
                skew_ns,
                spread: cli.spread,
                examples: 0,
                decisions: None,
                sweep: Some(SweepSpec { index, candidates }),
                series: None,
            };
            let mut extra = Replayer::new(defs.clone(), opts);
            run::pass(&reread, &schema, &mut extra, None)?;
            refine_passes += 1;
            if let Some((_, more)) = extra.finish()?.sweep {
                sweep.extend(more);
                sweep.sort_by_key(|r| r.size);
                sweep.dedup_by_key(|r| r.size);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    let mut pictures = Vec::new();
    if let Some(dir) = &cli.out_dir {
        std::fs::create_dir_all(dir)?;
        let peaks = dir.join("peaks.svg");
        plot::peaks(&peaks, &results)?;
        pictures.push(peaks.display().to_string());
        if let Some((index, sweep)) = &results.sweep {
            let path = dir.join("sweep.svg");
            let def = &results.defs[*index];
            let title = format!(
                "Sweep of #{} {} per {} ({})",
                index + 1,
                def.limit,
                def.template,
                sweep_what.as_deref().unwrap_or("")
            );
            plot::sweep(
                &path,
                &title,
                sweep,
                target,
                suggest::recommend(sweep, target),
            )?;
            pictures.push(path.display().to_string());
        }
        if results.totals.requests > 0 {
            let (start_ns, width_ns, buckets) =
                plot::buckets_for(results.totals.first_ns, results.totals.last_ns, 240);
            let keys = followed_keys(&results, cli.plot_keys);
            let opts = Options {
                skew_ns,
                spread: cli.spread,
                examples: 0,
                decisions: None,
                sweep: None,
                series: Some(SeriesSpec {
                    start_ns,
                    width_ns,
                    buckets,
                    keys,
                }),
            };
            let mut second = Replayer::new(defs.clone(), opts);
            run::pass(&reread, &schema, &mut second, None)?;
            let again = second.finish()?;
            if let Some(series) = &again.series {
                let path = dir.join("timeline.svg");
                plot::timeline(&path, &results, series)?;
                pictures.push(path.display().to_string());
            }
        }
    }

    if let Some(path) = &cli.keys {
        let mut w = create(path)?;
        report::write_denied_keys(&results, &mut w)?;
        w.flush()?;
    }
    let rep = report::build(
        &results,
        cli.top,
        sweep_what.map(|w| (w, target, refine_passes)),
        pictures,
        seconds,
    );
    if let Some(path) = &cli.json {
        let mut w = create(path)?;
        serde_json::to_writer_pretty(&mut w, &rep)?;
        writeln!(w)?;
        w.flush()?;
    }
    if !cli.quiet {
        let text = report::text(&rep);
        if cli.outputs_to_stdout() > 0 {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    }
    Ok(())
}
