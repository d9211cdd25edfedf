//! What travels from the handles to the writer thread (events, barriers,
//! jobs), and the state both sides share: the pending events, counted in
//! events and bytes against the queue's budget; the sessions *behind*; the
//! faults health reports; the counters.
//!
//! The channel itself is unbounded: [`Shared::admit`] is the bound. An event
//! that does not fit (or whose session is already behind) is dropped at once
//! and its session marked behind from that event on, so a submitter never
//! waits and the writer's backlog never grows past the budget.
//!
//! Steps and session facts are never shed that way ([`lossless`]): rows heal
//! from the client's resend, but a step's usage and spend exist nowhere
//! else. One that does not fit the queue goes to the step lane, a budget of
//! its own ([`LANE_EVENTS`] events), in the same channel so the order holds;
//! and they are kept while their session is behind. Only a full lane sheds
//! them (one WARN line).

use super::common::now_ms;
use super::records::{Behind, BehindReason};
use crate::model::Event;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Instant;
use tokio::sync::oneshot;
use tracing::warn;

/// Most events of the step lane (steps and session facts queued beyond the
/// queue's own budget): a few hundred bytes each.
pub(super) const LANE_EVENTS: usize = 65_536;
/// Most bytes of events in the step lane.
pub(super) const LANE_BYTES: usize = 64 << 20;

/// Whether `ev` is kept while the queue sheds and while its session is
/// behind: a step (its usage and spend are recorded nowhere else) or a
/// session's facts (a step of an unknown session would be refused).
pub(super) fn lossless(ev: &Event) -> bool {
    matches!(ev, Event::Session(_) | Event::Step { .. })
}

/// Approximate bytes an event holds while queued.
pub(super) fn event_bytes(ev: &Event) -> usize {
    const BASE: usize = 128;
    BASE + match ev {
        Event::Session(m) => {
            m.id.len()
                + m.client.len()
                + m.model.len()
                + m.client_session.as_ref().map_or(0, String::len)
        }
        Event::Rows { rows, .. } => rows.iter().map(|r| 96 + r.role.len() + r.raw.len()).sum(),
        Event::Confirm { raw, .. } => raw.len(),
        Event::Branch { hidden, .. } => hidden.len() * 8,
        Event::Hide { seqs, .. } => seqs.len() * 8,
        Event::Step { model, error, .. } => model.len() + error.as_ref().map_or(0, String::len),
        Event::Cut { .. } => 0,
        Event::Line {
            spec, overridden, ..
        } => spec.len() + overridden.as_ref().map_or(0, String::len),
        Event::ContextEdit { set, seqs, .. } => set.len() + seqs.len() * 8,
    }
}

#[derive(Default)]
struct Pending {
    by_id: BTreeMap<u64, Queued>,
    by_session: HashMap<String, u32>,
    /// Queued `Session` events by client key (what the restorer waits for).
    by_key: HashMap<String, u32>,
    /// Events and bytes queued within the queue's budget.
    count: usize,
    bytes: usize,
    /// Events and bytes queued in the step lane.
    lane_count: usize,
    lane_bytes: usize,
}

struct Queued {
    at: Instant,
    bytes: usize,
    session: String,
    key: Option<String>,
    /// In the step lane (counted against its budget).
    lane: bool,
}

fn dec(map: &mut HashMap<String, u32>, k: &str) {
    if let Some(n) = map.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            map.remove(k);
        }
    }
}

struct BehindEntry {
    /// Events of the session with this id or a later one are dropped.
    from_id: u64,
    since_ms: i64,
    reason: BehindReason,
    dropped: u64,
}

/// A fault in progress (commits or file writes failing).
pub(super) struct Fault {
    pub(super) since: Instant,
    pub(super) error: String,
    pub(super) retries: u64,
}

/// The faults in progress.
#[derive(Default)]
pub(super) struct Faults {
    /// Commits fail and are retried.
    pub(super) commit: Option<Fault>,
    /// File writes of some sessions fail; they are written again once they
    /// succeed.
    pub(super) files: Option<Fault>,
    /// Sessions whose files wait to be written again.
    pub(super) files_sessions: usize,
}

/// What [`Shared::admit`] decided.
pub(super) enum Admit {
    /// Queue it under this id.
    Queue { id: u64, at: Instant },
    /// Dropped (its session is behind).
    Dropped,
    /// It does not fit and is to be handed back (`try_submit`).
    Full,
}

