//! The tideline: pure window logic (no I/O, no clock, no async).
//!
//! * [`effective_line`] / [`block_tokens`] turn the configured specs into token counts.
//! * [`Tideline`] is one session's state machine: blocks close as the gauge grows,
//!   and while the gauge is at or over the line the oldest *closed* block is cut.
//!   Everything with `seq <= cut_upto()` is out of the window; `cut_upto` only
//!   moves at a cut, so between cuts the outgoing request only appends.
//! * [`plan_window`] turns `cut_upto` into a valid start on the active line.
//! * [`plan_pins`] picks the standing parts (project instructions) of the rows
//!   that left, kept with the stub.
//! * [`stub_text`] is the byte-stable line that replaces the cut rows.
//!
//! Gauge frame: a closed block's size is the *settled* gauge growth while it was
//! open (`settled = gauge - added`, the provider's measure of the window through
//! `boundary_seq`). A cut subtracts the block's size from the gauge as a
//! prediction; the next observation re-anchors the open block on the real
//! numbers, so estimate errors (stub, system prompt, pins) never accumulate.

use crate::model::{RowKind, Standing, StandingKind};
use oceancode_config::{BlockSpec, LineSpec, MIN_FIXED_LINE};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The most output a line keeps room for (tokens).
pub const MAX_OUTPUT_ALLOWANCE: u64 = 32_000;
/// `tokens: 0` when the model's context is unknown.
pub const UNKNOWN_CEILING_LINE: u64 = 120_000;
/// A percent line when the model's context is unknown.
pub const UNKNOWN_CONTEXT_LINE: u64 = 300_000;
/// The smallest block (tokens).
pub const MIN_BLOCK: u64 = 1_000;
/// At most this many cut turns are listed under the stub (the newest ones).
pub const STUB_MAX_TURNS: usize = 20;
/// A stub turn line is at most this many characters.
pub const STUB_TURN_LINE_CHARS: usize = 80;

/// The line in tokens and how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineCalc {
    /// The line (tokens, at least 1).
    pub line: u64,
    /// The context window it was computed against, if known.
    pub context: Option<u64>,
    /// True when the line was lowered to `context - output allowance` (log one note).
    pub clamped: bool,
}

/// Output room a request keeps: its `max_tokens`, else the model's max output,
/// else the cap; never more than [`MAX_OUTPUT_ALLOWANCE`].
pub fn output_allowance(max_output: Option<u64>, request_max_tokens: Option<u64>) -> u64 {
    request_max_tokens
        .or(max_output)
        .unwrap_or(MAX_OUTPUT_ALLOWANCE)
        .min(MAX_OUTPUT_ALLOWANCE)
}

/// The line in tokens for `spec` on a model with `context` (None = unknown).
///
/// `Percent(p)` → `max(context * p / 100, MIN_FIXED_LINE)` (unknown context:
/// 300 000). `Tokens(n > 0)` → `max(n, MIN_FIXED_LINE)`. `Tokens(0)` → the ceiling `context - allowance`
/// (unknown: 120 000). With a known context the line never exceeds the ceiling
/// (`clamped` says it was lowered).
pub fn effective_line(
    spec: LineSpec,
    context: Option<u64>,
    max_output: Option<u64>,
    request_max_tokens: Option<u64>,
) -> LineCalc {
    let ceiling =
        context.map(|c| c.saturating_sub(output_allowance(max_output, request_max_tokens)));
    let wanted = match (spec, context) {
        (LineSpec::Percent(p), Some(c)) => {
            let p = if p.is_finite() && p > 0.0 {
                p.min(100.0)
            } else {
                40.0
            };
            // The floor of a fixed line holds for a share too.
            ((c as f64 * p / 100.0).floor() as u64).max(MIN_FIXED_LINE)
        }
        (LineSpec::Percent(_), None) => UNKNOWN_CONTEXT_LINE,
        (LineSpec::Tokens(0), _) => ceiling.unwrap_or(UNKNOWN_CEILING_LINE),
        (LineSpec::Tokens(n), _) => n.max(MIN_FIXED_LINE),
    };
    let (line, clamped) = match ceiling {
        Some(ceil) if wanted > ceil => (ceil, true),
        _ => (wanted, false),
    };
    LineCalc {
        line: line.max(1),
        context,
        clamped,
    }
}

/// The block size in tokens: `Tokens(n)` or `p%` of the line, kept within
/// `[MIN_BLOCK, max(line, MIN_BLOCK)]` (a block larger than the line would let the
/// window overshoot by more than the line itself).
pub fn block_tokens(spec: BlockSpec, line: u64) -> u64 {
    let raw = match spec {
        BlockSpec::Tokens(n) => n,
        BlockSpec::PercentOfLine(p) => {
            let p = if p.is_finite() && p > 0.0 {
                p.min(100.0)
            } else {
                70.0
            };
            (line as f64 * p / 100.0).floor() as u64
        }
    };
    raw.clamp(MIN_BLOCK, line.max(MIN_BLOCK))
}

/// A cold request closes the open block early only when that frees at
/// least `block / COLD_SPLIT_MIN` tokens: smaller cuts would change the
/// window's stub for little ([`Tideline::cut_cold`]).
pub const COLD_SPLIT_MIN: u64 = 4;

/// The numbers in force for one observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    /// The line (tokens).
    pub line: u64,
    /// The block size (tokens).
    pub block: u64,
}

impl Params {
    /// `line` with the block computed from `block` by [`block_tokens`].
    pub fn new(line: u64, block: BlockSpec) -> Params {
        Params {
            line,
            block: block_tokens(block, line),
        }
    }
}

/// What the proxy knows when a request arrives, before rendering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Observation {
    /// Previous step's real `window_total` plus the estimate of the rows added since.
    pub gauge: u64,
    /// The part of `gauge` that is the estimate of the rows after `boundary_seq`
    /// (0 if unknown: block sizes then include those rows).
    pub added: u64,
    /// Seq of the last row that existed before this request's new rows.
    pub boundary_seq: u64,
    /// Seq of the newest row.
    pub last_seq: u64,
}

/// A cut that happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutInfo {
    /// Every row with `seq <= upto_seq` left the window (the new `cut_upto`).
    pub upto_seq: u64,
    /// Gauge before the cut.
    pub gauge_before: u64,
    /// Predicted gauge after the cut.
    pub gauge_after: u64,
    /// How many blocks left.
    pub blocks_cut: u32,
}

/// The result of [`Tideline::observe`] / [`Tideline::seed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The cut made by this observation, if any.
    pub cut: Option<CutInfo>,
    /// The gauge after any cut (predicted).
    pub gauge: u64,
    /// The line in force.
    pub line: u64,
    /// With a [`Mask`] tier: this observation was an event that masks more
    /// tool output than the window sent before (with or without a cut).
    #[serde(default)]
    pub masked: bool,
}

/// Masking as the first tier of a cut (`ledger.compress`), for
/// [`Tideline::observe_masked`] / [`Tideline::seed_masked`].
///
/// The gauge stays the *uncompressed* window (the caller adds what its
/// pointers save), so blocks keep their sizes; the line is compared with
/// the real window, `gauge − saved`. When that reaches the line, the event
/// first masks every eligible tool output of the window (`all`), and cuts
/// whole blocks, oldest first, only while the real window would still be
/// over `line − free`.
pub struct Mask<'a> {
    /// What the pointers of the window as last sent save.
    pub saved: u64,
    /// An event brings the real window down to `line − free` when it can.
    pub free: u64,
    /// What masking every eligible tool output of the rows after `upto`
    /// (the window if every row up to `upto` left) would save.
    pub all: &'a mut dyn FnMut(u64) -> u64,
}

