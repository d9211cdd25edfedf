//! Tideline properties over simulated sessions: a fake provider measures the
//! real window (system prompt + stub + pinned ask + retained rows) and the
//! tideline only ever sees the numbers a proxy would see.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_config::{BlockSpec, LineSpec};
use oceancode_window::tideline::{
    effective_line, plan_window, stub_text, Observation, Params, RowInfo, Tideline, WindowPlan,
};
use oceancode_window::RowKind;
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct SimRow {
    seq: u64,
    kind: RowKind,
    tokens: u64,
}

impl SimRow {
    fn info(&self) -> RowInfo {
        RowInfo {
            seq: self.seq,
            kind: self.kind,
            starts_ok: self.kind != RowKind::ToolResult,
        }
    }
}

/// One step of the client: the rows it adds, then the model's answer.
#[derive(Clone, Debug)]
struct Step {
    /// A new prompt (new turn) instead of a tool result.
    prompt: bool,
    /// True tokens of the row the client adds.
    input: u64,
    /// Output tokens of the answer (its assistant row).
    output: u64,
    /// Estimate error of the added row, in percent (-10..=10).
    noise: i64,
}

struct Stats {
    cuts: u32,
    max_window: u64,
    max_step: u64,
    /// Real row tokens that left the window at each cut of one block.
    removed: Vec<u64>,
}

const STUB_TOKENS: u64 = 120;

fn estimate(tokens: u64, noise: i64) -> u64 {
    let e = tokens as i64 + tokens as i64 * noise / 100;
    e.max(0) as u64
}

/// Run a session. `history` rows exist before the proxy first sees it (seeded);
/// with none the session starts fresh. Panics on a violated property.
fn simulate(base: u64, history: &[Step], steps: &[Step], params: Params) -> Stats {
    let mut rows: Vec<SimRow> = Vec::new();
    let push = |rows: &mut Vec<SimRow>, kind, tokens| {
        let seq = rows.len() as u64 + 1;
        rows.push(SimRow { seq, kind, tokens });
    };
    let first_kind = |i: usize, s: &Step| {
        if s.prompt || i == 0 {
            RowKind::Prompt
        } else {
            RowKind::ToolResult
        }
    };
    for (i, s) in history.iter().enumerate() {
        push(&mut rows, first_kind(i, s), s.input);
        push(&mut rows, RowKind::Assistant, s.output);
    }
    let mut t = Tideline::new();
    let mut measured: Option<u64> = None;
    let mut last_plan: Option<(u64, WindowPlan)> = None;
    let mut stats = Stats {
        cuts: 0,
        max_window: 0,
        max_step: 0,
        removed: Vec::new(),
    };
    for (i, s) in steps.iter().enumerate() {
        let boundary = rows.len() as u64;
        push(&mut rows, first_kind(history.len() + i, s), s.input);
        let last = rows.len() as u64;
        let added = estimate(s.input, s.noise);
        let before = t.cut_upto();
        let d = match measured {
            Some(total) => t.observe(
                Observation {
                    gauge: total + added,
                    added,
                    boundary_seq: boundary,
                    last_seq: last,
                },
                params,
            ),
            None => {
                let est: Vec<(u64, u64)> = rows.iter().map(|r| (r.seq, r.tokens)).collect();
                let sum: u64 = est.iter().map(|r| r.1).sum();
                t.seed(
                    &est,
                    Observation {
                        gauge: base + sum,
                        added,
                        boundary_seq: boundary,
                        last_seq: last,
                    },
                    params,
                )
            }
        };
        // (b) monotone, moves only at a cut, to the cut's seq. (c) never past the boundary.
        let after = t.cut_upto();
        assert!(after >= before);
        match d.cut {
            Some(c) => {
                assert_eq!(c.upto_seq, after);
                assert!(after > before);
                assert!(c.blocks_cut >= 1 && c.gauge_after <= c.gauge_before);
                stats.cuts += 1;
            }
            None => assert_eq!(after, before),
        }
        assert!(after <= boundary, "cut {after} past boundary {boundary}");
        // (a) the predicted gauge overshoots the line by less than a block and a step.
        let step = s.input + s.output;
        stats.max_step = stats.max_step.max(step);
        assert!(
            d.gauge < params.line + params.block + stats.max_step,
            "gauge {} line {} block {} step {}",
            d.gauge,
            params.line,
            params.block,
            stats.max_step
        );

        let infos: Vec<RowInfo> = rows.iter().map(SimRow::info).collect();
        let plan = plan_window(&infos, after);
        // (e) a valid start, or the documented fallback (keep everything).
        assert!(plan.start == 0 || infos[plan.start].starts_ok);
        assert!(plan.start < rows.len());
        if plan.start > 0 {
            assert_eq!(plan.effective_upto_seq, rows[plan.start - 1].seq);
            assert!(plan.effective_upto_seq <= after);
        }
        if let Some(p) = plan.pinned_prompt {
            assert!(p < plan.start && infos[p].kind == RowKind::Prompt);
        }
        // The newest ask is in the window or pinned.
        if let Some(newest) = infos.iter().rposition(|r| r.kind == RowKind::Prompt) {
            assert!(newest >= plan.start || plan.pinned_prompt == Some(newest));
        }
        // (d) between cuts the plan does not move (only appends: cache hits).
        if let Some((cut, prev)) = last_plan {
            if cut == after {
                assert_eq!(prev, plan, "plan moved between cuts");
            } else if d.cut.is_some_and(|c| c.blocks_cut == 1) {
                let gone = rows
                    .iter()
                    .filter(|r| r.seq > prev.effective_upto_seq && r.seq <= plan.effective_upto_seq)
                    .map(|r| r.tokens)
                    .sum();
                stats.removed.push(gone);
            }
        }
        last_plan = Some((after, plan));

        // The provider's measure of what was sent.
        let stub = if plan.effective_upto_seq > 0 {
            STUB_TOKENS
        } else {
            0
        };
        let pinned = plan.pinned_prompt.map_or(0, |p| rows[p].tokens);
        let retained: u64 = rows[plan.start..].iter().map(|r| r.tokens).sum();
        let input = base + stub + pinned + retained;
        stats.max_window = stats.max_window.max(input);
        assert!(
            input <= params.line + params.block + stats.max_step,
            "window {input} > line {} + block {} + step {} (step {i})",
            params.line,
            params.block,
            stats.max_step
        );
        push(&mut rows, RowKind::Assistant, s.output);
        measured = Some(input + s.output);
    }
    stats
}