/// Counters and pending events, shared by the handles and the writer.
pub(super) struct Shared {
    next_id: AtomicU64,
    /// Most events queued.
    capacity: usize,
    /// Most bytes of events queued.
    budget: usize,
    pending: Mutex<Pending>,
    behind: Mutex<HashMap<String, BehindEntry>>,
    behind_count: AtomicUsize,
    pub(super) faults: Mutex<Faults>,
    /// A shed episode is under way (its WARN line was written).
    shedding: AtomicBool,
    /// The step lane shed an event in this episode (its WARN line was written).
    lane_full: AtomicBool,
    /// Set by shutdown: the writer gives up retrying after a grace period.
    pub(super) stopping: AtomicBool,
    /// Bumped when the writer reopens the database: pooled readers of the
    /// old file are dropped.
    pub(super) generation: AtomicU64,
    pub(super) lags_us: Mutex<VecDeque<u64>>,
    pub(super) events: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) commits_failed: AtomicU64,
    pub(super) commit_retries: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) shed: AtomicU64,
    pub(super) transcript_errors: AtomicU64,
    pub(super) files_healed: AtomicU64,
    pub(super) pages_written: AtomicU64,
    pub(super) sessions_removed: AtomicU64,
    pub(super) reopens: AtomicU64,
}

impl Shared {
    pub(super) fn new(capacity: usize, budget: usize) -> Shared {
        Shared {
            next_id: AtomicU64::new(0),
            capacity: capacity.max(1),
            budget: budget.max(1),
            pending: Mutex::new(Pending::default()),
            behind: Mutex::new(HashMap::new()),
            behind_count: AtomicUsize::new(0),
            faults: Mutex::new(Faults::default()),
            shedding: AtomicBool::new(false),
            lane_full: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            lags_us: Mutex::new(VecDeque::new()),
            events: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            commits_failed: AtomicU64::new(0),
            commit_retries: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            transcript_errors: AtomicU64::new(0),
            files_healed: AtomicU64::new(0),
            pages_written: AtomicU64::new(0),
            sessions_removed: AtomicU64::new(0),
            reopens: AtomicU64::new(0),
        }
    }

