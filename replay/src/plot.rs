//! plot draws the pictures (SVG, with plotters): the timeline of requests against admitted
//! requests for all traffic and the most limited keys, the distribution of keys' peak rates
//! against each limit, and the `--suggest` sweep. Floats appear here only as drawing
//! coordinates.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::replay::{Results, Series, SweepResult};
use crate::report::{percent, thousands};
use crate::suggest;

type Error = Box<dyn std::error::Error>;

const GREY: RGBColor = RGBColor(150, 150, 150);
const ADMIT: RGBColor = RGBColor(31, 119, 180);
const DENY: RGBColor = RGBColor(214, 39, 40);
const FONT: &str = "sans-serif";

fn err<E: std::fmt::Debug>(e: E) -> Error {
    format!("drawing failed: {e:?}").into()
}

/// Bucket widths the timeline chooses from, in seconds.
const WIDTHS: [u64; 16] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 86_400,
];

/// Chooses a bucket width so that the span `first..=last` (ns) fills at most `max_buckets`;
/// returns `(start_ns, width_ns, buckets)`.
pub fn buckets_for(first_ns: u64, last_ns: u64, max_buckets: u64) -> (u64, u64, usize) {
    let span_s = last_ns.saturating_sub(first_ns) / 1_000_000_000 + 1;
    let width_s = WIDTHS
        .iter()
        .copied()
        .find(|w| span_s.div_ceil(*w) <= max_buckets)
        .unwrap_or_else(|| span_s.div_ceil(max_buckets));
    let width = width_s * 1_000_000_000;
    let start = first_ns - first_ns % width;
    let buckets = ((last_ns - start) / width + 1) as usize;
    (start, width, buckets)
}

fn width_label(width_ns: u64) -> String {
    let s = width_ns / 1_000_000_000;
    match s {
        s if s % 3600 == 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The text of the time axis' tick at `x` units of `unit_s` seconds past `origin_ns` (a whole
/// second), for a timeline spanning `span_s` seconds: `HH:MM:SS`, `HH:MM` past 10 minutes,
/// `mm-dd HH:MM` past two days. A tick the format cannot name exactly (between two of its
/// seconds or minutes) gets no text, which would repeat a neighbour's.
fn clock_label(origin_ns: u64, x: f64, unit_s: u64, span_s: u64) -> String {
    // To the millisecond, rounded: a tick that float steps left a hair short of a second
    // is that second, not the one before.
    let ms = (x.max(0.0) * unit_s as f64 * 1e3).round() as u64;
    let (format, step_ms) = match span_s {
        s if s > 2 * 86_400 => ("%m-%d %H:%M", 60_000),
        s if s > 600 => ("%H:%M", 60_000),
        _ => ("%H:%M:%S", 1_000),
    };
    if ms % step_ms != 0 {
        return String::new();
    }
    let secs = origin_ns / 1_000_000_000 + ms / 1_000;
    match chrono::DateTime::from_timestamp(secs as i64, 0) {
        Some(t) => t.format(format).to_string(),
        None => String::new(),
    }
}

/// The text of a count axis' tick: the count, or nothing between two whole counts (a panel
/// whose busiest bucket holds 2 requests has ticks at 0.5 and 1.5 too).
fn count_label(y: f64) -> String {
    let whole = y.round();
    if (y - whole).abs() > 1e-6 || whole < 0.0 {
        return String::new();
    }
    thousands(whole as u64)
}

/// The x unit of a timeline spanning `span_s` seconds: seconds up to 2 min, minutes up to
/// 3 h, hours up to 10 days, else days (so that the axis ticks fall on round clock times).
fn time_unit(span_s: u64) -> u64 {
    match span_s {
        0..=120 => 1,
        121..=10_800 => 60,
        10_801..=864_000 => 3600,
        _ => 86_400,
    }
}

/// Colours of the limits' denials (#1, #2, …), apart from the admitted blue.
const LIMIT_COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(90, 90, 90),
];

/// One filled area of a panel: its legend, fill and per-bucket counts.
struct Fill<'a> {
    label: String,
    color: RGBAColor,
    values: &'a [u64],
}