impl std::fmt::Debug for Mask<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mask")
            .field("saved", &self.saved)
            .field("free", &self.free)
            .finish_non_exhaustive()
    }
}

/// A block that stopped growing and can be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedBlock {
    /// First seq in the block.
    pub first_seq: u64,
    /// Last seq in the block (a cut of this block sets `cut_upto` to it).
    pub last_seq: u64,
    /// Settled gauge growth while it was open (seeded: sum of row estimates).
    pub tokens: u64,
}

/// The block being filled; never cut by [`Tideline::observe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenBlock {
    /// First seq that belongs to it.
    pub first_seq: u64,
    /// The settled gauge when it opened (shifted down by later cuts).
    pub opened_at: u64,
}

impl Default for OpenBlock {
    fn default() -> Self {
        OpenBlock {
            first_seq: 1,
            opened_at: 0,
        }
    }
}

/// One session's tideline state (persist it with serde).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tideline {
    closed: Vec<ClosedBlock>,
    open: OpenBlock,
    cut_upto: u64,
    gauge: u64,
    /// The last observation's `added` (shifted with the gauge).
    added: u64,
    /// False until the first observe/seed fixed the gauge frame.
    anchored: bool,
    /// After a cut or a seed the gauge is a prediction: the next observation sets
    /// `open.opened_at = settled - carry` (carry = the open block's growth).
    reanchor: Option<u64>,
}

impl Tideline {
    /// A fresh session: nothing cut, one empty open block.
    pub fn new() -> Tideline {
        Tideline::default()
    }

    /// A session read back from the ledger whose rows up to `cut_upto` were
    /// already cut: they stay cut (a cut is never undone). Call
    /// [`Tideline::seed`] next to rebuild the blocks of what is retained.
    pub fn resume(cut_upto: u64) -> Tideline {
        Tideline {
            cut_upto,
            open: OpenBlock {
                first_seq: cut_upto + 1,
                opened_at: 0,
            },
            ..Tideline::default()
        }
    }

    /// Every row with `seq <= cut_upto` is out of the window (0 = nothing cut).
    pub fn cut_upto(&self) -> u64 {
        self.cut_upto
    }

    /// The gauge after the last observation or cut (predicted after a cut).
    pub fn gauge(&self) -> u64 {
        self.gauge
    }

    /// Closed blocks not yet cut, oldest first.
    pub fn closed_blocks(&self) -> &[ClosedBlock] {
        &self.closed
    }

    /// The block being filled.
    pub fn open_block(&self) -> OpenBlock {
        self.open
    }

    /// A new request arrived (call before rendering, with measured usage).
    ///
    /// If the open block grew by `block` since it opened it closes at
    /// `boundary_seq` (when it holds rows up to there); then while the gauge is at
    /// or over the line the oldest closed block is cut. Rows after `boundary_seq`
    /// (this request's own rows) are never cut here, nor is the open block.
    pub fn observe(&mut self, obs: Observation, params: Params) -> Decision {
        self.observe_inner(obs, params, None)
    }

    /// [`Tideline::observe`] with masking as the first tier (see [`Mask`]):
    /// nothing happens while the real window is under the line; at or over
    /// it, masking comes first and whole blocks leave only for what it
    /// cannot free.
    pub fn observe_masked(&mut self, obs: Observation, params: Params, mask: Mask<'_>) -> Decision {
        self.observe_inner(obs, params, Some(mask))
    }

    fn observe_inner(
        &mut self,
        obs: Observation,
        params: Params,
        mask: Option<Mask<'_>>,
    ) -> Decision {
        let boundary = obs.boundary_seq.min(obs.last_seq);
        let added = obs.added.min(obs.gauge);
        let settled = obs.gauge - added;
        let mut force_reanchor = false;
        if !self.anchored {
            self.anchored = true;
            if boundary == 0 {
                // A brand-new session: what is there now is not growth, and the
                // next (real) measurement re-anchors past the system prompt.
                self.open.opened_at = settled;
                force_reanchor = true;
            } else {
                // History without a seed: all of it counts as growth, so it can close and be cut.
                self.open.opened_at = 0;
            }
        } else if let Some(carry) = self.reanchor.take() {
            self.open.opened_at = settled.saturating_sub(carry);
        }
        self.open.opened_at = self.open.opened_at.min(settled);
        self.step(obs.gauge, added, boundary, params, force_reanchor, mask)
    }

    /// Rebuild the blocks from row estimates when the history has no measured
    /// usage (first request of a session the proxy has not measured: resumed, or
    /// after a restart, or after a branch), then cut like [`Tideline::observe`].
    ///
    /// `rows` is the active line as `(seq, estimated tokens)` in order; rows with
    /// `seq <= cut_upto()` are skipped (a cut is never undone). Blocks close only at
    /// rows up to `obs.boundary_seq`, each when its estimate reaches `block`.
    /// `obs.gauge` is the whole request's estimate (system prompt and tools
    /// included); it is raised to the rows' sum if lower.
    pub fn seed(&mut self, rows: &[(u64, u64)], obs: Observation, params: Params) -> Decision {
        self.seed_inner(rows, obs, params, None)
    }

    /// [`Tideline::seed`] with masking as the first tier (see [`Mask`]).
    pub fn seed_masked(
        &mut self,
        rows: &[(u64, u64)],
        obs: Observation,
        params: Params,
        mask: Mask<'_>,
    ) -> Decision {
        self.seed_inner(rows, obs, params, Some(mask))
    }

    fn seed_inner(
        &mut self,
        rows: &[(u64, u64)],
        obs: Observation,
        params: Params,
        mask: Option<Mask<'_>>,
    ) -> Decision {
        let block = params.block.max(1);
        let boundary = obs.boundary_seq.min(obs.last_seq);
        let live = rows.iter().filter(|(seq, _)| *seq > self.cut_upto);
        self.closed.clear();
        let mut total = 0u64;
        let mut upto_boundary = 0u64;
        let mut acc = 0u64;
        let mut first: Option<u64> = None;
        for &(seq, tokens) in live {
            total = total.saturating_add(tokens);
            if seq > boundary {
                continue;
            }
            upto_boundary = upto_boundary.saturating_add(tokens);
            let start = *first.get_or_insert(seq);
            acc = acc.saturating_add(tokens);
            if acc >= block {
                self.closed.push(ClosedBlock {
                    first_seq: start,
                    last_seq: seq,
                    tokens: acc,
                });
                acc = 0;
                first = None;
            }
        }
        let closed_sum: u64 = self.closed.iter().map(|b| b.tokens).sum();
        let gauge = obs.gauge.max(total);
        let base = gauge - total;
        self.open = OpenBlock {
            first_seq: self
                .closed
                .last()
                .map_or(self.cut_upto + 1, |b| b.last_seq + 1),
            opened_at: base.saturating_add(closed_sum),
        };
        self.anchored = true;
        self.reanchor = None;
        let added = total - upto_boundary;
        self.step(gauge, added, boundary, params, true, mask)
    }

