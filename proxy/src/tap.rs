//! The usage tap: an [`http_body::Body`] wrapper around the upstream response
//! that forwards every frame unchanged and, on the side, decodes a copy
//! (gzip/deflate/br/zstd), parses SSE or JSON, and feeds the dialect's
//! collector. It finishes exactly once: at the end of the stream, on an error,
//! or when the client goes away (drop).

use crate::dialect::{Collected, ResponseCollector};
use crate::error::BoxError;
use crate::sse::SseParser;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

/// How the response ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapEnd {
    /// The whole body was forwarded.
    Complete,
    /// The upstream body failed mid-way.
    Error(String),
    /// The client stopped reading (dropped the body) before the end.
    Cancelled,
}

/// What the tap hands over when it finishes.
#[derive(Debug, Clone)]
pub struct TapOutcome {
    /// How it ended.
    pub end: TapEnd,
    /// What the collector gathered.
    pub collected: Collected,
    /// Bytes forwarded (as sent by the upstream, before decoding).
    pub bytes: u64,
}

/// Called exactly once with the outcome.
pub type OnFinish = Box<dyn FnOnce(TapOutcome) + Send>;

/// How to read the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`
    Sse,
    /// A JSON document (buffered copy, up to a cap).
    Json,
    /// Not interpreted.
    Opaque,
}

impl Framing {
    /// From a `Content-Type` header value.
    pub fn from_content_type(ct: Option<&str>) -> Framing {
        let ct = ct.unwrap_or("").to_ascii_lowercase();
        if ct.starts_with("text/event-stream") {
            Framing::Sse
        } else if ct.contains("json") {
            Framing::Json
        } else {
            Framing::Opaque
        }
    }
}

/// Largest JSON copy the tap keeps for a non-streamed body.
const JSON_COPY_CAP: usize = 64 << 20;

enum Decoder {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
    Brotli(Box<brotli::DecompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl Decoder {
    fn for_encoding(enc: Option<&str>) -> Result<Option<Decoder>, ()> {
        let enc = match enc {
            None => return Ok(None),
            Some(e) => e.trim().to_ascii_lowercase(),
        };
        Ok(Some(match enc.as_str() {
            "" | "identity" => return Ok(None),
            "gzip" | "x-gzip" => Decoder::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
            "deflate" => Decoder::Deflate(flate2::write::ZlibDecoder::new(Vec::new())),
            "br" => Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(Vec::new(), 4096))),
            "zstd" => Decoder::Zstd(zstd::stream::write::Decoder::new(Vec::new()).map_err(|_| ())?),
            _ => return Err(()),
        }))
    }

