//! A small hand-written SVG line chart (one polyline per series).

use std::fmt::Write;

/// One line of the chart.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Stroke colour (CSS).
    pub color: String,
    /// Dashed?
    pub dashed: bool,
    /// Points `(x, y)`.
    pub points: Vec<(f64, f64)>,
}

/// A horizontal reference line.
pub struct HLine {
    /// Label drawn at its right end.
    pub label: String,
    /// Value.
    pub y: f64,
}

fn nice_step(range: f64, ticks: f64) -> f64 {
    let raw = (range / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn fmt_tick(v: f64) -> String {
    // Ticks are multiples of a step: drop the float noise (0.6000000001).
    let v = (v * 1e6).round() / 1e6;
    if v >= 1_000_000.0 {
        format!("{}M", v / 1_000_000.0)
    } else if v >= 1_000.0 {
        format!("{}k", v / 1_000.0)
    } else {
        format!("{v}")
    }
}

/// Render a chart `w`×`h` px. Points are thinned to at most one per pixel column.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    hlines: &[HLine],
    (w, h): (f64, f64),
) -> String {
    let (ml, mr, mt, mb) = (
        70.0,
        20.0,
        40.0,
        50.0 + 18.0 * series.len().div_ceil(2) as f64,
    );
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let xmax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(hlines.iter().map(|l| l.y))
        .fold(1.0f64, f64::max);
    let ystep = nice_step(ymax, 6.0);
    let ytop = (ymax / ystep).ceil() * ystep;
    let xstep = nice_step(xmax, 8.0);
    let xtop = (xmax / xstep).ceil() * xstep;
    let sx = |x: f64| ml + x / xtop * pw;
    let sy = |y: f64| mt + ph - y / ytop * ph;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    // Grid and ticks.
    let mut i = 0.0;
    while i * ystep <= ytop + ystep / 2.0 {
        let y = i * ystep;
        i += 1.0;
        let py = sy(y);
        let _ = writeln!(
            o,
            r##"<line x1="{ml}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            py + 4.0,
            fmt_tick(y)
        );
    }
    let mut x = 0.0;
    while x <= xtop + xstep / 2.0 {
        let px = sx(x);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" y1="{mt}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            mt + ph,
            mt + ph + 16.0,
            fmt_tick(x)
        );
        x += xstep;
    }
    let _ = writeln!(
        o,
        r##"<rect x="{ml}" y="{mt}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        mt + ph + 34.0,
        esc(x_label)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        mt + ph / 2.0,
        esc(y_label)
    );
    // Labels at the right end of their line; one too close to the one
    // above it goes to the left end instead.
    let mut order: Vec<&HLine> = hlines.iter().collect();
    order.sort_by(|a, b| b.y.total_cmp(&a.y));
    let mut right_at = f64::NEG_INFINITY;
    for l in order {
        let py = sy(l.y);
        let (lx, anchor) = if py - right_at < 14.0 {
            (ml + 4.0, "start")
        } else {
            right_at = py;
            (ml + pw - 4.0, "end")
        };
        let _ = writeln!(
            o,
            r##"<line x1="{ml}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#999" stroke-dasharray="2,3"/><text x="{lx:.1}" y="{:.1}" text-anchor="{anchor}" fill="#666">{}</text>"##,
            ml + pw,
            py - 4.0,
            esc(&l.label)
        );
    }
    for s in series {
        let mut pts = String::new();
        let mut last_col = f64::NEG_INFINITY;
        let n = s.points.len();
        for (i, &(x, y)) in s.points.iter().enumerate() {
            let (px, py) = (sx(x), sy(y));
            // Keep every point where the line moves a lot (drops), else thin.
            let big_move = i > 0 && (s.points[i - 1].1 - y).abs() > ytop / 50.0;
            if px - last_col < 0.5 && !big_move && i + 1 != n {
                continue;
            }
            last_col = px;
            let _ = write!(pts, "{px:.1},{py:.1} ");
        }
        let dash = if s.dashed {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.4"{dash} points="{}"/>"#,
            s.color,
            pts.trim_end()
        );
    }
    // Legend, two columns under the plot.
    for (i, s) in series.iter().enumerate() {
        let lx = ml + (i % 2) as f64 * (pw / 2.0);
        let ly = mt + ph + 52.0 + (i / 2) as f64 * 18.0;
        let dash = if s.dashed {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            s.color,
            lx + 30.0,
            ly + 4.0,
            esc(&s.label)
        );
    }
    o.push_str("</svg>\n");
    o
}
