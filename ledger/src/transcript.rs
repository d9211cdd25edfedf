//! Per-turn Markdown transcripts: PURE rendering, so `ledger rebuild` can
//! reproduce the files byte for byte from the database.
//!
//! A turn file (`transcript/NNNN.md`) is a `# Turn N` heading followed by
//! every row of the turn's active line, in `seq` order, one `## seq S · role`
//! section per row. Text is written as is; thinking/reasoning is a
//! blockquote; tool inputs, arguments, results and outputs are fenced code
//! blocks (the fence is longer than any backtick run inside); images and
//! documents become placeholders with their size or pages and estimated
//! tokens (never their data); anything not understood is shown verbatim
//! in a ```` ```json ```` fence. Rows hidden by a branch are not passed in
//! (transcripts show the active line; the database keeps the rest).
//!
//! A row's anchor names its tools: `## seq 57 · assistant · call Bash`,
//! `## seq 58 · user · result Bash` (a result is named by the call it
//! answers in the same turn). Each turn file has a sidecar
//! (`transcript/NNNN.rows.md`) with the line range of every row, and
//! [`LineIndex`] is the same index as an API (seq → file and lines): what
//! the state block names and what a pointer to a row can cite, so an
//! agent's `Read` with offset/limit or `sed -n A,Bp` lands on the row.
//!
//! `transcript/index.md` lists the session's facts and one table line per
//! turn: link, seq range, tokens and the prompt's first line.

use crate::media;
use crate::model::{Dialect, Row, RowKind, SessionMeta};
pub use crate::paths::rows_file_name;
use crate::paths::{sanitize_session_id, turn_file_name};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::fmt::Write as _;

/// Longest first line kept for a turn (characters).
pub const FIRST_LINE_MAX: usize = 80;

/// One line of `index.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnSummary {
    /// 1-based turn number.
    pub turn: u32,
    /// First seq of the turn (active line).
    pub first_seq: u64,
    /// Last seq of the turn (active line).
    pub last_seq: u64,
    /// First line of the prompt, at most [`FIRST_LINE_MAX`] characters.
    pub first_line: String,
    /// Sum of the rows' token estimates.
    pub tokens: u64,
}

/// Render one turn file. `rows` are the turn's rows of the active line, in
/// `seq` order.
pub fn render_turn(dialect: Dialect, turn: u32, rows: &[Row]) -> String {
    render_turn_indexed(dialect, turn, rows).0
}

/// [`render_turn`] and the turn's [`LineIndex`] (with each row's anchor label).
pub fn render_turn_indexed(dialect: Dialect, turn: u32, rows: &[Row]) -> (String, LineIndex) {
    let mut out = render_turn_head(turn);
    let mut index = LineIndex::new(turn);
    for row in rows {
        let tools = row_tools(dialect, &row.raw);
        let label = index.label(&tools);
        let section = render_row_labeled(dialect, row, &label);
        index.place(row.seq, &row.role, &section, &label);
        out.push_str(&section);
    }
    (out, index)
}

/// One row on its own (`recall entry`), under its turn's heading, its
/// anchor as its turn file has it: the tools its results answer are named
/// from the calls among `earlier` (the rows before it).
pub fn render_entry(dialect: Dialect, row: &Row, earlier: &[Row]) -> String {
    let mut index = LineIndex::new(row.turn);
    for r in earlier {
        index.label(&row_tools(dialect, &r.raw));
    }
    let label = index.label(&row_tools(dialect, &row.raw));
    let mut out = render_turn_head(row.turn);
    out.push_str(&render_row_labeled(dialect, row, &label));
    out
}

/// Where one row is in its turn file (1-based lines, inclusive): `first`
/// is its `## seq` anchor, `last` its last line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLines {
    /// The row's seq.
    pub seq: u64,
    /// Its turn (the file is [`turn_file_name`]`(turn)`).
    pub turn: u32,
    /// The anchor's line.
    pub first: u32,
    /// The row's last line.
    pub last: u32,
}

