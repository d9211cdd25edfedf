//! The viewer's pages, rendered from what the ledger's read side returned
//! ([`super::session_data`] and the routes in [`super`]). Pure: every string from a session goes through
//! [`Html::text`] or an escaped attribute.

use super::chart;
use super::html::{qv, seg, session_url, ui_url, Html};
use super::seen::{self, Seen, Source};
use crate::sessions::{ModelView, Sent};
use oceancode_ledger::parts::{parts, Part};
use oceancode_ledger::recall::RecallHit;
use oceancode_ledger::status::tokens;
use oceancode_ledger::store::{
    ContextEditRecord, CutRecord, LineRecord, SessionSummary, StepRecord,
};
use oceancode_ledger::transcript::utc_iso;
use oceancode_window::{Dialect, Row, SessionMeta};
use std::collections::HashSet;

/// Rows on one page of the conversation.
pub const PAGE_ROWS: usize = 200;
/// Lines of `SESSION.md` shown open; a longer page is folded.
const FOLD_LINES: usize = 80;
/// Cuts listed open; more are folded.
const FOLD_CUTS: usize = 12;
/// Characters of one text part shown before the rest is folded away.
const TEXT_CLIP: usize = 4000;

/// The document around a page's body.
pub fn layout(title: &str, body: Html, live: Option<(&str, &str)>) -> String {
    let mut h = Html::new();
    h.raw("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
        .raw("<meta name=\"referrer\" content=\"no-referrer\">")
        .el("title", &[], &format!("{title} · oceancode"))
        .void(
            "link",
            &[("rel", "stylesheet"), ("href", &ui_url("assets/ui.css"))],
        )
        .open("script", &[("src", &ui_url("assets/ui.js")), ("defer", "")])
        .close("script")
        .raw("</head>");
    match live {
        Some((url, stamp)) => h.open("body", &[("data-live", url), ("data-stamp", stamp)]),
        None => h.open("body", &[]),
    };
    h.raw("<header class=\"top\">")
        .open("a", &[("href", &ui_url("")), ("class", "brand")])
        .raw("oceancode")
        .close("a");
    search_form(&mut h, "");
    h.raw("</header><main>");
    h.append(body);
    h.raw("</main></body></html>");
    h.finish()
}

fn search_form(h: &mut Html, q: &str) {
    h.open(
        "form",
        &[
            ("class", "search"),
            ("action", &ui_url("search")),
            ("method", "get"),
        ],
    )
    .void(
        "input",
        &[
            ("type", "search"),
            ("name", "q"),
            ("value", q),
            ("placeholder", "search every session"),
            ("aria-label", "search"),
        ],
    )
    .raw("<button type=\"submit\">search</button></form>");
}

fn when(ms: i64) -> String {
    if ms <= 0 {
        return "—".into();
    }
    utc_iso(ms)
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_string()
        + " UTC"
}

fn money(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("${v:.2}"),
        None => "—".into(),
    }
}

/// One line of the sessions page.
#[derive(Clone, Debug)]
pub struct SessionLine {
    /// What the ledger lists.
    pub summary: SessionSummary,
    /// Steps recorded.
    pub steps: u32,
    /// Cuts recorded.
    pub cuts: usize,
    /// Spend of the priced steps (None: no step was priced).
    pub spend: Option<f64>,
    /// Sessions linked to this one (sub-agents, siblings).
    pub children: Vec<String>,
}

/// How the sessions page is sorted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// Most recent activity first.
    Last,
    /// Most rows first.
    Rows,
    /// Most turns first.
    Turns,
    /// Most spend first.
    Spend,
    /// Most cuts first.
    Cuts,
    /// By client, then most recent.
    Client,
    /// By model, then most recent.
    Model,
}

impl Sort {
    /// From the `sort` query value (unknown: [`Sort::Last`]).
    pub fn parse(s: &str) -> Sort {
        match s {
            "rows" => Sort::Rows,
            "turns" => Sort::Turns,
            "spend" => Sort::Spend,
            "cuts" => Sort::Cuts,
            "client" => Sort::Client,
            "model" => Sort::Model,
            _ => Sort::Last,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Sort::Last => "last",
            Sort::Rows => "rows",
            Sort::Turns => "turns",
            Sort::Spend => "spend",
            Sort::Cuts => "cuts",
            Sort::Client => "client",
            Sort::Model => "model",
        }
    }
}

/// Sort and filter the sessions page's lines (`filter`: a substring of the
/// id, the name the user gave, the client or the model, any case).
pub fn arrange(mut lines: Vec<SessionLine>, sort: Sort, filter: &str) -> Vec<SessionLine> {
    let f = filter.trim().to_lowercase();
    if !f.is_empty() {
        lines.retain(|l| {
            let s = &l.summary;
            [
                Some(&s.id),
                s.name.as_ref(),
                Some(&s.client),
                Some(&s.model),
            ]
            .iter()
            .flatten()
            .any(|v| v.to_lowercase().contains(&f))
        });
    }
    let last = |l: &SessionLine| std::cmp::Reverse(l.summary.last_ms);
    match sort {
        Sort::Last => lines.sort_by_key(last),
        Sort::Rows => lines.sort_by_key(|l| (std::cmp::Reverse(l.summary.rows), last(l))),
        Sort::Turns => lines.sort_by_key(|l| (std::cmp::Reverse(l.summary.turns), last(l))),
        Sort::Cuts => lines.sort_by_key(|l| (std::cmp::Reverse(l.cuts), last(l))),
        Sort::Client => lines.sort_by(|a, b| {
            a.summary
                .client
                .cmp(&b.summary.client)
                .then(last(a).cmp(&last(b)))
        }),
        Sort::Model => lines.sort_by(|a, b| {
            a.summary
                .model
                .cmp(&b.summary.model)
                .then(last(a).cmp(&last(b)))
        }),
        Sort::Spend => lines.sort_by(|a, b| {
            b.spend
                .unwrap_or(0.0)
                .total_cmp(&a.spend.unwrap_or(0.0))
                .then(last(a).cmp(&last(b)))
        }),
    }
    lines
}

