//! The session manager: maps each request onto a ledger session by
//! longest-common-prefix over normalized messages, records new rows and
//! branches, runs the tideline, and renders the window sent upstream.
//!
//! Everything here is in memory and cheap per request: old messages are only
//! hashed (xxh3 over their raw bytes), and only messages that differ from the
//! recorded ones are parsed. Writes go to the single ledger writer through a
//! queue; the request path never waits on disk.
//!
//! | module | holds |
//! |---|---|
//! | `prepare` | a request in named phases: split, describe, record, tideline, window |
//! | `step` | the [`Ticket`] a prepared request carries until its step finishes, exactly once |
//! | `hold` | a request's events held until the upstream's status is known; a 401/403 rolled back |
//! | `index` | live sessions by client key and id, matching, siblings, restore, eviction |
//! | `state` | one session's rows, active line and tideline; absorbing a history |
//! | `window` | rendering the window for the current cut (pure) |
//! | `stages` | the context strategies as window stages in their declared order (pure but `at_cut`) |
//! | `view` | the same plan from a recorded session, for the viewer's model view (pure) |
//! | `compress` | `ledger.compress`: the pruned set chosen at a cut, applied in the rendering |
//! | `view` | the same plan from a recorded session, for the viewer's model view of a step recorded without its window (pure) |
//! | `sent` | what a step sent, kept in its record for the viewer (pure) |
//! | `layouts` | each client's latest body layouts, to split the next body fast |
//! | `parse` | full parses of new messages, root hashes, token estimates |
//! | `meter` | what the meter shows |
//! | `limits` | what a context-limit failure teaches a session, and whether a retry could cut |
//! | `budget` | per-session bounds on spend, steps and time (`limits.session`) |

mod budget;
mod compress;
mod context;
mod hold;
mod index;
mod layouts;
mod limits;
mod meter;
mod parse;
mod prepare;
mod rowmem;
mod rows;
mod sent;
mod stages;
mod state;
mod step;
#[cfg(test)]
mod tests;
mod thread;
mod view;
mod window;
pub use context::{ContextAnswer, Evict, Evicted};

pub use budget::{
    Budget, BudgetView, Estimate, Limit, LimitHit, Pricer, Reservation, SessionLimits, SpendSeed,
    Spent,
};
pub use compress::Locator;
pub use hold::refuses_caller;
pub use meter::{line_label, Meter};
pub use parse::{estimate_tokens, DEFAULT_BYTES_PER_TOKEN, FULL_PARSES};
pub use state::State;
pub use step::{MeterHead, Prepared, Refusal, StepError, Ticket};
pub use view::{model_view, ModelView, Sent};

use index::Index;
use layouts::Layouts;
use oceancode_config::{BlockSpec, CompressConfig, LineSpec};
use oceancode_ledger::store::LoadedSession;
use oceancode_window::tideline;
use oceancode_window::Event;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Context window and output allowance of a model, as configured/known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelLimits {
    /// Context window in tokens (None = unknown).
    pub context: Option<u64>,
    /// Output allowance in tokens.
    pub max_output: Option<u64>,
}

/// Resolves a model's limits given a learned ceiling.
pub type ModelResolver = Arc<dyn Fn(&str, Option<u64>) -> ModelLimits + Send + Sync>;

/// Where ledger events go (the store in production, a vector in tests).
pub type EventSink = Arc<dyn Fn(Vec<Event>) + Send + Sync>;

/// Reads back the recorded sessions of a client key (after a restart, or
/// after they left memory). Called outside every lock of the manager.
pub type Restorer =
    Arc<dyn Fn(&str) -> Result<Vec<LoadedSession>, crate::error::BoxError> + Send + Sync>;

/// The committed state of a session the ledger marked *behind*, taken as
/// the session's state so the client's next full resend records what the
/// ledger misses (`oceancode_ledger::store::LedgerWrite::resync`).
pub struct Resync {
    /// What the ledger holds of the session (None = nothing).
    pub committed: Option<LoadedSession>,
}

