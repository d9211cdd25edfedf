//! `SESSION.md`, the living page: PURE folding and rendering, so the writer
//! and `ledger rebuild` produce the same bytes from the same database.
//!
//! The engine writes what the rows already say: the goal (the first ask),
//! files touched (tool inputs with paths, `apply_patch` headers), commands
//! and their exit codes, tasks (`TodoWrite`, `update_plan`, Claude Code's
//! `TaskCreate`/`TaskUpdate` by id; a call the client refused counts for
//! nothing), tool errors and
//! a log line per turn (per block of a long turn). Rows are folded block by
//! block as soon as they are past the tideline, at each recorded cut
//! ([`Page::merge_turn`]), so a long headless turn has its facts on the page
//! after its first cut. Every line is stamped with its turn (`t07`). The page is edited, never rewritten: a merge only
//! adds lines, fills a pending exit code, or strikes a reversed line through
//! (`~~old~~`: a task whose status changed, an error a later run of the same
//! command fixed, a fact from rows a rewind hid). Optional model-merged notes
//! (Decisions, Environment, ...) are stored in the database and rendered in
//! their own sections.

use crate::facts::{
    command_of, file_refs, resolve_path, task_ack, task_op, todos_of, CallFacts, ResultFacts,
    TaskBook,
};
use crate::model::{Dialect, Row, RowKind};
use crate::parts::{self, Part};
use crate::transcript::{self, code, one_line};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Sections a model merge may write, in page order.
pub const NOTE_SECTIONS: &[&str] = &[
    "Decisions",
    "Environment",
    "Errors and fixes",
    "Code map",
    "Open questions",
    "Next step",
];
/// Longest goal kept (characters).
pub const GOAL_MAX: usize = 300;
/// Longest command, task or error text kept on a line (characters).
pub const LINE_MAX: usize = crate::facts::LINE_MAX;

/// One model-merged line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// One of [`NOTE_SECTIONS`].
    pub section: String,
    /// Turn it is stamped with.
    pub turn: u32,
    /// The line (one line).
    pub text: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Status {
    Pending,
    Exit(i64),
    Ok,
    Error,
}

#[derive(Clone, Debug)]
struct Command {
    turn: u32,
    cmd: String,
    status: Status,
    rewound: bool,
}

#[derive(Clone, Debug)]
struct File {
    turn: u32,
    path: String,
    verbs: Vec<String>,
    rewound: bool,
}

#[derive(Clone, Debug)]
struct Task {
    turn: u32,
    content: String,
    status: String,
    struck: bool,
}

#[derive(Clone, Debug)]
struct Error {
    turn: u32,
    tool: String,
    what: Option<String>,
    text: String,
    fixed_in: Option<u32>,
    rewound: bool,
}

#[derive(Clone, Debug)]
struct Log {
    turn: u32,
    first_seq: u64,
    last_seq: u64,
    first_line: String,
    tool_calls: u32,
    errors: u32,
}

#[derive(Clone, Debug)]
struct Call {
    tool: String,
    command: Option<usize>,
    what: Option<String>,
}

/// The folded state of one session's page.
#[derive(Clone, Debug, Default)]
pub struct Page {
    goal: Option<(u32, String)>,
    merged_through: u32,
    whole_through: u32,
    merged_upto_seq: u64,
    files: Vec<File>,
    commands: Vec<Command>,
    tasks: Vec<Task>,
    errors: Vec<Error>,
    log: Vec<Log>,
    notes: Vec<Note>,
    calls: HashMap<String, Call>,
    task_index: HashMap<String, usize>,
    /// Task calls folded (a call counts once its result is in; the turn of
    /// the call).
    book: TaskBook<u32>,
    /// The session's working directory (relative paths resolve against it).
    cwd: Option<String>,
}

impl Page {
    /// An empty page.
    pub fn new() -> Page {
        Page::default()
    }

    /// The last turn folded in, wholly or in part (0 = none).
    pub fn merged_through(&self) -> u32 {
        self.merged_through
    }

