//! Percentiles over latency samples and Markdown tables.

use std::time::Duration;

/// Sorted samples (microseconds).
#[derive(Clone, Debug, Default)]
pub struct Samples(Vec<u64>);

impl Samples {
    /// From durations.
    pub fn from_durations(d: impl IntoIterator<Item = Duration>) -> Samples {
        let mut v: Vec<u64> = d.into_iter().map(|d| d.as_micros() as u64).collect();
        v.sort_unstable();
        Samples(v)
    }

    /// From microseconds.
    pub fn from_us(mut v: Vec<u64>) -> Samples {
        v.sort_unstable();
        Samples(v)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No samples?
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Nearest-rank percentile in µs (0 when empty).
    pub fn pct(&self, p: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    /// Mean in µs.
    pub fn mean(&self) -> u64 {
        if self.0.is_empty() {
            0
        } else {
            self.0.iter().sum::<u64>() / self.0.len() as u64
        }
    }
}

/// µs as `0.42 ms` / `12.3 ms` / `1.20 s`.
pub fn ms(us: u64) -> String {
    let m = us as f64 / 1000.0;
    if m >= 1000.0 {
        format!("{:.2} s", m / 1000.0)
    } else if m >= 10.0 {
        format!("{m:.1} ms")
    } else {
        format!("{m:.2} ms")
    }
}

/// A signed µs difference as `+0.42 ms` / `−1.3 ms`.
pub fn ms_signed(us: i64) -> String {
    if us < 0 {
        format!("−{}", ms(us.unsigned_abs()))
    } else {
        format!("+{}", ms(us as u64))
    }
}

/// A Markdown table.
pub struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// With these column titles.
    pub fn new<S: ToString>(head: impl IntoIterator<Item = S>) -> Table {
        Table {
            head: head.into_iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row.
    pub fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows
            .push(cells.into_iter().map(|s| s.to_string()).collect());
    }

    /// Render with right-aligned columns except the first.
    pub fn render(&self) -> String {
        let n = self.head.len();
        let mut w = vec![3usize; n];
        for r in std::iter::once(&self.head).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, width) in w.iter().enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = width - c.chars().count();
                if i == 0 {
                    s.push_str(&format!(" {c}{} |", " ".repeat(pad)));
                } else {
                    s.push_str(&format!(" {}{c} |", " ".repeat(pad)));
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.head);
        out.push('|');
        for (i, width) in w.iter().enumerate() {
            if i == 0 {
                out.push_str(&format!(" {} |", "-".repeat(*width)));
            } else {
                out.push_str(&format!(" {}: |", "-".repeat(width - 1)));
            }
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s = Samples::from_us((1..=100).collect());
        assert_eq!((s.pct(50.0), s.pct(99.0), s.pct(100.0)), (50, 99, 100));
        assert_eq!(Samples::default().pct(50.0), 0);
        assert_eq!(ms(420), "0.42 ms");
        assert_eq!(ms_signed(-1_300), "−1.30 ms");
    }

    #[test]
    fn table() {
        let mut t = Table::new(["a", "bb"]);
        t.row(["x", "1"]);
        assert_eq!(t.render(), "| a   |  bb |\n| --- | --: |\n| x   |   1 |\n");
    }
}