    /// `/tideline now`: cut the oldest closed block; if there is none, close the
    /// open block at `boundary_seq` and cut that. Never cuts a row after
    /// `boundary_seq`. Call after [`Tideline::observe`] of the same request, with
    /// its boundary. `None` when there is nothing to cut.
    pub fn cut_now(&mut self, boundary_seq: u64) -> Option<CutInfo> {
        let cuttable = matches!(self.closed.first(), Some(b) if b.last_seq <= boundary_seq);
        if !cuttable {
            self.close_open(boundary_seq);
        }
        let gauge_before = self.gauge;
        let carry = self.open_growth();
        self.cut_oldest(boundary_seq)?;
        self.reanchor = Some(carry);
        Some(CutInfo {
            upto_seq: self.cut_upto,
            gauge_before,
            gauge_after: self.gauge,
            blocks_cut: 1,
        })
    }

    /// A request that finds the prompt cache cold
    /// ([`crate::cache::cold`]) rewrites the whole prefix anyway, so a cut
    /// made there costs nothing:
    ///
    /// - when a cut is due within the next block of growth
    ///   (`gauge + block >= line`), the oldest closed blocks go now, as the
    ///   next due cut would take them, while that holds;
    /// - else, when the window holds at least a quarter of a block
    ///   ([`COLD_SPLIT_MIN`]) over what a due cut keeps (`line - block`),
    ///   the open block closes early at the row that brings the gauge down
    ///   to that level, and goes (not when the rows up to the boundary
    ///   cannot bring it there). The window after it keeps what a due cut
    ///   keeps; the next due cut comes a block of growth later.
    ///
    /// `rows` are the active line's rows after the cut, in order, with
    /// their token estimates (`(seq, tokens)`; only the open block's are
    /// read). Only rows up to `boundary_seq` go. Call after
    /// [`Tideline::observe`] or [`Tideline::seed`] of the same request.
    /// `None` when nothing is due or nothing can go.
    pub fn cut_cold(
        &mut self,
        boundary_seq: u64,
        params: Params,
        rows: impl IntoIterator<Item = (u64, u64)>,
    ) -> Option<CutInfo> {
        let block = params.block.max(1);
        let cut = self.cut_closed_while(boundary_seq, |t| {
            t.gauge.saturating_add(block) >= params.line
        });
        if cut.is_some() {
            return cut;
        }
        let keep = params.line.saturating_sub(block);
        let min_free = (block / COLD_SPLIT_MIN).max(1);
        if self.gauge < keep.saturating_add(min_free) || !self.closed.is_empty() {
            return None;
        }
        // The open block's oldest rows, until what is left is a due cut's level.
        let mut split = None;
        let mut freed = 0u64;
        for (seq, tokens) in rows {
            if seq < self.open.first_seq {
                continue;
            }
            if seq > boundary_seq {
                break;
            }
            freed = freed.saturating_add(tokens);
            split = Some(seq);
            if self.gauge.saturating_sub(freed) <= keep {
                break;
            }
        }
        let split = split?;
        // Only a cut that lands where a due cut would: when this request's
        // own rows and the fixed part are over that level already, cutting
        // every earlier row would leave less than a due cut keeps.
        if freed < min_free || self.gauge.saturating_sub(freed) > keep {
            return None;
        }
        self.close_open_at(split, freed);
        // It is the only closed block.
        self.cut_closed_while(boundary_seq, |_| true)
    }

    /// "Prompt is too long" retry: close the open block at `boundary_seq` and cut
    /// every closed block. `None` when there is nothing to cut.
    pub fn cut_all_closed(&mut self, boundary_seq: u64) -> Option<CutInfo> {
        self.close_open(boundary_seq);
        self.cut_closed_while(boundary_seq, |_| true)
    }

    /// Cut the oldest closed blocks ending by `boundary_seq` while `more`
    /// holds (checked before each); the open block's growth is carried
    /// over. `None` when no block went.
    fn cut_closed_while(
        &mut self,
        boundary_seq: u64,
        more: impl Fn(&Self) -> bool,
    ) -> Option<CutInfo> {
        let gauge_before = self.gauge;
        let carry = self.open_growth();
        let mut blocks_cut = 0u32;
        while more(self) && self.cut_oldest(boundary_seq).is_some() {
            blocks_cut += 1;
        }
        if blocks_cut == 0 {
            return None;
        }
        self.reanchor = Some(carry);
        Some(CutInfo {
            upto_seq: self.cut_upto,
            gauge_before,
            gauge_after: self.gauge,
            blocks_cut,
        })
    }

    /// The provider itself dropped every row up to `seq` from the requests
    /// (Anthropic's server-side compaction drops what precedes its block):
    /// those rows are out of the window from now on, like a cut, but the
    /// gauge, which the provider's numbers never counted them in since, stays.
    /// Blocks that end by `seq` go; one that straddles it keeps its rows
    /// after `seq`. False when nothing changed.
    pub fn drop_through(&mut self, seq: u64) -> bool {
        if seq <= self.cut_upto {
            return false;
        }
        self.closed.retain(|b| b.last_seq > seq);
        for b in &mut self.closed {
            b.first_seq = b.first_seq.max(seq + 1);
        }
        self.open.first_seq = self.open.first_seq.max(seq + 1);
        self.cut_upto = seq;
        true
    }

    /// Close-if-grown, then the cut loop (with a [`Mask`]: the masking
    /// tier first). `gauge`/`added` are in the current frame.
    fn step(
        &mut self,
        gauge: u64,
        added: u64,
        boundary: u64,
        params: Params,
        force_reanchor: bool,
        mask: Option<Mask<'_>>,
    ) -> Decision {
        self.gauge = gauge;
        self.added = added;
        if gauge.saturating_sub(self.open.opened_at) >= params.block.max(1) {
            self.close_open(boundary);
        }
        let carry = self.open_growth();
        let gauge_before = self.gauge;
        let mut blocks_cut = 0u32;
        let mut masked = false;
        match mask {
            None => {
                while self.gauge >= params.line && self.cut_oldest(boundary).is_some() {
                    blocks_cut += 1;
                }
            }
            Some(m) if self.gauge.saturating_sub(m.saved) >= params.line => {
                let target = params.line.saturating_sub(m.free);
                let mut all = (m.all)(self.cut_upto);
                while self.gauge.saturating_sub(all) > target && self.cut_oldest(boundary).is_some()
                {
                    blocks_cut += 1;
                    all = (m.all)(self.cut_upto);
                }
                masked = blocks_cut > 0 || all > m.saved;
            }
            Some(_) => {}
        }
        if blocks_cut > 0 || force_reanchor {
            self.reanchor = Some(carry);
        }
        Decision {
            cut: (blocks_cut > 0).then_some(CutInfo {
                upto_seq: self.cut_upto,
                gauge_before,
                gauge_after: self.gauge,
                blocks_cut,
            }),
            gauge: self.gauge,
            line: params.line,
            masked,
        }
    }

    /// The open block's growth in the current frame.
    fn open_growth(&self) -> u64 {
        self.gauge.saturating_sub(self.open.opened_at)
    }

