//! Engine facts a row states: the files its tool calls name, the shell
//! command they run, the task list they write, and the exit code or error
//! of a tool result. PURE: one reading shared by `SESSION.md`
//! ([`crate::page`]) and the state block after the stub
//! ([`crate::state_block`]), so both say the same about the same rows.
//!
//! Tool shapes covered: Claude Code `Read`/`Edit`/`Write`/`MultiEdit`/
//! `NotebookEdit`/`Grep`/`Glob` (`file_path`, `notebook_path`, `path`),
//! `TodoWrite` (`todos`), `TaskCreate` / `TaskUpdate` (one task by id, the
//! id in `TaskCreate`'s result); Qwen Code `todo_write` and opencode
//! `todowrite` (`todos`); Codex `apply_patch` (patch headers, as a tool or
//! inside a shell command), `exec_command`/`shell` (`cmd`/`command`, a
//! string or an argv such as `["bash", "-lc", "..."]`) and the files a shell
//! command reads or writes (`cat`, `sed -n`, `head`, `nl`, `> file`, `tee`,
//! `touch`, `rm`, `sed -i`), `update_plan` (`plan`); generic `bash` and
//! `str_replace_editor`-style tools (`command` + `path`).

use crate::model::Dialect;
use crate::parts::{self, Part};
use crate::transcript::one_line;
use serde_json::Value;

/// Longest command or task text kept (characters).
pub const LINE_MAX: usize = 160;
/// Longest ask kept (characters).
pub const ASK_MAX: usize = 300;

/// How a tool call touched a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Touch {
    /// Read or viewed.
    Read,
    /// Searched (a `Grep`/`Glob` path).
    Searched,
    /// Changed in place.
    Edited,
    /// Created or written whole.
    Created,
    /// Deleted.
    Deleted,
}

impl Touch {
    /// `read`, `searched`, `edited`, `created`, `deleted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Touch::Read => "read",
            Touch::Searched => "searched",
            Touch::Edited => "edited",
            Touch::Created => "created",
            Touch::Deleted => "deleted",
        }
    }

    /// The touch a verb of [`file_refs`] stands for (a lowercase tool name,
    /// an `apply_patch` header verb, a `str_replace_editor` command, or a
    /// shell verb).
    pub fn of_verb(verb: &str) -> Touch {
        match verb {
            "write" | "create" | "add" | "touch" | "tee" | "redirect" => Touch::Created,
            "delete" | "rm" => Touch::Deleted,
            "grep" | "glob" | "search" | "ls" | "find" => Touch::Searched,
            v if v.contains("edit")
                || v.contains("patch")
                || matches!(v, "update" | "move" | "str_replace" | "insert" | "sed -i") =>
            {
                Touch::Edited
            }
            _ => Touch::Read,
        }
    }
}

/// One tool call's facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallFacts {
    /// The call id (what its result names).
    pub id: Option<String>,
    /// The tool's name.
    pub tool: String,
    /// `(verb, path)` of every file it names ([`file_refs`]).
    pub files: Vec<(String, String)>,
    /// The shell command it runs, squashed to one line and clipped.
    pub command: Option<String>,
    /// The task list it writes: `(content, status)`.
    pub todos: Option<Vec<(String, String)>>,
    /// One task it creates or changes (Claude Code's `TaskCreate` /
    /// `TaskUpdate`).
    pub task: Option<TaskOp>,
}

/// A change to one task of the agent's list (Claude Code 2.1.332 keeps its
/// list with `TaskCreate` / `TaskUpdate`, not `TodoWrite`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskOp {
    /// A new task; its id is in the call's result ([`TaskAck::Created`]).
    Create {
        /// Its subject.
        subject: String,
    },
    /// A change to the task `id`.
    Update {
        /// The task's id.
        id: String,
        /// A new subject.
        subject: Option<String>,
        /// A new status (`deleted` removes the task).
        status: Option<String>,
    },
}