    /// Decide what becomes of a submitted event: never waits. `shed` =
    /// a full queue drops the event and marks its session behind (else the
    /// event is handed back).
    pub(super) fn admit(&self, ev: &Event, shed: bool) -> Admit {
        let session = ev.session();
        let lossless = lossless(ev);
        if !lossless
            && self.behind_count.load(Ordering::Acquire) > 0
            && self.drops(session, u64::MAX)
        {
            self.shed.fetch_add(1, Ordering::Relaxed);
            return Admit::Dropped;
        }
        let bytes = event_bytes(ev);
        let mut p = self.pending.lock();
        let full = p.count >= self.capacity || p.bytes + bytes > self.budget;
        let lane = full
            && shed
            && lossless
            && p.lane_count < LANE_EVENTS
            && p.lane_bytes + bytes <= LANE_BYTES;
        if full && !lane {
            let (n, b) = (p.count, p.bytes);
            drop(p);
            if !shed {
                return Admit::Full;
            }
            if lossless && !self.lane_full.swap(true, Ordering::AcqRel) {
                warn!(
                    session,
                    "ledger step lane full ({LANE_EVENTS} events): a step or session fact is shed"
                );
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            self.shed.fetch_add(1, Ordering::Relaxed);
            if !self.shedding.swap(true, Ordering::AcqRel) {
                warn!(
                    queued = n,
                    queued_bytes = b,
                    "ledger write queue full (writer.queue_capacity {} / writer.queue_bytes {}): events are shed and their sessions fall behind; each heals from its client's next full resend",
                    self.capacity,
                    self.budget
                );
            }
            self.mark_behind(session, id, BehindReason::Shed);
            return Admit::Dropped;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let at = Instant::now();
        if lane {
            p.lane_count += 1;
            p.lane_bytes += bytes;
        } else {
            p.count += 1;
            p.bytes += bytes;
        }
        *p.by_session.entry(session.to_string()).or_default() += 1;
        let key = match ev {
            Event::Session(m) => m.client_session.clone(),
            _ => None,
        };
        if let Some(k) = &key {
            *p.by_key.entry(k.clone()).or_default() += 1;
        }
        p.by_id.insert(
            id,
            Queued {
                at,
                bytes,
                session: session.to_string(),
                key,
                lane,
            },
        );
        Admit::Queue { id, at }
    }

    /// The events `ids` left the queue (committed, refused, dropped or lost).
    pub(super) fn forget(&self, ids: impl Iterator<Item = u64>) {
        let mut p = self.pending.lock();
        for id in ids {
            let Some(q) = p.by_id.remove(&id) else {
                continue;
            };
            if q.lane {
                p.lane_count = p.lane_count.saturating_sub(1);
                p.lane_bytes = p.lane_bytes.saturating_sub(q.bytes);
            } else {
                p.count = p.count.saturating_sub(1);
                p.bytes = p.bytes.saturating_sub(q.bytes);
            }
            dec(&mut p.by_session, &q.session);
            if let Some(k) = &q.key {
                dec(&mut p.by_key, k);
            }
        }
        if p.by_id.is_empty() {
            self.lane_full.store(false, Ordering::Release);
        }
        if p.by_id.is_empty() && self.shedding.swap(false, Ordering::AcqRel) {
            drop(p);
            tracing::info!(
                behind = self.behind_count(),
                "ledger write queue drained: no more events are shed"
            );
        }
    }

    /// (events queued, their bytes, age of the oldest in ms).
    pub(super) fn queue_state(&self) -> (u64, u64, u64) {
        let p = self.pending.lock();
        let lag = p
            .by_id
            .values()
            .next()
            .map_or(0, |q| q.at.elapsed().as_millis() as u64);
        (p.by_id.len() as u64, (p.bytes + p.lane_bytes) as u64, lag)
    }

    /// Events of `session` still queued.
    pub(super) fn queued_of(&self, session: &str) -> u32 {
        self.pending
            .lock()
            .by_session
            .get(session)
            .copied()
            .unwrap_or(0)
    }

    /// Whether anything of client key `key` or of `sessions` is queued.
    pub(super) fn queued_for(&self, key: &str, sessions: &[String]) -> bool {
        let p = self.pending.lock();
        p.by_key.contains_key(key) || sessions.iter().any(|s| p.by_session.contains_key(s))
    }

    /// Whether a shed episode is under way.
    pub(super) fn shedding(&self) -> bool {
        self.shedding.load(Ordering::Acquire)
    }

    /// Mark `session` behind from event `from_id` on (kept if it already is).
    /// Returns whether it was not behind before.
    pub(super) fn mark_behind(&self, session: &str, from_id: u64, reason: BehindReason) -> bool {
        let mut b = self.behind.lock();
        if let Some(e) = b.get_mut(session) {
            e.from_id = e.from_id.min(from_id);
            e.dropped += 1;
            return false;
        }
        b.insert(
            session.to_string(),
            BehindEntry {
                from_id,
                since_ms: now_ms(),
                reason,
                dropped: 1,
            },
        );
        self.behind_count.store(b.len(), Ordering::Release);
        true
    }

    /// Whether event `id` of `session` is to be dropped (its session is
    /// behind from an earlier event); counts it.
    pub(super) fn drops(&self, session: &str, id: u64) -> bool {
        if self.behind_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut b = self.behind.lock();
        match b.get_mut(session) {
            Some(e) if e.from_id <= id => {
                e.dropped += 1;
                true
            }
            _ => false,
        }
    }

    /// Clear `session`'s behind mark.
    pub(super) fn clear_behind(&self, session: &str) {
        let mut b = self.behind.lock();
        if b.remove(session).is_some() {
            self.behind_count.store(b.len(), Ordering::Release);
        }
    }

    /// Clear the behind mark of `session` if nothing of it is queued
    /// (atomically with the check). Returns whether nothing is queued.
    pub(super) fn clear_behind_if_idle(&self, session: &str) -> bool {
        let p = self.pending.lock();
        if p.by_session.contains_key(session) {
            return false;
        }
        self.clear_behind(session);
        true
    }

    /// Sessions behind.
    pub(super) fn behind_count(&self) -> usize {
        self.behind_count.load(Ordering::Acquire)
    }

    /// `session`'s behind state.
    pub(super) fn behind(&self, session: &str) -> Option<Behind> {
        if self.behind_count() == 0 {
            return None;
        }
        let b = self.behind.lock().get(session).map(|e| Behind {
            since_ms: e.since_ms,
            reason: e.reason,
            dropped: e.dropped,
            ready: false,
        })?;
        Some(Behind {
            ready: self.queued_of(session) == 0 && self.faults.lock().commit.is_none(),
            ..b
        })
    }

    /// Every session behind, oldest first.
    pub(super) fn behind_sessions(&self) -> Vec<(String, Behind)> {
        let mut out: Vec<(String, Behind)> = self
            .behind
            .lock()
            .iter()
            .map(|(k, e)| {
                (
                    k.clone(),
                    Behind {
                        since_ms: e.since_ms,
                        reason: e.reason,
                        dropped: e.dropped,
                        ready: false,
                    },
                )
            })
            .collect();
        let stalled = self.faults.lock().commit.is_some();
        let p = self.pending.lock();
        for (k, b) in &mut out {
            b.ready = !stalled && !p.by_session.contains_key(k.as_str());
        }
        drop(p);
        out.sort_by(|a, b| a.1.since_ms.cmp(&b.1.since_ms).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

/// Where a settle barrier answers.
pub(super) enum Reply {
    Async(oneshot::Sender<()>),
    Blocking(SyncSender<()>),
}

impl Reply {
    pub(super) fn send(self) {
        match self {
            Reply::Async(tx) => {
                let _ = tx.send(());
            }
            Reply::Blocking(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

/// Work run on the writer thread, in queue order with the events (`W` is
/// the engine's writer).
pub(super) type Job<W> = Box<dyn FnOnce(&mut W) + Send>;

/// One command of the writer's queue.
pub(super) enum Cmd<W> {
    Event { ev: Event, id: u64, at: Instant },
    Settle(Reply),
    Job(Job<W>),
    Shutdown,
}
