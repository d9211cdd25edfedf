//! Parsing of `oceancode-proxy tideline [--session S] [50% | 500k | now | default]`,
//! shared by the CLI and the admin API.

use crate::tideline::LineSpec;

/// The usage line of the `tideline` command.
pub const TIDELINE_USAGE: &str =
    "usage: oceancode-proxy tideline [--session S] [50% | 500k | now | default]";

/// Preset words of the removed band geometry; refused with a hint.
const PRESETS: &[&str] = &["wide", "narrow", "strict", "auto"];

/// For a bare number that reads as a share written without its `%` (`20`,
/// `40`): what the user more likely meant, e.g. `20% (a share of the
/// model's context) or 20k (20,000 tokens)`; None for anything else.
pub fn bare_number_hint(v: &str) -> Option<String> {
    let n: u64 = v.trim().parse().ok()?;
    (1..=100)
        .contains(&n)
        .then(|| format!("{n}% (a share of the model's context) or {n}k ({n},000 tokens)"))
}

/// What `tideline` was asked to do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TidelineCommand {
    /// No value: show the line, the gauge and the window.
    Show,
    /// Set the line (a percentage, or fixed tokens ≥ 20k).
    Set(LineSpec),
    /// Cut every closed block on the next request.
    Now,
    /// Back to the configured line.
    Default,
}

/// `tideline` with its optional `--session`.
#[derive(Clone, Debug, PartialEq)]
pub struct TidelineArgs {
    /// `--session S`; `None` = the most recent session.
    pub session: Option<String>,
    /// The command.
    pub command: TidelineCommand,
}

/// A `tideline` command line that cannot be used. Displays as the reason,
/// a newline, and [`TIDELINE_USAGE`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}\n{usage}", usage = TIDELINE_USAGE)]
pub struct UsageError {
    /// One short line saying what is wrong.
    pub reason: String,
}

impl UsageError {
    fn new(reason: impl Into<String>) -> Self {
        UsageError {
            reason: reason.into(),
        }
    }
}

/// Parses the words after `tideline` (a leading `tideline` word is skipped).
/// Options are refused here; use [`tideline_args`] when `--session` may appear.
pub fn tideline_command(args: &[String]) -> Result<TidelineCommand, UsageError> {
    let args = strip_command_word(args);
    if let Some(opt) = args.iter().find(|a| a.starts_with("--")) {
        return Err(UsageError::new(format!("unknown option {opt}")));
    }
    parse_values(args)
}

/// Parses the words after `tideline`, including `--session S` / `--session=S`.
pub fn tideline_args(args: &[String]) -> Result<TidelineArgs, UsageError> {
    let args = strip_command_word(args);
    let mut session = None;
    let mut values = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = if a == "--session" {
            match it.next() {
                Some(v) if !v.starts_with("--") => Some(v.clone()),
                _ => return Err(UsageError::new("--session needs a session id")),
            }
        } else if let Some(v) = a.strip_prefix("--session=") {
            Some(v.to_string())
        } else if a.starts_with("--") {
            return Err(UsageError::new(format!("unknown option {a}")));
        } else {
            values.push(a.clone());
            None
        };
        if let Some(v) = value {
            if v.is_empty() {
                return Err(UsageError::new("--session needs a session id"));
            }
            if session.replace(v).is_some() {
                return Err(UsageError::new("--session given twice"));
            }
        }
    }
    Ok(TidelineArgs {
        session,
        command: parse_values(&values)?,
    })
}

fn strip_command_word(args: &[String]) -> &[String] {
    match args.first() {
        Some(w) if w == "tideline" => &args[1..],
        _ => args,
    }
}

fn parse_values(values: &[String]) -> Result<TidelineCommand, UsageError> {
    let v = match values {
        [] => return Ok(TidelineCommand::Show),
        [v] => v.trim(),
        more => {
            return Err(UsageError::new(format!(
                "expected one value, got {}: {}",
                more.len(),
                more.join(" ")
            )))
        }
    };
    let lower = v.to_ascii_lowercase();
    match lower.as_str() {
        "now" => return Ok(TidelineCommand::Now),
        "default" => return Ok(TidelineCommand::Default),
        w if PRESETS.contains(&w) => {
            return Err(UsageError::new(format!(
                "the preset {w:?} was removed; give a percentage (50%) or a token count (500k)"
            )))
        }
        _ => {}
    }
    match v.parse::<LineSpec>() {
        Ok(LineSpec::Tokens(0)) => Err(UsageError::new(
            "0 (the model ceiling) is set in the config file (ledger.tideline.tokens), not here",
        )),
        Ok(spec) => Ok(TidelineCommand::Set(spec)),
        Err(_) if bare_number_hint(v).is_some() => Err(UsageError::new(format!(
            "{v} would be {v} tokens (a fixed tideline is at least 20k): did you mean {}?",
            bare_number_hint(v).unwrap_or_default()
        ))),
        Err(e) if e.reason.starts_with("a fixed tideline") => Err(UsageError::new(format!(
            "a fixed tideline must be at least 20k tokens, got {v}"
        ))),
        Err(e) => Err(UsageError::new(format!(
            "not a tideline value: {v:?} ({})",
            e.reason
        ))),
    }
}
