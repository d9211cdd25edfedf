//! The typed configuration and its layering: defaults → JSON file →
//! `OCEANCODE_*` environment → CLI [`Overrides`], then [`Config::validate`].
//!
//! The file is JSON; every key is optional and unknown keys are refused.
//! `ledger.shelve` / `ledger.window` are aliases of `ledger.tideline`; the
//! removed keys `low`, `reserve`, `profile`, `hard_tokens` (in `ledger` or
//! `ledger.tideline`) still load and produce one warning.

use crate::budget::{parse_duration, SessionLimitsConfig};
use crate::error::ConfigError;
use crate::tideline::{Amount, BlockSpec, LineSpec, MIN_FIXED_LINE};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Name of the application directory under the XDG config and data homes.
pub const APP_DIR: &str = "oceancode-proxy";
/// File name of the config file inside the config directory.
pub const CONFIG_FILE: &str = "config.json";
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// Provider id of Anthropic.
pub const ANTHROPIC: &str = "anthropic";
/// Provider id of OpenAI.
pub const OPENAI: &str = "openai";
/// Default Anthropic upstream.
pub const DEFAULT_ANTHROPIC_UPSTREAM: &str = "https://api.anthropic.com";
/// Default OpenAI upstream.
pub const DEFAULT_OPENAI_UPSTREAM: &str = "https://api.openai.com";
/// Provider id of Google Gemini (Generative Language API).
pub const GEMINI: &str = "gemini";
/// Default Gemini upstream.
pub const DEFAULT_GEMINI_UPSTREAM: &str = "https://generativelanguage.googleapis.com";
/// Default log filter.
pub const DEFAULT_LOG: &str = "info";

/// Names of the environment variables read by this crate.
pub mod vars {
    /// Path of the config file.
    pub const CONFIG: &str = "OCEANCODE_CONFIG";
    /// Listen address (`127.0.0.1:8787`).
    pub const LISTEN: &str = "OCEANCODE_LISTEN";
    /// Data dir.
    pub const DATA_DIR: &str = "OCEANCODE_DATA_DIR";
    /// Anthropic upstream URL.
    pub const ANTHROPIC_UPSTREAM: &str = "OCEANCODE_ANTHROPIC_UPSTREAM";
    /// OpenAI upstream URL.
    pub const OPENAI_UPSTREAM: &str = "OCEANCODE_OPENAI_UPSTREAM";
    /// Gemini upstream URL.
    pub const GEMINI_UPSTREAM: &str = "OCEANCODE_GEMINI_UPSTREAM";
    /// Tideline (`40%`, `500k`, `0`).
    pub const TIDELINE: &str = "OCEANCODE_TIDELINE";
    /// Block size (`35%` of the line, or tokens).
    pub const TIDELINE_BLOCK: &str = "OCEANCODE_TIDELINE_BLOCK";
    /// `ledger.recall_tool.enabled` (`1`/`true`/`on`, `0`/`false`/`off`).
    pub const RECALL_TOOL: &str = "OCEANCODE_RECALL_TOOL";
    /// `ledger.compress` on or off (`on`, `off`, `true`, `false`, `1`, `0`).
    pub const COMPRESS: &str = "OCEANCODE_COMPRESS";
    /// `ledger.tideline.cold_cut` on or off.
    pub const COLD_CUT: &str = "OCEANCODE_COLD_CUT";
    /// Retention in days (`0` = keep forever).
    pub const RETENTION_DAYS: &str = "OCEANCODE_RETENTION_DAYS";
    /// Log filter (`info`, `oceancode_proxy=debug`, ...).
    pub const LOG: &str = "OCEANCODE_LOG";
    /// `limits.session.spend_usd`: most USD a session may spend.
    pub const MAX_SPEND: &str = "OCEANCODE_MAX_SPEND";
    /// `limits.session.steps`: most steps a session may make.
    pub const MAX_STEPS: &str = "OCEANCODE_MAX_STEPS";
    /// `limits.session.time`: longest a session may run (`30m`, `2h`).
    pub const MAX_TIME: &str = "OCEANCODE_MAX_TIME";
    /// `ledger.database`: `sqlite` or a `postgres://` URL.
    pub const DATABASE_URL: &str = "OCEANCODE_DATABASE_URL";
    /// `telemetry.otlp.endpoint`: the OTLP/HTTP collector to export spans to.
    pub const OTLP_ENDPOINT: &str = "OCEANCODE_OTLP_ENDPOINT";
    /// The default `telemetry.otlp.headers_env`: `key=value,key2=value2`
    /// headers sent to the collector (auth), never logged.
    pub const OTLP_HEADERS: &str = "OCEANCODE_OTLP_HEADERS";
    /// The GenAI conventions' content-capture switch (`true` exports message text).
    pub const CAPTURE_CONTENT: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";
    /// Context window override for every model (tokens; read by `model_facts::context_window`).
    pub const CONTEXT_TOKENS: &str = "OCEANCODE_CONTEXT_TOKENS";
    /// XDG config home.
    pub const XDG_CONFIG_HOME: &str = "XDG_CONFIG_HOME";
    /// XDG data home.
    pub const XDG_DATA_HOME: &str = "XDG_DATA_HOME";
    /// Home directory.
    pub const HOME: &str = "HOME";
}

/// Reads the process environment; pass `&process_env` where an `env` lookup is asked for.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// `env(key)` trimmed, with empty values treated as unset.
fn env_value(env: &dyn Fn(&str) -> Option<String>, key: &str) -> Option<String> {
    env(key)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// An absolute directory from an XDG variable (relative values are ignored, as the spec says).
fn xdg_dir(env: &dyn Fn(&str) -> Option<String>, key: &str) -> Option<PathBuf> {
    env_value(env, key)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// Expands a leading `~` / `~/` with `$HOME`.
fn expand_home(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let Some(s) = path.to_str() else {
        return path.to_path_buf();
    };
    let rest = if s == "~" {
        ""
    } else if let Some(r) = s.strip_prefix("~/") {
        r
    } else {
        return path.to_path_buf();
    };
    match env_value(env, vars::HOME) {
        Some(home) => PathBuf::from(home).join(rest),
        None => path.to_path_buf(),
    }
}

/// The default data dir: `$XDG_DATA_HOME/oceancode-proxy`, else
/// `$HOME/.local/share/oceancode-proxy`, else `./oceancode-proxy`.
pub fn default_data_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(d) = xdg_dir(env, vars::XDG_DATA_HOME) {
        return d.join(APP_DIR);
    }
    match env_value(env, vars::HOME) {
        Some(home) => PathBuf::from(home).join(".local/share").join(APP_DIR),
        None => PathBuf::from(APP_DIR),
    }
}

/// The data dir, first match wins: `flag` (`--data-dir`), `OCEANCODE_DATA_DIR`,
/// `$XDG_DATA_HOME/oceancode-proxy`, `$HOME/.local/share/oceancode-proxy`.
/// A leading `~/` is expanded with `$HOME`.
pub fn resolve_data_dir(flag: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(f) = flag {
        return expand_home(f, env);
    }
    if let Some(d) = env_value(env, vars::DATA_DIR) {
        return expand_home(Path::new(&d), env);
    }
    default_data_dir(env)
}

/// The default config file: `$XDG_CONFIG_HOME/oceancode-proxy/config.json`, else
/// `$HOME/.config/oceancode-proxy/config.json` (whether or not it exists).
pub fn default_config_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let base = match xdg_dir(env, vars::XDG_CONFIG_HOME) {
        Some(d) => d,
        None => PathBuf::from(env_value(env, vars::HOME)?).join(".config"),
    };
    Some(base.join(APP_DIR).join(CONFIG_FILE))
}

