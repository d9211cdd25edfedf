//! The layouts of each client's latest bodies (by the client key its headers
//! give; a few per key, since a main loop and its sub-agents share one), so
//! the next body is split without rescanning what it shares with one of them
//! (`dialect::splice`).

use crate::dialect::splice::{self, Layout};
use crate::dialect::ParsedBody;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Client keys whose layouts are kept (the map starts over beyond it).
const MAX_LAYOUT_KEYS: usize = 4096;
/// Layouts kept per client key (most recently used first).
const LAYOUTS_PER_KEY: usize = 4;

/// A body split at the top level, perhaps against a remembered layout.
pub(super) struct Split<'a> {
    /// The body's members and conversation elements.
    pub(super) parsed: ParsedBody<'a>,
    /// Leading elements byte-identical to the layout's (their hashes known).
    reused: usize,
    /// Which candidate layout was used.
    used: Option<usize>,
}

/// The remembered layouts.
#[derive(Default)]
pub(super) struct Layouts {
    map: Mutex<HashMap<String, Vec<Arc<Layout>>>>,
}

impl Layouts {
    /// The layouts remembered for `key` (most recent first).
    pub(super) fn candidates(&self, key: Option<&str>) -> Vec<Arc<Layout>> {
        key.and_then(|k| self.map.lock().get(k).cloned())
            .unwrap_or_default()
    }

    /// Split `body` against the first candidate it starts like, else in
    /// full; `Err` when the body is not a JSON object. `spliced` counts the
    /// bodies split against a layout.
    pub(super) fn split<'a>(
        candidates: &[Arc<Layout>],
        body: &'a [u8],
        conv_key: &str,
    ) -> Result<Split<'a>, serde_json::Error> {
        let spliced = candidates.iter().enumerate().find_map(|(i, l)| {
            (l.conv_key() == conv_key)
                .then(|| splice::parse(body, l))
                .flatten()
                .map(|(p, n)| (p, n, i))
        });
        Ok(match spliced {
            Some((parsed, reused, i)) => Split {
                parsed,
                reused,
                used: Some(i),
            },
            None => Split {
                parsed: ParsedBody::parse(body, conv_key)?,
                reused: 0,
                used: None,
            },
        })
    }

    /// Remember the layout of `body` for `key`, most recent first (the
    /// candidate it was split against is replaced by it, and extended).
    pub(super) fn remember(
        &self,
        key: &str,
        body: &[u8],
        split: &Split<'_>,
        candidates: &[Arc<Layout>],
        hashes: &[u64],
    ) {
        let made = match split.used.and_then(|u| candidates.get(u)) {
            Some(used) => used.extend(body, &split.parsed, hashes, split.reused),
            None => Layout::of(body, &split.parsed, hashes),
        };
        let Some(l) = made else {
            return;
        };
        let mut layouts = self.map.lock();
        if layouts.len() >= MAX_LAYOUT_KEYS && !layouts.contains_key(key) {
            layouts.clear();
        }
        let list = layouts.entry(key.to_string()).or_default();
        if let Some(u) = split.used.filter(|&u| u < list.len()) {
            list.remove(u);
        }
        list.insert(0, Arc::new(l));
        list.truncate(LAYOUTS_PER_KEY);
    }
}

impl Split<'_> {
    /// Whether a remembered layout was used.
    pub(super) fn spliced(&self) -> bool {
        self.used.is_some()
    }

    /// The raw hash of every message: known from the layout for the reused
    /// prefix, computed for the rest.
    pub(super) fn hashes(&self, candidates: &[Arc<Layout>]) -> Vec<u64> {
        self.parsed
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| match self.used {
                Some(u) if i < self.reused => candidates[u].hash(i),
                _ => crate::dialect::raw_hash(m),
            })
            .collect()
    }
}
