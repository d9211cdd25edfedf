//! Preparing a request, in named phases: split the body (against the
//! client's last layout when it can), describe the request (identity, key,
//! shape), record it on its session, run the tideline, render the window,
//! and hand back the body to forward with the step's [`Ticket`].

use super::layouts::Layouts;
use super::parse::root_hashes;
use super::stages;
use super::state::{CacheState, State};
use super::step::{Prepared, Refusal, Ticket};
use super::window::{self, Window};
use super::{Session, SessionManager};
use crate::dialect::{self, ParsedBody};
use crate::identity::{self, Identity, NameError, ReqKind};
use bytes::Bytes;
use oceancode_config::LineSpec;
use oceancode_window::cache::{self, Changes};
use oceancode_window::media::Cost;
use oceancode_window::tideline::{self, Observation, Params};
use oceancode_window::{Dialect, Event, SessionMeta};
use serde_json::Value;
use std::sync::atomic::Ordering;

/// What a request's conversation started with, to tell the client's own
/// fresh start (compaction, `/clear`) from a sub-agent.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    /// Hash of the `tools` member (0 = none).
    pub(super) tools: u64,
    /// [`super::parse::RootHashes::system`].
    pub(super) system: u64,
}

/// A request as the session matching and the tideline see it.
pub(super) struct Request<'a> {
    pub(super) dialect: Dialect,
    pub(super) ident: &'a Identity,
    /// The client key: the declared one, else `fp:` and the root hash.
    pub(super) key: String,
    /// The conversation's raw messages.
    pub(super) messages: &'a [&'a str],
    /// The body the messages are slices of (new rows may share its bytes).
    pub(super) body: &'a Bytes,
    /// Their raw hashes.
    pub(super) hashes: Vec<u64>,
    pub(super) shape: Shape,
    /// Responses with `previous_response_id`: the provider holds the
    /// history; the input is only what is new. Recorded, never windowed.
    pub(super) stateful: bool,
    /// A Responses string `input`, taken as one message: recorded, not cut.
    pub(super) synthetic: bool,
    pub(super) model: String,
    pub(super) max_tokens: Option<u64>,
    /// The prompt cache lifetime the request asks for (ms).
    pub(super) ttl_ms: u64,
}

impl<'a> Request<'a> {
    fn describe(
        dialect: Dialect,
        parsed: &'a ParsedBody<'a>,
        ident: &'a Identity,
        body: &'a Bytes,
        hashes: Vec<u64>,
        synthetic: bool,
    ) -> Self {
        let sys = parsed
            .get("system")
            .or_else(|| parsed.get("instructions"))
            .or_else(|| parsed.get("systemInstruction"))
            .unwrap_or("");
        let root = root_hashes(dialect, sys, &parsed.messages);
        let key = ident
            .client_key
            .clone()
            .unwrap_or_else(|| format!("fp:{:016x}", root.key));
        Request {
            dialect,
            ident,
            key,
            messages: &parsed.messages,
            body,
            hashes,
            shape: Shape {
                tools: parsed.get("tools").map(dialect::raw_hash).unwrap_or(0),
                system: root.system,
            },
            stateful: dialect == Dialect::OpenaiResponses
                && parsed
                    .get_as::<Value>("previous_response_id")
                    .is_some_and(|v| !v.is_null()),
            synthetic,
            model: parsed
                .model()
                .or_else(|| ident.model.clone())
                .unwrap_or_default(),
            max_tokens: max_tokens(parsed),
            ttl_ms: requested_ttl(parsed),
        }
    }

    /// Whether the tideline may window this request.
    fn windowed(&self, enabled: bool) -> bool {
        enabled && !self.stateful && !self.synthetic
    }
}

/// What phases 3–5 did on a session.
enum Run {
    /// Recorded: the step, the last seq before its new rows, the window
    /// and the images and documents it sends.
    Done {
        step: u32,
        boundary: u64,
        window: Box<Window>,
        media: Cost,
        cache: Box<Changes>,
    },
    /// Another conversation: it left the session's live line after row `at`.
    Sibling { at: u64 },
}

