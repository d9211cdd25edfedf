//! `limits.session`: what one session may spend, in money, steps and time,
//! before the proxy refuses its further requests (bounded CI runs:
//! `run --max-spend 2 --max-steps 200 --max-time 30m -- claude -p …`).
//!
//! The keys sit under `limits` with the connection and body bounds, in a
//! `session` subsection of their own: those bound one request or the
//! process, these a whole session.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// `limits.session`: the per-session bounds (each off when unset).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionLimitsConfig {
    /// Most USD a session may spend at list price (cache reads and writes
    /// included); the step that crosses it completes, the next request is
    /// refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spend_usd: Option<f64>,
    /// Most steps (requests sent upstream) a session may make.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Longest a session may run, from its first request (`30m`, `2h`,
    /// `1h30m`, `90s`, or a number of seconds).
    #[serde(
        deserialize_with = "de_duration",
        serialize_with = "ser_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub time: Option<Duration>,
}

impl SessionLimitsConfig {
    /// Whether any bound is set.
    pub fn any(&self) -> bool {
        self.spend_usd.is_some() || self.steps.is_some() || self.time.is_some()
    }
}

/// Parses a duration: whole numbers with a unit each (`d`, `h`, `m`, `s`),
/// in that order, written together (`1h30m`), or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a duration (use e.g. 90s, 30m, 2h, 1h30m)");
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut last_rank = usize::MAX;
    for c in t.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let (rank, unit) = match c.to_ascii_lowercase() {
            'd' => (3, 86_400),
            'h' => (2, 3_600),
            'm' => (1, 60),
            's' => (0, 1),
            _ => return Err(bad()),
        };
        if num.is_empty() || rank >= last_rank {
            return Err(bad());
        }
        let n: u64 = num.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        num.clear();
        last_rank = rank;
    }
    if !num.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// A duration as [`parse_duration`] reads it back: `2h`, `1h30m`, `45s`.
pub fn format_duration(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, n) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if s >= n {
            out.push_str(&format!("{}{unit}", s / n));
            s %= n;
        }
    }
    out
}

/// Deserializes `time`: seconds (a number) or a string like `"30m"`.
fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Duration>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as \"30m\", \"2h\" or a number of seconds")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(Duration::from_secs(v)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v)
                .map(|s| Some(Duration::from_secs(s)))
                .map_err(|_| E::custom(format!("duration {v} is negative")))
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            parse_duration(s).map(Some).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

/// Serializes `time` the way it is written: `"30m"`.
fn ser_duration<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_duration(*d)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: failures panic
    use super::*;

    #[test]
    fn durations_parse_and_read_back() {
        for (text, secs) in [
            ("90", 90),
            ("90s", 90),
            ("30m", 1800),
            ("2h", 7200),
            ("1h30m", 5400),
            ("1d2h3m4s", 93_784),
            (" 2H ", 7200),
        ] {
            let d = parse_duration(text).unwrap();
            assert_eq!(d.as_secs(), secs, "{text}");
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{text}");
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        for bad in [
            "", "m", "30x", "30m2h", "1.5h", "-5m", "2h2h", "30 m", "1h30",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }
}