/// What a tool result says of a task call (Claude Code's result texts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskAck {
    /// `Task #ID created successfully: …`.
    Created(String),
    /// `Updated task #ID …`.
    Updated,
}

/// One tool result's facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResultFacts {
    /// The call it answers.
    pub id: Option<String>,
    /// Marked as an error (Anthropic `is_error`).
    pub is_error: bool,
    /// The exit code its output reports.
    pub exit: Option<i64>,
    /// What it says of a task call.
    pub task: Option<TaskAck>,
}

/// What one row states.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowFacts {
    /// Its tool calls, in order.
    pub calls: Vec<CallFacts>,
    /// Its tool results, in order.
    pub results: Vec<ResultFacts>,
}

impl RowFacts {
    /// Nothing to say.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.results.is_empty()
    }
}

/// The facts of a raw row.
pub fn row_facts(dialect: Dialect, raw: &str) -> RowFacts {
    let mut out = RowFacts::default();
    for part in parts::parts(dialect, raw) {
        match part {
            Part::ToolCall { id, name, input } => out.calls.push(CallFacts {
                files: file_refs(&name, &input),
                command: command_of(&name, &input),
                todos: todos_of(&input),
                task: task_op(&name, &input),
                id,
                tool: name,
            }),
            Part::ToolResult { id, is_error, text } => out.results.push(ResultFacts {
                id,
                is_error,
                exit: parts::exit_code(&text),
                task: task_ack(&text),
            }),
            _ => {}
        }
    }
    out
}