    /// The last seq folded in (0 = none).
    pub fn merged_upto_seq(&self) -> u64 {
        self.merged_upto_seq
    }

    /// Every row up to `seq` is folded in (a block past the tideline).
    pub fn set_merged_upto(&mut self, seq: u64) {
        self.merged_upto_seq = self.merged_upto_seq.max(seq);
    }

    /// The last turn wholly past the tideline (what a model merge may take).
    pub fn whole_through(&self) -> u32 {
        self.whole_through
    }

    /// Set [`Page::whole_through`].
    pub fn set_whole_through(&mut self, turn: u32) {
        self.whole_through = self.whole_through.max(turn);
    }

    /// Whether a goal is set.
    pub fn has_goal(&self) -> bool {
        self.goal.is_some()
    }

    /// Whether the page has anything to show (a goal, a merged turn, a note).
    pub fn has_content(&self) -> bool {
        self.goal.is_some() || self.merged_through > 0 || !self.notes.is_empty()
    }

    /// Set the goal from the session's first ask (its raw prompt row).
    pub fn set_goal(&mut self, dialect: Dialect, turn: u32, raw: &str) {
        let goal = crate::facts::ask_text(dialect, raw).unwrap_or_default();
        self.goal = Some((turn, clip(&goal, GOAL_MAX)));
    }

    /// Add model-merged lines.
    pub fn add_notes(&mut self, notes: impl IntoIterator<Item = Note>) {
        self.notes.extend(notes);
    }

