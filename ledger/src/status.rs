//! The session meter of `status`: the context meter (window vs line vs the
//! model's context), tokens in/out, the cache hit ratio and the spend from
//! the price table. Pure: built from recorded steps and cuts.
//!
//! Tokens and spend count what the provider billed: a step's window usage
//! plus what it billed beyond it ([`StepDetail::extra`]: server-side
//! compaction). The window (the gauge) is the step's usage alone.

use crate::model::{AppliedEdit, StepDetail, Usage};
use crate::store::{CutRecord, StepRecord};
use oceancode_config::Price;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Width of the meter bar in cells.
pub const BAR_WIDTH: usize = 40;

/// Usage and spend summed over steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Steps counted.
    pub steps: u32,
    /// Uncached input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cache reads.
    pub cache_read: u64,
    /// Cache writes.
    pub cache_write: u64,
    /// Spend in USD of the priced steps.
    pub cost_usd: f64,
    /// Models without a price (their steps are not in `cost_usd`).
    pub unpriced: Vec<String>,
    /// Of the tokens above, those billed beyond the steps' windows
    /// (server-side compaction; in `input`..`output` already).
    pub beyond_window: u64,
    /// Output tokens spent on reasoning (a part of `output`).
    pub reasoning: u64,
    /// Server-side compactions the provider made.
    pub compactions: u32,
    /// Context edits the provider applied, summed per edit type.
    pub edits: Vec<EditTotal>,
    /// `oceancode_recall` calls the proxy answered itself (the in-band
    /// recall tool; the client never saw them).
    pub recalls: u32,
    /// Steps that failed (no whole answer: `StepRecord::error`).
    pub failed_steps: u32,
}

/// How a step record's error starts when a bound of `limits.session`
/// (`--max-spend`, `--max-steps`, `--max-time`) refused the request: the
/// rest says which bound and what was used.
pub const STOPPED: &str = "stopped: ";

/// A failed step as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedStep {
    /// Step number.
    pub step: u32,
    /// The status the client got.
    pub status: u16,
    /// Why (`upstream_unreachable`, `upstream_timeout`, `stream_error`,
    /// `cancelled`, `upstream_error`).
    pub error: String,
    /// Unix milliseconds.
    pub ts_ms: i64,
}

impl FailedStep {
    /// The latest failed step of `steps`, if any.
    pub fn latest(steps: &[StepRecord]) -> Option<FailedStep> {
        steps
            .iter()
            .filter(|s| s.error.is_some())
            .max_by_key(|s| (s.ts_ms, s.step))
            .map(|s| FailedStep {
                step: s.step,
                status: s.status,
                error: s.error.clone().unwrap_or_default(),
                ts_ms: s.ts_ms,
            })
    }

    /// `step 5: 502 upstream_unreachable`.
    pub fn label(&self) -> String {
        format!("step {}: {} {}", self.step, self.status, self.error)
    }
}

/// The context edits of one type the provider applied, summed over steps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EditTotal {
    /// The edit's type (`clear_tool_uses_20250919`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Steps it was applied on.
    pub steps: u32,
    /// Input tokens it cleared, in all.
    pub cleared_input_tokens: u64,
    /// Tool uses it cleared, in all.
    pub cleared_tool_uses: u64,
    /// Thinking turns it cleared, in all.
    pub cleared_thinking_turns: u64,
}

impl EditTotal {
    /// `clear_tool_uses_20250919 ×2 (5 tool uses, 12k tokens cleared)`.
    pub fn label(&self) -> String {
        let mut what = Vec::new();
        if self.cleared_tool_uses > 0 {
            what.push(format!("{} tool uses", self.cleared_tool_uses));
        }
        if self.cleared_thinking_turns > 0 {
            what.push(format!("{} thinking turns", self.cleared_thinking_turns));
        }
        what.push(format!(
            "{} tokens cleared",
            tokens(self.cleared_input_tokens)
        ));
        format!("{} ×{} ({})", self.kind, self.steps, what.join(", "))
    }
}

/// Add the edits of one step to per-type totals (in first-seen order).
pub fn add_edits(into: &mut Vec<EditTotal>, edits: &[AppliedEdit]) {
    for e in edits {
        let i = match into.iter().position(|t| t.kind == e.kind) {
            Some(i) => i,
            None => {
                into.push(EditTotal {
                    kind: e.kind.clone(),
                    ..EditTotal::default()
                });
                into.len() - 1
            }
        };
        let t = &mut into[i];
        t.steps += 1;
        t.cleared_input_tokens += e.cleared_input_tokens;
        t.cleared_tool_uses += e.cleared_tool_uses.unwrap_or(0);
        t.cleared_thinking_turns += e.cleared_thinking_turns.unwrap_or(0);
    }
}

/// What a step was billed: its window's usage and what came on top of it.
pub fn billed(usage: crate::Usage, detail: &StepDetail) -> crate::Usage {
    usage.plus(detail.extra)
}

impl Totals {
    /// All input tokens (uncached + cache read + cache write).
    pub fn input_total(&self) -> u64 {
        self.input + self.cache_read + self.cache_write
    }