/// A tiny deterministic generator (no clock, no OS randomness).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        lo + (self.0 >> 33) % (hi - lo + 1)
    }
}

#[test]
fn tideline_three_hundred_steps_at_forty_percent_of_200k() {
    let calc = effective_line(LineSpec::Percent(40.0), Some(200_000), None, Some(32_000));
    let params = Params::new(calc.line, BlockSpec::default());
    assert_eq!((params.line, params.block), (80_000, 56_000));
    let mut rng = Lcg(7);
    let steps: Vec<Step> = (0..300)
        .map(|i| Step {
            prompt: i % 12 == 0,
            input: rng.next(800, 2_200),
            output: rng.next(100, 600),
            noise: rng.next(0, 20) as i64 - 10,
        })
        .collect();
    let total: u64 = steps.iter().map(|s| s.input + s.output).sum();
    let stats = simulate(15_000, &[], &steps, params);
    eprintln!(
        "300 steps, {total} tokens of rows: {} cuts, max window {}, line {}, block {}",
        stats.cuts, stats.max_window, params.line, params.block
    );
    assert!(stats.max_window <= params.line + params.block);
    eprintln!("real tokens per one-block cut: {:?}", stats.removed);
    // Blocks are measured on the provider's numbers: each cut takes about one
    // block (within a step either way), not the block minus the system prompt.
    for gone in &stats.removed {
        assert!(gone.abs_diff(params.block) <= 3_000, "cut took {gone}");
    }
    // Each cut takes about one block: (total - line) / block, give or take one.
    let expected = (total + 15_000 - params.line) / params.block;
    assert!(
        (expected.saturating_sub(1)..=expected + 2).contains(&(stats.cuts as u64)),
        "cuts {} expected about {expected}",
        stats.cuts
    );
}

#[test]
fn tideline_resumed_long_session_is_cut_on_its_first_request() {
    let params = Params::new(80_000, BlockSpec::PercentOfLine(35.0));
    let mut rng = Lcg(11);
    let mut gen = |n: usize| -> Vec<Step> {
        (0..n)
            .map(|i| Step {
                prompt: i % 7 == 0,
                input: rng.next(500, 4_000),
                output: rng.next(100, 1_500),
                noise: 0,
            })
            .collect()
    };
    let history = gen(150);
    let steps = gen(200);
    let stats = simulate(20_000, &history, &steps, params);
    assert!(stats.cuts >= 5);
    assert!(stats.max_window <= params.line + params.block + stats.max_step);
}

#[test]
fn tideline_stub_is_byte_stable() {
    let turns = vec![(1u32, "first ask".to_string()), (2, "second".to_string())];
    let a = stub_text(17, "/data/sessions/abc", &turns);
    let b = stub_text(17, "/data/sessions/abc", &turns);
    assert_eq!(a, b);
    assert!(a.starts_with("[Earlier content of this session is past the tideline: every row up to seq 17 left this window."));
    assert!(a.ends_with("\n- t01: first ask\n- t02: second"));
}

