//! The context chart of a session page, drawn by the server as inline SVG:
//! the window the upstream saw per step (the sawtooth), the line, one
//! marker per cut (a link to where the cut falls), cache reads and writes
//! per step, and the spend over time. A large session is drawn at a bounded
//! number of points (the sawtooth keeps each bucket's low and high). Pure.

use super::html::Html;
use oceancode_config::Price;
use oceancode_ledger::store::{CutRecord, StepRecord};
use std::fmt::Write as _;

/// The SVG's user-space width and the plot's left edge.
const W: f64 = 1000.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
/// Panels: window (top), cache (middle), spend (bottom).
const WIN_TOP: f64 = 14.0;
const WIN_H: f64 = 190.0;
const CACHE_TOP: f64 = 236.0;
const CACHE_H: f64 = 70.0;
const SPEND_TOP: f64 = 338.0;
const SPEND_H: f64 = 50.0;
const H: f64 = 404.0;
/// Steps drawn one point (a circle) each up to this many.
pub const MAX_DOTS: usize = 600;
/// The sawtooth keeps at most this many buckets (two points each).
const MAX_BUCKETS: usize = 1500;
/// Cache bars drawn at most.
const MAX_BARS: usize = 400;

/// What one step contributes to the chart.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    /// Step number.
    pub step: u32,
    /// Window tokens (input + cache read + cache write + output).
    pub window: u64,
    /// Cache reads.
    pub cache_read: u64,
    /// Cache writes.
    pub cache_write: u64,
    /// Spend so far, USD (priced steps only).
    pub spend: f64,
    /// The step failed.
    pub failed: bool,
    /// The step wrote more of the prompt than it appended: why
    /// (`steps.detail.cache`).
    pub miss: Option<oceancode_window::cache::MissCause>,
    /// The tokens it sent again.
    pub miss_tokens: u64,
    /// Why its cache was cold on arrival.
    pub cold: Option<oceancode_window::cache::Cold>,
    /// It cut the window at a cold request (a free cut).
    pub free_cut: bool,
}

/// The chart's points: one per step, in order.
pub fn points(steps: &[StepRecord], price: &dyn Fn(&str) -> Option<Price>) -> Vec<Point> {
    let mut spend = 0.0;
    steps
        .iter()
        .map(|s| {
            let billed = oceancode_ledger::status::billed(s.usage, &s.detail);
            if let Some(p) = price(&s.model) {
                spend += p.cost_usd(
                    billed.input,
                    billed.output,
                    billed.cache_read,
                    billed.cache_write,
                );
            }
            Point {
                step: s.step,
                window: s.usage.window_total(),
                cache_read: s.usage.cache_read,
                cache_write: s.usage.cache_write,
                spend,
                failed: s.error.is_some(),
                miss: s.detail.cache.as_ref().and_then(|c| c.miss),
                miss_tokens: s.detail.cache.as_ref().map_or(0, |c| c.miss_tokens),
                cold: s.detail.cache.as_ref().and_then(|c| c.cold),
                free_cut: s.detail.cache.as_ref().is_some_and(|c| c.free_cut),
            }
        })
        .collect()
}

/// The index of the step a cut belongs to: the first step recorded at or
/// after it (a cut is made while its step is prepared).
pub fn cut_step_index(points_ts: &[i64], cut: &CutRecord) -> usize {
    let i = points_ts.partition_point(|&t| t < cut.ts_ms);
    i.min(points_ts.len().saturating_sub(1))
}

fn x_of(i: usize, n: usize) -> f64 {
    if n <= 1 {
        LEFT + (W - LEFT - RIGHT) / 2.0
    } else {
        LEFT + i as f64 * (W - LEFT - RIGHT) / (n - 1) as f64
    }
}

fn fmt_tokens(n: u64) -> String {
    oceancode_ledger::status::tokens(n)
}

/// A cut as the chart marks it.
pub struct Marker {
    /// Index of its step among the points.
    pub at: usize,
    /// The cut.
    pub cut: CutRecord,
    /// Where the marker links (a viewer URL).
    pub href: String,
}

