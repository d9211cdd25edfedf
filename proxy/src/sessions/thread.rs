//! Keeping the thread across a cut: what each row states for the state
//! block (its engine facts, its ask, its lines in the transcript), read
//! once from the bytes the ledger keeps, and the block for a window's cut
//! ([`oceancode_ledger::state_block`], pure), cached until the cut moves.
//!
//! The block depends only on rows up to the cut, so its bytes stay the same
//! between cuts (the prompt cache keeps hitting), and a session read back
//! from the ledger gives the same bytes (its rows are the same bytes).

use super::state::State;
use oceancode_ledger::facts::{self, CallFacts, ResultFacts, RowFacts};
use oceancode_ledger::state_block::{self, Ask, StateFacts, StateInput};
use oceancode_ledger::transcript::{self, RowLines};
use oceancode_window::tideline::WindowPlan;
use oceancode_window::{Dialect, RowKind};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// What one row tells the state block.
#[derive(Debug, Clone, Default)]
pub(super) struct RowThread {
    /// Its tool calls and results that can change the block.
    pub(super) facts: Facts,
    /// Its ask (prompt rows).
    pub(super) ask: Option<Box<str>>,
    /// Lines of its section in its turn file.
    pub(super) lines: u32,
}

/// The hashed ids of the session's tool calls that run a command or write
/// tasks: the only calls whose results change the state block (a command
/// that failed, or a success that clears its earlier failure; a task call
/// counts once its result is in and is not an error).
pub(super) type CommandCalls = HashSet<u64>;

/// The facts of a row that [`StateFacts::add`] can use, held for the row's
/// life in the smallest form: one command call or one result (an agent's
/// usual tool row) inline, anything else as [`RowFacts`]. Call ids are kept
/// hashed (they are only ever matched with each other); a `RowFacts` is made
/// again when a block is rendered, which happens when the cut moves. A
/// whole `RowFacts` per row, with its vectors' first growth (room for
/// four), was ≈ 320 bytes a row.
#[derive(Debug, Clone, Default)]
pub(super) enum Facts {
    /// Nothing the block uses.
    #[default]
    None,
    /// One call that runs a command.
    Command { id: u64, command: Box<str> },
    /// One result of a command call.
    Result {
        id: u64,
        is_error: bool,
        exit: Option<i64>,
    },
    /// Anything else: calls that name files or write a task list, several
    /// calls or results (ids as [`id_text`]).
    Full(Box<RowFacts>),
}

/// A hashed call id as the id of a [`RowFacts`] made again.
fn id_text(id: u64) -> String {
    format!("{id:016x}")
}

impl Facts {
    /// Keep what the fold can use: a call that names files or writes tasks
    /// (its file touches, its tasks), or runs a command or writes tasks and
    /// has an id (what its result is matched by); a result that answers one
    /// of the session's command or task calls, which `commands` gathers in
    /// seq order (any other result finds no call in the fold and changes
    /// nothing). The tool name is never read there.
    fn of(mut f: RowFacts, commands: &mut CommandCalls) -> Facts {
        let hash = |id: &str| crate::dialect::raw_hash(id);
        f.calls.retain_mut(|c| {
            c.tool = String::new();
            let answered = c.command.is_some() || c.todos.is_some() || c.task.is_some();
            c.id = match &c.id {
                Some(id) if answered => {
                    let h = hash(id);
                    commands.insert(h);
                    Some(id_text(h))
                }
                _ => None,
            };
            c.files.shrink_to_fit();
            !c.files.is_empty() || c.todos.is_some() || c.task.is_some() || c.id.is_some()
        });
        f.results.retain_mut(|r| match r.id.as_deref().map(hash) {
            Some(h) if commands.contains(&h) => {
                r.id = Some(id_text(h));
                true
            }
            _ => false,
        });
        match (f.calls.as_mut_slice(), f.results.as_slice()) {
            ([], []) => Facts::None,
            ([c], []) if c.files.is_empty() && c.todos.is_none() && c.task.is_none() => {
                match (c.id.as_deref().map(hash_of_text), c.command.take()) {
                    (Some(Some(id)), Some(command)) => Facts::Command {
                        id,
                        command: command.into_boxed_str(),
                    },
                    _ => Facts::None,
                }
            }
            ([], [r]) if r.task.is_none() => match r.id.as_deref().and_then(hash_of_text) {
                Some(id) => Facts::Result {
                    id,
                    is_error: r.is_error,
                    exit: r.exit,
                },
                None => Facts::None,
            },
            _ => {
                f.calls.shrink_to_fit();
                f.results.shrink_to_fit();
                Facts::Full(Box::new(f))
            }
        }
    }

    /// One result of command call `id`, with no exit code.
    pub(super) fn result(id: u64, is_error: bool) -> Facts {
        Facts::Result {
            id,
            is_error,
            exit: None,
        }
    }

    /// The call and error mark of one result with no exit code (what
    /// [`Facts::result`] makes), else None.
    pub(super) fn result_of(&self) -> Option<(u64, bool)> {
        match *self {
            Facts::Result {
                id,
                is_error,
                exit: None,
            } => Some((id, is_error)),
            _ => None,
        }
    }

