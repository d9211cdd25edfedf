//! Keeping the thread across a cut: what each row states for the state
//! block (its engine facts, its ask, its lines in the transcript), read
//! once from the bytes the ledger keeps, and the block for a window's cut
//! ([`oceancode_ledger::state_block`], pure), cached until the cut moves.
//!
//! The block depends only on rows up to the cut, so its bytes stay the same
//! between cuts (the prompt cache keeps hitting), and a session read back
//! from the ledger gives the same bytes (its rows are the same bytes).

use super::state::State;
use oceancode_ledger::facts::{self, RowFacts};
use oceancode_ledger::state_block::{self, Ask, StateFacts, StateInput};
use oceancode_ledger::tideline::WindowPlan;
use oceancode_ledger::transcript::{self, RowLines};
use oceancode_ledger::{Dialect, RowKind};
use std::collections::HashMap;
use std::sync::Arc;

/// What one row tells the state block.
#[derive(Debug, Clone, Default)]
pub(super) struct RowThread {
    /// Its tool calls and results (None = none).
    facts: Option<Box<RowFacts>>,
    /// Its ask (prompt rows).
    ask: Option<Box<str>>,
    /// Lines of its section in its turn file.
    pub(super) lines: u32,
}

impl RowThread {
    /// Read a row as the ledger keeps it.
    pub(super) fn of(
        dialect: Dialect,
        seq: u64,
        role: &str,
        kind: RowKind,
        raw: &str,
    ) -> RowThread {
        let f = match kind {
            RowKind::Assistant | RowKind::ToolResult | RowKind::Prompt | RowKind::Other => {
                facts::row_facts(dialect, raw)
            }
            RowKind::System => RowFacts::default(),
        };
        RowThread {
            facts: (!f.is_empty()).then(|| Box::new(f)),
            ask: (kind == RowKind::Prompt)
                .then(|| facts::ask_text(dialect, raw))
                .flatten()
                .map(String::into_boxed_str),
            lines: transcript::section_lines(dialect, seq, role, raw),
        }
    }
}

/// What a cached block was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BlockKey {
    upto: u64,
    start: usize,
    pinned: Option<usize>,
    hidden_gen: u32,
    max_tokens: u32,
}

/// The last block rendered.
pub(super) type BlockCache = parking_lot::Mutex<Option<(BlockKey, Option<Arc<str>>)>>;

/// The state block for a window planned as `plan` on the active line
/// (`dir`: the session directory the stub names), from the cache while the
/// cut has not moved.
pub(super) fn block(st: &State, plan: &WindowPlan, dir: &str, max_tokens: u32) -> Option<Arc<str>> {
    let key = BlockKey {
        upto: plan.effective_upto_seq,
        start: plan.start,
        pinned: plan.pinned_prompt,
        hidden_gen: st.hidden_gen,
        max_tokens,
    };
    let mut cache = st.block_cache.lock();
    if let Some((k, b)) = cache.as_ref() {
        if *k == key {
            return b.clone();
        }
    }
    let b = render(st, plan, dir, max_tokens).map(Arc::from);
    *cache = Some((key, b.clone()));
    b
}

/// Render the block (no cache).
fn render(st: &State, plan: &WindowPlan, dir: &str, max_tokens: u32) -> Option<String> {
    let upto = plan.effective_upto_seq;
    let mut f = StateFacts::new();
    let mut goal: Option<Ask> = None;
    let mut latest: Option<Ask> = None;
    for (i, &seq) in st.active.iter().enumerate().take(plan.start) {
        let r = st.row(seq);
        if let Some(x) = &r.thread.facts {
            f.add(seq, r.turn, x);
        }
        if let Some(a) = &r.thread.ask {
            let ask = Ask {
                turn: r.turn,
                seq,
                text: a.to_string(),
            };
            if goal.is_none() {
                goal = Some(ask);
            } else if Some(i) != plan.pinned_prompt {
                latest = Some(ask);
            }
        }
    }
    if goal.is_none() {
        // The first ask is in the window: still the session's goal.
        goal = st.active.iter().find_map(|&seq| {
            let r = st.row(seq);
            r.thread.ask.as_ref().map(|a| Ask {
                turn: r.turn,
                seq,
                text: a.to_string(),
            })
        });
    }
    let lines = row_lines(st, upto);
    state_block::render(
        &StateInput {
            upto_seq: upto,
            session: &st.meta.id,
            dir,
            goal,
            latest_ask: latest,
            facts: &f,
            lines: &lines,
        },
        max_tokens,
    )
}

/// Where every row up to `upto` is in its turn file, as the ledger's
/// writer renders it: the rows of a turn file are the turn's rows no
/// branch hid (an answer never echoed is in it too), in seq order.
fn row_lines(st: &State, upto: u64) -> Vec<RowLines> {
    let mut at: HashMap<u32, u32> = HashMap::new();
    let mut out = Vec::new();
    for (i, r) in st.rows.iter().enumerate().take(upto as usize) {
        if r.hidden {
            continue;
        }
        let seq = i as u64 + 1;
        let before = *at
            .entry(r.turn)
            .or_insert_with(|| transcript::line_count(&transcript::render_turn_head(r.turn)));
        let placed = RowLines {
            seq,
            turn: r.turn,
            first: before + 2,
            last: before + r.thread.lines,
        };
        at.insert(r.turn, before + r.thread.lines);
        out.push(placed);
    }
    out
}
