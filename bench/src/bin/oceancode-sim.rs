//! `oceancode-sim`: the context-efficiency simulator.
//!
//! One scripted long agent session (N tool steps) is replayed under four ways
//! of managing the context, and every request is priced with a prompt-cache
//! model:
//!
//! * `none`: the client sends everything. When a request would exceed the
//!   context window the provider answers "prompt is too long"; the client then
//!   does what Claude Code does on that error: it compacts (a summary, as below).
//! * `tideline 40%`: oceancode-proxy's window, with the very same
//!   `oceancode_window::tideline::{Tideline, plan_window, stub_text}` calls and
//!   gauge arithmetic as `proxy/src/sessions.rs` (seed on the first request,
//!   then `observe(last real usage + estimate of the new rows)`; stub + pinned
//!   ask + retained rows).
//! * `clear_tool_uses`: Anthropic context editing, trigger 100k input tokens,
//!   keep the 3 most recent tool results, older results replaced by a short
//!   placeholder (evaluated on every request, as the server does). If the
//!   cleared request still exceeds the context the client compacts.
//! * `tideline + compress`: the same, and at each cut the retained tool
//!   results older than the protected zone (`--protect`, percent of the
//!   line; never the newest row) and at least `--min-tokens` become a
//!   pointer (`oceancode_window::compress::choose`, the proxy's estimates);
//!   the gauge adds their saved estimate, so cuts fall where they would.
//! * `tideline + mask first` (`--free`, `ledger.compress.free`): masking as
//!   the first tier of a cut (`Tideline::observe_masked`): at the line the
//!   window's eligible outputs become pointers first, blocks leave only
//!   while the window would stay over `line − free`. The table's *agent
//!   trail* counts the agent's own messages in the window.
//! * `summarize 83%`: Claude Code style auto-compact: when the next request
//!   would reach 83% of the context, one summarization call (the whole context
//!   plus an instruction as input, a ~5k summary as output) replaces the history
//!   with the summary and the newest user row.
//!
//! Prompt cache (one breakpoint at the end of every request): `cache_read` =
//! the longest prefix identical to the previous request's, `cache_write` = the
//! rest, uncached input = 0. Prices come from
//! `oceancode_config::price(model, &Config::default())`. The cache is warm
//! unless idle gaps are scripted (`--idle-share`, `--slow-share`): a request
//! whose gap since the previous one is past the TTL (`--ttl`) reads nothing.
//! Gap model (its own random stream, so the rows are the same script): a
//! new turn starts after the user was away past the TTL with probability
//! `--idle-share` (log-uniform 1.2×TTL–1 h), else after 20 s–0.8×TTL; a
//! tool step's result takes past the TTL with probability `--slow-share`
//! (a long build or test run: 1.1×TTL–20 min), else 2–90 s. With gaps the
//! tideline runs are shown with and without `ledger.tideline.cold_cut`.

use anyhow::{bail, Context, Result};
use clap::Parser;
use oceancode_bench::conv::Rng;
use oceancode_bench::stats::Table;
use oceancode_bench::svg::{line_chart, HLine, Series};
use oceancode_config::{BlockSpec, Config, LineSpec, Price};
use oceancode_ledger::facts::{CallFacts, ResultFacts, RowFacts};
use oceancode_ledger::state_block::{self, Ask, StateFacts, StateInput};
use oceancode_ledger::transcript::RowLines;
use oceancode_window::tideline::{
    block_tokens, effective_line, plan_window, stub_text, Mask, Observation, Params, RowInfo,
    Tideline,
};
use oceancode_window::{compress, media, RowKind};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "oceancode-sim",
    about = "Context-efficiency simulator: tokens, cache and cost of context strategies over one long scripted session"
)]
struct Args {
    /// Tool steps (requests) in the session.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Model (context window and prices from the built-in table).
    #[arg(long, default_value = "claude-sonnet-4-5")]
    model: String,
    /// Override the context window (tokens).
    #[arg(long)]
    context: Option<u64>,
    /// System prompt + tools (tokens).
    #[arg(long, default_value_t = 15_000)]
    system: u64,
    /// Smallest tool result (tokens).
    #[arg(long, default_value_t = 200)]
    tool_min: u64,
    /// Largest tool result (tokens); results are log-uniform in [min, max].
    #[arg(long, default_value_t = 8_000)]
    tool_max: u64,
    /// Mean assistant message (output tokens per step; uniform in [mean/3, 5·mean/3]).
    #[arg(long, default_value_t = 300)]
    assistant: u64,
    /// A new user prompt (a new turn) every N steps instead of a tool result.
    #[arg(long, default_value_t = 25)]
    turn_every: usize,
    /// `max_tokens` of the requests.
    #[arg(long, default_value_t = 32_000)]
    max_tokens: u64,
    /// Tideline percent of the context.
    #[arg(long, default_value_t = 40.0)]
    tideline: f64,
    /// The lower line of the extra tideline rows (percent of the context; 0 = none).
    #[arg(long, default_value_t = 20.0)]
    low_line: f64,
    /// Block size, percent of the line.
    #[arg(long, default_value_t = 70.0)]
    block: f64,
    /// compress: the protected zone, percent of the line (`ledger.compress.protect`).
    #[arg(long, default_value_t = 10.0)]
    protect: f64,
    /// compress: the smallest tool output pruned (`ledger.compress.min_tokens`).
    #[arg(long, default_value_t = 500)]
    min_tokens: u64,
    /// compress, masking first: an event brings the window down to the line
    /// minus this (percent of the line; `ledger.compress.free`).
    #[arg(long, default_value_t = 50.0)]
    free: f64,
    /// Sweep compress settings: `PROTECTS/MINS[/BLOCKS]`, comma-separated
    /// percents of the line, token counts and block sizes in percent of the
    /// line (`0,5,10,25,50/200,500,2000/70,35`); each at the main and the
    /// low line.
    #[arg(long)]
    compress: Option<String>,
    /// Write the chart of cost vs protect size (needs `--compress`) here.
    #[arg(long)]
    compress_svg: Option<PathBuf>,
    /// Sweep the tideline: comma-separated lines in percent of the context
    /// (`10,15,20,30,40`), each alone and with compress (`--protect`,
    /// `--min-tokens`, `--block`), against the cost floor.
    #[arg(long)]
    lines: Option<String>,
    /// Write the chart of cost vs line (needs `--lines`) here.
    #[arg(long)]
    lines_svg: Option<PathBuf>,
    /// clear_tool_uses trigger (input tokens).
    #[arg(long, default_value_t = 100_000)]
    clear_trigger: u64,
    /// clear_tool_uses: tool results kept.
    #[arg(long, default_value_t = 3)]
    clear_keep: usize,
    /// Summarize when the request reaches this share of the context (percent).
    #[arg(long, default_value_t = 83.0)]
    summarize_at: f64,
    /// Summary size (output tokens of the summarization call).
    #[arg(long, default_value_t = 5_000)]
    summary: u64,
    /// Estimate error of the proxy's row estimates, ± percent (deterministic noise).
    #[arg(long, default_value_t = 10)]
    estimate_noise: i64,
    /// Every Nth tool result is a screenshot (an image block) instead of text (0 = none).
    #[arg(long, default_value_t = 0)]
    screenshot_every: usize,
    /// Screenshot size in pixels, WIDTHxHEIGHT.
    #[arg(long, default_value = "1920x1080", value_parser = parse_size)]
    screenshot: (u32, u32),
    /// Screenshot file size in bytes (its base64 is 4/3 of it).
    #[arg(long, default_value_t = 1_000_000)]
    screenshot_bytes: u64,
    /// Estimate screenshots by their bytes, as the proxy did before it priced
    /// images by the provider's rule (for comparison).
    #[arg(long)]
    bytes_for_media: bool,
    /// Share of new turns that start after the prompt cache expired (the
    /// user was away longer than the TTL); 0 with `--slow-share 0`: always warm.
    #[arg(long, default_value_t = 0.0)]
    idle_share: f64,
    /// Share of tool steps whose result takes longer than the TTL.
    #[arg(long, default_value_t = 0.0)]
    slow_share: f64,
    /// Prompt cache TTL (seconds).
    #[arg(long, default_value_t = 300)]
    ttl: u64,
    /// Random seed of the script.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the window-per-step chart here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Also write the per-step windows as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Leave the state block out of the tideline's stub (`ledger.state.enabled:
    /// false`), to measure what it costs.
    #[arg(long)]
    no_state_block: bool,
    /// The state block's budget (`ledger.state.max_tokens`).
    #[arg(long, default_value_t = 2_000)]
    state_tokens: u32,
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s.split_once('x').ok_or("expected WIDTHxHEIGHT")?;
    let n = |v: &str| v.trim().parse::<u32>().map_err(|e| e.to_string());
    Ok((n(w)?, n(h)?))
}