    /// Close the open block at `boundary` if it holds rows up to there.
    fn close_open(&mut self, boundary: u64) -> bool {
        if self.open.first_seq > boundary || boundary <= self.cut_upto {
            return false;
        }
        let settled = self.gauge.saturating_sub(self.added);
        self.close_open_at(boundary, settled.saturating_sub(self.open.opened_at));
        true
    }

    /// Close the open block after `last_seq`, with `tokens` of growth: the
    /// next open block starts that much higher.
    fn close_open_at(&mut self, last_seq: u64, tokens: u64) {
        self.closed.push(ClosedBlock {
            first_seq: self.open.first_seq,
            last_seq,
            tokens,
        });
        self.open = OpenBlock {
            first_seq: last_seq + 1,
            opened_at: self.open.opened_at.saturating_add(tokens),
        };
    }

    /// Cut the oldest closed block if it ends at or before `boundary`.
    fn cut_oldest(&mut self, boundary: u64) -> Option<ClosedBlock> {
        let b = *self.closed.first()?;
        if b.last_seq > boundary {
            return None;
        }
        self.closed.remove(0);
        self.cut_upto = self.cut_upto.max(b.last_seq);
        self.gauge = self.gauge.saturating_sub(b.tokens);
        self.open.opened_at = self.open.opened_at.saturating_sub(b.tokens);
        Some(b)
    }
}

/// One row of the session's active line, as [`plan_window`] needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowInfo {
    /// The row's seq (ascending along the line).
    pub seq: u64,
    /// Its kind.
    pub kind: RowKind,
    /// The dialect allows the window (after the stub) to start at this row:
    /// it does not answer a call made before it.
    pub starts_ok: bool,
}

/// Where the rendered window starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Index of the first retained row.
    pub start: usize,
    /// Seq of the row before `start` (what the stub names); 0 = no stub.
    pub effective_upto_seq: u64,
    /// Index of a Prompt row before `start` to render right after the stub.
    pub pinned_prompt: Option<usize>,
}

/// Plan the window for `rows` (the active line, in order) given `cut_upto`.
///
/// * `i0` = first row with `seq > cut_upto`; none → the last row (the newest
///   step is never cut). `i0 == 0` → start 0 (nothing on this line is cut).
/// * start = the nearest row at or **before** `i0` with `starts_ok`; none → 0
///   (keep everything: the client's own request is valid). Searching backwards
///   keeps a call with its result, never cuts rows of the block being filled,
///   and depends only on rows that exist at the cut, so the plan is stable
///   while rows are appended (prompt cache).
/// * pinned_prompt = the last Prompt row before start, when the window starts
///   mid-turn (rows\[start\] is not a Prompt) and that row is `starts_ok`; this
///   covers "the newest ask is never cut" and stays stable between cuts. A
///   pinned row right before start becomes the start instead (nothing between
///   them was cut), so `effective_upto_seq` is always the last row that left.
/// * effective_upto_seq = the seq of the row before start: the last row that
///   actually left the window (at most `cut_upto`). Every row up to it left,
///   except the pinned prompt, the system rows the renderer keeps and the
///   standing parts [`plan_pins`] keeps.
pub fn plan_window(rows: &[RowInfo], cut_upto: u64) -> WindowPlan {
    let none = WindowPlan {
        start: 0,
        effective_upto_seq: 0,
        pinned_prompt: None,
    };
    if rows.is_empty() {
        return none;
    }
    let i0 = rows
        .iter()
        .position(|r| r.seq > cut_upto)
        .unwrap_or(rows.len() - 1);
    let start = (1..=i0).rev().find(|&i| rows[i].starts_ok).unwrap_or(0);
    if start == 0 {
        return none;
    }
    let pinned_prompt = if rows[start].kind == RowKind::Prompt {
        None
    } else {
        rows[..start]
            .iter()
            .rposition(|r| r.kind == RowKind::Prompt)
            .filter(|&i| rows[i].starts_ok)
    };
    // A pinned ask right before the start is simply where the window starts:
    // then every row before it left, and the stub can say so.
    let (start, pinned_prompt) = match pinned_prompt {
        Some(p) if p + 1 == start => (p, None),
        other => (start, other),
    };
    if start == 0 {
        return none;
    }
    WindowPlan {
        start,
        effective_upto_seq: rows[start - 1].seq,
        pinned_prompt,
    }
}

/// A standing part kept in a cut window: `part` of the row at index `row`
/// of the line (a row before the window's start that left it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    /// Index of the row on the line.
    pub row: usize,
    /// Index of the part in that row's content.
    pub part: u32,
}

/// The standing parts a cut window keeps from the rows that left it, in
/// their original order (rendered with the stub, right after its text).
///
/// Rows that left = rows before `plan.start` other than the pinned prompt
/// and the `System`/`Other` rows the renderer keeps whole. Of their standing
/// parts (`standing(i)` for the row at index `i`), a superseded kind keeps
/// only its newest copy; any other kind keeps every distinct copy once (the
/// first, by text hash). The result depends only on rows before the start,
/// so it changes only at a cut: the pinned bytes are as stable as the stub.
pub fn plan_pins<'a>(
    rows: &[RowInfo],
    plan: &WindowPlan,
    standing: impl Fn(usize) -> &'a [Standing],
) -> Vec<Pin> {
    let left = (0..plan.start.min(rows.len())).filter(|&i| {
        Some(i) != plan.pinned_prompt && !matches!(rows[i].kind, RowKind::System | RowKind::Other)
    });
    let mut all: Vec<(Pin, Standing)> = Vec::new();
    for i in left {
        for s in standing(i) {
            all.push((
                Pin {
                    row: i,
                    part: s.part,
                },
                *s,
            ));
        }
    }
    let mut newest: HashMap<StandingKind, usize> = HashMap::new();
    for (at, (_, s)) in all.iter().enumerate() {
        if s.kind.superseded() {
            newest.insert(s.kind, at);
        }
    }
    let mut seen: HashSet<u64> = HashSet::new();
    all.iter()
        .enumerate()
        .filter(|(at, (_, s))| {
            if s.kind.superseded() {
                newest.get(&s.kind) == Some(at)
            } else {
                seen.insert(s.hash)
            }
        })
        .map(|(_, (pin, _))| *pin)
        .collect()
}

/// The stub that opens a cut window: a pure function of its inputs.
///
/// First line, exactly: ``[Earlier content of this session is past the tideline:
/// every row up to seq N left this window. The verbatim record is
/// DIR/transcript/ (one file per turn) and DIR/SESSION.md carries the merged
/// state. Read them when you need what was said; `oceancode-proxy context`
/// gives this window as a file to edit.]`` (DIR is `dir`, a trailing `/`
/// dropped). Then, for the newest [`STUB_MAX_TURNS`] of `cut_turns`
/// (`(turn, text)`, in the given order), one line `- tNN: FIRST` where
/// `NN` is the turn zero-padded to two digits and FIRST is the first
/// non-blank line of `text` with whitespace runs collapsed (`(no text)` if none),
/// cut to at most [`STUB_TURN_LINE_CHARS`] characters in all (ending in `…`).
/// Lines are joined by `\n`, no trailing newline.
///
/// The wording is the spec's, exactly (clients and tests match it). The
/// newest ask, pinned right after the stub when its turn is cut midway, is
/// the one row up to N a reader sees again below it, as the spec intends.
pub fn stub_text<S: AsRef<str>>(upto_seq: u64, dir: &str, cut_turns: &[(u32, S)]) -> String {
    let dir = dir
        .strip_suffix('/')
        .filter(|d| !d.is_empty())
        .unwrap_or(dir);
    let mut out = format!(
        "[Earlier content of this session is past the tideline: every row up to seq {upto_seq} left this window. The verbatim record is {dir}/transcript/ (one file per turn) and {dir}/SESSION.md carries the merged state. Read them when you need what was said; `oceancode-proxy context` gives this window as a file to edit.]"
    );
    let skip = cut_turns.len().saturating_sub(STUB_MAX_TURNS);
    for (turn, text) in &cut_turns[skip..] {
        out.push('\n');
        out.push_str(&turn_line(*turn, text.as_ref()));
    }
    out
}

