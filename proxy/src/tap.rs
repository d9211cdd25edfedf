//! The usage tap: an [`http_body::Body`] wrapper around the upstream response
//! that forwards every frame unchanged and, on the side, decodes a copy
//! (gzip/deflate/br/zstd), parses SSE or JSON, and feeds the dialect's
//! collector. It finishes exactly once: at the end of the stream, on an error,
//! or when the client goes away (drop).
//!
//! What the copy costs is bounded whatever the upstream sends: decoding
//! stops past [`TapLimits::max_decoded`] bytes (a compression bomb: the
//! answer's usage is then unknown), one SSE event or JSON body is kept up to
//! [`TapLimits::max_kept`] bytes, and so is what the collector keeps of the
//! answer (recorded truncated, with a marker). The client gets every byte.
//! A plain SSE stream cut mid-way (upstream reset, idle timeout) ends with
//! the dialect's error event instead of a silent truncation.

use crate::dialect::{self, Collected, ResponseCollector, StreamCut};
use crate::error::BoxError;
use crate::sse::{SseItem, SseParser};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use oceancode_window::Dialect;
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
    /// Decoding stopped at [`TapLimits::max_decoded`]: usage unknown.
    pub decode_stopped: bool,
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

/// What the copy of one answer may cost.
#[derive(Debug, Clone, Copy)]
pub struct TapLimits {
    /// Most bytes of one SSE event, of a JSON body, and of what the collector
    /// keeps (`limits.max_recorded_response_bytes`).
    pub max_kept: usize,
    /// Most decoded bytes of a compressed answer (`limits.max_decoded_response_bytes`).
    pub max_decoded: u64,
}

impl Default for TapLimits {
    fn default() -> Self {
        TapLimits {
            max_kept: dialect::DEFAULT_KEEP,
            max_decoded: 64 << 20,
        }
    }
}

enum Mode {
    Sse(SseParser),
    Json(Vec<u8>),
    Off,
}

/// The decoded copy's reader: parses SSE or buffers JSON and feeds the
/// collector. It is the decoders' output, so decoded bytes flow through it
/// as they are made and never pile up.
struct Consumer {
    mode: Mode,
    collector: Option<Box<dyn ResponseCollector>>,
    max_kept: usize,
    /// Decoded bytes so far, and the bound (u64::MAX without a decoder).
    decoded: u64,
    max_decoded: u64,
    decode_stopped: bool,
}

impl Consumer {
    fn consume(&mut self, plain: &[u8]) {
        let Some(collector) = self.collector.as_mut() else {
            return;
        };
        match &mut self.mode {
            // The collector hears of a dropped event where it was, so that
            // what it keeps after it does not depend on the chunking.
            Mode::Sse(p) => p.feed_items(plain, &mut |item| read_item(collector, item)),
            Mode::Json(buf) => {
                if buf.len() + plain.len() > self.max_kept {
                    collector.truncated();
                    self.mode = Mode::Off;
                } else {
                    buf.extend_from_slice(plain);
                }
            }
            Mode::Off => {}
        }
    }
}

