//! The state block: what the engine knows of the rows that left the window,
//! rendered right after the stub at every cut. PURE (facts in → text out),
//! and a function of the rows up to the cut only, so its bytes stay the
//! same until the next cut (the provider's prompt cache is unaffected) and
//! a restart or `ledger rebuild` gives the same bytes from the same rows.
//!
//! It says, never summarizes: the goal (the session's first ask, and the
//! newest ask that left the window), the latest task list as the agent
//! wrote it, the files touched in the cut part (newest first: path, how,
//! turn and seq of the last touch), the commands that failed and have not
//! since succeeded, and where to look: the transcript file and line range
//! of every cut block ([`crate::transcript::LineIndex`]) and the recall
//! command. Facts come from [`crate::facts`], the reading `SESSION.md`
//! shares.

use crate::facts::{clip, squash, RowFacts, Touch};
use crate::paths::turn_file_name;
use crate::transcript::{code, one_line, RowLines};
use std::collections::HashMap;
use std::fmt::Write as _;

/// The default budget (tokens).
pub const DEFAULT_MAX_TOKENS: u32 = 2_000;
/// Bytes per ten tokens the budget assumes: a fixed ratio (a learned one
/// would change the bytes between cuts), low because paths and numbers
/// tokenize short (o200k: ~2.5 bytes a token on a block of paths).
pub const BYTES_PER_TEN_TOKENS: usize = 24;
/// A transcript range is at most this many lines (Claude Code's `Read`
/// reads 2,000 lines by default): a long turn is named in pieces.
pub const RANGE_LINES: u32 = 2_000;
/// Most failed commands listed.
pub const MAX_FAILED: usize = 20;
/// The first line of every state block.
pub const HEAD: &str = "[State at the tideline: facts the proxy recorded from the rows that left this window (engine-written, not a summary).]";

/// An ask: its turn, seq and text (already clipped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// Turn.
    pub turn: u32,
    /// Seq of its row.
    pub seq: u64,
    /// The text.
    pub text: String,
}

#[derive(Clone, Debug)]
struct FileTouch {
    path: String,
    touches: Vec<Touch>,
    turn: u32,
    seq: u64,
}

#[derive(Clone, Debug)]
struct Failed {
    cmd: String,
    exit: Option<i64>,
    turn: u32,
    seq: u64,
}

/// The latest task list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tasks {
    /// Turn of the call that wrote it.
    pub turn: u32,
    /// Seq of its row.
    pub seq: u64,
    /// `(content, status)` in the agent's order.
    pub items: Vec<(String, String)>,
}

/// The facts folded over rows, in seq order ([`StateFacts::add`]).
#[derive(Clone, Debug, Default)]
pub struct StateFacts {
    files: Vec<FileTouch>,
    file_index: HashMap<String, usize>,
    failed: Vec<Failed>,
    tasks: Option<Tasks>,
    /// Call id → (command, seq, turn) until its result.
    calls: HashMap<String, (String, u64, u32)>,
}

impl StateFacts {
    /// Empty.
    pub fn new() -> StateFacts {
        StateFacts::default()
    }

    /// Fold one row (rows in seq order).
    pub fn add(&mut self, seq: u64, turn: u32, facts: &RowFacts) {
        for c in &facts.calls {
            for (verb, path) in &c.files {
                let touch = Touch::of_verb(verb);
                match self.file_index.get(path) {
                    Some(&i) => {
                        let f = &mut self.files[i];
                        if !f.touches.contains(&touch) {
                            f.touches.push(touch);
                            f.touches.sort();
                        }
                        f.turn = turn;
                        f.seq = seq;
                    }
                    None => {
                        self.file_index.insert(path.clone(), self.files.len());
                        self.files.push(FileTouch {
                            path: path.clone(),
                            touches: vec![touch],
                            turn,
                            seq,
                        });
                    }
                }
            }
            if let Some(items) = &c.todos {
                self.tasks = Some(Tasks {
                    turn,
                    seq,
                    items: items.clone(),
                });
            }
            if let (Some(id), Some(cmd)) = (&c.id, &c.command) {
                self.calls.insert(id.clone(), (cmd.clone(), seq, turn));
            }
        }
        for r in &facts.results {
            let Some((cmd, cseq, cturn)) = r.id.as_ref().and_then(|i| self.calls.remove(i)) else {
                continue;
            };
            let failed = r.is_error || r.exit.is_some_and(|e| e != 0);
            self.failed.retain(|f| f.cmd != cmd);
            if failed {
                self.failed.push(Failed {
                    cmd,
                    exit: r.exit,
                    turn: cturn,
                    seq: cseq,
                });
            }
        }
    }