/// The tools a row's anchor names: the calls it makes `(id, name)` and the
/// call ids its results answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowTools {
    /// Calls made: `(id, tool name)`.
    pub calls: Vec<(Option<String>, String)>,
    /// Results given: the call id each answers.
    pub results: Vec<Option<String>>,
}

/// [`RowTools`] of a raw row.
pub fn row_tools(dialect: Dialect, raw: &str) -> RowTools {
    let mut t = RowTools::default();
    for p in crate::parts::parts(dialect, raw) {
        match p {
            crate::parts::Part::ToolCall { id, name, .. } => t.calls.push((id, name)),
            crate::parts::Part::ToolResult { id, .. } => t.results.push(id),
            _ => {}
        }
    }
    t
}

/// The line index of one turn file, built row by row in `seq` order as
/// the file is rendered ([`render_turn_indexed`]); also what the sidecar
/// `NNNN.rows.md` lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineIndex {
    turn: u32,
    /// Lines written so far (the heading is line 1).
    lines: u32,
    rows: Vec<(RowLines, String)>,
    names: HashMap<String, String>,
    /// The names each placed row's label added, with what they replaced
    /// (what [`LineIndex::truncate`] undoes), and the next row's.
    added: Vec<Vec<(String, Option<String>)>>,
    adding: Vec<(String, Option<String>)>,
}

impl LineIndex {
    /// The index of an empty turn file (its heading only).
    pub fn new(turn: u32) -> LineIndex {
        LineIndex {
            turn,
            lines: line_count(&render_turn_head(turn)),
            rows: Vec::new(),
            names: HashMap::new(),
            added: Vec::new(),
            adding: Vec::new(),
        }
    }

    /// Rows placed so far.
    pub fn placed(&self) -> usize {
        self.rows.len()
    }

    /// Forget every row after the first `n` (their lines and the call
    /// names their labels added), as if only those were placed.
    pub fn truncate(&mut self, n: usize) {
        let names = &mut self.names;
        let mut undo = |adds: Vec<(String, Option<String>)>| {
            for (id, before) in adds.into_iter().rev() {
                match before {
                    Some(name) => names.insert(id, name),
                    None => names.remove(&id),
                };
            }
        };
        undo(std::mem::take(&mut self.adding));
        while self.rows.len() > n {
            self.rows.pop();
            undo(self.added.pop().unwrap_or_default());
        }
        self.lines = self
            .rows
            .last()
            .map_or_else(|| line_count(&render_turn_head(self.turn)), |(r, _)| r.last);
    }

