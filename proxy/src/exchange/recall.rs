//! The recall branch: the in-band recall tool's internal loop on the
//! request path ([`crate::recall_tool`] holds the tool itself). The answer of a request carrying
//! the tool is read whole (nothing reaches the client yet); when the model
//! called `oceancode_recall`, the proxy runs the recall against the ledger
//! and sends the continuation (the request, the model's answer, the
//! results), at most `max_rounds` times; the client gets the last answer,
//! as the upstream sent it, with its status. A continuation that fails
//! (429, 5xx) reaches the client as that status and body, unchanged. An
//! answer that calls client tools too (or past the round limit) goes to the
//! client without its recall calls; their results go with the next request.
//! A context-limit answer on the way (a 400/413 "too long", or a Responses
//! stream failing with `context_length_exceeded` before any output: nothing
//! reached the client, the answer is held) is answered as on the plain
//! path: every closed block cut, the request retried once, the exchange so
//! far appended to the retry.

use super::relay::tap_response;
use super::retry::{append, retry_after_cut};
use crate::app::App;
use crate::dialect::{self, Collected};
use crate::error::{ProxyBody, ProxyError};
use crate::recall_tool::{calls, search, strip};
use crate::sessions::{StepError, Ticket};
use crate::sse::SseParser;
use crate::tap::Framing;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use oceancode_window::{Dialect, InternalRecall, Usage};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What reading a held answer gave.
enum Read {
    /// The whole answer.
    Whole(Bytes),
    /// Longer than the proxy keeps of one answer: relayed as it comes.
    Over(crate::overflow::Held<Incoming>),
    /// The upstream broke off (or went silent) before the end.
    Failed(String),
}

async fn read_whole(mut body: Incoming, limit: usize, idle: std::time::Duration) -> Read {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Read::Failed("the upstream went silent".into()),
            Ok(None) => return Read::Whole(Bytes::from(buf)),
            Ok(Some(Err(e))) => return Read::Failed(e.to_string()),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(d) = frame.into_data() {
            buf.extend_from_slice(&d);
            if buf.len() > limit {
                return Read::Over(crate::overflow::Held::new(Bytes::from(buf), body));
            }
        }
    }
}

/// What the dialect's collector makes of a whole answer.
pub fn collect(d: Dialect, sse: bool, bytes: &[u8]) -> Collected {
    let mut c = dialect::collector(d);
    if sse {
        let mut p = SseParser::new();
        p.feed(bytes, &mut |ev| c.on_event(&ev.event, &ev.data));
        p.finish(&mut |ev| c.on_event(&ev.event, &ev.data));
    } else {
        c.on_json(bytes);
    }
    c.finish()
}