    /// The latest task list folded in.
    pub fn tasks(&self) -> Option<&Tasks> {
        self.tasks.as_ref()
    }

    /// Every file path folded in, newest touch first.
    pub fn paths(&self) -> Vec<&str> {
        self.files_newest_first()
            .into_iter()
            .map(|f| f.path.as_str())
            .collect()
    }

    fn files_newest_first(&self) -> Vec<&FileTouch> {
        let mut v: Vec<&FileTouch> = self.files.iter().collect();
        v.sort_by(|a, b| b.seq.cmp(&a.seq).then_with(|| a.path.cmp(&b.path)));
        v
    }
}

/// Everything a state block shows.
#[derive(Clone, Debug)]
pub struct StateInput<'a> {
    /// Every row up to this seq left the window (what the stub names).
    pub upto_seq: u64,
    /// The session's ledger id (for the recall command).
    pub session: &'a str,
    /// The session's directory (where `transcript/` is).
    pub dir: &'a str,
    /// The session's first ask.
    pub goal: Option<Ask>,
    /// The newest ask, when it left the window and is not the first.
    pub latest_ask: Option<Ask>,
    /// The facts of the rows that left.
    pub facts: &'a StateFacts,
    /// Where each row that left is in its turn file, in seq order.
    pub lines: &'a [RowLines],
}

/// A range of one turn file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// Turn (its file is `transcript/NNNN.md`).
    pub turn: u32,
    /// First and last seq.
    pub seqs: (u64, u64),
    /// First and last line (1-based, inclusive).
    pub lines: (u32, u32),
}

/// The rows' positions grouped into ranges: one per turn, a long turn in
/// pieces of at most [`RANGE_LINES`] lines (a row longer than that alone).
pub fn ranges(lines: &[RowLines]) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    for r in lines {
        match out.last_mut() {
            Some(g) if g.turn == r.turn && r.last - g.lines.0 < RANGE_LINES => {
                g.seqs.1 = r.seq;
                g.lines.1 = r.last;
            }
            _ => out.push(Range {
                turn: r.turn,
                seqs: (r.seq, r.seq),
                lines: (r.first, r.last),
            }),
        }
    }
    out
}

/// `("dir/", "name")` of a path (`("", path)` without a `/`).
fn split_path(p: &str) -> (&str, &str) {
    match p.rfind('/') {
        Some(i) => (&p[..=i], &p[i + 1..]),
        None => ("", p),
    }
}

fn span(a: u64, b: u64) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}–{b}")
    }
}

fn status_mark(status: &str) -> &'static str {
    match status {
        "completed" | "done" => "[x]",
        "in_progress" | "in-progress" => "[~]",
        "pending" | "todo" => "[ ]",
        _ => "[-]",
    }
}