/// Draw the chart. `line` is the line in force (tokens), if known.
pub fn render(points: &[Point], markers: &[Marker], line: Option<u64>) -> Html {
    let mut h = Html::new();
    let n = points.len();
    let n_s = n.to_string();
    let m_s = markers.len().to_string();
    h.open(
        "figure",
        &[
            ("class", "chart"),
            ("id", "chart"),
            ("data-steps", &n_s),
            ("data-cuts", &m_s),
        ],
    );
    if n == 0 {
        h.el("p", &[("class", "muted")], "No step recorded yet.");
        h.close("figure");
        return h;
    }
    let vb = format!("0 0 {W} {H}");
    h.open(
        "svg",
        &[
            ("viewBox", &vb),
            ("xmlns", "http://www.w3.org/2000/svg"),
            ("role", "img"),
            (
                "aria-label",
                "window tokens per step, the line and the cuts",
            ),
        ],
    );
    let max_win = points
        .iter()
        .map(|p| p.window)
        .chain(line)
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.08;
    let y_win = |v: u64| WIN_TOP + WIN_H - (v as f64 / max_win) * WIN_H;
    // Axes and labels.
    panel(
        &mut h,
        WIN_TOP,
        WIN_H,
        "window",
        &fmt_tokens(max_win as u64),
    );
    // The line.
    if let Some(l) = line.filter(|&l| l > 0) {
        let y = format!("{:.1}", y_win(l));
        h.void(
            "line",
            &[
                ("class", "tideline"),
                ("x1", &LEFT.to_string()),
                ("x2", &(W - RIGHT).to_string()),
                ("y1", &y),
                ("y2", &y),
            ],
        );
        let label = format!("line {}", fmt_tokens(l));
        let ly = format!("{:.1}", y_win(l) - 4.0);
        h.el(
            "text",
            &[
                ("class", "lbl line-lbl"),
                ("x", &(LEFT + 4.0).to_string()),
                ("y", &ly),
                ("text-anchor", "start"),
            ],
            &label,
        );
    }
    // The sawtooth.
    let mut pts = String::with_capacity(n.min(MAX_BUCKETS * 2) * 14);
    let valid: Vec<(usize, &Point)> = points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.window > 0)
        .collect();
    if valid.len() <= MAX_BUCKETS * 2 {
        for (i, p) in &valid {
            let _ = write!(pts, "{:.1},{:.1} ", x_of(*i, n), y_win(p.window));
        }
    } else {
        let per = valid.len().div_ceil(MAX_BUCKETS);
        for chunk in valid.chunks(per) {
            let lo = chunk.iter().min_by_key(|(_, p)| p.window);
            let hi = chunk.iter().max_by_key(|(_, p)| p.window);
            if let (Some(lo), Some(hi)) = (lo, hi) {
                let (a, b) = if lo.0 <= hi.0 { (lo, hi) } else { (hi, lo) };
                for (i, p) in [a, b] {
                    let _ = write!(pts, "{:.1},{:.1} ", x_of(*i, n), y_win(p.window));
                }
            }
        }
    }
    h.void(
        "polyline",
        &[("class", "window"), ("points", pts.trim_end())],
    );
    // One dot per step, with its numbers as a tooltip.
    if n <= MAX_DOTS {
        for (i, p) in points.iter().enumerate() {
            let cx = format!("{:.1}", x_of(i, n));
            let cy = format!("{:.1}", y_win(p.window));
            let step = p.step.to_string();
            let class = match (p.failed, p.miss.is_some()) {
                (true, _) => "pt failed",
                (false, true) => "pt miss",
                _ => "pt",
            };
            h.open(
                "circle",
                &[
                    ("class", class),
                    ("cx", &cx),
                    ("cy", &cy),
                    ("r", "3"),
                    ("data-step", &step),
                ],
            );
            h.el("title", &[], &tooltip(p));
            h.close("circle");
        }
    }
    // Cut markers.
    for m in markers {
        let x = format!("{:.1}", x_of(m.at, n));
        let free = points.get(m.at).is_some_and(|p| p.free_cut);
        let title = format!(
            "cut: every row up to seq {} left the window (gauge {}, line {}){}",
            m.cut.upto_seq,
            fmt_tokens(m.cut.gauge),
            fmt_tokens(m.cut.line),
            if free {
                " · free: the prompt cache was already cold"
            } else {
                ""
            }
        );
        let upto = m.cut.upto_seq.to_string();
        h.open(
            "a",
            &[
                ("href", &m.href),
                ("class", "cut-link"),
                ("data-upto", &upto),
            ],
        );
        h.void(
            "line",
            &[
                ("class", if free { "cut free" } else { "cut" }),
                ("x1", &x),
                ("x2", &x),
                ("y1", &WIN_TOP.to_string()),
                ("y2", &(WIN_TOP + WIN_H).to_string()),
            ],
        );
        let ty = format!("{:.1}", WIN_TOP + 10.0);
        h.open(
            "text",
            &[
                ("class", "cut-lbl"),
                ("x", &x),
                ("y", &ty),
                ("text-anchor", "middle"),
            ],
        )
        .raw("✂")
        .close("text");
        h.el("title", &[], &title);
        h.close("a");
    }
    // Cache reads and writes per step (stacked bars, bucketed).
    let max_cache = points
        .iter()
        .map(|p| p.cache_read + p.cache_write)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    panel(
        &mut h,
        CACHE_TOP,
        CACHE_H,
        "cache",
        &fmt_tokens(max_cache as u64),
    );
    let per = n.div_ceil(MAX_BARS).max(1);
    let slot = (W - LEFT - RIGHT) / n.div_ceil(per) as f64;
    let bw = format!("{:.2}", (slot * 0.8).max(0.5));
    for (b, chunk) in points.chunks(per).enumerate() {
        let k = chunk.len() as f64;
        let read = chunk.iter().map(|p| p.cache_read).sum::<u64>() as f64 / k;
        let write = chunk.iter().map(|p| p.cache_write).sum::<u64>() as f64 / k;
        let x = format!("{:.2}", LEFT + b as f64 * slot + slot * 0.1);
        let hr = read / max_cache * CACHE_H;
        let hw = write / max_cache * CACHE_H;
        let base = CACHE_TOP + CACHE_H;
        if hr > 0.0 {
            h.void(
                "rect",
                &[
                    ("class", "cread"),
                    ("x", &x),
                    ("y", &format!("{:.2}", base - hr)),
                    ("width", &bw),
                    ("height", &format!("{hr:.2}")),
                ],
            );
        }
        if hw > 0.0 {
            h.void(
                "rect",
                &[
                    ("class", "cwrite"),
                    ("x", &x),
                    ("y", &format!("{:.2}", base - hr - hw)),
                    ("width", &bw),
                    ("height", &format!("{hw:.2}")),
                ],
            );
        }
    }
    // Spend over time.
    let max_spend = points.last().map(|p| p.spend).unwrap_or(0.0);
    panel(
        &mut h,
        SPEND_TOP,
        SPEND_H,
        "spend",
        &format!("${max_spend:.2}"),
    );
    if max_spend > 0.0 {
        let per = n.div_ceil(MAX_BUCKETS).max(1);
        let mut sp = String::new();
        for (i, p) in points.iter().enumerate() {
            if i % per == 0 || i + 1 == n {
                let y = SPEND_TOP + SPEND_H - p.spend / max_spend * SPEND_H;
                let _ = write!(sp, "{:.1},{:.1} ", x_of(i, n), y);
            }
        }
        h.void("polyline", &[("class", "spend"), ("points", sp.trim_end())]);
    }
    // Step numbers under the last panel.
    let first = points.first().map(|p| p.step).unwrap_or(0);
    let last = points.last().map(|p| p.step).unwrap_or(0);
    let ty = format!("{:.1}", H - 2.0);
    h.el(
        "text",
        &[("class", "lbl"), ("x", &LEFT.to_string()), ("y", &ty)],
        &format!("step {first}"),
    );
    h.el(
        "text",
        &[
            ("class", "lbl"),
            ("x", &(W - RIGHT).to_string()),
            ("y", &ty),
            ("text-anchor", "end"),
        ],
        &format!("step {last}"),
    );
    // A hover band the script moves to the step under the pointer.
    h.void(
        "rect",
        &[
            ("class", "hover"),
            ("id", "hover"),
            ("x", "0"),
            ("y", &WIN_TOP.to_string()),
            ("width", "1"),
            ("height", &(SPEND_TOP + SPEND_H - WIN_TOP).to_string()),
        ],
    );
    h.close("svg");
    h.open("figcaption", &[]);
    h.raw("<span class=\"key kwin\"></span>window per step <span class=\"key kline\"></span>line <span class=\"key kcut\"></span>cut <span class=\"key kfree\"></span>free cut (cache already cold) <span class=\"key kmiss\"></span>cache miss (hover: its cause) <span class=\"key kread\"></span>cache read <span class=\"key kwrite\"></span>cache write <span class=\"key kspend\"></span>spend");
    h.el("span", &[("class", "tip"), ("id", "tip")], "");
    h.close("figcaption");
    // The numbers the hover shows (numbers only: nothing from content).
    h.open(
        "script",
        &[("type", "application/json"), ("id", "chart-data")],
    );
    let mut js = String::with_capacity(n * 32 + 2);
    js.push('[');
    for (i, p) in points.iter().enumerate() {
        if i > 0 {
            js.push(',');
        }
        let _ = write!(
            js,
            "[{},{},{},{},{:.4},{}]",
            p.step,
            p.window,
            p.cache_read,
            p.cache_write,
            p.spend,
            u8::from(p.failed)
        );
    }
    js.push(']');
    h.text_json(&js);
    h.close("script");
    h.close("figure");
    h
}

