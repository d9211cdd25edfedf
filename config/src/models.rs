//! The built-in model table (context window, output allowance, prices) and
//! the context-window resolution used by the tideline.
//!
//! Sources, checked 2026-12-01: Anthropic model overview and pricing pages
//! (platform.claude.com/docs), OpenAI model pages (developers.openai.com);
//! a few rows rest on third-party mirrors and are marked in the table.
//! Prices are USD per million tokens at the standard tier: Anthropic
//! `cache_write` is the 5-minute write; OpenAI models without a cache-write
//! charge use the input price; long-context surcharges and tiered prompt
//! prices are not modelled (the short-prompt tier is listed).

use serde::{Deserialize, Serialize};

/// Prices of a model, USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// Uncached input tokens.
    pub input: f64,
    /// Output tokens (thinking included).
    pub output: f64,
    /// Cache reads (hits).
    pub cache_read: f64,
    /// Cache writes (Anthropic: the 5-minute write).
    pub cache_write: f64,
}

impl Price {
    /// Cost of one step in USD. `input` is the *uncached* input (Anthropic
    /// `input_tokens`; OpenAI `input_tokens - cached_tokens`).
    pub fn cost_usd(&self, input: u64, output: u64, cache_read: u64, cache_write: u64) -> f64 {
        (input as f64 * self.input
            + output as f64 * self.output
            + cache_read as f64 * self.cache_read
            + cache_write as f64 * self.cache_write)
            / 1_000_000.0
    }
}

/// What is known of a model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Context window in tokens (input + output).
    pub context_window: u64,
    /// Output allowance (max output tokens).
    pub max_output: u64,
    /// Prices; `None` for family fallbacks.
    pub price: Option<Price>,
}

/// One row of the built-in table.
struct Row {
    id: &'static str,
    context_window: u64,
    max_output: u64,
    price: [f64; 4],
}

const fn row(id: &'static str, context_window: u64, max_output: u64, price: [f64; 4]) -> Row {
    Row {
        id,
        context_window,
        max_output,
        price,
    }
}

const K: u64 = 1_000;
const M1: u64 = 1_000_000;
/// GPT-6 generation window (OpenAI lists 1,050,000, max input 922,000).
const GPT6_CTX: u64 = 1_050_000;
/// Gemini window (2.5 and 3 generations).
const GEMINI_CTX: u64 = 1_048_576;
/// GPT-4.1 window.
const GPT41_CTX: u64 = 1_047_576;