/// The sessions page.
pub fn sessions_page(lines: &[SessionLine], sort: Sort, filter: &str, total: usize) -> String {
    let mut h = Html::new();
    h.raw("<h1>Sessions</h1>");
    h.open(
        "form",
        &[
            ("class", "filter"),
            ("action", &ui_url("")),
            ("method", "get"),
        ],
    )
    .void(
        "input",
        &[
            ("type", "text"),
            ("name", "filter"),
            ("value", filter),
            ("placeholder", "filter by id, name, client or model"),
            ("aria-label", "filter"),
        ],
    )
    .void(
        "input",
        &[("type", "hidden"), ("name", "sort"), ("value", sort.key())],
    )
    .raw("<button type=\"submit\">filter</button></form>");
    h.open("p", &[("class", "muted")])
        .text(&format!("{} of {} sessions", lines.len(), total))
        .close("p");
    if lines.is_empty() {
        h.el(
            "p",
            &[("class", "empty")],
            "No session recorded yet: point a client at this proxy.",
        );
        return layout("Sessions", h, None);
    }
    h.raw("<div class=\"scroll\"><table class=\"sessions\" id=\"sessions\"><thead><tr>");
    let col = |h: &mut Html, label: &str, key: Option<Sort>| match key {
        Some(k) => {
            let href = format!("{}?sort={}&filter={}", ui_url(""), k.key(), qv(filter));
            let class = if k == sort { "sorted" } else { "" };
            h.open("th", &[("class", class)])
                .link(&href, label)
                .close("th");
        }
        None => {
            h.el("th", &[], label);
        }
    };
    col(&mut h, "session", None);
    col(&mut h, "client", Some(Sort::Client));
    col(&mut h, "model", Some(Sort::Model));
    col(&mut h, "turns", Some(Sort::Turns));
    col(&mut h, "rows", Some(Sort::Rows));
    col(&mut h, "cuts", Some(Sort::Cuts));
    col(&mut h, "spend", Some(Sort::Spend));
    col(&mut h, "last activity", Some(Sort::Last));
    col(&mut h, "linked", None);
    h.raw("</tr></thead><tbody>");
    for l in lines {
        let s = &l.summary;
        h.open("tr", &[("data-session", &s.id)]);
        h.open("td", &[]).link(&session_url(&s.id), &s.id);
        if let Some(n) = &s.name {
            h.raw(" ").el("span", &[("class", "name")], n);
        }
        h.close("td");
        h.el("td", &[], &s.client);
        h.el("td", &[], &s.model);
        h.el("td", &[("class", "n")], &s.turns.to_string());
        h.el("td", &[("class", "n")], &s.rows.to_string());
        h.el("td", &[("class", "n")], &l.cuts.to_string());
        h.el("td", &[("class", "n")], &money(l.spend));
        h.el("td", &[], &when(s.last_ms));
        h.open("td", &[("class", "links")]);
        if let Some(p) = &s.parent {
            h.raw("↑ ").link(&session_url(p), p);
            if let Some(at) = s.parent_seq {
                h.text(&format!(" @seq {at}"));
            }
        }
        for c in &l.children {
            h.raw(" ↳ ").link(&session_url(c), c);
        }
        h.close("td");
        h.close("tr");
    }
    h.raw("</tbody></table></div>");
    layout("Sessions", h, None)
}

/// The search page: every session's rows holding every word.
pub fn search_page(q: &str, hits: &[RecallHit], limit: usize) -> String {
    let mut h = Html::new();
    h.raw("<h1>Search</h1>");
    search_form(&mut h, q);
    if q.trim().is_empty() {
        h.el(
            "p",
            &[("class", "muted")],
            "Type words to find: every word must appear in the row.",
        );
        return layout("Search", h, None);
    }
    let more = if hits.len() >= limit { "+" } else { "" };
    h.open("p", &[("class", "muted")])
        .text(&format!(
            "{}{more} rows hold every word of “{q}”",
            hits.len()
        ))
        .close("p");
    h.raw("<ol class=\"hits\" id=\"hits\">");
    for hit in hits {
        let href = format!(
            "{}?seq={}#r-{}",
            session_url(&hit.session),
            hit.seq,
            hit.seq
        );
        h.raw("<li>")
            .open("a", &[("href", &href), ("class", "hit")])
            .text(&format!(
                "{} · seq {} · t{:02} · {}",
                hit.session, hit.seq, hit.turn, hit.role
            ))
            .close("a");
        if hit.hidden {
            h.raw(" <span class=\"badge\">hidden by a rewind</span>");
        }
        h.open("div", &[("class", "snippet")]);
        for (hit, text) in highlight(&hit.body, q) {
            if hit {
                h.el("mark", &[], text);
            } else {
                h.text(text);
            }
        }
        h.close("div");
        h.raw("</li>");
    }
    h.raw("</ol>");
    layout("Search", h, None)
}

/// The search's snippet (`[word]` marks what the index matched) as runs of
/// text, `true` for a matched word of `q` (its brackets dropped); a
/// bracket the row itself holds stays text.
pub fn highlight<'a>(snippet: &'a str, q: &str) -> Vec<(bool, &'a str)> {
    let words: Vec<String> = q
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut out = Vec::new();
    let mut from = 0;
    let mut at = 0;
    while let Some(open) = snippet[at..].find('[').map(|i| at + i) {
        let Some(close) = snippet[open + 1..].find(']').map(|i| open + 1 + i) else {
            break;
        };
        let inner = &snippet[open + 1..close];
        // The index marks a phrase whole (`[zephyrword_case]`): every word
        // in the brackets must be one of the query's.
        let mut inner_words = inner
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .peekable();
        let matched = inner_words.peek().is_some()
            && !inner.contains('[')
            && inner_words.all(|w| words.contains(&w.to_lowercase()));
        if !matched {
            at = open + 1;
            continue;
        }
        if open > from {
            out.push((false, &snippet[from..open]));
        }
        out.push((true, inner));
        from = close + 1;
        at = from;
    }
    if from < snippet.len() {
        out.push((false, &snippet[from..]));
    }
    out
}

/// Which conversation a session page shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Every row, what left the window dimmed.
    Full,
    /// What the latest request sent.
    Model,
}

/// Everything a session page shows.
pub struct SessionData {
    /// The ledger's line for it.
    pub summary: SessionSummary,
    /// Its facts.
    pub meta: SessionMeta,
    /// Every row (hidden ones included) with its hidden flag, in seq order.
    pub rows: Vec<(Row, bool)>,
    /// Its steps.
    pub steps: Vec<StepRecord>,
    /// Its cuts.
    pub cuts: Vec<CutRecord>,
    /// The line it last ran with.
    pub line: Option<LineRecord>,
    /// The latest cut's window rebuilt from the rows (for a step recorded
    /// before the proxy kept what each step sent).
    pub view: ModelView,
    /// The session's taken context edits.
    pub edits: Vec<ContextEditRecord>,
    /// `SESSION.md`, if written.
    pub page_md: Option<String>,
    /// Sessions linked to it.
    pub children: Vec<String>,
    /// A running proxy holds it in memory.
    pub live: bool,
}