/// Render the block within `max_tokens` (at [`BYTES_PER_TEN_TOKENS`]): the goal,
/// the tasks and where to look always; files newest first and failed
/// commands as far as the budget goes (what does not fit is counted, and is
/// in `SESSION.md` and the transcripts). `None` when there is nothing to say.
pub fn render(input: &StateInput<'_>, max_tokens: u32) -> Option<String> {
    let f = input.facts;
    if input.goal.is_none() && f.files.is_empty() && f.tasks.is_none() && input.lines.is_empty() {
        return None;
    }
    let budget = max_tokens as usize * BYTES_PER_TEN_TOKENS / 10;
    let dir = input
        .dir
        .strip_suffix('/')
        .filter(|d| !d.is_empty())
        .unwrap_or(input.dir);
    let mut head = String::from(HEAD);
    if let Some(g) = &input.goal {
        let _ = write!(
            head,
            "\nGoal (t{:02}, seq {}): {}",
            g.turn,
            g.seq,
            one_line(&g.text)
        );
    }
    if let Some(a) = &input.latest_ask {
        let _ = write!(
            head,
            "\nLatest ask that left (t{:02}, seq {}): {}",
            a.turn,
            a.seq,
            one_line(&a.text)
        );
    }
    if let Some(t) = &f.tasks {
        let _ = write!(
            head,
            "\nTasks (as last written, t{:02} seq {}; a newer list in the window wins):",
            t.turn, t.seq
        );
        for (content, status) in &t.items {
            let _ = write!(
                head,
                "\n- {} {}",
                status_mark(status),
                clip(&squash(content), crate::facts::LINE_MAX)
            );
            if !matches!(status.as_str(), "completed" | "in_progress" | "pending") {
                let _ = write!(head, " ({})", one_line(status));
            }
        }
    }
    // Where to look: always whole.
    let mut tail = format!("\nWhere to look (the verbatim rows, in {dir}/transcript/):");
    for r in ranges(input.lines) {
        let _ = write!(
            tail,
            "\n- {} lines {}: seq {} (t{:02})",
            turn_file_name(r.turn),
            span(u64::from(r.lines.0), u64::from(r.lines.1)),
            span(r.seqs.0, r.seqs.1),
            r.turn
        );
    }
    let _ = write!(
        tail,
        "\n- oceancode-proxy recall {} --before {} --match TEXT",
        one_line(input.session),
        input.upto_seq + 1
    );
    // Files and failed commands share what is left.
    let mut room = budget.saturating_sub(head.len() + tail.len());
    let mut middle = String::new();
    let mut failed_text = String::new();
    if !f.failed.is_empty() {
        let title = "\nFailed, not since succeeded:";
        let mut body = String::new();
        let mut shown = 0;
        for c in f.failed.iter().rev().take(MAX_FAILED) {
            let exit = c
                .exit
                .map_or_else(|| "error".to_string(), |e| format!("exit {e}"));
            let line = format!("\n- {} → {exit} t{:02} seq {}", code(&c.cmd), c.turn, c.seq);
            // At most a quarter of the room: the files keep the rest.
            if title.len() + body.len() + line.len() > room / 4 {
                break;
            }
            body.push_str(&line);
            shown += 1;
        }
        if shown > 0 {
            failed_text.push_str(title);
            failed_text.push_str(&body);
        }
    }
    room = room.saturating_sub(failed_text.len());
    let files = f.files_newest_first();
    if !files.is_empty() {
        let title = "\nFiles touched in the cut part (by directory, newest first; how and the turn and seq of the last touch):";
        // Directories in the order of their newest touch, files newest first.
        let mut dirs: Vec<(&str, Vec<&FileTouch>)> = Vec::new();
        for file in &files {
            let (d, _) = split_path(&file.path);
            match dirs.iter_mut().find(|(x, _)| *x == d) {
                Some((_, v)) => v.push(file),
                None => dirs.push((d, vec![file])),
            }
        }
        let mut body = String::new();
        let mut shown = 0;
        'dirs: for (d, group) in &dirs {
            // One turn for the whole directory: said once, in its head.
            let one_turn = group.iter().all(|f| f.turn == group[0].turn);
            let dname = if d.is_empty() {
                "./".to_string()
            } else {
                one_line(d)
            };
            let head = if one_turn {
                format!("\n- {dname} (t{:02}):", group[0].turn)
            } else {
                format!("\n- {dname}:")
            };
            let mut line = String::new();
            for file in group {
                let (_, name) = split_path(&file.path);
                let how: Vec<&str> = file.touches.iter().map(|t| t.as_str()).collect();
                let at = if one_turn {
                    file.seq.to_string()
                } else {
                    format!("t{:02}·{}", file.turn, file.seq)
                };
                let entry = format!(" {} ({} {at});", one_line(name), how.join("+"));
                let need = title.len() + body.len() + head.len() + line.len() + entry.len() + 48;
                if need > room {
                    if !line.is_empty() {
                        body.push_str(&head);
                        body.push_str(line.trim_end_matches(';'));
                    }
                    break 'dirs;
                }
                line.push_str(&entry);
                shown += 1;
            }
            body.push_str(&head);
            body.push_str(line.trim_end_matches(';'));
        }
        middle.push_str(title);
        middle.push_str(&body);
        if files.len() > shown {
            let _ = write!(
                middle,
                "\n- … {} older file{} in SESSION.md",
                files.len() - shown,
                if files.len() - shown == 1 { "" } else { "s" }
            );
        }
    }
    let mut out = head;
    out.push_str(&middle);
    out.push_str(&failed_text);
    out.push_str(&tail);
    Some(out)
}