/// `(verb, path)` pairs a tool call names: `file_path` / `notebook_path` /
/// `path` inputs (the verb is the lowercase tool name, or a
/// `str_replace_editor` command), the file headers of an `apply_patch`
/// body, and the files a shell command reads or writes.
pub fn file_refs(name: &str, input: &Value) -> Vec<(String, String)> {
    let lname = name.to_ascii_lowercase();
    let mut out = Vec::new();
    if let Some(o) = input.as_object() {
        for key in ["file_path", "notebook_path", "path"] {
            if let Some(p) = o.get(key).and_then(Value::as_str) {
                if !p.is_empty() {
                    let verb = match o.get("command").and_then(Value::as_str) {
                        Some(c) if lname.contains("editor") || lname.contains("str_replace") => {
                            match c {
                                "view" => "read".to_string(),
                                c => c.to_ascii_lowercase(),
                            }
                        }
                        _ => lname.clone(),
                    };
                    out.push((verb, one_line(p)));
                    break;
                }
            }
        }
    }
    if lname.contains("apply_patch") || lname == "patch" {
        let body = match input {
            Value::String(s) => Some(s.as_str()),
            Value::Object(o) => ["input", "patch"]
                .iter()
                .find_map(|k| o.get(*k).and_then(Value::as_str)),
            _ => None,
        };
        patch_refs(body.unwrap_or_default(), &mut out);
    }
    if let Some(cmd) = raw_command(name, input) {
        if cmd.contains("*** Begin Patch") {
            patch_refs(&cmd, &mut out);
        } else {
            for r in shell_refs(&cmd) {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
    }
    out
}

fn patch_refs(body: &str, out: &mut Vec<(String, String)>) {
    for line in body.lines() {
        for (mark, verb) in [
            ("*** Add File: ", "add"),
            ("*** Update File: ", "update"),
            ("*** Delete File: ", "delete"),
            ("*** Move to: ", "move"),
        ] {
            if let Some(p) = line.strip_prefix(mark) {
                out.push((verb.to_string(), p.trim().to_string()));
            }
        }
    }
}

/// The shell command a tool call runs, as sent (`Bash.command`,
/// `exec_command.cmd`, `shell.command` arrays such as `["bash", "-lc", "..."]`).
fn raw_command(name: &str, input: &Value) -> Option<String> {
    let lname = name.to_ascii_lowercase();
    let shellish = ["bash", "shell", "exec", "command", "terminal", "run"]
        .iter()
        .any(|k| lname.contains(k));
    if !shellish {
        return None;
    }
    let o = input.as_object()?;
    let v = o.get("command").or_else(|| o.get("cmd"))?;
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => {
            let words: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            Some(match words.as_slice() {
                [_, flag, script] if matches!(*flag, "-lc" | "-c") => script.to_string(),
                _ => words.join(" "),
            })
        }
        _ => None,
    }
}

/// The shell command a tool call runs, on one line, clipped to [`LINE_MAX`].
pub fn command_of(name: &str, input: &Value) -> Option<String> {
    let cmd = squash_clip(&raw_command(name, input)?, LINE_MAX);
    (!cmd.is_empty()).then_some(cmd)
}

/// `(content, status)` of a `TodoWrite` (`todos`) or `update_plan` (`plan`)
/// call, or any tool whose input is such a list.
pub fn todos_of(input: &Value) -> Option<Vec<(String, String)>> {
    let o = input.as_object()?;
    let (list, key) = match (o.get("todos"), o.get("plan")) {
        (Some(Value::Array(l)), _) => (l, "content"),
        (_, Some(Value::Array(l))) => (l, "step"),
        _ => return None,
    };
    let items: Vec<(String, String)> = list
        .iter()
        .filter_map(|t| {
            let content = t
                .get(key)
                .or_else(|| t.get("content"))
                .or_else(|| t.get("step"))
                .or_else(|| t.get("title"))?
                .as_str()?;
            let status = t.get("status").and_then(Value::as_str).unwrap_or("pending");
            Some((squash(content), status.to_string()))
        })
        .collect();
    (!items.is_empty()).then_some(items)
}

/// The task a `TaskCreate` / `TaskUpdate` call creates or changes.
pub fn task_op(name: &str, input: &Value) -> Option<TaskOp> {
    let o = input.as_object()?;
    let text = |k: &str| {
        o.get(k)
            .and_then(Value::as_str)
            .map(squash)
            .filter(|s| !s.is_empty())
    };
    match name {
        "TaskCreate" => Some(TaskOp::Create {
            subject: text("subject")?,
        }),
        "TaskUpdate" => Some(TaskOp::Update {
            id: text("taskId")?,
            subject: text("subject"),
            status: text("status"),
        }),
        _ => None,
    }
}

/// What a tool result's text says of a task call: `Task #ID created
/// successfully…` or `Updated task #ID …` (Claude Code's wording).
pub fn task_ack(text: &str) -> Option<TaskAck> {
    let t = text.trim_start();
    if let Some(rest) = t.strip_prefix("Task #") {
        let (id, tail) = rest.split_once(char::is_whitespace)?;
        return (tail.starts_with("created successfully") && !id.is_empty())
            .then(|| TaskAck::Created(id.to_string()));
    }
    t.starts_with("Updated task #").then_some(TaskAck::Updated)
}

/// One task of a [`TaskBook`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct TaskItem {
    /// The id `TaskCreate` gave it (none for a whole-list write).
    id: Option<String>,
    subject: String,
    status: String,
}

/// A task call waiting for its result.
#[derive(Clone, Debug)]
enum PendingTask {
    List(Vec<(String, String)>),
    Op(TaskOp),
}

/// The agent's task list folded from its calls: a whole-list write
/// (`TodoWrite`, `update_plan`, `todo_write`, `todowrite`) replaces it,
/// `TaskCreate` / `TaskUpdate` change one task by id. A call with an id
/// counts only once its result is in and is not an error (a client that
/// refused the call, a task it did not find); `M` is what the caller keeps
/// of the call (its turn, seq) and gets back when it counts.
#[derive(Clone, Debug)]
pub struct TaskBook<M> {
    items: Vec<TaskItem>,
    pending: std::collections::HashMap<String, (PendingTask, M)>,
}