    /// Cache reads over all input tokens (0 when there is no input).
    pub fn cache_hit_ratio(&self) -> f64 {
        let total = self.input_total();
        if total == 0 {
            0.0
        } else {
            self.cache_read as f64 / total as f64
        }
    }

    /// The spend when every model had a price.
    pub fn cost_if_known(&self) -> Option<f64> {
        self.unpriced.is_empty().then_some(self.cost_usd)
    }

    /// Add one step.
    pub fn add(&mut self, step: &StepRecord, price: Option<Price>) {
        let u = billed(step.usage, &step.detail);
        self.steps += 1;
        if step.error.is_some() {
            self.failed_steps += 1;
        }
        self.beyond_window += step.detail.extra.window_total();
        self.reasoning += step.detail.reasoning;
        self.compactions += step.detail.compactions;
        add_edits(&mut self.edits, &step.detail.edits);
        self.recalls += step.detail.recalls.len() as u32;
        self.input += u.input;
        self.output += u.output;
        self.cache_read += u.cache_read;
        self.cache_write += u.cache_write;
        match price {
            Some(p) => self.cost_usd += p.cost_usd(u.input, u.output, u.cache_read, u.cache_write),
            None if u.window_total() > 0 && !self.unpriced.contains(&step.model) => {
                self.unpriced.push(step.model.clone())
            }
            None => {}
        }
    }
}

/// Totals over `steps`, overall and per model.
pub fn totals(
    steps: &[StepRecord],
    pricer: &dyn Fn(&str) -> Option<Price>,
) -> (Totals, BTreeMap<String, Totals>) {
    let mut all = Totals::default();
    let mut by_model: BTreeMap<String, Totals> = BTreeMap::new();
    for s in steps {
        let price = pricer(&s.model);
        all.add(s, price);
        by_model.entry(s.model.clone()).or_default().add(s, price);
    }
    (all, by_model)
}

/// Where the line `status` shows comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LineSource {
    /// A running proxy holds the session: its line now (runtime overrides
    /// and learned ceilings included).
    Live {
        /// Which proxy (`the run proxy (python3, pid 9, http://…)`).
        proxy: String,
    },
    /// No running proxy holds it: the line it last ran with, as recorded.
    Recorded {
        /// Unix milliseconds it came in force.
        since_ms: i64,
    },
    /// Nothing recorded and no proxy holds it: the configured line.
    Configured,
}

/// What `status` shows for one session.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    /// Session id.
    pub session: String,
    /// Client family.
    pub client: String,
    /// The name the user gave the session (`/s/<name>/`,
    /// `x-oceancode-session`), if any.
    pub name: Option<String>,
    /// Model of the latest request.
    pub model: String,
    /// The session this one is linked to (a sub-agent's parent, or the one
    /// a sibling diverged from).
    pub parent: Option<String>,
    /// A sibling's divergence point: the parent's last shared row.
    pub parent_seq: Option<u64>,
    /// The window after the latest step that reported usage (input + cache
    /// read + cache write + output); 0 when none did.
    pub window: u64,
    /// The line in tokens.
    pub line: u64,
    /// How the line was set (`40%`, `500k`, `ceiling`).
    pub line_spec: String,
    /// True when `line`/`line_spec` are the running proxy's live line.
    pub line_live: bool,
    /// Where `line`/`line_spec` come from.
    pub line_source: LineSource,
    /// The model's context window, if known.
    pub context: Option<u64>,
    /// What stays in every window whatever is cut ([`fixed_part`]).
    pub fixed: u64,
    /// Last seq past the tideline (0 = never cut).
    pub cut_upto: u64,
    /// Number of cuts.
    pub cuts: u32,
    /// Turns and rows on the active line.
    pub turns: u32,
    /// Rows on the active line.
    pub rows: u64,
    /// Usage and spend.
    pub totals: Totals,
    /// The running proxy's ledger is behind on this session (it misses
    /// events until the client's next full resend heals it).
    pub behind: bool,
    /// What `ledger.compress` sent as pointers in the latest step's window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pruned: Option<crate::Pruned>,
    /// The latest step that failed (the count is `totals.failed_steps`).
    pub last_error: Option<FailedStep>,
    /// Its use against the per-session bounds (`limits.session`), when
    /// one is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// The model merge of `SESSION.md` (`ledger.merge.model`): its calls,
    /// tokens and cost, apart from the session's own spend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeSpend>,
    /// The prompt cache: free cuts, misses by cause, the last miss, and
    /// the spend an unmanaged session would have had.
    pub cache: CacheSummary,
}

/// What `status` says about the prompt cache, from the steps' records
/// (`steps.detail.cache`) and the cuts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CacheSummary {
    /// Cuts that landed on a request whose cache was already cold (free).
    pub free_cuts: u32,
    /// Misses by cause (`cut`, `context_edit`, `client_changed`,
    /// `ttl_expired`, `model_switch`, `resumed`, `provider`, `unknown`).
    pub misses: Vec<MissTotal>,
    /// The latest miss.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_miss: Option<LastMiss>,
    /// The spend the same requests would have had unmanaged (an estimate:
    /// [`unmanaged`]); None when a model has no price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged_usd: Option<f64>,
}

