//! Reading messages for matching: a full parse only where the bytes are new
//! (counted in [`FULL_PARSES`]), the root hashes that key a conversation, and
//! the token estimates.

use crate::dialect;
use oceancode_window::media;
use oceancode_window::{Dialect, RowKind};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static BPE: OnceLock<Option<tiktoken_rs::CoreBPE>> = OnceLock::new();

/// Request JSON bytes per token before any usage was seen (o200k_base on
/// typical agent traffic measures ~3).
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 3.0;

/// Exact token count of a raw message (tiktoken `o200k_base`; bytes/4 for
/// very large rows; images and documents by [`media`]). About 5 MB/s: kept
/// off the request path, which uses a per-session calibrated byte estimate
/// instead.
pub fn estimate_tokens(raw: &str) -> u32 {
    let binary = media::cost(raw);
    if binary.bytes > 0 {
        return media::row_tokens(raw.len(), binary, 4.0);
    }
    if raw.len() > 256 * 1024 {
        return (raw.len() / 4) as u32;
    }
    match BPE.get_or_init(|| tiktoken_rs::o200k_base().ok()) {
        Some(bpe) => bpe.encode_ordinary(raw).len() as u32,
        None => (raw.len() / 4) as u32,
    }
}

/// A message read in full: its classification and normalized hash.
pub(super) struct Parsed {
    pub(super) info: dialect::MessageInfo,
    pub(super) norm: u64,
    /// What tells an answer from another when the client's echo has other
    /// bytes and fields than the reassembled response: its tool call ids,
    /// else its first text (0 = neither).
    pub(super) echo: u64,
}

/// [`Parsed::echo`] of a message.
fn echo_key(info: &dialect::MessageInfo, v: &Value) -> u64 {
    if !info.opens.is_empty() {
        return dialect::raw_hash(&info.opens.join("\u{0}"));
    }
    dialect::content_text(v).map_or(0, dialect::raw_hash)
}

/// Messages fully parsed so far in this process (old, unchanged history is
/// only hashed; this counter proves it in tests and benchmarks).
pub static FULL_PARSES: AtomicU64 = AtomicU64::new(0);

/// Parse one raw message (a message that is not JSON is kept verbatim and
/// compared by its bytes).
pub(super) fn parse_msg(d: Dialect, raw: &str) -> Parsed {
    FULL_PARSES.fetch_add(1, Ordering::Relaxed);
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => {
            let info = dialect::classify(d, &v);
            Parsed {
                echo: echo_key(&info, &v),
                norm: dialect::normalized_hash(&v),
                info,
            }
        }
        Err(_) => unparsed(raw),
    }
}

/// A message that is not JSON: kept verbatim, compared by bytes.
fn unparsed(raw: &str) -> Parsed {
    Parsed {
        info: dialect::MessageInfo {
            starts_ok: true,
            ..dialect::MessageInfo::default()
        },
        norm: dialect::raw_hash(raw),
        echo: 0,
    }
}

/// Hashes of a conversation's root, from one pass over its messages up to
/// the first user prompt.
pub(super) struct RootHashes {
    /// The system prompt (the `system` or `instructions` field) and the
    /// messages before the first prompt: what a client's own compaction
    /// keeps.
    pub(super) system: u64,
    /// That and the first prompt too: the session key of a request no header
    /// names. Chat Completions and Responses carry the system prompt as
    /// leading messages, so the first message alone would put every
    /// conversation with the same system prompt into one session.
    pub(super) key: u64,
}

pub(super) fn root_hashes(d: Dialect, sys: &str, msgs: &[&str]) -> RootHashes {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(sys.as_bytes());
    for m in msgs {
        let p = parse_msg(d, m);
        let before = h.digest();
        h.update(b"|");
        h.update(&p.norm.to_le_bytes());
        if p.info.kind == RowKind::Prompt {
            return RootHashes {
                system: before,
                key: h.digest(),
            };
        }
    }
    let all = h.digest();
    RootHashes {
        system: all,
        key: all,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_covers_the_system_and_the_first_user_prompt() {
        let sys = r#"{"role":"system","content":"You are helpful."}"#;
        let apples = r#"{"role":"user","content":"apples"}"#;
        let rockets = r#"{"role":"user","content":"rockets"}"#;
        let answer = r#"{"role":"assistant","content":"sure"}"#;
        let more = r#"{"role":"user","content":"more"}"#;
        let fingerprint = |d: Dialect, s: &str, m: &[&str]| root_hashes(d, s, m).key;
        let chat = |m: &[&str]| fingerprint(Dialect::OpenaiChat, "", m);
        assert_ne!(chat(&[sys, apples]), chat(&[sys, rockets]));
        assert_eq!(
            chat(&[sys, apples]),
            chat(&[sys, apples, answer, more]),
            "later turns keep the key"
        );
        let other_sys = r#"{"role":"system","content":"You are terse."}"#;
        assert_ne!(chat(&[sys, apples]), chat(&[other_sys, apples]));
        // Anthropic: the system field, and string ≡ one text block.
        let block = r#"{"role":"user","content":[{"type":"text","text":"apples","cache_control":{"type":"ephemeral"}}]}"#;
        let ant = |s: &str, m: &[&str]| fingerprint(Dialect::Anthropic, s, m);
        assert_eq!(ant("\"S\"", &[apples]), ant("\"S\"", &[block, answer]));
        assert_ne!(ant("\"S\"", &[apples]), ant("\"T\"", &[apples]));
        assert_ne!(ant("\"S\"", &[apples]), ant("\"S\"", &[rockets]));
    }
}
