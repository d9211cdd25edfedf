//! One step (request → answer) of a session, from the prepared request to
//! its record. A [`Ticket`] finishes exactly once, like the tap body: it is
//! completed with the answer, failed with why there is none, or — dropped
//! unfinished (the client went away, an early return) — recorded as failed.

use super::state::State;
use super::{now_ms, window, EventSink, Session, SessionManager, SessionMetrics};
use crate::dialect::{self, ParsedBody};
use bytes::Bytes;
use oceancode_ledger::media::Cost;
use oceancode_ledger::{Dialect, Event, InternalRecall, Usage};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The status recorded for a step whose client went away before an answer
/// (nginx's "client closed request").
pub const CLIENT_CLOSED: u16 = 499;

/// Why a step has no whole answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Where a finished step goes: the manager's sink and counters.
#[derive(Clone)]
pub(super) struct Recorder {
    sink: EventSink,
    metrics: Arc<SessionMetrics>,
    budget: Option<Arc<super::Budget>>,
}

impl Recorder {
    fn emit(&self, events: Vec<Event>) {
        if !events.is_empty() {
            (self.sink)(events);
        }
    }
}

/// The body to forward and the step to finish.
pub struct Prepared {
    /// Bytes to send upstream.
    pub body: Bytes,
    /// Present for recorded (main) requests.
    pub ticket: Option<Ticket>,
    /// The session reached a bound (`limits.session`): answer this
    /// instead of forwarding anything.
    pub refused: Option<super::LimitHit>,
}

impl Prepared {
    /// Forward `body` as it is; nothing to record.
    pub fn forward(body: Bytes) -> Prepared {
        Prepared {
            body,
            ticket: None,
            refused: None,
        }
    }
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
    recorder: Recorder,
    finished: bool,
}

impl SessionManager {
    pub(super) fn recorder(&self) -> Recorder {
        Recorder {
            sink: self.sink.clone(),
            metrics: self.metrics.clone(),
            budget: self.budget.clone(),
        }
    }

    /// A "prompt is too long" answer: learn the ceiling, cut every closed
    /// block, and return the body for the single retry (None = nothing to
    /// cut). The ticket stays open for the retry's answer.
    pub fn too_long(&self, ticket: &mut Ticket, ceiling: Option<u64>) -> Option<Bytes> {
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
        let w = window::render(
            &self.settings.data_dir,
            &st,
            &parsed,
            self.settings.state_tokens,
        );
        let media = st.sent_media(parsed.messages.len(), w.media_out);
        self.metrics
            .too_long_retries
            .fetch_add(1, Ordering::Relaxed);
        let mut events = Vec::new();
        if w.upto > st.recorded_cut {
            let (gauge, line) = (st.meter.gauge, st.meter.line);
            events.push(self.record_cut(&mut st, w.upto, gauge, line));
        }
        drop(st);
        ticket.recorder.emit(events);
        let body = w.body.map(Bytes::from)?;
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
            original,
            boundary,
            body_len,
            media,
            tail_seq,
            internal: None,
            recorder,
            finished: false,
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

    /// Keep an internal exchange after this request's last row.
    pub(crate) fn keep_hidden(&self, messages: Vec<String>) {
        self.session
            .state
            .lock()
            .hidden
            .record(self.tail_seq, messages);
    }

    /// The step ended with an answer (`ok`: whole, no error event): record
    /// its rows (when it succeeded) and the real usage.
    pub fn complete(mut self, status: u16, ok: bool, collected: &dialect::Collected) {
        self.finish(status, ok, collected);
    }

    /// The step ended without an answer: record it as failed, with the
    /// status the client got.
    pub fn fail(mut self, status: u16, error: StepError) {
        tracing::debug!(session = %self.session.id, step = self.step, status, error = error.as_str(), "step failed");
        self.finish(status, false, &dialect::Collected::default());
    }

    fn finish(&mut self, status: u16, ok: bool, collected: &dialect::Collected) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let mut st = self.session.state.lock();
        let mut events = Vec::new();
        if ok && (200..300).contains(&status) {
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
        st.step_done(self.step, now_ms());
        let mut event = step_event(&st, self, status, collected);
        if let (Some((recalls, billed)), Event::Step { detail, .. }) =
            (self.internal.take(), &mut event)
        {
            detail.extra = detail.extra.plus(billed);
            detail.recalls = recalls;
        }
        events.push(event);
        drop(st);
        if let (Some(b), Some(u)) = (&self.recorder.budget, collected.usage) {
            let model = collected.model.as_deref().unwrap_or_default();
            let model = if model.is_empty() {
                self.session.state.lock().meta.model.clone()
            } else {
                model.to_string()
            };
            b.charge(&self.session.id, &model, u.plus(collected.detail.extra));
        }
        self.recorder.emit(events);
    }
}

fn step_event(st: &State, t: &Ticket, status: u16, collected: &dialect::Collected) -> Event {
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
        ts_ms: now_ms(),
        error: None,
        detail: Box::new(collected.detail.clone()),
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            tracing::debug!(session = %self.session.id, step = self.step, "step dropped unfinished; recorded as failed");
            self.finish(CLIENT_CLOSED, false, &dialect::Collected::default());
        }
    }
}