/// A Responses request whose `input` is a string: that string as one user
/// message.
fn synthetic_input(dialect: Dialect, parsed: &ParsedBody<'_>) -> Option<String> {
    (dialect == Dialect::OpenaiResponses && parsed.messages.is_empty())
        .then(|| parsed.get_as::<String>("input"))
        .flatten()
        .map(|text| serde_json::json!({"role": "user", "content": text}).to_string())
}

/// A body that cannot be read while a bound is set.
fn unreadable(why: &str) -> Refusal {
    Refusal::Unreadable(format!(
        "{why}; a limit is in force (limits.session: --max-spend, --max-steps, --max-time), and a request the proxy cannot read cannot be counted: it is refused, not forwarded"
    ))
}

/// The prompt cache lifetime a request asks for: its cache markers sit in
/// the tools, the system prompt and the newest messages (Anthropic), or in
/// `prompt_cache_retention` (OpenAI); only those parts are scanned.
fn requested_ttl(parsed: &ParsedBody<'_>) -> u64 {
    use oceancode_window::cache::requested_ttl_ms;
    let n = parsed.messages.len();
    ["prompt_cache_retention", "tools", "system"]
        .iter()
        .filter_map(|k| parsed.get(k).map(|v| (*k, v)))
        .map(|(k, v)| match k {
            "prompt_cache_retention" => requested_ttl_ms(format!("{{\"{k}\":{v}}}").as_bytes()),
            _ => requested_ttl_ms(v.as_bytes()),
        })
        .chain(
            parsed.messages[n.saturating_sub(3)..]
                .iter()
                .map(|m| requested_ttl_ms(m.as_bytes())),
        )
        .max()
        .unwrap_or(oceancode_window::cache::DEFAULT_TTL_MS)
}

/// Whether the request finds the session's prompt cache cold (and why);
/// it becomes the previous request the next one compares with.
fn cold_on_arrival(st: &mut State, req: &Request<'_>, now: i64) -> Option<cache::Cold> {
    let previous = st.cache.previous.take();
    let models = &mut st.cache.models;
    let model_last_ms = models
        .iter()
        .position(|(m, _)| *m == req.model)
        .map(|i| models.remove(i).1);
    let cold = cache::cold(&cache::Facts {
        now_ms: now,
        model: &req.model,
        ttl_ms: req.ttl_ms,
        previous: previous.as_ref().map(|(at_ms, model)| cache::Previous {
            at_ms: *at_ms,
            model,
        }),
        model_last_ms,
        resumed: st.cache.resumed,
    });
    // The previous request's model joins the others when this one differs.
    if let Some((at, model)) = previous.filter(|(_, m)| *m != req.model) {
        models.insert(0, (model, at));
        models.truncate(CacheState::MODELS);
    }
    st.cache.previous = Some((now, req.model.clone()));
    st.cache.resumed = false;
    cold
}

/// Where the client's request first differs from its previous one, by the
/// proxy's own comparison (tools, then system prompt, then the first
/// earlier message that maps to another row: the normalized hashes, so a
/// moved `cache_control` marker is no change). Call after the request was
/// recorded (its messages are the active line's first rows).
fn client_change(
    st: &mut State,
    req: &Request<'_>,
    before: &mut super::hold::Checkpoint,
) -> Option<String> {
    if req.stateful {
        return None;
    }
    let shape = (req.shape.system, req.shape.tools);
    let n = req.messages.len().min(st.active.len());
    let seqs = st.active[..n].to_vec();
    let prev_shape = st.cache.shape.replace(shape);
    let prev = std::mem::replace(&mut st.cache.seqs, seqs);
    let change = match prev_shape {
        None => None,
        Some((_, tools)) if tools != shape.1 => Some("tools".to_string()),
        Some((system, _)) if system != shape.0 => Some("system".to_string()),
        Some(_) => prev
            .iter()
            .zip(&st.cache.seqs)
            .position(|(a, b)| a != b)
            .map(|i| format!("message {}", i + 1)),
    };
    // A rollback puts them back.
    before.keep_seqs(prev);
    change
}

