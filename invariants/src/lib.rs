//! The invariants oceancode-proxy's fuzz targets assert, one module per
//! target. Each `check` takes the fuzzer's bytes and panics when an invariant
//! breaks; the cargo-fuzz crate (`fuzz/`, nightly + libFuzzer) calls them,
//! and `tests/replay.rs` runs every file of the checked-in corpora
//! (`fuzz/corpus/<target>/`) through the same functions under `cargo test`.
//!
//! | target | what must hold |
//! |---|---|
//! | [`sse`] | the SSE parser gives the same events however the stream is split, and what a line-by-line reading gives |
//! | [`splice`] | splitting a body against the previous body's layout equals the full parse, or declines |
//! | [`window`] | random conversations (tool calls, parallel calls, reasoning) cut anywhere, in each dialect: every window is valid for the dialect |
//! | [`decode`] | the usage tap forwards compressed answers unchanged, reads them like the plain ones, and stays within its memory bound on bombs |
//! | [`usage`] | the dialect collectors read arbitrary SSE/JSON without panicking, the same through the tap in any split, into well-formed rows |
// Invariant checks panic when an invariant breaks: that is how a fuzzer
// or the replay test reports it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod alloc;
pub mod decode;
pub mod recall;
pub mod splice;
pub mod sse;
pub mod usage;
pub mod window;

use std::path::PathBuf;

/// A target's check: panics when an invariant breaks.
pub type Check = fn(&[u8]);

/// The fuzz targets: name (the corpus folder) and check.
pub const TARGETS: &[(&str, Check)] = &[
    ("sse", sse::check),
    ("splice", splice::check),
    ("window", window::check),
    ("decode", decode::check),
    ("usage", usage::check),
    ("recall", recall::check),
];

/// Where a target's corpus is checked in.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// The fuzzer's bytes cut into `[cuts...] rest`: a first byte telling how
/// many split points (0–15) follow as u16s, then the payload. The points are
/// sorted offsets into the payload.
pub(crate) fn cuts_and_payload(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let n = usize::from(n % 16).min(rest.len() / 2);
    let (head, payload) = rest.split_at(n * 2);
    let mut cuts: Vec<usize> = head
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (payload.len() + 1))
        .collect();
    cuts.sort_unstable();
    (cuts, payload)
}

/// `payload` split at `cuts` (sorted offsets).
pub(crate) fn split_at<'a>(payload: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut prev = 0;
    for &c in cuts {
        out.push(&payload[prev..c]);
        prev = c;
    }
    out.push(&payload[prev..]);
    out
}