fn step_strategy(max_row: u64) -> impl Strategy<Value = Step> {
    (
        prop::bool::weighted(0.15),
        100..=max_row,
        50..=max_row / 2,
        -10i64..=10,
    )
        .prop_map(|(prompt, input, output, noise)| Step {
            prompt,
            input,
            output,
            noise,
        })
}

fn session_strategy() -> impl Strategy<Value = (u64, Vec<Step>, Vec<Step>, Params)> {
    (20_000u64..=400_000, 20.0f64..=100.0).prop_flat_map(|(line, pct)| {
        let params = Params::new(line, BlockSpec::PercentOfLine(pct));
        let max_row = (params.block / 3).clamp(500, 20_000);
        (
            0..=line / 4,
            prop::collection::vec(step_strategy(max_row), 0..60),
            prop::collection::vec(step_strategy(max_row), 1..150),
            Just(params),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn tideline_sessions_keep_the_invariants((base, history, steps, params) in session_strategy()) {
        simulate(base, &history, &steps, params);
    }

    /// Arbitrary observations (not a realistic provider): the state machine's
    /// own invariants still hold.
    #[test]
    fn tideline_arbitrary_observations(
        obs in prop::collection::vec((0u64..500_000, 0u64..50_000, 0u64..4, 0u8..10), 1..80),
        line in 1u64..300_000,
        block in 1u64..200_000,
    ) {
        let params = Params { line, block };
        let mut t = Tideline::new();
        let mut boundary = 0u64;
        for (gauge, added, grow, op) in obs {
            let last = boundary + 1 + grow;
            let before = t.cut_upto();
            let cut = match op {
                0 => t.cut_now(boundary),
                1 => t.cut_all_closed(boundary),
                _ => t.observe(Observation { gauge, added, boundary_seq: boundary, last_seq: last }, params).cut,
            };
            let after = t.cut_upto();
            prop_assert!(after >= before);
            prop_assert!(after <= boundary);
            prop_assert_eq!(cut.is_some(), after != before);
            if let Some(c) = cut {
                prop_assert_eq!(c.upto_seq, after);
            }
            // Blocks stay ordered after the cut and before the open block.
            let mut prev = after;
            for b in t.closed_blocks() {
                prop_assert!(b.first_seq > prev && b.last_seq >= b.first_seq);
                prev = b.last_seq;
            }
            prop_assert!(t.open_block().first_seq > prev);
            boundary = last;
        }
    }

    #[test]
    fn tideline_plan_window_is_valid_and_stable(
        kinds in prop::collection::vec((0u8..4, prop::bool::weighted(0.8)), 1..60),
        extra in prop::collection::vec((0u8..4, any::<bool>()), 0..20),
        cut_frac in 0.0f64..1.2,
    ) {
        let mk = |i: usize, (k, ok): (u8, bool)| {
            let kind = match k { 0 => RowKind::Prompt, 1 => RowKind::ToolResult, 2 => RowKind::Assistant, _ => RowKind::System };
            RowInfo { seq: i as u64 * 2 + 1, kind, starts_ok: ok && kind != RowKind::ToolResult }
        };
        let rows: Vec<RowInfo> = kinds.iter().enumerate().map(|(i, k)| mk(i, *k)).collect();
        let cut = (rows.len() as f64 * 2.0 * cut_frac) as u64;
        let plan = plan_window(&rows, cut);
        prop_assert!(plan.start < rows.len());
        prop_assert!(plan.start == 0 || rows[plan.start].starts_ok);
        if plan.start == 0 {
            prop_assert_eq!(plan.effective_upto_seq, 0);
            prop_assert_eq!(plan.pinned_prompt, None);
        } else {
            prop_assert_eq!(plan.effective_upto_seq, rows[plan.start - 1].seq);
            // Never keeps less than the cut asks for, except the newest row.
            prop_assert!(plan.effective_upto_seq <= cut);
        }
        if let Some(p) = plan.pinned_prompt {
            prop_assert!(p + 1 < plan.start && rows[p].kind == RowKind::Prompt && rows[p].starts_ok);
        }
        // Appending rows never moves a plan whose first kept row already existed.
        if rows.iter().any(|r| r.seq > cut) {
            let mut longer = rows.clone();
            let n = rows.len();
            longer.extend(extra.iter().enumerate().map(|(i, k)| mk(n + i, *k)));
            prop_assert_eq!(plan_window(&longer, cut), plan);
        }
    }
}
