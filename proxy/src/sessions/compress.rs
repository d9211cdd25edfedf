//! `ledger.compress` on the request path: masking as the first tier of a
//! cut. When the window reaches the line, tool output older than the
//! protected zone becomes one pointer line to the verbatim record, and the
//! tideline cuts whole blocks only for what that cannot free
//! ([`eligible`] tells it what masking would save; the choice and the
//! splicing are pure, in `oceancode_window::compress`).
//!
//! The pruned set is chosen at an event only (masking, or a cut: the
//! window's start moved) and kept in the session's state with the pointer
//! text, so between events every request carries the very same bytes (the
//! prompt cache hits). An output, once a pointer, stays one while it is in
//! the window, so an event that only masks rewrites the window from its
//! first newly masked output on. The running round (the results after the
//! newest assistant message) is never pruned, and the ledger keeps every
//! original: this is rendering only.
//!
//! A pointer names the row's lines in its transcript file, placed from
//! memory as the ledger's writer renders them (the state block's rule, no
//! read on the request path), or as a [`Locator`] says; both with the
//! `recall entry` command that prints the original.

use super::state::State;
use crate::dialect::ParsedBody;
use oceancode_ledger::paths;
use oceancode_window::compress::{self as wc, Candidate, Location};
use oceancode_window::media::Cost;
use oceancode_window::{tideline, Pruned, RowKind};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where a session's row can be read in its transcript (`session id`,
/// `seq`), when the ledger has written it: the file and the lines of the
/// row. `None` = not known (yet): the pointer names the turn's file.
pub type Locator = Arc<dyn Fn(&str, u64) -> Option<Location> + Send + Sync>;

/// One tool output sent as a pointer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PrunedOutput {
    /// The output's index in its message.
    pub(super) part: u32,
    /// The pointer text (fixed until the next cut).
    pub(super) pointer: String,
    /// Estimated tokens of the original content.
    pub(super) tokens: u64,
    /// What it no longer costs (the gauge adds it).
    pub(super) saved: u64,
    /// Its images and documents (no longer sent).
    pub(super) media: Cost,
}

/// The pruned set of a session's window.
#[derive(Clone, Debug, Default)]
pub(super) struct Compressed {
    /// The window start (the last row that left) the set was chosen for;
    /// 0 = none yet.
    pub(super) at: u64,
    /// Pruned outputs by row seq.
    pub(super) rows: BTreeMap<u64, Vec<PrunedOutput>>,
    /// Σ saved.
    pub(super) saved: u64,
    /// Σ tokens.
    pub(super) tokens: u64,
    /// Outputs pruned.
    pub(super) outputs: u32,
    /// Rows the latest choice added (reported once with its step).
    pub(super) newly: Vec<u64>,
    /// Choices made so far (a request rolled back after one drops the set).
    pub(super) generation: u64,
    /// The tideline's masking tier asked for a new choice at this request.
    pub(super) due: bool,
}

impl Compressed {
    /// What the step's detail records: the counts, and the rows newly
    /// pruned at this step's cut.
    pub(super) fn detail(&mut self) -> Option<Pruned> {
        if self.outputs == 0 && self.newly.is_empty() {
            return None;
        }
        Some(Pruned {
            outputs: self.outputs,
            tokens: self.tokens,
            saved: self.saved,
            rows: std::mem::take(&mut self.newly),
        })
    }
}

/// The end of the rows compress may prune (index on the active line): the
/// running round, everything after the newest assistant message, never is.
fn running_round(st: &State, start: usize) -> usize {
    (start..st.active.len())
        .rev()
        .find(|&i| st.row(st.active[i]).kind == RowKind::Assistant)
        .unwrap_or(start)
}

/// A tool output of the active line: the row's index, its seq, its span.
type Output = (usize, u64, wc::Span);