/// Run the recall calls on a blocking thread (SQLite).
async fn run_calls(app: &Arc<App>, session: &str, cs: &[calls::Call]) -> Vec<String> {
    let Some(store) = app.store.clone() else {
        return cs
            .iter()
            .map(|_| "oceancode_recall: the ledger is off on this proxy".to_string())
            .collect();
    };
    let session = session.to_string();
    let inputs: Vec<String> = cs.iter().map(|c| c.input.clone()).collect();
    let n = inputs.len();
    let all = app.cfg.recall.search_all;
    tokio::task::spawn_blocking(move || {
        inputs
            .iter()
            .enumerate()
            .map(|(k, i)| {
                if k < search::MAX_CALLS {
                    search::run(store.as_ref(), &session, i, all)
                } else {
                    search::not_run()
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_else(|e| vec![format!("oceancode_recall: the recall failed ({e})"); n])
}

/// The answer of a request that carries the tool (status 200 from the
/// upstream): the internal loop, then the client's answer. `retried`: the
/// request's one too-long retry is spent.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn answer(
    app: &Arc<App>,
    parts: &http::request::Parts,
    uri: http::Uri,
    base: String,
    sent: Bytes,
    resp: Response<Incoming>,
    mut ticket: Ticket,
    mut retried: bool,
) -> Result<Response<ProxyBody>, ProxyError> {
    let d = ticket.dialect;
    let max_rounds = app.cfg.recall.max_rounds;
    let limit = app.cfg.net.tap.max_kept;
    let mut sent = sent;
    let mut resp = resp;
    let mut round = 1u32;
    let mut recalls: Vec<InternalRecall> = Vec::new();
    let mut billed = Usage::default();
    let mut hidden: Vec<String> = Vec::new();
    loop {
        let (mut head, body) = resp.into_parts();
        let identity = head
            .headers
            .get(header::CONTENT_ENCODING)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let framing = Framing::from_content_type(
            head.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
        );
        let too_long =
            head.status == StatusCode::BAD_REQUEST || head.status == StatusCode::PAYLOAD_TOO_LARGE;
        if too_long && identity && !retried {
            // A continuation over the context: read the (small) error.
            app.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
            let bytes =
                match read_whole(body, super::retry::ERROR_PEEK, app.cfg.idle_stream_timeout).await
                {
                    Read::Whole(b) => b,
                    Read::Over(held) => {
                        ticket.note_internal(recalls, billed, sent.len());
                        return Ok(tap_response(app, d, Some(ticket), head, held));
                    }
                    Read::Failed(reason) => {
                        ticket.note_internal(recalls, billed, sent.len());
                        ticket.fail(StatusCode::BAD_GATEWAY.as_u16(), StepError::Stream);
                        return Err(ProxyError::Unreachable {
                            upstream: base,
                            reason: format!("error body could not be read: {reason}"),
                        });
                    }
                };
            let limit = crate::overflow::context_limit(d, &bytes);
            if let Some(l) = limit {
                app.sessions.learn_limit(&ticket, l);
            }
            let next = limit.and_then(|l| retry_after_cut(app, &mut ticket, l.ceiling, &hidden));
            let Some(next) = next else {
                ticket.note_internal(recalls, billed, sent.len());
                return Ok(tap_response(app, d, Some(ticket), head, Full::new(bytes)));
            };
            tracing::info!(session = %ticket.session.id, round, "recall tool: too long, cut every closed block, retrying once");
            retried = true;
            sent = next;
            resp = match super::send(app, parts, &uri, &base, &sent).await {
                Ok(r) => r,
                Err(e) => return Err(lost(ticket, recalls, billed, sent.len(), e)),
            };
            continue;
        }
        if head.status == StatusCode::OK && (!identity || framing == Framing::Opaque) {
            // Compressed though the proxy asked for plain bytes, or neither
            // JSON nor an event stream: its calls cannot be read, so it must
            // not reach the client (it may hold the internal call).
            let reason = if identity {
                "the answer is neither JSON nor an event stream (its content type)"
            } else {
                "the answer came compressed"
            };
            return Err(unreadable(
                app,
                ticket,
                recalls,
                billed,
                sent.len(),
                reason.into(),
            ));
        }
        if head.status != StatusCode::OK || framing == Framing::Opaque {
            // A continuation's error, as the upstream sent it (never a 200
            // the client would not retry); or an answer the proxy cannot read.
            if head.status.is_client_error() || head.status.is_server_error() {
                app.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
            }
            ticket.note_internal(recalls, billed, sent.len());
            return Ok(tap_response(app, d, Some(ticket), head, body));
        }
        let sse = framing == Framing::Sse;
        let bytes = match read_whole(body, limit, app.cfg.idle_stream_timeout).await {
            Read::Whole(b) => b,
            Read::Over(_) => {
                // Fail closed: an answer the proxy cannot read whole may
                // hold the internal call, so none of it is relayed.
                return Err(unreadable(
                    app,
                    ticket,
                    recalls,
                    billed,
                    sent.len(),
                    format!("the answer is longer than the {limit} bytes the proxy holds (limits.max_recorded_response_bytes)"),
                ));
            }
            Read::Failed(reason) => {
                app.metrics.streams_cut.fetch_add(1, Ordering::Relaxed);
                ticket.note_internal(recalls, billed, sent.len());
                ticket.fail(StatusCode::BAD_GATEWAY.as_u16(), StepError::Stream);
                return Err(ProxyError::Unreachable {
                    upstream: base,
                    reason: format!("the answer broke off before its end: {reason}"),
                });
            }
        };
        if !retried
            && d == Dialect::OpenaiResponses
            && sse
            && crate::overflow::failed_before_output(&bytes)
        {
            // `context_length_exceeded` inside the 200, before any output:
            // the client has seen nothing; cut and retry once.
            if let Some(next) = retry_after_cut(app, &mut ticket, None, &hidden) {
                tracing::info!(session = %ticket.session.id, round, "recall tool: context_length_exceeded inside the stream, cut every closed block, retrying once");
                retried = true;
                sent = next;
                resp = match super::send(app, parts, &uri, &base, &sent).await {
                    Ok(r) => r,
                    Err(e) => return Err(lost(ticket, recalls, billed, sent.len(), e)),
                };
                continue;
            }
        }
        let collected = collect(d, sse, &bytes);
        let found = calls::find(d, &collected.rows);
        if found.recall.is_empty() || collected.error.is_some() || !collected.terminal {
            return Ok(finish(
                app,
                ticket,
                head,
                bytes,
                false,
                recalls,
                billed,
                hidden,
                sent.len(),
            ));
        }
        let texts = run_calls(app, &ticket.session.id, &found.recall).await;
        app.metrics
            .recalls
            .fetch_add(found.recall.len() as u64, Ordering::Relaxed);
        let cont = found.client == 0 && round <= max_rounds;
        let msgs = if cont {
            calls::continuation(d, &collected.rows, &found.recall, &texts)
        } else {
            calls::hidden_pair(d, &found.recall, &texts)
        };
        for (i, (c, t)) in found.recall.iter().zip(&texts).enumerate() {
            recalls.push(InternalRecall {
                round,
                call_id: c.id.clone(),
                input: c.input.clone(),
                result_chars: t.chars().count() as u64,
                continued: cont,
                messages: if i == 0 { msgs.clone() } else { Vec::new() },
                after: None,
            });
        }
        let next = if cont { append(d, &sent, &msgs) } else { None };
        let Some(next) = next else {
            // The client gets the rest of this answer; the calls and their
            // results follow its row in the next request.
            tracing::debug!(session = %ticket.session.id, round, client_calls = found.client, "recall tool: answered, the rest goes to the client");
            hidden.extend(msgs);
            let out = strip::strip(d, sse, &bytes, found.client);
            head.headers.remove(header::CONTENT_LENGTH);
            return Ok(finish(
                app,
                ticket,
                head,
                Bytes::from(out),
                true,
                recalls,
                billed,
                hidden,
                sent.len(),
            ));
        };
        tracing::debug!(session = %ticket.session.id, round, calls = found.recall.len(), "recall tool: answered, continuing");
        hidden.extend(msgs);
        billed = billed.plus(
            collected
                .usage
                .unwrap_or_default()
                .plus(collected.detail.extra),
        );
        sent = next;
        ticket.trace_child(crate::telemetry::Child::Recall {
            round,
            calls: found.recall.len() as u32,
        });
        resp = match super::send(app, parts, &uri, &base, &sent).await {
            Ok(r) => r,
            Err(e) => return Err(lost(ticket, recalls, billed, sent.len(), e)),
        };
        round += 1;
    }
}

/// The upstream could not be reached for the loop: the step ends failed,
/// its recalls noted.
fn lost(
    mut ticket: Ticket,
    recalls: Vec<InternalRecall>,
    billed: Usage,
    sent_len: usize,
    e: ProxyError,
) -> ProxyError {
    ticket.note_internal(recalls, billed, sent_len);
    ticket.fail(e.status().as_u16(), StepError::Unreachable);
    e
}

/// An answer the loop cannot read whole (too long, compressed): the client
/// gets a 502 in the provider's format instead of it, the step ends failed.
fn unreadable(
    app: &Arc<App>,
    mut ticket: Ticket,
    recalls: Vec<InternalRecall>,
    billed: Usage,
    sent_len: usize,
    reason: String,
) -> ProxyError {
    tracing::warn!(session = %ticket.session.id, %reason, "recall tool: the answer could not be read whole; not relayed");
    app.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
    ticket.note_internal(recalls, billed, sent_len);
    let e = ProxyError::RecallUnreadable(reason);
    ticket.fail(e.status().as_u16(), StepError::Stream);
    e
}

/// The client's answer: `bytes` through the tap (which records it), the
/// internal exchange kept for the next requests.
#[allow(clippy::too_many_arguments)]
fn finish(
    app: &Arc<App>,
    mut ticket: Ticket,
    mut head: http::response::Parts,
    bytes: Bytes,
    changed: bool,
    mut recalls: Vec<InternalRecall>,
    billed: Usage,
    hidden: Vec<String>,
    sent_len: usize,
) -> Response<ProxyBody> {
    if changed {
        head.headers.remove(header::CONTENT_LENGTH);
    }
    if !hidden.is_empty() {
        // Recorded where it goes, so a restart puts it back there.
        for r in &mut recalls {
            r.after = Some(ticket.tail_seq);
        }
        ticket.keep_hidden(hidden);
    }
    ticket.note_internal(recalls, billed, sent_len);
    let d = ticket.dialect;
    tap_response(app, d, Some(ticket), head, Full::new(bytes))
}