/// Misses of one cause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MissTotal {
    /// The cause's label.
    pub cause: String,
    /// Steps.
    pub steps: u32,
    /// Tokens sent again.
    pub tokens: u64,
}

/// The latest miss as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LastMiss {
    /// Step number.
    pub step: u32,
    /// The cause's label.
    pub cause: String,
    /// Tokens sent again.
    pub tokens: u64,
    /// Why the cache was already cold when the request arrived
    /// (`ttl_expired`, `model_switch`, `resumed`): a cut or edit there cost
    /// nothing the client would not have paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold: Option<String>,
    /// Where the client's request changed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<String>,
    /// The provider's own diagnosis, when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

impl LastMiss {
    /// Its cause with where the client changed and why the cache was cold
    /// already, when those apply: `cut (tools) at a cold cache (ttl_expired)`.
    pub fn why(&self) -> String {
        let mut why = self.cause.clone();
        if let Some(w) = &self.changed {
            let _ = write!(why, " ({w})");
        }
        if let Some(k) = self.cold.as_ref().filter(|k| **k != self.cause) {
            let _ = write!(why, " at a cold cache ({k})");
        }
        why
    }
}

impl CacheSummary {
    /// From the steps' records, in step order.
    pub fn of(
        steps: &[StepRecord],
        cuts: &[CutRecord],
        pricer: &dyn Fn(&str) -> Option<Price>,
    ) -> CacheSummary {
        let mut out = CacheSummary::default();
        for s in steps {
            let Some(c) = &s.detail.cache else { continue };
            out.free_cuts += u32::from(c.free_cut);
            let Some(cause) = c.miss else { continue };
            let label = cause.label();
            match out.misses.iter_mut().find(|m| m.cause == label) {
                Some(m) => {
                    m.steps += 1;
                    m.tokens += c.miss_tokens;
                }
                None => out.misses.push(MissTotal {
                    cause: label.to_string(),
                    steps: 1,
                    tokens: c.miss_tokens,
                }),
            }
            out.last_miss = Some(LastMiss {
                step: s.step,
                cause: label.to_string(),
                tokens: c.miss_tokens,
                cold: c.cold.map(|k| k.label().to_string()),
                changed: c.changed.clone(),
                provider: c.provider.clone(),
            });
        }
        out.unmanaged_usd = unmanaged(steps, cuts, pricer).map(|u| u.cost_usd);
        out
    }
}

/// The same requests without the proxy, as estimated from the ledger.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Unmanaged {
    /// Tokens, summed.
    pub usage: Usage,
    /// Spend at list price (USD).
    pub cost_usd: f64,
}

/// An estimate of what the session's requests would have cost with no
/// cuts: each step's prompt grows by what the cuts before it kept out
/// (a cut's gauge before it minus the prompt its step sent), read from the
/// cache as the client's own pattern reads it (the whole previous prompt
/// when the step read anything and its miss was not the proxy's; only
/// what it read when the client or the clock made it miss, a free cut at
/// a cold request included; no cache when the step used none), the rest
/// written (or sent uncached where the provider reports no writes); output
/// and what was billed beyond the window unchanged. None when a model has
/// no price.
pub fn unmanaged(
    steps: &[StepRecord],
    cuts: &[CutRecord],
    pricer: &dyn Fn(&str) -> Option<Price>,
) -> Option<Unmanaged> {
    use crate::cache::MissCause;
    let mut cuts: Vec<&CutRecord> = cuts.iter().collect();
    cuts.sort_by_key(|c| c.ts_ms);
    let mut next_cut = cuts.into_iter().peekable();
    let mut kept_out = 0u64;
    let mut prev: Option<u64> = None;
    let mut out = Unmanaged::default();
    for s in steps {
        let u = s.usage;
        let prompt = u.input + u.cache_read + u.cache_write;
        let mut gauge = None;
        while let Some(c) = next_cut.next_if(|c| c.ts_ms <= s.ts_ms) {
            gauge = Some(gauge.unwrap_or(0).max(c.gauge));
        }
        if let Some(g) = gauge.filter(|_| prompt > 0) {
            // The cut's gauge is the prompt this request had without it.
            kept_out += g.saturating_sub(prompt);
        }
        let billed = if prompt == 0 {
            u
        } else {
            let full = prompt + kept_out;
            let note = s.detail.cache.as_ref();
            // A miss the proxy caused is one the client would not have had,
            // unless the request found the cache cold (the TTL past, another
            // model, a resumed session): then it misses unmanaged too. A
            // request flagged cold that missed nothing found it warm.
            let cold = note.is_some_and(|c| c.cold.is_some());
            let proxy_miss = match note.and_then(|c| c.miss) {
                None => true,
                Some(MissCause::Cut | MissCause::ContextEdit) => !cold,
                Some(_) => false,
            };
            let (read, input, write) = if u.cache_read + u.cache_write == 0 {
                (0, full, 0)
            } else {
                let read = if proxy_miss {
                    prev.unwrap_or(u.cache_read)
                        .max(u.cache_read)
                        .min(full.saturating_sub(u.input))
                } else {
                    u.cache_read
                };
                let rest = full.saturating_sub(read + u.input);
                if u.cache_write == 0 {
                    (read, u.input + rest, 0)
                } else {
                    (read, u.input, rest)
                }
            };
            prev = Some(full);
            Usage {
                input,
                output: u.output,
                cache_read: read,
                cache_write: write,
            }
        };
        let b = billed.plus(s.detail.extra);
        out.usage = out.usage.plus(b);
        let p = pricer(&s.model);
        match p {
            Some(p) => out.cost_usd += p.cost_usd(b.input, b.output, b.cache_read, b.cache_write),
            None if b.window_total() > 0 => return None,
            None => {}
        }
    }
    Some(out)
}

