//! `context.seq_tags`' stage: each tool result row as the upstream sees it,
//! ending with its seq. A row is tagged once and kept while its bytes stay
//! the same; rows that left go. It runs last: its tags are by piece.

use super::{Draft, WindowStage};
use crate::context::edits::Src;
use std::sync::Arc;

/// Tool results that end with their seq.
pub(super) struct SeqTags;

impl WindowStage for SeqTags {
    fn name(&self) -> &'static str {
        "seq tags"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        let st = d.st;
        if !st.context.seq_tags {
            return;
        }
        d.changed = true;
        let pieces = &*d.pieces();
        let mut cache = st.context.tagged.lock();
        let mut used = 0usize;
        let out: Vec<_> = pieces
            .iter()
            .map(|(src, raw)| {
                let Src::Row(seq) = *src else { return None };
                if st.row(seq).closes().is_empty() {
                    return None;
                }
                used += 1;
                let h = xxhash_rust::xxh3::xxh3_64(raw.as_bytes());
                if let Some((hash, t)) = cache.get(&seq) {
                    if *hash == h {
                        return Some(t.clone());
                    }
                }
                let t: Arc<str> = crate::context::seq_tag::tag(st.dialect, raw, seq)?.into();
                cache.insert(seq, (h, t.clone()));
                Some(t)
            })
            .collect();
        if cache.len() > used + 64 {
            let keep: std::collections::HashSet<u64> =
                pieces.iter().filter_map(|(s, _)| s.seq()).collect();
            cache.retain(|s, _| keep.contains(s));
        }
        drop(cache);
        d.tags = out;
    }
}
