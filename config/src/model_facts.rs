//! A model's facts under a config: its context window, output allowance and
//! prices, each from the config (and the environment) first, then the
//! built-in table of [`crate::models`]. The table knows nothing of the
//! config; this module is where the two meet.

use crate::config::{vars, Config};
use crate::models::{lookup, Price};

/// `OCEANCODE_CONTEXT_TOKENS` as a token count (`"1m"`, `"200000"`); invalid
/// or zero values are ignored with a warning (`Config::apply_env` refuses
/// them at start, so only a value changed behind the process gets here).
fn env_context_tokens(env: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let raw = env(vars::CONTEXT_TOKENS)?;
    let v = raw.trim();
    if v.is_empty() {
        return None;
    }
    match v.parse::<crate::Amount>() {
        Ok(crate::Amount::Tokens(t)) if t > 0 => Some(t),
        _ => {
            tracing::warn!(
                "ignoring {}={raw:?}: expected a token count such as 200000 or 1m",
                vars::CONTEXT_TOKENS
            );
            None
        }
    }
}

/// The context window of `model`, first match wins: env
/// `OCEANCODE_CONTEXT_TOKENS`; config `providers.<id>.models[].context_window`
/// (any provider); `learned` (the ceiling learned from a too-long error); the
/// built-in table. `None` = unknown (the caller uses a fixed 300000 line).
pub fn context_window(
    model: &str,
    config: &Config,
    env: &dyn Fn(&str) -> Option<String>,
    learned: Option<u64>,
) -> Option<u64> {
    env_context_tokens(env)
        .or_else(|| config.model_config(model).and_then(|m| m.context_window))
        .or(learned.filter(|&l| l > 0))
        .or_else(|| lookup(model).map(|i| i.context_window))
}

/// The output allowance of `model`: config `providers.<id>.models[].max_output`,
/// else the built-in table. `None` = unknown.
pub fn max_output(model: &str, config: &Config) -> Option<u64> {
    config
        .model_config(model)
        .and_then(|m| m.max_output)
        .or_else(|| lookup(model).map(|i| i.max_output))
}

/// The prices of `model`: config `providers.<id>.models[].price`, else the
/// built-in table. `None` = unknown.
pub fn price(model: &str, config: &Config) -> Option<Price> {
    config
        .model_config(model)
        .and_then(|m| m.price.as_ref())
        .map(|p| p.to_price())
        .or_else(|| lookup(model).and_then(|i| i.price))
}
