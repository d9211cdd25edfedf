//! Decompression through the usage tap (gzip, deflate, br, zstd): the
//! client gets the upstream's bytes unchanged whatever they are (garbage,
//! truncated, a bomb), the tap finishes exactly once, a whole compressed
//! answer is read like the same answer sent plain, and what the tap
//! allocates stays within [`MEMORY_BOUND`] however far the bytes expand.

use bytes::Bytes;
use futures_util::FutureExt;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use oceancode_proxy::dialect::{self, Collected};
use oceancode_proxy::tap::{Framing, TapBody, TapEnd, TapLimits, TapOutcome};
use oceancode_window::Dialect;
use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Most bytes the tap may hold at once for one answer, whatever it decodes
/// to (checked when the binary counts allocations, see [`crate::alloc`]).
pub const MEMORY_BOUND: usize = 32 << 20;

const ENCODINGS: [&str; 6] = ["gzip", "deflate", "br", "zstd", "x-gzip", "identity"];

/// Input: `[encoding, flags, n, n × u16 split points, payload]`. With flag
/// bit 0 the payload is the answer in plain and is compressed here (bit 1:
/// then truncated at the first split point); without it the payload is the
/// compressed body as the upstream sent it. Bit 2 picks JSON over SSE
/// framing, bits 3–4 the dialect.
pub fn check(data: &[u8]) {
    let [enc, flags, rest @ ..] = data else {
        return;
    };
    let encoding = ENCODINGS[usize::from(*enc) % ENCODINGS.len()];
    let framing = if flags & 4 == 0 {
        Framing::Sse
    } else {
        Framing::Json
    };
    let d = crate::usage::dialect_of(flags >> 3);
    let (cuts, payload) = crate::cuts_and_payload(rest);
    let ours = flags & 1 == 1;
    let truncated = ours && flags & 2 == 2;
    let body = if ours {
        let mut z = compress(encoding, payload);
        if truncated {
            z.truncate(cuts.first().copied().unwrap_or(0).min(z.len()));
        }
        z
    } else {
        payload.to_vec()
    };
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let chunks = crate::split_at(&body, &cuts);
    let ((out, outcome), peak) = crate::alloc::measure(|| run(&chunks, framing, Some(encoding), d));
    assert_eq!(out, body, "the client gets the upstream's bytes");
    assert_eq!(outcome.end, TapEnd::Complete);
    assert_eq!(outcome.bytes, body.len() as u64);
    if let Some(peak) = peak {
        assert!(
            peak <= MEMORY_BOUND,
            "the tap held {peak} bytes for a {}-byte {encoding} answer (bound {MEMORY_BOUND})",
            body.len()
        );
    }
    if ours && !truncated {
        let (_, plain) = run(&[payload], framing, None, d);
        assert_eq!(
            outcome.collected, plain.collected,
            "a {encoding} answer reads like the plain one"
        );
    }
}

/// The tap over `chunks`: what the client got and the one outcome.
pub(crate) fn run(
    chunks: &[&[u8]],
    framing: Framing,
    encoding: Option<&str>,
    d: Dialect,
) -> (Vec<u8>, TapOutcome) {
    run_with(chunks, framing, encoding, d, TapLimits::default())
}

fn run_with(
    chunks: &[&[u8]],
    framing: Framing,
    encoding: Option<&str>,
    d: Dialect,
    limits: TapLimits,
) -> (Vec<u8>, TapOutcome) {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let seen: Arc<Mutex<Vec<TapOutcome>>> = Arc::default();
    let sink = seen.clone();
    let body = TapBody::with_limits(
        StreamBody::new(futures_util::stream::iter(frames)),
        framing,
        encoding,
        dialect::collector_keeping(d, limits.max_kept),
        Box::new(move |o| sink.lock().unwrap_or_else(|e| e.into_inner()).push(o)),
        limits,
    );
    let out = body
        .collect()
        .now_or_never()
        .expect("a body of ready frames completes at once")
        .expect("the upstream body cannot fail")
        .to_bytes()
        .to_vec();
    let mut outcomes = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    assert_eq!(outcomes.len(), 1, "the tap finishes exactly once");
    (out, outcomes.remove(0))
}

fn compress(encoding: &str, plain: &[u8]) -> Vec<u8> {
    let io = |r: std::io::Result<Vec<u8>>| r.expect("compressing into memory");
    match encoding {
        "gzip" | "x-gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            io(e.write_all(plain).and_then(|_| e.finish()))
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            io(e.write_all(plain).and_then(|_| e.finish()))
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                io(w.write_all(plain).map(|_| Vec::new()));
            }
            out
        }
        "zstd" => io(zstd::encode_all(plain, 3)),
        _ => plain.to_vec(),
    }
}

/// What a plain answer yields through a tap keeping `max_kept` bytes (used
/// by the usage target).
pub(crate) fn collected_through_tap(
    chunks: &[&[u8]],
    framing: Framing,
    d: Dialect,
    max_kept: usize,
) -> Collected {
    let limits = TapLimits {
        max_kept,
        ..TapLimits::default()
    };
    run_with(chunks, framing, None, d, limits).1.collected
}