    /// The anchor label of the next row (` · call Bash`, ` · result Bash`),
    /// remembering the calls it makes for the results that follow.
    pub fn label(&mut self, tools: &RowTools) -> String {
        let mut label = String::new();
        let mut names: Vec<&str> = Vec::new();
        for (_, name) in &tools.calls {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        if !names.is_empty() {
            label.push_str(" · call ");
            label.push_str(&one_line(&names.join(", ")));
        }
        let mut answered: Vec<&str> = Vec::new();
        for id in &tools.results {
            let name = id
                .as_ref()
                .and_then(|i| self.names.get(i))
                .map_or("?", String::as_str);
            if !answered.contains(&name) {
                answered.push(name);
            }
        }
        if !answered.is_empty() {
            label.push_str(" · result ");
            label.push_str(&one_line(&answered.join(", ")));
        }
        for (id, name) in &tools.calls {
            if let Some(id) = id {
                let before = self.names.insert(id.clone(), name.clone());
                self.adding.push((id.clone(), before));
            }
        }
        label
    }

    /// Place the next row's rendered section (from [`render_row_labeled`]).
    pub fn place(&mut self, seq: u64, role: &str, section: &str, label: &str) -> RowLines {
        self.place_lines(seq, role, line_count(section), label)
    }

    /// Place the next row's section of `n` lines ([`line_count`]).
    pub fn place_lines(&mut self, seq: u64, role: &str, n: u32, label: &str) -> RowLines {
        self.added.push(std::mem::take(&mut self.adding));
        let at = RowLines {
            seq,
            turn: self.turn,
            first: self.lines + 2,
            last: self.lines + n,
        };
        self.lines += n;
        self.rows
            .push((at, format!("{}{}", one_line(role), one_line(label))));
        at
    }

    /// Where each row is, in `seq` order.
    pub fn rows(&self) -> impl Iterator<Item = &RowLines> {
        self.rows.iter().map(|(r, _)| r)
    }

    /// Where the row `seq` is, if it is in this turn file.
    pub fn find(&self, seq: u64) -> Option<RowLines> {
        self.rows
            .binary_search_by_key(&seq, |(r, _)| r.seq)
            .ok()
            .map(|i| self.rows[i].0)
    }

    /// The sidecar `transcript/NNNN.rows.md`: the line range of every row
    /// ([`LineIndex::render_head`], then [`LineIndex::render_row`] of each).
    pub fn render(&self) -> String {
        let mut out = self.render_head();
        for i in 0..self.rows.len() {
            self.render_row(i, &mut out);
        }
        out
    }

    /// The sidecar's heading and table header.
    pub fn render_head(&self) -> String {
        let file = turn_file_name(self.turn);
        format!(
            "# Turn {} · where each row of [{file}]({file}) is\n\nOpen a row with `sed -n FIRST,LASTp {file}` or Read with offset FIRST.\n\n| Seq | Lines | Row |\n|---:|:---|:---|\n",
            self.turn
        )
    }

    /// The sidecar's line of the `i`th row placed, pushed to `out`.
    pub fn render_row(&self, i: usize, out: &mut String) {
        if let Some((r, what)) = self.rows.get(i) {
            let _ = writeln!(
                out,
                "| {} | {}–{} | {} |",
                r.seq,
                r.first,
                r.last,
                cell(what)
            );
        }
    }
}

/// Lines of a rendered piece (every line ends with `\n`).
pub fn line_count(s: &str) -> u32 {
    memchr::memchr_iter(b'\n', s.as_bytes()).count() as u32
}

/// Lines of one row's section in its turn file (anchor labels never change
/// the count): what a caller without the file needs to place the row.
pub fn section_lines(dialect: Dialect, seq: u64, role: &str, raw: &str) -> u32 {
    line_count(&render_section(dialect, seq, role, raw, ""))
}

/// The heading a turn file starts with; [`render_turn`] is this followed by
/// [`render_row`] of each row (so a writer may render rows once and reuse them).
pub fn render_turn_head(turn: u32) -> String {
    format!("# Turn {turn}\n")
}

/// One row's section of a turn file, its anchor without tool names.
pub fn render_row(dialect: Dialect, row: &Row) -> String {
    render_row_labeled(dialect, row, "")
}

/// One row's section of a turn file, `label` ([`LineIndex::label`]) after
/// its role in the anchor.
pub fn render_row_labeled(dialect: Dialect, row: &Row, label: &str) -> String {
    render_section(dialect, row.seq, &row.role, &row.raw, label)
}

fn render_section(dialect: Dialect, seq: u64, role: &str, raw: &str, label: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "\n## seq {} · {}{}\n",
        seq,
        one_line(role),
        one_line(label)
    );
    for block in row_blocks(dialect, raw) {
        out.push('\n');
        out.push_str(&block);
        if !block.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Render `transcript/index.md`. `turns` in turn order.
pub fn render_index(session: &SessionMeta, turns: &[TurnSummary]) -> String {
    let mut out = format!("# Session {}\n\n", one_line(&session.id));
    let _ = writeln!(out, "- client: {}", one_line(&session.client));
    if let Some(cs) = &session.client_session {
        let _ = writeln!(out, "- client session: {}", one_line(cs));
    }
    let _ = writeln!(out, "- dialect: {}", session.dialect.as_str());
    let _ = writeln!(out, "- model: {}", one_line(&session.model));
    if let Some(p) = &session.parent {
        let at = session
            .parent_seq
            .map(|s| format!(" (a sibling: diverged after its seq {s})"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "- parent: [{}](../../{}/transcript/index.md){at}",
            cell(p),
            sanitize_session_id(p)
        );
    }
    let _ = writeln!(out, "- created: {}", utc_iso(session.created_ms));
    out.push('\n');
    if turns.is_empty() {
        out.push_str("_No turns yet._\n");
        return out;
    }
    out.push_str("| Turn | Seq | Tokens | First line |\n|---:|:---|---:|:---|\n");
    let mut total = 0u64;
    for t in turns {
        total += t.tokens;
        let seqs = if t.first_seq == t.last_seq {
            t.first_seq.to_string()
        } else {
            format!("{}–{}", t.first_seq, t.last_seq)
        };
        let _ = writeln!(
            out,
            "| [{}]({}) | {} | {} | {} |",
            t.turn,
            turn_file_name(t.turn),
            seqs,
            t.tokens,
            cell(&t.first_line)
        );
    }
    let _ = writeln!(
        out,
        "\n{} turn{} · {} tokens",
        turns.len(),
        if turns.len() == 1 { "" } else { "s" },
        total
    );
    out
}

/// Summarize a turn from its rows (active line, `seq` order); `None` when
/// `rows` is empty.
pub fn summarize_turn(dialect: Dialect, turn: u32, rows: &[Row]) -> Option<TurnSummary> {
    let first = rows.first()?;
    let last = rows.last()?;
    let prompts = rows
        .iter()
        .filter(|r| r.kind == RowKind::Prompt)
        .map(|r| &*r.raw);
    Some(TurnSummary {
        turn,
        first_seq: first.seq,
        last_seq: last.seq,
        first_line: prompt_first_line(dialect, prompts),
        tokens: rows.iter().map(|r| u64::from(r.tokens)).sum(),
    })
}

/// The first line of a turn given the raw prompt rows of the turn, in order:
/// the first text that is not a wrapper (`<system-reminder>`,
/// `<environment_context>`, ...) wins; else the first text at all; else "".
pub fn prompt_first_line<'a>(dialect: Dialect, prompts: impl Iterator<Item = &'a str>) -> String {
    let mut fallback: Option<String> = None;
    for raw in prompts {
        for text in message_texts(dialect, raw) {
            let Some(line) = first_nonempty_line(&text) else {
                continue;
            };
            if !text.trim_start().starts_with('<') {
                return clip(line);
            }
            if fallback.is_none() {
                fallback = Some(clip(line));
            }
        }
    }
    fallback.unwrap_or_default()
}

/// First line of one message's text (≤ [`FIRST_LINE_MAX`] characters),
/// wrapper texts skipped as in [`prompt_first_line`].
pub fn first_line(dialect: Dialect, raw: &str) -> String {
    prompt_first_line(dialect, std::iter::once(raw))
}

/// The plain text parts of a message (content string, or `text` /
/// `input_text` / `output_text` parts), in order.
pub fn message_texts(dialect: Dialect, raw: &str) -> Vec<String> {
    if dialect == Dialect::Gemini {
        return crate::parts::parts(dialect, raw)
            .into_iter()
            .filter_map(|p| match p {
                crate::parts::Part::Text(t) => Some(t),
                _ => None,
            })
            .collect();
    }
    let Some(o) = obj(raw) else {
        return Vec::new();
    };
    let Some(content) = o.get("content") else {
        return Vec::new();
    };
    if let Some(s) = as_string(content) {
        return vec![s];
    }
    let mut out = Vec::new();
    for part in as_array(content).unwrap_or_default() {
        let Some(p) = as_object(part) else { continue };
        let ty = get_string(&p, "type").unwrap_or_default();
        if matches!(ty.as_str(), "text" | "input_text" | "output_text") {
            if let Some(t) = get_string(&p, "text") {
                out.push(t);
            }
        }
    }
    out
}

fn first_nonempty_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|l| !l.is_empty())
}