/// The masking tier's measure for the tideline: what pointers for every
/// output [`wc::choose`] picks would save in the window that starts after
/// `upto` (the rows `parsed` maps onto the active line). The outputs are
/// read from the messages once, on the first call.
pub(super) fn eligible<'p>(
    st: &'p State,
    parsed: &'p ParsedBody<'_>,
    params: wc::Params,
) -> impl FnMut(u64) -> u64 + 'p {
    // A pointer of typical length (what each pruned output still costs).
    let typical = wc::pointer_text(
        u64::from(u32::MAX),
        99_999,
        &Location::Lines {
            file: "transcript/0000.md".into(),
            first: 99_999,
            last: 99_999,
        },
    );
    let mut outputs: Option<(Vec<tideline::RowInfo>, Vec<Output>)> = None;
    move |upto| {
        if st.active.len() > parsed.messages.len() {
            return 0;
        }
        let (infos, spans) = outputs.get_or_insert_with(|| {
            let end = running_round(st, 0);
            let spans = (0..end)
                .flat_map(|i| {
                    let seq = st.active[i];
                    wc::outputs(st.dialect, parsed.messages[i])
                        .into_iter()
                        .map(move |s| (i, seq, s))
                })
                .collect();
            (st.row_infos(), spans)
        });
        let start = tideline::plan_window(infos, upto).start;
        let in_window: Vec<&Output> = spans.iter().filter(|(i, _, _)| *i >= start).collect();
        let candidates: Vec<Candidate> = in_window
            .iter()
            .map(|(_, seq, s)| Candidate {
                seq: *seq,
                part: s.part,
                tokens: s.tokens(),
            })
            .collect();
        let chosen: std::collections::HashSet<(u64, u32)> =
            wc::choose(&candidates, params).into_iter().collect();
        in_window
            .iter()
            .filter(|(_, seq, s)| chosen.contains(&(*seq, s.part)))
            .map(|(_, _, s)| wc::saved_tokens(s, &typical))
            .sum()
    }
}