/// The config file to read, if any: `OCEANCODE_CONFIG` (must exist), else the
/// default path when that file exists.
pub fn find_config_file(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(p) = env_value(env, vars::CONFIG) {
        return Some(expand_home(Path::new(&p), env));
    }
    default_config_path(env).filter(|p| p.is_file())
}

/// Checks an OTLP collector URL: `http`/`https` with a host, no
/// credentials, query or fragment (auth goes in `telemetry.otlp.headers_env`).
/// Unlike an upstream, plain `http` is allowed to any host: spans carry no
/// secret, and collectors on a private network often speak plain HTTP.
pub fn check_otlp_url(url: &str) -> Result<(), String> {
    let shown = crate::redact::redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("{shown:?} must start with http:// or https://"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(format!("unsupported scheme {scheme:?}; use http or https"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{shown:?} is not a URL with a host"));
    }
    if authority.contains('@') {
        return Err(format!(
            "{shown:?}: credentials in the URL are not supported; put them in the headers variable"
        ));
    }
    if rest.contains('?') || rest.contains('#') {
        return Err(format!("{shown:?}: takes no query or fragment"));
    }
    Ok(())
}

/// Checks an upstream base URL: `http`/`https` with a host, optional port and
/// path prefix; no credentials, query or fragment. Plain `http` is allowed only
/// for loopback hosts (127.0.0.0/8, ::1, localhost).
pub fn check_upstream_url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Err("empty URL".into());
    }
    // Messages show the URL without its credentials.
    let shown = crate::redact::redact_url(url);
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{shown:?} contains whitespace"));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{shown:?} must start with https:// (or http:// for loopback)"
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "https" && scheme != "http" {
        return Err(format!(
            "unsupported scheme {scheme:?}; use https (or http for loopback)"
        ));
    }
    if rest.contains('?') || rest.contains('#') {
        return Err(format!("{shown:?}: a base URL takes no query or fragment"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err(format!(
            "{shown:?}: credentials in the URL are not supported"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((h, after)) = v6.split_once(']') else {
            return Err(format!("{shown:?}: unterminated IPv6 address"));
        };
        if h.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{shown:?}: invalid IPv6 address {h:?}"));
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(format!("{shown:?}: junk after the IPv6 address")),
            },
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{shown:?} has no host"));
    }
    if !authority.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!("{shown:?}: invalid host {host:?}"));
    }
    if let Some(p) = port {
        if p.parse::<u16>().map(|n| n == 0).unwrap_or(true) {
            return Err(format!("{shown:?}: invalid port {p:?}"));
        }
    }
    if scheme == "http" && !is_loopback_host(host) {
        return Err(format!(
            "{shown:?}: plain http is only allowed for loopback hosts (127.0.0.0/8, ::1, localhost); use https"
        ));
    }
    Ok(())
}

/// `localhost`, 127.0.0.0/8 or ::1.
fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => a.is_loopback(),
        Ok(IpAddr::V6(a)) => a.is_loopback(),
        Err(_) => false,
    }
}

/// Marks a removed key that is still accepted (and reported as a warning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemovedKey(bool);

impl RemovedKey {
    /// Whether the key was present in the file.
    pub fn is_present(&self) -> bool {
        self.0
    }
}

impl<'de> Deserialize<'de> for RemovedKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de::IgnoredAny::deserialize(d)?;
        Ok(RemovedKey(true))
    }
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the proxy listens on (default `127.0.0.1:8787`).
    pub listen: SocketAddr,
    /// Data dir; `None` = `OCEANCODE_DATA_DIR` / XDG default (see [`resolve_data_dir`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Upstream providers by id; `anthropic` and `openai` are always present.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// The ledger and its tideline.
    pub ledger: LedgerConfig,
    /// How long idle sessions are kept.
    pub retention: RetentionConfig,
    /// Request size and timeout limits.
    pub limits: LimitsConfig,
    /// Who may use the proxy: remote listening, allowed `Host` names.
    pub access: AccessConfig,
    /// The ledger writer thread.
    pub writer: WriterConfig,
    /// The context file (`oceancode-proxy context`).
    pub context: ContextConfig,
    /// OpenTelemetry export (off unless `telemetry.otlp.endpoint` is set).
    pub telemetry: TelemetryConfig,
    /// Log filter (`tracing` env-filter syntax); `None` = `info`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        let mut providers = BTreeMap::new();
        providers.insert(
            ANTHROPIC.to_string(),
            ProviderConfig::with_upstream(DEFAULT_ANTHROPIC_UPSTREAM),
        );
        providers.insert(
            OPENAI.to_string(),
            ProviderConfig::with_upstream(DEFAULT_OPENAI_UPSTREAM),
        );
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            data_dir: None,
            providers,
            ledger: LedgerConfig::default(),
            retention: RetentionConfig::default(),
            limits: LimitsConfig::default(),
            access: AccessConfig::default(),
            writer: WriterConfig::default(),
            context: ContextConfig::default(),
            telemetry: TelemetryConfig::default(),
            log: None,
        }
    }
}

/// `telemetry`: what the proxy exports about its requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OpenTelemetry GenAI spans over OTLP/HTTP (protobuf).
    pub otlp: OtlpConfig,
}

/// `telemetry.otlp`: the collector spans go to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://127.0.0.1:6006`; `/v1/traces` is
    /// added unless it ends with it). `None`: nothing is exported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The environment variable holding the headers sent with each export
    /// (`key=value,key2=value2`, e.g. `Authorization=Basic ...`): read at
    /// start, never written to the config, a log or the ledger.
    pub headers_env: String,
    /// Export message content (`gen_ai.input.messages`,
    /// `gen_ai.output.messages`); also on when
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
    pub capture_content: bool,
    /// Most spans waiting for export; past it spans are dropped (counted).
    pub max_queue: usize,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: None,
            headers_env: vars::OTLP_HEADERS.to_string(),
            capture_content: false,
            max_queue: 2048,
        }
    }
}

/// `context`: the context file and what the upstream sees of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextConfig {
    /// Every tool result the upstream sees ends with its ledger seq,
    /// `[seq N]` (default `false`: a transparent proxy does not change tool
    /// output unasked; the ledger keeps the client's bytes either way).
    pub seq_tags: bool,
}