impl SessionData {
    fn row(&self, seq: u64) -> Option<&(Row, bool)> {
        let i = usize::try_from(seq.checked_sub(1)?).ok()?;
        match self.rows.get(i) {
            Some(r) if r.0.seq == seq => Some(r),
            _ => self
                .rows
                .binary_search_by_key(&seq, |(r, _)| r.seq)
                .ok()
                .map(|i| &self.rows[i]),
        }
    }
}

/// The query of a session page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageQuery {
    /// Which conversation.
    pub view: View,
    /// 0-based page (None: the last, or the one holding `seq`).
    pub page: Option<usize>,
    /// A row to show (its page is chosen).
    pub seq: Option<u64>,
    /// The step the model view shows (None: the latest).
    pub step: Option<u32>,
}

/// The live-update stamp: changes when a step, row or cut is recorded.
pub fn stamp(rows: u64, last_ms: i64, steps: usize, cuts: usize) -> String {
    format!("{rows}.{last_ms}.{steps}.{cuts}")
}

/// The session page.
pub fn session_page(
    d: &SessionData,
    q: PageQuery,
    price: &dyn Fn(&str) -> Option<oceancode_config::Price>,
) -> String {
    let id = &d.meta.id;
    let base = session_url(id);
    let mut h = Html::new();
    h.open("h1", &[])
        .raw("Session ")
        .el("code", &[], id)
        .close("h1");
    summary(&mut h, d, price);
    // The chart.
    let points = chart::points(&d.steps, price);
    let w = Windows::of(d, q);
    let markers: Vec<chart::Marker> = d
        .cuts
        .iter()
        .map(|c| {
            let at = cut_step(d, c);
            let recorded = d
                .steps
                .get(at)
                .and_then(|s| s.detail.sent.as_ref())
                .is_some_and(|w| w.upto >= c.upto_seq);
            let latest = d.cuts.last().map(|l| l.ts_ms) == Some(c.ts_ms);
            let href = match d.steps.get(at) {
                Some(s) if recorded => format!("{base}?view=model&step={}#stub", s.step),
                _ if latest && d.view.stub.is_some() => format!("{base}?view=model#stub"),
                _ => format!("{base}?seq={}#r-{}", c.upto_seq, c.upto_seq),
            };
            chart::Marker {
                at,
                href,
                cut: c.clone(),
            }
        })
        .collect();
    let line = d
        .line
        .as_ref()
        .map(|l| l.line)
        .or(d.cuts.last().map(|c| c.line));
    h.raw("<section class=\"card\"><h2>Context</h2>");
    h.append(chart::render(&points, &markers, line));
    h.raw("</section>");
    // The conversation.
    conversation(&mut h, d, q, &base, &w);
    // Cuts, SESSION.md, exports.
    cuts_table(&mut h, d, &base);
    h.raw("<section class=\"card\" id=\"page\"><h2>SESSION.md</h2>");
    match &d.page_md {
        // A long page (a long session's) is folded: it would push the
        // exports far below.
        Some(md) if md.lines().count() > FOLD_LINES => {
            h.open("details", &[("class", "fold")]).el(
                "summary",
                &[],
                &format!("{} lines · open", md.lines().count()),
            );
            markdown(&mut h, md);
            h.close("details");
        }
        Some(md) => markdown(&mut h, md),
        None => {
            h.el("p", &[("class", "muted")], "Not written yet.");
        }
    }
    h.raw("</section>");
    h.raw("<section class=\"card\" id=\"exports\"><h2>Exports</h2><p>");
    h.open(
        "a",
        &[
            ("href", &format!("{base}/export.md")),
            ("download", &format!("{}.md", seg(id))),
        ],
    )
    .raw("Markdown (export --md)")
    .close("a")
    .raw(" · ")
    .open(
        "a",
        &[
            ("href", &format!("{base}/export.atif.json")),
            ("download", &format!("{}.atif.json", seg(id))),
        ],
    )
    .raw("ATIF trajectory (export --atif)")
    .close("a")
    .raw("</p></section>");
    let live_url = format!("{base}/live");
    let st = stamp(
        d.summary.rows,
        d.summary.last_ms,
        d.steps.len(),
        d.cuts.len(),
    );
    layout(&format!("Session {id}"), h, Some((&live_url, &st)))
}

/// The index of the step that made cut `c`: the first whose record says
/// it sent a window past it, else the first recorded at or after it.
fn cut_step(d: &SessionData, c: &CutRecord) -> usize {
    d.steps
        .iter()
        .position(|s| s.detail.sent.as_ref().is_some_and(|w| w.upto >= c.upto_seq))
        .unwrap_or_else(|| {
            let ts: Vec<i64> = d.steps.iter().map(|s| s.ts_ms).collect();
            chart::cut_step_index(&ts, c)
        })
}