fn tooltip(p: &Point) -> String {
    let mut t = format!(
        "step {}: window {} (cache read {}, write {}) · spend ${:.4}{}",
        p.step,
        fmt_tokens(p.window),
        fmt_tokens(p.cache_read),
        fmt_tokens(p.cache_write),
        p.spend,
        if p.failed { " · failed" } else { "" }
    );
    if let Some(c) = p.cold {
        let _ = write!(t, " · cache cold on arrival: {}", c.label());
    }
    if let Some(m) = p.miss {
        let _ = write!(
            t,
            " · cache miss: {} ({} sent again)",
            m.label(),
            fmt_tokens(p.miss_tokens)
        );
    }
    if p.free_cut {
        t.push_str(" · free cut");
    }
    t
}

fn panel(h: &mut Html, top: f64, height: f64, name: &str, max: &str) {
    h.void(
        "rect",
        &[
            ("class", "panel"),
            ("x", &LEFT.to_string()),
            ("y", &top.to_string()),
            ("width", &(W - LEFT - RIGHT).to_string()),
            ("height", &height.to_string()),
        ],
    );
    let ty = format!("{:.1}", top + 10.0);
    h.el(
        "text",
        &[
            ("class", "lbl"),
            ("x", &(LEFT - 6.0).to_string()),
            ("y", &ty),
            ("text-anchor", "end"),
        ],
        max,
    );
    let ny = format!("{:.1}", top + height);
    h.el(
        "text",
        &[
            ("class", "lbl name"),
            ("x", &(LEFT - 6.0).to_string()),
            ("y", &ny),
            ("text-anchor", "end"),
        ],
        name,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(n: usize) -> Vec<Point> {
        (0..n)
            .map(|i| Point {
                step: i as u32 + 1,
                window: 1000 + (i as u64 % 10) * 1000,
                cache_read: 500,
                cache_write: 100,
                spend: i as f64 * 0.01,
                failed: false,
                ..Point::default()
            })
            .collect()
    }

    #[test]
    fn one_dot_per_step_and_one_marker_per_cut() {
        let p = pts(12);
        let cut = CutRecord {
            upto_seq: 7,
            gauge: 9000,
            line: 8000,
            ts_ms: 0,
        };
        let m = vec![Marker {
            at: 9,
            cut,
            href: "/_oceancode/ui/s/x".into(),
        }];
        let s = render(&p, &m, Some(8000)).finish();
        assert_eq!(s.matches("<circle class=\"pt\"").count(), 12);
        assert_eq!(s.matches("<line class=\"cut\"").count(), 1);
        assert!(s.contains("class=\"tideline\""));
        assert!(s.contains("data-steps=\"12\""));
    }

    #[test]
    fn ten_thousand_steps_are_drawn_at_bounded_size() {
        let p = pts(10_000);
        let s = render(&p, &[], Some(8000)).finish();
        assert_eq!(s.matches("<circle").count(), 0);
        assert!(s.matches("<rect class=\"cread\"").count() <= MAX_BARS);
        assert!(s.len() < 600_000, "{} bytes", s.len());
    }

    #[test]
    fn a_free_cut_and_a_miss_say_so() {
        let mut p = pts(3);
        p[1].free_cut = true;
        p[1].cold = Some(oceancode_window::cache::Cold::TtlExpired);
        p[1].miss = Some(oceancode_window::cache::MissCause::Cut);
        p[1].miss_tokens = 40_000;
        let m = vec![Marker {
            at: 1,
            cut: CutRecord {
                upto_seq: 4,
                gauge: 9_000,
                line: 8_000,
                ts_ms: 0,
            },
            href: "#s4".into(),
        }];
        let s = render(&p, &m, Some(8_000)).finish();
        assert!(s.contains("<line class=\"cut free\""), "{s}");
        assert!(s.contains("free: the prompt cache was already cold"));
        assert!(s.contains("cache miss: cut (40k sent again)"), "{s}");
        assert!(s.contains("cache cold on arrival: ttl_expired"));
        assert_eq!(s.matches("class=\"pt miss\"").count(), 1);
        assert!(s.contains("free cut (cache already cold)"), "the legend");
    }

    #[test]
    fn a_cut_belongs_to_the_first_step_at_or_after_it() {
        let ts = [10, 20, 30];
        let c = |t| CutRecord {
            upto_seq: 1,
            gauge: 0,
            line: 0,
            ts_ms: t,
        };
        assert_eq!(cut_step_index(&ts, &c(15)), 1);
        assert_eq!(cut_step_index(&ts, &c(20)), 1);
        assert_eq!(cut_step_index(&ts, &c(99)), 2);
        assert_eq!(cut_step_index(&[], &c(1)), 0);
    }
}