/// One upstream provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// Base URL (`https://host[:port][/prefix]`); empty = the built-in default
    /// for `anthropic` / `openai`, required for any other id.
    pub upstream: String,
    /// Per-model facts that override the built-in model table.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelConfig>,
}

impl ProviderConfig {
    /// A provider with `upstream` and no model overrides.
    pub fn with_upstream(upstream: &str) -> Self {
        ProviderConfig {
            upstream: upstream.to_string(),
            models: Vec::new(),
        }
    }
}

/// Facts about one model, overriding the built-in table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Model id as sent in requests (also matched case-insensitively and
    /// without a date suffix).
    pub id: String,
    /// Context window in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Output allowance (max output tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<u64>,
    /// Prices in USD per million tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<PriceConfig>,
}

/// Prices of a model as written in the config, USD per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Uncached input tokens.
    pub input: f64,
    /// Output tokens.
    pub output: f64,
    /// Cache reads; defaults to the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    /// Cache writes; defaults to the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

impl PriceConfig {
    /// The full price, missing cache prices taken as the input price.
    pub fn to_price(&self) -> crate::models::Price {
        crate::models::Price {
            input: self.input,
            output: self.output,
            cache_read: self.cache_read.unwrap_or(self.input),
            cache_write: self.cache_write.unwrap_or(self.input),
        }
    }
}

/// The ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LedgerConfig {
    /// Record sessions and apply the tideline (default `true`); `false` = plain pass-through.
    pub enabled: bool,
    /// Where the tideline sits and how blocks close (aliases: `shelve`, `window`).
    #[serde(alias = "shelve", alias = "window")]
    pub tideline: TidelineConfig,
    /// Model-merged `SESSION.md` sections (off by default).
    pub merge: MergeConfig,
    /// The `oceancode_recall` tool the proxy injects and answers itself
    /// (off by default; `true`/`false` or `{"enabled": …, "max_rounds": …}`).
    pub recall_tool: RecallToolConfig,
    /// The state block rendered after the stub at every cut.
    pub state: StateConfig,
    /// Old tool output becomes a pointer at a cut (`true`/`false`, or the
    /// object with `enabled`, `protect`, `min_tokens`).
    pub compress: CompressConfig,
    /// Where the ledger's database is: `sqlite` (default: `oceancode.db` in
    /// the data dir) or a `postgres://user@host:port/db` URL, shared by any
    /// number of proxies (`--database`, `OCEANCODE_DATABASE_URL`).
    pub database: String,
    /// With PostgreSQL: how long a proxy's hold on a session lasts without
    /// renewal (ms, default 10000); another proxy takes the session over
    /// once it lapses. The holder renews it every third of that.
    pub lease_ms: u64,
    /// Removed key `ledger.low` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub low: RemovedKey,
    /// Removed key `ledger.reserve` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub reserve: RemovedKey,
    /// Removed key `ledger.profile` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub profile: RemovedKey,
    /// Removed key `ledger.hard_tokens` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub hard_tokens: RemovedKey,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            enabled: true,
            tideline: TidelineConfig::default(),
            merge: MergeConfig::default(),
            recall_tool: RecallToolConfig::default(),
            state: StateConfig::default(),
            compress: CompressConfig::default(),
            database: SQLITE.to_string(),
            lease_ms: 10_000,
            low: RemovedKey::default(),
            reserve: RemovedKey::default(),
            profile: RemovedKey::default(),
            hard_tokens: RemovedKey::default(),
        }
    }
}

/// `ledger.database` for the embedded SQLite ledger.
pub const SQLITE: &str = "sqlite";

/// Whether `url` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

fn check_database(v: &str) -> Result<(), &'static str> {
    if v == SQLITE || is_postgres_url(v) {
        Ok(())
    } else {
        Err("expected `sqlite` or a postgres://user@host:port/database URL")
    }
}

impl LedgerConfig {
    /// The PostgreSQL URL when `database` names one (None = SQLite).
    pub fn postgres_url(&self) -> Option<&str> {
        is_postgres_url(&self.database).then_some(self.database.as_str())
    }

    /// Shorthand for `self.tideline.line_spec()`.
    pub fn line_spec(&self) -> LineSpec {
        self.tideline.line_spec()
    }

    /// Shorthand for `self.tideline.block_spec()`.
    pub fn block_spec(&self) -> BlockSpec {
        self.tideline.block_spec()
    }
}

/// `ledger.tideline`: the line (percent of the context, or fixed tokens) and the block size.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TidelineConfig {
    /// Line as a share of the model's context window, in percent (default 40).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// Fixed line in tokens (`300000` or `"500k"`); wins over `percent`.
    /// `0` = the model's ceiling (context − output allowance); else ≥ 20k.
    #[serde(
        deserialize_with = "de_tokens",
        skip_serializing_if = "Option::is_none"
    )]
    pub tokens: Option<u64>,
    /// Block size: tokens (`20000`, `"20k"`) or a share of the line (`"35%"`);
    /// default 70% of the line.
    #[serde(
        deserialize_with = "de_block",
        serialize_with = "ser_block",
        skip_serializing_if = "Option::is_none"
    )]
    pub block: Option<BlockSpec>,
    /// Cut at a request that finds the prompt cache cold (the gap since the
    /// previous request is past the TTL the client asked for, a model
    /// switch, a resumed session) when a cut is due within the next block;
    /// default `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold_cut: Option<bool>,
    /// Removed key `ledger.tideline.low` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub low: RemovedKey,
    /// Removed key `ledger.tideline.reserve` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub reserve: RemovedKey,
    /// Removed key `ledger.tideline.profile` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub profile: RemovedKey,
    /// Removed key `ledger.tideline.hard_tokens` (ignored, reported as a warning).
    #[doc(hidden)]
    #[serde(skip_serializing)]
    pub hard_tokens: RemovedKey,
}

impl TidelineConfig {
    /// The line: `tokens` if set, else `percent`, else 40%.
    pub fn line_spec(&self) -> LineSpec {
        match (self.tokens, self.percent) {
            (Some(t), _) => LineSpec::Tokens(t),
            (None, Some(p)) => LineSpec::Percent(p),
            (None, None) => LineSpec::default(),
        }
    }

    /// The block size: `block` if set, else 70% of the line.
    pub fn block_spec(&self) -> BlockSpec {
        self.block.unwrap_or_default()
    }

    /// `cold_cut`, on unless set off.
    pub fn cold_cut(&self) -> bool {
        self.cold_cut.unwrap_or(true)
    }

    /// Sets the line (clears the other form so `line_spec()` returns `spec`).
    pub fn set_line(&mut self, spec: LineSpec) {
        match spec {
            LineSpec::Tokens(t) => {
                self.tokens = Some(t);
                self.percent = None;
            }
            LineSpec::Percent(p) => {
                self.tokens = None;
                self.percent = Some(p);
            }
        }
    }
}