/// The built-in table; prices are `[input, output, cache_read, cache_write]`.
const TABLE: &[Row] = &[
    // Anthropic, current generation (1M context native).
    row("claude-fable-5-2", M1, 128 * K, [8.0, 40.0, 0.20, 10.0]), // cache prices: third-party mirror
    row("claude-fable-5-1", M1, 128 * K, [10.0, 50.0, 0.25, 12.50]),
    row("claude-mythos-5-1", M1, 128 * K, [10.0, 50.0, 0.25, 12.50]),
    row("claude-fable-5", M1, 128 * K, [10.0, 50.0, 1.0, 12.50]),
    row("claude-mythos-5", M1, 128 * K, [10.0, 50.0, 1.0, 12.50]),
    row("claude-opus-5-5", M1, 128 * K, [4.0, 20.0, 0.20, 5.0]),
    row("claude-opus-5", M1, 128 * K, [5.0, 25.0, 0.50, 6.25]),
    row("claude-sonnet-5-5", M1, 128 * K, [2.0, 10.0, 0.10, 2.50]),
    row("claude-sonnet-5", M1, 128 * K, [2.0, 10.0, 0.20, 2.50]),
    row("claude-haiku-5-5", M1, 128 * K, [0.10, 0.50, 0.01, 0.125]), // prompts ≤ 100k tier
    row("claude-opus-4-8", M1, 128 * K, [5.0, 25.0, 0.50, 6.25]),
    row("claude-opus-4-7", M1, 128 * K, [5.0, 25.0, 0.50, 6.25]),
    row("claude-opus-4-6", M1, 128 * K, [5.0, 25.0, 0.50, 6.25]),
    row("claude-sonnet-4-6", M1, 128 * K, [3.0, 15.0, 0.30, 3.75]),
    // Anthropic, 200k generation (1M only with `[1m]` / the context-1m beta).
    row("claude-opus-4-5", 200 * K, 64 * K, [5.0, 25.0, 0.50, 6.25]),
    row(
        "claude-sonnet-4-5",
        200 * K,
        64 * K,
        [3.0, 15.0, 0.30, 3.75],
    ),
    row("claude-haiku-4-5", 200 * K, 64 * K, [1.0, 5.0, 0.10, 1.25]),
    row(
        "claude-opus-4-1",
        200 * K,
        32 * K,
        [15.0, 75.0, 1.50, 18.75],
    ),
    row("claude-opus-4", 200 * K, 32 * K, [15.0, 75.0, 1.50, 18.75]),
    row(
        "claude-opus-4-0",
        200 * K,
        32 * K,
        [15.0, 75.0, 1.50, 18.75],
    ),
    row("claude-sonnet-4", 200 * K, 64 * K, [3.0, 15.0, 0.30, 3.75]),
    row(
        "claude-sonnet-4-0",
        200 * K,
        64 * K,
        [3.0, 15.0, 0.30, 3.75],
    ),
    row(
        "claude-3-7-sonnet",
        200 * K,
        64 * K,
        [3.0, 15.0, 0.30, 3.75],
    ),
    row("claude-3-5-haiku", 200 * K, 8_192, [0.80, 4.0, 0.08, 1.0]),
    // OpenAI, GPT-6 generation.
    row("gpt-6.2-astra", GPT6_CTX, 128 * K, [8.0, 40.0, 0.40, 10.0]), // cache prices: third-party
    row("gpt-6.2-sol", GPT6_CTX, 128 * K, [2.0, 10.0, 0.10, 2.50]),
    row("gpt-6.1-sol", GPT6_CTX, 128 * K, [2.0, 10.0, 0.10, 2.50]),
    row("gpt-6-astra", GPT6_CTX, 128 * K, [10.0, 50.0, 1.0, 12.50]),
    row("gpt-6-sol", GPT6_CTX, 128 * K, [2.0, 10.0, 0.20, 2.50]),
    // OpenAI, GPT-5 generation (400k context, 128k output).
    row("gpt-5", 400 * K, 128 * K, [1.25, 10.0, 0.125, 1.25]),
    row("gpt-5-mini", 400 * K, 128 * K, [0.25, 2.0, 0.025, 0.25]),
    row("gpt-5-nano", 400 * K, 128 * K, [0.05, 0.40, 0.005, 0.05]),
    row("gpt-5-codex", 400 * K, 128 * K, [1.25, 10.0, 0.125, 1.25]),
    row("gpt-5.1", 400 * K, 128 * K, [1.25, 10.0, 0.125, 1.25]),
    row("gpt-5.1-codex", 400 * K, 128 * K, [1.25, 10.0, 0.125, 1.25]),
    row(
        "gpt-5.1-codex-mini",
        400 * K,
        128 * K,
        [0.25, 2.0, 0.025, 0.25],
    ),
    row("gpt-5.2", 400 * K, 128 * K, [1.75, 14.0, 0.175, 1.75]),
    row("gpt-5.2-codex", 400 * K, 128 * K, [1.75, 14.0, 0.175, 1.75]),
    row("gpt-5.3-codex", 400 * K, 128 * K, [1.75, 14.0, 0.175, 1.75]),
    // Google Gemini: 1,048,576-token window, 65,536 output; prices for prompts
    // ≤ 200k tokens; the cache read is the implicit-caching rate (10% of the
    // input); no cache write is billed per token.
    row(
        "gemini-3-pro-preview",
        GEMINI_CTX,
        65_536,
        [2.0, 12.0, 0.20, 2.0],
    ),
    row(
        "gemini-3-flash-preview",
        GEMINI_CTX,
        65_536,
        [0.50, 3.0, 0.05, 0.50],
    ),
    row(
        "gemini-2.5-pro",
        GEMINI_CTX,
        65_536,
        [1.25, 10.0, 0.125, 1.25],
    ),
    row(
        "gemini-2.5-flash",
        GEMINI_CTX,
        65_536,
        [0.30, 2.50, 0.03, 0.30],
    ),
    row(
        "gemini-2.5-flash-lite",
        GEMINI_CTX,
        65_536,
        [0.10, 0.40, 0.01, 0.10],
    ),
    // OpenAI, older.
    row("gpt-4.1", GPT41_CTX, 32_768, [2.0, 8.0, 0.50, 2.0]),
    row("gpt-4.1-mini", GPT41_CTX, 32_768, [0.40, 1.60, 0.10, 0.40]),
    row("gpt-4.1-nano", GPT41_CTX, 32_768, [0.10, 0.40, 0.025, 0.10]),
    row("gpt-4o", 128 * K, 16_384, [2.50, 10.0, 1.25, 2.50]),
    row("gpt-4o-mini", 128 * K, 16_384, [0.15, 0.60, 0.075, 0.15]),
    row("o3", 200 * K, 100 * K, [2.0, 8.0, 0.50, 2.0]),
    row("o3-mini", 200 * K, 100 * K, [1.10, 4.40, 0.55, 1.10]),
    row("o4-mini", 200 * K, 100 * K, [1.10, 4.40, 0.275, 1.10]),
];

