//! The state block: what the engine knows of the rows that left the window,
//! rendered right after the stub at every cut. PURE (facts in → text out),
//! and a function of the rows up to the cut only, so its bytes stay the
//! same until the next cut (the provider's prompt cache is unaffected) and
//! a restart or `ledger rebuild` gives the same bytes from the same rows.
//!
//! It says, never summarizes: the goal (the session's first ask, and the
//! newest ask that left the window), the latest task list as the agent
//! wrote it (whole lists, and Claude Code's tasks folded by id; a call the
//! client answered with an error counts for nothing), the files touched in the cut part (newest first: path, how,
//! turn and seq of the last touch), the commands that failed and have not
//! since succeeded, and where to look: the transcript file and line range
//! of every cut block ([`crate::transcript::LineIndex`]) and the recall
//! command. Facts come from [`crate::facts`], the reading `SESSION.md`
//! shares.

use crate::facts::{RowFacts, TaskBook, Touch};
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
    /// The task calls folded so far (a call counts once its result is in).
    book: TaskBook<(u64, u32)>,
    /// Call id → (command, seq, turn) until its result.
    calls: HashMap<String, (String, u64, u32)>,
    /// The session's working directory: relative paths are resolved
    /// against it ([`crate::facts::resolve_path`]).
    cwd: Option<String>,
}

impl StateFacts {
    /// Empty.
    pub fn new() -> StateFacts {
        StateFacts::default()
    }

    /// The session's working directory (Claude Code's and Codex's
    /// environment, [`crate::facts::cwd_of`]): the relative paths of the
    /// rows folded after it are resolved against it, so a file touched
    /// through the shell and by its absolute path is one file.
    pub fn set_cwd(&mut self, cwd: Option<String>) {
        self.cwd = cwd;
    }