    /// Push compressed bytes, get what decoded so far.
    fn push(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Decoder::Gzip(d) => {
                d.write_all(data)?;
                d.flush()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Deflate(d) => {
                d.write_all(data)?;
                d.flush()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Brotli(d) => {
                d.write_all(data)?;
                d.flush()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Zstd(d) => {
                d.write_all(data)?;
                d.flush()?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }
}

enum Mode {
    Sse(SseParser),
    Json(Vec<u8>),
    Off,
}

struct TapState {
    decoder: Option<Decoder>,
    mode: Mode,
    collector: Box<dyn ResponseCollector>,
    on_finish: OnFinish,
    bytes: u64,
}

impl TapState {
    fn feed(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        if matches!(self.mode, Mode::Off) {
            return;
        }
        let decoded;
        let plain: &[u8] = match self.decoder.as_mut() {
            Some(d) => match d.push(data) {
                Ok(v) => {
                    decoded = v;
                    &decoded
                }
                Err(e) => {
                    tracing::debug!(error = %e, "usage tap: cannot decode the response copy; tap off");
                    self.mode = Mode::Off;
                    return;
                }
            },
            None => data,
        };
        let collector = &mut self.collector;
        match &mut self.mode {
            Mode::Sse(p) => p.feed(plain, &mut |ev| collector.on_event(&ev.event, &ev.data)),
            Mode::Json(buf) => {
                if buf.len() + plain.len() > JSON_COPY_CAP {
                    self.mode = Mode::Off;
                } else {
                    buf.extend_from_slice(plain);
                }
            }
            Mode::Off => {}
        }
    }

    fn finish(mut self, end: TapEnd) {
        if end == TapEnd::Complete {
            let collector = &mut self.collector;
            match &mut self.mode {
                Mode::Sse(p) => p.finish(&mut |ev| collector.on_event(&ev.event, &ev.data)),
                Mode::Json(buf) => collector.on_json(buf),
                Mode::Off => {}
            }
        }
        let collected = self.collector.finish();
        (self.on_finish)(TapOutcome {
            end,
            collected,
            bytes: self.bytes,
        });
    }
}

/// The wrapper. `B` is the upstream body.
pub struct TapBody<B> {
    inner: B,
    state: Option<TapState>,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
}

/// The upstream sent nothing for longer than the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("oceancode-proxy: the upstream sent nothing for {0:?}; stream closed")]
pub struct IdleTimeout(pub Duration);

impl<B> TapBody<B> {
    /// Wrap `inner`. `content_encoding` is the response's `Content-Encoding`.
    pub fn new(
        inner: B,
        framing: Framing,
        content_encoding: Option<&str>,
        collector: Box<dyn ResponseCollector>,
        on_finish: OnFinish,
    ) -> Self {
        let (decoder, mode) = match Decoder::for_encoding(content_encoding) {
            Ok(d) => (
                d,
                match framing {
                    Framing::Sse => Mode::Sse(SseParser::new()),
                    Framing::Json => Mode::Json(Vec::new()),
                    Framing::Opaque => Mode::Off,
                },
            ),
            Err(()) => (None, Mode::Off),
        };
        TapBody {
            inner,
            idle: None,
            state: Some(TapState {
                decoder,
                mode,
                collector,
                on_finish,
                bytes: 0,
            }),
        }
    }

    /// End the stream with an error when the upstream stays silent for `d`
    /// between frames (needs a tokio runtime).
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle = Some((d, Box::pin(tokio::time::sleep(d))));
        self
    }

    fn finish(&mut self, end: TapEnd) {
        if let Some(s) = self.state.take() {
            s.finish(end);
        }
    }
}

impl<B> Body for TapBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some((d, sleep)) = this.idle.as_mut() {
                    sleep.as_mut().reset(tokio::time::Instant::now() + *d);
                }
                if let (Some(data), Some(state)) = (frame.data_ref(), this.state.as_mut()) {
                    state.feed(data);
                }
                if this.inner.is_end_stream() {
                    this.finish(TapEnd::Complete);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(TapEnd::Error(e.to_string()));
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish(TapEnd::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some((d, sleep)) = this.idle.as_mut() {
                    if sleep.as_mut().poll(cx).is_ready() {
                        let d = *d;
                        this.idle = None;
                        this.finish(TapEnd::Error(format!("idle for {d:?}")));
                        return Poll::Ready(Some(Err(Box::new(IdleTimeout(d)))));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for TapBody<B> {
    fn drop(&mut self) {
        self.finish(TapEnd::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect;
    use http_body_util::{BodyExt, StreamBody};
    use oceancode_ledger::{Dialect, Usage};
    use proptest::prelude::*;
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    const STREAM: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"usage\":{\"input_tokens\":7,\"cache_creation_input_tokens\":12511,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hé\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"llo\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":17}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    type Sink = Arc<Mutex<Vec<TapOutcome>>>;

    fn tap_over(
        chunks: Vec<Bytes>,
        encoding: Option<&str>,
        sink: &Sink,
    ) -> TapBody<impl Body<Data = Bytes, Error = Infallible> + Unpin> {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(c))),
        );
        let s = sink.clone();
        TapBody::new(
            StreamBody::new(stream),
            Framing::Sse,
            encoding,
            dialect::collector(Dialect::Anthropic),
            Box::new(move |o| s.lock().unwrap().push(o)),
        )
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn split(data: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut idx: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        idx.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for i in idx {
            out.push(Bytes::copy_from_slice(&data[prev..i]));
            prev = i;
        }
        out.push(Bytes::copy_from_slice(&data[prev..]));
        out
    }

    fn run(chunks: Vec<Bytes>, enc: Option<&str>) -> (Vec<u8>, Vec<TapOutcome>) {
        let sink: Sink = Arc::default();
        let body = tap_over(chunks, enc, &sink);
        let out = block_on(body.collect()).unwrap().to_bytes().to_vec();
        let outcomes = sink.lock().unwrap().clone();
        (out, outcomes)
    }

    fn expected_usage() -> Usage {
        Usage {
            input: 7,
            output: 17,
            cache_read: 3,
            cache_write: 12511,
        }
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_bytes_and_usage(cuts in proptest::collection::vec(0usize..4000, 0..40)) {
            let chunks = split(STREAM.as_bytes(), &cuts);
            let (out, outcomes) = run(chunks, None);
            prop_assert_eq!(out.as_slice(), STREAM.as_bytes());
            prop_assert_eq!(outcomes.len(), 1);
            prop_assert_eq!(&outcomes[0].end, &TapEnd::Complete);
            prop_assert_eq!(outcomes[0].collected.usage, Some(expected_usage()));
            prop_assert!(outcomes[0].collected.rows[0].contains("Héllo"));
        }

        #[test]
        fn gzip_bodies_are_forwarded_compressed_and_read_decoded(cuts in proptest::collection::vec(0usize..4000, 0..20)) {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(STREAM.as_bytes()).unwrap();
            let gz = enc.finish().unwrap();
            let (out, outcomes) = run(split(&gz, &cuts), Some("gzip"));
            prop_assert_eq!(out, gz);
            prop_assert_eq!(outcomes[0].collected.usage, Some(expected_usage()));
        }
    }

    #[test]
    fn brotli_and_zstd_are_decoded() {
        let mut br = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut br, 4096, 5, 22);
            w.write_all(STREAM.as_bytes()).unwrap();
        }
        let (out, o) = run(split(&br, &[7, 100]), Some("br"));
        assert_eq!(out, br);
        assert_eq!(o[0].collected.usage, Some(expected_usage()));
        let zs = zstd::encode_all(STREAM.as_bytes(), 3).unwrap();
        let (out, o) = run(split(&zs, &[3, 50]), Some("zstd"));
        assert_eq!(out, zs);
        assert_eq!(o[0].collected.usage, Some(expected_usage()));
    }

    #[test]
    fn unknown_encoding_forwards_and_reports_no_usage() {
        let (out, o) = run(
            vec![Bytes::from_static(b"\x00\x01garbage")],
            Some("compress"),
        );
        assert_eq!(out, b"\x00\x01garbage");
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].collected.usage, None);
    }

    #[test]
    fn dropping_the_body_early_finishes_once_as_cancelled() {
        let sink: Sink = Arc::default();
        let chunks = split(STREAM.as_bytes(), &[300, 400]);
        let mut body = tap_over(chunks, None, &sink);
        let first = block_on(body.frame()).unwrap().unwrap();
        assert_eq!(first.into_data().unwrap().len(), 300);
        drop(body);
        let o = sink.lock().unwrap();
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].end, TapEnd::Cancelled);
        // message_start was already seen: its usage is reported.
        assert_eq!(o[0].collected.usage.unwrap().input, 7);
    }

    #[test]
    fn an_upstream_error_finishes_once_as_error() {
        let sink: Sink = Arc::default();
        let s = sink.clone();
        let stream = futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"event: x\ndata: {}\n\n"))),
            Err("reset by peer".to_string()),
        ]);
        let body = TapBody::new(
            StreamBody::new(stream),
            Framing::Sse,
            None,
            dialect::collector(Dialect::Anthropic),
            Box::new(move |o| s.lock().unwrap().push(o)),
        );
        let r = block_on(body.collect());
        assert!(r.is_err());
        let o = sink.lock().unwrap();
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].end, TapEnd::Error("reset by peer".into()));
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;
    use crate::dialect;
    use http_body_util::{BodyExt, StreamBody};
    use oceancode_ledger::Dialect;

    #[tokio::test]
    async fn a_silent_upstream_ends_the_stream_with_an_error() {
        let (tx, mut rx) =
            tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(2);
        tx.send(Ok(Frame::data(Bytes::from_static(b"data: {}\n\n"))))
            .await
            .unwrap();
        let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let ended = std::sync::Arc::new(std::sync::Mutex::new(None));
        let e2 = ended.clone();
        let body = TapBody::new(
            StreamBody::new(stream),
            Framing::Sse,
            None,
            dialect::collector(Dialect::Anthropic),
            Box::new(move |o| *e2.lock().unwrap() = Some(o.end)),
        )
        .with_idle_timeout(Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        let r = body.collect().await;
        assert!(r.is_err());
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(matches!(
            ended.lock().unwrap().clone(),
            Some(TapEnd::Error(_))
        ));
        drop(tx);
    }
}