/// `- tNN: first line`, at most [`STUB_TURN_LINE_CHARS`] characters.
fn turn_line(turn: u32, text: &str) -> String {
    let first = text
        .lines()
        .map(|l| {
            let clean: String = l
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            clean.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .find(|l| !l.is_empty())
        .unwrap_or_else(|| "(no text)".to_string());
    let prefix = format!("- t{turn:02}: ");
    let budget = STUB_TURN_LINE_CHARS.saturating_sub(prefix.chars().count());
    let mut line = prefix;
    if first.chars().count() <= budget {
        line.push_str(&first);
    } else {
        line.extend(first.chars().take(budget.saturating_sub(1)));
        line.push('…');
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(gauge: u64, added: u64, boundary_seq: u64, last_seq: u64) -> Observation {
        Observation {
            gauge,
            added,
            boundary_seq,
            last_seq,
        }
    }

    fn cb(first_seq: u64, last_seq: u64, tokens: u64) -> ClosedBlock {
        ClosedBlock {
            first_seq,
            last_seq,
            tokens,
        }
    }

    #[test]
    fn percent_line_and_clamp() {
        let l = effective_line(LineSpec::Percent(40.0), Some(200_000), None, Some(32_000));
        assert_eq!(
            (l.line, l.clamped, l.context),
            (80_000, false, Some(200_000))
        );
        // 100% of 200k with max_tokens 64k: room for at most 32k of output.
        let l = effective_line(LineSpec::Percent(100.0), Some(200_000), None, Some(64_000));
        assert_eq!((l.line, l.clamped), (168_000, true));
        // A smaller max_tokens leaves more room.
        let l = effective_line(LineSpec::Percent(100.0), Some(200_000), None, Some(8_000));
        assert_eq!((l.line, l.clamped), (192_000, true));
        // Fixed line above the ceiling.
        let l = effective_line(LineSpec::Tokens(500_000), Some(200_000), Some(64_000), None);
        assert_eq!((l.line, l.clamped), (168_000, true));
        // Fixed line below the ceiling: untouched.
        let l = effective_line(LineSpec::Tokens(100_000), Some(200_000), None, Some(32_000));
        assert_eq!((l.line, l.clamped), (100_000, false));
    }

    #[test]
    fn tokens_zero_is_the_ceiling() {
        let l = effective_line(LineSpec::Tokens(0), Some(200_000), Some(64_000), None);
        assert_eq!((l.line, l.clamped), (168_000, false));
        let l = effective_line(
            LineSpec::Tokens(0),
            Some(200_000),
            Some(64_000),
            Some(4_000),
        );
        assert_eq!((l.line, l.clamped), (196_000, false));
        let l = effective_line(LineSpec::Tokens(0), Some(1_000_000), None, None);
        assert_eq!(l.line, 968_000);
        let l = effective_line(LineSpec::Tokens(0), None, Some(64_000), Some(1_000));
        assert_eq!(
            (l.line, l.clamped, l.context),
            (UNKNOWN_CEILING_LINE, false, None)
        );
    }

    #[test]
    fn unknown_context_and_floor() {
        let l = effective_line(LineSpec::Percent(40.0), None, None, Some(32_000));
        assert_eq!((l.line, l.clamped), (UNKNOWN_CONTEXT_LINE, false));
        let l = effective_line(LineSpec::Tokens(750_000), None, None, None);
        assert_eq!((l.line, l.clamped), (750_000, false));
        let l = effective_line(LineSpec::Tokens(5_000), None, None, None);
        assert_eq!(l.line, MIN_FIXED_LINE);
        assert_eq!(output_allowance(None, None), 32_000);
        assert_eq!(output_allowance(Some(8_000), None), 8_000);
        assert_eq!(output_allowance(Some(8_000), Some(100_000)), 32_000);
    }

    #[test]
    fn block_sizes() {
        assert_eq!(block_tokens(BlockSpec::default(), 100_000), 70_000);
        assert_eq!(block_tokens(BlockSpec::PercentOfLine(35.0), 80_000), 28_000);
        assert_eq!(block_tokens(BlockSpec::Tokens(20_000), 500_000), 20_000);
        assert_eq!(block_tokens(BlockSpec::Tokens(0), 500_000), MIN_BLOCK);
        assert_eq!(
            block_tokens(BlockSpec::PercentOfLine(0.01), 80_000),
            MIN_BLOCK
        );
        assert_eq!(block_tokens(BlockSpec::Tokens(1_000_000), 100_000), 100_000);
        assert_eq!(Params::new(80_000, BlockSpec::default()).block, 56_000);
    }

    #[test]
    fn a_provider_drop_moves_the_cut_and_keeps_the_gauge() {
        let p = Params {
            line: 1_000,
            block: 30,
        };
        let mut t = Tideline::new();
        t.seed(&[(1, 40), (2, 40), (3, 40), (4, 40)], obs(160, 0, 4, 4), p);
        assert_eq!(t.closed_blocks().len(), 4);
        let gauge = t.gauge();
        assert!(t.drop_through(2));
        assert_eq!(t.cut_upto(), 2);
        assert_eq!(t.gauge(), gauge);
        assert_eq!(t.closed_blocks(), &[cb(3, 3, 40), cb(4, 4, 40)]);
        assert!(!t.drop_through(2), "nothing new");
        assert!(!t.drop_through(1));
        // A block straddling the drop keeps its later rows.
        let mut t = Tideline::new();
        t.seed(&[(1, 10), (2, 10), (3, 10), (4, 40)], obs(70, 0, 4, 4), p);
        assert_eq!(t.closed_blocks()[0], cb(1, 3, 30));
        assert!(t.drop_through(2));
        assert_eq!(t.closed_blocks()[0], cb(3, 3, 30));
        assert!(t.open_block().first_seq > 2);
    }

    #[test]
    fn block_closes_on_settled_growth() {
        let p = Params {
            line: 1_000,
            block: 30,
        };
        let mut t = Tideline::new();
        // Brand-new session: the first request is not growth.
        t.observe(obs(10, 10, 0, 1), p);
        assert!(t.closed_blocks().is_empty());
        // Re-anchored on the first real number: growth = 10 (carried) + 10 added.
        t.observe(obs(40, 10, 2, 3), p);
        assert_eq!(t.open_block().opened_at, 20);
        assert!(t.closed_blocks().is_empty());
        // Growth 40 >= 30: closes at the boundary, sized by the settled gauge.
        let d = t.observe(obs(60, 10, 4, 5), p);
        assert!(d.cut.is_none());
        assert_eq!(t.closed_blocks(), &[cb(1, 4, 30)]);
        assert_eq!(
            t.open_block(),
            OpenBlock {
                first_seq: 5,
                opened_at: 50
            }
        );
    }

    /// line 50, block 30: cut, overshoot, and the open block is never cut.
    fn scenario() -> (Tideline, Params) {
        let p = Params {
            line: 50,
            block: 30,
        };
        let mut t = Tideline::new();
        assert!(t.observe(obs(10, 10, 0, 1), p).cut.is_none());
        assert!(t.observe(obs(45, 5, 2, 3), p).cut.is_none());
        (t, p)
    }

    #[test]
    fn cut_oldest_closed_and_never_the_open_block() {
        let (mut t, p) = scenario();
        let d = t.observe(obs(70, 5, 4, 5), p);
        let cut = d.cut.expect("a cut");
        assert_eq!(
            cut,
            CutInfo {
                upto_seq: 4,
                gauge_before: 70,
                gauge_after: 35,
                blocks_cut: 1
            }
        );
        assert_eq!((t.cut_upto(), d.gauge, d.line), (4, 35, 50));
        // Over the line again, but only the open block is left: no cut.
        let d = t.observe(obs(60, 20, 6, 7), p);
        assert!(d.cut.is_none());
        assert_eq!(t.cut_upto(), 4);
        assert!(d.gauge - p.line <= p.block, "overshoot at most one block");
        // The open block grows past a block: it closes, then leaves.
        let d = t.observe(obs(80, 5, 8, 9), p);
        assert_eq!(d.cut.map(|c| c.upto_seq), Some(8));
        assert!(t.cut_upto() <= 8);
        assert!(d.gauge < p.line);
    }

    #[test]
    fn several_blocks_leave_while_over_the_line() {
        let p = Params {
            line: 100,
            block: 20,
        };
        let mut t = Tideline::new();
        t.observe(obs(0, 0, 0, 1), p);
        let mut g = 0;
        // Each step grows 25 with a raised line so nothing is cut yet.
        let high = Params { line: 1_000, ..p };
        for i in 1..=6u64 {
            g += 25;
            t.observe(obs(g, 0, 2 * i, 2 * i + 1), high);
        }
        assert_eq!(t.closed_blocks().len(), 5);
        // Lowering the line cuts oldest first until under it.
        let d = t.observe(obs(g, 0, 12, 13), p);
        let c = d.cut.expect("cut");
        assert!(c.blocks_cut >= 2);
        assert!(d.gauge < p.line);
        assert_eq!(c.upto_seq, t.cut_upto());
        assert_eq!(t.closed_blocks()[0].first_seq, t.cut_upto() + 1);
    }

    #[test]
    fn history_without_seed_can_be_cut() {
        let p = Params {
            line: 100,
            block: 50,
        };
        let mut t = Tideline::new();
        let d = t.observe(obs(400, 10, 40, 41), p);
        assert_eq!(d.cut.map(|c| c.upto_seq), Some(40));
    }

    #[test]
    fn seeding_builds_blocks_at_row_boundaries() {
        let p = Params {
            line: 80,
            block: 25,
        };
        let rows: Vec<(u64, u64)> = (1..=6).map(|s| (s, 10)).chain([(7, 5)]).collect();
        let mut t = Tideline::new();
        // gauge 100 = 35 of system prompt and tools + 65 of rows.
        let d = t.seed(&rows, obs(100, 5, 6, 7), p);
        assert_eq!(
            d.cut,
            Some(CutInfo {
                upto_seq: 3,
                gauge_before: 100,
                gauge_after: 70,
                blocks_cut: 1
            })
        );
        assert_eq!(t.closed_blocks(), &[cb(4, 6, 30)]);
        assert_eq!(
            t.open_block(),
            OpenBlock {
                first_seq: 7,
                opened_at: 65
            }
        );
        // Re-seeding skips what is cut and never undoes it.
        let d = t.seed(&rows, obs(100, 5, 6, 7), Params { line: 1_000, ..p });
        assert!(d.cut.is_none());
        assert_eq!(t.cut_upto(), 3);
        assert_eq!(t.closed_blocks(), &[cb(4, 6, 30)]);
        // The next real measurement re-anchors the open block (growth 5 carried).
        t.observe(obs(90, 10, 8, 9), Params { line: 1_000, ..p });
        assert_eq!(t.open_block().opened_at, 75);
    }

    #[test]
    fn seeding_closes_only_up_to_the_boundary() {
        let p = Params {
            line: 1_000,
            block: 10,
        };
        let rows: Vec<(u64, u64)> = (1..=5).map(|s| (s, 10)).collect();
        let mut t = Tideline::new();
        t.seed(&rows, obs(0, 0, 3, 5), p);
        // 1..3 close one each; 4 and 5 are this request's rows: the open block.
        assert_eq!(t.closed_blocks().len(), 3);
        assert_eq!(t.open_block().first_seq, 4);
        let d = t.cut_all_closed(3).expect("cut");
        assert_eq!((d.upto_seq, d.blocks_cut), (3, 3));
    }

    #[test]
    fn cut_now_takes_one_block_or_closes_the_open_one() {
        let p = Params {
            line: 1_000,
            block: 25,
        };
        let rows: Vec<(u64, u64)> = (1..=7).map(|s| (s, 10)).collect();
        let mut t = Tideline::new();
        t.seed(&rows, obs(70, 10, 6, 7), p);
        assert_eq!(t.closed_blocks(), &[cb(1, 3, 30), cb(4, 6, 30)]);
        let c = t.cut_now(6).expect("cut");
        assert_eq!((c.upto_seq, c.blocks_cut, c.gauge_after), (3, 1, 40));
        let c = t.cut_now(6).expect("cut");
        assert_eq!(c.upto_seq, 6);
        // Only row 7 is left, after the boundary: nothing to cut.
        assert_eq!(t.cut_now(6), None);
        assert_eq!(t.cut_upto(), 6);
        // A later boundary lets the open block close and go.
        let c = t.cut_now(7).expect("cut");
        assert_eq!(c.upto_seq, 7);
        assert!(t.closed_blocks().is_empty());
        assert_eq!(t.open_block().first_seq, 8);
    }

    #[test]
    fn a_cold_request_cuts_the_open_blocks_oldest_rows_to_a_due_cuts_level() {
        // The default shape: a block of 70% of the line; a due cut keeps 30k.
        let p = Params {
            line: 100_000,
            block: 70_000,
        };
        // Rows 1..=21 of 2k each; the window grew from 10k to 50k by row 20.
        let rows: Vec<(u64, u64)> = (1..=21).map(|s| (s, 2_000)).collect();
        let mut t = Tideline::new();
        t.observe(obs(10_000, 10_000, 0, 1), p);
        let d = t.observe(obs(30_000, 0, 10, 11), p);
        assert_eq!(d.cut, None);
        // 30k is not a quarter block (17.5k) over the 30k a due cut keeps.
        assert_eq!(t.clone().cut_cold(10, p, rows.clone()), None);
        let d = t.observe(obs(50_000, 0, 20, 21), p);
        assert_eq!((d.cut, t.closed_blocks().len()), (None, 0));
        // Cold at 50k: the oldest rows go until 30k is left.
        let mut cold = t.clone();
        let c = cold
            .cut_cold(20, p, rows.clone())
            .expect("the open block's oldest rows go");
        assert_eq!((c.upto_seq, c.blocks_cut), (10, 1));
        assert_eq!((c.gauge_before, c.gauge_after), (50_000, 30_000));
        assert_eq!(cold.open_block().first_seq, 11);
        assert!(cold.closed_blocks().is_empty());
        // Never rows past the boundary: up to row 9 they free 18k, which
        // leaves 32k, over a due cut's level: nothing goes.
        assert_eq!(t.clone().cut_cold(9, p, rows.clone()), None);
        // A request whose own new rows keep the gauge over 30k even with
        // every earlier row gone: no cut (it would keep less than a due cut).
        let mut big = t.clone();
        big.observe(obs(75_000, 40_000, 21, 22), p);
        assert_eq!(big.cut_cold(21, p, rows.clone()), None);
        // Off the cold path the same window waits for the line.
        let d = t.observe(obs(60_000, 0, 22, 23), p);
        assert_eq!(d.cut, None);
        // After the cold cut the next due cut is a block of growth away.
        let d = cold.observe(obs(40_000, 0, 22, 23), p);
        assert_eq!(d.cut, None);
        let d = cold.observe(obs(99_000, 0, 50, 51), p);
        assert_eq!(d.cut, None);
    }

    #[test]
    fn a_cold_request_takes_the_cut_due_within_the_next_block() {
        let p = Params {
            line: 100_000,
            block: 40_000,
        };
        let mut t = Tideline::new();
        t.observe(obs(10_000, 10_000, 0, 1), p);
        t.observe(obs(20_000, 0, 2, 3), p);
        // Grows by a block: it closes at seq 10 (gauge 55k, under the line).
        let d = t.observe(obs(55_000, 0, 10, 11), p);
        assert_eq!(d.cut, None);
        assert_eq!(t.closed_blocks().len(), 1);
        // Warm, nothing due yet; 55k + 40k < 100k: a cold request cuts nothing either.
        assert_eq!(t.clone().cut_cold(12, p, []), None);
        let d = t.observe(obs(62_000, 0, 12, 13), p);
        assert_eq!(d.cut, None);
        // 62k + 40k >= 100k: the cut due within the next block happens now.
        let mut cold = t.clone();
        let c = cold.cut_cold(13, p, []).expect("a cold cut");
        assert_eq!((c.upto_seq, c.blocks_cut), (10, 1));
        assert_eq!(cold.cut_upto(), 10);
        assert!(cold.gauge() < 62_000 - 40_000);
        // Never the open block, nor a block past the boundary.
        assert_eq!(cold.cut_cold(13, p, []), None);
        assert_eq!(t.clone().cut_cold(9, p, []), None);
        // Warm, the same request cut nothing: the cut waits for the line.
        let d = t.observe(obs(99_000, 0, 14, 15), p);
        assert_eq!(d.cut, None);
        let d = t.observe(obs(101_000, 0, 15, 16), p);
        assert_eq!(d.cut.map(|c| c.upto_seq), Some(10));
    }

    #[test]
    fn cut_all_closed_includes_the_open_rows_up_to_the_boundary() {
        let (mut t, p) = scenario();
        let d = t.observe(obs(49, 4, 4, 5), Params { line: 1_000, ..p });
        assert!(d.cut.is_none());
        let c = t.cut_all_closed(4).expect("cut");
        assert_eq!(c.upto_seq, 4);
        assert!(t.closed_blocks().is_empty());
        assert_eq!(t.open_block().first_seq, 5);
        assert_eq!(t.cut_all_closed(4), None);
    }

    /// Masking first: under the line nothing happens; at it, masking
    /// alone when it frees enough, else blocks leave (oldest first) only
    /// until the masked window is under `line − free`.
    #[test]
    fn masking_comes_before_cutting() {
        let p = Params {
            line: 100,
            block: 30,
        };
        // Rows 1..=8 of 10 tokens, a 20-token base; blocks of 30 close at
        // rows 3 and 6.
        let rows: Vec<(u64, u64)> = (1..=8).map(|s| (s, 10)).collect();
        let seeded = |t: &mut Tideline| {
            t.seed(&rows, obs(0, 10, 7, 8), Params { line: 1_000, ..p });
            assert_eq!(t.closed_blocks(), &[cb(1, 3, 30), cb(4, 6, 30)]);
        };
        // What masking would save: 5 tokens for each row after `upto`
        // before row 7 (the running round), as a caller's `choose` would.
        let calls = std::cell::RefCell::new(Vec::new());
        let mut all = |upto: u64| {
            calls.borrow_mut().push(upto);
            (upto + 1..7).count() as u64 * 5
        };
        // The real window (gauge − saved) under the line: no event, and
        // masking is not even measured.
        let mut t = Tideline::new();
        seeded(&mut t);
        let m = Mask {
            saved: 30,
            free: 20,
            all: &mut all,
        };
        let d = t.observe_masked(obs(120, 10, 8, 9), p, m);
        assert_eq!((d.cut, d.masked), (None, false));
        assert!(calls.borrow().is_empty());
        // At the line, masking alone frees enough (120 − 30 ≤ 100 − 20).
        let m = Mask {
            saved: 10,
            free: 20,
            all: &mut all,
        };
        let d = t.observe_masked(obs(110, 10, 8, 9), p, m);
        assert_eq!((d.cut, d.masked), (None, true));
        assert_eq!(t.cut_upto(), 0);
        assert_eq!(*calls.borrow(), [0]);
        // It cannot: the oldest block leaves (masking the rest then saves
        // 15: 130 − 30 − 15 ≤ 90), not both.
        let mut t = Tideline::new();
        seeded(&mut t);
        calls.borrow_mut().clear();
        let m = Mask {
            saved: 0,
            free: 10,
            all: &mut all,
        };
        let d = t.observe_masked(obs(130, 10, 8, 9), p, m);
        let c = d.cut.expect("a cut");
        assert_eq!((c.upto_seq, c.blocks_cut, d.masked), (3, 1, true));
        assert_eq!(*calls.borrow(), [0, 3]);
        // Without the tier the same observation cuts both blocks.
        let mut t = Tideline::new();
        seeded(&mut t);
        let d = t.observe(obs(130, 10, 8, 9), p);
        assert_eq!(d.cut.map(|c| c.blocks_cut), Some(2));
    }

    #[test]
    fn serde_round_trip() {
        let (mut t, p) = scenario();
        t.observe(obs(70, 5, 4, 5), p);
        let json = serde_json::to_string(&t).expect("ser");
        let back: Tideline = serde_json::from_str(&json).expect("de");
        assert_eq!(back, t);
        let empty: Tideline = serde_json::from_str("{}").expect("de");
        assert_eq!(empty, Tideline::new());
    }

    fn ri(seq: u64, kind: RowKind, starts_ok: bool) -> RowInfo {
        RowInfo {
            seq,
            kind,
            starts_ok,
        }
    }

    fn line() -> Vec<RowInfo> {
        use RowKind::*;
        vec![
            ri(1, Prompt, true),
            ri(2, Assistant, true),
            ri(3, ToolResult, false),
            ri(4, Assistant, true),
            ri(5, ToolResult, false),
            ri(6, Prompt, true),
            ri(7, Assistant, true),
        ]
    }

    fn plan(start: usize, effective_upto_seq: u64, pinned_prompt: Option<usize>) -> WindowPlan {
        WindowPlan {
            start,
            effective_upto_seq,
            pinned_prompt,
        }
    }

    #[test]
    fn plan_window_rules() {
        let rows = line();
        assert_eq!(plan_window(&rows, 0), plan(0, 0, None));
        assert_eq!(plan_window(&[], 5), plan(0, 0, None));
        // Seq 3 is a tool result: the window keeps its call (seq 2), and the
        // ask right before it: nothing left the window at all.
        assert_eq!(plan_window(&rows, 2), plan(0, 0, None));
        // Seqs 2 and 3 left; the ask (seq 1) is pinned.
        assert_eq!(plan_window(&rows, 3), plan(3, 3, Some(0)));
        // Starting at a prompt: nothing to pin.
        assert_eq!(plan_window(&rows, 5), plan(5, 5, None));
        // The newest row is never cut, and the newest ask right before it is
        // where the window starts: the stub names seq 5, the last row that left.
        assert_eq!(plan_window(&rows, 100), plan(5, 5, None));
        assert_eq!(plan_window(&rows, 6), plan(5, 5, None));
    }

    #[test]
    fn plan_window_fallback_keeps_everything() {
        use RowKind::*;
        let rows = vec![
            ri(1, Prompt, false),
            ri(2, ToolResult, false),
            ri(3, ToolResult, false),
        ];
        assert_eq!(plan_window(&rows, 2), plan(0, 0, None));
        // A prompt that is not a valid start is not pinned.
        let rows = vec![
            ri(1, Prompt, false),
            ri(2, Assistant, true),
            ri(3, ToolResult, false),
        ];
        assert_eq!(plan_window(&rows, 1), plan(1, 1, None));
    }

    #[test]
    fn plan_window_ignores_rows_not_on_the_line() {
        use RowKind::*;
        // After a branch the active line jumps from seq 2 to 50; cut_upto 40.
        let rows = vec![
            ri(1, Prompt, true),
            ri(2, Assistant, true),
            ri(50, Prompt, true),
        ];
        assert_eq!(plan_window(&rows, 40), plan(2, 2, None));
        let rows = vec![ri(50, Prompt, true), ri(51, Assistant, true)];
        assert_eq!(plan_window(&rows, 40), plan(0, 0, None));
    }

    fn st(part: u32, kind: StandingKind, hash: u64) -> Standing {
        Standing { part, kind, hash }
    }

    fn pin(row: usize, part: u32) -> Pin {
        Pin { row, part }
    }

    #[test]
    fn plan_pins_keeps_the_standing_parts_of_rows_that_left() {
        use RowKind::*;
        use StandingKind::*;
        // 0 system, 1 ask with CLAUDE.md + attribution, 2 call, 3 result with a
        // nested CLAUDE.md and a newer attribution, 4 call, 5 result with the
        // same nested CLAUDE.md again, 6 ask 2, 7 call, 8 result, 9 call.
        let rows = vec![
            ri(1, System, true),
            ri(2, Prompt, true),
            ri(3, Assistant, true),
            ri(4, ToolResult, false),
            ri(5, Assistant, true),
            ri(6, ToolResult, false),
            ri(7, Prompt, true),
            ri(8, Assistant, true),
            ri(9, ToolResult, false),
            ri(10, Assistant, true),
        ];
        let parts: Vec<Vec<Standing>> = vec![
            vec![st(0, Instructions, 0xA)], // a system row: kept whole, never pinned
            vec![st(0, Instructions, 1), st(1, Attribution, 2)],
            vec![],
            vec![st(1, Instructions, 3), st(2, Attribution, 4)],
            vec![],
            vec![st(1, Instructions, 3)],
            vec![st(0, Environment, 5)],
            vec![],
            vec![],
            vec![],
        ];
        let of = |i: usize| parts[i].as_slice();
        // Nothing cut: nothing pinned.
        assert!(plan_pins(&rows, &plan_window(&rows, 0), of).is_empty());
        // Window at row 4 (seq 5) inside turn 1: the ask (row 1) is pinned
        // whole, so its parts are not pinned again; row 3's parts are.
        let p = plan_window(&rows, 4);
        assert_eq!(p, plan(4, 4, Some(1)));
        assert_eq!(plan_pins(&rows, &p, of), [pin(3, 1), pin(3, 2)]);
        // Turn 1 left whole (window at ask 2): CLAUDE.md, the nested one once,
        // the newest attribution only, in their original order.
        let p = plan_window(&rows, 6);
        assert_eq!(p, plan(6, 6, None));
        assert_eq!(plan_pins(&rows, &p, of), [pin(1, 0), pin(3, 1), pin(3, 2)]);
        // Later: ask 2 pinned whole, its environment part not pinned again.
        let p = plan_window(&rows, 9);
        assert_eq!(p, plan(9, 9, Some(6)));
        assert_eq!(plan_pins(&rows, &p, of), [pin(1, 0), pin(3, 1), pin(3, 2)]);
        // Stable while rows are appended.
        let mut more = rows.clone();
        more.push(ri(11, ToolResult, false));
        let mut more_parts = parts.clone();
        more_parts.push(vec![st(0, Instructions, 9)]);
        let p2 = plan_window(&more, 9);
        assert_eq!(
            plan_pins(&more, &p2, |i| more_parts[i].as_slice()),
            plan_pins(&rows, &p, of)
        );
    }

    const HEAD: &str = "[Earlier content of this session is past the tideline: every row up to seq 42 left this window. The verbatim record is /d/s1/transcript/ (one file per turn) and /d/s1/SESSION.md carries the merged state. Read them when you need what was said; `oceancode-proxy context` gives this window as a file to edit.]";

    #[test]
    fn stub_exact() {
        let none: &[(u32, String)] = &[];
        assert_eq!(stub_text(42, "/d/s1", none), HEAD);
        assert_eq!(stub_text(42, "/d/s1/", none), HEAD);
        let turns = [
            (1, "Fix the build\nmore detail"),
            (2, "\n\n   "),
            (3, "  a\tb  \u{7}c  "),
        ];
        assert_eq!(
            stub_text(42, "/d/s1", &turns),
            format!("{HEAD}\n- t01: Fix the build\n- t02: (no text)\n- t03: a b c")
        );
    }

    #[test]
    fn stub_turn_lines_are_short_and_newest_twenty() {
        let long = "é".repeat(200);
        let turns: Vec<(u32, String)> = (1..=25).map(|t| (t, long.clone())).collect();
        let s = stub_text(9, "/x", &turns);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 1 + STUB_MAX_TURNS);
        assert!(lines[1].starts_with("- t06: é"));
        assert!(lines[20].starts_with("- t25: "));
        for l in &lines[1..] {
            assert_eq!(l.chars().count(), STUB_TURN_LINE_CHARS);
            assert!(l.ends_with('…'));
        }
        assert_eq!(s, stub_text(9, "/x", &turns), "pure");
        let short = stub_text(9, "/x", &[(123, "x".repeat(72))]);
        assert_eq!(short.lines().nth(1).map(|l| l.chars().count()), Some(80));
        assert!(!short.ends_with('…'));
    }
}
