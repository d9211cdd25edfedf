//! Context-limit failures the proxy answers with a cut and one retry.
//!
//! * Error bodies ([`context_limit`]): Anthropic `prompt is too long: N tokens
//!   > M maximum` and `input length and `max_tokens` exceed context limit: N
//!   + T > M, …` (the limit counts the request's `max_tokens` too), OpenAI
//!   `context_length_exceeded`. The last number is the context window learned.
//! * A Responses stream that fails inside its 200 (`response.failed` with
//!   `context_length_exceeded`, what Codex turns into `turn.failed`):
//!   [`hold_opening`] holds back only the stream's opening events
//!   (`response.created`, `response.in_progress`) until the first other event,
//!   [`OPENING_HOLD`] or [`OPENING_HOLD_BYTES`], whichever comes first, so a
//!   failure before any output can be retried without the client having seen
//!   anything; everything else is relayed as it comes.

use crate::sse::SseParser;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use oceancode_window::Dialect;
use serde_json::Value;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

pub use oceancode_window::dialect::ContextLimit;

/// Recognise a context-limit error body of `dialect` (its
/// [`oceancode_window::dialect::DialectSpec::context_limit`]).
pub fn context_limit(dialect: Dialect, body: &[u8]) -> Option<ContextLimit> {
    let v: Value = serde_json::from_slice(body).ok()?;
    oceancode_window::dialect::spec(dialect).context_limit(&v)
}

/// How long a Responses stream's opening events may be held back.
pub const OPENING_HOLD: Duration = Duration::from_millis(300);

/// How many bytes of opening events may be held back (they are a few hundred).
pub const OPENING_HOLD_BYTES: usize = 64 << 10;

/// What the opening of a Responses stream showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// It failed with `context_length_exceeded` before any output event.
    Overflow,
    /// Anything else: an output event came, the hold ran out, or it ended.
    Relay,
}

/// The event's `type` and, for a `response.failed`, its error code.
fn kind_of(data: &str) -> (String, Option<String>) {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let ty = v
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let code = v
        .pointer("/response/error/code")
        .and_then(Value::as_str)
        .map(str::to_string);
    (ty, code)
}

/// Read the opening of a Responses stream: its `response.created` /
/// `response.in_progress` events, until another event, the body's end or
/// error, [`OPENING_HOLD`] or [`OPENING_HOLD_BYTES`]. Returns what it showed
/// and the body to relay (what was read, then the rest, unchanged).
pub async fn hold_opening<B>(mut body: B, hold: Duration) -> (Opening, Held<B>)
where
    B: Body<Data = Bytes> + Unpin,
{
    let deadline = tokio::time::Instant::now() + hold;
    let mut parser = SseParser::with_limit(OPENING_HOLD_BYTES);
    let mut read: Vec<u8> = Vec::new();
    let mut failed = None;
    let mut opening = Opening::Relay;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) | Ok(None) => break,
            Ok(Some(Err(e))) => {
                failed = Some(e);
                break;
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read.extend_from_slice(&data);
        let mut past_opening = false;
        parser.feed(&data, &mut |ev| {
            if past_opening {
                return;
            }
            match kind_of(&ev.data) {
                (t, _) if t == "response.created" || t == "response.in_progress" => {}
                (t, Some(code)) if t == "response.failed" && code == "context_length_exceeded" => {
                    opening = Opening::Overflow;
                    past_opening = true;
                }
                _ => past_opening = true,
            }
        });
        if past_opening || read.len() > OPENING_HOLD_BYTES {
            break;
        }
    }
    let held = Held {
        head: (!read.is_empty()).then(|| Bytes::from(read)),
        failed,
        inner: body,
        done: false,
    };
    (opening, held)
}

/// Whether a whole Responses stream (an answer held whole, the recall
/// tool's) failed with `context_length_exceeded` before any output event:
/// what [`hold_opening`] tells of its opening.
pub fn failed_before_output(stream: &[u8]) -> bool {
    let mut parser = SseParser::new();
    let mut verdict = None;
    let mut see = |data: &str| {
        if verdict.is_some() {
            return;
        }
        match kind_of(data) {
            (t, _) if t == "response.created" || t == "response.in_progress" => {}
            (t, Some(code)) if t == "response.failed" && code == "context_length_exceeded" => {
                verdict = Some(true);
            }
            _ => verdict = Some(false),
        }
    };
    parser.feed(stream, &mut |ev| see(&ev.data));
    parser.finish(&mut |ev| see(&ev.data));
    verdict == Some(true)
}

/// A body whose first bytes (and possibly its error) were already read:
/// `head`, then `failed` or the rest of `inner`.
pub struct Held<B: Body> {
    head: Option<Bytes>,
    failed: Option<B::Error>,
    inner: B,
    done: bool,
}