fn summary(h: &mut Html, d: &SessionData, price: &dyn Fn(&str) -> Option<oceancode_config::Price>) {
    let (totals, _) = oceancode_ledger::status::totals(&d.steps, price);
    let window = d
        .steps
        .iter()
        .rev()
        .find(|s| !s.usage.is_zero())
        .map(|s| s.usage.window_total())
        .unwrap_or(0);
    let m = &d.meta;
    h.raw("<section class=\"card\" id=\"summary\"><dl class=\"facts\">");
    let fact = |h: &mut Html, k: &str, v: &str| {
        h.el("dt", &[], k).el("dd", &[], v);
    };
    fact(h, "client", &m.client);
    fact(h, "model", &m.model);
    fact(h, "dialect", m.dialect.as_str());
    if let Some(cs) = &m.client_session {
        fact(h, "client session", cs);
    }
    fact(h, "turns", &d.summary.turns.to_string());
    fact(
        h,
        "rows",
        &format!("{} on the line, {} recorded", d.summary.rows, d.rows.len()),
    );
    fact(h, "steps", &d.steps.len().to_string());
    if let Some((s, why)) = d.steps.iter().rev().find_map(|s| {
        Some((
            s,
            s.error
                .as_deref()?
                .strip_prefix(oceancode_ledger::status::STOPPED)?,
        ))
    }) {
        fact(
            h,
            "stopped",
            &format!(
                "{why} · the request after step {} was refused",
                s.step.saturating_sub(1)
            ),
        );
    }
    let cache = oceancode_ledger::status::CacheSummary::of(&d.steps, &d.cuts, price);
    if cache.free_cuts > 0 {
        fact(
            h,
            "cuts",
            &format!(
                "{} ({} free: the prompt cache was already cold)",
                d.cuts.len(),
                cache.free_cuts
            ),
        );
    } else {
        fact(h, "cuts", &d.cuts.len().to_string());
    }
    if let Some(l) = &cache.last_miss {
        let by: Vec<String> = cache
            .misses
            .iter()
            .map(|m| format!("{} {}", m.cause, m.steps))
            .collect();
        let last = format!("step {} · {}", l.step, l.why());
        fact(
            h,
            "cache misses",
            &format!(
                "{} · last: {last}, {} sent again",
                by.join(" · "),
                tokens(l.tokens)
            ),
        );
    }
    fact(h, "window now", &tokens(window));
    if let Some(l) = &d.line {
        let line = tokens(l.line);
        if l.spec == line {
            fact(h, "line", &line);
        } else {
            fact(h, "line", &format!("{line} ({})", l.spec));
        }
    }
    fact(
        h,
        "tokens",
        &format!(
            "{} in ({} cache read, {} cache write) · {} out · cache hit {:.0}%",
            tokens(totals.input_total()),
            tokens(totals.cache_read),
            tokens(totals.cache_write),
            tokens(totals.output),
            totals.cache_hit_ratio() * 100.0
        ),
    );
    let spend = if totals.unpriced.is_empty() {
        money(Some(totals.cost_usd))
    } else {
        format!(
            "{} (no price for {})",
            money(Some(totals.cost_usd)),
            totals.unpriced.join(", ")
        )
    };
    fact(h, "spend", &spend);
    if let (Some(u), true) = (cache.unmanaged_usd, totals.unpriced.is_empty()) {
        fact(
            h,
            "unmanaged (estimate)",
            &format!(
                "{} for the same requests with no cuts and the client's own cache pattern",
                money(Some(u))
            ),
        );
    }
    fact(h, "created", &when(m.created_ms));
    fact(h, "last activity", &when(m.last_ms));
    h.raw("</dl>");
    if let Some(p) = &m.parent {
        h.raw("<p>Linked to ").link(&session_url(p), p);
        if let Some(at) = m.parent_seq {
            h.text(&format!(" (diverged after its seq {at})"));
        }
        h.raw("</p>");
    }
    if !d.children.is_empty() {
        h.raw("<p>Sub-agents and siblings:");
        for c in &d.children {
            h.raw(" ").link(&session_url(c), c);
        }
        h.raw("</p>");
    }
    if d.live {
        h.raw("<p class=\"live-note\"><span class=\"dot\"></span>held by this proxy: the page follows new steps</p>");
    }
    h.raw("</section>");
}

/// What the model saw on the steps a session page shows.
struct Windows {
    /// The latest step's (None: recorded before the proxy kept it).
    latest: Option<Seen>,
    /// The chosen step's (the model view).
    chosen: Option<Seen>,
    /// The chosen step's number (None: no step yet).
    step: Option<u32>,
    /// The chosen step is the latest.
    is_latest: bool,
}

impl Windows {
    fn of(d: &SessionData, q: PageQuery) -> Windows {
        let latest_step = d.steps.last().map(|s| s.step);
        let step = q
            .step
            .filter(|n| d.steps.iter().any(|s| s.step == *n))
            .or(latest_step);
        let row = |s: u64| d.row(s).map(|r| &r.0);
        let dialect = d.meta.dialect;
        let latest = latest_step.and_then(|n| seen::seen(dialect, &d.steps, n, row, &d.edits));
        let is_latest = step == latest_step;
        let chosen = if is_latest {
            latest.clone()
        } else {
            step.and_then(|n| seen::seen(dialect, &d.steps, n, row, &d.edits))
        };
        Windows {
            latest,
            chosen,
            step,
            is_latest,
        }
    }
}