/// What the model merge of a session's `SESSION.md` used (live or
/// `ledger rebuild --merge`): not a step of the session, so not in its
/// tokens, spend or limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MergeSpend {
    /// Merge calls recorded.
    pub calls: u32,
    /// Their tokens.
    pub usage: Usage,
    /// Their cost at list price (None when a model has no price).
    pub cost_usd: Option<f64>,
    /// The models used.
    pub models: Vec<String>,
}

impl MergeSpend {
    /// Sum the uses a session's merge markers record; `None` when none.
    pub fn of(
        uses: &[crate::merge::MergeUse],
        price: &dyn Fn(&str) -> Option<Price>,
    ) -> Option<MergeSpend> {
        if uses.is_empty() {
            return None;
        }
        let mut m = MergeSpend {
            cost_usd: Some(0.0),
            ..MergeSpend::default()
        };
        for u in uses {
            m.calls += 1;
            m.usage.input += u.usage.input;
            m.usage.output += u.usage.output;
            m.usage.cache_read += u.usage.cache_read;
            m.usage.cache_write += u.usage.cache_write;
            let c = price(&u.model).map(|p| {
                p.cost_usd(
                    u.usage.input,
                    u.usage.output,
                    u.usage.cache_read,
                    u.usage.cache_write,
                )
            });
            m.cost_usd = match (m.cost_usd, c) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
            if !m.models.contains(&u.model) {
                m.models.push(u.model.clone());
            }
        }
        Some(m)
    }

    /// The meter's line: `3 calls · 12.3k in · 456 out · $0.0123 (claude-haiku-4-5)`.
    pub fn line(&self) -> String {
        let u = &self.usage;
        let cost = self
            .cost_usd
            .map_or_else(|| "no price".to_string(), |c| format!("${c:.4}"));
        format!(
            "{} call{} · {} in · {} out · {cost} ({}; not in the spend above)",
            self.calls,
            if self.calls == 1 { "" } else { "s" },
            tokens(u.input + u.cache_read + u.cache_write),
            tokens(u.output),
            self.models.join(", ")
        )
    }
}

/// A session's use against its bounds (`limits.session`: spend, steps,
/// time), as `status` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Limits {
    /// The spend bound, USD (the spend itself is [`Totals::cost_usd`], or
    /// `spent_usd` when the proxy counted it with linked sessions).
    pub spend_cap_usd: Option<f64>,
    /// USD spent as the bound counts it (None: the session's own totals).
    pub spent_usd: Option<f64>,
    /// Steps as the bound counts them.
    pub steps: u32,
    /// The step bound.
    pub steps_cap: Option<u32>,
    /// Milliseconds since the session's first request (to now while a
    /// proxy holds it, else to its last activity).
    pub elapsed_ms: u64,
    /// The time bound, ms.
    pub time_cap_ms: Option<u64>,
    /// Where the bounds come from (`the run proxy …`, `the config`).
    pub from: String,
    /// The bound reached, as the proxy said it.
    pub stopped: Option<String>,
}

/// `1h30m`, `2m5s`, `45s`.
pub fn duration(ms: u64) -> String {
    let mut s = ms / 1000;
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, n) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if s >= n {
            let _ = write!(out, "{}{unit}", s / n);
            s %= n;
        }
    }
    out
}

/// `$0.0512` under a dollar, else `$1.25`.
pub fn usd(v: f64) -> String {
    if v < 1.0 {
        format!("${v:.4}")
    } else {
        format!("${v:.2}")
    }
}

