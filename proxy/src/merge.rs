//! The model merge of `SESSION.md` (`ledger.merge.model`, issue 13 part 4):
//! the one call to a model the proxy makes itself, and it never enters a
//! request. [`ask`] sends the merge prompt ([`oceancode_ledger::merge`]) to
//! the merge model and reads its answer and usage; `ledger rebuild --merge`
//! and the live merge both use it.
//!
//! The live merge ([`Merger`]) runs while serving, opt-in: with
//! `ledger.merge.model` set and a key in the proxy's own environment
//! (`OCEANCODE_MERGE_API_KEY`, or the variable `ledger.merge.api_key_env`
//! names; a client's credentials are never reused). After a step whose
//! session cut further, it starts a background task (never awaited by a
//! request): wait for the ledger to settle, read the session's backlog
//! (turns wholly past the tideline that no merge covered), send their
//! transcripts and the page, and store the answer's lines with a marker
//! that records the call's model and tokens (`Store::add_page_notes`: the
//! page's Decisions, Environment, Errors and fixes, Code map, Open
//! questions and Next step; a plain `ledger rebuild` reproduces them).
//! One merge runs at a time; a session's next merge waits for its next
//! cut; a failure is logged once (later ones at debug) and counted.

use crate::error::ProxyError;
use crate::upstream::{self, Upstream};
use http_body_util::{BodyExt, Full};
use oceancode_ledger::merge as m;
use oceancode_ledger::store::{LedgerStore, StoreError};
use oceancode_window::Usage;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The API the merge model speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Anthropic Messages (`/v1/messages`, `x-api-key`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`, a bearer token).
    OpenAi,
}

impl Provider {
    /// `claude…` models speak Anthropic's API; every other one OpenAI's.
    pub fn of_model(model: &str) -> Provider {
        if model.trim().to_ascii_lowercase().starts_with("claude") {
            Provider::Anthropic
        } else {
            Provider::OpenAi
        }
    }
}

/// A secret, never printed.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wrap.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// How a merge request authenticates.
#[derive(Clone, Debug)]
pub enum Auth {
    /// `x-api-key` (Anthropic).
    ApiKey(Secret),
    /// `authorization: Bearer` (OpenAI; Anthropic's auth tokens).
    Bearer(Secret),
}

impl Auth {
    /// The provider's usual form for a key.
    pub fn key_for(provider: Provider, key: Secret) -> Auth {
        match provider {
            Provider::Anthropic => Auth::ApiKey(key),
            Provider::OpenAi => Auth::Bearer(key),
        }
    }
}

/// The merge model's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// Its text.
    pub text: String,
    /// The tokens it reported.
    pub usage: Usage,
}

/// Why a merge failed.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The request could not be sent or its answer not read.
    #[error("the merge request failed: {0}")]
    Send(#[from] ProxyError),
    /// The model answered with an error.
    #[error("the merge model answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// Reading the answer failed.
    #[error("cannot read the merge model's answer: {0}")]
    Read(String),
    /// The ledger refused.
    #[error("ledger: {0}")]
    Store(#[from] StoreError),
}

/// One non-streaming request to `provider` at `base`.
pub async fn ask(
    up: &Upstream,
    base: &str,
    provider: Provider,
    model: &str,
    auth: &Auth,
    prompt: &str,
) -> Result<Answer, MergeError> {
    let (path, body) = match provider {
        Provider::Anthropic => (
            "/v1/messages",
            serde_json::json!({"model": model, "max_tokens": 4096,
                "messages": [{"role": "user", "content": prompt}]}),
        ),
        Provider::OpenAi => (
            "/v1/chat/completions",
            serde_json::json!({"model": model,
                "messages": [{"role": "user", "content": prompt}]}),
        ),
    };
    let uri = upstream::join(base, path)?;
    let mut req = http::Request::post(uri).header("content-type", "application/json");
    if provider == Provider::Anthropic {
        req = req.header("anthropic-version", "2023-06-01");
    }
    req = match auth {
        Auth::ApiKey(k) => req.header("x-api-key", &k.0),
        Auth::Bearer(k) => req.header("authorization", format!("Bearer {}", k.0)),
    };
    let body = Full::new(bytes::Bytes::from(body.to_string()))
        .map_err(|never| match never {})
        .boxed();
    let req = req
        .body(body)
        .map_err(|e| MergeError::Read(format!("bad request: {e}")))?;
    let resp = up.send(req, base).await?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| MergeError::Read(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(MergeError::Status {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&bytes).chars().take(300).collect(),
        });
    }
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| MergeError::Read(e.to_string()))?;
    let n = |p: &str| {
        v.pointer(p)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    Ok(match provider {
        Provider::Anthropic => Answer {
            text: v["content"]
                .as_array()
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter_map(|b| b["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default(),
            usage: Usage {
                input: n("/usage/input_tokens"),
                output: n("/usage/output_tokens"),
                cache_read: n("/usage/cache_read_input_tokens"),
                cache_write: n("/usage/cache_creation_input_tokens"),
            },
        },
        Provider::OpenAi => {
            let cached = n("/usage/prompt_tokens_details/cached_tokens");
            Answer {
                text: v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                usage: Usage {
                    input: n("/usage/prompt_tokens").saturating_sub(cached),
                    output: n("/usage/completion_tokens"),
                    cache_read: cached,
                    cache_write: 0,
                },
            }
        }
    })
}

/// What the live merge runs with.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    /// The merge model.
    pub model: String,
    /// Its API.
    pub provider: Provider,
    /// Where it is served (the provider's configured upstream).
    pub upstream: String,
    /// The key, from the proxy's own environment.
    pub auth: Auth,
    /// Its price (the meter's cost), if known.
    pub price: Option<oceancode_config::Price>,
}

impl MergeOptions {
    /// From the config and the environment: `None` (the live merge off)
    /// without `ledger.merge.model` or without its key (said once in the
    /// log: `ledger rebuild --merge` still works with the shell's keys).
    pub fn from_config(
        cfg: &oceancode_config::Config,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<MergeOptions> {
        let model = cfg.ledger.merge.model.clone()?;
        let var = cfg.ledger.merge.key_env();
        let Some(key) = env(var).filter(|k| !k.trim().is_empty()) else {
            tracing::info!(model = %model, "ledger.merge.model is set but {var} is not: the live merge of SESSION.md is off (`ledger rebuild --merge` still merges, with the shell's provider key)");
            return None;
        };
        let provider = Provider::of_model(&model);
        let upstream = match provider {
            Provider::Anthropic => cfg.anthropic_upstream(),
            Provider::OpenAi => cfg.openai_upstream(),
        }
        .to_string();
        Some(MergeOptions {
            price: oceancode_config::price(&model, cfg),
            auth: Auth::key_for(provider, Secret::new(key.trim())),
            provider,
            upstream,
            model,
        })
    }
}

/// What the live merge did, in all and per session (the meter and
/// `/metrics`).
#[derive(Debug, Default)]
pub struct MergeStats {
    /// Merge calls that stored their lines.
    pub calls: AtomicU64,
    /// Merge calls that failed.
    pub failures: AtomicU64,
    /// Lines merged into pages.
    pub lines: AtomicU64,
    /// Input tokens (uncached + cache read + cache write).
    pub input_tokens: AtomicU64,
    /// Output tokens.
    pub output_tokens: AtomicU64,
    /// Cost at list price, in micro-dollars.
    pub cost_micro_usd: AtomicU64,
}

/// A session's merges, as its meter shows them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SessionMerge {
    /// Calls that stored their lines.
    pub calls: u32,
    /// Calls that failed.
    pub failures: u32,
    /// The last turn merged (0 = none yet).
    pub through_turn: u32,
    /// Their tokens.
    pub usage: Usage,
    /// Their cost at list price (None: no price for the model).
    pub cost_usd: Option<f64>,
    /// A merge is running now.
    pub running: bool,
    /// The last failure, if the last call failed.
    pub last_error: Option<String>,
    #[serde(skip)]
    checked_cut: u64,
}

/// The live merge.
pub struct Merger {
    opts: MergeOptions,
    up: Upstream,
    store: Arc<dyn LedgerStore>,
    sessions: Mutex<HashMap<String, SessionMerge>>,
    one_at_a_time: tokio::sync::Semaphore,
    failure_logged: AtomicBool,
    /// In all.
    pub stats: MergeStats,
}

impl fmt::Debug for Merger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Merger")
            .field("model", &self.opts.model)
            .field("upstream", &self.opts.upstream)
            .finish_non_exhaustive()
    }
}

impl Merger {
    /// A merger sending with `up`, storing through `store`.
    pub fn new(opts: MergeOptions, up: Upstream, store: Arc<dyn LedgerStore>) -> Arc<Merger> {
        tracing::info!(model = %opts.model, upstream = %oceancode_config::redact_url(&opts.upstream), "the live merge of SESSION.md is on: turns wholly past the tideline are merged in the background");
        Arc::new(Merger {
            opts,
            up,
            store,
            sessions: Mutex::new(HashMap::new()),
            one_at_a_time: tokio::sync::Semaphore::new(1),
            failure_logged: AtomicBool::new(false),
            stats: MergeStats::default(),
        })
    }

    /// The merge model.
    pub fn model(&self) -> &str {
        &self.opts.model
    }

    /// A session's merges so far (None: none tried).
    pub fn session(&self, id: &str) -> Option<SessionMerge> {
        self.sessions.lock().get(id).cloned()
    }

    /// After a step of session `id`, whose rows up to `cut_upto` are past
    /// the tideline: when the cut moved since the last check and no merge
    /// of it runs, one starts in the background. Cheap (a lock and a
    /// compare); never waits.
    pub fn after_step(self: &Arc<Self>, id: &str, cut_upto: u64) {
        if cut_upto == 0 {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut all = self.sessions.lock();
            let s = all.entry(id.to_string()).or_default();
            if s.running || cut_upto <= s.checked_cut {
                return;
            }
            s.running = true;
            s.checked_cut = cut_upto;
        }
        let this = self.clone();
        let id = id.to_string();
        rt.spawn(async move {
            let r = this.run(&id).await;
            this.done(&id, r);
        });
    }

    /// Merge the session's backlog, if it has one.
    async fn run(&self, id: &str) -> Result<Option<Merged>, MergeError> {
        let _one = self.one_at_a_time.acquire().await;
        // The cut and the rows it passed are committed first.
        self.store.settle().await?;
        let store = self.store.clone();
        let sid = id.to_string();
        let read = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
            let (from, to) = store.page_backlog(&sid)?;
            if from > to {
                return Ok(None);
            }
            let (page, transcripts) = m::read_inputs(store.data_dir(), &sid, from, to);
            Ok(Some((from, to, m::prompt(&sid, &page, &transcripts))))
        })
        .await
        .map_err(|e| MergeError::Read(format!("the merge's read stopped: {e}")))??;
        let Some((from, to, prompt)) = read else {
            return Ok(None);
        };
        let o = &self.opts;
        let answer = ask(
            &self.up,
            &o.upstream,
            o.provider,
            &o.model,
            &o.auth,
            &prompt,
        )
        .await?;
        let mut notes = m::parse_notes(&answer.text, from, to);
        let lines = notes.len();
        notes.push(m::marker_with(to, &o.model, &answer.usage));
        let store = self.store.clone();
        let sid = id.to_string();
        tokio::task::spawn_blocking(move || store.add_page_notes(&sid, notes))
            .await
            .map_err(|e| MergeError::Read(format!("the merge's write stopped: {e}")))??;
        Ok(Some(Merged {
            from,
            to,
            lines,
            usage: answer.usage,
        }))
    }

    /// Count and log what a merge did.
    fn done(&self, id: &str, r: Result<Option<Merged>, MergeError>) {
        let mut all = self.sessions.lock();
        let s = all.entry(id.to_string()).or_default();
        s.running = false;
        match r {
            Ok(None) => {}
            Ok(Some(done)) => {
                let u = done.usage;
                let cost = self
                    .opts
                    .price
                    .map(|p| p.cost_usd(u.input, u.output, u.cache_read, u.cache_write));
                s.calls += 1;
                s.through_turn = done.to;
                s.last_error = None;
                s.usage.input += u.input;
                s.usage.output += u.output;
                s.usage.cache_read += u.cache_read;
                s.usage.cache_write += u.cache_write;
                s.cost_usd = match (s.calls, s.cost_usd, cost) {
                    (1, _, c) => c,
                    (_, Some(a), Some(b)) => Some(a + b),
                    _ => None,
                };
                let st = &self.stats;
                st.calls.fetch_add(1, Ordering::Relaxed);
                st.lines.fetch_add(done.lines as u64, Ordering::Relaxed);
                st.input_tokens
                    .fetch_add(u.input + u.cache_read + u.cache_write, Ordering::Relaxed);
                st.output_tokens.fetch_add(u.output, Ordering::Relaxed);
                if let Some(c) = cost {
                    st.cost_micro_usd
                        .fetch_add((c * 1e6).round() as u64, Ordering::Relaxed);
                }
                tracing::info!(
                    session = id,
                    turns = %format!("t{:02}–t{:02}", done.from, done.to),
                    lines = done.lines,
                    input_tokens = u.input + u.cache_read + u.cache_write,
                    output_tokens = u.output,
                    cost_usd = cost.map(|c| format!("{c:.4}")).unwrap_or_else(|| "no price".into()),
                    "SESSION.md merged by {}",
                    self.opts.model
                );
            }
            Err(e) => {
                s.failures += 1;
                s.last_error = Some(e.to_string());
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                if self.failure_logged.swap(true, Ordering::Relaxed) {
                    tracing::debug!(session = id, error = %e, "the live merge failed again");
                } else {
                    tracing::warn!(session = id, error = %e, "the live merge of SESSION.md failed; it is tried again at the session's next cut (later failures are counted in /metrics, not logged)");
                }
            }
        }
    }
}

/// One merge that stored its lines.
struct Merged {
    from: u32,
    to: u32,
    lines: usize,
    usage: Usage,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_comes_from_the_model_and_the_key_from_the_proxys_env() {
        assert_eq!(Provider::of_model("claude-haiku-4-5"), Provider::Anthropic);
        assert_eq!(Provider::of_model("gpt-5-mini"), Provider::OpenAi);
        let mut cfg = oceancode_config::Config::default();
        let env = |k: &str| (k == "OCEANCODE_MERGE_API_KEY").then(|| "sk-merge".to_string());
        assert!(
            MergeOptions::from_config(&cfg, &env).is_none(),
            "no model: off"
        );
        cfg.ledger.merge.model = Some("claude-haiku-4-5".into());
        let o = MergeOptions::from_config(&cfg, &env).unwrap();
        assert_eq!(o.provider, Provider::Anthropic);
        assert_eq!(o.upstream, "https://api.anthropic.com");
        assert!(matches!(&o.auth, Auth::ApiKey(k) if k.0 == "sk-merge"));
        assert!(
            !format!("{o:?}").contains("sk-merge"),
            "the key is never printed"
        );
        cfg.ledger.merge.api_key_env = Some("CI_MERGE".into());
        assert!(
            MergeOptions::from_config(&cfg, &env).is_none(),
            "no key: off"
        );
        let env2 = |k: &str| (k == "CI_MERGE").then(|| "sk-ci".to_string());
        cfg.ledger.merge.model = Some("gpt-5-mini".into());
        let o = MergeOptions::from_config(&cfg, &env2).unwrap();
        assert_eq!(o.upstream, "https://api.openai.com");
        assert!(matches!(&o.auth, Auth::Bearer(k) if k.0 == "sk-ci"));
    }
}
