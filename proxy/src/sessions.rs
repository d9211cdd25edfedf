//! The session manager: maps each request onto a ledger session by
//! longest-common-prefix over normalized messages, records new rows and
//! branches, runs the tideline, and renders the window sent upstream.
//!
//! Everything here is in memory and cheap per request: old messages are only
//! hashed (xxh3 over their raw bytes), and only messages that differ from the
//! recorded ones are parsed. Writes go to the single ledger writer through a
//! queue; the request path never waits on disk.

use crate::dialect::splice::{self, Layout};
use crate::dialect::{self, ParsedBody};
use crate::identity::{Identity, ReqKind};
use bytes::Bytes;
use oceancode_config::{BlockSpec, LineSpec};
use oceancode_ledger::store::{LoadedSession, StoreError};
use oceancode_ledger::tideline::{self, Observation, Params, RowInfo, Tideline};
use oceancode_ledger::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Reads back the recorded sessions of a client key (after a restart).
pub type Restorer = Arc<dyn Fn(&str) -> Result<Vec<LoadedSession>, StoreError> + Send + Sync>;

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
}

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
    /// Requests whose body was rewritten.
    pub rewritten: AtomicU64,
    /// Retries after a too-long error.
    pub too_long_retries: AtomicU64,
    /// Bodies split against a previous body of the same client (its shared
    /// prefix hashed, not scanned).
    pub bodies_spliced: AtomicU64,
}

/// The tool calls a row makes and answers (hashed ids).
#[derive(Debug, Clone, Default)]
struct Calls {
    opens: Box<[u64]>,
    closes: Box<[u64]>,
    binds_next: bool,
}

impl Calls {
    fn of(i: &dialect::MessageInfo) -> Calls {
        let h = |ids: &[String]| ids.iter().map(|s| dialect::raw_hash(s)).collect();
        Calls {
            opens: h(&i.opens),
            closes: h(&i.closes),
            binds_next: i.binds_next,
        }
    }
}

/// One row as the manager keeps it in memory (no bytes).
#[derive(Debug, Clone)]
struct RowMem {
    raw_hash: u64,
    norm_hash: u64,
    kind: RowKind,
    starts_ok: bool,
    calls: Calls,
    tokens: u32,
    turn: u32,
}

/// The live state of one ledger session.
pub struct State {
    meta: SessionMeta,
    /// The facts last handed to the ledger (None = never): a request only
    /// re-sends them when something other than `last_ms` changed (the
    /// ledger's `Step` keeps the activity time).
    recorded_meta: Option<SessionMeta>,
    dialect: Dialect,
    /// All rows ever recorded, index = seq − 1.
    rows: Vec<RowMem>,
    /// Seqs on the active line, in order (what the client's history maps to).
    active: Vec<u64>,
    /// Response rows not yet echoed by the client.
    pending: Vec<u64>,
    branch: u32,
    step: u32,
    turn: u32,
    /// First line of each turn's prompt, by turn.
    turn_lines: HashMap<u32, (u64, String)>,
    tideline: Tideline,
    /// The last row the rendered window left out, as last recorded in a
    /// `Cut` event (what the stub names; at most `tideline.cut_upto()`).
    recorded_cut: u64,
    needs_seed: bool,
    last_usage: Option<Usage>,
    pending_est: u64,
    override_line: Option<LineSpec>,
    learned_ceiling: Option<u64>,
    tools_fp: u64,
    /// [`RootHashes::system`] of the request that opened the conversation;
    /// 0 = unknown.
    system_fp: u64,
    /// Bytes of request JSON per real input token, learned from usage
    /// (row estimates on the request path are `bytes / bytes_per_token`).
    bytes_per_token: f64,
    /// Totals over the session's steps.
    pub totals: Usage,
    /// Last computed numbers, for the meter.
    pub meter: Meter,
}

/// What the meter shows for a session.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Meter {
    /// Gauge (tokens): the last answer's real window (input, cache read and
    /// write, output); between a request and its answer, the request's
    /// estimate.
    pub gauge: u64,
    /// The line in force.
    pub line: u64,
    /// The spec `line` was computed from at the last request (a change
    /// applies from the next one).
    #[serde(skip)]
    pub spec: Option<LineSpec>,
    /// Block size.
    pub block: u64,
    /// The model's context window, if known.
    pub context: Option<u64>,
    /// Last seq past the tideline.
    pub cut_upto: u64,
    /// Rows on the active line.
    pub active_rows: usize,
    /// Rows sent in the last window.
    pub window_rows: usize,
    /// Steps so far.
    pub steps: u32,
    /// Cuts so far.
    pub cuts: u32,
}

/// A ledger session shared between requests.
pub struct Session {
    /// Ledger id.
    pub id: String,
    /// Mutable state.
    pub state: Mutex<State>,
}

/// What the request path needs to finish a step.
pub struct Ticket {
    /// The session.
    pub session: Arc<Session>,
    /// Step number.
    pub step: u32,
    /// Dialect.
    pub dialect: Dialect,
    /// The original request body (kept for a too-long retry).
    pub original: Bytes,
    /// Rows in the window sent.
    pub window_rows: usize,
    /// Last seq before this step's new rows (the newest step is never cut).
    pub boundary: u64,
    /// Bytes of the body sent upstream (calibrates the token estimate).
    pub body_len: usize,
}

/// The body to forward and the step to finish.
pub struct Prepared {
    /// Bytes to send upstream.
    pub body: Bytes,
    /// Present for recorded (main) requests.
    pub ticket: Option<Ticket>,
}