/// The bytes of the window `req` is likely to send, for pricing its spend
/// reservation: when it resends every message of the session's previous
/// request, the window that request sent plus what the client added since
/// (a cut leaves out what it left out before, or more); otherwise, or for
/// the first request, its whole body.
fn likely_window(st: &State, req: &Request<'_>, body_len: usize) -> usize {
    let Some((client, sent)) = st.cache.sizes else {
        return body_len;
    };
    let previous = st.cache.seqs.len();
    if previous == 0 || st.lcp(req.messages, &req.hashes) < previous {
        return body_len;
    }
    body_len.min(sent.saturating_add(body_len.saturating_sub(client)))
}

/// The output the request asks for at most.
fn max_tokens(parsed: &ParsedBody<'_>) -> Option<u64> {
    parsed
        .get_as("max_tokens")
        .or_else(|| parsed.get_as("max_output_tokens"))
        .or_else(|| parsed.get_as("max_completion_tokens"))
}

impl SessionManager {
    /// Prepare a request: record it, run the tideline, render the window.
    pub fn prepare(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        ident: &Identity,
        body: Bytes,
    ) -> Prepared {
        let given = |_: Option<&ParsedBody<'_>>| Ok::<_, std::convert::Infallible>(ident.clone());
        match self.prepare_with(dialect, kind, body, None, given) {
            Ok(p) => p,
            Err(never) => match never {},
        }
    }

    /// [`SessionManager::prepare`] for a request as it arrived: the body is
    /// parsed once, to tell side requests (titles) apart, to read the
    /// identity (`metadata.user_id`), and to record and window it. A session
    /// name that breaks [`identity::session_name`]'s rule refuses the
    /// request.
    pub fn prepare_request(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        route: identity::Route<'_>,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Result<Prepared, NameError> {
        // Only a key the headers (or path) give: it is known before the body
        // is read, which is what lets the body be split against the last one.
        let layout_key = identity::identify(route, headers, None)?
            .client_key
            .map(|k| format!("{}|{k}", dialect.as_str()));
        self.prepare_with(dialect, kind, body, layout_key, |parsed| {
            identity::identify(route, headers, parsed)
        })
    }

    /// A request that is never recorded (the ledger is off, or its body
    /// is content-encoded): forwarded as it came, within the bounds of
    /// `limits.session` when one is set (charged to its client key, a turn
    /// counting a step; a body that cannot be read is then refused).
    /// `count_tokens` is never refused.
    pub fn prepare_unrecorded(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        route: identity::Route<'_>,
        headers: &http::HeaderMap,
        body: Bytes,
        encoded: bool,
    ) -> Result<Prepared, NameError> {
        if !self.budgeted() || kind == ReqKind::CountTokens {
            return Ok(Prepared::forward(body));
        }
        if encoded {
            return Ok(Prepared::refuse(unreadable("it is content-encoded")));
        }
        let parsed = match ParsedBody::parse(&body, dialect::conv_key(dialect)) {
            Ok(p) => p,
            Err(e) => return Ok(Prepared::refuse(unreadable(&e.to_string()))),
        };
        let ident = identity::identify(route, headers, Some(&parsed))?;
        // With the ledger off a turn of the conversation is still a step.
        let step = !encoded
            && kind == ReqKind::Main
            && !identity::is_side_request(dialect, &parsed, ident.client);
        Ok(self.forward_unrecorded(body.clone(), &ident, &parsed, step))
    }