/// At an event (the masking tier asked for it, or the window's start moved
/// since the set was chosen), choose the pruned set again for the window
/// `parsed` renders to; otherwise keep it. Returns the number of outputs
/// newly pruned.
pub(super) fn refresh(
    st: &mut State,
    parsed: &ParsedBody<'_>,
    params: Option<wc::Params>,
    locate: Option<&Locator>,
) -> u32 {
    let due = std::mem::take(&mut st.compress.due);
    let Some(params) = params else {
        st.compress = Compressed::default();
        return 0;
    };
    if st.active.len() > parsed.messages.len() {
        return 0;
    }
    let cut_upto = st.tideline.cut_upto();
    // Before any cut the plan starts at the first row: nothing to choose
    // again (and no need to read the line's rows on every request).
    if !due && cut_upto == 0 {
        return 0;
    }
    let plan = tideline::plan_window(&st.row_infos(), cut_upto);
    // Between events the set stays (before any cut, what masking chose).
    if !due && (plan.effective_upto_seq == 0 || plan.effective_upto_seq == st.compress.at) {
        return 0;
    }
    if due {
        // A new choice: the window is rewritten from its first new pointer.
        st.restored_pointers = None;
    }
    let end = running_round(st, plan.start);
    let mut spans: HashMap<(u64, u32), wc::Span> = HashMap::new();
    let mut candidates = Vec::new();
    for i in plan.start..end {
        let seq = st.active[i];
        for s in wc::outputs(st.dialect, parsed.messages[i]) {
            candidates.push(Candidate {
                seq,
                part: s.part,
                tokens: s.tokens(),
            });
            spans.insert((seq, s.part), s);
        }
    }
    let mut before: std::collections::BTreeSet<u64> = st.compress.rows.keys().copied().collect();
    let mut next = Compressed {
        at: plan.effective_upto_seq,
        generation: st.compress.generation + 1,
        ..Compressed::default()
    };
    // A restarted proxy at the cut its predecessor last sent: the very same
    // pointers (the same bytes, so the prompt cache still hits), not a new
    // choice over the window as it has grown since.
    if st
        .restored_pointers
        .as_ref()
        .is_some_and(|r| r.upto != plan.effective_upto_seq)
    {
        st.restored_pointers = None;
    }
    let recorded: HashMap<(u64, u32), &str> = st
        .restored_pointers
        .iter()
        .flat_map(|r| &r.rows)
        .flat_map(|(seq, parts)| parts.iter().map(move |(p, t)| ((*seq, *p), t.as_str())))
        .collect();
    let chosen: Vec<(u64, u32)> = if st.restored_pointers.is_some() {
        before.extend(recorded.keys().map(|&(seq, _)| seq));
        let mut c: Vec<(u64, u32)> = recorded.keys().copied().collect();
        c.sort_unstable();
        c
    } else {
        wc::choose(&candidates, params)
    };
    // Where each row is in its turn file, as the writer renders it (from
    // memory: no read on the request path).
    let placed: HashMap<u64, (u32, u32, u32)> =
        if chosen.is_empty() || locate.is_some() || !recorded.is_empty() {
            HashMap::new()
        } else {
            let upto = chosen.iter().map(|&(seq, _)| seq).max().unwrap_or(0);
            super::thread::row_lines(st, upto)
                .into_iter()
                .map(|l| (l.seq, (l.turn, l.first, l.last)))
                .collect()
        };
    for (seq, part) in chosen {
        let Some(span) = spans.get(&(seq, part)) else {
            continue;
        };
        let at = || {
            locate
                .and_then(|l| l(&st.meta.id, seq))
                .or_else(|| {
                    placed
                        .get(&seq)
                        .map(|&(turn, first, last)| Location::Lines {
                            file: format!("transcript/{}", paths::turn_file_name(turn)),
                            first: first.into(),
                            last: last.into(),
                        })
                })
                .unwrap_or_else(|| {
                    Location::File(format!(
                        "transcript/{}",
                        paths::turn_file_name(st.row(seq).turn)
                    ))
                })
        };
        let tokens = span.tokens();
        let pointer = match recorded.get(&(seq, part)) {
            Some(text) => (*text).to_string(),
            None => wc::pointer_text(seq, tokens, &at()),
        };
        let saved = wc::saved_tokens(span, &pointer);
        next.saved += saved;
        next.tokens += tokens;
        next.outputs += 1;
        next.rows.entry(seq).or_default().push(PrunedOutput {
            part,
            pointer,
            tokens,
            saved,
            media: span.media,
        });
    }
    let newly: Vec<u64> = next
        .rows
        .keys()
        .copied()
        .filter(|s| !before.contains(s))
        .collect();
    let added = newly.iter().map(|s| next.rows[s].len() as u32).sum::<u32>();
    next.newly = newly;
    st.compress = next;
    added
}

/// The retained messages from `start` on, with their pruned outputs as
/// pointers: `(index, rewritten message)` for the messages that change,
/// and the images and documents no longer sent.
pub(super) fn rewritten(
    st: &State,
    parsed: &ParsedBody<'_>,
    start: usize,
) -> (HashMap<usize, String>, Cost) {
    let mut out = HashMap::new();
    let mut media = Cost::default();
    if st.compress.rows.is_empty() {
        return (out, media);
    }
    for i in start..parsed.messages.len().min(st.active.len()) {
        let Some(pruned) = st.compress.rows.get(&st.active[i]) else {
            continue;
        };
        let parts: Vec<(u32, &str)> = pruned
            .iter()
            .map(|p| (p.part, p.pointer.as_str()))
            .collect();
        if let Some(m) = wc::rewrite(st.dialect, parsed.messages[i], &parts) {
            media = pruned.iter().fold(media, |c, p| c.plus(p.media));
            out.insert(i, m);
        }
    }
    (out, media)
}
