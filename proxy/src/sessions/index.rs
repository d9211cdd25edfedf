//! The index of live sessions (by client key and by id), the matching of a
//! request onto one of its key's sessions, siblings (another conversation
//! with the same opening), restoring a key's sessions from the ledger, and
//! idle eviction.

use super::prepare::Request;
use super::state::State;
use super::{Session, SessionManager};
use oceancode_window::SessionMeta;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Live sessions.
#[derive(Default)]
pub(super) struct Index {
    pub(super) by_key: HashMap<String, Vec<Arc<Session>>>,
    pub(super) by_id: HashMap<String, Arc<Session>>,
    /// Most recently used session id.
    pub(super) latest: Option<String>,
}

impl Index {
    /// Add a session under `key`.
    fn insert(&mut self, key: &str, s: Arc<Session>) {
        self.by_key
            .entry(key.to_string())
            .or_default()
            .push(s.clone());
        self.by_id.insert(s.id.clone(), s);
    }

    /// Take `s` out again when nothing of it was recorded or is under way
    /// (the request that created it was rolled back, [`super::hold`]).
    pub(super) fn forget_unrecorded(&mut self, s: &Arc<Session>) {
        let st = s.state.lock();
        if !st.unrecorded() {
            return;
        }
        if let Some(key) = st.meta.client_session.as_deref() {
            if let Some(list) = self.by_key.get_mut(key) {
                list.retain(|x| !Arc::ptr_eq(x, s));
                if list.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        if self.by_id.get(&s.id).is_some_and(|x| Arc::ptr_eq(x, s)) {
            self.by_id.remove(&s.id);
        }
        if self.latest.as_deref() == Some(s.id.as_str()) {
            self.latest = None;
        }
    }
}

impl SessionManager {
    /// Let client sessions idle for longer than `idle_ms` leave memory (all
    /// sessions of a client key together). They are read back from the
    /// ledger on their next request. Needs a restorer (a ledger on disk).
    pub fn evict_idle(&self, idle_ms: i64) -> usize {
        self.evict_idle_ids(idle_ms).len()
    }

    /// [`SessionManager::evict_idle`], returning the ids that left memory.
    pub fn evict_idle_ids(&self, idle_ms: i64) -> Vec<String> {
        if self.restorer.is_none() {
            return Vec::new();
        }
        let now = self.now_ms();
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
        let mut gone = Vec::new();
        for k in idle_keys {
            for s in idx.by_key.remove(&k).unwrap_or_default() {
                let line = s.state.lock().override_line;
                self.parked_overrides.lock().insert(s.id.clone(), line);
                idx.by_id.remove(&s.id);
                gone.push(s.id.clone());
            }
        }
        if idx
            .latest
            .as_ref()
            .is_some_and(|l| !idx.by_id.contains_key(l))
        {
            idx.latest = None;
        }
        gone
    }

    /// Read a client key's recorded sessions back (SQLite, and a wait for
    /// the writer to drain): called with no lock held. A failure is logged
    /// and the request goes on as the key's first.
    fn load_key(&self, key: &str) -> Vec<State> {
        let Some(r) = &self.restorer else {
            return Vec::new();
        };
        match r(key) {
            Ok(loaded) => loaded
                .into_iter()
                .map(|l| {
                    let mut st = State::restore(l);
                    super::context::resume(&self.settings.data_dir, &mut st);
                    st
                })
                .collect(),
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot read the client's recorded sessions back; its request starts a new session");
                Vec::new()
            }
        }
    }

    /// Put restored sessions into the index under `key` (none already live).
    fn adopt(&self, idx: &mut Index, key: &str, restored: Vec<State>) {
        for mut st in restored {
            if idx.by_id.contains_key(&st.meta.id) {
                continue;
            }
            // An override set (or cleared) while it was live wins over the
            // recorded one (a request records it; none may have since).
            if let Some(line) = self.parked_overrides.lock().remove(&st.meta.id) {
                st.override_line = line;
            }
            let s = Arc::new(Session {
                id: st.meta.id.clone(),
                state: Mutex::new(st),
            });
            idx.insert(key, s);
        }
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

    /// The live sessions of a client key (none when the key is not in memory).
    pub(super) fn candidates(&self, key: &str) -> Vec<Arc<Session>> {
        self.index
            .lock()
            .by_key
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// The session a request continues, or a new one (true).
    pub(super) fn find_or_create(&self, req: &Request<'_>) -> (Arc<Session>, bool) {
        let mut idx = self.index.lock();
        if self.restorer.is_some() && !idx.by_key.contains_key(&req.key) {
            // The key's first request since a start or an eviction: read its
            // sessions back without holding the index (other clients go on),
            // then look again — a concurrent request may have been first.
            drop(idx);
            let restored = self.load_key(&req.key);
            idx = self.index.lock();
            if !idx.by_key.contains_key(&req.key) {
                self.adopt(&mut idx, &req.key, restored);
            }
        }
        let cands = idx.by_key.get(&req.key).cloned().unwrap_or_default();
        let (session, created) = match choose(&cands, req) {
            Some(s) => (s, false),
            None => {
                let s = self.create(&cands, req);
                idx.insert(&req.key, s.clone());
                (s, true)
            }
        };
        idx.latest = Some(session.id.clone());
        (session, created)
    }

    /// A new session for `req` (linked to the key's first one, whose line
    /// override it inherits).
    fn create(&self, cands: &[Arc<Session>], req: &Request<'_>) -> Arc<Session> {
        self.new_session(req, cands.first(), None)
    }

    /// A sibling of `parent` for `req`, which left the parent's live line
    /// after its row `at`: another conversation with the same opening, its
    /// own session (rows, tideline, cut), linked to the parent at `at`.
    pub(super) fn sibling(
        &self,
        parent: &Arc<Session>,
        req: &Request<'_>,
        at: u64,
    ) -> Arc<Session> {
        let s = self.new_session(req, Some(parent), Some(at));
        self.metrics.siblings.fetch_add(1, Ordering::Relaxed);
        let mut idx = self.index.lock();
        idx.insert(&req.key, s.clone());
        idx.latest = Some(s.id.clone());
        s
    }

    /// A new session for `req`, linked to `parent` (whose line override it
    /// inherits) after its row `at` for a sibling.
    fn new_session(
        &self,
        req: &Request<'_>,
        parent: Option<&Arc<Session>>,
        at: Option<u64>,
    ) -> Arc<Session> {
        let id = self.new_id(req.ident.client);
        let inherited = parent.and_then(|p| p.state.lock().override_line);
        let now = self.now_ms();
        tracing::info!(
            session = %id,
            client = %req.ident.client,
            name = %oceancode_ledger::resolve::given_name(&req.key).unwrap_or("-"),
            parent = %parent.map_or("-", |p| p.id.as_str()),
            "new session"
        );
        let meta = SessionMeta {
            id: id.clone(),
            client: req.ident.client.to_string(),
            client_session: Some(req.key.clone()),
            dialect: req.dialect,
            model: req.model.clone(),
            parent: parent.map(|p| p.id.clone()),
            parent_seq: at,
            created_ms: now,
            last_ms: now,
        };
        let mut st = State::new(meta, req.dialect, req.shape.tools, req.shape.system);
        st.override_line = inherited;
        Arc::new(Session {
            id,
            state: Mutex::new(st),
        })
    }

    fn new_id(&self, client: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let ms = self.now_ms();
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
            "{}-{tag}-{:06x}",
            oceancode_ledger::time::id_stamp(ms),
            salt & 0xff_ffff
        )
    }
}

/// Which of a key's sessions a request continues, if any.
///
/// A request continues (or rewinds) the session it shares the longest prefix
/// with — its active line, then the unechoed answer the request continues
/// with there — the oldest on a tie, but only if that prefix reaches the
/// session's root (its first user prompt): a request with another first
/// prompt is another conversation — a sub-agent, or the client's own fresh
/// start — and becomes a new session linked to the first one, never a
/// branch hiding the root. (Whether a request that leaves the chosen line
/// is a rewind or a sibling is decided under the session's lock, by
/// `SessionManager::prepare`.)
fn choose(cands: &[Arc<Session>], req: &Request<'_>) -> Option<Arc<Session>> {
    let (dialect, shape) = (req.dialect, req.shape);
    if req.stateful {
        // Only what is new is sent: it continues the client's latest
        // conversation of this dialect (the one with the same tools first).
        return cands
            .iter()
            .filter_map(|s| {
                let st = s.state.lock();
                (st.dialect == dialect)
                    .then(|| ((st.tools_fp == shape.tools, st.meta.last_ms), s.clone()))
            })
            .max_by_key(|(k, _)| *k)
            .map(|(_, s)| s);
    }
    let mut best: Option<(usize, Arc<Session>)> = None;
    for s in cands {
        let st = s.state.lock();
        if st.dialect != dialect {
            continue;
        }
        let reach = st.reach(req.messages, &req.hashes);
        let p = reach.len();
        if reach.shared > 0
            && reach.shared >= st.root_len()
            && best.as_ref().is_none_or(|(bp, _)| p > *bp)
        {
            best = Some((p, s.clone()));
        }
    }
    best.map(|(_, s)| s).or_else(|| {
        // Nothing shared up to a root, but the system prompt and the tools
        // the conversation started with: the client compacted or cleared its
        // own conversation — a branch at 0 of it (spec §2). A sub-agent comes
        // with its own system prompt.
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
}