impl<M> Default for TaskBook<M> {
    fn default() -> Self {
        TaskBook {
            items: Vec::new(),
            pending: std::collections::HashMap::new(),
        }
    }
}

impl<M> TaskBook<M> {
    /// Take a call: `Some(meta)` when it changed the list now (a call
    /// without an id, which no result can answer), else held for its
    /// result when it is a task call.
    pub fn call(&mut self, c: &CallFacts, meta: M) -> Option<M> {
        let op = match (&c.todos, &c.task) {
            (Some(l), _) => PendingTask::List(l.clone()),
            (None, Some(op)) => PendingTask::Op(op.clone()),
            (None, None) => return None,
        };
        match &c.id {
            Some(id) => {
                self.pending.insert(id.clone(), (op, meta));
                None
            }
            None => self.apply(op, None).then_some(meta),
        }
    }

    /// Take a result: the held call's `meta` when it changed the list.
    pub fn result(&mut self, r: &ResultFacts) -> Option<M> {
        let (op, meta) = self.pending.remove(r.id.as_deref()?)?;
        if r.is_error {
            return None;
        }
        self.apply(op, r.task.as_ref()).then_some(meta)
    }

    fn apply(&mut self, op: PendingTask, ack: Option<&TaskAck>) -> bool {
        match op {
            PendingTask::List(l) => {
                self.items = l
                    .into_iter()
                    .map(|(subject, status)| TaskItem {
                        id: None,
                        subject,
                        status,
                    })
                    .collect();
                true
            }
            PendingTask::Op(TaskOp::Create { subject }) => {
                let Some(TaskAck::Created(id)) = ack else {
                    return false;
                };
                self.items.retain(|t| t.id.as_ref() != Some(id));
                self.items.push(TaskItem {
                    id: Some(id.clone()),
                    subject,
                    status: "pending".into(),
                });
                true
            }
            PendingTask::Op(TaskOp::Update {
                id,
                subject,
                status,
            }) => {
                if ack != Some(&TaskAck::Updated) {
                    return false;
                }
                let i = match self.items.iter().position(|t| t.id.as_ref() == Some(&id)) {
                    Some(i) => i,
                    None => {
                        // Made before what was read (a task list kept on disk).
                        self.items.push(TaskItem {
                            id: Some(id.clone()),
                            subject: format!("task #{id}"),
                            status: "pending".into(),
                        });
                        self.items.len() - 1
                    }
                };
                if status.as_deref() == Some("deleted") {
                    self.items.remove(i);
                    return true;
                }
                let t = &mut self.items[i];
                if let Some(s) = subject {
                    t.subject = s;
                }
                if let Some(s) = status {
                    t.status = s;
                }
                true
            }
        }
    }

    /// `(content, status)` in the agent's order (a task with an id reads
    /// `#ID subject`, the id the agent's `TaskUpdate` names).
    pub fn items(&self) -> Vec<(String, String)> {
        self.items
            .iter()
            .map(|t| {
                let content = match &t.id {
                    Some(id) => format!("#{id} {}", t.subject),
                    None => t.subject.clone(),
                };
                (content, t.status.clone())
            })
            .collect()
    }
}

/// The session's working directory a row states: Claude Code's
/// environment (`Primary working directory: /dir`, older `Working
/// directory: /dir`), Codex's `<cwd>/dir</cwd>`. Only an absolute path.
pub fn cwd_of(dialect: Dialect, raw: &str) -> Option<String> {
    if !(raw.contains("orking directory: ") || raw.contains("<cwd>")) {
        return None;
    }
    crate::transcript::message_texts(dialect, raw)
        .iter()
        .find_map(|t| {
            let from_tag = t
                .split_once("<cwd>")
                .and_then(|(_, r)| r.split_once("</cwd>"))
                .map(|(d, _)| d);
            let from_line = || {
                t.lines().find_map(|l| {
                    let l = l.trim_start_matches([' ', '-', '\t']);
                    l.strip_prefix("Primary working directory: ")
                        .or_else(|| l.strip_prefix("Working directory: "))
                })
            };
            from_tag.or_else(from_line).map(str::trim)
        })
        .filter(|d| d.starts_with('/'))
        .map(|d| d.trim_end_matches('/').to_string())
}