impl Row {
    fn info(&self) -> ModelInfo {
        let [input, output, cache_read, cache_write] = self.price;
        ModelInfo {
            context_window: self.context_window,
            max_output: self.max_output,
            price: Some(Price {
                input,
                output,
                cache_read,
                cache_write,
            }),
        }
    }
}

/// A model id reduced to its table key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Normalized {
    /// Lower-case id without provider prefix, `[1m]`, `-latest` or date suffix.
    pub base: String,
    /// The id carried the `[1m]` suffix (1M context requested).
    pub one_m: bool,
}

/// Normalizes a model id: lower case, drops a `provider/` prefix, the `[1m]`
/// suffix (noted in [`Normalized::one_m`]), `-latest`, and a date suffix
/// (`-20250929`, `-2025-04-14`, `@20250929`).
pub fn normalize(model: &str) -> Normalized {
    let mut s = model.trim().to_ascii_lowercase();
    if let Some(i) = s.rfind('/') {
        s = s[i + 1..].to_string();
    }
    let one_m = s.ends_with("[1m]");
    if one_m {
        s.truncate(s.len() - "[1m]".len());
    }
    if let Some(stripped) = s.strip_suffix("-latest") {
        s = stripped.to_string();
    }
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let n = b.len();
    if n > 9 && (b[n - 9] == b'-' || b[n - 9] == b'@') && digits(n - 8..n) {
        s.truncate(n - 9);
    } else if n > 11
        && b[n - 11] == b'-'
        && digits(n - 10..n - 6)
        && b[n - 6] == b'-'
        && digits(n - 5..n - 3)
        && b[n - 3] == b'-'
        && digits(n - 2..n)
    {
        s.truncate(n - 11);
    }
    Normalized { base: s, one_m }
}

/// Appends `[1m]` to a Claude model id when the `anthropic-beta` header asks
/// for the 1M context (`context-1m-...`), so [`lookup`] sees it.
pub fn with_context_1m(model: &str, anthropic_beta: Option<&str>) -> String {
    let wants = anthropic_beta
        .map(|b| b.split(',').any(|t| t.trim().starts_with("context-1m")))
        .unwrap_or(false);
    if wants && !model.to_ascii_lowercase().ends_with("[1m]") {
        format!("{model}[1m]")
    } else {
        model.to_string()
    }
}

/// The family fallback for an id that is not in the table.
fn family(base: &str) -> Option<ModelInfo> {
    let (context_window, max_output) = if base.starts_with("claude-") {
        (200 * K, 64 * K)
    } else if base.starts_with("gpt-4.1") {
        (GPT41_CTX, 32_768)
    } else if base.starts_with("gpt-4o") {
        (128 * K, 16_384)
    } else if base.starts_with("gpt-5") || base.starts_with("gpt-6") {
        (400 * K, 128 * K)
    } else if base == "o3" || base.starts_with("o3-") || base.starts_with("o4-mini") {
        (200 * K, 100 * K)
    } else if base.starts_with("gemini-") {
        (GEMINI_CTX, 65_536)
    } else {
        return None;
    };
    Some(ModelInfo {
        context_window,
        max_output,
        price: None,
    })
}

/// What the built-in table knows of `model`: an exact row (after
/// [`normalize`]), else a family fallback (`claude-*` 200k, `gpt-5*`/`gpt-6*`
/// 400k, `gpt-4.1*` 1,047,576, `o3`/`o4-mini` 200k, `gpt-4o*` 128k,
/// `gemini-*` 1,048,576; no price).
/// A Claude id with `[1m]` gets a 1M context. `None` = unknown.
pub fn lookup(model: &str) -> Option<ModelInfo> {
    let n = normalize(model);
    let mut info = TABLE
        .iter()
        .find(|r| r.id == n.base)
        .map(Row::info)
        .or_else(|| family(&n.base))?;
    if n.one_m && n.base.starts_with("claude-") {
        info.context_window = info.context_window.max(M1);
    }
    Some(info)
}

/// Every row of the built-in table (id, facts), in table order.
pub fn builtin_models() -> impl Iterator<Item = (&'static str, ModelInfo)> {
    TABLE.iter().map(|r| (r.id, r.info()))
}
