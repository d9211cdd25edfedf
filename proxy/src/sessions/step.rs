//! One step (request → answer) of a session, from the prepared request to
//! its record. A [`Ticket`] finishes exactly once, like the tap body: it is
//! completed with the answer, failed with why there is none, or — dropped
//! unfinished (the client went away, an early return) — recorded as failed.

use super::hold::refuses_caller;
use super::index::Index;
use super::meter::LastError;
use super::state::State;
use super::{window, Clock, EventSink, Session, SessionManager, SessionMetrics};
use crate::dialect::{self, ParsedBody};
use bytes::Bytes;
use oceancode_window::media::Cost;
use oceancode_window::{Dialect, Event, InternalRecall, Usage};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The status recorded for a step whose client went away before an answer
/// (nginx's "client closed request").
pub const CLIENT_CLOSED: u16 = 499;

/// Why a step has no whole answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(into = "&'static str")]
pub enum StepError {
    /// The upstream could not be reached (connect, TLS, reset before headers).
    Unreachable,
    /// The upstream did not answer in time.
    Timeout,
    /// The answer broke off (upstream reset, idle timeout).
    Stream,
    /// The client went away before the answer was whole.
    Cancelled,
    /// The upstream answered with an error (status or error event).
    Upstream,
}

impl StepError {
    /// Stable name, as recorded.
    pub fn as_str(self) -> &'static str {
        match self {
            StepError::Unreachable => "upstream_unreachable",
            StepError::Timeout => "upstream_timeout",
            StepError::Stream => "stream_error",
            StepError::Cancelled => "cancelled",
            StepError::Upstream => "upstream_error",
        }
    }
}

impl From<StepError> for &'static str {
    fn from(e: StepError) -> &'static str {
        e.as_str()
    }
}

/// Where a finished step goes: the manager's sink and counters, and its
/// index (a rolled-back request's new session leaves it).
#[derive(Clone)]
pub(super) struct Recorder {
    sink: EventSink,
    metrics: Arc<SessionMetrics>,
    index: Arc<Mutex<Index>>,
    clock: Clock,
}

/// The body to forward and the step to finish.
pub struct Prepared {
    /// Bytes to send upstream.
    pub body: Bytes,
    /// Present for recorded (main) requests.
    pub ticket: Option<Ticket>,
    /// Answer this instead of forwarding anything.
    pub refused: Option<Refusal>,
    /// The spend reserved for a request that records no step (a title,
    /// remote compaction): settled with its answer's usage.
    pub reservation: Option<super::Reservation>,
}

/// Why the proxy answers a request itself instead of forwarding it.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// The session (or the run) reached a bound of `limits.session`.
    Limit(super::LimitHit),
    /// A bound is set and the body cannot be read (so the request can be
    /// neither told apart nor charged): why.
    Unreadable(String),
}

impl Prepared {
    /// Forward `body` as it is; nothing to record.
    pub fn forward(body: Bytes) -> Prepared {
        Prepared {
            body,
            ticket: None,
            refused: None,
            reservation: None,
        }
    }

    /// Answer `why` instead of forwarding.
    pub fn refuse(why: Refusal) -> Prepared {
        Prepared {
            refused: Some(why),
            ..Prepared::forward(Bytes::new())
        }
    }
}

/// The meter of one step as its answer's `x-oceancode-*` headers tell it
/// (never inside the body: the window's bytes stay the cached prefix).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeterHead {
    /// The window sent, estimated tokens (the gauge after this request's cut).
    pub window: u64,
    /// The line in force for it, tokens.
    pub line: u64,
    /// Rows this request cut out of the window (0: none).
    pub cut_rows: u64,
}