    /// Fold rows of one turn: `rows` are the turn's rows of one block past
    /// the tideline (all of the turn's rows in it, hidden ones too), in seq
    /// order with their `hidden` flag; blocks come in seq order. A long turn
    /// is folded block by block, each block with its own log line.
    pub fn merge_turn(&mut self, dialect: Dialect, turn: u32, rows: &[(Row, bool)]) {
        let mut log = Log {
            turn,
            first_seq: rows.first().map_or(0, |(r, _)| r.seq),
            last_seq: rows.last().map_or(0, |(r, _)| r.seq),
            first_line: transcript::prompt_first_line(
                dialect,
                rows.iter()
                    .filter(|(r, h)| !h && r.kind == RowKind::Prompt)
                    .map(|(r, _)| &*r.raw),
            ),
            tool_calls: 0,
            errors: 0,
        };
        for (row, hidden) in rows {
            let rewound = *hidden;
            if self.cwd.is_none() && row.kind != RowKind::Assistant {
                self.cwd = crate::facts::cwd_of(dialect, &row.raw);
            }
            for part in parts::parts(dialect, &row.raw) {
                match part {
                    Part::ToolCall { id, name, input } => {
                        if !rewound {
                            log.tool_calls += 1;
                        }
                        let mut what = None;
                        for (verb, path) in file_refs(&name, &input) {
                            let path = resolve_path(self.cwd.as_deref(), &path);
                            what.get_or_insert_with(|| path.clone());
                            match self
                                .files
                                .iter_mut()
                                .find(|f| f.turn == turn && f.path == path && f.rewound == rewound)
                            {
                                Some(f) => {
                                    if !f.verbs.contains(&verb) {
                                        f.verbs.push(verb);
                                    }
                                }
                                None => self.files.push(File {
                                    turn,
                                    path,
                                    verbs: vec![verb],
                                    rewound,
                                }),
                            }
                        }
                        let command = command_of(&name, &input).map(|cmd| {
                            what = Some(cmd.clone());
                            self.commands.push(Command {
                                turn,
                                cmd,
                                status: Status::Pending,
                                rewound,
                            });
                            self.commands.len() - 1
                        });
                        if !rewound {
                            let c = CallFacts {
                                id: id.clone(),
                                todos: todos_of(&input),
                                task: task_op(&name, &input),
                                ..CallFacts::default()
                            };
                            if let Some(t) = self.book.call(&c, turn) {
                                self.update_tasks(t, self.book.items());
                            }
                        }
                        if let Some(id) = id {
                            self.calls.insert(
                                id,
                                Call {
                                    tool: name,
                                    command,
                                    what,
                                },
                            );
                        }
                    }
                    Part::ToolResult { id, is_error, text } => {
                        if !rewound {
                            let r = ResultFacts {
                                id: id.clone(),
                                is_error,
                                exit: None,
                                task: task_ack(&text),
                            };
                            if let Some(t) = self.book.result(&r) {
                                self.update_tasks(t, self.book.items());
                            }
                        }
                        let call = id.as_deref().and_then(|i| self.calls.remove(i));
                        let code = parts::exit_code(&text);
                        let command = call.as_ref().and_then(|c| c.command);
                        if let Some(i) = command {
                            self.commands[i].status = match (code, is_error) {
                                (Some(c), _) => Status::Exit(c),
                                (None, true) => Status::Error,
                                (None, false) => Status::Ok,
                            };
                        }
                        let failed =
                            is_error || (command.is_some() && code.is_some_and(|c| c != 0));
                        if failed {
                            if !rewound {
                                log.errors += 1;
                            }
                            self.errors.push(Error {
                                turn,
                                tool: call.as_ref().map_or_else(String::new, |c| c.tool.clone()),
                                what: call.as_ref().and_then(|c| c.what.clone()),
                                text: error_line(&text),
                                fixed_in: None,
                                rewound,
                            });
                        } else if let (Some(i), false) = (command, rewound) {
                            let cmd = &self.commands[i].cmd;
                            for e in &mut self.errors {
                                if e.fixed_in.is_none()
                                    && !e.rewound
                                    && e.what.as_ref() == Some(cmd)
                                {
                                    e.fixed_in = Some(turn);
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        self.log.push(log);
        self.merged_through = self.merged_through.max(turn);
        if let Some((r, _)) = rows.last() {
            self.merged_upto_seq = self.merged_upto_seq.max(r.seq);
        }
    }

    fn update_tasks(&mut self, turn: u32, todos: Vec<(String, String)>) {
        for (content, status) in todos {
            if let Some(&i) = self.task_index.get(&content) {
                if self.tasks[i].status == status {
                    continue;
                }
                self.tasks[i].struck = true;
            }
            self.tasks.push(Task {
                turn,
                content: content.clone(),
                status,
                struck: false,
            });
            self.task_index.insert(content, self.tasks.len() - 1);
        }
    }

    /// Render `SESSION.md`.
    pub fn render(&self, session_id: &str) -> String {
        let mut out = format!("# SESSION {}\n\n", one_line(session_id));
        out.push_str(
            "<!-- Written by oceancode-proxy. Each line is stamped with its turn (tNN). \
             Lines are added or struck through (~~old~~), never rewritten. -->\n\n",
        );
        if self.merged_through == 0 {
            out.push_str("Merged: no row is past the tideline yet.\n");
        } else {
            let range = if self.merged_through == 1 {
                stamp(1)
            } else {
                format!("{}–{}", stamp(1), stamp(self.merged_through))
            };
            let _ = writeln!(
                out,
                "Merged: {range} (every row up to seq {} is past the tideline).",
                self.merged_upto_seq
            );
        }
        section(
            &mut out,
            "Goal",
            self.goal.iter().map(|(t, g)| format!("{} {g}", stamp(*t))),
        );
        for name in NOTE_SECTIONS {
            let lines: Vec<String> = self
                .notes
                .iter()
                .filter(|n| n.section == *name)
                .map(|n| format!("{} {}", stamp(n.turn), one_line(&n.text)))
                .collect();
            if !lines.is_empty() {
                section(&mut out, name, lines.into_iter());
            }
        }
        section(
            &mut out,
            "Files touched",
            self.files.iter().map(|f| {
                rewound(
                    format!(
                        "{} {} ({})",
                        stamp(f.turn),
                        code(&f.path),
                        f.verbs.join(", ")
                    ),
                    f.rewound,
                )
            }),
        );
        section(
            &mut out,
            "Commands",
            self.commands.iter().map(|c| {
                let status = match c.status {
                    Status::Pending => "…".to_string(),
                    Status::Exit(n) => format!("exit {n}"),
                    Status::Ok => "ok".to_string(),
                    Status::Error => "error".to_string(),
                };
                rewound(
                    format!("{} {} → {status}", stamp(c.turn), code(&c.cmd)),
                    c.rewound,
                )
            }),
        );
        section(
            &mut out,
            "Tasks",
            self.tasks.iter().map(|t| {
                let mark = match t.status.as_str() {
                    "completed" | "done" => "[x]",
                    "in_progress" | "in-progress" => "[~]",
                    "pending" | "todo" => "[ ]",
                    _ => "[-]",
                };
                let mut s = format!(
                    "{} {mark} {}",
                    stamp(t.turn),
                    squash_clip(&t.content, LINE_MAX)
                );
                if !matches!(t.status.as_str(), "completed" | "in_progress" | "pending") {
                    let _ = write!(s, " ({})", one_line(&t.status));
                }
                strike(s, t.struck)
            }),
        );
        section(
            &mut out,
            "Errors",
            self.errors.iter().map(|e| {
                let mut s = stamp(e.turn);
                if !e.tool.is_empty() {
                    s.push(' ');
                    s.push_str(&code(&e.tool));
                }
                if let Some(w) = &e.what {
                    s.push(' ');
                    s.push_str(&code(w));
                }
                if !e.text.is_empty() {
                    s.push_str(": ");
                    s.push_str(&e.text);
                }
                if e.rewound {
                    return rewound(s, true);
                }
                let mut s = strike(s, e.fixed_in.is_some());
                if let Some(t) = e.fixed_in {
                    let _ = write!(s, " fixed {}", stamp(t));
                }
                s
            }),
        );
        section(
            &mut out,
            "Log",
            self.log.iter().map(|l| {
                let mut s = format!("{} seq {}–{}", stamp(l.turn), l.first_seq, l.last_seq);
                if !l.first_line.is_empty() {
                    s.push_str(" · ");
                    s.push_str(&l.first_line);
                }
                let _ = write!(s, " · {} tool call{}", l.tool_calls, plural(l.tool_calls));
                if l.errors > 0 {
                    let _ = write!(s, ", {} error{}", l.errors, plural(l.errors));
                }
                s
            }),
        );
        out
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `t07`: a turn stamp (at least two digits, as in the stub).
pub fn stamp(turn: u32) -> String {
    format!("t{turn:02}")
}

/// A struck line for a fact whose rows a rewind hid: `~~line~~ rewound`.
fn rewound(line: String, rewound: bool) -> String {
    if rewound {
        format!("~~{line}~~ rewound")
    } else {
        line
    }
}

fn strike(line: String, struck: bool) -> String {
    if struck {
        format!("~~{line}~~")
    } else {
        line
    }
}

fn section(out: &mut String, title: &str, lines: impl Iterator<Item = String>) {
    let _ = write!(out, "\n## {title}\n\n");
    let mut any = false;
    for l in lines {
        any = true;
        out.push_str("- ");
        out.push_str(&l);
        out.push('\n');
    }
    if !any {
        out.push_str("_None yet._\n");
    }
}

pub(crate) use crate::facts::{clip, squash, squash_clip};

/// The first telling line of an error output (an `Exit code N` line skipped).
fn error_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default();
    let pick = if parts::exit_code(first).is_some() && first.len() < 40 {
        lines.next().unwrap_or(first)
    } else {
        first
    };
    squash_clip(pick, LINE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn commands_from_arrays() {
        let v = serde_json::json!({"command": ["bash", "-lc", "cargo test"]});
        assert_eq!(command_of("shell", &v).as_deref(), Some("cargo test"));
        assert_eq!(command_of("Read", &v), None);
    }

    #[test]
    fn patch_headers() {
        let v = Value::String(
            "*** Begin Patch\n*** Update File: src/a.rs\n@@\n*** Add File: b.txt\n".into(),
        );
        assert_eq!(
            file_refs("apply_patch", &v),
            vec![
                ("update".into(), "src/a.rs".into()),
                ("add".into(), "b.txt".into())
            ]
        );
    }
}
