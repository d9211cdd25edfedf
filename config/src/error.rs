//! Errors of configuration loading and validation; each names its source
//! (file and position, environment variable, or key).

use std::path::PathBuf;

/// Why a configuration could not be loaded or was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config: cannot read {}: {source}", path.display())]
    Read {
        /// The file that was tried.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid JSON or does not fit the schema
    /// (unknown key, wrong type, bad value).
    #[error("config: {}:{line}:{column}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error (0 when unknown).
        line: usize,
        /// 1-based column of the error (0 when unknown).
        column: usize,
        /// The parser's message, without its position suffix.
        message: String,
    },
    /// An `OCEANCODE_*` environment variable holds a value that cannot be used.
    #[error("config: environment variable {var}={value:?}: {message}")]
    Env {
        /// The variable's name.
        var: String,
        /// The value it holds, credentials masked.
        value: String,
        /// Why it was refused.
        message: String,
    },
    /// A setting is out of range or inconsistent (found by `validate()`).
    #[error("config: {key}: {message}")]
    Invalid {
        /// Dotted path of the key, e.g. `ledger.tideline.tokens`.
        key: String,
        /// Why it was refused.
        message: String,
    },
}

/// Keys that were removed but are still read (and warned about): not keys
/// to suggest.
const REMOVED_KEYS: &[&str] = &["low", "reserve", "profile", "hard_tokens"];

/// A parser message's `expected one of `a`, `b`` list without the removed
/// keys (they are read only to warn that they are gone).
fn without_removed_keys(message: &str) -> String {
    const LIST: &str = "expected one of ";
    let Some(at) = message.find(LIST) else {
        return message.to_string();
    };
    let (head, list) = message.split_at(at + LIST.len());
    let kept: Vec<&str> = list
        .split(", ")
        .filter(|k| !REMOVED_KEYS.iter().any(|r| k.trim_matches('`') == *r))
        .collect();
    format!("{head}{}", kept.join(", "))
}

impl ConfigError {
    /// A [`ConfigError::Invalid`] for `key`.
    pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }

    /// A [`ConfigError::Env`] for `var`; the value is kept without the
    /// credentials a URL may carry ([`crate::redact::redact_url`]).
    pub(crate) fn env(var: &str, value: &str, message: impl Into<String>) -> Self {
        ConfigError::Env {
            var: var.to_string(),
            value: crate::redact::redact_url(value),
            message: message.into(),
        }
    }

    /// A [`ConfigError::Parse`] from a `serde_json` error on `path`.
    pub(crate) fn parse(path: PathBuf, err: &serde_json::Error) -> Self {
        let (line, column) = (err.line(), err.column());
        let full = err.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = without_removed_keys(full.strip_suffix(&suffix).unwrap_or(&full));
        ConfigError::Parse {
            path,
            line,
            column,
            message,
        }
    }
}