/// Asked once per request for the session it continues: `Some` when the
/// ledger had it behind and now hands back its committed state (cheap when
/// nothing is behind: one atomic load).
pub type Healer = Arc<dyn Fn(&str) -> Option<Resync> + Send + Sync>;

/// Tideline and ledger settings the manager runs with.
#[derive(Clone)]
pub struct Settings {
    /// The data directory (stubs point into `<data>/sessions/<id>`).
    pub data_dir: PathBuf,
    /// Configured line.
    pub line: LineSpec,
    /// Configured block size.
    pub block: BlockSpec,
    /// Model limits lookup.
    pub models: ModelResolver,
    /// When false, nothing is windowed (pure passthrough + ledger).
    pub tideline_enabled: bool,
    /// How long after its last answer a headerless conversation's line is
    /// still live: a request that leaves a live line is another
    /// conversation (a sibling session), one that leaves a quiet line is a
    /// rewind (a branch). See [`LIVE_WINDOW`].
    pub live_window: std::time::Duration,
    /// The state block after the stub at every cut, within this many tokens
    /// (`ledger.state`; None = off).
    pub state_tokens: Option<u32>,
    /// `ledger.compress`: at a cut, old tool output becomes a pointer
    /// (`enabled: false` = off).
    pub compress: CompressConfig,
    /// `context.seq_tags`: every tool result sent upstream ends with its
    /// seq, `[seq N]`.
    pub seq_tags: bool,
    /// `ledger.tideline.cold_cut`: a request that finds the prompt cache
    /// cold takes the cut due within the next block.
    pub cold_cut: bool,
    /// What the sessions read the time from (the wall clock; a test's own).
    pub clock: Clock,
}

/// The time the session logic reads (Unix ms): when a session began and
/// was last answered, so the live window, the time limit, the prompt
/// cache's warmth and its events' timestamps. The wall clock, except in
/// tests that move time on without waiting for it.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl Clock {
    /// The wall clock.
    pub fn wall() -> Clock {
        Clock(Arc::new(now_ms))
    }

    /// A clock reading `now` (Unix ms).
    pub fn from_fn(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// Unix milliseconds now.
    pub fn now_ms(&self) -> i64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::wall()
    }
}

impl Settings {
    /// The production defaults (those of an empty config file) with the
    /// data dir at `data_dir`: a new setting gets its default here, and
    /// every caller names only what it changes
    /// (`Settings { seq_tags: true, ..Settings::new(dir) }`).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Settings {
            data_dir: data_dir.into(),
            line: LineSpec::Percent(40.0),
            block: BlockSpec::PercentOfLine(70.0),
            models: builtin_models(),
            tideline_enabled: true,
            live_window: LIVE_WINDOW,
            state_tokens: Some(oceancode_ledger::state_block::DEFAULT_MAX_TOKENS),
            compress: CompressConfig::default(),
            seq_tags: false,
            cold_cut: true,
            clock: Clock::wall(),
        }
    }

    /// For tests: [`Settings::new`] with every model at a 200k context and
    /// 8k of output, and compress off (tests that assert retained rows
    /// byte for byte turn it on where they test it).
    pub fn for_tests(data_dir: impl Into<PathBuf>) -> Self {
        Settings {
            models: Arc::new(|_: &str, _: Option<u64>| ModelLimits {
                context: Some(200_000),
                max_output: Some(8_000),
            }),
            compress: CompressConfig {
                enabled: false,
                ..CompressConfig::default()
            },
            ..Settings::new(data_dir)
        }
    }
}

/// The built-in model table (a context the upstream taught wins over it).
pub fn builtin_models() -> ModelResolver {
    Arc::new(|model: &str, learned: Option<u64>| {
        let info = oceancode_config::lookup(model);
        ModelLimits {
            context: learned.or(info.map(|i| i.context_window)),
            max_output: info.map(|i| i.max_output),
        }
    })
}