fn conversation(h: &mut Html, d: &SessionData, q: PageQuery, base: &str, w: &Windows) {
    let (sent, upto): (HashSet<u64>, u64) = match &w.latest {
        Some(s) => (s.row_seqs().collect(), s.upto),
        None => (
            d.view
                .sent
                .iter()
                .filter_map(|s| match s {
                    Sent::Row(seq) => Some(*seq),
                    Sent::Stub => None,
                })
                .collect(),
            d.view.upto,
        ),
    };
    let deleted: HashSet<u64> = w
        .latest
        .as_ref()
        .and_then(|s| s.edit.as_ref())
        .map(|e| e.deleted.iter().copied().collect())
        .unwrap_or_default();
    let active: HashSet<u64> = d.view.active.iter().copied().collect();
    let view_key = match q.view {
        View::Full => "full",
        View::Model => "model",
    };
    h.open(
        "section",
        &[
            ("class", "card"),
            ("id", "conversation"),
            ("data-view", view_key),
        ],
    );
    h.raw("<h2>Conversation</h2><nav class=\"toggle\" id=\"toggle\">");
    for (v, label, key) in [
        (View::Full, "full transcript", "full"),
        (View::Model, "model view", "model"),
    ] {
        let class = if v == q.view { "on" } else { "" };
        h.open(
            "a",
            &[
                ("href", &format!("{base}?view={key}")),
                ("class", class),
                ("data-view", key),
            ],
        )
        .text(label)
        .close("a");
        if v == View::Full {
            h.raw(" | ");
        }
    }
    h.raw("</nav>");
    let seen = match q.view {
        View::Model => w.chosen.as_ref(),
        View::Full => None,
    };
    let total = match (q.view, seen) {
        (View::Full, _) => d.rows.len(),
        (View::Model, Some(s)) => s.messages.len(),
        (View::Model, None) => d.view.sent.len(),
    };
    match q.view {
        View::Full => {
            let text = if upto > 0 {
                format!(
                    "Every recorded row. Dimmed: what the latest window left out (up to seq {upto}{}), and rows hidden by a rewind.",
                    if deleted.is_empty() { "" } else { ", and rows an edit leaves out" }
                )
            } else if !deleted.is_empty() {
                "Every recorded row. Dimmed: rows the edit in force leaves out, and rows hidden by a rewind.".to_string()
            } else {
                "Every recorded row; nothing is cut yet, so the model saw them all.".to_string()
            };
            h.el("p", &[("class", "muted")], &text);
        }
        View::Model => model_head(h, d, base, w, seen),
    }
    let pages = total.div_ceil(PAGE_ROWS).max(1);
    let page = match (q.page, q.seq) {
        (Some(p), _) => p.min(pages - 1),
        (None, Some(seq)) => {
            let idx = match (q.view, seen) {
                (View::Full, _) => d.rows.iter().position(|(r, _)| r.seq >= seq),
                (View::Model, Some(s)) => s.messages.iter().position(|m| {
                    matches!(m.source, Source::Row(x) | Source::Edited(x) | Source::Pruned(x) if x >= seq)
                }),
                (View::Model, None) => d
                    .view
                    .sent
                    .iter()
                    .position(|s| matches!(s, Sent::Row(x) if *x >= seq)),
            };
            idx.map(|i| i / PAGE_ROWS).unwrap_or(pages - 1)
        }
        (None, None) => pages - 1,
    };
    let step_q = match (q.view, w.step) {
        (View::Model, Some(n)) if !w.is_latest => format!("&step={n}"),
        _ => String::new(),
    };
    let nav = |h: &mut Html| {
        if pages <= 1 {
            return;
        }
        h.raw("<nav class=\"pager\">");
        let link = |h: &mut Html, p: usize, label: &str| {
            let href = format!("{base}?view={view_key}{step_q}&page={p}");
            h.link(&href, label);
        };
        if page > 0 {
            link(h, 0, "« first");
            h.raw(" ");
            link(h, page - 1, "‹ previous");
        }
        h.text(&format!(" page {} of {} ", page + 1, pages));
        if page + 1 < pages {
            link(h, page + 1, "next ›");
            h.raw(" ");
            link(h, pages - 1, "last »");
        }
        h.raw("</nav>");
    };
    nav(h);
    h.raw("<ol class=\"rows\" id=\"rows\">");
    let lo = page * PAGE_ROWS;
    let hi = (lo + PAGE_ROWS).min(total);
    match (q.view, seen) {
        (View::Full, _) => {
            for (r, hidden) in &d.rows[lo..hi] {
                let out = !sent.contains(&r.seq);
                let state = if *hidden || (!active.contains(&r.seq) && !r.from_response) {
                    Some("hidden by a rewind")
                } else if r.from_response && !active.contains(&r.seq) {
                    Some("answer not echoed yet")
                } else if deleted.contains(&r.seq) && r.seq > upto {
                    Some("left out by an edit")
                } else if out {
                    Some("left the window")
                } else {
                    None
                };
                let pending = r.from_response && !active.contains(&r.seq) && !*hidden;
                let open = q.seq == Some(r.seq);
                row(
                    h,
                    d.meta.dialect,
                    r,
                    (out && !pending) || *hidden,
                    state,
                    base,
                    open,
                );
            }
        }
        (View::Model, Some(s)) => {
            for m in &s.messages[lo..hi] {
                sent_message(h, d, base, s, m, q.seq);
            }
        }
        (View::Model, None) => {
            for s in &d.view.sent[lo..hi] {
                match s {
                    Sent::Stub => stub(h, d, base),
                    Sent::Row(seq) => {
                        if let Some((r, _)) = d.row(*seq) {
                            let pinned = *seq <= d.view.upto;
                            row(
                                h,
                                d.meta.dialect,
                                r,
                                false,
                                pinned.then_some("kept from before the cut"),
                                base,
                                q.seq == Some(*seq),
                            );
                        }
                    }
                }
            }
        }
    }
    h.raw("</ol>");
    nav(h);
    h.close("section");
}

/// The model view's heading: which step, what it sent, and the way to
/// another step.
fn model_head(h: &mut Html, d: &SessionData, base: &str, w: &Windows, seen: Option<&Seen>) {
    let Some(n) = w.step else {
        h.el("p", &[("class", "muted")], "No step recorded yet.");
        return;
    };
    let count = d.steps.len();
    let pos = d.steps.iter().position(|s| s.step == n).unwrap_or(0);
    h.open("div", &[("class", "stepnav"), ("id", "stepnav")]);
    let step_link = |h: &mut Html, i: usize, label: &str| {
        if let Some(s) = d.steps.get(i) {
            h.link(&format!("{base}?view=model&step={}", s.step), label);
        }
    };
    if pos > 0 {
        step_link(h, 0, "« first");
        h.raw(" ");
        step_link(h, pos - 1, "‹ step before");
        h.raw(" ");
    }
    h.open("strong", &[])
        .text(&format!("step {n} of {count}"))
        .close("strong");
    if pos + 1 < count {
        h.raw(" ");
        step_link(h, pos + 1, "step after ›");
        h.raw(" ");
        step_link(h, count - 1, "latest »");
    }
    if seen.is_some_and(|s| s.upto > 0) {
        h.raw(" · ");
        h.link(
            &format!("{base}?view=model&step={n}&page=0#stub"),
            "its stub",
        );
    }
    h.open(
        "form",
        &[("class", "stepform"), ("action", base), ("method", "get")],
    )
    .void(
        "input",
        &[("type", "hidden"), ("name", "view"), ("value", "model")],
    );
    let max = d.steps.last().map(|s| s.step).unwrap_or(1).to_string();
    let now = n.to_string();
    h.void(
        "input",
        &[
            ("type", "number"),
            ("name", "step"),
            ("min", "1"),
            ("max", &max),
            ("value", &now),
            ("aria-label", "step"),
        ],
    )
    .raw("<button type=\"submit\">show</button></form>");
    h.close("div");
    let text = match seen {
        Some(s) => {
            let mut t = format!(
                "What step {n} sent upstream, message by message: {} messages",
                s.messages.len()
            );
            if s.stateful {
                t.push_str(", the request's own (the provider holds the conversation)");
            }
            if s.upto > 0 {
                t.push_str(&format!(
                    "; every row up to seq {} had left the window, the stub (first) stands for them",
                    s.upto
                ));
            } else {
                t.push_str("; nothing was cut");
            }
            if let Some(e) = &s.edit {
                t.push_str(&format!(
                    "; context edit #{} in force ({} left out, {} rewritten, {})",
                    e.n,
                    oceancode_ledger::status::counted(e.deleted.len() as u64, "row"),
                    e.rewritten,
                    oceancode_ledger::status::counted(e.notes as u64, "note")
                ));
            }
            t.push('.');
            t
        }
        None if w.is_latest => format!(
            "Step {n} was recorded before the proxy kept what each step sent: this is the window of the latest cut rebuilt from the rows ({} messages{}).",
            d.view.sent.len(),
            if d.view.stub.is_some() { ", the stub first" } else { ", nothing cut" }
        ),
        None => format!(
            "Step {n} was recorded before the proxy kept what each step sent (or is not in the ledger): there is nothing to show for it."
        ),
    };
    h.el("p", &[("class", "muted")], &text);
}