impl Write for Consumer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if matches!(self.mode, Mode::Off) {
            return Ok(buf.len());
        }
        self.decoded += buf.len() as u64;
        if self.decoded > self.max_decoded {
            self.decode_stopped = true;
            self.mode = Mode::Off;
            return Err(std::io::Error::other(format!(
                "decoded copy over {} bytes",
                self.max_decoded
            )));
        }
        self.consume(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One parsed item of the copy, to the collector.
fn read_item(collector: &mut Box<dyn ResponseCollector>, item: SseItem) {
    match item {
        SseItem::Event(ev) => collector.on_event(&ev.event, &ev.data),
        SseItem::Dropped => collector.truncated(),
    }
}

/// The largest zstd window the tap decodes (2^23 = 8 MiB; zstd's own
/// default limit is 128 MiB).
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// Compressed bytes in, the consumer fed with what they decode to.
enum Pipeline {
    Plain(Consumer),
    Gzip(flate2::write::MultiGzDecoder<Consumer>),
    Deflate(flate2::write::ZlibDecoder<Consumer>),
    Brotli(Box<brotli::DecompressorWriter<Consumer>>),
    Zstd(zstd::stream::write::Decoder<'static, Consumer>),
}

impl Pipeline {
    /// The pipeline for a `Content-Encoding`; one it cannot decode turns the
    /// copy off.
    fn for_encoding(enc: Option<&str>, mut c: Consumer) -> Pipeline {
        let enc = enc
            .map(|e| e.trim().to_ascii_lowercase())
            .unwrap_or_default();
        match enc.as_str() {
            "" | "identity" => Pipeline::Plain(c),
            "gzip" | "x-gzip" => Pipeline::Gzip(flate2::write::MultiGzDecoder::new(c)),
            "deflate" => Pipeline::Deflate(flate2::write::ZlibDecoder::new(c)),
            "br" => Pipeline::Brotli(Box::new(brotli::DecompressorWriter::new(c, 4096))),
            // zstd fails only when it cannot allocate its context; the
            // consumer is lost with it (the answer's usage is unknown).
            // A frame may declare a window of up to 2 GiB, which the decoder
            // would allocate (outside the decoded-bytes bound); streaming
            // answers use far smaller ones, so a larger window is not read.
            "zstd" => match zstd::stream::write::Decoder::new(c) {
                Ok(mut d) => match d.window_log_max(ZSTD_WINDOW_LOG_MAX) {
                    Ok(()) => Pipeline::Zstd(d),
                    Err(_) => Pipeline::Plain(Consumer::off()),
                },
                Err(_) => Pipeline::Plain(Consumer::off()),
            },
            _ => {
                c.mode = Mode::Off;
                Pipeline::Plain(c)
            }
        }
    }

    fn consumer(&mut self) -> &mut Consumer {
        match self {
            Pipeline::Plain(c) => c,
            Pipeline::Gzip(d) => d.get_mut(),
            Pipeline::Deflate(d) => d.get_mut(),
            Pipeline::Brotli(d) => d.get_mut(),
            Pipeline::Zstd(d) => d.get_mut(),
        }
    }

    fn push(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Pipeline::Plain(c) => c.write_all(data),
            Pipeline::Gzip(d) => d.write_all(data).and_then(|_| d.flush()),
            Pipeline::Deflate(d) => d.write_all(data).and_then(|_| d.flush()),
            Pipeline::Brotli(d) => d.write_all(data).and_then(|_| d.flush()),
            Pipeline::Zstd(d) => d.write_all(data).and_then(|_| d.flush()),
        }
    }
}

impl Consumer {
    fn off() -> Consumer {
        Consumer {
            mode: Mode::Off,
            collector: None,
            max_kept: 0,
            decoded: 0,
            max_decoded: u64::MAX,
            decode_stopped: false,
        }
    }
}

struct TapState {
    pipeline: Pipeline,
    on_finish: OnFinish,
    bytes: u64,
}

impl TapState {
    fn feed(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        if matches!(self.pipeline.consumer().mode, Mode::Off) {
            return;
        }
        if let Err(e) = self.pipeline.push(data) {
            let c = self.pipeline.consumer();
            if c.decode_stopped {
                tracing::warn!(
                    decoded = c.decoded,
                    compressed = self.bytes,
                    "usage tap: the answer decodes past limits.max_decoded_response_bytes; stopped reading it (usage unknown, the client gets it unchanged)"
                );
            } else {
                tracing::debug!(error = %e, "usage tap: cannot decode the response copy; tap off");
            }
            c.mode = Mode::Off;
        }
    }

    /// Inside an SSE event (a cut now would leave a partial event)?
    fn mid_event(&mut self) -> bool {
        matches!(&self.pipeline.consumer().mode, Mode::Sse(p) if p.mid_event())
    }

    /// Hand the outcome over; true if the answer's terminal event was seen.
    fn finish(mut self, end: TapEnd) -> bool {
        let c = self.pipeline.consumer();
        let mut collector = c.collector.take();
        if let (true, Some(col)) = (end == TapEnd::Complete, collector.as_mut()) {
            match &mut c.mode {
                Mode::Sse(p) => p.finish_items(&mut |item| read_item(col, item)),
                Mode::Json(buf) => col.on_json(buf),
                Mode::Off => {}
            }
        }
        let decode_stopped = c.decode_stopped;
        let collected = match collector {
            // A bomb: nothing read of it is trusted.
            Some(_) if decode_stopped => Collected::default(),
            Some(col) => col.finish(),
            None => Collected::default(),
        };
        let terminal = collected.terminal;
        (self.on_finish)(TapOutcome {
            end,
            collected,
            bytes: self.bytes,
            decode_stopped,
        });
        terminal
    }
}

/// The wrapper. `B` is the upstream body.
pub struct TapBody<B> {
    inner: B,
    state: Option<TapState>,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    /// The dialect whose error event ends a cut plain SSE stream.
    cut_event: Option<Dialect>,
    /// The body ended early and the closing frame was sent.
    done: bool,
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
        Self::with_limits(
            inner,
            framing,
            content_encoding,
            collector,
            on_finish,
            TapLimits::default(),
        )
    }

    /// [`TapBody::new`] with explicit bounds.
    pub fn with_limits(
        inner: B,
        framing: Framing,
        content_encoding: Option<&str>,
        collector: Box<dyn ResponseCollector>,
        on_finish: OnFinish,
        limits: TapLimits,
    ) -> Self {
        let encoded = !matches!(
            content_encoding
                .map(|e| e.trim().to_ascii_lowercase())
                .as_deref(),
            None | Some("") | Some("identity")
        );
        let consumer = Consumer {
            mode: match framing {
                Framing::Sse => Mode::Sse(SseParser::with_limit(limits.max_kept)),
                Framing::Json => Mode::Json(Vec::new()),
                Framing::Opaque => Mode::Off,
            },
            collector: Some(collector),
            max_kept: limits.max_kept,
            decoded: 0,
            max_decoded: if encoded {
                limits.max_decoded
            } else {
                u64::MAX
            },
            decode_stopped: false,
        };
        let pipeline = Pipeline::for_encoding(content_encoding, consumer);
        TapBody {
            inner,
            idle: None,
            state: Some(TapState {
                pipeline,
                on_finish,
                bytes: 0,
            }),
            cut_event: None,
            done: false,
        }
    }

    /// End the stream with an error when the upstream stays silent for `d`
    /// between frames (needs a tokio runtime).
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle = Some((d, Box::pin(tokio::time::sleep(d))));
        self
    }

    /// End a plain (not content-encoded) SSE stream cut mid-way with the
    /// error event of `dialect` and a clean end, instead of an error.
    pub fn with_error_event(
        mut self,
        dialect: Dialect,
        framing: Framing,
        encoding: Option<&str>,
    ) -> Self {
        let plain = matches!(
            encoding.map(|e| e.trim().to_ascii_lowercase()).as_deref(),
            None | Some("") | Some("identity")
        );
        if framing == Framing::Sse && plain {
            self.cut_event = Some(dialect);
        }
        self
    }

    fn finish(&mut self, end: TapEnd) -> bool {
        match self.state.take() {
            Some(s) => s.finish(end),
            None => false,
        }
    }

    /// The stream was cut: the frame that ends it for the client.
    fn cut(
        &mut self,
        cut: StreamCut,
        reason: String,
        err: BoxError,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mid = self.state.as_mut().is_some_and(TapState::mid_event);
        let terminal = self.finish(TapEnd::Error(reason.clone()));
        let Some(d) = self.cut_event else {
            tracing::warn!(reason = %reason, "upstream stream cut mid-way");
            return Poll::Ready(Some(Err(err)));
        };
        self.done = true;
        if terminal {
            // The answer was whole already: end it cleanly.
            tracing::debug!(reason = %reason, "upstream stream ended badly after its terminal event");
            return Poll::Ready(None);
        }
        tracing::warn!(reason = %reason, dialect = d.as_str(), "upstream stream cut mid-way: ended with the dialect's error event");
        let msg = format!("oceancode-proxy: the upstream stream was cut mid-way ({reason})");
        let mut ev = String::new();
        if mid {
            // End the partial event first, so the error event stands alone.
            ev.push_str("\n\n");
        }
        ev.push_str(&dialect::stream_error_event(d, cut, &msg));
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(ev)))))
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
        if this.done {
            return Poll::Ready(None);
        }
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
                let reason = e.to_string();
                this.cut(StreamCut::Broken, reason, e.into())
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
                        return this.cut(
                            StreamCut::Idle,
                            format!("idle for {d:?}"),
                            Box::new(IdleTimeout(d)),
                        );
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.done {
            return SizeHint::with_exact(0);
        }
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
    use oceancode_window::{Dialect, Usage};
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

    /// Found by the usage fuzz target: an event too long to keep was
    /// reported to the collector only after the rest of its chunk, so the
    /// events after it in the same chunk were recorded or not depending on
    /// how the stream was split.
    #[test]
    fn what_is_recorded_after_a_dropped_event_does_not_depend_on_the_split() {
        let long = format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n",
            "x".repeat(300)
        );
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"content\":[]}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        )
        .to_string()
            + &long
            + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"after\"}}\n\n";
        let collect = |chunks: Vec<Bytes>| {
            let sink: Sink = Arc::default();
            let s = sink.clone();
            let body = TapBody::with_limits(
                StreamBody::new(futures_util::stream::iter(
                    chunks
                        .into_iter()
                        .map(|c| Ok::<_, Infallible>(Frame::data(c))),
                )),
                Framing::Sse,
                None,
                dialect::collector_keeping(Dialect::Anthropic, 256),
                Box::new(move |o| s.lock().unwrap().push(o)),
                TapLimits {
                    max_kept: 256,
                    ..TapLimits::default()
                },
            );
            block_on(body.collect()).unwrap();
            let o = sink.lock().unwrap().clone();
            o[0].collected.clone()
        };
        let whole = collect(vec![Bytes::from(stream.clone())]);
        let bytes = collect(stream.bytes().map(|b| Bytes::from(vec![b])).collect());
        assert!(whole.truncated);
        assert_eq!(whole, bytes);
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

    /// An Anthropic stream whose text is `deltas` deltas of `each` bytes.
    fn long_stream(deltas: usize, each: usize) -> Vec<Bytes> {
        let head = STREAM.split("event: content_block_delta").next().unwrap();
        let tail = &STREAM[STREAM.find("event: content_block_stop").unwrap()..];
        let text = "y".repeat(each);
        let ev = format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n");
        let mut out = vec![Bytes::from(head.to_string())];
        out.extend(std::iter::repeat_n(Bytes::from(ev), deltas));
        out.push(Bytes::from(tail.to_string()));
        out
    }

    #[test]
    fn a_zstd_frame_with_a_huge_window_is_not_decoded() {
        // The frame header declares a 128 MiB window: decoding it would
        // allocate that much whatever the answer's size.
        let wide = |log: u32| {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            e.window_log(log).unwrap();
            e.long_distance_matching(true).unwrap();
            e.write_all(STREAM.as_bytes()).unwrap();
            e.finish().unwrap()
        };
        let (out, o) = run(split(&wide(27), &[5]), Some("zstd"));
        assert_eq!(out, wide(27), "the client gets the bytes unchanged");
        assert_eq!(o[0].collected.usage, None, "usage unknown");
        let (_, o) = run(split(&wide(20), &[5]), Some("zstd"));
        assert_eq!(o[0].collected.usage, Some(expected_usage()));
    }

    #[test]
    fn a_compression_bomb_is_not_decoded_past_the_bound() {
        // A real message_start, then 100 MB of zeros: about 100 KB of gzip.
        let mut plain = STREAM.as_bytes()[..STREAM.find("event: ping").unwrap()].to_vec();
        plain.resize(plain.len() + (100 << 20), 0);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&plain).unwrap();
        let gz = enc.finish().unwrap();
        let zs = zstd::encode_all(plain.as_slice(), 19).unwrap();
        drop(plain);
        for (enc, bytes) in [("gzip", gz), ("zstd", zs)] {
            let chunks: Vec<Bytes> = bytes.chunks(16 << 10).map(Bytes::copy_from_slice).collect();
            let (out, o) = run(chunks, Some(enc));
            assert_eq!(out, bytes, "{enc}: the client gets the bytes unchanged");
            assert_eq!(o.len(), 1);
            assert_eq!(o[0].end, TapEnd::Complete);
            assert_eq!(o[0].collected.usage, None, "{enc}: usage unknown");
            assert!(o[0].collected.rows.is_empty(), "{enc}");
        }
    }

    #[test]
    fn an_answer_longer_than_the_bound_is_recorded_truncated_with_a_marker() {
        // 6 MB of text in 64 KB deltas, then one 5 MB delta: over the
        // 4 MiB kept of one answer (and of one event).
        for chunks in [long_stream(96, 64 << 10), long_stream(1, 5 << 20)] {
            let sent: usize = chunks.iter().map(Bytes::len).sum();
            let (out, o) = run(chunks, None);
            assert_eq!(out.len(), sent, "the client gets every byte");
            let c = &o[0].collected;
            assert_eq!(c.usage, Some(expected_usage()), "usage is still read");
            assert_eq!(c.rows.len(), 1);
            let row = &c.rows[0];
            assert!(row.len() < (4 << 20) + 4096, "{}", row.len());
            let v: serde_json::Value = serde_json::from_str(row).unwrap();
            let blocks = v["content"].as_array().unwrap();
            let last = blocks.last().unwrap()["text"].as_str().unwrap();
            assert!(
                last.contains("limits.max_recorded_response_bytes"),
                "{last}"
            );
        }
    }

    /// `first`, then a reset, through a tap that ends cut streams with the
    /// error event (when the body is `encoding`-free).
    fn cut_after(
        first: &'static [u8],
        encoding: Option<&str>,
    ) -> (Result<Vec<u8>, String>, Vec<TapOutcome>) {
        let sink: Sink = Arc::default();
        let s = sink.clone();
        let stream = futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(first))),
            Err("connection reset by peer".to_string()),
        ]);
        let body = TapBody::new(
            StreamBody::new(stream),
            Framing::Sse,
            encoding,
            dialect::collector(Dialect::Anthropic),
            Box::new(move |o| s.lock().unwrap().push(o)),
        )
        .with_error_event(Dialect::Anthropic, Framing::Sse, encoding);
        let r = block_on(body.collect())
            .map(|c| c.to_bytes().to_vec())
            .map_err(|e| e.to_string());
        let o = sink.lock().unwrap().clone();
        (r, o)
    }

    #[test]
    fn a_cut_stream_ends_with_the_error_event_or_cleanly_once_whole() {
        // Cut inside an event: that event is closed off, then the error.
        let first = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: content_block_delta\ndata: {\"ty";
        let (r, o) = cut_after(first, None);
        let out = String::from_utf8(r.expect("a clean end for the client")).unwrap();
        let tail = &out[first.len()..];
        assert!(tail.starts_with("\n\nevent: error\ndata: {"), "{tail:?}");
        let data: serde_json::Value =
            serde_json::from_str(tail.trim().rsplit("data: ").next().unwrap()).unwrap();
        assert_eq!(data["error"]["type"], "api_error");
        assert!(data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reset by peer"));
        assert_eq!(o.len(), 1);
        assert!(matches!(o[0].end, TapEnd::Error(_)));
        // Cut after the terminal event: the answer was whole; no error added.
        let (r, o) = cut_after(STREAM.as_bytes(), None);
        assert_eq!(r.unwrap(), STREAM.as_bytes());
        assert!(o[0].collected.terminal);
        // Without the error event (a compressed body): an error, as before.
        let (r, o) = cut_after(b"x", Some("gzip"));
        assert!(r.is_err());
        assert!(matches!(o[0].end, TapEnd::Error(_)));
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
    use oceancode_window::Dialect;

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