/// The default [`Settings::live_window`]: an agent's next request follows
/// its last answer within seconds to minutes (a long tool run), a person's
/// rewind of a quiet conversation after longer.
pub const LIVE_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// Counters exported on `/metrics`.
#[derive(Debug, Default)]
pub struct SessionMetrics {
    /// Cuts made.
    pub cuts: AtomicU64,
    /// Tokens (estimated) kept out of upstream windows, summed over requests.
    pub tokens_kept_out: AtomicU64,
    /// Rows recorded.
    pub rows: AtomicU64,
    /// Branches recorded.
    pub branches: AtomicU64,
    /// Sibling sessions made (another conversation with the same opening).
    pub siblings: AtomicU64,
    /// Requests whose body was rewritten.
    pub rewritten: AtomicU64,
    /// Retries after a too-long error.
    pub too_long_retries: AtomicU64,
    /// Bodies split against a previous body of the same client (its shared
    /// prefix hashed, not scanned).
    pub bodies_spliced: AtomicU64,
    /// Requests the upstream refused with 401/403, left unrecorded.
    pub refused: AtomicU64,
    /// Steps recorded as failed (no whole answer: unreachable, timeout,
    /// broken stream, cancelled, an error status or error event).
    pub failed_steps: AtomicU64,
    /// Tool outputs `ledger.compress` made pointers (counted at the cut
    /// that chose them).
    pub compress_outputs: AtomicU64,
    /// The saved estimate of the pointers sent, summed over requests.
    pub compress_saved_tokens: AtomicU64,
    /// Cuts made at a request whose prompt cache was already cold (free).
    pub cold_cuts: AtomicU64,
    /// Cache misses by cause, in the order of
    /// [`oceancode_window::cache::MissCause::ALL`].
    pub cache_misses: [AtomicU64; 8],
}

/// A ledger session shared between requests.
pub struct Session {
    /// Ledger id.
    pub id: String,
    /// Mutable state.
    pub state: Mutex<State>,
}

/// The manager.
pub struct SessionManager {
    settings: Settings,
    sink: EventSink,
    index: Arc<Mutex<Index>>,
    global_override: Mutex<Option<LineSpec>>,
    /// Counters.
    pub metrics: Arc<SessionMetrics>,
    counter: AtomicU64,
    restorer: Option<Restorer>,
    healer: Option<Healer>,
    locator: Option<Locator>,
    /// Line overrides of sessions that left memory (restored with them).
    parked_overrides: Mutex<HashMap<String, Option<LineSpec>>>,
    layouts: Layouts,
    /// Per-session bounds (None: none set).
    budget: Option<Arc<Budget>>,
    /// Inject the in-band recall tool into every recorded request.
    recall_tool: bool,
}

use oceancode_ledger::time::now_ms;

impl SessionManager {
    /// A manager writing ledger events to `sink`.
    pub fn new(settings: Settings, sink: EventSink) -> Self {
        SessionManager {
            settings,
            sink,
            index: Arc::default(),
            global_override: Mutex::new(None),
            metrics: Arc::default(),
            counter: AtomicU64::new(0),
            restorer: None,
            healer: None,
            locator: None,
            parked_overrides: Mutex::new(HashMap::new()),
            layouts: Layouts::default(),
            budget: None,
            recall_tool: false,
        }
    }

    /// Unix milliseconds now, by [`Settings::clock`].
    fn now_ms(&self) -> i64 {
        self.settings.clock.now_ms()
    }

    /// Inject the in-band recall tool (`ledger.recall_tool`) into every
    /// recorded request (and count_tokens), after the client's tools.
    pub fn with_recall_tool(mut self, on: bool) -> Self {
        self.recall_tool = on;
        self
    }

    /// Whether the in-band recall tool is injected.
    pub fn recall_tool(&self) -> bool {
        self.recall_tool
    }

    /// Read recorded sessions back from the ledger when a client key is first
    /// seen after a restart, so its next full resend continues (and heals) them.
    pub fn with_restorer(mut self, r: Restorer) -> Self {
        self.restorer = Some(r);
        self
    }

    /// Name transcript lines in compress pointers (see [`Locator`]).
    pub fn with_locator(mut self, l: Locator) -> Self {
        self.locator = Some(l);
        self
    }

