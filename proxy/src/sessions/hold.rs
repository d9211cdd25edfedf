//! A request's record is held until the upstream's answer status is known.
//!
//! The events a request makes on its session (the session itself, its new
//! rows, a branch, a cut, a hidden answer) stay in the session's memory —
//! never on disk, so nothing waits — until the upstream answers. An answer
//! the upstream refused as unauthorized (401) or forbidden (403) says the
//! request was not the user's to make (a bad key, a page posting across
//! sites): the session's state is rolled back to its checkpoint and the
//! held events are dropped, so the request leaves no row, turn, step or
//! `SESSION.md` Goal, and the next request is matched as if it never came.
//! Any other answer (an error too: the client sent those rows and resends
//! them) releases the events to the writer.
//!
//! A session holds at most one request's events: whatever else changes the
//! session first (another request, a step's answer, a cut) releases them,
//! since it builds on that state; the held request can then no longer be
//! rolled back and is recorded with its status like any failed step. (A
//! step that fails meanwhile changes nothing the held request did: its
//! record does not release them.)
//! Events are handed to the writer under the session's lock, so they reach
//! it in the order the state made them.

use super::meter::Meter;
use super::state::{Answer, State};
use super::{EventSink, SessionMetrics};
use oceancode_window::tideline::Tideline;
use oceancode_window::{Event, SessionMeta, Usage};
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether an upstream status refuses the caller (nothing of the request
/// is recorded): 401 Unauthorized, 403 Forbidden.
pub fn refuses_caller(status: u16) -> bool {
    status == 401 || status == 403
}

/// A fresh id for a ticket (which request holds a session's events).
pub(super) fn next_ticket() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What a request changes on a session, as it was before.
pub(super) struct Checkpoint {
    meta: SessionMeta,
    recorded_meta: Option<SessionMeta>,
    rows: usize,
    active: Vec<u64>,
    answers: Vec<Answer>,
    branch: u32,
    step: u32,
    turn: u32,
    tideline: Tideline,
    recorded_cut: u64,
    needs_seed: bool,
    last_usage: Option<Usage>,
    pending_est: u64,
    recorded_line: Option<super::state::RecordedLine>,
    meter: Meter,
    compress_generation: u64,
    /// A refused request never reached the provider's prompt cache: the
    /// cache facts as they were (but the message seqs, see `seqs`).
    cache: super::state::CacheState,
    /// The previous request's message seqs, handed over by the request
    /// that replaced them (None: it did not), so none are copied here.
    seqs: Option<Vec<u64>>,
}

/// One request's events on a session, and the state before it.
pub(super) struct Hold {
    ticket: u64,
    events: Vec<Event>,
    before: Box<Checkpoint>,
}

impl Checkpoint {
    /// The message seqs the request replaced, for a rollback to put back.
    pub(super) fn keep_seqs(&mut self, seqs: Vec<u64>) {
        self.seqs = Some(seqs);
    }
}

impl State {
    /// Before a request changes the session: release what another request
    /// holds (this one builds on it) and take the checkpoint to roll back to.
    pub(super) fn checkpoint(&mut self, sink: &EventSink) -> Box<Checkpoint> {
        self.release_hold(sink);
        self.undo.clear();
        // The cache facts without the seqs: a request that replaces them
        // hands the old ones over ([`Checkpoint::keep_seqs`]).
        let seqs = std::mem::take(&mut self.cache.seqs);
        let cache = self.cache.clone();
        self.cache.seqs = seqs;
        Box::new(Checkpoint {
            meta: self.meta.clone(),
            recorded_meta: self.recorded_meta.clone(),
            rows: self.rows.len(),
            active: self.active.clone(),
            answers: self.answers.clone(),
            branch: self.branch,
            step: self.step,
            turn: self.turn,
            tideline: self.tideline.clone(),
            recorded_cut: self.recorded_cut,
            needs_seed: self.needs_seed,
            last_usage: self.last_usage,
            pending_est: self.pending_est,
            recorded_line: self.recorded_line.clone(),
            meter: self.meter,
            compress_generation: self.compress.generation,
            cache,
            seqs: None,
        })
    }

    /// Hold `events` of request `ticket` (made since `before`).
    pub(super) fn hold(&mut self, ticket: u64, events: Vec<Event>, before: Box<Checkpoint>) {
        self.hold = Some(Hold {
            ticket,
            events,
            before,
        });
    }

    /// Whether request `ticket` still holds this session's events (nothing
    /// else changed the session since).
    pub(super) fn holds(&self, ticket: u64) -> bool {
        self.hold.as_ref().is_some_and(|h| h.ticket == ticket)
    }

    /// Hand the held events, if any, to the writer.
    pub(super) fn release_hold(&mut self, sink: &EventSink) {
        if let Some(h) = self.hold.take() {
            if !h.events.is_empty() {
                sink(h.events);
            }
        }
    }

    /// Hand `events` to the writer after what is held (which they build on).
    pub(super) fn emit(&mut self, sink: &EventSink, events: Vec<Event>) {
        self.release_hold(sink);
        if !events.is_empty() {
            sink(events);
        }
    }

    /// Undo request `ticket`: the state as it was before it, its held
    /// events dropped (and taken out of the counters). False when it no
    /// longer holds the session.
    ///
    /// A context edit the request read from the exported file is the file
    /// writer's, not the refused caller's: it stays in force and its event
    /// still goes to the writer (it names rows recorded before the request).
    pub(super) fn roll_back(
        &mut self,
        ticket: u64,
        metrics: &SessionMetrics,
        sink: &EventSink,
    ) -> bool {
        if !self.holds(ticket) {
            return false;
        }
        let Some(h) = self.hold.take() else {
            return false;
        };
        let (edits, dropped): (Vec<Event>, Vec<Event>) = h
            .events
            .into_iter()
            .partition(|ev| matches!(ev, Event::ContextEdit { .. }));
        if !edits.is_empty() {
            sink(edits);
        }
        for ev in &dropped {
            let (counter, n) = match ev {
                Event::Rows { rows, .. } => (&metrics.rows, rows.len() as u64),
                Event::Branch { .. } => (&metrics.branches, 1),
                Event::Cut { .. } => (&metrics.cuts, 1),
                _ => continue,
            };
            counter.fetch_sub(n, Ordering::Relaxed);
        }
        for u in std::mem::take(&mut self.undo).into_iter().rev() {
            if let Some(r) = self.rows.get_mut((u.seq - 1) as usize) {
                (r.raw_hash, r.norm_hash, r.echo) = (u.raw_hash, u.norm_hash, u.echo);
                r.set_calls(u.calls);
                r.set_starts_ok(u.starts_ok);
            }
        }
        let c = *h.before;
        self.rows.truncate(c.rows);
        self.turn_lines.retain(|turn, _| *turn <= c.turn);
        self.meta = c.meta;
        self.recorded_meta = c.recorded_meta;
        self.active = c.active;
        self.answers = c.answers;
        // Steps that failed meanwhile finished without touching what this
        // request changed: they stay finished and counted.
        self.open.retain(|(step, _)| *step <= c.step);
        self.branch = c.branch;
        self.step = c.step;
        self.turn = c.turn;
        self.tideline = c.tideline;
        self.recorded_cut = c.recorded_cut;
        self.needs_seed = c.needs_seed;
        self.last_usage = c.last_usage;
        self.pending_est = c.pending_est;
        self.recorded_line = c.recorded_line;
        if self.compress.generation != c.compress_generation {
            // The request chose a pruned set at its event: the next request
            // that makes it chooses it again (the same inputs, the same
            // set), and reports it with its own step.
            self.compress = super::compress::Compressed {
                generation: self.compress.generation,
                ..Default::default()
            };
        }
        self.meter = Meter {
            failed_steps: self.meter.failed_steps,
            last_error: self.meter.last_error,
            ..c.meter
        };
        // The upstream refused the request before its cache saw it: the
        // next request compares with the one before (the window event
        // count only grows: the refused window was sent).
        let seqs = c
            .seqs
            .unwrap_or_else(|| std::mem::take(&mut self.cache.seqs));
        self.cache = super::state::CacheState {
            events: self.cache.events,
            seqs,
            ..c.cache
        };
        true
    }

    /// Nothing of this session was ever recorded or is under way: a session
    /// a rolled-back request created, which leaves the index.
    pub(super) fn unrecorded(&self) -> bool {
        self.rows.is_empty()
            && self.recorded_meta.is_none()
            && self.hold.is_none()
            && self.open.is_empty()
    }
}
