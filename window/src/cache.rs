//! The provider's prompt cache, as the window logic sees it (pure: the
//! times, the TTL and the models are passed in; no clock is read here).
//!
//! * [`cold`] says whether a request finds the cache already cold (the gap
//!   since the session's previous upstream request is past the TTL the
//!   client asked for, the model changed to one the session has not used
//!   within the TTL, or the session was just resumed from the ledger):
//!   such a request rewrites the whole prefix anyway, so a cut due soon
//!   costs nothing there ([`crate::tideline::Tideline::cut_cold`]).
//! * [`miss_tokens`] finds a cache write beyond the newly appended part;
//!   [`MissCause`] names why it happened.

use serde::{Deserialize, Serialize};

/// The prompt cache's default lifetime (Anthropic `ephemeral`, OpenAI's
/// in-memory retention): 5 minutes.
pub const DEFAULT_TTL_MS: u64 = 5 * 60 * 1000;
/// Anthropic's `cache_control: {"ttl": "1h"}`.
pub const HOUR_TTL_MS: u64 = 60 * 60 * 1000;
/// OpenAI's `prompt_cache_retention: "24h"`.
pub const DAY_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// What the session knows about its previous upstream request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Previous<'a> {
    /// Unix ms it was sent.
    pub at_ms: i64,
    /// Its model.
    pub model: &'a str,
}

/// The facts of one request about the prompt cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    /// Unix ms of this request.
    pub now_ms: i64,
    /// This request's model.
    pub model: &'a str,
    /// The cache lifetime this request's client asked for (ms).
    pub ttl_ms: u64,
    /// The session's previous upstream request (None: a new session, or
    /// one resumed from the ledger that recorded no activity time); for a
    /// resumed session, its recorded last activity and model.
    pub previous: Option<Previous<'a>>,
    /// When this request's model was last sent in the session, if it was
    /// (caches are per model: a switch back within the TTL finds that
    /// model's cache warm).
    pub model_last_ms: Option<i64>,
    /// The session was just read back from the ledger.
    pub resumed: bool,
}

/// Why the prompt cache is cold at a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cold {
    /// The gap since the previous request is past the TTL.
    TtlExpired,
    /// The previous request used another model, and this one was not
    /// used within the TTL (caches are per model).
    ModelSwitch,
    /// The first request after the session was resumed from the ledger,
    /// its recorded last activity past the TTL (or unknown).
    Resumed,
}

impl Cold {
    /// The label (`ttl_expired`, `model_switch`, `resumed`).
    pub fn label(self) -> &'static str {
        match self {
            Cold::TtlExpired => "ttl_expired",
            Cold::ModelSwitch => "model_switch",
            Cold::Resumed => "resumed",
        }
    }
}

/// Whether the request finds the cache cold, and why. A brand-new session
/// (no previous request, not resumed) has nothing cached to lose: `None`.
/// A resumed session is cold when its recorded last activity is older than
/// the TTL, or unknown (a proxy restarted within the TTL finds it warm).
/// After a model switch the cache of this request's model is what counts:
/// warm when the session sent that model within the TTL.
pub fn cold(f: &Facts<'_>) -> Option<Cold> {
    let within =
        |at_ms: i64| u64::try_from(f.now_ms.saturating_sub(at_ms)).unwrap_or(0) <= f.ttl_ms;
    match &f.previous {
        None => f.resumed.then_some(Cold::Resumed),
        Some(p) if !p.model.is_empty() && !f.model.is_empty() && p.model != f.model => {
            (!f.model_last_ms.is_some_and(within)).then_some(Cold::ModelSwitch)
        }
        Some(p) => {
            let expired = if f.resumed {
                Cold::Resumed
            } else {
                Cold::TtlExpired
            };
            (!within(p.at_ms)).then_some(expired)
        }
    }
}