/// One message of a step's window.
fn sent_message(
    h: &mut Html,
    d: &SessionData,
    base: &str,
    s: &Seen,
    m: &seen::Message,
    open_seq: Option<u64>,
) {
    let dialect = d.meta.dialect;
    let edit = s.edit.as_ref().map_or(0, |e| e.n);
    match (&m.source, &m.raw) {
        (Source::Row(seq), _) | (Source::Edited(seq), _) | (Source::Pruned(seq), _) => {
            let Some((r, hidden)) = d.row(*seq) else {
                message(
                    h,
                    dialect,
                    "missing",
                    &format!("seq {seq}"),
                    None,
                    "not in the ledger",
                    None,
                );
                return;
            };
            let pruned = matches!(m.source, Source::Pruned(_));
            let edited = matches!(m.source, Source::Edited(_)) || pruned;
            let badge = if pruned {
                Some("old tool output sent as a pointer (compress)".to_string())
            } else if edited {
                Some(format!("rewritten by edit #{edit}"))
            } else if *seq <= s.upto {
                Some("kept from before the cut".to_string())
            } else if *hidden {
                Some("later hidden by a rewind".to_string())
            } else {
                None
            };
            match (&m.raw, edited) {
                (Some(raw), true) => {
                    let mut r = r.clone();
                    r.raw = raw.as_str().into();
                    row_as(
                        h,
                        dialect,
                        &r,
                        if pruned { "pruned" } else { "edited" },
                        false,
                        badge.as_deref(),
                        base,
                        open_seq == Some(*seq),
                    );
                }
                (None, true) => {
                    message(
                        h,
                        dialect,
                        "missing",
                        &format!("seq {seq}"),
                        None,
                        "rewritten (an edit or compress) with bytes the ledger does not hold",
                        None,
                    );
                }
                _ => row_as(
                    h,
                    dialect,
                    r,
                    "row",
                    false,
                    badge.as_deref(),
                    base,
                    open_seq == Some(*seq),
                ),
            }
        }
        (Source::Stub, Some(raw)) => sent_stub(h, dialect, base, s.upto, raw),
        (Source::Stub, None) => {
            message(
                h,
                dialect,
                "stub",
                "stub",
                Some("stub"),
                "the stub this step sent is not in the ledger",
                None,
            );
        }
        (Source::Note(id), raw) => message(
            h,
            dialect,
            "note",
            &format!("note {id}"),
            None,
            &format!("a note of edit #{edit}"),
            raw.as_deref(),
        ),
        (Source::Recall(after), raw) => message(
            h,
            dialect,
            "recall",
            &format!("after seq {after}"),
            None,
            "the recall tool's exchange (the proxy's own)",
            raw.as_deref(),
        ),
        (Source::Tail, _) => message(
            h,
            dialect,
            "tail",
            "—",
            None,
            "a message past the recorded line",
            None,
        ),
    }
}

/// A message that is no recorded row: `label` heads it, `badge` says what
/// it is, `raw` (if held) is shown by its parts.
fn message(
    h: &mut Html,
    dialect: Dialect,
    src: &str,
    label: &str,
    id: Option<&str>,
    badge: &str,
    raw: Option<&str>,
) {
    let class = format!("row k-{src}");
    let mut attrs = vec![("class", class.as_str()), ("data-src", src)];
    if let Some(id) = id {
        attrs.push(("id", id));
    }
    h.open("li", &attrs);
    h.raw("<div class=\"head\">");
    h.el("span", &[("class", "seq")], label);
    h.raw(" ").el("span", &[("class", "badge")], badge);
    h.raw("</div>");
    match raw {
        Some(raw) => row_parts(h, dialect, raw, false),
        None => {
            h.el(
                "p",
                &[("class", "muted")],
                "(its content is not in the ledger)",
            );
        }
    }
    h.close("li");
}

/// The stub message a step sent: the stub's text, the state block after
/// it, and the standing parts kept with it.
fn sent_stub(h: &mut Html, dialect: Dialect, base: &str, upto: u64, raw: &str) {
    h.raw("<li class=\"row stub\" id=\"stub\" data-src=\"stub\"><div class=\"head\"><span class=\"role\">stub</span> ");
    h.text(&format!("the window starts after seq {upto}"));
    h.raw(" · ");
    h.link(
        &format!("{base}?view=full&seq={upto}#r-{upto}"),
        "see what left",
    );
    h.raw("</div>");
    let texts: Vec<String> = parts(dialect, raw)
        .into_iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t),
            _ => None,
        })
        .collect();
    for (i, t) in texts.iter().enumerate() {
        if i == 0 {
            let (stub, state) = match t.find(oceancode_ledger::state_block::HEAD) {
                Some(at) => (t[..at].trim_end(), Some(&t[at..])),
                None => (t.as_str(), None),
            };
            h.el("div", &[("class", "text")], stub);
            if let Some(state) = state {
                h.open("details", &[("class", "state"), ("open", "")])
                    .el(
                        "summary",
                        &[],
                        &format!("state block · {} lines", state.lines().count()),
                    )
                    .el("pre", &[], state)
                    .close("details");
            }
        } else {
            h.open("details", &[("class", "pinned")])
                .el("summary", &[], "kept with the stub: standing instructions")
                .el("pre", &[], t)
                .close("details");
        }
    }
    h.raw("</li>");
}