    /// Forward a request that records no step, within the bounds: its
    /// most possible cost reserved on its client key's budget
    /// ([`SessionManager::admit_unrecorded`]), or refused.
    fn forward_unrecorded(
        &self,
        body: Bytes,
        ident: &Identity,
        parsed: &ParsedBody<'_>,
        step: bool,
    ) -> Prepared {
        if !self.budgeted() {
            return Prepared::forward(body);
        }
        // A Gemini body names no model: its path does.
        let model = parsed.model().or_else(|| ident.model.clone());
        let est = self.estimate(&model.unwrap_or_default(), body.len(), max_tokens(parsed));
        let client_key = ident.client_key.as_deref();
        match self.admit_unrecorded(client_key, Some(&est), step) {
            Ok(reservation) => Prepared {
                reservation,
                ..Prepared::forward(body)
            },
            Err(hit) => Prepared::refuse(Refusal::Limit(hit)),
        }
    }

    fn prepare_with<E>(
        &self,
        dialect: Dialect,
        kind: ReqKind,
        body: Bytes,
        layout_key: Option<String>,
        ident_of: impl FnOnce(Option<&ParsedBody<'_>>) -> Result<Identity, E>,
    ) -> Result<Prepared, E> {
        // Within a bound every request is admitted (side requests too); a
        // body the proxy cannot read is then refused, not forwarded.
        let budgeted = self.budgeted();
        if kind == ReqKind::Side && !budgeted {
            return Ok(Prepared::forward(body));
        }
        // 1. Split the body.
        let candidates = self.layouts.candidates(layout_key.as_deref());
        let mut split = match Layouts::split(&candidates, &body, dialect::conv_key(dialect)) {
            Ok(s) => s,
            Err(e) if budgeted && kind != ReqKind::CountTokens => {
                tracing::warn!(error = %e, "request body is not a JSON object the proxy can read, and a limit is in force: refused");
                return Ok(Prepared::refuse(unreadable(&e.to_string())));
            }
            Err(e) => {
                tracing::warn!(error = %e, "request body is not a JSON object; forwarded unchanged");
                return Ok(Prepared::forward(body));
            }
        };
        if split.spliced() {
            self.metrics.bodies_spliced.fetch_add(1, Ordering::Relaxed);
        }
        // 2. Describe it: who, which conversation, what shape.
        let ident = ident_of(Some(&split.parsed))?;
        if kind == ReqKind::Side || identity::is_side_request(dialect, &split.parsed, ident.client)
        {
            if kind == ReqKind::CountTokens {
                return Ok(Prepared::forward(body));
            }
            return Ok(self.forward_unrecorded(body.clone(), &ident, &split.parsed, false));
        }
        let synthetic = synthetic_input(dialect, &split.parsed);
        if let Some(m) = &synthetic {
            split.parsed.messages = vec![m.as_str()];
        }
        if split.parsed.messages.is_empty() {
            if kind == ReqKind::CountTokens {
                return Ok(Prepared::forward(body));
            }
            return Ok(self.forward_unrecorded(body.clone(), &ident, &split.parsed, false));
        }
        let hashes = split.hashes(&candidates);
        if let Some(k) = &layout_key {
            self.layouts
                .remember(k, &body, &split, &candidates, &hashes);
        }
        let parsed = &split.parsed;
        // The in-band recall tool: every request of the session carries it,
        // the same bytes after the client's tools.
        let tools = self
            .recall_tool
            .then(|| crate::recall_tool::tools_member(dialect, parsed.get("tools")))
            .flatten();
        let view;
        let parsed = match &tools {
            Some(t) => {
                view = parsed.with_member("tools", t);
                &view
            }
            None => parsed,
        };
        let req = Request::describe(dialect, parsed, &ident, &body, hashes, synthetic.is_some());
        if kind == ReqKind::CountTokens {
            return Ok(self.prepare_count(&req, parsed, &body));
        }
        // 3–5. Record it on its session (or on a sibling), run the tideline,
        // render the window. Its events are held on the sessions it changed
        // until the upstream's status is known (`hold`).
        let id = super::hold::next_ticket();
        let (mut session, created) = self.find_or_create(&req);
        let est = budgeted.then(|| {
            let bytes = likely_window(&session.state.lock(), &req, body.len());
            self.estimate(&req.model, bytes, req.max_tokens)
        });
        let reservation = match self.admit(&session, est.as_ref()) {
            Ok(r) => r,
            Err(hit) => {
                if created {
                    // Refused before anything of it was recorded: it leaves
                    // the index as a rolled-back request's session does.
                    self.index.lock().forget_unrecorded(&session);
                } else {
                    self.record_stop(&session, &req.model, &hit);
                }
                return Ok(Prepared::refuse(Refusal::Limit(hit)));
            }
        };
        let mut held = Vec::new();
        let mut new_sessions = Vec::new();
        if created {
            new_sessions.push(session.clone());
        }
        let mut may_split = true;
        // An edited context.txt is read before the session is locked.
        let mut peek = super::context::peek(&session);
        let (step, boundary, window, media, changes) = loop {
            held.push(session.clone());
            match self.run_on(&session, &req, parsed, may_split, id, peek.take()) {
                Run::Done {
                    step,
                    boundary,
                    window,
                    media,
                    cache,
                } => break (step, boundary, *window, media, *cache),
                Run::Sibling { at } => {
                    session = self.sibling(&session, &req, at);
                    new_sessions.push(session.clone());
                    may_split = false;
                }
            }
        };
        // 6. The body and the ticket back.
        self.metrics
            .tokens_kept_out
            .fetch_add(window.kept_out, Ordering::Relaxed);
        let out = match window.body {
            Some(b) => {
                self.metrics.rewritten.fetch_add(1, Ordering::Relaxed);
                Bytes::from(b)
            }
            None if tools.is_some() => Bytes::from(parsed.render_with(&parsed.messages)),
            None => body.clone(),
        };
        super::context::refresh(&session, &out);
        let body_len = out.len();
        let (tail_seq, meter, window_event) = {
            let mut st = session.state.lock();
            st.cache.sizes = Some((body.len(), body_len));
            let meter = super::MeterHead {
                window: st.meter.gauge,
                line: st.meter.line,
                cut_rows: window.cut_rows,
            };
            (
                st.active.last().copied().unwrap_or(0),
                meter,
                st.cache.events,
            )
        };
        let sent = window.sent;
        let mut ticket = Ticket::new(
            session,
            step,
            dialect,
            body,
            window.rows,
            boundary,
            body_len,
            media,
            tail_seq,
            self.recorder(),
        )
        .holding(id, held, new_sessions);
        ticket.meter = meter;
        ticket.window_event = window_event;
        ticket.compress = window.compress;
        ticket.sent = sent.map(|s| *s);
        ticket.reservation = reservation;
        ticket.cache = changes;
        Ok(Prepared {
            body: out,
            ticket: Some(ticket),
            refused: None,
            reservation: None,
        })
    }

    /// Phases 3–5 on `session`, under its lock: record, tideline, window;
    /// the events are held on the session for request `ticket`.
    /// With `may_split`, a headerless request that leaves the session's
    /// line while the line is live is another conversation: nothing is
    /// recorded here but the hiding of the answer it continues with (its
    /// sibling records it), and the sibling's divergence point is returned.
    fn run_on(
        &self,
        session: &Session,
        req: &Request<'_>,
        parsed: &ParsedBody<'_>,
        may_split: bool,
        ticket: u64,
        peek: Option<super::context::Peek>,
    ) -> Run {
        let mut st = session.state.lock();
        if let Some(r) = self.healer.as_ref().and_then(|h| h(&session.id)) {
            st.resync(r.committed);
        }
        let mut before = st.checkpoint(&self.sink);
        let mut events = Vec::new();
        if may_split {
            if let Some((at, answer)) = self.leaves_live_line(&st, req) {
                let seqs = answer.map(|a| st.give_away(a)).unwrap_or_default();
                if !seqs.is_empty() {
                    events.push(Event::Hide {
                        session: st.meta.id.clone(),
                        seqs,
                    });
                }
                st.hold(ticket, events, before);
                return Run::Sibling { at };
            }
        }
        st.recall_tool = self.recall_tool;
        let events = &mut events;
        let cold = cold_on_arrival(&mut st, req, self.now_ms());
        let boundary = self.record(&mut st, req, events);
        let client = client_change(&mut st, req, &mut before);
        let step = st.step;
        st.step_opened(step);
        let cut_before = st.recorded_cut;
        let line = self.run_tideline(&mut st, req, parsed, boundary, cold);
        record_line(&mut st, events, self.now_ms());
        let pointers_before = st.compress.generation;
        let window = self.window(&mut st, req, parsed, line, events, peek);
        let media = st.sent_media(parsed.messages.len(), window.media_out);
        let edit = window.sent.as_ref().map_or(0, |s| s.edit);
        let changes = Changes {
            cut: window.upto > cut_before,
            // A new pruned set (a masking event) rewrites the window from
            // its first new pointer, as an edit does.
            edit: std::mem::replace(&mut st.cache.edit, edit) != edit
                || st.compress.generation != pointers_before,
            client,
            cold,
        };
        if changes.cut || changes.edit {
            st.cache.events += 1;
        }
        if changes.cut && cold.is_some() {
            self.metrics.cold_cuts.fetch_add(1, Ordering::Relaxed);
            tracing::info!(session = %st.meta.id, upto_seq = window.upto, cold = cold.map_or("", |c| c.label()), "the cut landed on a request whose prompt cache was cold: it cost no extra cache write");
        }
        st.hold(ticket, std::mem::take(events), before);
        Run::Done {
            step,
            boundary,
            window: Box::new(window),
            media,
            cache: Box::new(changes),
        }
    }

    /// Where a request leaves a line that is still live (a step in flight,
    /// or answered within [`Settings::live_window`](super::Settings)): the
    /// last row both share and the unechoed answer it continues with. Only
    /// for a client that names no session (its key is the fingerprint of
    /// the opening): a named session is one conversation, so leaving its
    /// line is always a rewind.
    fn leaves_live_line(&self, st: &State, req: &Request<'_>) -> Option<(u64, Option<usize>)> {
        let window = i64::try_from(self.settings.live_window.as_millis()).unwrap_or(i64::MAX);
        if req.ident.client_key.is_some()
            || req.stateful
            || st.dialect != req.dialect
            || !st.live(self.now_ms(), window)
        {
            return None;
        }
        st.divergence(req.messages, &req.hashes)
    }

    /// Phase 3: the session's facts, a new step, and the request's history
    /// mapped onto the active line (confirmed echoes, a branch, new rows).
    /// Returns the last seq before this step's new rows.
    fn record(&self, st: &mut State, req: &Request<'_>, events: &mut Vec<Event>) -> u64 {
        st.meta.model.clone_from(&req.model);
        st.meta.last_ms = self.now_ms();
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
        if req.stateful {
            st.append_stateful(req.messages, req.body, events);
        } else {
            st.absorb(req.messages, &req.hashes, req.body, events);
        }
        for ev in events.iter() {
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
        boundary
    }

    /// Phase 4: the line in force, and the tideline's decision on the
    /// gauge (last real usage + the estimate of what was added since).
    /// Returns the parameters and, when this request cut, the gauge before.
    fn run_tideline(
        &self,
        st: &mut State,
        req: &Request<'_>,
        parsed: &ParsedBody<'_>,
        boundary: u64,
        cold: Option<cache::Cold>,
    ) -> (Params, Option<u64>) {
        let limits_model = if req.ident.context_1m && !req.model.contains("[1m]") {
            format!("{}[1m]", req.model)
        } else {
            req.model.clone()
        };
        let (params, calc, spec) = self.params(st, &limits_model, req.max_tokens);
        if calc.clamped && st.meter.line != calc.line {
            tracing::info!(session = %st.meta.id, line = calc.line, "tideline clamped to the model's context minus the output allowance");
        }
        // A conversation held by the provider (`previous_response_id`) is
        // never windowed; a string input is one message, recorded but not cut.
        // The gauge before this request's cut, if it made one.
        let mut cut_gauge = None;
        if self.settings.tideline_enabled && !req.stateful {
            let last_seq = st.active.last().copied().unwrap_or(0);
            // What precedes the latest server-side compaction block the
            // provider drops anyway: the window may start at the block.
            let floor = st.compaction_floor();
            st.tideline.drop_through(floor);
            let cut_before = st.tideline.cut_upto();
            // A restored session knows its last real usage; otherwise the row
            // estimates are all there is (seeding).
            // With compress, plus the saved estimate of the pointers the
            // last window sent: the gauge measures the uncompressed window.
            let measured = st
                .last_usage
                .map(|u| u.window_total() + st.pending_est + st.compress.saved);
            let obs = Observation {
                gauge: measured.unwrap_or(0),
                added: st.pending_est,
                boundary_seq: boundary,
                last_seq,
            };
            let seed = (st.needs_seed || measured.is_none()).then(|| st.seed_rows());
            st.needs_seed = false;
            // ledger.compress with `free`: masking is the first tier of a cut.
            let c = &self.settings.compress;
            let cp = c.first().then(|| oceancode_window::compress::Params {
                protect: c.protect_tokens(params.line),
                min_tokens: c.min_tokens,
            });
            let mut tl = std::mem::take(&mut st.tideline);
            let decision = {
                let st: &State = st;
                match cp {
                    Some(cp) => {
                        let mut all = super::compress::eligible(st, parsed, cp);
                        let mask = tideline::Mask {
                            saved: st.compress.saved,
                            free: c.free_tokens(params.line),
                            all: &mut all,
                        };
                        match &seed {
                            Some(rows) => tl.seed_masked(rows, obs, params, mask),
                            None => tl.observe_masked(obs, params, mask),
                        }
                    }
                    None => match &seed {
                        Some(rows) => tl.seed(rows, obs, params),
                        None => tl.observe(obs, params),
                    },
                }
            };
            st.tideline = tl;
            st.compress.due = decision.masked;
            // The prompt cache is cold: the whole prefix is written anyway,
            // so a cut now costs nothing (the due one, or the open block's
            // oldest rows down to what a due cut keeps).
            let cut = decision.cut.or_else(|| {
                (self.settings.cold_cut && cold.is_some() && req.windowed(true))
                    .then(|| {
                        let ests = st.seed_rows();
                        st.tideline.cut_cold(boundary, params, ests)
                    })
                    .flatten()
            });
            st.meter.gauge = st.tideline.gauge();
            if let Some(cut) = cut.filter(|c| c.upto_seq > cut_before) {
                cut_gauge = Some(cut.gauge_before);
            }
        }
        st.meter.line = params.line;
        st.meter.spec = Some(spec);
        st.meter.block = params.block;
        st.meter.context = calc.context;
        st.meter.steps = st.step;
        st.meter.active_rows = st.active.len();
        (params, cut_gauge)
    }

    /// Phase 5: the window for the session's cut; a cut is recorded when the
    /// window it renders leaves out more rows (by this request's tideline,
    /// or by an earlier `tideline now`).
    fn window(
        &self,
        st: &mut State,
        req: &Request<'_>,
        parsed: &ParsedBody<'_>,
        (params, cut_gauge): (Params, Option<u64>),
        events: &mut Vec<Event>,
        peek: Option<super::context::Peek>,
    ) -> Window {
        let mut window = if req.windowed(self.settings.tideline_enabled) {
            st.context.seq_tags = self.settings.seq_tags;
            // The agent's edit of its context file, read first (a stat when none).
            let edit = super::context::read_edit(st, parsed, peek);
            self.at_cut(st, parsed, params.line);
            let w = window::render(&self.settings, st, parsed);
            super::context::settle(&self.settings, st, parsed, edit, w, events)
        } else {
            Window::unchanged(parsed.messages.len())
        };
        let n = parsed.messages.len();
        window.sent = Some(Box::new(super::sent::record(st, &window, n, req.stateful)));
        super::context::remember(st, &mut window);
        let cut = window.upto > st.recorded_cut;
        if cut {
            window.cut_rows = st.rows_between(st.recorded_cut, window.upto);
            let gauge = cut_gauge.unwrap_or(st.meter.gauge);
            events.push(self.record_cut(st, window.upto, gauge, params.line));
        }
        stages::record_and_meter(stages::ORDER, st, &mut window, cut, &self.metrics);
        window
    }

    /// Before the window: each stage's `at_cut` (compress chooses its
    /// pruned set again when the window's start moved; between cuts it stays).
    pub(super) fn at_cut(&self, st: &mut State, parsed: &ParsedBody<'_>, line: u64) {
        let cx = stages::AtCut {
            parsed,
            line,
            settings: &self.settings,
            locator: self.locator.as_ref(),
            metrics: &self.metrics,
        };
        stages::at_cut(stages::ORDER, st, &cx);
    }

    /// The line and block for a session and model.
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
        let mut calc =
            tideline::effective_line(spec, limits.context, limits.max_output, max_tokens);
        if let (true, Some(context), Some(reserved)) =
            (st.reserves_max_tokens, limits.context, max_tokens)
        {
            // Input and the whole `max_tokens` must fit (the client's
            // `max_tokens` is never changed).
            let room = context.saturating_sub(reserved).max(1);
            if calc.line > room {
                calc.line = room;
                calc.clamped = true;
            }
        }
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

    /// The `Cut` event for a window that now leaves out every row up to
    /// `upto` (counted in the meter and the metrics).
    pub(super) fn record_cut(&self, st: &mut State, upto: u64, gauge: u64, line: u64) -> Event {
        self.metrics.cuts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(session = %st.meta.id, upto_seq = upto, gauge, line, "cut: the rows up to seq {upto} leave the window");
        st.meter.cuts += 1;
        let before = st.recorded_cut;
        st.meter.last_cut = Some(crate::telemetry::CutNote {
            step: st.step,
            upto_seq: upto,
            rows: st
                .active
                .iter()
                .filter(|&&s| s > before && s <= upto)
                .count() as u64,
            gauge,
            line,
            at: std::time::SystemTime::now(),
        });
        st.recorded_cut = upto;
        st.meter.cut_upto = upto;
        Event::Cut {
            session: st.meta.id.clone(),
            upto_seq: upto,
            gauge,
            line,
            ts_ms: self.now_ms(),
        }
    }

    /// `count_tokens`: windowed like the conversation it counts (the
    /// session whose whole active line it starts with), never recorded.
    fn prepare_count(&self, req: &Request<'_>, parsed: &ParsedBody<'_>, body: &Bytes) -> Prepared {
        for s in self.candidates(&req.key) {
            let st = s.state.lock();
            if st.dialect != req.dialect || req.messages.len() < 2 {
                continue;
            }
            // The count may carry new messages after the recorded ones.
            if !st.active.is_empty() && st.lcp(req.messages, &req.hashes) == st.active.len() {
                let w = window::render(&self.settings, &st, parsed);
                if let Some(b) = w.body {
                    return Prepared::forward(Bytes::from(b));
                }
            }
        }
        if self.recall_tool {
            // Counted with the tool the conversation's requests carry.
            return Prepared::forward(Bytes::from(parsed.render_with(&parsed.messages)));
        }
        Prepared::forward(body.clone())
    }
}

/// A `Line` event when the line in force or the session's override differs
/// from the one last recorded (the first request, an override, a learned
/// ceiling): what `status` shows once no running proxy holds the session,
/// and the override a restarted proxy (or the one taking the session over)
/// keeps.
fn record_line(st: &mut State, events: &mut Vec<Event>, now_ms: i64) {
    let Some(spec) = st.meter.spec else { return };
    let overridden = st
        .override_line
        .and_then(|o| serde_json::to_string(&o).ok());
    let now = (st.meter.line, super::line_label(spec), overridden);
    if st.recorded_line.as_ref() == Some(&now) {
        return;
    }
    events.push(Event::Line {
        session: st.meta.id.clone(),
        line: now.0,
        spec: now.1.clone(),
        overridden: now.2.clone(),
        ts_ms: now_ms,
    });
    st.recorded_line = Some(now);
}