    /// The facts as [`StateFacts::add`] takes them (empty = nothing).
    pub(super) fn into_row_facts(self) -> RowFacts {
        self.row_facts().map(Cow::into_owned).unwrap_or_default()
    }

    /// The facts as [`StateFacts::add`] takes them (None = nothing).
    pub(super) fn row_facts(&self) -> Option<Cow<'_, RowFacts>> {
        match self {
            Facts::None => None,
            Facts::Command { id, command } => Some(Cow::Owned(RowFacts {
                calls: vec![CallFacts {
                    id: Some(id_text(*id)),
                    command: Some(command.to_string()),
                    ..CallFacts::default()
                }],
                results: Vec::new(),
            })),
            Facts::Result { id, is_error, exit } => Some(Cow::Owned(RowFacts {
                calls: Vec::new(),
                results: vec![ResultFacts {
                    id: Some(id_text(*id)),
                    is_error: *is_error,
                    exit: *exit,
                    task: None,
                }],
            })),
            Facts::Full(f) => Some(Cow::Borrowed(f)),
        }
    }
}

/// The hash an [`id_text`] stands for.
fn hash_of_text(t: &str) -> Option<u64> {
    u64::from_str_radix(t, 16).ok()
}

impl RowThread {
    /// Read a row as the ledger keeps it. Rows come in seq order; `commands`
    /// gathers the session's command calls, `cwd` takes the first working
    /// directory a row states ([`facts::cwd_of`]).
    pub(super) fn of(
        dialect: Dialect,
        seq: u64,
        role: &str,
        kind: RowKind,
        raw: &str,
        commands: &mut CommandCalls,
        cwd: &mut Option<Box<str>>,
    ) -> RowThread {
        if cwd.is_none() && kind != RowKind::Assistant {
            *cwd = facts::cwd_of(dialect, raw).map(String::into_boxed_str);
        }
        let facts = match kind {
            RowKind::Assistant | RowKind::ToolResult | RowKind::Prompt | RowKind::Other => {
                Facts::of(facts::row_facts(dialect, raw), commands)
            }
            RowKind::System => Facts::None,
        };
        let ask = match kind {
            RowKind::Prompt => facts::ask_text(dialect, raw),
            // A prompt typed after an interrupted tool call.
            RowKind::ToolResult => facts::typed_after_results(dialect, raw),
            _ => None,
        };
        RowThread {
            facts,
            ask: ask.map(String::into_boxed_str),
            lines: transcript::section_lines(dialect, seq, role, raw),
        }
    }
}

/// What a cached block was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BlockKey {
    upto: u64,
    start: usize,
    pinned: Option<usize>,
    hidden_gen: u32,
    max_tokens: u32,
}

/// The last block rendered.
pub(super) type BlockCache = parking_lot::Mutex<Option<(BlockKey, Option<Arc<str>>)>>;

/// The state block for a window planned as `plan` on the active line
/// (`dir`: the session directory the stub names), from the cache while the
/// cut has not moved.
pub(super) fn block(st: &State, plan: &WindowPlan, dir: &str, max_tokens: u32) -> Option<Arc<str>> {
    let key = BlockKey {
        upto: plan.effective_upto_seq,
        start: plan.start,
        pinned: plan.pinned_prompt,
        hidden_gen: st.hidden_gen,
        max_tokens,
    };
    let mut cache = st.block_cache.lock();
    if let Some((k, b)) = cache.as_ref() {
        if *k == key {
            return b.clone();
        }
    }
    let b = render(st, plan, dir, max_tokens).map(Arc::from);
    *cache = Some((key, b.clone()));
    b
}

/// Render the block (no cache).
fn render(st: &State, plan: &WindowPlan, dir: &str, max_tokens: u32) -> Option<String> {
    let upto = plan.effective_upto_seq;
    let mut f = StateFacts::new();
    f.set_cwd(st.cwd.as_deref().map(str::to_string));
    let mut goal: Option<Ask> = None;
    let mut latest: Option<Ask> = None;
    for (i, &seq) in st.active.iter().enumerate().take(plan.start) {
        let r = st.row(seq);
        if let Some(x) = r.row_facts() {
            f.add(seq, r.turn, &x);
        }
        if let Some(a) = r.ask() {
            let ask = Ask {
                turn: r.turn,
                seq,
                text: a.to_string(),
            };
            if goal.is_none() {
                goal = Some(ask);
            } else if Some(i) != plan.pinned_prompt {
                latest = Some(ask);
            }
        }
    }
    if goal.is_none() {
        // The first ask is in the window: still the session's goal.
        goal = st.active.iter().find_map(|&seq| {
            let r = st.row(seq);
            r.ask().map(|a| Ask {
                turn: r.turn,
                seq,
                text: a.to_string(),
            })
        });
    }
    let lines = row_lines(st, upto);
    state_block::render(
        &StateInput {
            upto_seq: upto,
            session: &st.meta.id,
            dir,
            goal,
            latest_ask: latest,
            facts: &f,
            lines: &lines,
        },
        max_tokens,
    )
}