fn clip(line: &str) -> String {
    if line.chars().count() <= FIRST_LINE_MAX {
        return line.to_string();
    }
    let mut s: String = line.chars().take(FIRST_LINE_MAX - 1).collect();
    s.push('…');
    s
}

// ---------------------------------------------------------------------------
// Row rendering

type Obj<'a> = HashMap<String, &'a RawValue>;

fn obj(s: &str) -> Option<Obj<'_>> {
    serde_json::from_str(s).ok()
}

fn as_object(v: &RawValue) -> Option<Obj<'_>> {
    obj(v.get())
}

fn as_array(v: &RawValue) -> Option<Vec<&RawValue>> {
    serde_json::from_str(v.get()).ok()
}

fn as_string(v: &RawValue) -> Option<String> {
    serde_json::from_str(v.get()).ok()
}

fn get_string(o: &Obj<'_>, key: &str) -> Option<String> {
    o.get(key).and_then(|v| as_string(v))
}

fn is_true(o: &Obj<'_>, key: &str) -> bool {
    o.get(key)
        .and_then(|v| serde_json::from_str::<bool>(v.get()).ok())
        .unwrap_or(false)
}

/// The blocks of one row (each one Markdown paragraph/fence).
fn row_blocks(dialect: Dialect, raw: &str) -> Vec<String> {
    let blocks = obj(raw).and_then(|o| match dialect {
        Dialect::Anthropic => anthropic_blocks(&o),
        Dialect::OpenaiChat => chat_blocks(&o),
        Dialect::OpenaiResponses => responses_blocks(&o),
        Dialect::Gemini => Some(gemini_blocks(raw)),
    });
    match blocks {
        Some(b) if b.is_empty() => vec!["*(empty)*".to_string()],
        Some(b) => b,
        None => vec![verbatim(raw)],
    }
}

