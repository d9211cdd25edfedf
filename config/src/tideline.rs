//! Tideline settings as written by users: `40%`, `500k`, `1.5m`, `0`, and the block size.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The smallest fixed line a user may set (tokens), and the floor every
/// line resolves to at least (a percentage too).
pub const MIN_FIXED_LINE: u64 = 20_000;

/// The largest context window a percentage is checked against without a
/// model: 10M tokens.
pub const MAX_CHECKED_WINDOW: u64 = 10_000_000;

/// The smallest percentage accepted anywhere: below it a line resolves
/// under [`MIN_FIXED_LINE`] on every window up to [`MAX_CHECKED_WINDOW`]
/// (a proxy also checks a percentage against its sessions' own windows).
pub const MIN_PERCENT: f64 = MIN_FIXED_LINE as f64 * 100.0 / MAX_CHECKED_WINDOW as f64;

/// Where the tideline sits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineSpec {
    /// A share of the model's context window, in percent (0 < p ≤ 100).
    Percent(f64),
    /// A fixed number of tokens; `0` means the model's own ceiling
    /// (context − output allowance).
    Tokens(u64),
}

impl Default for LineSpec {
    fn default() -> Self {
        LineSpec::Percent(40.0)
    }
}

/// How much the gauge must grow before a block closes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockSpec {
    /// A fixed number of tokens.
    Tokens(u64),
    /// A share of the line, in percent.
    PercentOfLine(f64),
}

impl Default for BlockSpec {
    fn default() -> Self {
        BlockSpec::PercentOfLine(70.0)
    }
}

/// A malformed `40%` / `500k` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid amount {input:?}: {reason}")]
pub struct AmountError {
    /// What the user wrote.
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// A parsed amount: a percentage or a token count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// `40%`
    Percent(f64),
    /// `500k`, `1.5m`, `20000`
    Tokens(u64),
}

impl FromStr for Amount {
    type Err = AmountError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| AmountError {
            input: s.to_string(),
            reason,
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(err("empty"));
        }
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| err("not a number"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(err("a percentage must be above 0 and at most 100"));
            }
            return Ok(Amount::Percent(v));
        }
        let lower = t.to_ascii_lowercase();
        let (num, mult) = if let Some(n) = lower.strip_suffix('k') {
            (n, 1_000f64)
        } else if let Some(n) = lower.strip_suffix('m') {
            (n, 1_000_000f64)
        } else {
            (lower.as_str(), 1f64)
        };
        let v: f64 = num.trim().parse().map_err(|_| err("not a number"))?;
        if !v.is_finite() || v < 0.0 {
            return Err(err("must be a non-negative number"));
        }
        let tokens = (v * mult).round();
        if tokens > u64::MAX as f64 / 2.0 {
            return Err(err("too large"));
        }
        Ok(Amount::Tokens(tokens as u64))
    }
}

impl Amount {
    /// Parses `s` (see [`FromStr`]); the same as `s.parse::<Amount>()`.
    pub fn parse(s: &str) -> Result<Amount, AmountError> {
        s.parse()
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Percent(p) => write!(f, "{p}%"),
            Amount::Tokens(t) => write!(f, "{t}"),
        }
    }
}

impl fmt::Display for LineSpec {
    /// `40%` or a token count (`500000`; `0` = the model's ceiling).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineSpec::Percent(p) => write!(f, "{p}%"),
            LineSpec::Tokens(t) => write!(f, "{t}"),
        }
    }
}

impl LineSpec {
    /// The rule every line value follows, wherever it is given (the config
    /// file, `OCEANCODE_TIDELINE`, `serve`/`run --tideline`, the `tideline`
    /// command and the admin API): a percentage above 0 and at most 100, a
    /// fixed line of at least [`MIN_FIXED_LINE`] tokens, or 0 (the model's
    /// ceiling). Returns why a value breaks it. A percentage under
    /// [`MIN_PERCENT`] is refused too: it resolves under the 20k floor on
    /// any model.
    pub fn check(self) -> Result<LineSpec, &'static str> {
        match self {
            LineSpec::Percent(p) if !(p > 0.0 && p <= 100.0) => {
                Err("a percentage must be above 0 and at most 100")
            }
            LineSpec::Percent(p) if p < MIN_PERCENT => {
                Err("a percentage under 0.2% resolves under the 20k-token floor of a tideline on any model (windows up to 10M tokens)")
            }
            LineSpec::Tokens(t) if t != 0 && t < MIN_FIXED_LINE => {
                Err("a fixed tideline must be at least 20k tokens (or 0 for the model ceiling)")
            }
            ok => Ok(ok),
        }
    }
}

impl FromStr for LineSpec {
    type Err = AmountError;

    /// The one parser of a line value: `40%` → share of the context; `500k`
    /// / `1.5m` / `300000` → fixed tokens; `0` → the model's ceiling; then
    /// [`LineSpec::check`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let spec = match s.parse::<Amount>()? {
            Amount::Percent(p) => LineSpec::Percent(p),
            Amount::Tokens(t) => LineSpec::Tokens(t),
        };
        spec.check().map_err(|reason| AmountError {
            input: s.to_string(),
            reason,
        })
    }
}

impl fmt::Display for BlockSpec {
    /// `35%` (of the line) or a token count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockSpec::PercentOfLine(p) => write!(f, "{p}%"),
            BlockSpec::Tokens(t) => write!(f, "{t}"),
        }
    }
}

impl FromStr for BlockSpec {
    type Err = AmountError;

    /// `35%` → share of the line; `20k` / `20000` → tokens (above 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<Amount>()? {
            Amount::Percent(p) => Ok(BlockSpec::PercentOfLine(p)),
            Amount::Tokens(0) => Err(AmountError {
                input: s.to_string(),
                reason: "a block must be above 0 tokens",
            }),
            Amount::Tokens(t) => Ok(BlockSpec::Tokens(t)),
        }
    }
}