fn stub(h: &mut Html, d: &SessionData, base: &str) {
    h.raw(
        "<li class=\"row stub\" id=\"stub\"><div class=\"head\"><span class=\"role\">stub</span> ",
    );
    h.text(&format!("the window starts after seq {}", d.view.upto));
    h.raw(" · ");
    h.link(
        &format!("{base}?view=full&seq={}#r-{}", d.view.upto, d.view.upto),
        "see what left",
    );
    h.raw("</div>");
    if let Some(t) = &d.view.stub {
        h.el("div", &[("class", "text")], t);
    }
    for (seq, part) in &d.view.pinned_parts {
        let text = d
            .row(*seq)
            .and_then(|(r, _)| {
                crate::dialect::content_parts(&r.raw)?
                    .get(*part as usize)
                    .map(|p| part_text(p))
            })
            .unwrap_or_default();
        h.open("details", &[("class", "pinned")])
            .el(
                "summary",
                &[],
                &format!("kept with the stub: part {part} of seq {seq}"),
            )
            .el("pre", &[], &text)
            .close("details");
    }
    if d.view.at_compaction {
        h.el("p", &[("class", "muted")], "The window starts at a server-side compaction block: the provider drops what precedes it.");
    }
    h.raw("</li>");
}

/// The text of one content part (its `text` field, else its JSON).
fn part_text(raw: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(v) => v
            .get("text")
            .and_then(|t| t.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string()),
        Err(_) => raw.to_string(),
    }
}

/// One row; `open`: its folded parts (tool calls and results, thinking)
/// start open (the row a link points at).
fn row(
    h: &mut Html,
    dialect: Dialect,
    r: &Row,
    dim: bool,
    state: Option<&str>,
    base: &str,
    open: bool,
) {
    row_as(h, dialect, r, "row", dim, state, base, open);
}

/// One row, marked as coming from `src` (`row`, `edited`).
#[allow(clippy::too_many_arguments)]
fn row_as(
    h: &mut Html,
    dialect: Dialect,
    r: &Row,
    src: &str,
    dim: bool,
    state: Option<&str>,
    base: &str,
    open: bool,
) {
    let anchor = format!("r-{}", r.seq);
    let class = match (dim, r.kind.as_str()) {
        (true, k) => format!("row out k-{k}"),
        (false, k) => format!("row k-{k}"),
    };
    let seq = r.seq.to_string();
    h.open(
        "li",
        &[
            ("class", &class),
            ("id", &anchor),
            ("data-seq", &seq),
            ("data-src", src),
        ],
    );
    h.raw("<div class=\"head\">");
    h.open(
        "a",
        &[
            ("href", &format!("{base}?view=full&seq={}#{anchor}", r.seq)),
            ("class", "seq"),
        ],
    )
    .text(&format!("seq {}", r.seq))
    .close("a");
    h.text(&format!(" · t{:02} · step {} · ", r.turn, r.step));
    h.el("span", &[("class", "role")], &r.role);
    h.text(&format!(" · ~{} tokens", tokens(u64::from(r.tokens))));
    if let Some(s) = state {
        h.raw(" ").el("span", &[("class", "badge")], s);
    }
    h.raw("</div>");
    row_parts(h, dialect, &r.raw, open);
    h.close("li");
}

/// A message's parts: text, thinking, tool calls and results (folded
/// unless `open`), media.
fn row_parts(h: &mut Html, dialect: Dialect, raw: &str, open: bool) {
    let details = |h: &mut Html, class: &'static str| {
        if open {
            h.open("details", &[("class", class), ("open", "")]);
        } else {
            h.open("details", &[("class", class)]);
        }
    };
    for p in parts(dialect, raw) {
        match p {
            Part::Text(t) => clipped(h, "text", &t),
            Part::Thinking(t) => {
                details(h, "thinking");
                h.raw("<summary>thinking</summary>");
                h.el(
                    "div",
                    &[("class", "text")],
                    if t.is_empty() { "(encrypted)" } else { &t },
                );
                h.raw("</details>");
            }
            Part::ToolCall { id, name, input } => {
                let args = match &input {
                    serde_json::Value::String(s) => s.clone(),
                    v => serde_json::to_string_pretty(v).unwrap_or_default(),
                };
                details(h, "call");
                h.raw("<summary>");
                h.text(&format!("call {name}"));
                if let Some(id) = id {
                    h.raw(" ").el("span", &[("class", "muted")], &id);
                }
                h.raw("</summary>");
                h.el("pre", &[], &clip(&args, TEXT_CLIP * 4));
                h.raw("</details>");
            }
            Part::ToolResult { id, is_error, text } => {
                let lines = text.lines().count();
                let class = if is_error { "result error" } else { "result" };
                details(h, class);
                h.raw("<summary>");
                h.text(&format!(
                    "result{} · {lines} line{}",
                    if is_error { " (error)" } else { "" },
                    if lines == 1 { "" } else { "s" }
                ));
                if let Some(id) = id {
                    h.raw(" ").el("span", &[("class", "muted")], &id);
                }
                h.raw("</summary>");
                h.el("pre", &[], &clip(&text, TEXT_CLIP * 4));
                h.raw("</details>");
            }
            Part::Media(t) => {
                h.el("div", &[("class", "media")], &t);
            }
            Part::Other(t) => {
                details(h, "other");
                h.raw("<summary>other</summary>");
                h.el("pre", &[], &clip(&t, TEXT_CLIP));
                h.raw("</details>");
            }
        }
    }
}

fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!(
            "{}\n… ({} more characters: see the transcript file)",
            &s[..i],
            s[i..].chars().count()
        ),
        None => s.to_string(),
    }
}

/// A text part: the first [`TEXT_CLIP`] characters, the rest folded away.
fn clipped(h: &mut Html, class: &'static str, t: &str) {
    match t.char_indices().nth(TEXT_CLIP) {
        None => {
            h.el("div", &[("class", class)], t);
        }
        Some((i, _)) => {
            h.open("div", &[("class", class)])
                .text(&t[..i])
                .close("div");
            let rest = &t[i..];
            h.raw("<details class=\"more\"><summary>");
            h.text(&format!("{} more characters", rest.chars().count()));
            h.raw("</summary>");
            h.el("div", &[("class", class)], &clip(rest, TEXT_CLIP * 8));
            h.raw("</details>");
        }
    }
}