impl Status {
    /// Build from recorded facts.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        meta: &crate::SessionMeta,
        steps: &[StepRecord],
        cuts: &[CutRecord],
        turns: u32,
        rows: u64,
        line: u64,
        line_spec: String,
        context: Option<u64>,
        pricer: &dyn Fn(&str) -> Option<Price>,
    ) -> Status {
        let window = steps
            .iter()
            .rev()
            .find(|s| s.usage.window_total() > 0)
            .map_or(0, |s| s.usage.window_total());
        Status {
            session: meta.id.clone(),
            client: meta.client.clone(),
            name: meta
                .client_session
                .as_deref()
                .and_then(crate::resolve::given_name)
                .map(str::to_string),
            model: meta.model.clone(),
            parent: meta.parent.clone(),
            parent_seq: meta.parent_seq,
            window,
            line,
            line_spec,
            line_live: false,
            line_source: LineSource::Configured,
            context,
            fixed: fixed_part(steps),
            cut_upto: cuts.iter().map(|c| c.upto_seq).max().unwrap_or(0),
            cuts: cuts.len() as u32,
            turns,
            rows,
            totals: totals(steps, pricer).0,
            behind: false,
            limits: None,
            last_error: FailedStep::latest(steps),
            pruned: steps.last().and_then(|s| s.detail.compress.clone()),
            merge: None,
            cache: CacheSummary::of(steps, cuts, pricer),
        }
    }

    /// The meter bar: `BAR_WIDTH` cells scaled to the model's context (else
    /// to the larger of line and window); `█` up to the window, `┃` at the line.
    pub fn bar(&self) -> String {
        let scale = self
            .context
            .unwrap_or(0)
            .max(self.line)
            .max(self.window)
            .max(1);
        let cell = |v: u64| ((v as f64 / scale as f64) * BAR_WIDTH as f64).round() as usize;
        let filled = cell(self.window).min(BAR_WIDTH);
        let mark = cell(self.line).min(BAR_WIDTH - 1);
        let mut s = String::from("[");
        for i in 0..BAR_WIDTH {
            s.push(if i == mark {
                '┃'
            } else if i < filled {
                '█'
            } else {
                '░'
            });
        }
        s.push(']');
        s
    }

    /// The human-readable meter.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let name = self
            .name
            .as_deref()
            .map_or(String::new(), |n| format!(" \"{n}\""));
        let _ = writeln!(
            out,
            "session  {}{name} ({} · {})",
            self.session, self.client, self.model
        );
        match (&self.parent, self.parent_seq) {
            (Some(p), Some(seq)) => {
                let _ = writeln!(out, "link     sibling of {p}, diverged after its seq {seq}");
            }
            (Some(p), None) => {
                let _ = writeln!(out, "link     sub-agent of {p}");
            }
            _ => {}
        }
        let context = self.context.map_or_else(|| "unknown".to_string(), tokens);
        let _ = writeln!(
            out,
            "context  {}  window {} · line {} · context {}",
            self.bar(),
            tokens(self.window),
            tokens(self.line),
            context
        );
        let to_go = if self.window < self.line {
            format!("{} to go", tokens(self.line - self.window))
        } else {
            format!(
                "{} over: the next request cuts",
                tokens(self.window - self.line)
            )
        };
        let source = match &self.line_source {
            LineSource::Live { proxy } => format!(", live from {proxy}"),
            LineSource::Recorded { since_ms } => format!(
                ", as it ran (recorded {}): no running proxy holds the session",
                crate::transcript::utc_iso(*since_ms)
            ),
            LineSource::Configured => {
                ", as configured: none recorded, no running proxy holds the session".to_string()
            }
        };
        let _ = writeln!(
            out,
            "         tideline @{} ({}{source}): {to_go}",
            self.line_spec,
            tokens(self.line)
        );
        if let Some(note) = fixed_part_note(self.fixed, self.line) {
            let _ = writeln!(out, "         fixed: {note}");
        }
        let t = &self.totals;
        let _ = writeln!(
            out,
            "tokens   in {} (uncached {} · cache read {} · cache write {}) · out {}",
            tokens(t.input_total()),
            tokens(t.input),
            tokens(t.cache_read),
            tokens(t.cache_write),
            tokens(t.output)
        );
        if t.reasoning > 0 {
            let _ = writeln!(
                out,
                "         of the output, reasoning {}",
                tokens(t.reasoning)
            );
        }
        let _ = writeln!(
            out,
            "cache    hit ratio {:.1}%",
            t.cache_hit_ratio() * 100.0
        );
        if t.compactions > 0 || t.beyond_window > 0 {
            let _ = writeln!(
                out,
                "server   {} compaction{} by the provider · {} billed beyond the window (in the tokens and spend above, not in the window)",
                t.compactions,
                if t.compactions == 1 { "" } else { "s" },
                tokens(t.beyond_window)
            );
        }
        for e in &t.edits {
            let _ = writeln!(
                out,
                "edits    {} by the provider (the window is the real input after them)",
                e.label()
            );
        }
        if t.recalls > 0 {
            let _ = writeln!(
                out,
                "recall   {} oceancode_recall call{} answered by the proxy (internal: the client never saw them)",
                t.recalls,
                if t.recalls == 1 { "" } else { "s" }
            );
        }
        let spend = match (t.cost_if_known(), t.cost_usd > 0.0) {
            (Some(c), _) => format!("${c:.4} at list price"),
            (None, true) => format!(
                "≥ ${:.4} (no price for {})",
                t.cost_usd,
                t.unpriced.join(", ")
            ),
            (None, false) => format!("unknown (no price for {})", t.unpriced.join(", ")),
        };
        let cap = self.limits.as_ref().and_then(|l| l.spend_cap_usd);
        let spent = self
            .limits
            .as_ref()
            .and_then(|l| l.spent_usd)
            .or(t.cost_if_known());
        let spend = match (cap, spent) {
            (Some(cap), Some(spent)) => {
                format!("{} / {} at list price", usd(spent), usd(cap))
            }
            (Some(cap), None) => format!("{spend} (cap {})", usd(cap)),
            (None, _) => spend,
        };
        let _ = writeln!(out, "spend    {spend}");
        if let (Some(u), Some(real)) = (self.cache.unmanaged_usd, t.cost_if_known()) {
            let _ = writeln!(
                out,
                "         unmanaged (estimate: the same requests, no cuts, the client's own cache pattern) {} · managed {}",
                usd(u),
                usd(real)
            );
        }
        if let Some(m) = &self.merge {
            let _ = writeln!(out, "merge    {}", m.line());
        }
        if let Some(l) = &self.limits {
            let mut parts = Vec::new();
            if let Some(cap) = l.steps_cap {
                parts.push(format!("steps {} / {cap}", l.steps));
            }
            if let Some(cap) = l.time_cap_ms {
                parts.push(format!(
                    "elapsed {} / {}",
                    duration(l.elapsed_ms),
                    duration(cap)
                ));
            }
            let mut label = "limits  ";
            if !parts.is_empty() {
                let _ = writeln!(out, "{label} {} ({})", parts.join(" · "), l.from);
                label = "        ";
            }
            if let Some(why) = &l.stopped {
                let _ = writeln!(
                    out,
                    "{label} stopped: {why}; the proxy refuses its further requests"
                );
            }
        }
        let cut = if self.cut_upto == 0 {
            "never cut".to_string()
        } else {
            format!("rows ≤ seq {} past the tideline", self.cut_upto)
        };
        let _ = writeln!(
            out,
            "ledger   {} · {} · {} · {} ({cut})",
            counted(u64::from(t.steps), "step"),
            counted(u64::from(self.turns), "turn"),
            counted(self.rows, "row"),
            counted(u64::from(self.cuts), "cut")
        );
        if let Some(why) = self
            .last_error
            .as_ref()
            .and_then(|e| Some((e, e.error.strip_prefix(STOPPED)?)))
        {
            let (e, why) = why;
            let _ = writeln!(
                out,
                "stopped  {why} · the request after step {} was refused ({})",
                e.step.saturating_sub(1),
                crate::transcript::utc_iso(e.ts_ms)
            );
        } else if let Some(e) = &self.last_error {
            let _ = writeln!(
                out,
                "failed   {} step{} without a whole answer · latest {} ({})",
                t.failed_steps,
                if t.failed_steps == 1 { "" } else { "s" },
                e.label(),
                crate::transcript::utc_iso(e.ts_ms)
            );
        }
        if let Some(p) = self.pruned.as_ref().filter(|p| p.outputs > 0) {
            let _ = writeln!(
                out,
                "compress {} tool output{} sent as pointers ({} of output, ≈{} saved; the gauge counts them)",
                p.outputs,
                if p.outputs == 1 { "" } else { "s" },
                tokens(p.tokens),
                tokens(p.saved)
            );
        }
        let c = &self.cache;
        if c.free_cuts > 0 || !c.misses.is_empty() {
            let by: Vec<String> = c
                .misses
                .iter()
                .map(|m| format!("{} {}", m.cause, m.steps))
                .collect();
            let _ = writeln!(
                out,
                "misses   {} (tokens written again: {}) · {} of {} free (at a cold request)",
                if by.is_empty() {
                    "none".to_string()
                } else {
                    by.join(" · ")
                },
                tokens(c.misses.iter().map(|m| m.tokens).sum()),
                counted(u64::from(c.free_cuts), "cut"),
                self.cuts
            );
        }
        if let Some(m) = &c.last_miss {
            let mut why = m.why();
            if let Some(p) = &m.provider {
                let _ = write!(why, ", provider: {p}");
            }
            let _ = writeln!(
                out,
                "         last miss: step {} · {why} · {} sent again",
                m.step,
                tokens(m.tokens)
            );
        }
        if self.behind {
            let _ = writeln!(
                out,
                "         behind: the proxy's ledger misses events of this session; its client's next request records them"
            );
        }
        out
    }
}

