//! The one Prometheus text writer of `/metrics`: every family is written
//! with its `# HELP` and `# TYPE` lines; durations are in seconds (names end
//! in `_seconds`), sizes in bytes.

use std::fmt::Write as _;

/// A Prometheus text exposition being written.
#[derive(Default)]
pub struct Prom {
    out: String,
}

impl Prom {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    fn head(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.head(name, help, "counter");
        let _ = writeln!(self.out, "{name} {v}");
    }

    /// A counter of seconds, from microseconds.
    pub fn seconds_total(&mut self, name: &str, help: &str, us: u64) {
        self.head(name, help, "counter");
        let _ = writeln!(self.out, "{name} {:.6}", us as f64 / 1e6);
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.head(name, help, "gauge");
        let _ = writeln!(self.out, "{name} {v}");
    }

    /// One family of `kind` with a sample per label value:
    /// `name{label="value"} v`.
    pub fn labeled(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        label: &str,
        samples: &[(&str, f64)],
    ) {
        self.head(name, help, kind);
        for (value, v) in samples {
            let _ = writeln!(self.out, "{name}{{{label}=\"{value}\"}} {v}");
        }
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_and_seconds_are_seconds() {
        let mut p = Prom::new();
        p.counter("x_total", "Xs.", 3);
        p.seconds_total("t_seconds_total", "Time.", 1_500_000);
        p.gauge("g", "G.", 0.25);
        p.labeled(
            "l_total",
            "L.",
            "counter",
            "kind",
            &[("a", 1.0), ("b", 2.0)],
        );
        let t = p.finish();
        assert_eq!(
            t,
            "# HELP x_total Xs.\n# TYPE x_total counter\nx_total 3\n\
             # HELP t_seconds_total Time.\n# TYPE t_seconds_total counter\nt_seconds_total 1.500000\n\
             # HELP g G.\n# TYPE g gauge\ng 0.25\n\
             # HELP l_total L.\n# TYPE l_total counter\nl_total{kind=\"a\"} 1\nl_total{kind=\"b\"} 2\n"
        );
    }
}