/// One line of a panel: its legend, colour and per-bucket counts.
struct Line<'a> {
    label: String,
    color: RGBColor,
    values: &'a [u64],
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    series: &Series,
    fills: &[Fill<'_>],
    lines: &[Line<'_>],
) -> Result<(), Error> {
    let spec = &series.spec;
    let span_s = spec.width_ns * spec.buckets as u64 / 1_000_000_000;
    let unit_s = time_unit(span_s);
    let unit_ns = unit_s * 1_000_000_000;
    let origin = spec.start_ns - spec.start_ns % unit_ns;
    let x_of = |ns: u64| (ns - origin) as f64 / unit_ns as f64;
    let x_end = x_of(spec.start_ns + spec.width_ns * spec.buckets as u64);
    let most = fills
        .iter()
        .map(|f| f.values)
        .chain(lines.iter().map(|l| l.values))
        .flat_map(|v| v.iter().copied())
        .max()
        .unwrap_or(1);
    let top = most.max(1) as f64 * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 15))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(x_of(spec.start_ns)..x_end, 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(10)
        .y_labels(5)
        .x_label_formatter(&|x| clock_label(origin, *x, unit_s, span_s))
        .y_label_formatter(&|y| count_label(*y))
        .y_desc(format!("requests / {}", width_label(spec.width_ns)))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    // Steps: each bucket is a flat segment, so a single busy bucket reads as one.
    let steps = |v: &[u64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .flat_map(|(i, &c)| {
                let b = spec.start_ns + i as u64 * spec.width_ns;
                [(x_of(b), c as f64), (x_of(b + spec.width_ns), c as f64)]
            })
            .collect()
    };
    for f in fills {
        let color = f.color;
        chart
            .draw_series(AreaSeries::new(steps(f.values), 0.0, color))
            .map_err(err)?
            .label(f.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], color.filled()));
    }
    for l in lines {
        let color = l.color;
        chart
            .draw_series(LineSeries::new(steps(l.values), color.stroke_width(2)))
            .map_err(err)?
            .label(l.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(GREY)
        .label_font((FONT, 13))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// `#i SPEC per TEMPLATE [on ROUTE]`, the way the summary names limit `i` (0-based).
fn limit_name(res: &Results, i: usize) -> String {
    format!("#{} {}", i + 1, res.defs[i])
}

/// Draws the timeline: all requests, the denials of each limit (on their own scale, so that
/// a denial rate of a few percent is as visible as the traffic), then each followed key, as
/// stacked panels. Every denial is drawn in the colour of the limit that denied it.
pub fn timeline(path: &Path, res: &Results, series: &Series) -> Result<(), Error> {
    let panels = 2 + series.spec.keys.len();
    let root = SVGBackend::new(path, (1000, 60 + 230 * panels as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(44);
    head.draw_text(
        "Requests, what the limits would have admitted, and which limit denied the rest",
        &(FONT, 20).into_font().color(&BLACK),
        (12, 12),
    )
    .map_err(err)?;
    let areas = body.split_evenly((panels, 1));
    let t = &res.totals;
    let color = |l: usize| LIMIT_COLORS[l % LIMIT_COLORS.len()];
    panel(
        &areas[0],
        &format!(
            "All requests: {} of {} denied ({}; the red part)",
            thousands(t.denied),
            thousands(t.requests),
            percent(t.denied, t.requests)
        ),
        series,
        &[
            Fill {
                label: "requests".into(),
                color: DENY.mix(0.25),
                values: &series.total,
            },
            Fill {
                label: "admitted".into(),
                color: ADMIT.mix(0.55),
                values: &series.total_admitted,
            },
        ],
        &[],
    )?;
    let denied_total: Vec<u64> = series
        .total
        .iter()
        .zip(&series.total_admitted)
        .map(|(r, a)| r - a)
        .collect();
    let limit_lines: Vec<Line<'_>> = series
        .total_denied_by
        .iter()
        .enumerate()
        .filter(|(l, _)| res.stats[*l].by_this > 0)
        .map(|(l, v)| Line {
            label: format!(
                "{}: {} ({} of its requests)",
                limit_name(res, l),
                thousands(res.stats[l].by_this),
                percent(res.stats[l].by_this, res.stats[l].requests)
            ),
            color: color(l),
            values: v,
        })
        .collect();
    panel(
        &areas[1],
        &format!(
            "Denied requests ({} of all), by the limit that denied them (a request two limits deny is under both)",
            percent(t.denied, t.requests)
        ),
        series,
        &[Fill {
            label: "denied".into(),
            color: DENY.mix(0.12),
            values: &denied_total,
        }],
        &limit_lines,
    )?;
    for (j, &(li, kid)) in series.spec.keys.iter().enumerate() {
        let ks = &res.stats[li].keys[kid as usize];
        let key = String::from_utf8_lossy(res.keys[li].get(kid));
        let key: String = key.chars().take(60).collect();
        let by: Vec<(usize, u64)> = series.denied_by[j]
            .iter()
            .enumerate()
            .map(|(l, v)| (l, v.iter().sum::<u64>()))
            .filter(|&(_, n)| n > 0)
            .collect();
        let who = by
            .iter()
            .map(|&(l, n)| format!("{} by #{}", thousands(n), l + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let title = format!(
            "{key} (a key of #{}): {} of {} requests denied{}{}",
            li + 1,
            thousands(u64::from(ks.denied)),
            thousands(u64::from(ks.requests)),
            if who.is_empty() { "" } else { ": " },
            who
        );
        let lines: Vec<Line<'_>> = by
            .iter()
            .map(|&(l, _)| Line {
                label: format!("denied by {}", limit_name(res, l)),
                color: color(l),
                values: &series.denied_by[j][l],
            })
            .collect();
        panel(
            &areas[j + 2],
            &title,
            series,
            &[
                Fill {
                    label: "requests".into(),
                    color: DENY.mix(0.25),
                    values: &series.requests[j],
                },
                Fill {
                    label: "admitted".into(),
                    color: ADMIT.mix(0.55),
                    values: &series.admitted[j],
                },
            ],
            &lines,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The bins of the peaks picture, as integer ranges `(lo, hi]` of peaks, ascending from
/// `(0, …]` until one reaches `max_peak` and twice the largest line: their edges are
/// `allowance × 2^k` (rounded down) and `burst`, so that a limit's lines fall between two
/// bins and no bin holds peaks on both sides of one.
pub fn peak_bins(allowance: u64, burst: Option<u64>, max_peak: u64) -> Vec<(u64, u64)> {
    let allowance = allowance.max(1);
    let line = allowance.max(burst.unwrap_or(0));
    let reach = max_peak.max(line.saturating_mul(2)).max(1);
    let mut edges: Vec<u64> = vec![0];
    // Below the allowance: allowance / 2^k, down to 1.
    let mut below = Vec::new();
    let mut d = 1u64;
    while allowance / d >= 1 && d <= 1 << 62 {
        below.push(allowance / d);
        d *= 2;
    }
    edges.extend(below.into_iter().rev());
    let mut e = allowance;
    while e < reach {
        e = e.saturating_mul(2);
        edges.push(e);
    }
    if let Some(b) = burst {
        edges.push(b);
    }
    edges.sort_unstable();
    edges.dedup();
    edges.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Draws, for each limit, how many keys reached each peak (most requests in one period or
/// window), on log scales, against the limit's allowance per period and its burst. The bins
/// are chosen around those lines ([`peak_bins`]): every bar is wholly on one side of each.
pub fn peaks(path: &Path, res: &Results) -> Result<(), Error> {
    let n = res.defs.len();
    let root = SVGBackend::new(path, (1000, 60 + 330 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(44);
    head.draw_text(
        "Keys by their peak rate, against each limit",
        &(FONT, 20).into_font().color(&BLACK),
        (12, 12),
    )
    .map_err(err)?;
    let areas = body.split_evenly((n, 1));
    for (i, area) in areas.iter().enumerate() {
        let def = &res.defs[i];
        let st = &res.stats[i];
        let allowance = def.limit.per_period();
        let burst = (def.limit.is_gcra() && def.limit.capacity() != allowance)
            .then(|| def.limit.capacity());
        let max_peak = st.keys.iter().map(|k| u64::from(k.peak)).max().unwrap_or(1);
        let ranges = peak_bins(allowance, burst, max_peak);
        // (keys, keys this limit denied a request of), per bin.
        let mut bins = vec![(0u64, 0u64); ranges.len()];
        for k in st.keys.iter().filter(|k| k.requests > 0) {
            let p = u64::from(k.peak.max(1));
            let b = ranges
                .partition_point(|&(_, hi)| hi < p)
                .min(ranges.len() - 1);
            bins[b].0 += 1;
            bins[b].1 += u64::from(k.by_this > 0);
        }
        let last = bins.iter().rposition(|b| b.0 > 0).unwrap_or(0);
        let line_at = allowance.max(burst.unwrap_or(0));
        let x_hi = ranges[last].1.max(line_at * 2);
        // Bars span [lo + ½, hi + ½]: a line drawn at L + ½ lies between the bin ending at L
        // and the next.
        let x_max = x_hi as f64 + 0.5;
        let y_max = bins.iter().map(|b| b.0).max().unwrap_or(1).max(1) as f64 * 40.0;
        let period = def.limit.period_ns() as f64 / 1e9;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "#{} {} per {}: {} keys, {} denied by it; peak = most requests in one {period} s",
                    i + 1,
                    def.limit,
                    def.template,
                    thousands(st.keys.len() as u64),
                    thousands(st.keys.iter().filter(|k| k.by_this > 0).count() as u64)
                ),
                (FONT, 15),
            )
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(60)
            .build_cartesian_2d((0.5f64..x_max).log_scale(), (0.5f64..y_max).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(format!(
                "peak requests per {period} s (log scale; each bar's range above it)"
            ))
            .y_desc("keys (log scale)")
            .x_label_formatter(&|x| {
                let r = x.round();
                if (x - r).abs() < 1e-6 && r >= 1.0 {
                    thousands(r as u64)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| {
                if *y >= 1.0 {
                    thousands(y.round() as u64)
                } else {
                    String::new()
                }
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        let span = |b: usize| {
            let (lo, hi) = ranges[b];
            ((lo as f64 + 0.5) * 1.02, (hi as f64 + 0.5) / 1.02)
        };
        chart
            .draw_series(
                bins.iter()
                    .enumerate()
                    .filter(|(_, b)| b.0 > 0)
                    .map(|(b, c)| {
                        let (x0, x1) = span(b);
                        Rectangle::new([(x0, 0.5), (x1, c.0 as f64)], ADMIT.mix(0.6).filled())
                    }),
            )
            .map_err(err)?
            .label("keys")
            .legend(|(x, y)| {
                Rectangle::new([(x, y - 5), (x + 16, y + 5)], ADMIT.mix(0.6).filled())
            });
        chart
            .draw_series(
                bins.iter()
                    .enumerate()
                    .filter(|(_, b)| b.1 > 0)
                    .map(|(b, c)| {
                        let (x0, x1) = span(b);
                        Rectangle::new([(x0, 0.5), (x1, c.1 as f64)], DENY.mix(0.8).filled())
                    }),
            )
            .map_err(err)?
            .label("keys with a request this limit denied")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], DENY.mix(0.8).filled()));
        // Each bar's range of peaks, above it.
        chart
            .draw_series(
                bins.iter()
                    .enumerate()
                    .filter(|(_, b)| b.0 > 0)
                    .map(|(b, c)| {
                        let (lo, hi) = ranges[b];
                        let text = if hi == lo + 1 {
                            thousands(hi)
                        } else {
                            format!("{}–{}", thousands(lo + 1), thousands(hi))
                        };
                        let (x0, x1) = span(b);
                        Text::new(
                            text,
                            ((x0 * x1).sqrt(), c.0 as f64 * 1.25),
                            TextStyle::from((FONT, 11).into_font())
                                .pos(Pos::new(HPos::Center, VPos::Bottom)),
                        )
                    }),
            )
            .map_err(err)?;
        let at = allowance as f64 + 0.5;
        chart
            .draw_series(LineSeries::new(
                [(at, 0.5), (at, y_max)],
                BLACK.stroke_width(2),
            ))
            .map_err(err)?
            .label(format!(
                "limit: {allowance} per {period} s (peaks up to {allowance} on its left)"
            ))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.stroke_width(2)));
        if let Some(b) = burst {
            let at = b as f64 + 0.5;
            chart
                .draw_series(DashedLineSeries::new(
                    [(at, 0.5), (at, y_max)],
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?
                .label(format!("burst: {b}"))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.stroke_width(1)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(GREY)
            .label_font((FONT, 13))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Draws the sweep: share of keys and of requests denied against the swept size, the target
/// line and the suggested size.
pub fn sweep(
    path: &Path,
    title: &str,
    results: &[SweepResult],
    target: f64,
    pick: Option<usize>,
) -> Result<(), Error> {
    let root = SVGBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let lo = results.first().map_or(1, |r| r.size) as f64;
    let hi = results.last().map_or(2, |r| r.size).max(2) as f64;
    // Shares in percent on a log axis, so that a target of 0.1 % is as visible as 50 %;
    // a share of 0 is drawn on the floor.
    let smallest = results
        .iter()
        .flat_map(|r| [suggest::key_share(r), suggest::request_share(r)])
        .filter(|&v| v > 0.0)
        .fold(target.max(1e-6), f64::min)
        * 100.0;
    let floor = smallest / 4.0;
    let pct = |v: f64| (v * 100.0).max(floor);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi * 1.05).log_scale(), (floor..100.0).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("size (log scale)")
        .x_labels(20)
        .y_desc("denied, % (log scale; 0 at the floor)")
        .x_label_formatter(&|x| thousands(x.round() as u64))
        .y_label_formatter(&|y| format!("{y}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    let keys: Vec<(f64, f64)> = results
        .iter()
        .map(|r| (r.size as f64, pct(suggest::key_share(r))))
        .collect();
    let reqs: Vec<(f64, f64)> = results
        .iter()
        .map(|r| (r.size as f64, pct(suggest::request_share(r))))
        .collect();
    chart
        .draw_series(LineSeries::new(keys.clone(), DENY.stroke_width(2)))
        .map_err(err)?
        .label("keys ever denied by it")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], DENY.stroke_width(2)));
    chart
        .draw_series(keys.iter().map(|&p| Circle::new(p, 3, DENY.filled())))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(reqs.clone(), ADMIT.stroke_width(2)))
        .map_err(err)?
        .label("requests denied by it")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], ADMIT.stroke_width(2)));
    chart
        .draw_series(reqs.iter().map(|&p| Circle::new(p, 3, ADMIT.filled())))
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(
            [(lo, pct(target)), (hi * 1.05, pct(target))],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(err)?
        .label(format!("target: {} % of keys", target * 100.0))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    if let Some(i) = pick {
        let x = results[i].size as f64;
        chart
            .draw_series(LineSeries::new(
                [(x, floor), (x, 100.0)],
                RGBColor(44, 160, 44).stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("suggested: {}", results[i].spec))
            .legend(|(x, y)| {
                PathElement::new([(x, y), (x + 16, y)], RGBColor(44, 160, 44).stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(GREY)
        .label_font((FONT, 13))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    const MIDNIGHT: u64 = 1_762_128_000 * S; // 2025-11-03T00:00:00Z

    #[test]
    fn clock_labels_name_the_tick_they_stand_at() {
        // A tick at 1.6 min that float steps left a hair short of it is 00:01:36, not :35.
        assert_eq!(
            clock_label(MIDNIGHT, 1.5999999999999999, 60, 100),
            "00:01:36"
        );
        assert_eq!(clock_label(MIDNIGHT, 0.5, 60, 100), "00:00:30");
        assert_eq!(clock_label(MIDNIGHT, 20.0, 60, 3600), "00:20");
        assert_eq!(clock_label(MIDNIGHT, 30.0, 3600, 3 * 86_400), "11-04 06:00");
        // A tick between two labels of the axis' resolution gets none: a span of 3 s puts
        // ticks every 0.5 s, which would repeat each second twice.
        assert_eq!(clock_label(MIDNIGHT, 0.5 / 60.0, 60, 3), "");
        assert_eq!(clock_label(MIDNIGHT, 1.0 / 60.0, 60, 3), "00:00:01");
        assert_eq!(clock_label(MIDNIGHT, 2.5, 60, 3600), "");
    }

    #[test]
    fn short_timelines_count_in_seconds() {
        // Ticks at round seconds (0, 1, 2 … or 0, 10, 20 …), not at fractions of a minute.
        assert_eq!(time_unit(5), 1);
        assert_eq!(time_unit(120), 1);
        assert_eq!(time_unit(3600), 60);
        assert_eq!(time_unit(86_400), 3600);
    }

    #[test]
    fn count_labels_are_whole_numbers() {
        // A panel whose busiest bucket holds 2 requests puts ticks at 0, 0.5, 1, 1.5, 2.
        assert_eq!(count_label(0.5), "");
        assert_eq!(count_label(1.5), "");
        assert_eq!(count_label(0.0), "0");
        assert_eq!(count_label(2.0), "2");
        assert_eq!(count_label(2500.0), "2,500");
    }

    #[test]
    fn peak_bins_end_at_the_limit_and_the_burst() {
        // GCRA 20 10 1: 10 per second, burst 20; powers of two would put 16..31 around both.
        let bins = peak_bins(10, Some(20), 32);
        assert_eq!(bins, [(0, 1), (1, 2), (2, 5), (5, 10), (10, 20), (20, 40)]);
        // WINDOW 5 60 LOG: 5 per window.
        assert_eq!(peak_bins(5, None, 3), [(0, 1), (1, 2), (2, 5), (5, 10)]);
        // GCRA 7 4 1: both lines are bin edges.
        let bins = peak_bins(4, Some(7), 100);
        assert!(bins.iter().any(|b| b.1 == 4) && bins.iter().any(|b| b.1 == 7));
        // No bin holds peaks on both sides of a line, and they tile 1..=max.
        for (allowance, burst, max) in [(10, Some(20), 32), (1, None, 1), (3, Some(100), 5000)] {
            let bins = peak_bins(allowance, burst, max);
            assert_eq!(bins[0].0, 0);
            assert!(bins.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1));
            assert!(bins.last().unwrap().1 >= max);
            for line in [Some(allowance), burst].into_iter().flatten() {
                assert!(bins.iter().all(|&(lo, hi)| !(lo < line && line < hi)));
            }
        }
    }

    #[test]
    fn bucket_widths_are_round_and_cover_the_span() {
        assert_eq!(buckets_for(100 * S, 100 * S, 240), (100 * S, S, 1));
        let (start, w, n) = buckets_for(1000 * S + 7, 1000 * S + 86_399 * S, 240);
        assert_eq!(w, 600 * S);
        assert!(start <= 1000 * S && start + w * n as u64 > 1000 * S + 86_399 * S);
        assert!(n <= 241);
        let (_, w, _) = buckets_for(0, 3_000_000 * S, 10);
        assert!(w >= 300_000 * S);
    }
}