/// What the request path needs to finish a step. Finishes exactly once:
/// [`Ticket::complete`], [`Ticket::fail`], or on drop (a failed step,
/// [`StepError::Cancelled`]).
pub struct Ticket {
    /// The session.
    pub session: Arc<Session>,
    /// Step number.
    pub step: u32,
    /// Dialect.
    pub dialect: Dialect,
    /// Rows in the window sent.
    pub window_rows: usize,
    /// Its meter, for the answer's headers.
    pub meter: MeterHead,
    /// The session's window events up to this request (a cut, a masking
    /// choice, a context edit): a window may differ from the one before it
    /// in more than what the client appended only when this advanced.
    pub window_event: u64,
    /// The original request body (kept for a too-long retry).
    pub(super) original: Bytes,
    /// Last seq before this step's new rows (the newest step is never cut).
    pub(super) boundary: u64,
    /// Bytes of the body sent upstream (calibrates the token estimate).
    body_len: usize,
    /// Its images and documents (left out of the calibration).
    media: Cost,
    /// The last row of the request's history (what an internal recall
    /// exchange follows).
    pub(crate) tail_seq: u64,
    /// The recall calls the proxy answered itself, and what their internal
    /// answers were billed (beyond the window of the answer the client got).
    internal: Option<(Vec<InternalRecall>, Usage)>,
    /// What `ledger.compress` did to the window sent (the step's detail).
    pub(super) compress: Option<oceancode_window::Pruned>,
    /// What it sent upstream (the retry's window after a too-long answer).
    pub(super) sent: Option<oceancode_window::SentWindow>,
    recorder: Recorder,
    finished: bool,
    /// Which request holds events on the sessions in `held`, until the
    /// upstream's status is known ([`Ticket::answered`]).
    id: u64,
    held: Vec<Arc<Session>>,
    /// Sessions this request created (they leave the index if it is
    /// rolled back).
    created: Vec<Arc<Session>>,
    /// The spend reserved when it was let through (`limits.session`),
    /// settled when it finishes.
    pub(super) reservation: Option<super::Reservation>,
    /// Its spans, when OpenTelemetry export is on.
    trace: Option<Box<crate::telemetry::StepTrace>>,
    /// What the proxy saw change at the request (a miss's cause).
    pub(super) cache: oceancode_window::cache::Changes,
}

impl SessionManager {
    pub(super) fn recorder(&self) -> Recorder {
        Recorder {
            sink: self.sink.clone(),
            metrics: self.metrics.clone(),
            index: self.index.clone(),
            clock: self.settings.clock.clone(),
        }
    }

    /// A "prompt is too long" answer: learn the ceiling, cut every closed
    /// block, and return the body for the single retry (None = nothing to
    /// cut). The ticket stays open for the retry's answer.
    pub fn too_long(&self, ticket: &mut Ticket, ceiling: Option<u64>) -> Option<Bytes> {
        ticket.answered(400);
        let parsed = ParsedBody::parse(&ticket.original, dialect::conv_key(ticket.dialect)).ok()?;
        // The retry carries the recall tool as every request of the session.
        let tools = self
            .recall_tool
            .then(|| crate::recall_tool::tools_member(ticket.dialect, parsed.get("tools")))
            .flatten();
        let view;
        let parsed = match &tools {
            Some(t) => {
                view = parsed.with_member("tools", t);
                &view
            }
            None => &parsed,
        };
        let mut st = ticket.session.state.lock();
        st.release_hold(&self.sink);
        if let Some(c) = ceiling {
            st.learned_ceiling = Some(c);
        }
        let before = st.tideline.cut_upto();
        let cut = st.tideline.cut_all_closed(ticket.boundary)?;
        if cut.upto_seq <= before {
            return None;
        }
        let line = st.meter.line;
        // The answer's meter tells the window the retry sends; the cut's
        // record keeps the gauge it was made at.
        st.meter.gauge = st.tideline.gauge();
        ticket.meter.window = st.meter.gauge;
        self.at_cut(&mut st, parsed, line);
        let w = window::render(&self.settings, &st, parsed);
        if w.saved > 0 {
            ticket.compress = st.compress.detail();
        }
        let media = st.sent_media(parsed.messages.len(), w.media_out);
        let n = parsed.messages.len();
        ticket.sent = Some(super::sent::record(&st, &w, n, false));
        self.metrics
            .too_long_retries
            .fetch_add(1, Ordering::Relaxed);
        let mut events = Vec::new();
        if w.upto > st.recorded_cut {
            ticket.meter.cut_rows += st.rows_between(st.recorded_cut, w.upto);
            st.meter.last_cut_rows = ticket.meter.cut_rows;
            ticket.cache.cut = true;
            let line = st.meter.line;
            events.push(self.record_cut(&mut st, w.upto, cut.gauge_before, line));
        }
        st.emit(&self.sink, events);
        drop(st);
        let body = w.body.map(Bytes::from)?;
        ticket.trace_child(crate::telemetry::Child::Retry {
            too_long: ceiling.is_some(),
        });
        ticket.body_len = body.len();
        ticket.media = media;
        Some(body)
    }
}