/// The manager.
pub struct SessionManager {
    settings: Settings,
    sink: EventSink,
    index: Mutex<Index>,
    global_override: Mutex<Option<LineSpec>>,
    /// Counters.
    pub metrics: SessionMetrics,
    counter: AtomicU64,
    restorer: Option<Restorer>,
    /// Line overrides of sessions that left memory (restored with them).
    parked_overrides: Mutex<HashMap<String, LineSpec>>,
    /// The layouts of each client's latest bodies (by the client key its
    /// headers give; a few per key, since a main loop and its sub-agents
    /// share one), so the next body is split without rescanning what it
    /// shares with one of them (`dialect::splice`).
    layouts: Mutex<HashMap<String, Vec<Arc<Layout>>>>,
}

/// Client keys whose layouts are kept (the map starts over beyond it).
const MAX_LAYOUT_KEYS: usize = 4096;
/// Layouts kept per client key (most recently used first).
const LAYOUTS_PER_KEY: usize = 4;

#[derive(Default)]
struct Index {
    by_key: HashMap<String, Vec<Arc<Session>>>,
    by_id: HashMap<String, Arc<Session>>,
    /// Most recently used session id.
    latest: Option<String>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

static BPE: OnceLock<Option<tiktoken_rs::CoreBPE>> = OnceLock::new();

/// Request JSON bytes per token before any usage was seen (o200k_base on
/// typical agent traffic measures ~3).
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 3.0;

/// Exact token count of a raw message (tiktoken `o200k_base`; bytes/4 for
/// very large rows). About 5 MB/s: kept off the request path, which uses a
/// per-session calibrated byte estimate instead.
pub fn estimate_tokens(raw: &str) -> u32 {
    if raw.len() > 256 * 1024 {
        return (raw.len() / 4) as u32;
    }
    match BPE.get_or_init(|| tiktoken_rs::o200k_base().ok()) {
        Some(bpe) => bpe.encode_ordinary(raw).len() as u32,
        None => (raw.len() / 4) as u32,
    }
}

struct Parsed {
    info: dialect::MessageInfo,
    norm: u64,
}

/// Messages fully parsed so far in this process (old, unchanged history is
/// only hashed; this counter proves it in tests and benchmarks).
pub static FULL_PARSES: AtomicU64 = AtomicU64::new(0);

fn parse_msg(d: Dialect, raw: &str) -> Parsed {
    FULL_PARSES.fetch_add(1, Ordering::Relaxed);
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => Parsed {
            info: dialect::classify(d, &v),
            norm: dialect::normalized_hash(&v),
        },
        Err(_) => unparsed(raw),
    }
}

/// Hashes of a conversation's root, from one pass over its messages up to
/// the first user prompt.
struct RootHashes {
    /// The system prompt (the `system` or `instructions` field) and the
    /// messages before the first prompt: what a client's own compaction
    /// keeps.
    system: u64,
    /// That and the first prompt too: the session key of a request no header
    /// names. Chat Completions and Responses carry the system prompt as
    /// leading messages, so the first message alone would put every
    /// conversation with the same system prompt into one session.
    key: u64,
}

fn root_hashes(d: Dialect, sys: &str, msgs: &[&str]) -> RootHashes {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(sys.as_bytes());
    for m in msgs {
        let p = parse_msg(d, m);
        let before = h.digest();
        h.update(b"|");
        h.update(&p.norm.to_le_bytes());
        if p.info.kind == RowKind::Prompt {
            return RootHashes {
                system: before,
                key: h.digest(),
            };
        }
    }
    let all = h.digest();
    RootHashes {
        system: all,
        key: all,
    }
}

/// A message that is not JSON: kept verbatim, compared by bytes.
fn unparsed(raw: &str) -> Parsed {
    Parsed {
        info: dialect::MessageInfo {
            starts_ok: true,
            ..dialect::MessageInfo::default()
        },
        norm: dialect::raw_hash(raw),
    }
}

impl State {
    fn new(meta: SessionMeta, dialect: Dialect, tools_fp: u64, system_fp: u64) -> Self {
        State {
            meta,
            recorded_meta: None,
            dialect,
            rows: Vec::new(),
            active: Vec::new(),
            pending: Vec::new(),
            branch: 0,
            step: 0,
            turn: 0,
            turn_lines: HashMap::new(),
            tideline: Tideline::default(),
            recorded_cut: 0,
            needs_seed: true,
            last_usage: None,
            pending_est: 0,
            override_line: None,
            learned_ceiling: None,
            tools_fp,
            system_fp,
            bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
            totals: Usage::default(),
            meter: Meter::default(),
        }
    }

    fn row(&self, seq: u64) -> &RowMem {
        &self.rows[(seq - 1) as usize]
    }

    /// Length of the common prefix between the active line and `msgs`
    /// (read-only: compares raw hashes, then normalized hashes).
    fn lcp(&self, msgs: &[&str], hashes: &[u64]) -> usize {
        let mut p = 0;
        while p < msgs.len() && p < self.active.len() {
            let r = self.row(self.active[p]);
            if r.raw_hash != hashes[p] && parse_msg(self.dialect, msgs[p]).norm != r.norm_hash {
                break;
            }
            p += 1;
        }
        p
    }

    /// How many rows of the active line a request must share to continue
    /// this conversation: everything up to and including its first prompt
    /// (the whole line when it has none).
    fn root_len(&self) -> usize {
        self.active
            .iter()
            .position(|&seq| self.row(seq).kind == RowKind::Prompt)
            .map_or(self.active.len(), |i| i + 1)
    }

    fn next_seq(&self) -> u64 {
        self.rows.len() as u64 + 1
    }

