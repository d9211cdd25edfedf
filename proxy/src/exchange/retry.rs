//! The too-long branch: an answer saying the window is over the model's
//! context (a 400/413 error, or a Responses stream failing with
//! `context_length_exceeded` before any output). Nothing reached the
//! client: every closed block is cut and the request sent once more
//! ([`retry_after_cut`], which the recall loop uses too).

use super::relay::tap_response;
use super::{failed, meter_headers, relay_head, send};
use crate::app::App;
use crate::dialect::{self, Collected};
use crate::error::{full, ProxyBody, ProxyError};
use crate::overflow::{self, Opening};
use crate::sessions::{StepError, Ticket};
use crate::tap::Framing;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use oceancode_window::Dialect;
use std::sync::Arc;

/// Every closed block of `ticket`'s session cut (under `ceiling`, the
/// model's context when the upstream named it), the client's request
/// rendered again, and `hidden` (the recall loop's exchange so far)
/// appended to its conversation. None: nothing left to cut (or a body
/// the proxy cannot append to). The one place a retry is built.
pub(crate) fn retry_after_cut(
    app: &App,
    ticket: &mut Ticket,
    ceiling: Option<u64>,
    hidden: &[String],
) -> Option<Bytes> {
    let sessions = app.sessions.clone();
    let body = crate::cpu::run(|| sessions.too_long(ticket, ceiling))?;
    if hidden.is_empty() {
        return Some(body);
    }
    append(ticket.dialect, &body, hidden)
}

/// The request body `sent` with `extra` appended to its conversation
/// (None: a body with no conversation to append to).
pub(super) fn append(d: Dialect, sent: &[u8], extra: &[String]) -> Option<Bytes> {
    let parsed = dialect::ParsedBody::parse(sent, dialect::conv_key(d)).ok()?;
    parsed.conv_field?;
    let mut parts: Vec<&str> = parsed.messages.clone();
    parts.extend(extra.iter().map(String::as_str));
    Some(Bytes::from(parsed.render_with(&parts)))
}

/// How much of a 400/413 answer is read to tell a too-long error (they are
/// small); a longer answer is relayed as it comes, whatever its size.
pub(crate) const ERROR_PEEK: usize = 1 << 20;

/// The too-long branch: a 400/413 answer. Its (small) body is read; a
/// context-limit error has every closed block cut and the request sent
/// once more (through the recall loop when the tool is on); anything else
/// is relayed unchanged.
pub(super) async fn too_long_path(
    app: &Arc<App>,
    parts: &http::request::Parts,
    uri: http::Uri,
    base: String,
    resp: Response<Incoming>,
    mut ticket: Ticket,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (head, mut body) = resp.into_parts();
    let status = head.status.as_u16();
    let encoded = head.headers.contains_key(header::CONTENT_ENCODING);
    let mut read: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let e = ProxyError::Unreachable {
                    upstream: base.clone(),
                    reason: format!("error body could not be read: {e}"),
                };
                ticket.fail(e.status().as_u16(), StepError::Stream);
                return Err(e);
            }
        };
        if let Ok(d) = frame.into_data() {
            read.extend_from_slice(&d);
            if read.len() > ERROR_PEEK {
                // Not a too-long error: relay it unchanged, read so far + the rest.
                let rest = overflow::Held::new(Bytes::from(read), body);
                return Ok(tap_response(app, ticket.dialect, Some(ticket), head, rest));
            }
        }
    }
    let bytes = Bytes::from(read);
    // Nothing was cut for the error relayed: the meter as prepared.
    let (session, meter) = (ticket.session.id.clone(), ticket.meter);
    let relay = |bytes: Bytes| -> Result<Response<ProxyBody>, ProxyError> {
        meter_headers(relay_head(&head), &session, meter)
            .body(full(bytes))
            .map_err(|e| ProxyError::BadTarget(e.to_string()))
    };
    let limit = if encoded {
        None
    } else {
        overflow::context_limit(ticket.dialect, &bytes)
    };
    let Some(limit) = limit else {
        ticket.complete(status, true, &Collected::default());
        return relay(bytes);
    };
    let ceiling = limit.ceiling;
    app.sessions.learn_limit(&ticket, limit);
    let Some(new_body) = retry_after_cut(app, &mut ticket, ceiling, &[]) else {
        tracing::info!(session = %ticket.session.id, "too long, and nothing left to cut: relaying the error");
        ticket.complete(status, true, &Collected::default());
        return relay(bytes);
    };
    tracing::info!(session = %ticket.session.id, ?ceiling, "too long: cut every closed block, retrying once");
    let resp = match send(app, parts, &uri, &base, &new_body).await {
        Ok(r) => r,
        Err(e) => return Err(failed(Some(ticket), e)),
    };
    if app.cfg.recall.enabled && resp.status() == StatusCode::OK {
        // The retry's answer goes through the recall loop like any other.
        return super::recall::answer(app, parts, uri, base, new_body, resp, ticket, true).await;
    }
    let (head, body) = resp.into_parts();
    Ok(tap_response(app, ticket.dialect, Some(ticket), head, body))
}

/// A Responses stream worth reading the opening of before relaying it: a
/// plain SSE answer of a step a retry could cut.
pub(super) fn holds_opening(app: &App, t: &Ticket, h: &http::HeaderMap) -> bool {
    t.dialect == Dialect::OpenaiResponses
        && Framing::from_content_type(h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()))
            == Framing::Sse
        && h.get(header::CONTENT_ENCODING)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"))
        && app.sessions.can_cut(t)
}

/// A Responses stream that may fail with `context_length_exceeded` inside
/// its 200: its opening events are held back (at most
/// [`overflow::OPENING_HOLD`]); a failure before any output is answered like
/// the 400 (cut every closed block, retry once, the failed stream dropped);
/// anything else is relayed, held bytes first.
pub(super) async fn overflow_in_stream_path(
    app: &Arc<App>,
    parts: &http::request::Parts,
    uri: http::Uri,
    base: String,
    resp: Response<Incoming>,
    mut ticket: Ticket,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (head, body) = resp.into_parts();
    let (opening, held) = overflow::hold_opening(body, overflow::OPENING_HOLD).await;
    if opening == Opening::Overflow {
        if let Some(new_body) = retry_after_cut(app, &mut ticket, None, &[]) {
            tracing::info!(session = %ticket.session.id, "context_length_exceeded inside the stream, before any output: cut every closed block, retrying once");
            drop(held);
            let (head, body) = match send(app, parts, &uri, &base, &new_body).await {
                Ok(r) => r.into_parts(),
                Err(e) => return Err(failed(Some(ticket), e)),
            };
            return Ok(tap_response(app, ticket.dialect, Some(ticket), head, body));
        }
        tracing::info!(session = %ticket.session.id, "context_length_exceeded inside the stream, and nothing left to cut: relaying it");
    }
    Ok(tap_response(app, ticket.dialect, Some(ticket), head, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn too_long_ceiling(dialect: Dialect, body: &[u8]) -> Option<Option<u64>> {
        overflow::context_limit(dialect, body).map(|l| l.ceiling)
    }

    #[test]
    fn too_long_errors_are_recognised() {
        let a = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert_eq!(too_long_ceiling(Dialect::Anthropic, a), Some(Some(200_000)));
        let o = br#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(
            too_long_ceiling(Dialect::OpenaiChat, o),
            Some(Some(128_000))
        );
        let other = br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: field required"}}"#;
        assert_eq!(too_long_ceiling(Dialect::Anthropic, other), None);
    }
}