impl Ticket {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        session: Arc<Session>,
        step: u32,
        dialect: Dialect,
        original: Bytes,
        window_rows: usize,
        boundary: u64,
        body_len: usize,
        media: Cost,
        tail_seq: u64,
        recorder: Recorder,
    ) -> Ticket {
        Ticket {
            session,
            step,
            dialect,
            window_rows,
            meter: MeterHead::default(),
            window_event: 0,
            original,
            boundary,
            body_len,
            media,
            tail_seq,
            internal: None,
            compress: None,
            sent: None,
            recorder,
            finished: false,
            id: 0,
            held: Vec::new(),
            created: Vec::new(),
            reservation: None,
            trace: None,
            cache: Default::default(),
        }
    }

    /// Export this step's spans (`crate::telemetry`; None: export is off).
    pub fn traced(&mut self, trace: Option<Box<crate::telemetry::StepTrace>>) {
        self.trace = trace;
    }

    /// Another upstream call of this step begins (a child span).
    pub fn trace_child(&mut self, child: crate::telemetry::Child) {
        if let Some(t) = self.trace.as_mut() {
            t.child(child);
        }
    }

    /// The in-band recall tool answered calls in this step: they go to the
    /// step's detail (`recalls`), what their internal answers were billed to
    /// its `extra`; the answer the client gets came from a body of
    /// `sent_len` bytes (the last continuation).
    pub(crate) fn note_internal(
        &mut self,
        recalls: Vec<InternalRecall>,
        billed: Usage,
        sent_len: usize,
    ) {
        if recalls.is_empty() {
            return;
        }
        self.body_len = sent_len;
        self.internal = Some((recalls, billed));
    }

    /// Keep an internal exchange after this request's last row (the recall
    /// loop; public for the window invariants).
    pub fn keep_hidden(&self, messages: Vec<String>) {
        self.session
            .state
            .lock()
            .hidden
            .record(self.tail_seq, messages);
    }

    /// The sessions holding this request's events (a sibling's parent
    /// first), and those it created.
    pub(super) fn holding(
        mut self,
        id: u64,
        held: Vec<Arc<Session>>,
        created: Vec<Arc<Session>>,
    ) -> Ticket {
        self.id = id;
        self.held = held;
        self.created = created;
        self
    }

    /// The upstream answered with `status`: the request's held events go
    /// to the writer, unless the upstream refused the caller (401/403):
    /// then the request is rolled back and leaves no trace, its step
    /// finished (see `sessions::hold`). Called once the status is known; the
    /// first call decides, and finishing the step calls it too.
    pub fn answered(&mut self, status: u16) {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return;
        }
        if refuses_caller(status) && self.roll_back(&held) {
            self.finished = true;
            tracing::info!(session = %self.session.id, step = self.step, status, "the upstream refused the caller: nothing of the request is recorded");
            return;
        }
        for s in &held {
            let mut st = s.state.lock();
            if st.holds(self.id) {
                st.release_hold(&self.recorder.sink);
            }
        }
    }

    /// Undo the request on every session it changed, if it still holds
    /// them all (nothing else changed them since).
    fn roll_back(&mut self, held: &[Arc<Session>]) -> bool {
        let mut guards: Vec<_> = held.iter().map(|s| s.state.lock()).collect();
        if !guards.iter().all(|st| st.holds(self.id)) {
            return false;
        }
        let metrics = &self.recorder.metrics;
        for st in guards.iter_mut().rev() {
            st.roll_back(self.id, metrics, &self.recorder.sink);
        }
        drop(guards);
        metrics.refused.fetch_add(1, Ordering::Relaxed);
        let created = std::mem::take(&mut self.created);
        for s in &created {
            if s.state.lock().meta.parent_seq.is_some() {
                // The sibling made for it was no other conversation after all.
                metrics.siblings.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let mut idx = self.recorder.index.lock();
        for s in &created {
            idx.forget_unrecorded(s);
        }
        true
    }

    /// The step ended with an answer (`ok`: whole, no error event): record
    /// its rows (when it succeeded) and the real usage.
    /// An answer that is not whole or not a success is a failed step: an
    /// error status or error event is [`StepError::Upstream`], else the
    /// stream broke off ([`StepError::Stream`]).
    pub fn complete(mut self, status: u16, ok: bool, collected: &dialect::Collected) {
        let error = if !(200..300).contains(&status) || collected.error.is_some() {
            Some(StepError::Upstream)
        } else if !ok {
            Some(StepError::Stream)
        } else {
            None
        };
        self.finish(status, collected, error);
    }

    /// The step ended without an answer: record it as failed, with the
    /// status the client got and why.
    pub fn fail(mut self, status: u16, error: StepError) {
        self.finish(status, &dialect::Collected::default(), Some(error));
    }

    /// The answer began but did not end whole (`error`: the client went
    /// away, the stream broke off): the usage seen so far, no rows.
    pub fn cut_short(mut self, status: u16, error: StepError, collected: &dialect::Collected) {
        self.finish(status, collected, Some(error));
    }

    fn finish(&mut self, status: u16, collected: &dialect::Collected, error: Option<StepError>) {
        self.answered(status);
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let mut st = self.session.state.lock();
        let mut events = Vec::new();
        if let Some(e) = error {
            tracing::debug!(session = %self.session.id, step = self.step, status, error = e.as_str(), "step failed");
            self.recorder
                .metrics
                .failed_steps
                .fetch_add(1, Ordering::Relaxed);
            st.meter.failed_steps += 1;
            st.meter.last_error = Some(LastError {
                step: self.step,
                status,
                error: e,
            });
        } else {
            let rows = st.take_answer(self.step, collected, self.body_len, self.media);
            if !rows.is_empty() {
                self.recorder
                    .metrics
                    .rows
                    .fetch_add(rows.len() as u64, Ordering::Relaxed);
                events.push(Event::Rows {
                    session: st.meta.id.clone(),
                    rows,
                });
            }
        }
        st.step_done(self.step, self.recorder.clock.now_ms());
        self.sent = super::sent::keep_stub_once(&mut st, self.step, self.sent.take());
        if let Some(t) = self.trace.take() {
            t.finish(&self.facts(&st, status, collected, error));
        }
        let note = self.cache_note(&mut st, collected, error.is_none());
        let mut event = step_event(&st, self, status, collected, error);
        if let (Some(n), Event::Step { detail, .. }) = (note, &mut event) {
            detail.cache = Some(n);
        }
        let mut internal_billed = Usage::default();
        if let (Some((recalls, billed)), Event::Step { detail, .. }) =
            (self.internal.take(), &mut event)
        {
            detail.extra = detail.extra.plus(billed);
            detail.recalls = recalls;
            internal_billed = billed;
        }
        events.push(event);
        // The spend bound charges the answer's model (the session's when the
        // answer named none), after the session's lock is let go; with no
        // usage the reservation is released.
        let charge = self
            .reservation
            .take()
            .map(|r| (r, collected.usage))
            .map(|(r, u)| {
                let model = match collected.model.as_deref() {
                    Some(m) if !m.is_empty() => m.to_string(),
                    _ => st.meta.model.clone(),
                };
                let billed = u.map(|u| u.plus(collected.detail.extra).plus(internal_billed));
                (r, model, billed)
            });
        if error.is_some() {
            // Only the step's own record: it builds on nothing another
            // request may still hold (see `hold`).
            (self.recorder.sink)(events);
        } else {
            st.emit(&self.recorder.sink, events);
        }
        drop(st);
        if let Some((r, model, Some(billed))) = charge {
            r.settle(&model, billed);
        }
    }
}

impl Ticket {
    /// What the step's span tells (`crate::telemetry`).
    fn facts<'a>(
        &'a self,
        st: &'a State,
        status: u16,
        collected: &'a dialect::Collected,
        error: Option<StepError>,
    ) -> crate::telemetry::StepFacts<'a> {
        let m = &st.meter;
        crate::telemetry::StepFacts {
            session: &self.session.id,
            step: self.step,
            dialect: self.dialect,
            request_model: &st.meta.model,
            status,
            collected,
            error: error.map(StepError::as_str),
            window_rows: self.window_rows,
            active_rows: m.active_rows,
            gauge: m.gauge,
            line: m.line,
            block: m.block,
            context: m.context,
            cut_upto: m.cut_upto,
            cut: m.last_cut.filter(|c| c.step == self.step),
            pointers: self.compress.as_ref().map_or(0, |c| c.outputs),
            pointer_saved_tokens: self.compress.as_ref().map_or(0, |c| c.saved),
            state_tokens: m.state_tokens,
            context_edit: self.sent.as_ref().map_or(0, |s| s.edit),
            provider_edits: collected.detail.edits.len(),
            recalls: self.internal.as_ref().map_or(0, |(r, _)| r.len()),
            request: &self.original,
        }
    }

    /// The step's prompt cache note: cold on arrival, a free cut, and a
    /// miss (the previous prompt not read from the cache) with its cause.
    fn cache_note(
        &self,
        st: &mut State,
        collected: &dialect::Collected,
        ok: bool,
    ) -> Option<oceancode_window::cache::CacheNote> {
        use oceancode_window::cache;
        let ch = &self.cache;
        let provider = collected
            .detail
            .cache
            .as_ref()
            .and_then(|c| c.provider.clone());
        let mut note = cache::CacheNote {
            cold: ch.cold,
            free_cut: ch.cut && ch.cold.is_some(),
            changed: ch.client.clone(),
            provider,
            ..Default::default()
        };
        if let (true, Some(u)) = (ok, collected.usage) {
            let missed = cache::miss_tokens(st.cache.prompt, u.cache_read)
                .map(|m| m.min(u.input + u.cache_write))
                .filter(|&m| m >= cache::MIN_MISS_TOKENS);
            if let Some(m) = missed {
                let cause = cache::cause(ch, note.provider.as_deref());
                note.miss = Some(cause);
                note.miss_tokens = m;
                let i = cache::MissCause::ALL
                    .iter()
                    .position(|c| *c == cause)
                    .unwrap_or(cache::MissCause::ALL.len() - 1);
                self.recorder.metrics.cache_misses[i].fetch_add(1, Ordering::Relaxed);
                tracing::debug!(session = %self.session.id, step = self.step, cause = cause.label(), tokens = m, changed = ?note.changed, provider = ?note.provider, "cache miss");
            }
            st.cache.prompt = Some(u.input + u.cache_read + u.cache_write);
        }
        (!note.is_empty()).then_some(note)
    }
}

fn step_event(
    st: &State,
    t: &Ticket,
    status: u16,
    collected: &dialect::Collected,
    error: Option<StepError>,
) -> Event {
    Event::Step {
        session: st.meta.id.clone(),
        step: t.step,
        model: collected
            .model
            .clone()
            .unwrap_or_else(|| st.meta.model.clone()),
        status,
        usage: collected.usage.unwrap_or_default(),
        window_rows: t.window_rows as u32,
        ts_ms: t.recorder.clock.now_ms(),
        error: error.map(|e| e.as_str().to_string()),
        detail: Box::new(oceancode_window::StepDetail {
            compress: t.compress.clone(),
            sent: t.sent.clone(),
            ..collected.detail.clone()
        }),
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            tracing::debug!(session = %self.session.id, step = self.step, "step dropped unfinished; recorded as failed");
            self.finish(
                CLIENT_CLOSED,
                &dialect::Collected::default(),
                Some(StepError::Cancelled),
            );
        }
    }
}