    fn push_row(
        &mut self,
        raw: &str,
        p: Parsed,
        from_response: bool,
        events: &mut Vec<Row>,
    ) -> u64 {
        let seq = self.next_seq();
        if p.info.kind == RowKind::Prompt {
            self.turn += 1;
            if let Some(l) = &p.info.first_line {
                self.turn_lines.insert(self.turn, (seq, l.clone()));
            }
        }
        let turn = self.turn.max(1);
        let tokens = (raw.len() as f64 / self.bytes_per_token).ceil() as u32;
        self.rows.push(RowMem {
            raw_hash: dialect::raw_hash(raw),
            norm_hash: p.norm,
            kind: p.info.kind,
            starts_ok: p.info.starts_ok,
            calls: Calls::of(&p.info),
            tokens,
            turn,
        });
        events.push(Row {
            seq,
            role: p.info.role,
            kind: p.info.kind,
            raw: Arc::from(raw),
            tokens,
            turn,
            step: self.step,
            branch: self.branch,
            from_response,
        });
        seq
    }

    /// Map the client's history onto the active line: confirm echoes, record
    /// a branch when it diverges, append what is new.
    fn absorb(&mut self, msgs: &[&str], hashes: &[u64], events: &mut Vec<Event>) {
        let id = self.meta.id.clone();
        let mut p = 0;
        while p < msgs.len() && p < self.active.len() {
            let idx = (self.active[p] - 1) as usize;
            if self.rows[idx].raw_hash == hashes[p] {
                p += 1;
                continue;
            }
            let parsed = parse_msg(self.dialect, msgs[p]);
            if parsed.norm != self.rows[idx].norm_hash {
                break;
            }
            self.rows[idx].raw_hash = hashes[p];
            p += 1;
        }
        if p < self.active.len() {
            let mut hidden = self.active.split_off(p);
            // The last answer, never echoed, ends the abandoned line too.
            hidden.append(&mut self.pending);
            self.branch += 1;
            events.push(Event::Branch {
                session: id.clone(),
                at_seq: self.active.last().copied().unwrap_or(0),
                branch: self.branch,
                hidden,
            });
            self.tideline = Tideline::default();
            self.needs_seed = true;
            self.last_usage = None;
            self.pending_est = 0;
        }
        // Echoes of the last response confirm its rows, in order.
        let pending = std::mem::take(&mut self.pending);
        if p == self.active.len() {
            for seq in pending {
                let Some(m) = msgs.get(p) else { break };
                let parsed = parse_msg(self.dialect, m);
                let idx = (seq - 1) as usize;
                if parsed.info.kind != RowKind::Assistant
                    || self.rows[idx].kind != RowKind::Assistant
                {
                    break;
                }
                // Confirm even a byte-identical echo: `from_response = 0` on
                // disk is what tells a restart (`State::restore`) that the row
                // is on the active line.
                events.push(Event::Confirm {
                    session: id.clone(),
                    seq,
                    raw: Arc::from(*m),
                });
                self.rows[idx].raw_hash = hashes[p];
                self.rows[idx].norm_hash = parsed.norm;
                self.active.push(seq);
                p += 1;
            }
        }
        let mut rows = Vec::new();
        for m in &msgs[p..] {
            let parsed = parse_msg(self.dialect, m);
            let seq = self.push_row(m, parsed, false, &mut rows);
            self.pending_est += u64::from(self.row(seq).tokens);
            self.active.push(seq);
        }
        if !rows.is_empty() {
            events.push(Event::Rows { session: id, rows });
        }
    }

    /// Append every message as new (server-side conversation state): the
    /// previous response's rows are taken as confirmed.
    fn append_stateful(&mut self, msgs: &[&str], events: &mut Vec<Event>) {
        let pending = std::mem::take(&mut self.pending);
        self.active.extend(pending);
        let mut rows = Vec::new();
        for m in msgs {
            let parsed = parse_msg(self.dialect, m);
            let seq = self.push_row(m, parsed, false, &mut rows);
            self.active.push(seq);
        }
        if !rows.is_empty() {
            events.push(Event::Rows {
                session: self.meta.id.clone(),
                rows,
            });
        }
    }

    /// The active line for window planning. A window may start at a row
    /// only if the row allows it, no tool call made before it is still
    /// unanswered (parallel calls answered one by one), and the row before it
    /// does not bind to it (a reasoning item and its call).
    fn row_infos(&self) -> Vec<RowInfo> {
        let mut open: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut prev_binds = false;
        self.active
            .iter()
            .map(|&seq| {
                let r = self.row(seq);
                let starts_ok = r.starts_ok && open.is_empty() && !prev_binds;
                for c in r.calls.closes.iter() {
                    open.remove(c);
                }
                open.extend(r.calls.opens.iter().copied());
                prev_binds = r.calls.binds_next;
                RowInfo {
                    seq,
                    kind: r.kind,
                    starts_ok,
                }
            })
            .collect()
    }

    fn seed_rows(&self) -> Vec<(u64, u64)> {
        self.active
            .iter()
            .map(|&s| (s, u64::from(self.row(s).tokens)))
            .collect()
    }
}

/// What a request's conversation started with, to tell the client's own
/// fresh start (compaction, `/clear`) from a sub-agent.
#[derive(Clone, Copy)]
struct Shape {
    tools: u64,
    system: u64,
}

/// A rendered window.
struct Window {
    body: Option<Vec<u8>>,
    rows: usize,
    kept_out: u64,
    /// The last row that left the window (what its stub names; 0 = none).
    upto: u64,
}

impl SessionManager {
    /// Whether sessions are recorded and windowed (`ledger.enabled`); when
    /// not, the front relays provider requests as they are.
    pub fn enabled(&self) -> bool {
        self.settings.tideline_enabled
    }

    /// A manager writing ledger events to `sink`.
    pub fn new(settings: Settings, sink: EventSink) -> Self {
        SessionManager {
            settings,
            sink,
            index: Mutex::new(Index::default()),
            global_override: Mutex::new(None),
            metrics: SessionMetrics::default(),
            counter: AtomicU64::new(0),
            restorer: None,
            parked_overrides: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
        }
    }