fn cuts_table(h: &mut Html, d: &SessionData, base: &str) {
    h.raw("<section class=\"card\" id=\"cuts\"><h2>Cuts</h2>");
    if d.cuts.is_empty() {
        h.el(
            "p",
            &[("class", "muted")],
            "No cut yet: the window never reached the line.",
        );
        h.raw("</section>");
        return;
    }
    let folded = d.cuts.len() > FOLD_CUTS;
    if folded {
        h.open("details", &[("class", "fold")]).el(
            "summary",
            &[],
            &format!("{} cuts · open the table", d.cuts.len()),
        );
    }
    h.raw("<div class=\"scroll\"><table class=\"cuts\"><thead><tr><th>#</th><th>rows up to</th><th>step</th><th>gauge</th><th>line</th><th>when</th></tr></thead><tbody>");
    for (i, c) in d.cuts.iter().enumerate() {
        h.raw("<tr>")
            .el("td", &[("class", "n")], &(i + 1).to_string())
            .raw("<td>");
        h.link(
            &format!("{base}?view=full&seq={}#r-{}", c.upto_seq, c.upto_seq),
            &format!("seq {}", c.upto_seq),
        );
        h.raw("</td><td>");
        // The step that cut, at its stub (what the model got instead).
        match d.steps.get(cut_step(d, c)) {
            Some(s) if s.detail.sent.as_ref().is_some_and(|w| w.upto >= c.upto_seq) => {
                h.link(
                    &format!("{base}?view=model&step={}#stub", s.step),
                    &format!("step {} · stub", s.step),
                );
            }
            _ => {
                h.raw("—");
            }
        }
        h.raw("</td>")
            .el("td", &[("class", "n")], &tokens(c.gauge))
            .el("td", &[("class", "n")], &tokens(c.line))
            .el("td", &[], &when(c.ts_ms))
            .raw("</tr>");
    }
    h.raw("</tbody></table></div>");
    if folded {
        h.close("details");
    }
    h.raw("</section>");
}

/// A small Markdown reading of `SESSION.md` (headings, lists, code, tables
/// as text, paragraphs): every line's text escaped.
fn markdown(h: &mut Html, md: &str) {
    h.raw("<div class=\"md\">");
    let mut in_code = false;
    let mut in_list = false;
    let mut code = String::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            if in_code {
                h.el("pre", &[], &code);
                code.clear();
            } else if in_list {
                h.raw("</ul>");
                in_list = false;
            }
            in_code = !in_code;
            continue;
        }
        if in_code {
            code.push_str(line);
            code.push('\n');
            continue;
        }
        let t = line.trim_start();
        if t.starts_with("<!--") {
            continue;
        }
        let t = t
            .strip_prefix('_')
            .and_then(|x| x.strip_suffix('_'))
            .filter(|x| !x.is_empty())
            .unwrap_or(t);
        let is_item = t.starts_with("- ") || t.starts_with("* ");
        if in_list && !is_item {
            h.raw("</ul>");
            in_list = false;
        }
        if let Some(x) = t.strip_prefix("### ") {
            h.el("h5", &[], x);
        } else if let Some(x) = t.strip_prefix("## ") {
            h.el("h4", &[], x);
        } else if let Some(x) = t.strip_prefix("# ") {
            h.el("h3", &[], x);
        } else if is_item {
            if !in_list {
                h.raw("<ul>");
                in_list = true;
            }
            h.el("li", &[], &t[2..]);
        } else if !t.is_empty() {
            h.el("p", &[], t);
        }
    }
    if in_code {
        h.el("pre", &[], &code);
    }
    if in_list {
        h.raw("</ul>");
    }
    h.raw("</div>");
}

/// A page that says what went wrong (404, 401); a `command` in backticks
/// in `text` is set as code.
pub fn message_page(title: &str, text: &str) -> String {
    let mut h = Html::new();
    h.el("h1", &[], title).open("p", &[]);
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            h.el("code", &[], part);
        } else {
            h.text(part);
        }
    }
    h.close("p");
    layout(title, h, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_escaped() {
        let mut h = Html::new();
        markdown(&mut h, "# Goal <script>x</script>\n- <img src=x onerror=alert(1)>\n```\n</pre><b>\n```\ntext & more");
        let s = h.finish();
        assert!(!s.contains("<script>"), "{s}");
        assert!(!s.contains("<img"), "{s}");
        assert!(!s.contains("<b>"), "{s}");
        assert!(s.contains("&lt;script&gt;"));
        assert!(s.contains("text &amp; more"));
    }

    #[test]
    fn search_marks_the_matched_words_and_leaves_other_brackets() {
        let snip = "…ran [zephyrword_case] and [case] with a[0] and [<i>] [ZephyrWord]…";
        assert_eq!(
            highlight(snip, "zephyrword_case"),
            [
                (false, "…ran "),
                (true, "zephyrword_case"),
                (false, " and "),
                (true, "case"),
                (false, " with a[0] and [<i>] "),
                (true, "ZephyrWord"),
                (false, "…"),
            ]
        );
        assert_eq!(
            highlight("no [match] here", "other"),
            [(false, "no [match] here")]
        );
        // On the page the runs are escaped: a matched word is text in <mark>.
        let hit = RecallHit {
            session: "s".into(),
            seq: 3,
            turn: 1,
            role: "user".into(),
            kind: oceancode_window::RowKind::Prompt,
            hidden: false,
            body: "say [<script>] [zap]".into(),
        };
        let page = search_page("zap", std::slice::from_ref(&hit), 10);
        assert!(page.contains("<mark>zap</mark>"), "{page}");
        assert!(page.contains("[&lt;script&gt;]"), "{page}");
        let page = search_page("zap script", std::slice::from_ref(&hit), 10);
        assert!(page.contains("<mark>&lt;script&gt;</mark>"), "{page}");
        assert!(!page.contains("<script>]"), "{page}");
    }

    #[test]
    fn sessions_are_sorted_and_filtered() {
        let line = |id: &str, rows: u64, last_ms: i64| SessionLine {
            summary: SessionSummary {
                id: id.into(),
                client: "claude-code".into(),
                name: None,
                model: "m".into(),
                dialect: Dialect::Anthropic,
                turns: 1,
                rows,
                last_ms,
                parent: None,
                parent_seq: None,
            },
            steps: 1,
            cuts: 0,
            spend: None,
            children: vec![],
        };
        let all = vec![line("a", 5, 3), line("b", 9, 1), line("c", 1, 2)];
        let ids = |v: Vec<SessionLine>| v.into_iter().map(|l| l.summary.id).collect::<Vec<_>>();
        assert_eq!(ids(arrange(all.clone(), Sort::Last, "")), ["a", "c", "b"]);
        assert_eq!(ids(arrange(all.clone(), Sort::Rows, "")), ["b", "a", "c"]);
        assert_eq!(ids(arrange(all, Sort::Last, "B")), ["b"]);
    }
}