/// Where every row up to `upto` is in its turn file, as the ledger's
/// writer renders it: the rows of a turn file are the turn's rows no
/// branch hid (an answer never echoed is in it too), in seq order.
pub(super) fn row_lines(st: &State, upto: u64) -> Vec<RowLines> {
    let mut at: HashMap<u32, u32> = HashMap::new();
    let mut out = Vec::new();
    for (i, r) in st.rows.iter().enumerate().take(upto as usize) {
        if r.hidden() {
            continue;
        }
        let seq = i as u64 + 1;
        let before = *at
            .entry(r.turn)
            .or_insert_with(|| transcript::line_count(&transcript::render_turn_head(r.turn)));
        let placed = RowLines {
            seq,
            turn: r.turn,
            first: before + 2,
            last: before + r.lines(),
        };
        at.insert(r.turn, before + r.lines());
        out.push(placed);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str, input: serde_json::Value) -> String {
        json!({"role":"assistant","content":[{"type":"tool_use","id":id,"name":name,"input":input}]})
            .to_string()
    }

    fn result(id: &str, text: &str, is_error: bool) -> String {
        json!({"role":"user","content":[{"type":"tool_result","tool_use_id":id,"content":text,"is_error":is_error}]})
            .to_string()
    }

    /// The block folded from every row's whole facts and from what
    /// [`RowThread::of`] keeps of them, for each prefix of the rows.
    #[test]
    fn the_kept_facts_render_the_block_the_whole_facts_render() {
        let d = Dialect::Anthropic;
        let two_calls = json!({"role":"assistant","content":[
            {"type":"tool_use","id":"m1","name":"Bash","input":{"command":"make"}},
            {"type":"tool_use","id":"m2","name":"Read","input":{"file_path":"src/m.rs"}}]})
        .to_string();
        let rows = [
            call("a", "Read", json!({"file_path": "src/a.rs"})),
            result("a", "fn main() {}", false),
            call("b", "Bash", json!({"command": "cargo test"})),
            result("b", "Exit code 101\nfailed", false),
            call(
                "c",
                "TodoWrite",
                json!({"todos": [{"content": "fix a", "status": "in_progress"}]}),
            ),
            result("c", "ok", false),
            call("g", "WebSearch", json!({"query": "rust"})),
            result("g", "nothing", true),
            call("e", "Bash", json!({"command": "cat src/b.rs > src/c.rs"})),
            result("e", "Exit code 1", false),
            two_calls,
            result("m1", "boom", true),
            result("m2", "text", false),
            call("f", "Bash", json!({"command": "cargo test"})),
            result("f", "ok", false),
            result("zz", "an answer to no call", true),
            call("h", "Bash", json!({"command": "cargo build"})),
            call(
                "t1",
                "TaskCreate",
                json!({"subject": "Port", "description": "x"}),
            ),
            result("t1", "Task #1 created successfully: Port", false),
            call(
                "t2",
                "TaskUpdate",
                json!({"taskId": "1", "status": "completed"}),
            ),
            result("t2", "Updated task #1 status", false),
            call(
                "t3",
                "TodoWrite",
                json!({"todos": [{"content": "ghost", "status": "pending"}]}),
            ),
            result("t3", "Error: No such tool available: TodoWrite", true),
        ];
        let mut commands = CommandCalls::default();
        let kept: Vec<Facts> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let t = RowThread::of(
                    d,
                    i as u64 + 1,
                    "x",
                    RowKind::Assistant,
                    r,
                    &mut commands,
                    &mut None,
                );
                t.facts
            })
            .collect();
        assert!(kept.iter().any(|f| matches!(f, Facts::Command { .. })));
        assert!(kept.iter().any(|f| matches!(f, Facts::Result { .. })));
        assert!(kept.iter().any(|f| matches!(f, Facts::Full(_))));
        assert!(
            matches!(kept[6], Facts::None),
            "a call with no command, files or tasks"
        );
        assert!(
            matches!(kept[15], Facts::None),
            "a result of no command call"
        );
        for n in 1..=rows.len() {
            let render = |facts: &StateFacts| {
                state_block::render(
                    &StateInput {
                        upto_seq: n as u64,
                        session: "s1",
                        dir: "/d/s1",
                        goal: None,
                        latest_ask: None,
                        facts,
                        lines: &[],
                    },
                    4000,
                )
            };
            let mut whole = StateFacts::new();
            let mut thin = StateFacts::new();
            for (i, r) in rows.iter().take(n).enumerate() {
                whole.add(i as u64 + 1, 1, &facts::row_facts(d, r));
                if let Some(x) = kept[i].row_facts() {
                    thin.add(i as u64 + 1, 1, &x);
                }
            }
            assert_eq!(render(&whole), render(&thin), "after {n} rows");
            if n == rows.len() {
                let block = render(&thin).unwrap_or_default();
                assert!(
                    block.contains("make") && block.contains("src/c.rs"),
                    "{block}"
                );
                assert!(
                    !block.contains("cargo test"),
                    "its failure was cleared: {block}"
                );
                assert!(block.contains("- [x] #1 Port"), "{block}");
                assert!(!block.contains("ghost"), "a rejected call: {block}");
            }
        }
    }
}