impl<B: Body> Held<B> {
    /// `head` read already, `inner` the rest.
    pub fn new(head: Bytes, inner: B) -> Self {
        Held {
            head: Some(head),
            failed: None,
            inner,
            done: false,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Held<B>
where
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(h) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(h))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Poll::Ready(Some(Err(e)));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.failed.is_none() && (self.done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let n = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let inner = self.inner.size_hint();
        let mut h = SizeHint::new();
        h.set_lower(inner.lower() + n);
        if let Some(u) = inner.upper() {
            h.set_upper(u + n);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;

    #[test]
    fn every_context_limit_error_is_recognised_with_its_ceiling() {
        let a = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert_eq!(
            context_limit(Dialect::Anthropic, a),
            Some(ContextLimit {
                ceiling: Some(200_000),
                counts_max_tokens: false
            })
        );
        let m = br#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"},"request_id":"req_011"}"#;
        assert_eq!(
            context_limit(Dialect::Anthropic, m),
            Some(ContextLimit {
                ceiling: Some(200_000),
                counts_max_tokens: true
            })
        );
        let o = br#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(
            context_limit(Dialect::OpenaiChat, o).and_then(|l| l.ceiling),
            Some(128_000)
        );
        let r = br#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#;
        assert_eq!(
            context_limit(Dialect::OpenaiResponses, r),
            Some(ContextLimit {
                ceiling: None,
                counts_max_tokens: false
            })
        );
        for other in [
            &br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: field required"}}"#[..],
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 300000 > 128000, which is the maximum allowed number of output tokens for claude-opus-4-6"}}"#,
            b"not json",
        ] {
            assert_eq!(context_limit(Dialect::Anthropic, other), None);
        }
    }

    fn body_of(events: &[&str]) -> impl Body<Data = Bytes, Error = Infallible> + Unpin + use<> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = events
            .iter()
            .map(|e| Ok(Frame::data(Bytes::from(format!("event: x\ndata: {e}\n\n")))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    const CREATED: &str = r#"{"type":"response.created","sequence_number":0,"response":{"id":"r","status":"in_progress"}}"#;
    const PROGRESS: &str = r#"{"type":"response.in_progress","sequence_number":1,"response":{"id":"r","status":"in_progress"}}"#;
    const FAILED: &str = r#"{"type":"response.failed","sequence_number":2,"response":{"id":"r","status":"failed","error":{"code":"context_length_exceeded","message":"Your input exceeds the context window of this model. Please adjust your input and try again."},"usage":null}}"#;
    const ADDED: &str = r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"message"}}"#;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_whole_stream_failing_before_output_is_told_from_any_other() {
        let whole = |events: &[&str]| -> Vec<u8> {
            events
                .iter()
                .map(|e| format!("event: x\ndata: {e}\n\n"))
                .collect::<String>()
                .into_bytes()
        };
        assert!(failed_before_output(&whole(&[CREATED, PROGRESS, FAILED])));
        assert!(!failed_before_output(&whole(&[CREATED, ADDED, FAILED])));
        let quota = FAILED.replace("context_length_exceeded", "insufficient_quota");
        assert!(!failed_before_output(&whole(&[CREATED, &quota])));
        assert!(!failed_before_output(&whole(&[CREATED, PROGRESS])));
        assert!(!failed_before_output(b""));
    }

    #[test]
    fn an_overflow_before_any_output_is_seen_and_anything_else_relayed_whole() {
        rt().block_on(async {
            let (o, _) = hold_opening(body_of(&[CREATED, PROGRESS, FAILED]), OPENING_HOLD).await;
            assert_eq!(o, Opening::Overflow);
            // An output event ends the hold: everything is relayed, in order.
            let all = [CREATED, PROGRESS, ADDED, FAILED];
            let (o, held) = hold_opening(body_of(&all), OPENING_HOLD).await;
            assert_eq!(o, Opening::Relay);
            let got = held.collect().await.unwrap().to_bytes();
            let want: String = all
                .iter()
                .map(|e| format!("event: x\ndata: {e}\n\n"))
                .collect();
            assert_eq!(got, Bytes::from(want));
            // A failure of another kind is relayed.
            let quota = FAILED.replace("context_length_exceeded", "insufficient_quota");
            let (o, _) = hold_opening(body_of(&[CREATED, &quota]), OPENING_HOLD).await;
            assert_eq!(o, Opening::Relay);
        });
    }

    #[test]
    fn the_hold_ends_at_its_bound() {
        rt().block_on(async {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            tx.send(Ok(Frame::data(Bytes::from(format!(
                "event: response.created\ndata: {CREATED}\n\n"
            )))))
            .await
            .unwrap();
            let body = StreamBody::new(Box::pin(futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            )));
            let t0 = tokio::time::Instant::now();
            let (o, held) = hold_opening(body, Duration::from_millis(50)).await;
            assert_eq!(o, Opening::Relay);
            assert!(t0.elapsed() < Duration::from_secs(5));
            assert!(held.head.is_some(), "what was read is relayed first");
            drop(tx);
        });
    }
}