/// A screenshot tool result: (real tokens, the proxy's estimate). The text
/// around the image is ~20 tokens; the proxy prices the image by the
/// provider's rule (`oceancode_window::media`) and the rest by bytes.
fn screenshot_row(a: &Args) -> (u64, u64) {
    let (w, h) = a.screenshot;
    let rule = if a.model.starts_with("claude") {
        media::Rule::Anthropic
    } else {
        media::Rule::OpenAi(media::Detail::Auto)
    };
    let image = rule.image_tokens(Some((w, h)));
    let b64 = a.screenshot_bytes.div_ceil(3) * 4;
    let row_bytes = b64 as usize + 200;
    let est = if a.bytes_for_media {
        (row_bytes as f64 / BYTES_PER_TOKEN).ceil() as u64
    } else {
        let cost = media::Cost {
            bytes: b64,
            tokens: image,
        };
        u64::from(media::row_tokens(row_bytes, cost, BYTES_PER_TOKEN))
    };
    (image + 20, est)
}

/// The proxy's bytes per token on text (its starting value).
const BYTES_PER_TOKEN: f64 = 3.0;

/// Tokens of the summarization instruction appended to the context.
const SUMMARY_INSTRUCTION: u64 = 1_000;
/// clear_tool_uses placeholder (tokens).
const PLACEHOLDER: u64 = 12;
/// Room the client keeps when truncating an overflowing context for its summary call.
const SUMMARY_HEADROOM: u64 = 20_000;

#[derive(Clone, Copy, Debug)]
struct UserRow {
    kind: RowKind,
    tokens: u64,
    /// The proxy's estimate (tiktoken vs the provider's tokenizer).
    est: u64,
}

/// The scripted session: identical for every strategy.
struct Script {
    user: Vec<UserRow>,
    out: Vec<u64>,
    out_est: Vec<u64>,
    /// The request finds the prompt cache cold (its gap is past the TTL).
    cold: Vec<bool>,
}

/// The gap before each request (seconds), by the module's gap model.
fn gaps(a: &Args, user: &[UserRow]) -> Vec<f64> {
    let mut rng = Rng::new(a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed);
    let ttl = a.ttl.max(1) as f64;
    let log_uniform = |rng: &mut Rng, lo: f64, hi: f64| {
        (lo.ln() + rng.unit() * (hi.max(lo * 1.01).ln() - lo.ln())).exp()
    };
    user.iter()
        .enumerate()
        .map(|(i, u)| {
            let roll = rng.unit();
            if i == 0 {
                0.0
            } else if u.kind == RowKind::Prompt {
                if roll < a.idle_share {
                    log_uniform(&mut rng, 1.2 * ttl, 3600.0)
                } else {
                    log_uniform(&mut rng, 20.0, 0.8 * ttl)
                }
            } else if roll < a.slow_share {
                log_uniform(&mut rng, 1.1 * ttl, 1200.0)
            } else {
                log_uniform(&mut rng, 2.0, 90.0)
            }
        })
        .collect()
}

fn script(a: &Args) -> Script {
    let mut rng = Rng::new(a.seed);
    let mut user = Vec::with_capacity(a.steps);
    let mut out = Vec::with_capacity(a.steps);
    let mut out_est = Vec::with_capacity(a.steps);
    let noisy = |rng: &mut Rng, t: u64| -> u64 {
        let n = a.estimate_noise.max(0);
        let pct = rng.range(0, (2 * n + 1) as u64) as i64 - n;
        (t as i64 + t as i64 * pct / 100).max(1) as u64
    };
    let (lo, hi) = (
        a.tool_min.max(1) as f64,
        a.tool_max.max(a.tool_min + 1) as f64,
    );
    for i in 0..a.steps {
        let shot = a.screenshot_every > 0 && i % a.screenshot_every == a.screenshot_every - 1;
        let (kind, tokens) = if i == 0 || (a.turn_every > 0 && i % a.turn_every == 0) {
            (RowKind::Prompt, rng.range(80, 400))
        } else {
            let t = (lo.ln() + rng.unit() * (hi.ln() - lo.ln())).exp();
            (RowKind::ToolResult, t.round() as u64)
        };
        let (tokens, est) = if shot && kind == RowKind::ToolResult {
            screenshot_row(a)
        } else {
            (tokens, noisy(&mut rng, tokens))
        };
        user.push(UserRow { kind, tokens, est });
        let o = rng.range(a.assistant / 3, a.assistant * 5 / 3 + 1).max(1);
        out.push(o);
        out_est.push(noisy(&mut rng, o));
    }
    let ttl = a.ttl as f64;
    let cold = gaps(a, &user).into_iter().map(|g| g > ttl).collect();
    Script {
        user,
        out,
        out_est,
        cold,
    }
}

/// One segment of a request, for the prefix cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    id: u64,
    tokens: u64,
}

const SYS_ID: u64 = u64::MAX;

fn row_id(seq: u64) -> u64 {
    seq << 2
}
fn cleared_id(seq: u64) -> u64 {
    (seq << 2) | 1
}
fn special_id(n: u64) -> u64 {
    (n << 2) | 2
}
fn pruned_id(seq: u64) -> u64 {
    (seq << 2) | 3
}

/// compress settings for one tideline run.
#[derive(Clone, Copy, Debug)]
struct Compress {
    /// Protected zone, percent of the line.
    protect: f64,
    /// Smallest output pruned (tokens).
    min_tokens: u64,
    /// Masking as the first tier of a cut, bringing the real window to
    /// `line − free` (percent of the line); None = at cuts only (before).
    free: Option<f64>,
}