/// `ledger.state`: the state block after the stub (the goal, the task
/// list, the files touched and the commands that failed in the rows that
/// left, and where to find them in the transcripts), byte-stable between cuts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateConfig {
    /// Render the block after the stub (default `true`).
    pub enabled: bool,
    /// The block's budget in tokens (default 2000; 200 to 20000).
    pub max_tokens: u32,
}

/// The smallest `ledger.state.max_tokens`.
pub const MIN_STATE_TOKENS: u32 = 200;
/// The largest `ledger.state.max_tokens`.
pub const MAX_STATE_TOKENS: u32 = 20_000;

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            enabled: true,
            max_tokens: 2_000,
        }
    }
}

/// `ledger.compress`: at a cut, tool output older than the protected zone
/// becomes one pointer line to its transcript lines (see
/// `oceancode_window::compress`); with `free`, masking is the first tier of
/// a cut instead: when the window reaches the line, that happens first and
/// whole blocks are cut only for what it cannot free
/// (`Tideline::observe_masked`). Written `true`/`false` or as the object.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CompressConfig {
    /// On (default) or off.
    pub enabled: bool,
    /// The newest tool output never pruned: tokens (`8000`, `"8k"`) or a
    /// share of the line (`"10%"`, the default).
    #[serde(serialize_with = "ser_block", skip_serializing_if = "Option::is_none")]
    pub protect: Option<BlockSpec>,
    /// Smaller outputs are never pruned (tokens; default 500).
    pub min_tokens: u64,
    /// Masking first: how far under the line an event (masking, then cuts)
    /// brings the window, tokens or a share of the line. None (the
    /// default) = compress at cuts only.
    #[serde(serialize_with = "ser_block", skip_serializing_if = "Option::is_none")]
    pub free: Option<BlockSpec>,
}

/// `ledger.compress.protect` default, percent of the line.
pub const COMPRESS_PROTECT_PERCENT: f64 = 10.0;
/// `ledger.compress.min_tokens` default.
pub const COMPRESS_MIN_TOKENS: u64 = 500;

impl Default for CompressConfig {
    fn default() -> Self {
        CompressConfig {
            enabled: true,
            protect: None,
            min_tokens: COMPRESS_MIN_TOKENS,
            free: None,
        }
    }
}

impl CompressConfig {
    /// The protected zone in tokens for a line of `line` tokens.
    pub fn protect_tokens(&self, line: u64) -> u64 {
        match self
            .protect
            .unwrap_or(BlockSpec::PercentOfLine(COMPRESS_PROTECT_PERCENT))
        {
            BlockSpec::Tokens(t) => t,
            BlockSpec::PercentOfLine(p) => (line as f64 * p.clamp(0.0, 100.0) / 100.0) as u64,
        }
    }

    /// Masking first (`free` set, compress on).
    pub fn first(&self) -> bool {
        self.enabled && self.free.is_some()
    }

    /// How far under a line of `line` tokens an event brings the window
    /// (0 when `free` is not set).
    pub fn free_tokens(&self, line: u64) -> u64 {
        match self.free {
            None => 0,
            Some(BlockSpec::Tokens(t)) => t.min(line),
            Some(BlockSpec::PercentOfLine(p)) => (line as f64 * p.clamp(0.0, 100.0) / 100.0) as u64,
        }
    }
}

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CompressFields {
    enabled: bool,
    #[serde(deserialize_with = "de_block")]
    protect: Option<BlockSpec>,
    min_tokens: u64,
    #[serde(deserialize_with = "de_block")]
    free: Option<BlockSpec>,
}

impl Default for CompressFields {
    fn default() -> Self {
        let d = CompressConfig::default();
        CompressFields {
            enabled: d.enabled,
            protect: d.protect,
            min_tokens: d.min_tokens,
            free: d.free,
        }
    }
}

impl<'de> Deserialize<'de> for CompressConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Switch(bool),
            Fields(CompressFields),
        }
        Ok(match Form::deserialize(d)? {
            Form::Switch(enabled) => CompressConfig {
                enabled,
                ..CompressConfig::default()
            },
            Form::Fields(f) => CompressConfig {
                enabled: f.enabled,
                protect: f.protect,
                min_tokens: f.min_tokens,
                free: f.free,
            },
        })
    }
}

/// `on`/`off` (also `true`/`false`, `yes`/`no`, `1`/`0`).
pub fn parse_switch(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// `ledger.merge`: the optional model merge of `SESSION.md`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MergeConfig {
    /// Model used for the merge; `None` = merge off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The environment variable holding the API key of the live merge
    /// while serving (default [`MERGE_KEY_ENV`]); the proxy never reuses a
    /// client's credentials, and without the key the live merge is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

/// The environment variable the live merge takes its key from by default.
pub const MERGE_KEY_ENV: &str = "OCEANCODE_MERGE_API_KEY";

impl MergeConfig {
    /// The name of the environment variable holding the merge's key.
    pub fn key_env(&self) -> &str {
        self.api_key_env.as_deref().unwrap_or(MERGE_KEY_ENV)
    }
}

/// `ledger.recall_tool`: the in-band recall tool. Written as a bool
/// (`"recall_tool": true`) or an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RecallToolConfig {
    /// Inject `oceancode_recall` into every recorded request and answer its
    /// calls in the proxy (default `false`).
    pub enabled: bool,
    /// Most internal round trips (continuations) for one client request
    /// (default 4).
    pub max_rounds: u32,
    /// Which sessions the tool's `search` reads (default `related`: the
    /// calling session, its parent, children and siblings; `all`: every
    /// session in the ledger).
    pub search: RecallSearchScope,
}

/// `ledger.recall_tool.search`: which sessions the in-band recall tool's
/// search reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecallSearchScope {
    /// The calling session, its parent, its children and its siblings.
    #[default]
    Related,
    /// Every session in the ledger (other projects' and users' rows too).
    All,
}

impl Default for RecallToolConfig {
    fn default() -> Self {
        RecallToolConfig {
            enabled: false,
            max_rounds: 4,
            search: RecallSearchScope::Related,
        }
    }
}

impl<'de> Deserialize<'de> for RecallToolConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(default, deny_unknown_fields)]
        struct Full {
            enabled: bool,
            max_rounds: u32,
            search: RecallSearchScope,
        }
        impl Default for Full {
            fn default() -> Self {
                let d = RecallToolConfig::default();
                Full {
                    enabled: d.enabled,
                    max_rounds: d.max_rounds,
                    search: d.search,
                }
            }
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Flag(bool),
            Full(Full),
        }
        Ok(match Form::deserialize(d)? {
            Form::Flag(enabled) => RecallToolConfig {
                enabled,
                ..RecallToolConfig::default()
            },
            Form::Full(f) => RecallToolConfig {
                enabled: f.enabled,
                max_rounds: f.max_rounds,
                search: f.search,
            },
        })
    }
}

/// `retention`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Days a session may stay idle before its rows and directory are removed
    /// (default 7; `0` = keep forever).
    pub days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig { days: 7 }
    }
}