/// A Gemini content's parts as blocks (read through [`crate::parts`]).
fn gemini_blocks(raw: &str) -> Vec<String> {
    use crate::parts::Part;
    crate::parts::parts(Dialect::Gemini, raw)
        .into_iter()
        .map(|p| match p {
            Part::Text(t) => t,
            Part::Thinking(t) => quote("thinking", &t),
            Part::ToolCall { id, name, input } => {
                let mut s = tool_header("functionCall", Some(name), id);
                s.push('\n');
                s.push_str(&fence("json", &input.to_string()));
                s
            }
            Part::ToolResult { id, is_error, text } => {
                let mut s = tool_header("functionResponse", None, id);
                if is_error {
                    s.push_str(" · error");
                }
                s.push('\n');
                s.push_str(&fence("", &text));
                s
            }
            Part::Media(m) => format!("*{}*", one_line(&m)),
            Part::Other(o) => fence("json", &o),
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// Unknown content: the raw bytes in a `json` fence (plain if not JSON).
fn verbatim(raw: &str) -> String {
    if serde_json::from_str::<&RawValue>(raw).is_ok() {
        fence("json", raw)
    } else {
        fence("", raw)
    }
}

fn push_text(out: &mut Vec<String>, text: Option<String>) {
    if let Some(t) = text {
        if !t.is_empty() {
            out.push(t);
        }
    }
}

fn anthropic_blocks(o: &Obj<'_>) -> Option<Vec<String>> {
    let content = o.get("content")?;
    let mut out = Vec::new();
    if let Some(s) = as_string(content) {
        push_text(&mut out, Some(s));
        return Some(out);
    }
    if content.get() == "null" {
        return Some(out);
    }
    for block in as_array(content)? {
        anthropic_block(block, &mut out);
    }
    Some(out)
}

fn anthropic_block(block: &RawValue, out: &mut Vec<String>) {
    let Some(b) = as_object(block) else {
        out.push(verbatim(block.get()));
        return;
    };
    let ty = get_string(&b, "type").unwrap_or_default();
    match ty.as_str() {
        "text" => push_text(out, get_string(&b, "text")),
        "thinking" => out.push(quote(
            "thinking",
            &get_string(&b, "thinking").unwrap_or_default(),
        )),
        "redacted_thinking" => out.push(quote("redacted thinking", "")),
        "tool_use" | "server_tool_use" | "mcp_tool_use" => {
            let mut s = tool_header(&ty, get_string(&b, "name"), get_string(&b, "id"));
            s.push('\n');
            s.push_str(&fence("json", b.get("input").map_or("{}", |v| v.get())));
            out.push(s);
        }
        t if t == "tool_result" || t.ends_with("_tool_result") => {
            let mut s = tool_header(&ty, None, get_string(&b, "tool_use_id"));
            if is_true(&b, "is_error") {
                s.push_str(" · error");
            }
            if let Some(c) = b.get("content") {
                result_body(c, &mut s);
            }
            out.push(s);
        }
        "image" => out.push(media_placeholder("image", &b, block.get())),
        "document" => out.push(media_placeholder("document", &b, block.get())),
        _ => out.push(fence("json", block.get())),
    }
}

/// Append a tool result/output body (string, or list of parts) as fences.
fn result_body(content: &RawValue, s: &mut String) {
    if let Some(text) = as_string(content) {
        s.push('\n');
        s.push_str(&fence("", &text));
        return;
    }
    let Some(parts) = as_array(content) else {
        if content.get() != "null" {
            s.push('\n');
            s.push_str(&fence("json", content.get()));
        }
        return;
    };
    for part in parts {
        s.push('\n');
        let Some(p) = as_object(part) else {
            s.push_str(&fence("json", part.get()));
            continue;
        };
        let ty = get_string(&p, "type").unwrap_or_default();
        match ty.as_str() {
            "text" | "input_text" | "output_text" => {
                s.push_str(&fence("", &get_string(&p, "text").unwrap_or_default()))
            }
            "image" | "input_image" | "image_url" => {
                s.push_str(&media_placeholder("image", &p, part.get()))
            }
            "document" | "input_file" | "file" => {
                s.push_str(&media_placeholder("file", &p, part.get()))
            }
            _ => s.push_str(&fence("json", part.get())),
        }
    }
}

fn chat_blocks(o: &Obj<'_>) -> Option<Vec<String>> {
    let role = get_string(o, "role")?;
    let mut out = Vec::new();
    if let Some(r) = get_string(o, "reasoning_content") {
        out.push(quote("reasoning", &r));
    }
    if role == "tool" {
        let mut s = tool_header("tool_result", None, get_string(o, "tool_call_id"));
        if let Some(c) = o.get("content") {
            result_body(c, &mut s);
        }
        out.push(s);
        return Some(out);
    }
    if let Some(c) = o.get("content") {
        message_content(c, &mut out);
    }
    if let Some(r) = get_string(o, "refusal") {
        out.push(format!("*refusal:* {r}"));
    }
    if let Some(calls) = o.get("tool_calls").and_then(|v| as_array(v)) {
        for call in calls {
            let Some(c) = as_object(call) else {
                out.push(fence("json", call.get()));
                continue;
            };
            let id = get_string(&c, "id");
            if let Some(f) = c.get("function").and_then(|v| as_object(v)) {
                out.push(call_block("tool_call", &f, id, "arguments", "json"));
            } else if let Some(f) = c.get("custom").and_then(|v| as_object(v)) {
                out.push(call_block("tool_call", &f, id, "input", ""));
            } else {
                out.push(fence("json", call.get()));
            }
        }
    }
    if let Some(f) = o.get("function_call").and_then(|v| as_object(v)) {
        out.push(call_block("function_call", &f, None, "arguments", "json"));
    }
    Some(out)
}

fn responses_blocks(o: &Obj<'_>) -> Option<Vec<String>> {
    let ty = get_string(o, "type");
    let mut out = Vec::new();
    match ty.as_deref() {
        Some("message") => message_content(o.get("content")?, &mut out),
        None if o.contains_key("role") => message_content(o.get("content")?, &mut out),
        Some(t @ ("function_call" | "custom_tool_call")) => {
            let (field, lang) = if t == "function_call" {
                ("arguments", "json")
            } else {
                ("input", "")
            };
            out.push(call_block(t, o, get_string(o, "call_id"), field, lang));
        }
        Some(t) if t.ends_with("_call_output") => {
            let mut s = tool_header(t, None, get_string(o, "call_id"));
            if let Some(c) = o.get("output") {
                result_body(c, &mut s);
            }
            out.push(s);
        }
        Some("reasoning") => {
            let mut texts = Vec::new();
            for key in ["summary", "content"] {
                for part in o.get(key).and_then(|v| as_array(v)).unwrap_or_default() {
                    if let Some(t) = as_object(part).and_then(|p| get_string(&p, "text")) {
                        texts.push(t);
                    }
                }
            }
            if texts.is_empty() {
                out.push(quote("reasoning (encrypted)", ""));
            } else {
                out.push(quote("reasoning", &texts.join("\n\n")));
            }
        }
        _ => return None,
    }
    Some(out)
}

/// A message's `content`: string as is, or parts (chat and Responses).
fn message_content(content: &RawValue, out: &mut Vec<String>) {
    if let Some(s) = as_string(content) {
        push_text(out, Some(s));
        return;
    }
    let Some(parts) = as_array(content) else {
        if content.get() != "null" {
            out.push(fence("json", content.get()));
        }
        return;
    };
    for part in parts {
        let Some(p) = as_object(part) else {
            out.push(fence("json", part.get()));
            continue;
        };
        let ty = get_string(&p, "type").unwrap_or_default();
        match ty.as_str() {
            "text" | "input_text" | "output_text" => push_text(out, get_string(&p, "text")),
            "refusal" => out.push(format!(
                "*refusal:* {}",
                get_string(&p, "refusal").unwrap_or_default()
            )),
            "image_url" | "input_image" | "image" => {
                out.push(media_placeholder("image", &p, part.get()))
            }
            "input_file" | "file" => out.push(media_placeholder("file", &p, part.get())),
            "input_audio" => out.push("*[audio]*".to_string()),
            _ => out.push(fence("json", part.get())),
        }
    }
}

/// `**kind** `name` · `id`` then the call's input in a fence (a string
/// field is shown decoded, anything else raw).
fn call_block(kind: &str, o: &Obj<'_>, id: Option<String>, field: &str, lang: &str) -> String {
    let mut s = tool_header(kind, get_string(o, "name"), id);
    s.push('\n');
    let body = match o.get(field) {
        Some(v) => as_string(v).unwrap_or_else(|| v.get().to_string()),
        None => String::new(),
    };
    s.push_str(&fence(lang, &body));
    s
}

fn tool_header(kind: &str, name: Option<String>, id: Option<String>) -> String {
    let mut s = format!("**{}**", one_line(kind));
    if let Some(n) = name {
        s.push(' ');
        s.push_str(&code(&n));
    }
    if let Some(i) = id {
        s.push_str(" · ");
        s.push_str(&code(&i));
    }
    s
}

/// `*[image: image/png · 1920×1080 · ~1568 tokens]*`-style placeholder:
/// what the part is, its size or pages and what it costs the provider
/// ([`media`]), never the data itself. `raw` is the part's JSON.
fn media_placeholder(what: &str, o: &Obj<'_>, raw: &str) -> String {
    let src = o.get("source").and_then(|v| as_object(v));
    let declared = get_string(o, "title")
        .or_else(|| get_string(o, "filename"))
        .or_else(|| src.as_ref().and_then(|s| get_string(s, "media_type")));
    let m = media::block(raw);
    let fallback = || src.as_ref().and_then(|s| get_string(s, "type"));
    let detail = declared
        .or_else(|| m.as_ref().and_then(|m| m.media_type.clone()))
        .or_else(fallback);
    match media::label(detail.as_deref(), m.as_ref()) {
        Some(l) => format!("*[{what}: {}]*", one_line(&l)),
        None => format!("*[{what}]*"),
    }
}

/// A blockquote: `> *label*`, then the text line by line.
fn quote(label: &str, text: &str) -> String {
    let mut s = format!("> *{label}*");
    let text = text.trim_end_matches('\n');
    if !text.is_empty() {
        s.push_str("\n>");
        for line in text.split('\n') {
            s.push('\n');
            if line.is_empty() {
                s.push('>');
            } else {
                s.push_str("> ");
                s.push_str(line);
            }
        }
    }
    s
}

/// A fenced code block whose fence is longer than any backtick run inside.
pub fn fence(lang: &str, body: &str) -> String {
    let ticks = "`".repeat(longest_backtick_run(body).max(2) + 1);
    let mut s = format!("{ticks}{lang}\n{body}");
    if !body.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&ticks);
    s
}

fn longest_backtick_run(s: &str) -> usize {
    // The backticks only (memchr): most of a tool's output holds none.
    let (mut best, mut run, mut next) = (0, 0, usize::MAX);
    for i in memchr::memchr_iter(b'`', s.as_bytes()) {
        run = if i == next { run + 1 } else { 1 };
        best = best.max(run);
        next = i + 1;
    }
    best
}

/// An inline code span safe for any content.
pub fn code(s: &str) -> String {
    let s = one_line(s);
    let ticks = "`".repeat(longest_backtick_run(&s) + 1);
    if s.starts_with('`') || s.ends_with('`') {
        format!("{ticks} {s} {ticks}")
    } else {
        format!("{ticks}{s}{ticks}")
    }
}

/// `s` on one line (CR/LF become spaces).
pub fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// A table cell: one line, `|` escaped.
pub fn cell(s: &str) -> String {
    one_line(s).replace('|', "\\|")
}

/// `2026-12-01T00:58:07Z` for Unix milliseconds (the one date helper).
pub use crate::time::utc_iso;

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(calls: &[(&str, &str)], results: &[&str]) -> RowTools {
        RowTools {
            calls: calls
                .iter()
                .map(|(id, name)| (Some(id.to_string()), name.to_string()))
                .collect(),
            results: results.iter().map(|id| Some(id.to_string())).collect(),
        }
    }

    /// Each row: its tools and its section's lines.
    fn place_all(index: &mut LineIndex, rows: &[(RowTools, u32)], from: usize) {
        for (i, (t, n)) in rows.iter().enumerate().skip(from) {
            let label = index.label(t);
            index.place_lines(i as u64 + 1, "user", *n, &label);
        }
    }

    #[test]
    fn a_truncated_index_places_again_as_a_fresh_one() {
        let rows = vec![
            (tools(&[("a", "Bash")], &[]), 5),
            (tools(&[], &["a"]), 9),
            (tools(&[("a", "Read"), ("b", "Grep")], &[]), 4),
            (tools(&[], &["a", "b"]), 12),
            (tools(&[], &[]), 3),
        ];
        let mut fresh = LineIndex::new(7);
        place_all(&mut fresh, &rows, 0);
        for k in 0..=rows.len() {
            let mut index = LineIndex::new(7);
            place_all(&mut index, &rows, 0);
            // A label taken for a row never placed is undone too.
            index.label(&tools(&[("b", "Edit")], &[]));
            index.truncate(k);
            assert_eq!(index.placed(), k);
            place_all(&mut index, &rows, k);
            assert_eq!(index.render(), fresh.render(), "truncated to {k}");
            assert_eq!(index.lines, fresh.lines);
        }
        // The second row answers a Bash call; after the third row's call
        // reuses its id, a result names Read.
        let side = fresh.render();
        assert!(side.contains("| 2 | 8–15 | user · result Bash |"), "{side}");
        assert!(
            side.contains("| 4 | 21–31 | user · result Read, Grep |"),
            "{side}"
        );
    }
}