/// Estimated tokens of a block (at [`BYTES_PER_TEN_TOKENS`]).
pub fn tokens(block: &str) -> u32 {
    (block.len() * 10).div_ceil(BYTES_PER_TEN_TOKENS) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::row_facts;
    use crate::model::Dialect;

    fn call(id: &str, name: &str, input: serde_json::Value) -> String {
        serde_json::json!({"role":"assistant","content":[{"type":"tool_use","id":id,"name":name,"input":input}]}).to_string()
    }

    fn result(id: &str, text: &str) -> String {
        serde_json::json!({"role":"user","content":[{"type":"tool_result","tool_use_id":id,"content":text}]}).to_string()
    }

    #[test]
    fn folds_files_tasks_and_failures() {
        let d = Dialect::Anthropic;
        let rows = [
            call("a", "Read", serde_json::json!({"file_path": "src/a.rs"})),
            result("a", "fn main() {}"),
            call("b", "Bash", serde_json::json!({"command": "cargo test"})),
            result("b", "Exit code 101\nfailed"),
            call(
                "c",
                "TodoWrite",
                serde_json::json!({"todos": [{"content": "fix a", "status": "in_progress"}, {"content": "docs", "status": "pending"}]}),
            ),
            call(
                "d",
                "Edit",
                serde_json::json!({"file_path": "src/a.rs", "old_string": "x", "new_string": "y"}),
            ),
            call("e", "Bash", serde_json::json!({"command": "cargo build"})),
            result("e", "Exit code 1"),
            call("f", "Bash", serde_json::json!({"command": "cargo build"})),
            result("f", "ok"),
        ];
        let mut facts = StateFacts::new();
        for (i, r) in rows.iter().enumerate() {
            facts.add(i as u64 + 1, 1, &row_facts(d, r));
        }
        assert_eq!(facts.paths(), vec!["src/a.rs"]);
        let lines: Vec<RowLines> = (1..=10)
            .map(|s| RowLines {
                seq: s,
                turn: 1,
                first: (s as u32) * 10,
                last: (s as u32) * 10 + 8,
            })
            .collect();
        let input = StateInput {
            upto_seq: 10,
            session: "s1",
            dir: "/d/s1",
            goal: Some(Ask {
                turn: 1,
                seq: 1,
                text: "Fix the bug".into(),
            }),
            latest_ask: None,
            facts: &facts,
            lines: &lines,
        };
        let block = render(&input, DEFAULT_MAX_TOKENS).unwrap();
        assert!(block.starts_with(HEAD));
        assert!(block.contains("Goal (t01, seq 1): Fix the bug"));
        assert!(block.contains("- [~] fix a\n- [ ] docs"));
        assert!(
            block.contains("- src/ (t01): a.rs (read+edited 6)"),
            "{block}"
        );
        assert!(
            block.contains("- `cargo test` → exit 101 t01 seq 3"),
            "{block}"
        );
        assert!(
            !block.contains("cargo build"),
            "it succeeded since: {block}"
        );
        assert!(block.contains("in /d/s1/transcript/):\n- 0001.md lines 10–108: seq 1–10 (t01)"));
        assert!(block.contains("oceancode-proxy recall s1 --before 11 --match TEXT"));
        assert_eq!(
            Some(block.clone()),
            render(&input, DEFAULT_MAX_TOKENS),
            "pure"
        );
        // A tight budget keeps the goal, tasks and ranges and counts the files.
        let small = render(&input, 100).unwrap();
        assert!(small.contains("1 older file in SESSION.md"), "{small}");
        assert!(small.contains("- 0001.md lines"));
    }

    #[test]
    fn a_long_turn_is_named_in_read_sized_pieces() {
        let lines: Vec<RowLines> = (0..50u32)
            .map(|i| RowLines {
                seq: u64::from(i) + 1,
                turn: 1,
                first: 2 + i * 100,
                last: 100 + i * 100,
            })
            .collect();
        let r = ranges(&lines);
        assert!(r.len() >= 3, "{r:?}");
        for g in &r {
            assert!(g.lines.1 - g.lines.0 < RANGE_LINES);
        }
        assert_eq!(r[0].lines.0, 2);
        assert_eq!(r.last().unwrap().lines.1, 5000);
        for w in r.windows(2) {
            assert_eq!(w[0].seqs.1 + 1, w[1].seqs.0);
        }
    }
}
