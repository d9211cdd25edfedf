//! The internal exchanges of a session (pure): the messages of each, kept
//! by the row they follow, and put back right after that row in every later
//! request that still sends it, so the upstream's history is the one the
//! model produced (its calls answered) and the prefix the continuation
//! cached stays the prefix of the next request.

use std::collections::BTreeMap;

/// Internal exchanges by the seq of the row they follow.
#[derive(Debug, Clone, Default)]
pub struct Hidden {
    after: BTreeMap<u64, Vec<String>>,
}

impl Hidden {
    /// No exchange kept.
    pub fn is_empty(&self) -> bool {
        self.after.is_empty()
    }

    /// Exchanges kept.
    pub fn len(&self) -> usize {
        self.after.len()
    }

    /// Keep `messages` (raw JSON, in order) to follow row `seq`; a new
    /// exchange after the same row (the client retried that request)
    /// replaces the old one.
    pub fn record(&mut self, seq: u64, messages: Vec<String>) {
        if !messages.is_empty() {
            self.after.insert(seq, messages);
        }
    }

    /// What follows row `seq`.
    pub fn after(&self, seq: u64) -> Option<&[String]> {
        self.after.get(&seq).map(Vec::as_slice)
    }

    /// The parts of a request (each with the seq of the row it is, None
    /// for the proxy's own: the stub) with every exchange put after its
    /// row; None when no row of them has one.
    pub fn expand<'a>(&'a self, parts: &[(Option<u64>, &'a str)]) -> Option<Vec<&'a str>> {
        if self.after.is_empty()
            || !parts
                .iter()
                .any(|(s, _)| s.is_some_and(|s| self.after.contains_key(&s)))
        {
            return None;
        }
        let mut out = Vec::with_capacity(parts.len() + 4);
        for (seq, p) in parts {
            out.push(*p);
            if let Some(m) = seq.and_then(|s| self.after.get(&s)) {
                out.extend(m.iter().map(String::as_str));
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_goes_right_after_its_row_and_nowhere_else() {
        let mut h = Hidden::default();
        assert!(h.expand(&[(Some(1), "a")]).is_none());
        h.record(2, vec!["call".into(), "result".into()]);
        let parts = [
            (None, "stub"),
            (Some(1), "a"),
            (Some(2), "b"),
            (Some(3), "c"),
        ];
        assert_eq!(
            h.expand(&parts),
            Some(vec!["stub", "a", "b", "call", "result", "c"])
        );
        // Its row cut away (or rewound): nothing is put back.
        assert!(h.expand(&[(None, "stub"), (Some(3), "c")]).is_none());
        h.record(2, vec!["again".into()]);
        assert_eq!(h.expand(&parts[2..3]), Some(vec!["b", "again"]));
        assert_eq!(h.len(), 1);
    }
}