/// `path` as an absolute path: a relative one (what an agent writes in a
/// shell command, `./build.log`, `src/a.rs`, `../x`) joined to `cwd`, `.`
/// and `..` resolved by name; an absolute path, `~/…`, or any path without
/// a `cwd` as written.
pub fn resolve_path(cwd: Option<&str>, path: &str) -> String {
    let Some(cwd) = cwd else {
        return path.to_string();
    };
    if path.starts_with('/') || path.starts_with('~') {
        return path.to_string();
    }
    let mut parts: Vec<&str> = cwd.split('/').filter(|p| !p.is_empty()).collect();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Claude Code's marker after a tool call the user interrupted.
pub const INTERRUPTED: &str = "[Request interrupted by user";

/// Whether a text part of a tool-result message is words the user typed:
/// not empty, not a wrapper (`<system-reminder>`, ...), not Claude Code's
/// [`INTERRUPTED`] marker.
pub fn is_typed_text(t: &str) -> bool {
    let t = t.trim_start();
    !t.is_empty() && !t.starts_with('<') && !t.starts_with(INTERRUPTED)
}

/// The ask a tool-result row carries: Claude Code folds a prompt typed
/// after an interrupted tool call into the message that answers the call
/// (`[tool_result, "[Request interrupted by user for tool use]", ask]`).
/// Its first typed text part ([`is_typed_text`]), squashed and clipped to
/// [`ASK_MAX`].
pub fn typed_after_results(dialect: Dialect, raw: &str) -> Option<String> {
    let texts = crate::transcript::message_texts(dialect, raw);
    let t = texts.iter().find(|t| is_typed_text(t))?;
    Some(squash_clip(t, ASK_MAX))
}

/// The ask of a prompt row: its first text that is not a wrapper
/// (`<system-reminder>`, ...), else its first text; squashed and clipped to
/// [`ASK_MAX`].
pub fn ask_text(dialect: Dialect, raw: &str) -> Option<String> {
    let texts = crate::transcript::message_texts(dialect, raw);
    let text = texts
        .iter()
        .find(|t| !t.trim().is_empty() && !t.trim_start().starts_with('<'))
        .or_else(|| texts.iter().find(|t| !t.trim().is_empty()))?;
    Some(squash_clip(text, ASK_MAX))
}

/// Whitespace runs (newlines included) collapsed to one space, trimmed.
pub fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `clip(&squash(s), max)`, reading `s` only as far as the clip: a long
/// output or heredoc is not joined whole to keep its first line.
pub fn squash_clip(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    for w in s.split_whitespace() {
        if chars > 0 {
            out.push(' ');
            chars += 1;
        }
        out.push_str(w);
        chars += w.chars().count();
        if chars > max {
            return clip(&out, max);
        }
    }
    out
}

/// At most `max` characters (`…` marks a cut).
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

// ---------------------------------------------------------------------------
// Shell commands

/// Programs whose file arguments a command reads, and the ones it writes.
const READERS: &[&str] = &[
    "cat", "head", "tail", "nl", "less", "more", "bat", "wc", "sed", "awk", "diff", "cmp",
];

/// `(verb, path)` of the files a shell command reads (`cat`, `sed -n`,
/// `head`, ...), creates (`> file`, `tee`, `touch`), edits (`sed -i`) or
/// deletes (`rm`). A heuristic over simple commands: a path is a word with
/// a `/` or a `.`, no glob or variable, not a flag.
pub fn shell_refs(cmd: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |verb: &str, p: &str| {
        if is_pathlike(p) && !out.iter().any(|(v, q)| v == verb && q == p) {
            out.push((verb.to_string(), p.to_string()));
        }
    };
    for seg in segments(cmd) {
        if !seg.contains('>') && !runs_a_file_program(&seg) {
            continue;
        }
        let words = words(&seg);
        let mut args: Vec<&str> = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let w = words[i].as_str();
            if let Some(t) = w.strip_prefix(">>").or_else(|| w.strip_prefix('>')) {
                let target = if t.is_empty() {
                    i += 1;
                    words.get(i).map(String::as_str).unwrap_or("")
                } else {
                    t
                };
                if !target.starts_with('&') {
                    push("redirect", target);
                }
            } else if w == "2>" || w == "<" {
                i += 1;
            } else if !(w.starts_with("2>") || w.starts_with('<')) {
                args.push(w);
            }
            i += 1;
        }
        // Leading `VAR=value` assignments and wrappers.
        while let Some(a) = args.first() {
            if is_command_prefix(a) {
                args.remove(0);
            } else {
                break;
            }
        }
        let Some((prog, rest)) = args.split_first() else {
            continue;
        };
        let prog = prog.rsplit('/').next().unwrap_or(prog);
        let operands: Vec<&str> = rest
            .iter()
            .copied()
            .filter(|a| !a.starts_with('-'))
            .collect();
        match prog {
            "sed" => {
                let in_place = rest.iter().any(|a| a.starts_with("-i"));
                let scripted = rest.iter().any(|a| *a == "-e" || *a == "-f");
                let files = if scripted {
                    &operands[..]
                } else {
                    operands.get(1..).unwrap_or(&[])
                };
                for f in files {
                    push(if in_place { "sed -i" } else { "read" }, f);
                }
            }
            "touch" => operands.iter().for_each(|f| push("touch", f)),
            "tee" => operands.iter().for_each(|f| push("tee", f)),
            "rm" => operands.iter().for_each(|f| push("rm", f)),
            "awk" => {
                for f in operands.get(1..).unwrap_or(&[]) {
                    push("read", f);
                }
            }
            p if READERS.contains(&p) => operands.iter().for_each(|f| push("read", f)),
            _ => {}
        }
    }
    out
}