#[derive(Default, Clone)]
struct Totals {
    requests: u64,
    input_uncached: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
    cost: f64,
    max_window: u64,
    window_sum: u64,
    compactions: u64,
    cuts: u64,
    overflows: u64,
    first_overflow: Option<usize>,
    /// Main requests' input per step.
    series: Vec<(f64, f64)>,
    /// Σ over steps of (tool results verbatim in the window / tool results so far).
    verbatim_frac_sum: f64,
    verbatim_end: u64,
    recoverable_end: u64,
    tool_results: u64,
    /// State blocks rendered (one per cut) and their tokens.
    state_blocks: u64,
    state_tokens_sum: u64,
    state_tokens_max: u64,
    /// Σ over requests of the saved estimate of the pruned outputs in the window.
    saved_sum: u64,
    /// The fewest bytes per o200k token of a block (the budget assumes 2.4).
    state_min_bytes_per_token: f64,
    /// Cuts made at a request whose cache was cold (free).
    cold_cuts: u64,
    /// Σ over requests of the agent's own past messages (assistant rows) in the window.
    trail_sum: u64,
    /// Σ over cuts of the agent's own past messages in the window sent at the cut.
    trail_cut_sum: u64,
    /// Cuts whose window sends pointers.
    cuts_with_pointers: u64,
    /// Events that masked without a cut.
    masks: u64,
}

struct Cache {
    prev: Vec<Seg>,
}

impl Cache {
    /// (read, write) for a request made of `segs` (`cold`: the cache expired).
    fn charge(&mut self, segs: &[Seg], cold: bool) -> (u64, u64) {
        let mut read = 0;
        let mut i = 0;
        while !cold && i < segs.len() && i < self.prev.len() && segs[i] == self.prev[i] {
            read += segs[i].tokens;
            i += 1;
        }
        let write = segs[i..].iter().map(|s| s.tokens).sum();
        self.prev = segs.to_vec();
        (read, write)
    }
}

struct Ctx<'a> {
    a: &'a Args,
    s: &'a Script,
    price: Price,
    context: u64,
    max_output: Option<u64>,
    /// `ledger.tideline.cold_cut`.
    cold_cut: bool,
}

impl Totals {
    fn bill(&mut self, price: &Price, input: u64, read: u64, write: u64, output: u64) {
        self.requests += 1;
        self.input_uncached += input;
        self.cache_read += read;
        self.cache_write += write;
        self.output += output;
        self.cost += price.cost_usd(input, output, read, write);
    }

    fn main_request(&mut self, step: usize, window: u64) {
        self.max_window = self.max_window.max(window);
        self.window_sum += window;
        self.series.push(((step + 1) as f64, window as f64));
    }
}