/// `limits`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body accepted, in bytes (default 64 MiB).
    pub max_body_bytes: u64,
    /// Timeout to connect to an upstream, ms (default 10000).
    pub connect_timeout_ms: u64,
    /// Timeout until the upstream's response headers arrive, ms (default 600000).
    pub response_header_timeout_ms: u64,
    /// Longest silence inside a streamed response, ms (default 600000).
    pub idle_stream_timeout_ms: u64,
    /// Bytes of request bodies the proxy holds at once across all
    /// connections (default 128 MiB; at least `max_body_bytes`): a body
    /// that does not fit waits for others to finish (one at a time may go
    /// past it, so reads always move on).
    pub max_bodies_in_flight_bytes: u64,
    /// Client connections open at once (default 512); more wait to be accepted.
    pub max_connections: u64,
    /// Time allowed for a request head to arrive once its first byte has, ms (default 30000).
    pub header_read_timeout_ms: u64,
    /// Time allowed for a request body the proxy reads to arrive whole, ms (default 120000).
    pub body_read_timeout_ms: u64,
    /// A client connection with no request in flight is closed after this, ms (default 90000).
    pub keepalive_timeout_ms: u64,
    /// Idle upstream connections are closed after this, ms (default 90000).
    pub upstream_pool_idle_timeout_ms: u64,
    /// Most bytes of one answer the proxy keeps to record (default 4 MiB);
    /// a longer answer is recorded truncated, with a marker.
    pub max_recorded_response_bytes: u64,
    /// Most decoded bytes the usage tap reads of one compressed answer
    /// (default 64 MiB); past it, the answer's usage is unknown.
    pub max_decoded_response_bytes: u64,
    /// What one session may spend, in USD, steps and time (`limits.session`).
    pub session: SessionLimitsConfig,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_body_bytes: 64 * 1024 * 1024,
            connect_timeout_ms: 10_000,
            response_header_timeout_ms: 600_000,
            idle_stream_timeout_ms: 600_000,
            max_bodies_in_flight_bytes: 128 << 20,
            max_connections: 512,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 120_000,
            keepalive_timeout_ms: 90_000,
            upstream_pool_idle_timeout_ms: 90_000,
            max_recorded_response_bytes: 4 << 20,
            max_decoded_response_bytes: 64 << 20,
            session: SessionLimitsConfig::default(),
        }
    }
}

impl LimitsConfig {
    /// `connect_timeout_ms` as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// `response_header_timeout_ms` as a duration.
    pub fn response_header_timeout(&self) -> Duration {
        Duration::from_millis(self.response_header_timeout_ms)
    }

    /// `idle_stream_timeout_ms` as a duration.
    pub fn idle_stream_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_stream_timeout_ms)
    }

    /// `header_read_timeout_ms` as a duration.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// `body_read_timeout_ms` as a duration.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    /// `keepalive_timeout_ms` as a duration.
    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(self.keepalive_timeout_ms)
    }

    /// `upstream_pool_idle_timeout_ms` as a duration.
    pub fn upstream_pool_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream_pool_idle_timeout_ms)
    }
}

/// `access`: who may use the proxy (see docs/operations.md, "Access").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessConfig {
    /// Listen on a non-loopback address (`--allow-remote`); default false.
    pub allow_remote: bool,
    /// Host names (besides `localhost` and IP addresses) clients may name in
    /// `Host`, e.g. the machine's name for remote use.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

/// `writer`: the ledger's writer thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WriterConfig {
    /// Most writes queued for the ledger writer (default 65536); beyond it
    /// writes are shed and their sessions heal from the next resend.
    pub queue_capacity: usize,
    /// Most bytes of writes queued (default 64 MiB); likewise.
    pub queue_bytes: u64,
    /// Most writes committed in one transaction (default 512).
    pub batch_max: usize,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            queue_capacity: 65_536,
            queue_bytes: 64 << 20,
            batch_max: 512,
        }
    }
}

/// Settings given on the command line; they win over file and environment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--anthropic-upstream`.
    pub anthropic_upstream: Option<String>,
    /// `--openai-upstream`.
    pub openai_upstream: Option<String>,
    /// `--gemini-upstream`.
    pub gemini_upstream: Option<String>,
    /// `--tideline` (e.g. `run --tideline 50%`).
    pub tideline: Option<LineSpec>,
    /// `--compress on|off`.
    pub compress: Option<bool>,
    /// `serve --allow-remote` (true sets `access.allow_remote`).
    pub allow_remote: bool,
    /// `--max-spend USD` (`limits.session.spend_usd`).
    pub max_spend_usd: Option<f64>,
    /// `--max-steps N` (`limits.session.steps`).
    pub max_steps: Option<u32>,
    /// `--max-time DURATION` (`limits.session.time`).
    pub max_time: Option<Duration>,
    /// `serve`/`run --recall-tool` (true sets `ledger.recall_tool.enabled`).
    pub recall_tool: bool,
    /// `--database` (`sqlite` or a `postgres://` URL).
    pub database: Option<String>,
    /// `--otlp URL` (`telemetry.otlp.endpoint`).
    pub otlp: Option<String>,
}

/// A loaded configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    /// The layered configuration (not yet validated by [`Config::load`]).
    pub config: Config,
    /// Warnings to log (removed keys).
    pub warnings: Vec<String>,
    /// The file that was read, if any.
    pub source: Option<PathBuf>,
}