/// Whether a simple command's program is one whose operands
/// [`shell_refs`] reads: its words are read only up to the program (past
/// `<` inputs, `VAR=value` assignments and wrappers), as `shell_refs` reads
/// them. A command with a redirection (`>`) is read whole instead.
fn runs_a_file_program(seg: &str) -> bool {
    let mut words = Words::new(seg);
    while let Some(w) = words.next() {
        if w == "<" {
            words.next();
            continue;
        }
        if w.starts_with('<') || is_command_prefix(&w) {
            continue;
        }
        let prog = w.rsplit('/').next().unwrap_or(&w);
        return matches!(prog, "sed" | "touch" | "tee" | "rm" | "awk") || READERS.contains(&prog);
    }
    false
}

/// A word before a command's program: a `VAR=value` assignment or a
/// wrapper (`sudo`, `time`, `env`).
fn is_command_prefix(w: &str) -> bool {
    w.contains('=') && !w.starts_with('-') || matches!(w, "sudo" | "time" | "env")
}

/// A command split at `&&`, `||`, `;`, `|` and newlines (outside quotes);
/// a heredoc's body is dropped.
///
/// Read byte by byte: every byte it looks at is ASCII, and what it drops
/// (the `<<` and its tag, a heredoc's lines, the separators) ends at an
/// ASCII byte, so each segment is whole UTF-8.
fn segments(cmd: &str) -> Vec<String> {
    let b = cmd.as_bytes();
    let mut out = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let mut quote: Option<u8> = None;
    let mut heredoc: Option<Vec<u8>> = None;
    let mut lines_skip = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if lines_skip {
            // Inside a heredoc body: skip to its terminator line (the line
            // is `c` and what follows it up to the next newline).
            let end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |n| i + n);
            let line = std::str::from_utf8(&b[i - 1..end]).unwrap_or_default();
            i = (end + 1).min(b.len());
            if heredoc.as_deref() == Some(line.trim().as_bytes()) {
                lines_skip = false;
                heredoc = None;
            }
            continue;
        }
        match quote {
            Some(q) => {
                cur.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                b'\'' | b'"' => {
                    quote = Some(c);
                    cur.push(c);
                }
                b'<' if b.get(i) == Some(&b'<') => {
                    i += 1;
                    let mut tag = Vec::new();
                    while let Some(&n) = b.get(i) {
                        if n == b'\n' || n == b' ' && !tag.is_empty() {
                            break;
                        }
                        i += 1;
                        if !matches!(n, b'\'' | b'"' | b'-' | b' ') {
                            tag.push(n);
                        }
                    }
                    heredoc = Some(tag);
                }
                b';' | b'|' | b'&' | b'\n' => {
                    if c == b'\n' && heredoc.is_some() {
                        lines_skip = true;
                    }
                    if c == b'&' && cur.ends_with(b">") {
                        cur.push(c);
                        continue;
                    }
                    if matches!(c, b'|' | b'&') && b.get(i) == Some(&c) {
                        i += 1;
                    }
                    out.push(utf8(std::mem::take(&mut cur)));
                }
                c => cur.push(c),
            },
        }
    }
    out.push(utf8(cur));
    out.retain(|s| !s.trim().is_empty());
    out
}