    /// Read recorded sessions back from the ledger when a client key is first
    /// seen after a restart, so its next full resend continues (and heals) them.
    pub fn with_restorer(mut self, r: Restorer) -> Self {
        self.restorer = Some(r);
        self
    }

    /// Let client sessions idle for longer than `idle_ms` leave memory (all
    /// sessions of a client key together). They are read back from the
    /// ledger on their next request. Needs a restorer (a ledger on disk).
    pub fn evict_idle(&self, idle_ms: i64) -> usize {
        if self.restorer.is_none() {
            return 0;
        }
        let now = now_ms();
        let mut idx = self.index.lock();
        let idle_keys: Vec<String> = idx
            .by_key
            .iter()
            .filter(|(_, list)| {
                list.iter().all(|s| {
                    s.state
                        .try_lock()
                        .is_some_and(|st| now - st.meta.last_ms > idle_ms)
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut n = 0;
        for k in idle_keys {
            for s in idx.by_key.remove(&k).unwrap_or_default() {
                if let Some(l) = s.state.lock().override_line {
                    self.parked_overrides.lock().insert(s.id.clone(), l);
                }
                idx.by_id.remove(&s.id);
                n += 1;
            }
        }
        if idx
            .latest
            .as_ref()
            .is_some_and(|l| !idx.by_id.contains_key(l))
        {
            idx.latest = None;
        }
        n
    }

    fn restore_key(&self, idx: &mut Index, key: &str) {
        let Some(r) = &self.restorer else { return };
        let restored = r(key).unwrap_or_else(|e| {
            tracing::error!(key, error = %e, "cannot read the client's sessions back from the ledger; its next request starts a new session");
            Vec::new()
        });
        for loaded in restored {
            if idx.by_id.contains_key(&loaded.meta.id) {
                continue;
            }
            let mut st = State::restore(loaded);
            st.override_line = self.parked_overrides.lock().remove(&st.meta.id);
            let s = Arc::new(Session {
                id: st.meta.id.clone(),
                state: Mutex::new(st),
            });
            idx.by_key
                .entry(key.to_string())
                .or_default()
                .push(s.clone());
            idx.by_id.insert(s.id.clone(), s);
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Sessions known in memory, most recent last.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        self.index.lock().by_id.values().cloned().collect()
    }

    /// A session by id.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.index.lock().by_id.get(id).cloned()
    }

    /// A live session's full id from its id or a unique prefix of it (as the
    /// ledger commands accept).
    pub fn resolve(&self, id: &str) -> Option<String> {
        let idx = self.index.lock();
        if idx.by_id.contains_key(id) {
            return Some(id.to_string());
        }
        let mut found = idx.by_id.keys().filter(|k| k.starts_with(id));
        match (found.next(), found.next()) {
            (Some(k), None) => Some(k.clone()),
            _ => None,
        }
    }

    /// The most recently used session.
    pub fn latest(&self) -> Option<Arc<Session>> {
        let idx = self.index.lock();
        idx.latest
            .as_ref()
            .and_then(|id| idx.by_id.get(id).cloned())
    }

    /// The line spec in force for a session: its override, else the global
    /// override, else the configured line (`serve --tideline`, config).
    pub fn line_spec_of(&self, s: &Session) -> LineSpec {
        let own = s.state.lock().override_line;
        own.or(*self.global_override.lock())
            .unwrap_or(self.settings.line)
    }

    /// Set (or clear) the line for one session, or for all when `session` is None.
    /// Sub-agent sessions follow their parent's override.
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
                    .filter(|c| c.state.lock().meta.parent.as_deref() == Some(id))
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
    /// next window leaves out.
    pub fn cut_now(&self, id: &str) -> Result<u64, String> {
        let s = self.get(id).ok_or_else(|| format!("no session {id:?}"))?;
        let mut st = s.state.lock();
        let boundary = st.active.last().copied().unwrap_or(0);
        st.tideline
            .cut_now(boundary)
            .ok_or_else(|| "nothing to cut yet".to_string())?;
        let plan = tideline::plan_window(&st.row_infos(), st.tideline.cut_upto());
        Ok(plan.effective_upto_seq.max(st.recorded_cut))
    }

    fn new_id(&self, client: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let ms = now_ms();
        let secs = ms / 1000;
        let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
        let rem = secs.rem_euclid(86_400);
        let tag = match client {
            "claude-code" => "cc",
            "codex" => "codex",
            "openai-sdk" => "oai",
            "anthropic-sdk" => "ant",
            _ => "s",
        };
        let salt =
            xxhash_rust::xxh3::xxh3_64(format!("{ms}-{n}-{}", std::process::id()).as_bytes());
        format!(
            "{y:04}{mo:02}{d:02}-{:02}{:02}{:02}-{tag}-{:06x}",
            rem / 3600,
            (rem / 60) % 60,
            rem % 60,
            salt & 0xff_ffff
        )
    }

    fn params(
        &self,
        st: &State,
        model: &str,
        max_tokens: Option<u64>,
    ) -> (Params, tideline::LineCalc, LineSpec) {
        let limits = (self.settings.models)(model, st.learned_ceiling);
        let spec = st
            .override_line
            .or(*self.global_override.lock())
            .unwrap_or(self.settings.line);
        let calc = tideline::effective_line(spec, limits.context, limits.max_output, max_tokens);
        let block = tideline::block_tokens(self.settings.block, calc.line);
        (
            Params {
                line: calc.line,
                block,
            },
            calc,
            spec,
        )
    }

    /// Prepare a request: record it, run the tideline, render the window.
    pub fn prepare(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        ident: &Identity,
        body: Bytes,
    ) -> Prepared {
        self.prepare_with(dialect, kind, body, None, |_| ident.clone())
    }

    /// [`SessionManager::prepare`] for a request as it arrived: the body is
    /// parsed once, to tell side requests (titles) apart, to read the
    /// identity (`metadata.user_id`), and to record and window it.
    pub fn prepare_request(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        prefix: Option<&str>,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Prepared {
        // Only a key the headers (or path) give: it is known before the body
        // is read, which is what lets the body be split against the last one.
        let layout_key = crate::identity::identify(prefix, headers, None)
            .client_key
            .map(|k| format!("{}|{k}", dialect.as_str()));
        self.prepare_with(dialect, kind, body, layout_key, |parsed| {
            crate::identity::identify(prefix, headers, parsed)
        })
    }

    fn prepare_with(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        body: Bytes,
        layout_key: Option<String>,
        ident_of: impl FnOnce(Option<&ParsedBody<'_>>) -> Identity,
    ) -> Prepared {
        if kind == ReqKind::Side {
            return Prepared { body, ticket: None };
        }
        let conv_key = dialect::conv_key(dialect);
        let candidates = layout_key
            .as_ref()
            .and_then(|k| self.layouts.lock().get(k).cloned())
            .unwrap_or_default();
        let spliced = candidates.iter().enumerate().find_map(|(i, l)| {
            (l.conv_key() == conv_key)
                .then(|| splice::parse(&body, l))
                .flatten()
                .map(|(p, n)| (p, n, i))
        });
        let (mut parsed, reused, used) = match spliced {
            Some((p, n, i)) => {
                self.metrics.bodies_spliced.fetch_add(1, Ordering::Relaxed);
                (p, n, Some(i))
            }
            None => match ParsedBody::parse(&body, conv_key) {
                Ok(p) => (p, 0, None),
                Err(e) => {
                    tracing::warn!(error = %e, "request body is not a JSON object; forwarded unchanged");
                    return Prepared { body, ticket: None };
                }
            },
        };
        if crate::identity::is_side_request(dialect, &parsed) {
            return Prepared { body, ticket: None };
        }
        let ident = &ident_of(Some(&parsed));
        let synthetic: Option<String> = (dialect == Dialect::OpenaiResponses
            && parsed.messages.is_empty())
        .then(|| parsed.get_as::<String>("input"))
        .flatten()
        .map(|text| serde_json::json!({"role": "user", "content": text}).to_string());
        if let Some(m) = &synthetic {
            parsed.messages = vec![m.as_str()];
        }
        if parsed.messages.is_empty() {
            return Prepared { body, ticket: None };
        }
        let hashes: Vec<u64> = parsed
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| match used {
                Some(u) if i < reused => candidates[u].hash(i),
                _ => dialect::raw_hash(m),
            })
            .collect();
        if let Some(k) = layout_key {
            if let Some(l) = Layout::of(&body, &parsed, &hashes) {
                let mut layouts = self.layouts.lock();
                if layouts.len() >= MAX_LAYOUT_KEYS && !layouts.contains_key(&k) {
                    layouts.clear();
                }
                let list = layouts.entry(k).or_default();
                if let Some(u) = used.filter(|&u| u < list.len()) {
                    list.remove(u);
                }
                list.insert(0, Arc::new(l));
                list.truncate(LAYOUTS_PER_KEY);
            }
        }
        let model = parsed.model().unwrap_or_default();
        let max_tokens: Option<u64> = parsed
            .get_as("max_tokens")
            .or_else(|| parsed.get_as("max_output_tokens"))
            .or_else(|| parsed.get_as("max_completion_tokens"));
        let tools_fp = parsed.get("tools").map(dialect::raw_hash).unwrap_or(0);
        let sys = parsed
            .get("system")
            .or_else(|| parsed.get("instructions"))
            .unwrap_or("");
        let root = root_hashes(dialect, sys, &parsed.messages);
        let key = ident
            .client_key
            .clone()
            .unwrap_or_else(|| format!("fp:{:016x}", root.key));
        let shape = Shape {
            tools: tools_fp,
            system: root.system,
        };

        if kind == ReqKind::CountTokens {
            return self.prepare_count(dialect, &key, &parsed, &hashes, &model, max_tokens, &body);
        }

        // Responses with `previous_response_id`: the provider holds the
        // history; the input is only what is new. Record it, never window it.
        let stateful = dialect == Dialect::OpenaiResponses
            && parsed
                .get_as::<Value>("previous_response_id")
                .is_some_and(|v| !v.is_null());
        let session = self.find_or_create(
            dialect, &key, ident, &parsed, &hashes, shape, stateful, &model,
        );
        let mut events = Vec::new();
        let mut st = session.state.lock();
        st.meta.model.clone_from(&model);
        st.meta.last_ms = now_ms();
        let same = st.recorded_meta.as_ref().is_some_and(|r| {
            SessionMeta {
                last_ms: st.meta.last_ms,
                ..r.clone()
            } == st.meta
        });
        if !same {
            events.push(Event::Session(st.meta.clone()));
            st.recorded_meta = Some(st.meta.clone());
        }
        st.step += 1;
        let boundary = st.active.last().copied().unwrap_or(0);
        if stateful {
            st.append_stateful(&parsed.messages, &mut events);
        } else {
            st.absorb(&parsed.messages, &hashes, &mut events);
        }
        for ev in &events {
            match ev {
                Event::Branch { .. } => {
                    self.metrics.branches.fetch_add(1, Ordering::Relaxed);
                }
                Event::Rows { rows, .. } => {
                    self.metrics
                        .rows
                        .fetch_add(rows.len() as u64, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        let limits_model = if ident.context_1m && !model.contains("[1m]") {
            format!("{model}[1m]")
        } else {
            model.clone()
        };
        let (params, calc, spec) = self.params(&st, &limits_model, max_tokens);
        if calc.clamped && st.meter.line != calc.line {
            tracing::info!(session = %st.meta.id, line = calc.line, "tideline clamped to the model's context minus the output allowance");
        }
        // A conversation held by the provider (`previous_response_id`) is
        // never windowed; a string input is one message, recorded but not cut.
        // The gauge before this request's cut, if it made one.
        let mut cut_gauge = None;
        if self.settings.tideline_enabled && !stateful {
            let last_seq = st.active.last().copied().unwrap_or(0);
            let cut_before = st.tideline.cut_upto();
            // A restored session knows its last real usage; otherwise the row
            // estimates are all there is (seeding).
            let measured = st.last_usage.map(|u| u.window_total() + st.pending_est);
            let obs = Observation {
                gauge: measured.unwrap_or(0),
                added: st.pending_est,
                boundary_seq: boundary,
                last_seq,
            };
            let decision = if st.needs_seed || measured.is_none() {
                st.needs_seed = false;
                let rows = st.seed_rows();
                st.tideline.seed(&rows, obs, params)
            } else {
                st.tideline.observe(obs, params)
            };
            st.meter.gauge = decision.gauge;
            if let Some(cut) = decision.cut.filter(|c| c.upto_seq > cut_before) {
                cut_gauge = Some(cut.gauge_before);
            }
        }
        st.meter.line = params.line;
        st.meter.spec = Some(spec);
        st.meter.block = params.block;
        st.meter.context = calc.context;
        st.meter.steps = st.step;
        st.meter.active_rows = st.active.len();
        let window = if self.settings.tideline_enabled && !stateful && synthetic.is_none() {
            self.render(&st, &parsed)
        } else {
            Window {
                body: None,
                rows: parsed.messages.len(),
                kept_out: 0,
                upto: 0,
            }
        };
        // A cut is recorded when the window it renders leaves out more rows:
        // by this request's tideline, or by an earlier `tideline now`.
        if window.upto > st.recorded_cut {
            let gauge = cut_gauge.unwrap_or(st.meter.gauge);
            events.push(self.record_cut(&mut st, window.upto, gauge, params.line));
        }
        st.meter.window_rows = window.rows;
        let step = st.step;
        drop(st);
        (self.sink)(events);
        self.metrics
            .tokens_kept_out
            .fetch_add(window.kept_out, Ordering::Relaxed);
        let out = match window.body {
            Some(b) => {
                self.metrics.rewritten.fetch_add(1, Ordering::Relaxed);
                Bytes::from(b)
            }
            None => body.clone(),
        };
        let body_len = out.len();
        Prepared {
            body: out,
            ticket: Some(Ticket {
                session,
                step,
                dialect,
                original: body,
                window_rows: window.rows,
                boundary,
                body_len,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_count(
        &self,
        dialect: Dialect,
        key: &str,
        parsed: &ParsedBody<'_>,
        hashes: &[u64],
        _model: &str,
        _max_tokens: Option<u64>,
        body: &Bytes,
    ) -> Prepared {
        let cands = self
            .index
            .lock()
            .by_key
            .get(key)
            .cloned()
            .unwrap_or_default();
        for s in cands {
            let st = s.state.lock();
            if st.dialect != dialect || parsed.messages.len() < 2 {
                continue;
            }
            // The count may carry new messages after the recorded ones.
            if !st.active.is_empty() && st.lcp(&parsed.messages, hashes) == st.active.len() {
                let w = self.render(&st, parsed);
                if let Some(b) = w.body {
                    return Prepared {
                        body: Bytes::from(b),
                        ticket: None,
                    };
                }
            }
        }
        Prepared {
            body: body.clone(),
            ticket: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn find_or_create(
        &self,
        dialect: Dialect,
        key: &str,
        ident: &Identity,
        parsed: &ParsedBody<'_>,
        hashes: &[u64],
        shape: Shape,
        stateful: bool,
        model: &str,
    ) -> Arc<Session> {
        let mut idx = self.index.lock();
        if !idx.by_key.contains_key(key) {
            self.restore_key(&mut idx, key);
        }
        let cands = idx.by_key.get(key).cloned().unwrap_or_default();
        // A request continues (or rewinds) the session it shares the longest
        // prefix with, but only if that prefix reaches the session's root
        // (its first user prompt): a request with another first prompt is
        // another conversation — a sub-agent, or the client's own fresh start
        // — and becomes a new session linked to the first one, never a branch
        // hiding the root.
        let mut best: Option<(usize, Arc<Session>)> = None;
        for s in cands.iter().filter(|_| !stateful) {
            let st = s.state.lock();
            if st.dialect != dialect {
                continue;
            }
            let p = st.lcp(&parsed.messages, hashes);
            if p > 0 && p >= st.root_len() && best.as_ref().is_none_or(|(bp, _)| p > *bp) {
                best = Some((p, s.clone()));
            }
        }
        let chosen = if stateful {
            // Only what is new is sent: it continues the client's latest
            // conversation of this dialect (the one with the same tools first).
            cands
                .iter()
                .filter_map(|s| {
                    let st = s.state.lock();
                    (st.dialect == dialect)
                        .then(|| ((st.tools_fp == shape.tools, st.meta.last_ms), s.clone()))
                })
                .max_by_key(|(k, _)| *k)
                .map(|(_, s)| s)
        } else {
            best.map(|(_, s)| s).or_else(|| {
                // Nothing shared up to a root, but the system prompt and the
                // tools the conversation started with: the client compacted
                // or cleared its own conversation — a branch at 0 of it
                // (spec §2). A sub-agent comes with its own system prompt.
                cands
                    .iter()
                    .filter_map(|s| {
                        let st = s.state.lock();
                        (st.dialect == dialect
                            && st.system_fp != 0
                            && st.system_fp == shape.system
                            && st.tools_fp == shape.tools)
                            .then(|| (st.meta.last_ms, s.clone()))
                    })
                    .max_by_key(|(last, _)| *last)
                    .map(|(_, s)| s)
            })
        };
        let session = match chosen {
            Some(s) => s,
            None => {
                let id = self.new_id(ident.client);
                let parent = cands.first().map(|p| p.id.clone());
                let inherited = cands.first().and_then(|p| p.state.lock().override_line);
                let now = now_ms();
                let meta = SessionMeta {
                    id: id.clone(),
                    client: ident.client.to_string(),
                    client_session: Some(key.to_string()),
                    dialect,
                    model: model.to_string(),
                    parent,
                    created_ms: now,
                    last_ms: now,
                };
                let mut st = State::new(meta, dialect, shape.tools, shape.system);
                st.override_line = inherited;
                let s = Arc::new(Session {
                    id: id.clone(),
                    state: Mutex::new(st),
                });
                idx.by_key
                    .entry(key.to_string())
                    .or_default()
                    .push(s.clone());
                idx.by_id.insert(id, s.clone());
                s
            }
        };
        idx.latest = Some(session.id.clone());
        session
    }

    /// Render the window for the session's current cut (None = unchanged).
    fn render(&self, st: &State, parsed: &ParsedBody<'_>) -> Window {
        let n = parsed.messages.len();
        let cut_upto = st.tideline.cut_upto();
        // Messages past the active line (a count_tokens request's new tail)
        // are retained as they are.
        if cut_upto == 0 || st.active.len() > n {
            return Window {
                body: None,
                rows: n,
                kept_out: 0,
                upto: 0,
            };
        }
        let infos = st.row_infos();
        let plan = tideline::plan_window(&infos, cut_upto);
        if plan.start == 0 || plan.effective_upto_seq == 0 {
            return Window {
                body: None,
                rows: n,
                kept_out: 0,
                upto: 0,
            };
        }
        let dir =
            oceancode_ledger::paths::DataDir::new(&self.settings.data_dir).session_dir(&st.meta.id);
        let mut lines = Vec::new();
        let mut turns: Vec<&(u64, String)> = st
            .turn_lines
            .values()
            .filter(|(seq, _)| {
                *seq <= plan.effective_upto_seq
                    && plan.pinned_prompt.map(|i| st.active[i]) != Some(*seq)
            })
            .collect();
        turns.sort();
        for (seq, line) in turns {
            lines.push((st.row(*seq).turn, line.as_str()));
        }
        let stub = tideline::stub_text(plan.effective_upto_seq, &dir.display().to_string(), &lines);
        let stub_msg = dialect::stub_message(st.dialect, &stub);
        let mut parts: Vec<&str> = Vec::with_capacity(n - plan.start + 4);
        let mut kept_out = 0u64;
        let kept: Vec<&str> = (0..plan.start)
            .filter(|&i| Some(i) != plan.pinned_prompt)
            .filter_map(|i| {
                let r = st.row(st.active[i]);
                if matches!(r.kind, RowKind::System | RowKind::Other) {
                    Some(parsed.messages[i])
                } else {
                    kept_out += u64::from(r.tokens);
                    None
                }
            })
            .collect();
        if st.dialect == Dialect::Anthropic {
            parts.push(&stub_msg);
            parts.extend(kept);
        } else {
            parts.extend(kept);
            parts.push(&stub_msg);
        }
        if let Some(i) = plan.pinned_prompt {
            parts.push(parsed.messages[i]);
        }
        parts.extend(parsed.messages[plan.start..].iter().copied());
        let rows = parts.len();
        Window {
            body: Some(parsed.render_with(&parts)),
            rows,
            kept_out,
            upto: plan.effective_upto_seq,
        }
    }

    /// The `Cut` event for a window that now leaves out every row up to
    /// `upto` (counted in the meter and the metrics).
    fn record_cut(&self, st: &mut State, upto: u64, gauge: u64, line: u64) -> Event {
        self.metrics.cuts.fetch_add(1, Ordering::Relaxed);
        st.meter.cuts += 1;
        st.recorded_cut = upto;
        st.meter.cut_upto = upto;
        Event::Cut {
            session: st.meta.id.clone(),
            upto_seq: upto,
            gauge,
            line,
            ts_ms: now_ms(),
        }
    }

    /// A "prompt is too long" answer: learn the ceiling, cut every closed
    /// block, and return the body for the single retry (None = nothing to cut).
    pub fn too_long(&self, ticket: &Ticket, ceiling: Option<u64>) -> Option<Bytes> {
        let parsed = ParsedBody::parse(&ticket.original, dialect::conv_key(ticket.dialect)).ok()?;
        let mut st = ticket.session.state.lock();
        if let Some(c) = ceiling {
            st.learned_ceiling = Some(c);
        }
        let before = st.tideline.cut_upto();
        let upto = st.tideline.cut_all_closed(ticket.boundary)?.upto_seq;
        if upto <= before {
            return None;
        }
        let w = self.render(&st, &parsed);
        self.metrics
            .too_long_retries
            .fetch_add(1, Ordering::Relaxed);
        let mut events = Vec::new();
        if w.upto > st.recorded_cut {
            let (gauge, line) = (st.meter.gauge, st.meter.line);
            events.push(self.record_cut(&mut st, w.upto, gauge, line));
        }
        drop(st);
        (self.sink)(events);
        w.body.map(Bytes::from)
    }

    /// A step ended: record the response rows and the real usage.
    pub fn complete(&self, ticket: &Ticket, status: u16, ok: bool, collected: &dialect::Collected) {
        let mut st = ticket.session.state.lock();
        let mut events = Vec::new();
        let success = ok && (200..300).contains(&status);
        if success {
            if let Some(u) = collected.usage {
                let input = u.input_total();
                if input > 0 && ticket.body_len > 0 {
                    let measured = (ticket.body_len as f64 / input as f64).clamp(1.0, 16.0);
                    st.bytes_per_token = 0.5 * st.bytes_per_token + 0.5 * measured;
                }
                st.last_usage = Some(u);
                st.pending_est = 0;
                // The meter follows the real window once the answer tells it
                // (after a forced cut the request's estimate was the old one).
                st.meter.gauge = u.window_total();
                st.totals.input += u.input;
                st.totals.output += u.output;
                st.totals.cache_read += u.cache_read;
                st.totals.cache_write += u.cache_write;
            }
            let mut rows = Vec::new();
            let mut pending = Vec::new();
            for raw in &collected.rows {
                let parsed = parse_msg(st.dialect, raw);
                pending.push(st.push_row(raw, parsed, true, &mut rows));
            }
            st.pending = pending;
            if !rows.is_empty() {
                self.metrics
                    .rows
                    .fetch_add(rows.len() as u64, Ordering::Relaxed);
                events.push(Event::Rows {
                    session: st.meta.id.clone(),
                    rows,
                });
            }
        }
        events.push(Event::Step {
            session: st.meta.id.clone(),
            step: ticket.step,
            model: collected
                .model
                .clone()
                .unwrap_or_else(|| st.meta.model.clone()),
            status,
            usage: collected.usage.unwrap_or_default(),
            window_rows: ticket.window_rows as u32,
            ts_ms: now_ms(),
            error: None,
        });
        drop(st);
        (self.sink)(events);
    }
}

impl State {
    /// Rebuild the live state of a recorded session (parses every row once).
    fn restore(l: LoadedSession) -> Self {
        let dialect = l.meta.dialect;
        let mut st = State::new(l.meta, dialect, 0, 0);
        st.recorded_meta = Some(st.meta.clone());
        st.branch = l.branch;
        st.step = l.steps;
        let hidden: std::collections::HashSet<u64> = l.hidden.into_iter().collect();
        for r in &l.rows {
            let p = parse_msg(dialect, &r.raw);
            if p.info.kind == RowKind::Prompt {
                if let Some(line) = &p.info.first_line {
                    st.turn_lines.insert(r.turn, (r.seq, line.clone()));
                }
            }
            st.turn = st.turn.max(r.turn);
            st.rows.push(RowMem {
                raw_hash: dialect::raw_hash(&r.raw),
                norm_hash: p.norm,
                kind: r.kind,
                starts_ok: p.info.starts_ok,
                calls: Calls::of(&p.info),
                tokens: r.tokens,
                turn: r.turn,
            });
            if !hidden.contains(&r.seq) {
                if r.from_response {
                    st.pending.push(r.seq);
                } else {
                    st.pending.clear();
                    st.active.push(r.seq);
                }
            }
        }
        // A restored ledger may miss rows the crash lost: seq numbering must
        // continue from what is on disk, which `rows.len()` does only if the
        // rows are gap-free (the store guarantees an in-order prefix).
        st.last_usage = l.last_usage;
        st.tideline = Tideline::resume(l.cut_upto);
        st.recorded_cut = l.cut_upto;
        st.meter.cut_upto = l.cut_upto;
        st.needs_seed = true;
        st
    }

    /// Session facts.
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }

    /// The line override, if any.
    pub fn override_line(&self) -> Option<LineSpec> {
        self.override_line
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// How a line spec reads to a person: `40%`, `20k`, `ceiling`.
pub fn line_label(spec: LineSpec) -> String {
    match spec {
        LineSpec::Percent(p) => format!("{p}%"),
        LineSpec::Tokens(0) => "ceiling".to_string(),
        LineSpec::Tokens(t) => oceancode_ledger::status::tokens(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_covers_the_system_and_the_first_user_prompt() {
        let sys = r#"{"role":"system","content":"You are helpful."}"#;
        let apples = r#"{"role":"user","content":"apples"}"#;
        let rockets = r#"{"role":"user","content":"rockets"}"#;
        let answer = r#"{"role":"assistant","content":"sure"}"#;
        let more = r#"{"role":"user","content":"more"}"#;
        let fingerprint = |d: Dialect, s: &str, m: &[&str]| root_hashes(d, s, m).key;
        let chat = |m: &[&str]| fingerprint(Dialect::OpenaiChat, "", m);
        assert_ne!(chat(&[sys, apples]), chat(&[sys, rockets]));
        assert_eq!(
            chat(&[sys, apples]),
            chat(&[sys, apples, answer, more]),
            "later turns keep the key"
        );
        let other_sys = r#"{"role":"system","content":"You are terse."}"#;
        assert_ne!(chat(&[sys, apples]), chat(&[other_sys, apples]));
        // Anthropic: the system field, and string ≡ one text block.
        let block = r#"{"role":"user","content":[{"type":"text","text":"apples","cache_control":{"type":"ephemeral"}}]}"#;
        let ant = |s: &str, m: &[&str]| fingerprint(Dialect::Anthropic, s, m);
        assert_eq!(ant("\"S\"", &[apples]), ant("\"S\"", &[block, answer]));
        assert_ne!(ant("\"S\"", &[apples]), ant("\"T\"", &[apples]));
        assert_ne!(ant("\"S\"", &[apples]), ant("\"S\"", &[rockets]));
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
    }
}
