//! Typed configuration of oceancode-proxy (layered: defaults → JSON file →
//! `OCEANCODE_*` env → CLI flags), the built-in model table, and the parser
//! of the `tideline` command. See `docs/configuration.md` for every key.

#![warn(missing_docs)]

pub mod budget;
pub mod command;
pub mod config;
pub mod error;
pub mod model_facts;
pub mod models;
pub mod redact;
pub mod tideline;

pub use budget::{format_duration, parse_duration, SessionLimitsConfig};
pub use command::{
    bare_number_hint, tideline_args, tideline_command, TidelineArgs, TidelineCommand, UsageError,
    TIDELINE_USAGE,
};
pub use config::{
    check_otlp_url, check_upstream_url, default_config_path, default_data_dir, find_config_file,
    is_postgres_url, parse_switch, parse_usd, process_env, resolve_data_dir, vars, AccessConfig,
    CompressConfig, Config, ContextConfig, LedgerConfig, LimitsConfig, Loaded, MergeConfig,
    ModelConfig, OtlpConfig, Overrides, PriceConfig, ProviderConfig, RecallSearchScope,
    RecallToolConfig, RetentionConfig, StateConfig, TelemetryConfig, TidelineConfig, WriterConfig,
    MAX_STATE_TOKENS, MIN_STATE_TOKENS, SQLITE,
};
pub use error::ConfigError;
pub use model_facts::{context_window, max_output, price};
pub use models::{lookup, with_context_1m, ModelInfo, Price};
pub use redact::{redact_url, redact_urls_in};
pub use tideline::{
    Amount, AmountError, BlockSpec, LineSpec, MAX_CHECKED_WINDOW, MIN_FIXED_LINE, MIN_PERCENT,
};

#[cfg(test)]
mod tests;