impl Config {
    /// Defaults → JSON file → `OCEANCODE_*` environment. The file is `file`,
    /// else `OCEANCODE_CONFIG`, else the default path if it exists. Each layer
    /// is type-checked (errors name the file position or the variable); call
    /// [`Config::apply`] and [`Config::validate`] next, or use [`Config::resolve`].
    pub fn load(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Loaded, ConfigError> {
        let source = match file {
            Some(p) => Some(p.to_path_buf()),
            None => find_config_file(env),
        };
        let mut loaded = match &source {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                    path: path.clone(),
                    source: e,
                })?;
                Config::from_json(&text, path)?
            }
            None => Loaded {
                config: Config::default(),
                warnings: Vec::new(),
                source: None,
            },
        };
        loaded.config.apply_env(env)?;
        Ok(loaded)
    }

    /// [`Config::load`], then [`Config::apply`] of `overrides`, then [`Config::validate`].
    pub fn resolve(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
        overrides: &Overrides,
    ) -> Result<Loaded, ConfigError> {
        let mut loaded = Config::load(file, env)?;
        loaded.config.apply(overrides);
        loaded.config.validate()?;
        Ok(loaded)
    }

    /// Parses the JSON text of a config file over the defaults; `origin` names
    /// the file in errors and becomes [`Loaded::source`]. A blank file is `{}`.
    pub fn from_json(text: &str, origin: &Path) -> Result<Loaded, ConfigError> {
        let text = if text.trim().is_empty() { "{}" } else { text };
        let mut config: Config =
            serde_json::from_str(text).map_err(|e| ConfigError::parse(origin.to_path_buf(), &e))?;
        config.fill_provider_defaults();
        let warnings = config.take_removed_keys().into_iter().collect();
        Ok(Loaded {
            config,
            warnings,
            source: Some(origin.to_path_buf()),
        })
    }

    /// Ensures `anthropic` and `openai` exist and fills their empty upstreams.
    fn fill_provider_defaults(&mut self) {
        for (id, url) in [
            (ANTHROPIC, DEFAULT_ANTHROPIC_UPSTREAM),
            (OPENAI, DEFAULT_OPENAI_UPSTREAM),
        ] {
            let p = self.providers.entry(id.to_string()).or_default();
            if p.upstream.trim().is_empty() {
                p.upstream = url.to_string();
            }
        }
    }

    /// Clears the removed-key markers; returns the one warning naming them.
    fn take_removed_keys(&mut self) -> Option<String> {
        let mut found = Vec::new();
        let l = &mut self.ledger;
        for (name, k) in [
            ("low", &mut l.low),
            ("reserve", &mut l.reserve),
            ("profile", &mut l.profile),
            ("hard_tokens", &mut l.hard_tokens),
        ] {
            if std::mem::take(k).is_present() {
                found.push(format!("ledger.{name}"));
            }
        }
        let t = &mut l.tideline;
        for (name, k) in [
            ("low", &mut t.low),
            ("reserve", &mut t.reserve),
            ("profile", &mut t.profile),
            ("hard_tokens", &mut t.hard_tokens),
        ] {
            if std::mem::take(k).is_present() {
                found.push(format!("ledger.tideline.{name}"));
            }
        }
        if found.is_empty() {
            return None;
        }
        let noun = if found.len() == 1 { "key" } else { "keys" };
        Some(format!(
            "config: ignoring removed {noun} {} (the band geometry was removed; see ledger.tideline)",
            found.join(", ")
        ))
    }

    /// Applies the `OCEANCODE_*` variables (empty values are ignored).
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = env_value(env, vars::LISTEN) {
            self.listen = v.parse().map_err(|_| {
                ConfigError::env(
                    vars::LISTEN,
                    &v,
                    "expected a socket address like 127.0.0.1:8787",
                )
            })?;
        }
        if let Some(v) = env_value(env, vars::DATA_DIR) {
            self.data_dir = Some(PathBuf::from(v));
        }
        for (var, id) in [
            (vars::ANTHROPIC_UPSTREAM, ANTHROPIC),
            (vars::OPENAI_UPSTREAM, OPENAI),
            (vars::GEMINI_UPSTREAM, GEMINI),
        ] {
            if let Some(v) = env_value(env, var) {
                check_upstream_url(&v).map_err(|m| ConfigError::env(var, &v, m))?;
                self.providers.entry(id.to_string()).or_default().upstream = v;
            }
        }
        if let Some(v) = env_value(env, vars::TIDELINE) {
            let spec: LineSpec = v
                .parse()
                .map_err(|e: crate::AmountError| ConfigError::env(vars::TIDELINE, &v, e.reason))?;
            self.ledger.tideline.set_line(spec);
        }
        if let Some(v) = env_value(env, vars::TIDELINE_BLOCK) {
            let spec: BlockSpec = v.parse().map_err(|e: crate::AmountError| {
                ConfigError::env(vars::TIDELINE_BLOCK, &v, e.reason)
            })?;
            self.ledger.tideline.block = Some(spec);
        }
        if let Some(v) = env_value(env, vars::RECALL_TOOL) {
            self.ledger.recall_tool.enabled = parse_switch(&v)
                .ok_or_else(|| ConfigError::env(vars::RECALL_TOOL, &v, "expected on or off"))?;
        }
        if let Some(v) = env_value(env, vars::COLD_CUT) {
            self.ledger.tideline.cold_cut = Some(
                parse_switch(&v)
                    .ok_or_else(|| ConfigError::env(vars::COLD_CUT, &v, "expected on or off"))?,
            );
        }
        if let Some(v) = env_value(env, vars::COMPRESS) {
            self.ledger.compress.enabled = parse_switch(&v)
                .ok_or_else(|| ConfigError::env(vars::COMPRESS, &v, "expected on or off"))?;
        }
        if let Some(v) = env_value(env, vars::RETENTION_DAYS) {
            self.retention.days = v.parse().map_err(|_| {
                ConfigError::env(
                    vars::RETENTION_DAYS,
                    &v,
                    "expected a whole number of days (0 = forever)",
                )
            })?;
        }
        if let Some(v) = env_value(env, vars::DATABASE_URL) {
            check_database(&v).map_err(|m| ConfigError::env(vars::DATABASE_URL, &v, m))?;
            self.ledger.database = v;
        }
        if let Some(v) = env_value(env, vars::LOG) {
            self.log = Some(v);
        }
        if let Some(v) = env_value(env, vars::OTLP_ENDPOINT) {
            check_otlp_url(&v).map_err(|m| ConfigError::env(vars::OTLP_ENDPOINT, &v, m))?;
            self.telemetry.otlp.endpoint = Some(v);
        }
        if let Some(v) = env_value(env, vars::CAPTURE_CONTENT) {
            if parse_switch(&v) == Some(true) {
                self.telemetry.otlp.capture_content = true;
            }
        }
        if let Some(v) = env_value(env, vars::MAX_SPEND) {
            let usd = parse_usd(&v).map_err(|m| ConfigError::env(vars::MAX_SPEND, &v, m))?;
            self.limits.session.spend_usd = Some(usd);
        }
        if let Some(v) = env_value(env, vars::MAX_STEPS) {
            let n = v.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| {
                ConfigError::env(
                    vars::MAX_STEPS,
                    &v,
                    "expected a whole number of steps above 0",
                )
            })?;
            self.limits.session.steps = Some(n);
        }
        if let Some(v) = env_value(env, vars::MAX_TIME) {
            let d = parse_duration(&v).map_err(|m| ConfigError::env(vars::MAX_TIME, &v, m))?;
            self.limits.session.time = Some(d);
        }
        // Read where a model's window is needed; checked here so a bad value
        // stops the start instead of being ignored at every request.
        if let Some(v) = env_value(env, vars::CONTEXT_TOKENS) {
            match v.parse::<crate::Amount>() {
                Ok(crate::Amount::Tokens(t)) if t > 0 => {}
                _ => {
                    return Err(ConfigError::env(
                        vars::CONTEXT_TOKENS,
                        &v,
                        "expected a token count such as 200000 or 1m",
                    ))
                }
            }
        }
        Ok(())
    }

    /// Applies command-line settings (the last layer).
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(l) = o.listen {
            self.listen = l;
        }
        if let Some(d) = &o.data_dir {
            self.data_dir = Some(d.clone());
        }
        if let Some(u) = &o.anthropic_upstream {
            self.providers
                .entry(ANTHROPIC.to_string())
                .or_default()
                .upstream = u.clone();
        }
        if let Some(u) = &o.openai_upstream {
            self.providers
                .entry(OPENAI.to_string())
                .or_default()
                .upstream = u.clone();
        }
        if let Some(u) = &o.gemini_upstream {
            self.providers
                .entry(GEMINI.to_string())
                .or_default()
                .upstream = u.clone();
        }
        if let Some(t) = o.tideline {
            self.ledger.tideline.set_line(t);
        }
        if let Some(c) = o.compress {
            self.ledger.compress.enabled = c;
        }
        if o.allow_remote {
            self.access.allow_remote = true;
        }
        if let Some(u) = &o.otlp {
            self.telemetry.otlp.endpoint = Some(u.clone());
        }
        let b = &mut self.limits.session;
        if let Some(v) = o.max_spend_usd {
            b.spend_usd = Some(v);
        }
        if let Some(v) = o.max_steps {
            b.steps = Some(v);
        }
        if let Some(v) = o.max_time {
            b.time = Some(v);
        }
        if o.recall_tool {
            self.ledger.recall_tool.enabled = true;
        }
        if let Some(d) = &o.database {
            self.ledger.database = d.clone();
        }
    }

    /// Checks ranges and consistency; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_database(&self.ledger.database)
            .map_err(|m| ConfigError::invalid("ledger.database", m))?;
        if self.ledger.lease_ms < 1000 {
            return Err(ConfigError::invalid(
                "ledger.lease_ms",
                "at least 1000 (a lease renewed every third of it)",
            ));
        }
        for (id, p) in &self.providers {
            if id.trim().is_empty() {
                return Err(ConfigError::invalid(
                    "providers",
                    "a provider id must not be empty",
                ));
            }
            let key = format!("providers.{id}.upstream");
            if p.upstream.trim().is_empty() {
                return Err(ConfigError::invalid(
                    key,
                    format!("required (no default for provider {id:?})"),
                ));
            }
            check_upstream_url(&p.upstream).map_err(|m| ConfigError::invalid(key, m))?;
            for (i, m) in p.models.iter().enumerate() {
                validate_model(&format!("providers.{id}.models[{i}]"), m)?;
            }
        }
        let otlp = &self.telemetry.otlp;
        if let Some(u) = &otlp.endpoint {
            check_otlp_url(u).map_err(|m| ConfigError::invalid("telemetry.otlp.endpoint", m))?;
        }
        if otlp.max_queue == 0 {
            return Err(ConfigError::invalid(
                "telemetry.otlp.max_queue",
                "must be above 0",
            ));
        }
        if otlp.headers_env.trim().is_empty() {
            return Err(ConfigError::invalid(
                "telemetry.otlp.headers_env",
                "must name an environment variable",
            ));
        }
        if !(1..=16).contains(&self.ledger.recall_tool.max_rounds) {
            return Err(ConfigError::invalid(
                "ledger.recall_tool.max_rounds",
                format!(
                    "{} is out of range (1 to 16)",
                    self.ledger.recall_tool.max_rounds
                ),
            ));
        }
        let t = &self.ledger.tideline;
        // The rule of every line value (`LineSpec::check`), with the key's
        // own wording.
        if let Some(p) = t.percent {
            if let Err(why) = LineSpec::Percent(p).check() {
                let message = if p > 0.0 && p <= 100.0 {
                    format!("{p}: {why}")
                } else {
                    format!("{p} is out of range (above 0, at most 100)")
                };
                return Err(ConfigError::invalid("ledger.tideline.percent", message));
            }
        }
        if let Some(n) = t.tokens {
            if LineSpec::Tokens(n).check().is_err() {
                return Err(ConfigError::invalid(
                    "ledger.tideline.tokens",
                    format!("{n} is below the {MIN_FIXED_LINE} minimum (0 = the model ceiling)"),
                ));
            }
        }
        match t.block {
            Some(BlockSpec::Tokens(0)) => {
                return Err(ConfigError::invalid(
                    "ledger.tideline.block",
                    "must be above 0",
                ));
            }
            Some(BlockSpec::PercentOfLine(p)) if !(p > 0.0 && p <= 100.0) => {
                return Err(ConfigError::invalid(
                    "ledger.tideline.block",
                    format!("{p}% is out of range (above 0, at most 100)"),
                ));
            }
            _ => {}
        }
        let st = &self.ledger.state;
        if !(MIN_STATE_TOKENS..=MAX_STATE_TOKENS).contains(&st.max_tokens) {
            return Err(ConfigError::invalid(
                "ledger.state.max_tokens",
                format!(
                    "{} is out of range ({MIN_STATE_TOKENS} to {MAX_STATE_TOKENS})",
                    st.max_tokens
                ),
            ));
        }
        for (key, spec) in [
            ("ledger.compress.protect", self.ledger.compress.protect),
            ("ledger.compress.free", self.ledger.compress.free),
        ] {
            if let Some(BlockSpec::PercentOfLine(p)) = spec {
                if !(0.0..=100.0).contains(&p) {
                    return Err(ConfigError::invalid(
                        key,
                        format!("{p}% is out of range (0 to 100)"),
                    ));
                }
            }
        }
        if let Some(m) = &self.ledger.merge.model {
            if m.trim().is_empty() {
                return Err(ConfigError::invalid(
                    "ledger.merge.model",
                    "must not be empty (omit it to turn merge off)",
                ));
            }
        }
        if let Some(e) = &self.ledger.merge.api_key_env {
            let ok = !e.is_empty()
                && !e.starts_with(|c: char| c.is_ascii_digit())
                && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(ConfigError::invalid(
                    "ledger.merge.api_key_env",
                    format!("{e:?} is not an environment variable name (letters, digits and _, not starting with a digit)"),
                ));
            }
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.max_body_bytes", l.max_body_bytes),
            ("limits.connect_timeout_ms", l.connect_timeout_ms),
            (
                "limits.response_header_timeout_ms",
                l.response_header_timeout_ms,
            ),
            ("limits.idle_stream_timeout_ms", l.idle_stream_timeout_ms),
            (
                "limits.max_bodies_in_flight_bytes",
                l.max_bodies_in_flight_bytes,
            ),
            ("limits.max_connections", l.max_connections),
            ("limits.header_read_timeout_ms", l.header_read_timeout_ms),
            ("limits.body_read_timeout_ms", l.body_read_timeout_ms),
            ("limits.keepalive_timeout_ms", l.keepalive_timeout_ms),
            (
                "limits.upstream_pool_idle_timeout_ms",
                l.upstream_pool_idle_timeout_ms,
            ),
            (
                "limits.max_recorded_response_bytes",
                l.max_recorded_response_bytes,
            ),
            (
                "limits.max_decoded_response_bytes",
                l.max_decoded_response_bytes,
            ),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(key, "must be above 0"));
            }
        }
        if l.max_bodies_in_flight_bytes < l.max_body_bytes {
            return Err(ConfigError::invalid(
                "limits.max_bodies_in_flight_bytes",
                format!(
                    "must be at least limits.max_body_bytes ({})",
                    l.max_body_bytes
                ),
            ));
        }
        let b = &l.session;
        if let Some(v) = b.spend_usd {
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError::invalid(
                    "limits.session.spend_usd",
                    format!("{v} must be a number of USD above 0 (omit it for no limit)"),
                ));
            }
        }
        if b.steps == Some(0) {
            return Err(ConfigError::invalid(
                "limits.session.steps",
                "must be above 0 (omit it for no limit)",
            ));
        }
        if b.time.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::invalid(
                "limits.session.time",
                "must be above 0 (omit it for no limit)",
            ));
        }
        for h in &self.access.allowed_hosts {
            if h.trim().is_empty() || h.contains(['/', ':', ' ']) {
                return Err(ConfigError::invalid(
                    "access.allowed_hosts",
                    format!("{h:?} is not a host name (no scheme, port or path)"),
                ));
            }
        }
        let w = &self.writer;
        if w.queue_capacity == 0 {
            return Err(ConfigError::invalid(
                "writer.queue_capacity",
                "must be above 0",
            ));
        }
        if w.queue_bytes == 0 {
            return Err(ConfigError::invalid(
                "writer.queue_bytes",
                "must be above 0",
            ));
        }
        if w.batch_max == 0 || w.batch_max > w.queue_capacity {
            return Err(ConfigError::invalid(
                "writer.batch_max",
                format!(
                    "must be between 1 and writer.queue_capacity ({})",
                    w.queue_capacity
                ),
            ));
        }
        if let Some(f) = &self.log {
            if f.trim().is_empty() {
                return Err(ConfigError::invalid("log", "must not be empty"));
            }
        }
        Ok(())
    }

    /// The upstream base URL of provider `id` (`anthropic`, `openai`, ...).
    pub fn upstream(&self, id: &str) -> Option<&str> {
        self.providers
            .get(id)
            .map(|p| p.upstream.as_str())
            .filter(|u| !u.is_empty())
    }

    /// The Anthropic upstream base URL.
    pub fn anthropic_upstream(&self) -> &str {
        self.upstream(ANTHROPIC)
            .unwrap_or(DEFAULT_ANTHROPIC_UPSTREAM)
    }

    /// The OpenAI upstream base URL.
    pub fn openai_upstream(&self) -> &str {
        self.upstream(OPENAI).unwrap_or(DEFAULT_OPENAI_UPSTREAM)
    }

    /// The Gemini upstream base URL.
    pub fn gemini_upstream(&self) -> &str {
        self.upstream(GEMINI).unwrap_or(DEFAULT_GEMINI_UPSTREAM)
    }

    /// The data dir: `data_dir` (set by file, `OCEANCODE_DATA_DIR` or `--data-dir`),
    /// else the XDG default. A leading `~/` is expanded.
    pub fn resolved_data_dir(&self, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
        match &self.data_dir {
            Some(d) => expand_home(d, env),
            None => default_data_dir(env),
        }
    }

    /// The log filter (`info` unless set).
    pub fn log_filter(&self) -> &str {
        self.log.as_deref().unwrap_or(DEFAULT_LOG)
    }

    /// The configured facts for `model` from any provider: an exact id match
    /// first, then a match after normalization (case, date suffix, `[1m]`).
    pub fn model_config(&self, model: &str) -> Option<&ModelConfig> {
        let all = || self.providers.values().flat_map(|p| p.models.iter());
        if let Some(m) = all().find(|m| m.id == model) {
            return Some(m);
        }
        let want = crate::models::normalize(model).base;
        all().find(|m| crate::models::normalize(&m.id).base == want)
    }
}