/// The smallest input of the steps that reported usage: what stays in
/// every window whatever a cut removes (the system prompt, the tools, the
/// ask kept after the stub), as far as the steps show it; 0 when none did.
pub fn fixed_part(steps: &[StepRecord]) -> u64 {
    steps
        .iter()
        .map(|s| s.usage.input_total())
        .filter(|&n| n > 0)
        .min()
        .unwrap_or(0)
}

/// When the part of every request no cut can remove (`fixed`, see
/// [`fixed_part`]) is over half the `line`: the warning `status`, `run` and
/// the log give, with a line that would leave room (twice the fixed part,
/// in steps of 5k).
pub fn fixed_part_note(fixed: u64, line: u64) -> Option<String> {
    if fixed == 0 || line == 0 || fixed * 2 <= line {
        return None;
    }
    let room = (fixed * 2).div_ceil(5_000) * 5_000;
    Some(format!(
        "{} of every request (system prompt, tools, the ask) stays whatever is cut: over half the {} line, so the window stays near the line and cuts come every few steps; a line of {} or more leaves room (--tideline {})",
        tokens(fixed),
        tokens(line),
        tokens(room),
        tokens(room)
    ))
}

/// `1 turn`, `3 turns`: a count and its noun, plural unless one.
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `950`, `12.3k`, `1.0M`.
pub fn tokens(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 10_000 {
        format!("{}k", (n as f64 / 1e3).round() as u64)
    } else if n >= 1_000 {
        format!("{:.1}k", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::{AppliedEdit, StepDetail, Usage};

    fn step(n: u32, usage: Usage, detail: StepDetail) -> StepRecord {
        StepRecord {
            step: n,
            model: "m".into(),
            status: 200,
            usage,
            window_rows: 3,
            ts_ms: 0,
            error: None,
            detail,
        }
    }

    fn cached(read: u64, write: u64) -> Usage {
        Usage {
            input: 10,
            output: 500,
            cache_read: read,
            cache_write: write,
        }
    }

    fn note(miss: Option<crate::cache::MissCause>, tokens: u64, free: bool) -> StepDetail {
        StepDetail {
            cache: Some(crate::cache::CacheNote {
                miss,
                miss_tokens: tokens,
                free_cut: free,
                cold: free.then_some(crate::cache::Cold::TtlExpired),
                changed: None,
                provider: None,
            }),
            ..StepDetail::default()
        }
    }

    #[test]
    fn misses_free_cuts_and_the_unmanaged_estimate() {
        use crate::cache::MissCause;
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        };
        // 70k, 75k, a free cut to 25k (the gauge said 80k), 27k, then the
        // client changed its tools: 28k written again.
        let mut steps = vec![
            step(1, cached(0, 70_000), StepDetail::default()),
            step(2, cached(70_000, 5_000), StepDetail::default()),
            step(
                3,
                cached(2_000, 23_000),
                note(Some(MissCause::Cut), 23_000, true),
            ),
            step(4, cached(25_000, 2_000), StepDetail::default()),
            step(
                5,
                cached(0, 28_000),
                note(Some(MissCause::ClientChanged), 27_000, false),
            ),
        ];
        for (i, s) in steps.iter_mut().enumerate() {
            s.ts_ms = (i as i64 + 1) * 1_000;
        }
        if let Some(c) = steps[4].detail.cache.as_mut() {
            c.changed = Some("tools".into());
        }
        let cuts = [CutRecord {
            upto_seq: 6,
            gauge: 80_010,
            line: 80_000,
            ts_ms: 2_500,
        }];
        let c = CacheSummary::of(&steps, &cuts, &|_| Some(price));
        assert_eq!(c.free_cuts, 1);
        assert_eq!(
            c.misses,
            vec![
                MissTotal {
                    cause: "cut".into(),
                    steps: 1,
                    tokens: 23_000
                },
                MissTotal {
                    cause: "client_changed".into(),
                    steps: 1,
                    tokens: 27_000
                },
            ]
        );
        let last = c.last_miss.clone().expect("a last miss");
        assert_eq!((last.step, last.changed.as_deref()), (5, Some("tools")));
        assert_eq!(last.cold, None);
        // Up to step 3 the last miss is the free cut: it says the cache
        // was cold already.
        let meta = crate::test_support::meta("s", "anthropic-sdk");
        let st = Status::new(
            &meta,
            &steps[..3],
            &cuts,
            1,
            3,
            80_000,
            "40%".into(),
            Some(200_000),
            &|_| Some(price),
        );
        assert_eq!(
            st.cache.last_miss.as_ref().and_then(|l| l.cold.as_deref()),
            Some("ttl_expired")
        );
        let text = st.render();
        assert!(
            text.contains("last miss: step 3 · cut at a cold cache (ttl_expired) · "),
            "{text}"
        );
        // Unmanaged: 55k more from step 3 on. Step 3 found the cache cold
        // (the TTL past): unmanaged it writes its whole 80k prompt too. The
        // client's own miss is paid on the larger prompt.
        let u = unmanaged(&steps, &cuts, &|_| Some(price)).expect("priced");
        let (real, _) = totals(&steps, &|_| Some(price));
        assert!(
            u.cost_usd > real.cost_usd,
            "{} vs {}",
            u.cost_usd,
            real.cost_usd
        );
        assert_eq!(u.usage.input_total(), real.input_total() + 3 * 55_000);
        assert_eq!(
            u.usage.cache_write,
            70_000 + 4_990 + 78_000 + 1_990 + 83_000
        );
        assert_eq!(unmanaged(&steps, &cuts, &|_| None), None);
        // Flagged cold but nothing missed (the cache was warm after all):
        // unmanaged it reads the whole previous prompt, as before.
        let mut warm = steps.clone();
        warm[3].detail = note(None, 0, false);
        if let Some(c) = warm[3].detail.cache.as_mut() {
            c.cold = Some(crate::cache::Cold::Resumed);
        }
        let w = unmanaged(&warm, &cuts, &|_| Some(price)).expect("priced");
        assert_eq!(w.usage.cache_write, u.usage.cache_write);
    }

    #[test]
    fn billed_beyond_the_window_is_in_tokens_and_spend_not_in_the_window() {
        let window = Usage {
            input: 23_000,
            output: 1_000,
            ..Usage::default()
        };
        let compaction = StepDetail {
            extra: Usage {
                input: 180_000,
                output: 3_500,
                ..Usage::default()
            },
            compactions: 1,
            edits: vec![AppliedEdit {
                kind: "clear_tool_uses_20250919".into(),
                cleared_input_tokens: 50_000,
                cleared_tool_uses: Some(8),
                cleared_thinking_turns: None,
            }],
            ..StepDetail::default()
        };
        let steps = [step(1, window, compaction)];
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        };
        let (t, _) = totals(&steps, &|_| Some(price));
        assert_eq!((t.input, t.output), (203_000, 4_500));
        assert_eq!(t.beyond_window, 183_500);
        let want = price.cost_usd(203_000, 4_500, 0, 0);
        assert!((t.cost_usd - want).abs() < 1e-9, "{} vs {want}", t.cost_usd);
        let meta = crate::test_support::meta("s", "anthropic-sdk");
        let st = Status::new(
            &meta,
            &steps,
            &[],
            1,
            3,
            80_000,
            "40%".into(),
            Some(200_000),
            &|_| Some(price),
        );
        assert_eq!(st.window, 24_000, "the window is the step's own usage");
        let text = st.render();
        assert!(
            text.contains("1 compaction by the provider · 184k billed beyond the window"),
            "{text}"
        );
        assert!(
            text.contains("edits    clear_tool_uses_20250919 ×1 (8 tool uses, 50k tokens cleared)"),
            "{text}"
        );
    }

    #[test]
    fn failed_steps_are_counted_and_the_latest_shown() {
        let ok = step(1, Usage::default(), StepDetail::default());
        let failed = |n: u32, status: u16, error: &str| StepRecord {
            status,
            error: Some(error.into()),
            ts_ms: i64::from(n),
            ..step(n, Usage::default(), StepDetail::default())
        };
        let steps = [
            ok,
            failed(2, 502, "upstream_unreachable"),
            failed(3, 504, "upstream_timeout"),
        ];
        let (t, _) = totals(&steps, &|_| None);
        assert_eq!((t.steps, t.failed_steps), (3, 2));
        let latest = FailedStep::latest(&steps).expect("failed");
        assert_eq!(latest.label(), "step 3: 504 upstream_timeout");
        let meta = crate::test_support::meta("s", "c");
        let text = Status::new(
            &meta,
            &steps,
            &[],
            1,
            1,
            20_000,
            "20k".into(),
            None,
            &|_| None,
        )
        .render();
        assert!(
            text.contains(
                "failed   2 steps without a whole answer · latest step 3: 504 upstream_timeout"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_meter_shows_spend_against_its_cap_and_a_limits_row() {
        let usage = Usage {
            input: 1_000,
            output: 500,
            cache_read: 100_000,
            cache_write: 10_000,
        };
        let steps = [
            step(1, usage, StepDetail::default()),
            step(2, usage, StepDetail::default()),
        ];
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        };
        let meta = crate::test_support::meta("s", "claude-code");
        let mut st = Status::new(
            &meta,
            &steps,
            &[],
            1,
            4,
            80_000,
            "40%".into(),
            None,
            &|_| Some(price),
        );
        // Cache reads and writes at their own prices: 2 × (0.003 + 0.0075 + 0.03 + 0.0375).
        assert!(
            (st.totals.cost_usd - 0.156).abs() < 1e-9,
            "{}",
            st.totals.cost_usd
        );
        let plain = st.render();
        assert!(
            plain.contains("spend    $0.1560 at list price\n"),
            "{plain}"
        );
        assert!(!plain.contains("limits"), "{plain}");
        st.limits = Some(Limits {
            spend_cap_usd: Some(2.0),
            steps: 2,
            steps_cap: Some(50),
            elapsed_ms: 192_000,
            time_cap_ms: Some(1_800_000),
            from: "the config".into(),
            ..Limits::default()
        });
        let text = st.render();
        assert!(
            text.contains("spend    $0.1560 / $2.00 at list price\n"),
            "{text}"
        );
        assert!(
            text.contains("limits   steps 2 / 50 · elapsed 3m12s / 30m (the config)\n"),
            "{text}"
        );
        // Spend alone: no limits row; a stop is said.
        st.limits = Some(Limits {
            spend_cap_usd: Some(0.1),
            spent_usd: Some(0.156),
            steps: 2,
            stopped: Some("session s reached its spend limit: $0.1560 spent of $0.1000".into()),
            from: "the run proxy".into(),
            ..Limits::default()
        });
        let text = st.render();
        assert!(
            text.contains("spend    $0.1560 / $0.1000 at list price\n"),
            "{text}"
        );
        assert!(
            text.contains("limits   stopped: session s reached its spend limit: $0.1560 spent of $0.1000; the proxy refuses its further requests\n"),
            "{text}"
        );
        assert_eq!(duration(5_400_000), "1h30m");
    }

    #[test]
    fn token_units() {
        assert_eq!(tokens(950), "950");
        assert_eq!(tokens(12_345), "12k");
        assert_eq!(tokens(1_500), "1.5k");
        assert_eq!(tokens(1_000_000), "1.0M");
    }
}
