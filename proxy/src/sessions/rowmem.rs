//! One row as the manager keeps it in memory ([`RowMem`], no bytes), packed
//! for the common row: its hashes, numbers and flags inline, with room for
//! the one tool call most agent rows open or close (and a command result's
//! facts about it); whatever few rows have (several calls, images and
//! documents, standing parts, other state-block facts, an ask) in a boxed
//! side list that a plain row does not allocate.
//!
//! A session of 2,001 rows keeps 2,001 of these: with every field inline
//! a row was 168 bytes plus a boxed slice per call list; now 64.

use super::state::Calls;
use super::thread::{Facts, RowThread};
use oceancode_ledger::facts::RowFacts;
use oceancode_window::media::Cost;
use oceancode_window::{RowKind, Standing};
use std::borrow::Cow;

const STARTS_OK: u8 = 1;
const COMPACTION: u8 = 1 << 1;
const HIDDEN: u8 = 1 << 2;
const BINDS_NEXT: u8 = 1 << 3;
/// `call` is the one tool call the row opens (it closes none).
const OPENS: u8 = 1 << 4;
/// `call` is the one tool call the row closes (it opens none).
const CLOSES: u8 = 1 << 5;
/// Its state-block facts: one command result answering `call`, no exit code.
const RESULT: u8 = 1 << 6;
/// That result is marked as an error.
const RESULT_ERROR: u8 = 1 << 7;

/// What only some rows have.
#[derive(Debug, Clone)]
enum Extra {
    /// The calls it opens, when they are not one call alone.
    Opens(Box<[u64]>),
    /// The calls it closes, when they are not one call alone.
    Closes(Box<[u64]>),
    /// Binary parts (images, documents): bytes and estimated tokens.
    Media(Cost),
    /// Standing parts (project instructions) kept when the row leaves.
    Standing(Box<[Standing]>),
    /// What it tells the state block, unless it is [`RESULT`].
    Facts(Facts),
    /// Its ask (prompt rows).
    Ask(Box<str>),
}

/// One row as the manager keeps it in memory (no bytes).
#[derive(Debug, Clone)]
pub(super) struct RowMem {
    pub(super) raw_hash: u64,
    pub(super) norm_hash: u64,
    /// [`Parsed::echo`](super::parse::Parsed::echo).
    pub(super) echo: u64,
    /// The hashed id of the one call it opens or closes ([`OPENS`],
    /// [`CLOSES`]); 0 = none inline.
    call: u64,
    pub(super) tokens: u32,
    pub(super) turn: u32,
    /// Lines of its section in its turn file.
    lines: u32,
    pub(super) kind: RowKind,
    flags: u8,
    extra: Box<[Extra]>,
}

/// A row's parts, as [`RowMem::new`] packs them.
pub(super) struct NewRow {
    pub(super) raw_hash: u64,
    pub(super) norm_hash: u64,
    pub(super) echo: u64,
    pub(super) kind: RowKind,
    pub(super) starts_ok: bool,
    pub(super) calls: Calls,
    pub(super) tokens: u32,
    pub(super) media: Cost,
    pub(super) turn: u32,
    pub(super) standing: Box<[Standing]>,
    /// It holds a server-side compaction block (the API drops what precedes it).
    pub(super) compaction: bool,
    pub(super) thread: RowThread,
    /// A branch or a sibling hid it (it is in no transcript).
    pub(super) hidden: bool,
}

/// The rare parts of a row, unpacked.
struct Rare {
    calls: Calls,
    media: Cost,
    standing: Box<[Standing]>,
    facts: Facts,
    ask: Option<Box<str>>,
}

impl RowMem {
    pub(super) fn new(n: NewRow) -> RowMem {
        let mut r = RowMem {
            raw_hash: n.raw_hash,
            norm_hash: n.norm_hash,
            echo: n.echo,
            call: 0,
            tokens: n.tokens,
            turn: n.turn,
            lines: n.thread.lines,
            kind: n.kind,
            flags: 0,
            extra: Box::default(),
        };
        r.set(STARTS_OK, n.starts_ok);
        r.set(COMPACTION, n.compaction);
        r.set(HIDDEN, n.hidden);
        r.pack(Rare {
            calls: n.calls,
            media: n.media,
            standing: n.standing,
            facts: n.thread.facts,
            ask: n.thread.ask,
        });
        r
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }

    /// Take the rare parts out (the row keeps its inline ones).
    fn unpack(&mut self) -> Rare {
        let mut rare = Rare {
            calls: Calls {
                opens: Box::default(),
                closes: Box::default(),
                binds_next: self.has(BINDS_NEXT),
            },
            media: Cost::default(),
            standing: Box::default(),
            facts: Facts::None,
            ask: None,
        };
        if self.has(OPENS) {
            rare.calls.opens = Box::new([self.call]);
        }
        if self.has(CLOSES) {
            rare.calls.closes = Box::new([self.call]);
        }
        if self.has(RESULT) {
            rare.facts = Facts::result(self.call, self.has(RESULT_ERROR));
        }
        for e in std::mem::take(&mut self.extra).into_vec() {
            match e {
                Extra::Opens(o) => rare.calls.opens = o,
                Extra::Closes(c) => rare.calls.closes = c,
                Extra::Media(m) => rare.media = m,
                Extra::Standing(s) => rare.standing = s,
                Extra::Facts(f) => rare.facts = f,
                Extra::Ask(a) => rare.ask = Some(a),
            }
        }
        rare
    }

    /// Keep the rare parts: inline what fits, the rest in the side list.
    fn pack(&mut self, rare: Rare) {
        self.flags &= STARTS_OK | COMPACTION | HIDDEN;
        self.call = 0;
        self.set(BINDS_NEXT, rare.calls.binds_next);
        let mut opens = None;
        let mut closes = None;
        match (&*rare.calls.opens, &*rare.calls.closes) {
            ([], []) => {}
            ([id], []) => {
                self.call = *id;
                self.flags |= OPENS;
            }
            ([], [id]) => {
                self.call = *id;
                self.flags |= CLOSES;
            }
            (o, c) => {
                opens = (!o.is_empty()).then_some(rare.calls.opens);
                closes = (!c.is_empty()).then_some(rare.calls.closes);
            }
        }
        let facts = match rare.facts.result_of() {
            Some((id, is_error)) if self.has(CLOSES) && id == self.call => {
                self.flags |= RESULT;
                self.set(RESULT_ERROR, is_error);
                None
            }
            _ => (!matches!(rare.facts, Facts::None)).then_some(rare.facts),
        };
        let parts = [
            opens.map(Extra::Opens),
            closes.map(Extra::Closes),
            (rare.media != Cost::default()).then_some(Extra::Media(rare.media)),
            (!rare.standing.is_empty()).then_some(Extra::Standing(rare.standing)),
            facts.map(Extra::Facts),
            rare.ask.map(Extra::Ask),
        ];
        // Exactly the room it needs: the list is never grown.
        let mut extra = Vec::with_capacity(parts.iter().flatten().count());
        extra.extend(parts.into_iter().flatten());
        self.extra = extra.into_boxed_slice();
    }

    pub(super) fn starts_ok(&self) -> bool {
        self.has(STARTS_OK)
    }

    pub(super) fn set_starts_ok(&mut self, on: bool) {
        self.set(STARTS_OK, on);
    }

    pub(super) fn compaction(&self) -> bool {
        self.has(COMPACTION)
    }

    pub(super) fn hidden(&self) -> bool {
        self.has(HIDDEN)
    }

    pub(super) fn set_hidden(&mut self) {
        self.set(HIDDEN, true);
    }

    /// The hashed ids of the calls it opens.
    pub(super) fn opens(&self) -> &[u64] {
        if self.has(OPENS) {
            return std::slice::from_ref(&self.call);
        }
        self.extra
            .iter()
            .find_map(|e| match e {
                Extra::Opens(o) => Some(&**o),
                _ => None,
            })
            .unwrap_or(&[])
    }

    /// The hashed ids of the calls it answers.
    pub(super) fn closes(&self) -> &[u64] {
        if self.has(CLOSES) {
            return std::slice::from_ref(&self.call);
        }
        self.extra
            .iter()
            .find_map(|e| match e {
                Extra::Closes(c) => Some(&**c),
                _ => None,
            })
            .unwrap_or(&[])
    }