/// A USD amount (`2`, `0.50`, `$1.5`): finite and above 0.
pub fn parse_usd(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_prefix('$').unwrap_or(t);
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not an amount of USD above 0 (e.g. 2 or 0.50)"
        )),
    }
}

/// Validates one `providers.<id>.models[i]` entry.
fn validate_model(key: &str, m: &ModelConfig) -> Result<(), ConfigError> {
    if m.id.trim().is_empty() {
        return Err(ConfigError::invalid(
            format!("{key}.id"),
            "must not be empty",
        ));
    }
    if m.context_window == Some(0) {
        return Err(ConfigError::invalid(
            format!("{key}.context_window"),
            "must be above 0",
        ));
    }
    if m.max_output == Some(0) {
        return Err(ConfigError::invalid(
            format!("{key}.max_output"),
            "must be above 0",
        ));
    }
    if let (Some(c), Some(o)) = (m.context_window, m.max_output) {
        if o >= c {
            return Err(ConfigError::invalid(
                format!("{key}.max_output"),
                format!("{o} must be below context_window ({c})"),
            ));
        }
    }
    if let Some(p) = &m.price {
        for (name, v) in [
            ("input", Some(p.input)),
            ("output", Some(p.output)),
            ("cache_read", p.cache_read),
            ("cache_write", p.cache_write),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(ConfigError::invalid(
                        format!("{key}.price.{name}"),
                        format!("{v} must be a non-negative number"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Deserializes `tokens`: a whole number or a string like `"500k"`.
fn de_tokens<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a token count such as 300000 or \"500k\"")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v)
                .map(Some)
                .map_err(|_| E::custom(format!("token count {v} is negative")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            whole_tokens(v).map(Some).ok_or_else(|| {
                E::custom(format!(
                    "token count {v} is not a whole non-negative number"
                ))
            })
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            match s.parse::<Amount>() {
                Ok(Amount::Tokens(t)) => Ok(Some(t)),
                Ok(Amount::Percent(_)) => Err(E::custom(format!(
                    "{s:?} is a percentage; use ledger.tideline.percent for it"
                ))),
                Err(e) => Err(E::custom(e)),
            }
        }
    }
    d.deserialize_any(V)
}

/// Deserializes `block`: a token count (number, or `"20k"`) or `"35%"` of the line.
fn de_block<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BlockSpec>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<BlockSpec>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(
                "a token count such as 20000 or \"20k\", or a share of the line such as \"35%\"",
            )
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(BlockSpec::Tokens(v)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v)
                .map(|t| Some(BlockSpec::Tokens(t)))
                .map_err(|_| E::custom(format!("block {v} is negative")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            whole_tokens(v)
                .map(|t| Some(BlockSpec::Tokens(t)))
                .ok_or_else(|| {
                    E::custom(format!(
                        "block {v} is not a whole non-negative number of tokens"
                    ))
                })
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            s.parse::<BlockSpec>().map(Some).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

/// `v` as a token count if it is finite, non-negative and whole.
fn whole_tokens(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 9.0e15).then_some(v as u64)
}

/// Serializes `block` the way it is written: a number or `"35%"`.
fn ser_block<S: Serializer>(b: &Option<BlockSpec>, s: S) -> Result<S::Ok, S::Error> {
    match b {
        Some(BlockSpec::Tokens(t)) => s.serialize_u64(*t),
        Some(BlockSpec::PercentOfLine(p)) => s.serialize_str(&format!("{p}%")),
        None => s.serialize_none(),
    }
}