/// A row of the client's own history (client-side strategies).
#[derive(Clone, Copy, Debug)]
struct Item {
    id: u64,
    kind: RowKind,
    tokens: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Client {
    None,
    Clear,
    Summarize,
}

/// What the client sends for `hist` (clear_tool_uses applied server-side).
fn render_client(c: &Ctx, mode: Client, hist: &[Item]) -> Vec<Seg> {
    let mut segs = Vec::with_capacity(hist.len() + 1);
    segs.push(Seg {
        id: SYS_ID,
        tokens: c.a.system,
    });
    let full: u64 = c.a.system + hist.iter().map(|i| i.tokens).sum::<u64>();
    let clear = mode == Client::Clear && full > c.a.clear_trigger;
    let results: Vec<usize> = hist
        .iter()
        .enumerate()
        .filter(|(_, i)| i.kind == RowKind::ToolResult)
        .map(|(n, _)| n)
        .collect();
    let keep_from = results
        .len()
        .checked_sub(c.a.clear_keep)
        .map_or(0, |k| results.get(k).copied().unwrap_or(usize::MAX));
    for (n, it) in hist.iter().enumerate() {
        if clear && it.kind == RowKind::ToolResult && n < keep_from {
            segs.push(Seg {
                id: cleared_id(it.id),
                tokens: PLACEHOLDER,
            });
        } else {
            segs.push(Seg {
                id: row_id(it.id),
                tokens: it.tokens,
            });
        }
    }
    segs
}

fn sum(segs: &[Seg]) -> u64 {
    segs.iter().map(|s| s.tokens).sum()
}

/// Verbatim tool results in `segs`.
fn verbatim_results(segs: &[Seg], kinds: &BTreeMap<u64, RowKind>) -> u64 {
    segs.iter()
        .filter(|s| s.id & 3 == 0 && s.id != SYS_ID)
        .filter(|s| kinds.get(&(s.id >> 2)) == Some(&RowKind::ToolResult))
        .count() as u64
}

fn run_client(c: &Ctx, mode: Client) -> Totals {
    let mut t = Totals::default();
    let mut cache = Cache { prev: Vec::new() };
    let mut hist: Vec<Item> = Vec::new();
    let mut kinds: BTreeMap<u64, RowKind> = BTreeMap::new();
    let mut next_id = 1u64;
    let mut summaries = 0u64;
    let threshold = (c.context as f64 * c.a.summarize_at / 100.0) as u64;
    for step in 0..c.a.steps {
        let u = c.s.user[step];
        let id = next_id;
        next_id += 1;
        kinds.insert(id, u.kind);
        if u.kind == RowKind::ToolResult {
            t.tool_results += 1;
        }
        hist.push(Item {
            id,
            kind: u.kind,
            tokens: u.tokens,
        });
        let mut segs = render_client(c, mode, &hist);
        let over = sum(&segs) > c.context;
        let compact = match mode {
            Client::Summarize => sum(&segs) >= threshold,
            Client::None | Client::Clear => over,
        };
        if over {
            t.overflows += 1;
            t.first_overflow.get_or_insert(step + 1);
        }
        if compact {
            // The summarization call: the conversation as last sent plus the
            // new rows and an instruction (truncated from the oldest rows if it
            // cannot fit), answered by a summary.
            let mut call = segs.clone();
            while sum(&call) + SUMMARY_INSTRUCTION + SUMMARY_HEADROOM > c.context && call.len() > 2
            {
                call.remove(1);
            }
            call.push(Seg {
                id: special_id(1_000_000 + summaries),
                tokens: SUMMARY_INSTRUCTION,
            });
            let (read, write) = cache.charge(&call, c.s.cold[step]);
            t.bill(&c.price, 0, read, write, c.a.summary);
            summaries += 1;
            t.compactions += 1;
            let sid = next_id;
            next_id += 1;
            kinds.insert(sid, RowKind::Prompt);
            let Some(&newest) = hist.last() else {
                unreachable!("a row was just pushed")
            };
            hist = vec![
                Item {
                    id: sid,
                    kind: RowKind::Prompt,
                    tokens: c.a.summary,
                },
                newest,
            ];
            segs = render_client(c, mode, &hist);
        }
        let window = sum(&segs);
        // After a summarization call the cache is warm again.
        let (read, write) = cache.charge(&segs, c.s.cold[step] && !compact);
        let out = c.s.out[step];
        t.bill(&c.price, 0, read, write, out);
        t.main_request(step, window);
        let verbatim = verbatim_results(&segs, &kinds);
        if t.tool_results > 0 {
            t.verbatim_frac_sum += verbatim as f64 / t.tool_results as f64;
        }
        t.verbatim_end = verbatim;
        t.recoverable_end = verbatim;
        t.trail_sum += segs
            .iter()
            .filter(|s| s.id & 3 == 0 && s.id != SYS_ID)
            .filter(|s| kinds.get(&(s.id >> 2)) == Some(&RowKind::Assistant))
            .count() as u64;
        let aid = next_id;
        next_id += 1;
        kinds.insert(aid, RowKind::Assistant);
        hist.push(Item {
            id: aid,
            kind: RowKind::Assistant,
            tokens: out,
        });
    }
    t
}

/// A row as the proxy keeps it.
#[derive(Clone, Copy, Debug)]
struct PRow {
    seq: u64,
    kind: RowKind,
    tokens: u64,
    est: u64,
    turn: u32,
}

fn run_tideline(
    c: &Ctx,
    bpe: &tiktoken_rs::CoreBPE,
    percent: f64,
    compress: Option<Compress>,
) -> Result<Totals> {
    let a = c.a;
    let mut t = Totals::default();
    let mut cache = Cache { prev: Vec::new() };
    // The proxy's state (sessions.rs `State`).
    let mut rows: Vec<PRow> = Vec::new();
    let mut active: Vec<u64> = Vec::new();
    let mut pending: Option<u64> = None;
    let mut tl = Tideline::new();
    let mut needs_seed = true;
    let mut last_window: Option<u64> = None;
    let mut pending_est = 0u64;
    let mut turn = 0u32;
    let mut turn_lines: BTreeMap<u32, (u64, String)> = BTreeMap::new();
    let dir = "/home/dev/.local/share/oceancode-proxy/sessions/20261201-093000-cc-3f9a1c";
    let calc = effective_line(
        LineSpec::Percent(percent),
        Some(c.context),
        c.max_output,
        Some(a.max_tokens),
    );
    let params = Params {
        line: calc.line,
        block: block_tokens(BlockSpec::PercentOfLine(a.block), calc.line),
    };
    let cparams = compress.map(|cp| compress::Params {
        protect: (calc.line as f64 * cp.protect / 100.0) as u64,
        min_tokens: cp.min_tokens,
    });
    let free = compress
        .and_then(|cp| cp.free)
        .map(|f| (calc.line as f64 * f / 100.0) as u64);
    // What a pointer costs (the same for every row but the digits).
    let pointer = compress::pointer_text(
        1234,
        2345,
        &compress::Location::Lines {
            file: "transcript/0007.md".into(),
            first: 120,
            last: 188,
        },
    );
    let pointer_tokens = bpe.encode_ordinary(&pointer).len() as u64 + 4;
    // Pruned at the last cut: seq → saved estimate.
    let mut pruned: BTreeMap<u64, u64> = BTreeMap::new();
    let summarize_threshold = (c.context as f64 * a.summarize_at / 100.0) as u64;
    let mut stub_cache: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_cut = 0u64;
    // What each row tells the state block (by seq − 1): facts and lines.
    let mut row_facts: Vec<Option<RowFacts>> = Vec::new();
    let mut row_lines: Vec<u32> = Vec::new();
    let mut block_of: Option<(u64, Option<String>)> = None;
    for step in 0..a.steps {
        let u = c.s.user[step];
        if u.kind == RowKind::ToolResult {
            t.tool_results += 1;
        }
        // absorb: the echo of the last answer, then the new row.
        let boundary = active.last().copied().unwrap_or(0);
        if let Some(seq) = pending.take() {
            active.push(seq);
        }
        let seq = rows.len() as u64 + 1;
        if u.kind == RowKind::Prompt {
            turn += 1;
            turn_lines.insert(
                turn,
                (
                    seq,
                    format!("Task {turn}: fix the failing tests in module {turn} and report"),
                ),
            );
        }
        rows.push(PRow {
            seq,
            kind: u.kind,
            tokens: u.tokens,
            est: u.est,
            turn: turn.max(1),
        });
        row_facts.push((u.kind == RowKind::ToolResult).then(|| synthetic_facts(step)));
        row_lines.push(synthetic_lines(u.tokens));
        active.push(seq);
        pending_est += u.est;
        let last_seq = seq;
        let infos: Vec<RowInfo> = active
            .iter()
            .map(|&s| {
                let r = rows[(s - 1) as usize];
                RowInfo {
                    seq: s,
                    kind: r.kind,
                    starts_ok: r.kind != RowKind::ToolResult,
                }
            })
            .collect();
        // The pruned set of a window that starts after `upto`: the retained
        // tool results before the running round (the newest row), by the
        // proxy's estimates (`compress::choose`), seq → saved estimate.
        let choose = |upto: u64, cp: compress::Params| -> BTreeMap<u64, u64> {
            let plan = plan_window(&infos, upto);
            let retained = &active[plan.start..active.len().saturating_sub(1)];
            let cands: Vec<compress::Candidate> = retained
                .iter()
                .map(|&s| rows[(s - 1) as usize])
                .filter(|r| r.kind == RowKind::ToolResult)
                .map(|r| compress::Candidate {
                    seq: r.seq,
                    part: 0,
                    tokens: r.est,
                })
                .collect();
            compress::choose(&cands, cp)
                .into_iter()
                .map(|(s, _)| {
                    let est = rows[(s - 1) as usize].est;
                    (s, est.saturating_sub(pointer_tokens))
                })
                .collect()
        };
        let saved_now: u64 = pruned.values().sum();
        let obs = Observation {
            // The gauge adds the saved estimate: it measures the
            // uncompressed window (blocks keep their sizes).
            gauge: last_window.map_or(0, |w| w + pending_est + saved_now),
            added: pending_est,
            boundary_seq: boundary,
            last_seq,
        };
        let mut all =
            |upto: u64| -> u64 { cparams.map_or(0, |cp| choose(upto, cp).values().sum()) };
        let mask = free.map(|free| Mask {
            saved: saved_now,
            free,
            all: &mut all,
        });
        let decision = if needs_seed || last_window.is_none() {
            needs_seed = false;
            let seed: Vec<(u64, u64)> = active
                .iter()
                .map(|&s| (s, rows[(s - 1) as usize].est))
                .collect();
            match mask {
                Some(m) => tl.seed_masked(&seed, obs, params, m),
                None => tl.seed(&seed, obs, params),
            }
        } else {
            match mask {
                Some(m) => tl.observe_masked(obs, params, m),
                None => tl.observe(obs, params),
            }
        };
        let cold = c.s.cold[step];
        let cut = decision.cut.or_else(|| {
            (cold && c.cold_cut)
                .then(|| {
                    let ests = active.iter().map(|&s| (s, rows[(s - 1) as usize].est));
                    tl.cut_cold(boundary, params, ests)
                })
                .flatten()
        });
        if cut.is_some() {
            t.cuts += 1;
            t.cold_cuts += u64::from(cold);
        } else if decision.masked {
            t.masks += 1;
        }
        // render (sessions.rs `render`).
        let mut segs = vec![Seg {
            id: SYS_ID,
            tokens: a.system,
        }];
        let cut_upto = tl.cut_upto();
        let plan = plan_window(&infos, cut_upto);
        if free.is_some() && (decision.masked || cut.is_some()) {
            // Masking first: the set is chosen again at every event, cut or
            // not (outputs only ever join it while they stay in the window).
            if let Some(cp) = cparams {
                pruned = choose(cut_upto, cp);
            }
        }
        let start = if cut_upto == 0 || plan.start == 0 || plan.effective_upto_seq == 0 {
            0
        } else {
            let pinned_seq = plan.pinned_prompt.map(|i| active[i]);
            let lines: Vec<(u32, &str)> = turn_lines
                .values()
                .filter(|(s, _)| *s <= plan.effective_upto_seq && Some(*s) != pinned_seq)
                .map(|(s, l)| (rows[(*s - 1) as usize].turn, l.as_str()))
                .collect();
            let mut stub = stub_text(plan.effective_upto_seq, dir, &lines);
            if !a.no_state_block {
                // The proxy renders the block once per cut (sessions/thread.rs).
                let upto = plan.effective_upto_seq;
                if block_of.as_ref().map(|(u, _)| *u) != Some(upto) {
                    let block = state_block(
                        &rows,
                        &active[..plan.start],
                        &row_facts,
                        &row_lines,
                        upto,
                        dir,
                        a.state_tokens,
                    );
                    if let Some(b) = &block {
                        let n = bpe.encode_ordinary(b).len() as u64;
                        let bpt = b.len() as f64 / n.max(1) as f64;
                        if t.state_blocks == 0 || bpt < t.state_min_bytes_per_token {
                            t.state_min_bytes_per_token = bpt;
                        }
                        t.state_blocks += 1;
                        t.state_tokens_sum += n;
                        t.state_tokens_max = t.state_tokens_max.max(n);
                    }
                    block_of = Some((upto, block));
                }
                if let Some((_, Some(b))) = &block_of {
                    stub.push_str("\n\n");
                    stub.push_str(b);
                }
            }
            let n = stub_cache.len() as u64;
            let stub_tokens = bpe.encode_ordinary(&stub).len() as u64 + 8;
            let id = *stub_cache.entry(stub).or_insert(n);
            segs.push(Seg {
                id: special_id(id),
                tokens: stub_tokens,
            });
            if let Some(i) = plan.pinned_prompt {
                let r = rows[(active[i] - 1) as usize];
                segs.push(Seg {
                    id: row_id(r.seq),
                    tokens: r.tokens,
                });
            }
            if plan.effective_upto_seq != last_cut {
                last_cut = plan.effective_upto_seq;
                // compress before (at the cut only): the retained tool
                // results before the running round.
                if let (Some(cp), None) = (cparams, free) {
                    pruned = choose(plan.effective_upto_seq, cp);
                }
            }
            plan.start
        };
        for &s in &active[start..] {
            let r = rows[(s - 1) as usize];
            if pruned.contains_key(&s) {
                segs.push(Seg {
                    id: pruned_id(s),
                    tokens: pointer_tokens,
                });
                continue;
            }
            segs.push(Seg {
                id: row_id(s),
                tokens: r.tokens,
            });
        }
        t.saved_sum += pruned.values().sum::<u64>();
        let trail = segs
            .iter()
            .filter(|s| s.id & 3 == 0 && s.id != SYS_ID)
            .filter(|s| {
                rows.get(((s.id >> 2) - 1) as usize).map(|r| r.kind) == Some(RowKind::Assistant)
            })
            .count() as u64;
        t.trail_sum += trail;
        if cut.is_some() {
            t.trail_cut_sum += trail;
            if segs.iter().any(|s| s.id != SYS_ID && s.id & 3 == 3) {
                t.cuts_with_pointers += 1;
            }
        }
        let window = sum(&segs);
        if window > c.context {
            t.overflows += 1;
            t.first_overflow.get_or_insert(step + 1);
        }
        if window >= summarize_threshold {
            // The client would compact here; the tideline exists to prevent it.
            bail!(
                "tideline window {window} reached the client's compaction threshold at step {}",
                step + 1
            );
        }
        let (read, write) = cache.charge(&segs, cold);
        let out = c.s.out[step];
        t.bill(&c.price, 0, read, write, out);
        t.main_request(step, window);
        let kinds: BTreeMap<u64, RowKind> = rows.iter().map(|r| (r.seq, r.kind)).collect();
        let verbatim = verbatim_results(&segs, &kinds);
        if t.tool_results > 0 {
            t.verbatim_frac_sum += verbatim as f64 / t.tool_results as f64;
        }
        t.verbatim_end = verbatim;
        // Everything that left the window is in the ledger, verbatim.
        t.recoverable_end = t.tool_results;
        // complete: real usage, then the answer's row (pending until echoed).
        last_window = Some(window + out);
        pending_est = 0;
        let aseq = rows.len() as u64 + 1;
        rows.push(PRow {
            seq: aseq,
            kind: RowKind::Assistant,
            tokens: out,
            est: c.s.out_est[step],
            turn: turn.max(1),
        });
        row_facts.push(None);
        row_lines.push(synthetic_lines(out));
        pending = Some(aseq);
    }
    Ok(t)
}

/// The facts of the tool step `step` (the call and its result in one row):
/// a file read, edited or written per step (a few hundred files over a
/// long session, revisited), a test command every 5th step (failing every
/// 10th, until its next run), a task list every 25th.
fn synthetic_facts(step: usize) -> RowFacts {
    let id = format!("c{step}");
    let path = format!("src/mod_{}/file_{}.rs", step % 23, (step * 7) % 211);
    let verb = ["read", "edit", "write"][step % 3];
    let command = (step.is_multiple_of(5)).then(|| format!("cargo test -p m{}", step % 7));
    let todos = (step.is_multiple_of(25)).then(|| {
        (0..6)
            .map(|k| {
                let status = if k * 200 < step {
                    "completed"
                } else {
                    "pending"
                };
                (
                    format!("Fix the failing tests in module {k}"),
                    status.to_string(),
                )
            })
            .collect()
    });
    RowFacts {
        calls: vec![CallFacts {
            id: Some(id.clone()),
            tool: if command.is_some() { "Bash" } else { "Edit" }.to_string(),
            files: if command.is_some() {
                Vec::new()
            } else {
                vec![(verb.to_string(), path)]
            },
            command,
            todos,
            task: None,
        }],
        results: vec![ResultFacts {
            id: Some(id),
            is_error: false,
            exit: (step.is_multiple_of(5)).then_some(if step % 10 == 5 { 1 } else { 0 }),
            task: None,
        }],
    }
}

/// Transcript lines of a row of `tokens` tokens (~12 tokens a line).
fn synthetic_lines(tokens: u64) -> u32 {
    4 + (tokens / 12) as u32
}

/// The state block at a cut (`oceancode_ledger::state_block`, as the proxy
/// renders it): facts of the rows before the window's start, line ranges
/// of every row up to `upto`.
fn state_block(
    rows: &[PRow],
    cut: &[u64],
    facts: &[Option<RowFacts>],
    lines: &[u32],
    upto: u64,
    dir: &str,
    max_tokens: u32,
) -> Option<String> {
    let mut f = StateFacts::new();
    for &s in cut {
        if let Some(x) = &facts[(s - 1) as usize] {
            f.add(s, rows[(s - 1) as usize].turn, x);
        }
    }
    let mut at: BTreeMap<u32, u32> = BTreeMap::new();
    let placed: Vec<RowLines> = rows
        .iter()
        .take(upto as usize)
        .map(|r| {
            let before = *at.entry(r.turn).or_insert(1);
            let n = lines[(r.seq - 1) as usize];
            at.insert(r.turn, before + n);
            RowLines {
                seq: r.seq,
                turn: r.turn,
                first: before + 2,
                last: before + n,
            }
        })
        .collect();
    let first = rows.iter().find(|r| r.kind == RowKind::Prompt)?;
    state_block::render(
        &StateInput {
            upto_seq: upto,
            session: "20261201-093000-cc-3f9a1c",
            dir,
            goal: Some(Ask {
                turn: first.turn,
                seq: first.seq,
                text: "Task 1: fix the failing tests in module 1 and report".into(),
            }),
            latest_ask: None,
            facts: &f,
            lines: &placed,
        },
        max_tokens,
    )
}

fn pct(a: u64, b: u64) -> String {
    if b == 0 {
        "–".into()
    } else {
        format!("{:.0}%", 100.0 * a as f64 / b as f64)
    }
}

fn tok(n: u64) -> String {
    if n >= 10_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 1_000_000 {
        format!("{:.2}M", n as f64 / 1e6)
    } else {
        format!("{:.1}k", n as f64 / 1e3)
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let cfg = Config::default();
    let price = oceancode_config::price(&a.model, &cfg)
        .with_context(|| format!("no price for model {:?}", a.model))?;
    let info = oceancode_config::lookup(&a.model);
    let context = a
        .context
        .or(info.map(|i| i.context_window))
        .with_context(|| format!("unknown context window for {:?}: pass --context", a.model))?;
    let c = Ctx {
        a: &a,
        s: &script(&a),
        price,
        context,
        max_output: info.map(|i| i.max_output),
        cold_cut: false,
    };
    let bpe = tiktoken_rs::o200k_base().map_err(|e| anyhow::anyhow!("{e}"))?;
    let before_c = Compress {
        protect: a.protect,
        min_tokens: a.min_tokens,
        free: None,
    };
    let main_c = Compress {
        free: Some(a.free),
        ..before_c
    };
    let tl_label = |p: f64| format!("oceancode-proxy tideline {p}%");
    let c_label = |p: f64, cp: Compress| match cp.free {
        None => format!(
            "tideline {p}% + compress at cuts (before; protect {}%, min {})",
            cp.protect, cp.min_tokens
        ),
        Some(f) => format!(
            "tideline {p}% + mask first (protect {}%, min {}, free {f}%)",
            cp.protect, cp.min_tokens
        ),
    };
    let mut runs: Vec<Run> = vec![
        Run::new("none", "#888888", true, false, run_client(&c, Client::None)),
        Run::new(
            &tl_label(a.tideline),
            "#1f77b4",
            false,
            true,
            run_tideline(&c, &bpe, a.tideline, None)?,
        ),
        Run::new(
            &c_label(a.tideline, before_c),
            "#8c564b",
            true,
            true,
            run_tideline(&c, &bpe, a.tideline, Some(before_c))?,
        ),
        Run::new(
            &c_label(a.tideline, main_c),
            "#9467bd",
            false,
            true,
            run_tideline(&c, &bpe, a.tideline, Some(main_c))?,
        ),
    ];
    if a.low_line > 0.0 {
        runs.push(Run::new(
            &tl_label(a.low_line),
            "#17becf",
            true,
            true,
            run_tideline(&c, &bpe, a.low_line, None)?,
        ));
        runs.push(Run::new(
            &c_label(a.low_line, before_c),
            "#bcbd22",
            true,
            true,
            run_tideline(&c, &bpe, a.low_line, Some(before_c))?,
        ));
        runs.push(Run::new(
            &c_label(a.low_line, main_c),
            "#e377c2",
            true,
            true,
            run_tideline(&c, &bpe, a.low_line, Some(main_c))?,
        ));
    }
    runs.push(Run::new(
        &format!(
            "clear_tool_uses (trigger {}k, keep {})",
            a.clear_trigger / 1000,
            a.clear_keep
        ),
        "#2ca02c",
        false,
        false,
        run_client(&c, Client::Clear),
    ));
    runs.push(Run::new(
        &format!("summarize at {}%", a.summarize_at),
        "#d62728",
        false,
        false,
        run_client(&c, Client::Summarize),
    ));
    let script_tokens: u64 =
        c.s.user.iter().map(|u| u.tokens).sum::<u64>() + c.s.out.iter().sum::<u64>();
    println!(
        "## Context efficiency: {} steps, {} ({}k context, ${}/{}/{}/{} per MTok in/out/cache read/cache write)\n",
        a.steps,
        a.model,
        context / 1000,
        price.input,
        price.output,
        price.cache_read,
        price.cache_write
    );
    println!(
        "Script: system+tools {}k; tool results log-uniform {}–{} tokens; assistant ~{} tokens/step; a new prompt every {} steps; {} of conversation in all (seed {}).\n",
        a.system / 1000,
        a.tool_min,
        a.tool_max,
        a.assistant,
        a.turn_every,
        tok(script_tokens),
        a.seed
    );
    if a.screenshot_every > 0 {
        let (real, est) = screenshot_row(&a);
        println!(
            "Every {}th tool result is a {}×{} screenshot of {} KB: {real} tokens for the provider, estimated {est}{}.\n",
            a.screenshot_every,
            a.screenshot.0,
            a.screenshot.1,
            a.screenshot_bytes / 1000,
            if a.bytes_for_media { " (by its bytes)" } else { "" }
        );
    }
    let mut table = Table::new([
        "strategy",
        "requests",
        "input sent",
        "cache read",
        "cache write",
        "output",
        "cost",
        "vs none",
        "max window",
        "mean window",
        "compactions / cuts",
        "tool results in window (end / avg)",
        "pruned (mean saved)",
        "agent trail (mean / at cuts)",
        "cuts with pointers",
        "recoverable (end)",
    ]);
    let none_cost = runs[0].totals.cost;
    for run in &runs {
        let t = &run.totals;
        let input = t.input_uncached + t.cache_read + t.cache_write;
        let events = if run.cuts && t.masks > 0 {
            format!("{} cuts + {} masks", t.cuts, t.masks)
        } else if run.cuts {
            format!("{} cuts", t.cuts)
        } else {
            format!("{} compactions", t.compactions)
        };
        table.row([
            run.label.clone(),
            t.requests.to_string(),
            tok(input),
            tok(t.cache_read),
            tok(t.cache_write),
            tok(t.output),
            format!("${:.2}", t.cost),
            format!("{:.2}×", t.cost / none_cost),
            tok(t.max_window),
            tok(t.window_sum / a.steps.max(1) as u64),
            events,
            format!(
                "{} / {:.0}%",
                pct(t.verbatim_end, t.tool_results),
                100.0 * t.verbatim_frac_sum / a.steps.max(1) as f64
            ),
            if t.saved_sum > 0 {
                tok(t.saved_sum / a.steps.max(1) as u64)
            } else {
                "–".into()
            },
            format!(
                "{:.1} / {}",
                t.trail_sum as f64 / a.steps.max(1) as f64,
                if t.cuts > 0 {
                    format!("{:.1}", t.trail_cut_sum as f64 / t.cuts as f64)
                } else {
                    "–".into()
                }
            ),
            if run.cuts {
                pct(t.cuts_with_pointers, t.cuts)
            } else {
                "–".into()
            },
            pct(t.recoverable_end, t.tool_results),
        ]);
    }
    println!("{}", table.render());
    for run in &runs {
        let t = &run.totals;
        if let Some(s) = t.first_overflow {
            println!(
                "- {}: the full context first exceeded {}k at step {s} ({} requests over the window); the client then compacted.",
                run.label,
                context / 1000,
                t.overflows
            );
        }
    }
    let tl = &runs[1].totals;
    if a.no_state_block {
        println!("- The tideline's stub carries no state block (--no-state-block).");
    } else if tl.state_blocks > 0 {
        println!(
            "- The tideline's stub carries the state block: {} blocks (one per cut), {} tokens on average, {} at most (budget {}; o200k), at least {:.2} bytes a token (the budget assumes {:.1}).",
            tl.state_blocks,
            tl.state_tokens_sum / tl.state_blocks,
            tl.state_tokens_max,
            a.state_tokens,
            tl.state_min_bytes_per_token,
            state_block::BYTES_PER_TEN_TOKENS as f64 / 10.0
        );
    }
    println!(
        "- Requests include the summarization calls. Input sent = uncached + cache read + cache write; with a breakpoint at the end of every request there is no uncached input."
    );
    println!(
        "- Recoverable: tool results the model can still read verbatim (in the window, or for the tideline in the ledger's transcript files named by the stub). Cleared and summarized results are gone for the model.\n"
    );
    if let Some(path) = &a.csv {
        let mut out = String::from("step");
        for run in &runs {
            out.push(',');
            out.push_str(&run.label);
        }
        out.push('\n');
        for i in 0..a.steps {
            out.push_str(&(i + 1).to_string());
            for run in &runs {
                out.push_str(&format!(",{}", run.totals.series[i].1));
            }
            out.push('\n');
        }
        std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.svg {
        let series: Vec<Series> = runs
            .iter()
            .map(|run| Series {
                label: run.label.clone(),
                color: run.color.to_string(),
                dashed: run.dashed,
                points: run.totals.series.clone(),
            })
            .collect();
        let hlines = vec![
            HLine {
                label: format!("context {}k", context / 1000),
                y: context as f64,
            },
            HLine {
                label: format!("tideline {}%", a.tideline),
                y: context as f64 * a.tideline / 100.0,
            },
        ];
        write_chart(
            path,
            &format!(
                "Window sent upstream per step ({}, {} steps)",
                a.model, a.steps
            ),
            "step",
            "input tokens per request",
            &series,
            &hlines,
        )?;
    }
    let floor = cost_floor(&c);
    println!(
        "- The floor: whatever manages the context, if every request carries the system prompt and tools and every row reaches the model once, the session pays at least each row's tokens written to the cache once, the assistant's tokens as output and the system prompt read from the cache on every later request: ${floor:.2} = {:.2}× of none here (reading the conversation back, which every strategy does, comes on top).\n",
        floor / none_cost
    );
    if c.s.cold.iter().any(|&x| x) {
        cold_cuts(&c, &bpe, none_cost, [before_c, main_c])?;
    }
    if let Some(spec) = &a.compress {
        sweep(&c, &bpe, spec, none_cost, &runs)?;
    }
    if let Some(spec) = &a.lines {
        line_sweep(&c, &bpe, spec, none_cost, floor, &runs)?;
    }
    Ok(())
}

/// `ledger.tideline.cold_cut` off and on, at the main line, alone, with
/// compress at cuts (the default) and with masking first: how many cuts
/// land on cold requests, and what the cache writes and the spend are.
fn cold_cuts(
    c: &Ctx,
    bpe: &tiktoken_rs::CoreBPE,
    none_cost: f64,
    cps: [Compress; 2],
) -> Result<()> {
    let a = c.a;
    let cold = c.s.cold.iter().filter(|&&x| x).count();
    println!(
        "### Cold cuts ({} of {} requests find the cache cold: idle share {}, slow share {}, TTL {} s)\n",
        cold, a.steps, a.idle_share, a.slow_share, a.ttl
    );
    let mut table = Table::new([
        "strategy",
        "cold_cut",
        "cuts",
        "on cold requests",
        "cache write",
        "cache read",
        "cost",
        "vs none",
        "mean window",
    ]);
    for compress in [None, Some(cps[0]), Some(cps[1])] {
        for on in [false, true] {
            let cc = Ctx {
                a: c.a,
                s: c.s,
                price: c.price,
                context: c.context,
                max_output: c.max_output,
                cold_cut: on,
            };
            let t = run_tideline(&cc, bpe, a.tideline, compress)?;
            table.row([
                format!(
                    "tideline {}%{}",
                    a.tideline,
                    match compress.map(|cp| cp.free) {
                        None => "",
                        Some(None) => " + compress at cuts",
                        Some(Some(_)) => " + mask first",
                    }
                ),
                if on { "on" } else { "off" }.to_string(),
                t.cuts.to_string(),
                format!("{} ({})", t.cold_cuts, pct(t.cold_cuts, t.cuts)),
                tok(t.cache_write),
                tok(t.cache_read),
                format!("${:.2}", t.cost),
                format!("{:.2}×", t.cost / none_cost),
                tok(t.window_sum / a.steps.max(1) as u64),
            ]);
        }
    }
    println!("{}", table.render());
    Ok(())
}

/// The least any strategy pays for the script (see the note it prints):
/// the system prompt written once and read by every later request, every
/// row of the conversation written to the cache once, the assistant's
/// tokens generated once. Nothing of the conversation is read back.
fn cost_floor(c: &Ctx) -> f64 {
    let p = &c.price;
    let requests = c.a.steps as u64;
    let conversation: u64 =
        c.s.user.iter().map(|u| u.tokens).sum::<u64>() + c.s.out.iter().sum::<u64>();
    let output: u64 = c.s.out.iter().sum();
    p.cost_usd(
        0,
        output,
        c.a.system * requests.saturating_sub(1),
        c.a.system + conversation,
    )
}

/// `--lines L1,L2,…`: the tideline alone and with compress at each line;
/// a table, and the chart of cost vs line with the floor and the goal.
fn line_sweep(
    c: &Ctx,
    bpe: &tiktoken_rs::CoreBPE,
    spec: &str,
    none_cost: f64,
    floor: f64,
    runs: &[Run],
) -> Result<()> {
    let a = c.a;
    let lines: Vec<f64> = parse_list(spec)?;
    let before = Compress {
        protect: a.protect,
        min_tokens: a.min_tokens,
        free: None,
    };
    let cp = Compress {
        free: Some(a.free),
        ..before
    };
    println!(
        "### Cost vs line ({}; block {}% of the line; compress protect {}%, min {})\n",
        a.model, a.block, a.protect, a.min_tokens
    );
    let mut table = Table::new([
        "line",
        "line tokens",
        "compress",
        "cache read",
        "cache write",
        "cost",
        "vs none",
        "over the floor",
        "mean window",
        "cuts",
    ]);
    let (mut alone, mut with) = (Vec::new(), Vec::new());
    for &line in &lines {
        for compress in [None, Some(before), Some(cp)] {
            let t = run_tideline(c, bpe, line, compress)?;
            let ratio = t.cost / none_cost;
            table.row([
                format!("{line}%"),
                tok(effective_line(
                    LineSpec::Percent(line),
                    Some(c.context),
                    c.max_output,
                    Some(a.max_tokens),
                )
                .line),
                match compress.map(|c| c.free.is_some()) {
                    None => "off",
                    Some(false) => "at cuts",
                    Some(true) => "mask first",
                }
                .to_string(),
                tok(t.cache_read),
                tok(t.cache_write),
                format!("${:.2}", t.cost),
                format!("{ratio:.2}×"),
                format!("+${:.2}", t.cost - floor),
                tok(t.window_sum / a.steps.max(1) as u64),
                t.cuts.to_string(),
            ]);
            match compress.map(|c| c.free.is_some()) {
                None => alone.push((line, ratio)),
                Some(true) => with.push((line, ratio)),
                Some(false) => {}
            }
        }
    }
    println!("{}", table.render());
    if let Some(path) = &a.lines_svg {
        let series = vec![
            Series {
                label: "tideline alone".into(),
                color: "#1f77b4".into(),
                dashed: true,
                points: alone,
            },
            Series {
                label: format!("tideline + mask first (protect {}%)", a.protect),
                color: "#9467bd".into(),
                dashed: false,
                points: with,
            },
        ];
        let mut hlines = vec![
            HLine {
                label: "goal 0.35×".into(),
                y: 0.35,
            },
            HLine {
                label: format!("floor {:.2}×", floor / none_cost),
                y: floor / none_cost,
            },
        ];
        hlines.extend(strategy_lines(runs, none_cost, "tideline"));
        write_chart(
            path,
            &format!("Cost vs tideline ({}, {} steps)", a.model, a.steps),
            "tideline (% of the context)",
            "cost vs none",
            &series,
            &hlines,
        )?;
    }
    Ok(())
}

/// The other strategies of the table as horizontal lines of a cost chart
/// (their cost vs none), leaving out the runs `skip` names.
fn strategy_lines(runs: &[Run], none_cost: f64, skip: &str) -> Vec<HLine> {
    runs.iter()
        .skip(1)
        .filter(|run| !run.label.contains(skip))
        .map(|run| HLine {
            label: format!("{} {:.2}×", run.label, run.totals.cost / none_cost),
            y: run.totals.cost / none_cost,
        })
        .collect()
}

/// Write a line chart to `path` (its folder made if needed) and say so.
fn write_chart(
    path: &std::path::Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    hlines: &[HLine],
) -> Result<()> {
    let svg = line_chart(title, x_label, y_label, series, hlines, (900.0, 460.0));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    println!("(chart written to {})", path.display());
    Ok(())
}

/// One strategy's result, as the table shows it.
struct Run {
    label: String,
    color: &'static str,
    dashed: bool,
    /// Counts cuts (the tideline) rather than compactions.
    cuts: bool,
    totals: Totals,
}

impl Run {
    fn new(label: &str, color: &'static str, dashed: bool, cuts: bool, totals: Totals) -> Run {
        Run {
            label: label.to_string(),
            color,
            dashed,
            cuts,
            totals,
        }
    }
}

fn parse_list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>> {
    s.split(',')
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.trim()
                .parse::<T>()
                .map_err(|_| anyhow::anyhow!("not a number: {v:?}"))
        })
        .collect()
}

/// `--compress PROTECTS/MINS`: every pair at the main and the low line; a
/// table, and the chart of cost vs protect size.
fn sweep(
    c: &Ctx,
    bpe: &tiktoken_rs::CoreBPE,
    spec: &str,
    none_cost: f64,
    runs: &[Run],
) -> Result<()> {
    let a = c.a;
    let mut parts = spec.split('/');
    let protects: Vec<f64> = parse_list(parts.next().unwrap_or(""))?;
    let mut mins: Vec<u64> = parse_list(parts.next().unwrap_or(""))?;
    if mins.is_empty() {
        mins.push(a.min_tokens);
    }
    let mut blocks: Vec<f64> = parse_list(parts.next().unwrap_or(""))?;
    if blocks.is_empty() {
        blocks.push(a.block);
    }
    // Masking first at each `free` (percent of the line); `-` = at cuts only.
    let frees: Vec<Option<f64>> = match parts.next() {
        None | Some("") => vec![Some(a.free)],
        Some(list) => list
            .split(',')
            .map(|v| match v.trim() {
                "-" => Ok(None),
                v => v
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| anyhow::anyhow!("not a number: {v:?}")),
            })
            .collect::<Result<_>>()?,
    };
    let mut lines = vec![a.tideline];
    if a.low_line > 0.0 {
        lines.push(a.low_line);
    }
    println!("### compress sweep ({})\n", a.model);
    let mut table = Table::new([
        "line",
        "block",
        "protect",
        "min_tokens",
        "free",
        "input sent",
        "cache read",
        "cache write",
        "cost",
        "vs none",
        "max window",
        "mean window",
        "cuts",
        "masks",
        "agent trail",
        "pruned (mean saved)",
    ]);
    let colors = [
        "#1f77b4", "#9467bd", "#17becf", "#e377c2", "#ff7f0e", "#8c564b", "#bcbd22", "#7f7f7f",
    ];
    let mut series: Vec<Series> = Vec::new();
    for &line in &lines {
        for &block in &blocks {
            let cb = Ctx {
                a: &Args { block, ..a.clone() },
                s: c.s,
                price: c.price,
                context: c.context,
                max_output: c.max_output,
                cold_cut: c.cold_cut,
            };
            for (&min, &free) in mins.iter().flat_map(|m| frees.iter().map(move |f| (m, f))) {
                let mut points = Vec::new();
                for &protect in &protects {
                    let cp = Compress {
                        protect,
                        min_tokens: min,
                        free,
                    };
                    let t = run_tideline(&cb, bpe, line, Some(cp))?;
                    let input = t.input_uncached + t.cache_read + t.cache_write;
                    let ratio = t.cost / none_cost;
                    table.row([
                        format!("{line}%"),
                        format!("{block}%"),
                        format!("{protect}%"),
                        min.to_string(),
                        free.map_or("at cuts".into(), |f| format!("{f}%")),
                        tok(input),
                        tok(t.cache_read),
                        tok(t.cache_write),
                        format!("${:.2}", t.cost),
                        format!("{ratio:.2}×"),
                        tok(t.max_window),
                        tok(t.window_sum / a.steps.max(1) as u64),
                        t.cuts.to_string(),
                        t.masks.to_string(),
                        format!("{:.1}", t.trail_sum as f64 / a.steps.max(1) as f64),
                        tok(t.saved_sum / a.steps.max(1) as u64),
                    ]);
                    points.push((protect, ratio));
                }
                let color = colors[series.len() % colors.len()];
                series.push(Series {
                    label: format!(
                        "tideline {line}%, block {block}%, min {min}, free {}",
                        free.map_or("at cuts".into(), |f| format!("{f}%"))
                    ),
                    color: color.to_string(),
                    dashed: line != a.tideline,
                    points,
                });
            }
        }
    }
    println!("{}", table.render());
    if let Some(path) = &a.compress_svg {
        let mut hlines = vec![HLine {
            label: "goal 0.35×".into(),
            y: 0.35,
        }];
        hlines.extend(strategy_lines(runs, none_cost, "compress"));
        write_chart(
            path,
            &format!("Cost vs protect size ({}, {} steps)", a.model, a.steps),
            "protect (% of the line)",
            "cost vs none",
            &series,
            &hlines,
        )?;
    }
    Ok(())
}
