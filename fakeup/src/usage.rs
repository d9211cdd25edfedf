//! Usage numbers and the prompt-cache simulation.
//!
//! Each request is a chain of segment hashes; the cache remembers every prefix chain seen
//! per model (bounded, approximately LRU). `cache_read` = tokens of the longest known
//! prefix (never the last segment); Anthropic: `cache_creation` = the rest except the last
//! segment, `input_tokens` = the last segment; OpenAI: input = total, cached = cache_read.

use parking_lot::Mutex;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::analyze::{Analysis, Dialect};
use crate::script::UsageOverride;
use crate::tokens::TwoGen;

/// Usage of one request as reported to the client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Anthropic: uncached input (the last message); OpenAI: the prompt total.
    pub input_tokens: u64,
    /// Anthropic `cache_creation_input_tokens` (0 for OpenAI).
    pub cache_creation_input_tokens: u64,
    /// Anthropic `cache_read_input_tokens` / OpenAI `cached_tokens`.
    pub cache_read_input_tokens: u64,
    /// Output tokens (thinking/reasoning included).
    pub output_tokens: u64,
    /// Reasoning tokens (OpenAI `reasoning_tokens`; the thinking part for Anthropic).
    pub reasoning_tokens: u64,
    /// All input tokens of the request (what a context limit is checked against).
    pub total_input_tokens: u64,
}

impl Usage {
    /// Applies a scripted override.
    pub(crate) fn apply(&mut self, o: &UsageOverride) {
        if let Some(v) = o.input_tokens {
            self.input_tokens = v;
        }
        if let Some(v) = o.cache_creation_input_tokens {
            self.cache_creation_input_tokens = v;
        }
        if let Some(v) = o.cache_read_input_tokens {
            self.cache_read_input_tokens = v;
        }
        if let Some(v) = o.output_tokens {
            self.output_tokens = v;
        }
    }
}

/// Remembered prefix chains (keyed by model).
pub(crate) struct PromptCache {
    seen: Mutex<TwoGen<()>>,
}

impl PromptCache {
    pub(crate) fn new(cap: usize) -> Self {
        PromptCache {
            seen: Mutex::new(TwoGen::new(cap)),
        }
    }

    pub(crate) fn clear(&self) {
        self.seen.lock().clear();
    }

    /// Input usage of a request; when `remember`, its prefixes are stored afterwards.
    pub(crate) fn input_usage(&self, dialect: Dialect, a: &Analysis, remember: bool) -> Usage {
        let mut chain = Vec::with_capacity(a.seg_hashes.len());
        let mut h = xxh3_64(a.model.as_bytes());
        for seg in &a.seg_hashes {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&h.to_le_bytes());
            buf[8..].copy_from_slice(&seg.to_le_bytes());
            h = xxh3_64_with_seed(&buf, 0x0cea_c0de);
            chain.push(h);
        }
        let n = chain.len();
        let mut seen = self.seen.lock();
        // Longest known prefix, excluding the last segment.
        let mut hit = 0;
        for k in (1..n).rev() {
            if seen.get(chain[k - 1]).is_some() {
                hit = k;
                break;
            }
        }
        if remember {
            for c in &chain {
                seen.insert(*c, ());
            }
        }
        drop(seen);
        let read: u64 = a.seg_tokens[..hit].iter().sum();
        let last = a.seg_tokens.last().copied().unwrap_or(0);
        let total = a.total;
        match dialect {
            Dialect::Anthropic => Usage {
                input_tokens: last.min(total - read),
                cache_creation_input_tokens: total - read - last.min(total - read),
                cache_read_input_tokens: read,
                total_input_tokens: total,
                ..Usage::default()
            },
            Dialect::Chat | Dialect::Responses | Dialect::Gemini => Usage {
                input_tokens: total,
                cache_read_input_tokens: read,
                total_input_tokens: total,
                ..Usage::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn an(model: &str, segs: &[(u64, u64)]) -> Analysis {
        Analysis {
            model: model.into(),
            seg_hashes: segs.iter().map(|s| s.0).collect(),
            seg_tokens: segs.iter().map(|s| s.1).collect(),
            total: segs.iter().map(|s| s.1).sum(),
            ..Analysis::default()
        }
    }

    #[test]
    fn appended_message_reads_previous_prefix() {
        let c = PromptCache::new(100);
        let first = an("m", &[(1, 100), (2, 50), (3, 7)]);
        let u1 = c.input_usage(Dialect::Anthropic, &first, true);
        assert_eq!(
            (
                u1.input_tokens,
                u1.cache_creation_input_tokens,
                u1.cache_read_input_tokens
            ),
            (7, 150, 0)
        );
        let second = an("m", &[(1, 100), (2, 50), (3, 7), (4, 20), (5, 9)]);
        let u2 = c.input_usage(Dialect::Anthropic, &second, true);
        assert_eq!(
            (
                u2.input_tokens,
                u2.cache_creation_input_tokens,
                u2.cache_read_input_tokens
            ),
            (9, 20, 157)
        );
        // Same request again: everything but the last segment is read.
        let u3 = c.input_usage(Dialect::Chat, &second, true);
        assert_eq!((u3.input_tokens, u3.cache_read_input_tokens), (186, 177));
        // Other model: cold.
        let u4 = c.input_usage(Dialect::Anthropic, &an("other", &[(1, 100), (2, 5)]), false);
        assert_eq!(u4.cache_read_input_tokens, 0);
    }
}