/// The cache TTL a request asks for, from its raw body: 1 h when a
/// `cache_control` carries `"ttl": "1h"` (Anthropic), 24 h with
/// `"prompt_cache_retention": "24h"` (OpenAI), else [`DEFAULT_TTL_MS`]. A
/// byte scan (the key names are unique to these fields); whitespace
/// between the tokens is allowed.
pub fn requested_ttl_ms(body: &[u8]) -> u64 {
    if has_pair(body, b"\"prompt_cache_retention\"", b"\"24h\"") {
        DAY_TTL_MS
    } else if has_pair(body, b"\"ttl\"", b"\"1h\"") {
        HOUR_TTL_MS
    } else {
        DEFAULT_TTL_MS
    }
}

/// `key` `:` `value` somewhere in `body` (JSON whitespace allowed around `:`).
fn has_pair(body: &[u8], key: &[u8], value: &[u8]) -> bool {
    for at in memchr::memmem::find_iter(body, key) {
        let mut i = at + key.len();
        let skip = |i: &mut usize| {
            while body.get(*i).is_some_and(|b| b.is_ascii_whitespace()) {
                *i += 1;
            }
        };
        skip(&mut i);
        if body.get(i) == Some(&b':') {
            i += 1;
            skip(&mut i);
            if body[i..].starts_with(value) {
                return true;
            }
        }
    }
    false
}

/// Why a step wrote (or sent uncached) more of the prompt than it appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissCause {
    /// The proxy cut the window at this request.
    Cut,
    /// A context edit (or compress pointers) changed the window.
    ContextEdit,
    /// The client changed its system prompt, tools or earlier messages.
    ClientChanged,
    /// The gap since the previous request was past the TTL.
    TtlExpired,
    /// The model changed.
    ModelSwitch,
    /// The session was resumed from the ledger (its cache state unknown).
    Resumed,
    /// Only the provider's own diagnosis explains it.
    Provider,
    /// Nothing the proxy saw explains it (the provider evicted early, a
    /// request too short to cache, ...).
    Unknown,
}

impl MissCause {
    /// Every cause, in the order [`MissCause::label`]s are listed.
    pub const ALL: [MissCause; 8] = [
        MissCause::Cut,
        MissCause::ContextEdit,
        MissCause::ClientChanged,
        MissCause::TtlExpired,
        MissCause::ModelSwitch,
        MissCause::Resumed,
        MissCause::Provider,
        MissCause::Unknown,
    ];

    /// The label (`cut`, `context_edit`, `client_changed`, `ttl_expired`,
    /// `model_switch`, `resumed`, `provider`, `unknown`).
    pub fn label(self) -> &'static str {
        match self {
            MissCause::Cut => "cut",
            MissCause::ContextEdit => "context_edit",
            MissCause::ClientChanged => "client_changed",
            MissCause::TtlExpired => "ttl_expired",
            MissCause::ModelSwitch => "model_switch",
            MissCause::Resumed => "resumed",
            MissCause::Provider => "provider",
            MissCause::Unknown => "unknown",
        }
    }
}

impl From<Cold> for MissCause {
    fn from(c: Cold) -> MissCause {
        match c {
            Cold::TtlExpired => MissCause::TtlExpired,
            Cold::ModelSwitch => MissCause::ModelSwitch,
            Cold::Resumed => MissCause::Resumed,
        }
    }
}

/// What the proxy itself saw change at a request, most telling first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The window's start moved (a cut).
    pub cut: bool,
    /// The edit set in force, or the compress pointers, changed.
    pub edit: bool,
    /// Where the client's own request first differs from its previous one
    /// (`system`, `tools`, `message 12`), if it does.
    pub client: Option<String>,
    /// The cache was cold on arrival.
    pub cold: Option<Cold>,
}

/// The cause of a miss: the proxy's own finding, else the provider's
/// reason when it gave one, else unknown.
pub fn cause(ch: &Changes, provider_reason: Option<&str>) -> MissCause {
    if ch.cut {
        MissCause::Cut
    } else if ch.edit {
        MissCause::ContextEdit
    } else if ch.client.is_some() {
        MissCause::ClientChanged
    } else if let Some(c) = ch.cold {
        c.into()
    } else if provider_reason.is_some() {
        MissCause::Provider
    } else {
        MissCause::Unknown
    }
}