    /// It binds to the row after it (a reasoning item and its call).
    pub(super) fn binds_next(&self) -> bool {
        self.has(BINDS_NEXT)
    }

    /// Its calls, as a [`Calls`] (to keep for a rollback).
    pub(super) fn calls(&self) -> Calls {
        Calls {
            opens: self.opens().into(),
            closes: self.closes().into(),
            binds_next: self.binds_next(),
        }
    }

    pub(super) fn set_calls(&mut self, calls: Calls) {
        let rare = self.unpack();
        self.pack(Rare { calls, ..rare });
    }

    /// Its images and documents: bytes and estimated tokens.
    pub(super) fn media(&self) -> Cost {
        self.extra
            .iter()
            .find_map(|e| match e {
                Extra::Media(m) => Some(*m),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// Its standing parts (project instructions) kept when the row leaves.
    pub(super) fn standing(&self) -> &[Standing] {
        self.extra
            .iter()
            .find_map(|e| match e {
                Extra::Standing(s) => Some(&**s),
                _ => None,
            })
            .unwrap_or(&[])
    }

    /// What it tells the state block's fold (None = nothing).
    pub(super) fn row_facts(&self) -> Option<Cow<'_, RowFacts>> {
        if self.has(RESULT) {
            return Some(Cow::Owned(
                Facts::result(self.call, self.has(RESULT_ERROR)).into_row_facts(),
            ));
        }
        self.extra.iter().find_map(|e| match e {
            Extra::Facts(f) => f.row_facts(),
            _ => None,
        })
    }

    /// Its ask (prompt rows).
    pub(super) fn ask(&self) -> Option<&str> {
        self.extra.iter().find_map(|e| match e {
            Extra::Ask(a) => Some(&**a),
            _ => None,
        })
    }

    /// Lines of its section in its turn file.
    pub(super) fn lines(&self) -> u32 {
        self.lines
    }

    /// What it tells the state block, read again (the ledger keeps an
    /// echo's bytes).
    pub(super) fn set_thread(&mut self, thread: RowThread) {
        let rare = self.unpack();
        self.lines = thread.lines;
        self.pack(Rare {
            facts: thread.facts,
            ask: thread.ask,
            ..rare
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect;
    use oceancode_window::{Dialect, StandingKind};
    use std::collections::HashSet;

    #[test]
    fn a_row_is_64_bytes_and_a_plain_one_allocates_nothing() {
        // Before the side list: 168 bytes, and a boxed slice per call list.
        assert_eq!(std::mem::size_of::<RowMem>(), 64);
        let r = row(Calls::default(), Facts::None, None);
        assert!(r.extra.is_empty());
    }

    fn row(calls: Calls, facts: Facts, ask: Option<&str>) -> RowMem {
        RowMem::new(NewRow {
            raw_hash: 1,
            norm_hash: 2,
            echo: 3,
            kind: RowKind::Assistant,
            starts_ok: true,
            calls,
            tokens: 4,
            media: Cost::default(),
            turn: 5,
            standing: Box::default(),
            compaction: false,
            thread: RowThread {
                facts,
                ask: ask.map(Box::from),
                lines: 6,
            },
            hidden: false,
        })
    }

    fn thread_of(kind: RowKind, raw: &str, commands: &mut HashSet<u64>) -> RowThread {
        RowThread::of(
            Dialect::Anthropic,
            1,
            "user",
            kind,
            raw,
            commands,
            &mut None,
        )
    }

    /// Every part read back as it went in, however it is packed.
    #[test]
    fn the_packed_parts_read_back_as_they_went_in() {
        let mut commands = HashSet::new();
        let call = r#"{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"Bash","input":{"command":"make"}}]}"#;
        let ok = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"done"}]}"#;
        let failed = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"no","is_error":true}]}"#;
        let exit = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"Exit code 2\nno"}]}"#;
        let a = dialect::raw_hash("a");
        let (b, c) = (dialect::raw_hash("b"), dialect::raw_hash("c"));
        let cases: Vec<(Calls, RowThread)> = vec![
            (Calls::default(), RowThread::default()),
            (
                Calls {
                    opens: Box::new([a]),
                    closes: Box::default(),
                    binds_next: true,
                },
                thread_of(RowKind::Assistant, call, &mut commands),
            ),
            (
                Calls {
                    opens: Box::default(),
                    closes: Box::new([a]),
                    binds_next: false,
                },
                thread_of(RowKind::ToolResult, ok, &mut commands),
            ),
            (
                Calls {
                    opens: Box::default(),
                    closes: Box::new([a]),
                    binds_next: false,
                },
                thread_of(RowKind::ToolResult, failed, &mut commands),
            ),
            (
                Calls {
                    opens: Box::default(),
                    closes: Box::new([a]),
                    binds_next: false,
                },
                thread_of(RowKind::ToolResult, exit, &mut commands),
            ),
            (
                // A result whose facts are of another call than it closes.
                Calls {
                    opens: Box::default(),
                    closes: Box::new([b]),
                    binds_next: false,
                },
                thread_of(RowKind::ToolResult, failed, &mut commands),
            ),
            (
                Calls {
                    opens: Box::new([b, c]),
                    closes: Box::new([a]),
                    binds_next: false,
                },
                RowThread {
                    facts: Facts::None,
                    ask: Some(Box::from("fix it")),
                    lines: 9,
                },
            ),
        ];
        for (calls, thread) in cases {
            let want_facts = thread.facts.row_facts().map(Cow::into_owned);
            let want_ask = thread.ask.clone();
            let standing = [Standing {
                part: 1,
                kind: StandingKind::Instructions,
                hash: 7,
            }];
            let media = Cost {
                bytes: 10,
                tokens: 20,
            };
            for (standing, media) in [(&standing[..], media), (&[][..], Cost::default())] {
                let r = RowMem::new(NewRow {
                    raw_hash: 1,
                    norm_hash: 2,
                    echo: 3,
                    kind: RowKind::ToolResult,
                    starts_ok: false,
                    calls: calls.clone(),
                    tokens: 4,
                    media,
                    turn: 5,
                    standing: standing.into(),
                    compaction: true,
                    thread: thread.clone(),
                    hidden: true,
                });
                assert_eq!(r.opens(), &*calls.opens);
                assert_eq!(r.closes(), &*calls.closes);
                assert_eq!(r.binds_next(), calls.binds_next);
                assert_eq!(r.row_facts().map(Cow::into_owned), want_facts);
                assert_eq!(r.ask(), want_ask.as_deref());
                assert_eq!(r.lines(), thread.lines);
                assert_eq!(r.media(), media);
                assert_eq!(r.standing(), standing);
                assert!(!r.starts_ok() && r.compaction() && r.hidden());
                assert_eq!((r.raw_hash, r.norm_hash, r.echo), (1, 2, 3));
                assert_eq!((r.tokens, r.turn, r.kind), (4, 5, RowKind::ToolResult));
            }
        }
    }

    /// A result's facts packed inline stay its facts when its calls change
    /// (an echo that drops a call, a rollback), and its ask stays too.
    #[test]
    fn the_facts_outlive_a_change_of_calls() {
        let mut commands = HashSet::new();
        let call = r#"{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"Bash","input":{"command":"make"}}]}"#;
        let failed = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"no","is_error":true}]}"#;
        thread_of(RowKind::Assistant, call, &mut commands);
        let a = dialect::raw_hash("a");
        let mut thread = thread_of(RowKind::ToolResult, failed, &mut commands);
        thread.ask = Some(Box::from("and then?"));
        let want = thread.facts.row_facts().map(Cow::into_owned);
        assert!(want.is_some());
        let closes_a = Calls {
            opens: Box::default(),
            closes: Box::new([a]),
            binds_next: false,
        };
        let mut r = row(closes_a.clone(), thread.facts, thread.ask.as_deref());
        r.set_calls(Calls::default());
        assert!(r.closes().is_empty());
        assert_eq!(r.row_facts().map(Cow::into_owned), want);
        r.set_calls(closes_a);
        assert_eq!(r.closes(), [a]);
        assert_eq!(r.row_facts().map(Cow::into_owned), want);
        assert_eq!(r.ask(), Some("and then?"));
        r.set_thread(RowThread::default());
        assert_eq!(r.row_facts(), None);
        assert_eq!(r.ask(), None);
        assert_eq!(r.closes(), [a]);
    }
}