    /// Heal sessions the ledger fell behind on (see [`Healer`]).
    pub fn with_healer(mut self, h: Healer) -> Self {
        self.healer = Some(h);
        self
    }

    /// Whether sessions are recorded and windowed (`ledger.enabled`); when
    /// not, the front relays provider requests as they are.
    pub fn enabled(&self) -> bool {
        self.settings.tideline_enabled
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The line spec in force for a session: its override, else the global
    /// override, else the configured line (`serve --tideline`, config).
    pub fn line_spec_of(&self, s: &Session) -> LineSpec {
        let own = s.state.lock().override_line;
        own.or(*self.global_override.lock())
            .unwrap_or(self.settings.line)
    }

    /// Whether `spec` is a line for `session` (all live sessions when None):
    /// a percentage must resolve to at least the 20k floor
    /// ([`oceancode_config::MIN_FIXED_LINE`], or the model's ceiling when
    /// that is lower) on each of their models' windows, as a fixed line
    /// must. Err says which session and model, the floor, and the least
    /// percentage that would do.
    pub fn check_line(&self, session: Option<&str>, spec: LineSpec) -> Result<(), String> {
        let LineSpec::Percent(p) = spec else {
            return Ok(());
        };
        let targets: Vec<Arc<Session>> = match session {
            Some(id) => self.get(id).into_iter().collect(),
            None => self.sessions(),
        };
        for s in targets {
            let (model, learned) = {
                let st = s.state.lock();
                (st.meta.model.clone(), st.learned_ceiling)
            };
            if model.is_empty() {
                continue;
            }
            let limits = (self.settings.models)(&model, learned);
            let Some(context) = limits.context else {
                continue;
            };
            let ceiling =
                context.saturating_sub(tideline::output_allowance(limits.max_output, None));
            let floor = oceancode_config::MIN_FIXED_LINE.min(ceiling);
            let line = (context as f64 * p / 100.0).floor() as u64;
            if line < floor {
                let least = (floor as f64 * 100.0 / context as f64 * 100.0).ceil() / 100.0;
                return Err(format!(
                    "{p}% of the {context}-token window of {model} (session {}) is {line} tokens, under the {floor}-token floor of a tideline: give at least {least}%, or a fixed line of 20k or more",
                    s.id
                ));
            }
        }
        Ok(())
    }

    /// Set (or clear) the line for one session, or for all when `session` is None.
    /// Sub-agent sessions follow their parent's override; a sibling (another
    /// conversation) took its parent's when it began, and keeps its own.
    pub fn set_override(
        &self,
        session: Option<&str>,
        line: Option<LineSpec>,
    ) -> Result<(), String> {
        match session {
            None => {
                *self.global_override.lock() = line;
                Ok(())
            }
            Some(id) => {
                let s = self.get(id).ok_or_else(|| format!("no session {id:?}"))?;
                s.state.lock().override_line = line;
                let children: Vec<Arc<Session>> = self
                    .sessions()
                    .into_iter()
                    .filter(|c| {
                        let st = c.state.lock();
                        st.meta.parent.as_deref() == Some(id) && st.meta.parent_seq.is_none()
                    })
                    .collect();
                for c in children {
                    c.state.lock().override_line = line;
                }
                Ok(())
            }
        }
    }

    /// `tideline now`: cut at the next request of the session, which
    /// records it (a `Cut` event) like any other. Returns the last row the
    /// next window leaves out, which is on the active line: after a rewind
    /// the session's recorded cut may name rows of the line it left.
    pub fn cut_now(&self, id: &str) -> Result<u64, String> {
        let s = self.get(id).ok_or_else(|| format!("no session {id:?}"))?;
        let mut st = s.state.lock();
        st.release_hold(&self.sink);
        let boundary = st.active.last().copied().unwrap_or(0);
        st.tideline
            .cut_now(boundary)
            .ok_or_else(|| "nothing to cut yet".to_string())?;
        let plan = tideline::plan_window(&st.row_infos(), st.tideline.cut_upto());
        if plan.effective_upto_seq == 0 {
            return Err("nothing to cut yet".to_string());
        }
        Ok(plan.effective_upto_seq)
    }
}