/// Bytes cut from a `str` at ASCII bytes, as text.
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Shell words of one simple command (quotes removed).
fn words(seg: &str) -> Vec<String> {
    Words::new(seg).collect()
}

/// [`words`], one at a time: the program of a command is its first words,
/// and most commands name no file.
struct Words<'a> {
    chars: std::str::Chars<'a>,
    done: bool,
}

impl<'a> Words<'a> {
    fn new(seg: &'a str) -> Self {
        Words {
            chars: seg.chars(),
            done: false,
        }
    }
}

impl Iterator for Words<'_> {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let mut cur = String::new();
        let mut quote: Option<char> = None;
        let mut any = false;
        for c in self.chars.by_ref() {
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => cur.push(c),
                None if c == '\'' || c == '"' => {
                    quote = Some(c);
                    any = true;
                }
                None if c.is_whitespace() => {
                    if !cur.is_empty() || any {
                        return Some(cur);
                    }
                    any = false;
                }
                None => cur.push(c),
            }
        }
        if self.done {
            return None;
        }
        self.done = true;
        (!cur.is_empty() || any).then_some(cur)
    }
}

fn is_pathlike(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('-')
        && !p.starts_with("/dev/")
        && !p.chars().any(|c| {
            c.is_whitespace() || matches!(c, '$' | '*' | '?' | '{' | '}' | '(' | ')' | '`' | '\\')
        })
        && (p.contains('/') || p.contains('.'))
        && !p
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, ',' | '.' | 'p' | '$'))
        && p.len() <= 512
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refs(cmd: &str) -> Vec<(String, String)> {
        shell_refs(cmd)
    }

    proptest::proptest! {
        #[test]
        fn squash_clip_is_clip_of_squash(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "a", "bc", "é", "日本", " ", "  ", "\n", "\t", "\u{a0}", "word", "…",
            ]), 0..40),
            max in 0usize..12,
        ) {
            let s = pieces.concat();
            proptest::prop_assert_eq!(squash_clip(&s, max), clip(&squash(&s), max));
        }
    }

    #[test]
    fn shell_reads_and_writes() {
        assert_eq!(
            refs("sed -n '1,200p' src/main.rs"),
            vec![("read".into(), "src/main.rs".into())]
        );
        assert_eq!(
            refs("nl -ba crates/x/lib.rs | sed -n 40,80p"),
            vec![("read".into(), "crates/x/lib.rs".into())]
        );
        assert_eq!(
            refs("cd /repo && cat Cargo.toml README.md 2>/dev/null"),
            vec![
                ("read".into(), "Cargo.toml".into()),
                ("read".into(), "README.md".into())
            ]
        );
        assert_eq!(
            refs("echo hi > notes/out.txt; rm -f old.log"),
            vec![
                ("redirect".into(), "notes/out.txt".into()),
                ("rm".into(), "old.log".into())
            ]
        );
        assert_eq!(
            refs("sed -i 's/a/b/' src/lib.rs"),
            vec![("sed -i".into(), "src/lib.rs".into())]
        );
        assert_eq!(refs("cargo test 2>&1 | tail -20"), vec![]);
        assert_eq!(refs("ls -la"), vec![]);
        assert_eq!(
            refs("cat > src/new.py <<'EOF'\nimport os\nprint(1)\nEOF\npython3 src/new.py"),
            vec![("redirect".into(), "src/new.py".into())]
        );
    }

    #[test]
    fn tool_shapes() {
        let f = |name: &str, v: Value| file_refs(name, &v);
        assert_eq!(
            f("Read", json!({"file_path": "/r/a.rs"})),
            vec![("read".into(), "/r/a.rs".into())]
        );
        assert_eq!(
            f(
                "str_replace_editor",
                json!({"command": "create", "path": "b.py", "file_text": ""})
            ),
            vec![("create".into(), "b.py".into())]
        );
        assert_eq!(
            f("exec_command", json!({"cmd": "cat src/x.rs"})),
            vec![("read".into(), "src/x.rs".into())]
        );
        assert_eq!(
            f(
                "shell",
                json!({"command": ["bash", "-lc", "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a/b.rs\n@@\n-x\n+y\n*** End Patch\nEOF"]})
            ),
            vec![("update".into(), "a/b.rs".into())]
        );
        assert_eq!(Touch::of_verb("multiedit"), Touch::Edited);
        assert_eq!(Touch::of_verb("notebookedit"), Touch::Edited);
        assert_eq!(Touch::of_verb("write"), Touch::Created);
        assert_eq!(Touch::of_verb("read"), Touch::Read);
        assert_eq!(Touch::of_verb("update"), Touch::Edited);
        assert_eq!(Touch::of_verb("grep"), Touch::Searched);
    }

    #[test]
    fn working_directory_and_relative_paths() {
        let d = Dialect::Anthropic;
        let cc = json!({"role":"system","content":[{"type":"text","text":"# Environment\nYou have been invoked in the following environment: \n - Primary working directory: /home/dev/proj\n - Is a git repository: false"}]}).to_string();
        assert_eq!(cwd_of(d, &cc).as_deref(), Some("/home/dev/proj"));
        let codex = json!({"role":"user","content":[{"type":"input_text","text":"<environment_context>\n  <cwd>/repo/x/</cwd>\n  <shell>bash</shell>\n</environment_context>"}]}).to_string();
        assert_eq!(
            cwd_of(Dialect::OpenaiResponses, &codex).as_deref(),
            Some("/repo/x")
        );
        let ask = json!({"role":"user","content":"fix the build"}).to_string();
        assert_eq!(cwd_of(d, &ask), None);
        let c = Some("/home/dev/proj");
        assert_eq!(resolve_path(c, "./build.log"), "/home/dev/proj/build.log");
        assert_eq!(resolve_path(c, "src/a.rs"), "/home/dev/proj/src/a.rs");
        assert_eq!(resolve_path(c, "../other/b.rs"), "/home/dev/other/b.rs");
        assert_eq!(resolve_path(c, "/etc/hosts"), "/etc/hosts");
        assert_eq!(resolve_path(None, "./build.log"), "./build.log");
    }

    #[test]
    fn todo_lists() {
        let v = json!({"plan": [{"step": "a", "status": "completed"}, {"step": "b"}]});
        assert_eq!(
            todos_of(&v),
            Some(vec![
                ("a".into(), "completed".into()),
                ("b".into(), "pending".into())
            ])
        );
    }
}