/// What a step's record says about the prompt cache (`steps.detail.cache`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheNote {
    /// Why the cache was cold when the request arrived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold: Option<Cold>,
    /// The step cut the window at a cold request: a free cut.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub free_cut: bool,
    /// The step wrote (or sent uncached) more than it appended: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub miss: Option<MissCause>,
    /// Tokens of the previous prompt this step did not read from the cache
    /// and sent again (at most what it wrote or sent uncached).
    #[serde(skip_serializing_if = "is_zero")]
    pub miss_tokens: u64,
    /// Where the client's own request first differed from its previous
    /// one (`system`, `tools`, `message 12`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<String>,
    /// The provider's own diagnosis, when the answer carried one
    /// (Anthropic `diagnostics.cache_miss_reason.type`, OpenAI
    /// `prompt_cache_diagnostics.reason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

impl CacheNote {
    /// Nothing to say.
    pub fn is_empty(&self) -> bool {
        *self == CacheNote::default()
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The provider's own cache-miss diagnosis in an answer object, when it
/// carries one: Anthropic's `diagnostics.cache_miss_reason` (its `type`:
/// `system_changed`, `tools_changed`, `messages_changed`, ...; on the
/// message, `message_start` in a stream) or OpenAI's Responses
/// `prompt_cache_diagnostics` of type `cache_miss` (its `reason`). Only
/// read: the proxy never asks for them (no beta header, no request field).
pub fn provider_reason(answer: &serde_json::Value) -> Option<String> {
    let label = |v: &serde_json::Value| -> Option<String> {
        v.as_str()
            .or_else(|| v.get("type").and_then(serde_json::Value::as_str))
            .map(|s| s.chars().take(64).collect())
    };
    if let Some(r) = answer
        .get("diagnostics")
        .and_then(|d| d.get("cache_miss_reason"))
        .filter(|r| !r.is_null())
    {
        return label(r);
    }
    let d = answer.get("prompt_cache_diagnostics")?;
    if d.get("type").and_then(serde_json::Value::as_str) != Some("cache_miss") {
        return None;
    }
    d.get("reason").and_then(label)
}

/// The smallest miss reported (tokens): below it, cache granularity
/// (Anthropic caches from 1,024 tokens, OpenAI in 128-token steps) and
/// where the client puts its breakpoints explain the difference.
pub const MIN_MISS_TOKENS: u64 = 2_048;

/// Tokens of the previous prompt this step did not read from the cache:
/// the previous step's whole prompt (`prev_prompt` = input + cache read +
/// cache write) is the prefix a warm request reads; what it read less is
/// rewritten. None when under [`MIN_MISS_TOKENS`] or 2% of the prefix, or
/// when there is no previous step to compare.
pub fn miss_tokens(prev_prompt: Option<u64>, cache_read: u64) -> Option<u64> {
    let prev = prev_prompt?;
    let missed = prev.saturating_sub(cache_read);
    (missed >= MIN_MISS_TOKENS && missed * 50 >= prev).then_some(missed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(now: i64, model: &'a str, prev: Option<(i64, &'a str)>) -> Facts<'a> {
        Facts {
            now_ms: now,
            model,
            ttl_ms: DEFAULT_TTL_MS,
            previous: prev.map(|(at_ms, model)| Previous { at_ms, model }),
            model_last_ms: None,
            resumed: false,
        }
    }

    #[test]
    fn cold_on_gap_model_switch_and_resume() {
        let m = "claude-sonnet-4-5";
        assert_eq!(cold(&facts(1_000, m, None)), None);
        assert_eq!(cold(&facts(300_000, m, Some((0, m)))), None);
        assert_eq!(
            cold(&facts(300_001, m, Some((0, m)))),
            Some(Cold::TtlExpired)
        );
        let hour = Facts {
            ttl_ms: HOUR_TTL_MS,
            ..facts(3_000_000, m, Some((0, m)))
        };
        assert_eq!(cold(&hour), None);
        assert_eq!(
            cold(&facts(1_000, m, Some((0, "claude-haiku-4-5")))),
            Some(Cold::ModelSwitch)
        );
        // Back to a model the session sent a minute ago: its cache is warm;
        // six minutes ago: cold.
        let back = |last: i64| Facts {
            model_last_ms: Some(last),
            ..facts(400_000, m, Some((390_000, "claude-haiku-4-5")))
        };
        assert_eq!(cold(&back(340_000)), None);
        assert_eq!(cold(&back(40_000)), Some(Cold::ModelSwitch));
        let resumed = Facts {
            resumed: true,
            ..facts(1_000, m, None)
        };
        assert_eq!(cold(&resumed), Some(Cold::Resumed));
        // Resumed with its recorded activity: warm within the TTL.
        let recent = Facts {
            resumed: true,
            ..facts(60_000, m, Some((0, m)))
        };
        assert_eq!(cold(&recent), None);
        let old = Facts {
            resumed: true,
            ..facts(600_000, m, Some((0, m)))
        };
        assert_eq!(cold(&old), Some(Cold::Resumed));
    }

    #[test]
    fn ttl_from_the_body() {
        assert_eq!(requested_ttl_ms(br#"{"system":[]}"#), DEFAULT_TTL_MS);
        assert_eq!(
            requested_ttl_ms(br#"{"cache_control":{"type":"ephemeral","ttl" : "1h"}}"#),
            HOUR_TTL_MS
        );
        assert_eq!(
            requested_ttl_ms(br#"{"cache_control":{"type":"ephemeral","ttl":"5m"}}"#),
            DEFAULT_TTL_MS
        );
        assert_eq!(
            requested_ttl_ms(br#"{"prompt_cache_retention":"24h"}"#),
            DAY_TTL_MS
        );
        // The first "ttl" is text, the second a 1 h breakpoint: every
        // occurrence is looked at.
        assert_eq!(
            requested_ttl_ms(br#"[{"text":""ttl" is short"},{"ttl":"5m"},{"ttl":"1h"}]"#),
            HOUR_TTL_MS
        );
        assert_eq!(requested_ttl_ms(br#"{"ttl""#), DEFAULT_TTL_MS);
    }

    #[test]
    fn the_providers_own_reason() {
        let a: serde_json::Value = serde_json::from_str(
            r#"{"id":"m","diagnostics":{"cache_miss_reason":{"type":"tools_changed","cache_missed_input_tokens":9000}}}"#,
        )
        .unwrap();
        assert_eq!(provider_reason(&a).as_deref(), Some("tools_changed"));
        let none: serde_json::Value =
            serde_json::from_str(r#"{"diagnostics":{"cache_miss_reason":null}}"#).unwrap();
        assert_eq!(provider_reason(&none), None);
        let o: serde_json::Value = serde_json::from_str(
            r#"{"prompt_cache_diagnostics":{"type":"cache_miss","reason":"input_changed","cache_missed_tokens":512}}"#,
        )
        .unwrap();
        assert_eq!(provider_reason(&o).as_deref(), Some("input_changed"));
        let hit: serde_json::Value =
            serde_json::from_str(r#"{"prompt_cache_diagnostics":{"type":"cache_hit"}}"#).unwrap();
        assert_eq!(provider_reason(&hit), None);
    }

    #[test]
    fn misses_and_causes() {
        assert_eq!(miss_tokens(None, 0), None);
        assert_eq!(miss_tokens(Some(100_000), 99_000), None);
        assert_eq!(miss_tokens(Some(100_000), 15_000), Some(85_000));
        let ch = Changes {
            client: Some("tools".into()),
            cold: Some(Cold::TtlExpired),
            ..Changes::default()
        };
        assert_eq!(cause(&ch, None), MissCause::ClientChanged);
        let ch = Changes { cut: true, ..ch };
        assert_eq!(cause(&ch, None), MissCause::Cut);
        assert_eq!(cause(&Changes::default(), Some("x")), MissCause::Provider);
        assert_eq!(cause(&Changes::default(), None), MissCause::Unknown);
    }
}