    /// Fold one row (rows in seq order).
    pub fn add(&mut self, seq: u64, turn: u32, facts: &RowFacts) {
        for c in &facts.calls {
            for (verb, path) in &c.files {
                let touch = Touch::of_verb(verb);
                let path = &crate::facts::resolve_path(self.cwd.as_deref(), path);
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
            if let Some(at) = self.book.call(c, (seq, turn)) {
                self.set_tasks(at);
            }
            if let (Some(id), Some(cmd)) = (&c.id, &c.command) {
                self.calls.insert(id.clone(), (cmd.clone(), seq, turn));
            }
        }
        for r in &facts.results {
            if let Some(at) = self.book.result(r) {
                self.set_tasks(at);
            }
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

    /// The list as the book holds it, stamped with the call that changed it.
    fn set_tasks(&mut self, (seq, turn): (u64, u32)) {
        let items = self.book.items();
        self.tasks = (!items.is_empty()).then_some(Tasks { turn, seq, items });
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

/// The block's budget in bytes for `max_tokens` (at [`BYTES_PER_TEN_TOKENS`]).
pub fn budget_bytes(max_tokens: u32) -> usize {
    max_tokens as usize * BYTES_PER_TEN_TOKENS / 10
}

/// At most `max` bytes of `s` on a char boundary (`…` marks a cut; `None`
/// when not even that fits).
fn clip_bytes(s: &str, max: usize) -> Option<String> {
    if s.len() <= max {
        return Some(s.to_string());
    }
    let ell = '…'.len_utf8();
    if max < ell + 1 {
        return None;
    }
    let mut cut = max - ell;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    (cut > 0).then(|| format!("{}…", &s[..cut]))
}

/// `prefix` + `text` clipped so the line is at most `room` bytes.
fn fit_line(prefix: &str, text: &str, room: usize) -> Option<String> {
    let t = clip_bytes(text, room.checked_sub(prefix.len())?)?;
    Some(format!("{prefix}{t}"))
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Render the block within `max_tokens` (at [`BYTES_PER_TEN_TOKENS`]), by
/// construction: the frame (the head line, the title of "Where to look"
/// and the recall command) always; then, each within a share of what is
/// left, the goal and the latest ask (clipped), the tasks (the rest
/// counted), the newest transcript ranges (the older ones counted, their
/// lines are in the turns' `NNNN.rows.md`), the failed commands, and the
/// files newest first with the rest of the room (what does not fit is
/// counted, and is in `SESSION.md` and the transcripts). `None` when there
/// is nothing to say, or the budget cannot hold the frame.
pub fn render(input: &StateInput<'_>, max_tokens: u32) -> Option<String> {
    let f = input.facts;
    if input.goal.is_none() && f.files.is_empty() && f.tasks.is_none() && input.lines.is_empty() {
        return None;
    }
    let budget = budget_bytes(max_tokens);
    let dir = input
        .dir
        .strip_suffix('/')
        .filter(|d| !d.is_empty())
        .unwrap_or(input.dir);
    let recall = format!(
        "\n- oceancode-proxy recall {} --before {} --match TEXT",
        one_line(input.session),
        input.upto_seq + 1
    );
    let mut where_title = format!("\nWhere to look (the verbatim rows, in {dir}/transcript/):");
    // Room for the newest range and the count of the older ones.
    const ONE_RANGE: usize = 128;
    if HEAD.len() + where_title.len() + recall.len() + ONE_RANGE > budget {
        // A long data dir: the stub names it already.
        where_title =
            "\nWhere to look (the verbatim rows, in transcript/ of the stub's directory):".into();
    }
    let frame = HEAD.len() + where_title.len() + recall.len();
    let mut room = budget.checked_sub(frame)?;

    // Where to look, first: the newest range, and more within a quarter of
    // the room (the older ones counted), then the recall command.
    let all = ranges(input.lines);
    let quarter = room / 4;
    let range_line = |r: &Range| {
        format!(
            "\n- {} lines {}: seq {} (t{:02})",
            turn_file_name(r.turn),
            span(u64::from(r.lines.0), u64::from(r.lines.1)),
            span(r.seqs.0, r.seqs.1),
            r.turn
        )
    };
    let older_line = |kept: usize| -> String {
        let n = all.len() - kept;
        let (a, b) = (all[0].turn, all[n - 1].turn);
        let turns = if a == b {
            format!("t{a:02}")
        } else {
            format!("t{a:02}–t{b:02}")
        };
        format!(
            "\n- … {n} older range{} ({turns}; rows by line: NNNN.rows.md)",
            plural(n)
        )
    };
    let mut kept: Vec<String> = Vec::new();
    let mut used = 0;
    for (i, r) in all.iter().enumerate().rev() {
        let line = range_line(r);
        let reserve = if i > 0 {
            older_line(kept.len() + 1).len()
        } else {
            0
        };
        let share = if kept.is_empty() { room } else { quarter };
        if used + line.len() + reserve > share {
            break;
        }
        used += line.len();
        kept.push(line);
    }
    let mut tail = where_title;
    if kept.len() < all.len() {
        let line = older_line(kept.len());
        if used + line.len() <= room {
            used += line.len();
            tail.push_str(&line);
        }
    }
    for line in kept.iter().rev() {
        tail.push_str(line);
    }
    tail.push_str(&recall);
    room -= used;

    let mut head = String::from(HEAD);
    if let Some(g) = &input.goal {
        let prefix = format!("\nGoal (t{:02}, seq {}): ", g.turn, g.seq);
        if let Some(line) = fit_line(&prefix, &one_line(&g.text), room / 4) {
            room -= line.len();
            head.push_str(&line);
        }
    }
    if let Some(a) = &input.latest_ask {
        let prefix = format!("\nLatest ask that left (t{:02}, seq {}): ", a.turn, a.seq);
        if let Some(line) = fit_line(&prefix, &one_line(&a.text), room / 4) {
            room -= line.len();
            head.push_str(&line);
        }
    }
    if let Some(t) = &f.tasks {
        let share = room / 2;
        let title = format!(
            "\nTasks (as last written, t{:02} seq {}; a newer list in the window wins):",
            t.turn, t.seq
        );
        let mut body = String::new();
        let mut shown = 0;
        for (i, (content, status)) in t.items.iter().enumerate() {
            let mut line = format!(
                "\n- {} {}",
                status_mark(status),
                crate::facts::squash_clip(content, crate::facts::LINE_MAX)
            );
            if !matches!(status.as_str(), "completed" | "in_progress" | "pending") {
                let _ = write!(line, " ({})", one_line(status));
            }
            // Room for the count of the rest, unless this is the last.
            let reserve = if i + 1 < t.items.len() { 24 } else { 0 };
            if title.len() + body.len() + line.len() + reserve > share {
                break;
            }
            body.push_str(&line);
            shown += 1;
        }
        let rest = t.items.len() - shown;
        if rest > 0 {
            let _ = write!(body, "\n- … {rest} more task{}", plural(rest));
        }
        if title.len() + body.len() <= share {
            room -= title.len() + body.len();
            head.push_str(&title);
            head.push_str(&body);
        }
    }

    // Failed commands: at most a quarter of what is left.
    let mut failed_text = String::new();
    if !f.failed.is_empty() {
        let title = "\nFailed, not since succeeded:";
        let mut body = String::new();
        for c in f.failed.iter().rev().take(MAX_FAILED) {
            let exit = c
                .exit
                .map_or_else(|| "error".to_string(), |e| format!("exit {e}"));
            let line = format!("\n- {} → {exit} t{:02} seq {}", code(&c.cmd), c.turn, c.seq);
            if title.len() + body.len() + line.len() > room / 4 {
                break;
            }
            body.push_str(&line);
        }
        if !body.is_empty() {
            failed_text.push_str(title);
            failed_text.push_str(&body);
        }
    }
    room -= failed_text.len();

    // Files: the rest of the room.
    let mut middle = String::new();
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
        let rest = files.len() - shown;
        if shown > 0 {
            middle.push_str(title);
            middle.push_str(&body);
            if rest > 0 {
                let _ = write!(
                    middle,
                    "\n- … {rest} older file{} in SESSION.md",
                    plural(rest)
                );
            }
        } else {
            // Not one entry fits: the count alone, if it does.
            let line = format!("\nFiles touched in the cut part: {rest}, listed in SESSION.md");
            if line.len() <= room {
                middle = line;
            }
        }
    }
    let mut out = head;
    out.push_str(&middle);
    out.push_str(&failed_text);
    out.push_str(&tail);
    debug_assert!(out.len() <= budget, "{} > {budget}", out.len());
    Some(out)
}

/// Estimated tokens of a block (at [`BYTES_PER_TEN_TOKENS`]).
pub fn tokens(block: &str) -> u32 {
    (block.len() * 10).div_ceil(BYTES_PER_TEN_TOKENS) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{clip, row_facts, squash};
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
            result("c", "Todos have been modified successfully."),
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
        let lines: Vec<RowLines> = (1..=11)
            .map(|s| RowLines {
                seq: s,
                turn: 1,
                first: (s as u32) * 10,
                last: (s as u32) * 10 + 8,
            })
            .collect();
        let input = StateInput {
            upto_seq: 11,
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
            block.contains("- src/ (t01): a.rs (read+edited 7)"),
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
        assert!(block.contains("in /d/s1/transcript/):\n- 0001.md lines 10–118: seq 1–11 (t01)"));
        assert!(block.contains("oceancode-proxy recall s1 --before 12 --match TEXT"));
        assert_eq!(
            Some(block.clone()),
            render(&input, DEFAULT_MAX_TOKENS),
            "pure"
        );
        // A tight budget keeps the frame and what fits, and counts the rest.
        let small = render(&input, 200).unwrap();
        assert!(small.len() <= budget_bytes(200), "{small}");
        assert!(small.contains("- 0001.md lines"), "{small}");
        assert!(small.contains("Goal (t01, seq 1): Fix the bug"), "{small}");
        // Too small for the frame: no block rather than one over budget.
        assert_eq!(render(&input, 50), None);
    }

    /// The block of `rows` (one turn) cut after the last one.
    fn block_of(rows: &[String]) -> String {
        let mut facts = StateFacts::new();
        for (i, r) in rows.iter().enumerate() {
            facts.add(i as u64 + 1, 1, &row_facts(Dialect::Anthropic, r));
        }
        let lines: Vec<RowLines> = (1..=rows.len() as u64)
            .map(|s| RowLines {
                seq: s,
                turn: 1,
                first: s as u32 * 10,
                last: s as u32 * 10 + 8,
            })
            .collect();
        let input = StateInput {
            upto_seq: rows.len() as u64,
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
        render(&input, DEFAULT_MAX_TOKENS).unwrap()
    }

    fn error_result(id: &str, text: &str) -> String {
        serde_json::json!({"role":"user","content":[{"type":"tool_result","tool_use_id":id,"content":text,"is_error":true}]}).to_string()
    }

    /// A file touched through the shell (relative, `./build.log`) and by
    /// its absolute path is one file, listed under its directory.
    #[test]
    fn relative_paths_resolve_against_the_working_directory() {
        let rows = [
            call(
                "a",
                "Read",
                serde_json::json!({"file_path": "/home/dev/proj/src/a.rs"}),
            ),
            result("a", "x"),
            call(
                "b",
                "Bash",
                serde_json::json!({"command": "make > ./build.log"}),
            ),
            result("b", "ok"),
            call(
                "c",
                "Bash",
                serde_json::json!({"command": "cat src/a.rs ./build.log"}),
            ),
            result("c", "ok"),
        ];
        let mut facts = StateFacts::new();
        facts.set_cwd(Some("/home/dev/proj".into()));
        for (i, r) in rows.iter().enumerate() {
            facts.add(i as u64 + 1, 1, &row_facts(Dialect::Anthropic, r));
        }
        assert_eq!(
            facts.paths(),
            vec!["/home/dev/proj/build.log", "/home/dev/proj/src/a.rs"]
        );
        let input = StateInput {
            upto_seq: 6,
            session: "s1",
            dir: "/d/s1",
            goal: None,
            latest_ask: None,
            facts: &facts,
            lines: &[],
        };
        let block = render(&input, DEFAULT_MAX_TOKENS).unwrap();
        assert!(
            block.contains("- /home/dev/proj/ (t01): build.log (read+created 5)"),
            "{block}"
        );
        assert!(!block.contains("./"), "{block}");
    }

    /// Claude Code 2.1.332's tasks: `TaskCreate` (its id in the result),
    /// `TaskUpdate` by id; the list shows each task's latest status.
    #[test]
    fn claude_code_tasks_fold_by_id() {
        let rows = [
            call(
                "a",
                "TaskCreate",
                serde_json::json!({"subject": "Port the parser", "description": "d"}),
            ),
            result("a", "Task #1 created successfully: Port the parser"),
            call(
                "b",
                "TaskCreate",
                serde_json::json!({"subject": "Write docs", "description": "d"}),
            ),
            result("b", "Task #2 created successfully: Write docs"),
            call(
                "c",
                "TaskCreate",
                serde_json::json!({"subject": "Drop me", "description": "d"}),
            ),
            result("c", "Task #3 created successfully: Drop me"),
            call(
                "d",
                "TaskUpdate",
                serde_json::json!({"taskId": "1", "status": "in_progress"}),
            ),
            result("d", "Updated task #1 status"),
            call(
                "e",
                "TaskUpdate",
                serde_json::json!({"taskId": "1", "status": "completed"}),
            ),
            result("e", "Updated task #1 status"),
            call(
                "f",
                "TaskUpdate",
                serde_json::json!({"taskId": "2", "status": "in_progress"}),
            ),
            result("f", "Updated task #2 status"),
            call(
                "g",
                "TaskUpdate",
                serde_json::json!({"taskId": "3", "status": "deleted"}),
            ),
            result("g", "Updated task #3 deleted"),
            // Not found: the client says so without `is_error`.
            call(
                "h",
                "TaskUpdate",
                serde_json::json!({"taskId": "9", "status": "completed"}),
            ),
            result("h", "Task #9 not found"),
            call("i", "TaskList", serde_json::json!({})),
            result("i", "#1 [completed] Port the parser"),
        ];
        let block = block_of(&rows);
        assert!(
            block.contains(
                "Tasks (as last written, t01 seq 13; a newer list in the window wins):\n- [x] #1 Port the parser\n- [~] #2 Write docs\n"
            ),
            "{block}"
        );
        assert!(
            !block.contains("Drop me") && !block.contains("#9"),
            "{block}"
        );
    }

    /// A task call the client rejected (`is_error`: Claude Code 2.1.332 has
    /// no `TodoWrite`) says nothing; an accepted one is taken.
    #[test]
    fn a_rejected_task_call_is_no_fact() {
        let rejected = [
            call(
                "a",
                "TodoWrite",
                serde_json::json!({"todos": [{"content": "ghost task", "status": "in_progress"}]}),
            ),
            error_result(
                "a",
                "<tool_use_error>Error: No such tool available: TodoWrite</tool_use_error>",
            ),
        ];
        let block = block_of(&rejected);
        assert!(
            !block.contains("Tasks") && !block.contains("ghost task"),
            "{block}"
        );
        let mut rows = rejected.to_vec();
        rows.extend([
            call(
                "b",
                "TodoWrite",
                serde_json::json!({"todos": [{"content": "real task", "status": "pending"}]}),
            ),
            result("b", "Todos have been modified successfully."),
            call(
                "c",
                "TodoWrite",
                serde_json::json!({"todos": [{"content": "later ghost", "status": "pending"}]}),
            ),
            error_result("c", "InputValidationError"),
        ]);
        let block = block_of(&rows);
        assert!(
            block.contains("seq 3; a newer list in the window wins):\n- [ ] real task"),
            "{block}"
        );
        assert!(!block.contains("ghost"), "{block}");
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

    mod budget_props {
        use super::*;
        use proptest::prelude::*;

        /// One step of a scripted session: a tool call on a path (read,
        /// edit, write, a failing or passing shell command), a todo list,
        /// or a new turn's ask.
        #[derive(Clone, Debug)]
        enum Step {
            Ask(String),
            Read(String),
            Edit(String),
            Write(String),
            Shell(String, bool),
            Todos(Vec<(String, u8)>),
        }

        fn path() -> impl Strategy<Value = String> {
            (
                prop::collection::vec("[a-z_]{1,12}|[é€😀]{1,4}", 0..6),
                "[a-zA-Z0-9_]{1,40}\\.(rs|py|md|ts)",
            )
                .prop_map(|(dirs, name)| {
                    let mut p = dirs.join("/");
                    if !p.is_empty() {
                        p.push('/');
                    }
                    p + &name
                })
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                1 => ".{0,900}".prop_map(Step::Ask),
                4 => path().prop_map(Step::Read),
                3 => path().prop_map(Step::Edit),
                2 => path().prop_map(Step::Write),
                2 => ("[a-z ./-]{1,300}", any::<bool>()).prop_map(|(c, ok)| Step::Shell(c, ok)),
                1 => prop::collection::vec((".{0,200}", 0u8..4), 0..40).prop_map(Step::Todos),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Over a long session of many turns, the block at every cut
            /// stays within its budget, names the newest range and the
            /// recall command, and counts the older ranges it leaves out.
            #[test]
            fn the_block_never_exceeds_its_budget(
                steps in prop::collection::vec(step(), 1..400),
                max_tokens in 200u32..3_000,
                dir_len in 0usize..120,
                every in 5usize..60,
            ) {
                let d = Dialect::Anthropic;
                let dir = format!("/data/{}/sessions/20261203-173000-cc-3f9a1c", "x".repeat(dir_len));
                let mut facts = StateFacts::new();
                let mut lines: Vec<RowLines> = Vec::new();
                let mut at: HashMap<u32, u32> = HashMap::new();
                let (mut turn, mut seq) = (1u32, 0u64);
                let mut goal: Option<Ask> = None;
                let mut latest: Option<Ask> = None;
                let mut place = |seq: u64, turn: u32, n: u32, lines: &mut Vec<RowLines>| {
                    let before = *at.entry(turn).or_insert(2);
                    lines.push(RowLines { seq, turn, first: before + 2, last: before + n });
                    at.insert(turn, before + n);
                };
                for (i, st) in steps.iter().enumerate() {
                    let rows: Vec<String> = match st {
                        Step::Ask(t) => {
                            turn += 1;
                            let ask = Ask { turn, seq: seq + 1, text: clip(&squash(t), crate::facts::ASK_MAX) };
                            if goal.is_none() { goal = Some(ask) } else { latest = Some(ask) }
                            vec![serde_json::json!({"role":"user","content":t}).to_string()]
                        }
                        Step::Read(p) => vec![call(&format!("c{i}"), "Read", serde_json::json!({"file_path": p})), result(&format!("c{i}"), "x")],
                        Step::Edit(p) => vec![call(&format!("c{i}"), "Edit", serde_json::json!({"file_path": p, "old_string": "a", "new_string": "b"}))],
                        Step::Write(p) => vec![call(&format!("c{i}"), "Write", serde_json::json!({"file_path": p, "content": "x"}))],
                        Step::Shell(c, ok) => vec![
                            call(&format!("c{i}"), "Bash", serde_json::json!({"command": c})),
                            result(&format!("c{i}"), if *ok { "ok" } else { "Exit code 2\nno" }),
                        ],
                        Step::Todos(items) => {
                            const STATUS: [&str; 4] = ["pending", "in_progress", "completed", "blocked"];
                            let todos: Vec<_> = items.iter().map(|(c, s)| {
                                let status = STATUS[*s as usize];
                                serde_json::json!({"content": c, "status": status})
                            }).collect();
                            vec![call(&format!("c{i}"), "TodoWrite", serde_json::json!({"todos": todos}))]
                        }
                    };
                    for r in rows {
                        seq += 1;
                        facts.add(seq, turn, &row_facts(d, &r));
                        // Rows of up to 3,000 lines: long turns come in pieces.
                        place(seq, turn, 3 + (seq as u32 * 7919) % 3_000, &mut lines);
                    }
                    if i % every != every - 1 {
                        continue;
                    }
                    let input = StateInput {
                        upto_seq: seq,
                        session: "20261203-173000-cc-3f9a1c",
                        dir: &dir,
                        goal: goal.clone(),
                        latest_ask: latest.clone(),
                        facts: &facts,
                        lines: &lines,
                    };
                    let block = render(&input, max_tokens).unwrap();
                    prop_assert!(block.len() <= budget_bytes(max_tokens), "{} > {}:\n{block}", block.len(), budget_bytes(max_tokens));
                    prop_assert!(tokens(&block) <= max_tokens);
                    prop_assert!(block.starts_with(HEAD));
                    let recall = format!("- oceancode-proxy recall 20261203-173000-cc-3f9a1c --before {} --match TEXT", seq + 1);
                    prop_assert!(block.ends_with(&recall), "{block}");
                    let all = ranges(&lines);
                    let newest = all.last().unwrap();
                    let named = format!("- {} lines {}", turn_file_name(newest.turn), span(u64::from(newest.lines.0), u64::from(newest.lines.1)));
                    prop_assert!(block.contains(&named), "the newest range: {named}\n{block}");
                    // Ranges shown + ranges counted = every range.
                    let shown = block.lines().filter(|l| l.starts_with("- 0") && l.contains(" lines ")).count();
                    let counted = block
                        .lines()
                        .find_map(|l| l.strip_prefix("- … ")?.split(" older range").next()?.parse::<usize>().ok())
                        .unwrap_or(0);
                    prop_assert_eq!(shown + counted, all.len(), "{}", block);
                    prop_assert_eq!(Some(block.clone()), render(&input, max_tokens), "pure");
                }
            }
        }
    }
}
