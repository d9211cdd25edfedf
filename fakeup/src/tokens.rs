//! Token counting with tiktoken `o200k_base` (loaded once, lazily, shared by all
//! servers), plus a bounded memo of counts keyed by content hash.

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;
use tiktoken_rs::CoreBPE;
use xxhash_rust::xxh3::xxh3_64;

static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();

fn bpe() -> Option<&'static CoreBPE> {
    BPE.get_or_init(|| match tiktoken_rs::o200k_base() {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::error!("cannot load o200k_base, falling back to bytes/4: {e}");
            None
        }
    })
    .as_ref()
}

/// Largest slice handed to the BPE at once: a long run without whitespace would
/// otherwise be one regex piece with quadratic merge cost.
const MAX_PIECE: usize = 8 * 1024;

/// Number of `o200k_base` tokens in `text` (no special tokens).
pub fn count_tokens(text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    let Some(bpe) = bpe() else {
        return (text.len() as u64).div_ceil(4);
    };
    split_pieces(text, MAX_PIECE)
        .map(|p| bpe.encode_ordinary(p).len() as u64)
        .sum()
}

/// Splits at whitespace (kept with the following piece) into slices of at most `max`
/// bytes where possible, else at a char boundary.
fn split_pieces(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= max {
            let out = rest;
            rest = "";
            return Some(out);
        }
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let window = &rest[..cut];
        if let Some(ws) = window.rfind(char::is_whitespace) {
            if ws > max / 4 {
                cut = ws;
            }
        }
        if cut == 0 {
            // A single char wider than `max` cannot happen (max >= 4); be safe anyway.
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (head, tail) = rest.split_at(cut);
        rest = tail;
        Some(head)
    })
}

/// Approximate LRU: two generations of at most `cap / 2` entries each; a hit in the old
/// generation is promoted, and when the young one fills up the old one is dropped.
pub(crate) struct TwoGen<V> {
    half: usize,
    hot: HashMap<u64, V>,
    cold: HashMap<u64, V>,
}

impl<V: Clone> TwoGen<V> {
    pub(crate) fn new(cap: usize) -> Self {
        TwoGen {
            half: (cap / 2).max(1),
            hot: HashMap::new(),
            cold: HashMap::new(),
        }
    }

    pub(crate) fn get(&mut self, k: u64) -> Option<V> {
        if let Some(v) = self.hot.get(&k) {
            return Some(v.clone());
        }
        let v = self.cold.remove(&k)?;
        self.insert(k, v.clone());
        Some(v)
    }

    pub(crate) fn insert(&mut self, k: u64, v: V) {
        if self.hot.len() >= self.half && !self.hot.contains_key(&k) {
            self.cold = std::mem::take(&mut self.hot);
        }
        self.hot.insert(k, v);
    }

    pub(crate) fn clear(&mut self) {
        self.hot.clear();
        self.cold.clear();
    }
}

/// Memoized counts, keyed by the hash of what was counted.
pub(crate) struct TokenMemo {
    memo: Mutex<TwoGen<u64>>,
}

impl TokenMemo {
    pub(crate) fn new(cap: usize) -> Self {
        TokenMemo {
            memo: Mutex::new(TwoGen::new(cap)),
        }
    }

    /// Count for the content identified by `key`, computing `text()` only on a miss.
    pub(crate) fn get_or_count(&self, key: u64, text: impl FnOnce() -> String) -> u64 {
        self.get_or(key, || count_tokens(&text()))
    }

    /// The memoized count for `key`, computing `count()` only on a miss.
    pub(crate) fn get_or(&self, key: u64, count: impl FnOnce() -> u64) -> u64 {
        if let Some(n) = self.memo.lock().get(key) {
            return n;
        }
        let n = count();
        self.memo.lock().insert(key, n);
        n
    }

    /// Count of a plain text (memoized when long).
    pub(crate) fn text(&self, text: &str) -> u64 {
        if text.len() < 512 {
            return count_tokens(text);
        }
        let key = xxh3_64(text.as_bytes()) ^ 0x7465_7874;
        self.get_or_count(key, || text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_known_strings() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("hello world"), 2);
        let long = "word ".repeat(10_000);
        let n = count_tokens(&long);
        assert!((9_990..=10_010).contains(&n), "{n}");
        // A long run without whitespace stays cheap and roughly linear.
        let run = "a".repeat(100_000);
        assert!(count_tokens(&run) > 1_000);
    }

    #[test]
    fn split_keeps_all_bytes() {
        let s = "ab cd ".repeat(5000) + &"é".repeat(9000);
        let joined: String = split_pieces(&s, 1000).collect();
        assert_eq!(joined, s);
        assert!(split_pieces(&s, 1000).all(|p| p.len() <= 1000));
    }

    #[test]
    fn two_gen_evicts_old() {
        let mut g = TwoGen::new(4);
        for k in 0..10u64 {
            g.insert(k, k);
        }
        assert_eq!(g.get(9), Some(9));
        assert_eq!(g.get(0), None);
    }
}
