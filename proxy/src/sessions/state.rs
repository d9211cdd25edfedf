//! The live state of one ledger session: its rows (hashes, kinds and tool
//! calls, never bytes), the active line, the answers not yet echoed (each
//! hanging off the row it answers), the steps in flight, and the tideline;
//! how a request's history maps onto it (confirm, branch, append, or where
//! it leaves the line for a sibling), and how a recorded session is read
//! back.

use super::meter::Meter;
use super::parse::{parse_msg, Parsed, DEFAULT_BYTES_PER_TOKEN};
use super::rowmem::NewRow;
pub(super) use super::rowmem::RowMem;
use super::thread::{BlockCache, CommandCalls, RowThread};
use crate::dialect;
use bytes::Bytes;
use oceancode_config::LineSpec;
use oceancode_ledger::store::LoadedSession;
use oceancode_window::media::{self, Cost};
use oceancode_window::tideline::{RowInfo, Tideline};
use oceancode_window::{ByteString, Dialect, Event, Row, RowKind, SessionMeta, Usage};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a request's new rows take their bytes ([`Row::raw`]) from.
#[derive(Debug, Clone, Copy)]
pub(super) enum RowBytes<'a> {
    /// A copy of each message.
    Copy,
    /// Slices of the request body the messages are in: no copy, and the
    /// rows keep the body alive until the writer has them all.
    Body(&'a Bytes),
}

impl<'a> RowBytes<'a> {
    /// How the new messages `new` of `body` are kept: as slices of the body
    /// when they are most of it (a cold request: its rows would copy the
    /// whole body while the request holds it anyway), else as copies (a
    /// step's few new rows must not keep a whole body alive in the
    /// writer's queue).
    pub(super) fn of(body: &'a Bytes, new: &[&str]) -> RowBytes<'a> {
        if 2 * new.iter().map(|m| m.len()).sum::<usize>() >= body.len() {
            RowBytes::Body(body)
        } else {
            RowBytes::Copy
        }
    }

    /// The bytes of message `raw`: a slice of the body when it lies within
    /// it, else a copy.
    fn take(self, raw: &str) -> ByteString {
        if let RowBytes::Body(body) = self {
            let (start, p) = (body.as_ptr() as usize, raw.as_ptr() as usize);
            if p >= start && p + raw.len() <= start + body.len() {
                let slice = body.slice(p - start..p - start + raw.len());
                if let Ok(s) = ByteString::try_from(slice) {
                    return s;
                }
            }
        }
        ByteString::from(raw)
    }
}

/// The tool calls a row makes and answers (hashed ids).
#[derive(Debug, Clone, Default)]
pub(super) struct Calls {
    pub(super) opens: Box<[u64]>,
    pub(super) closes: Box<[u64]>,
    pub(super) binds_next: bool,
}

impl Calls {
    pub(super) fn of(i: &dialect::MessageInfo) -> Calls {
        let h = |ids: &[String]| ids.iter().map(|s| dialect::raw_hash(s)).collect();
        Calls {
            opens: h(&i.opens),
            closes: h(&i.closes),
            binds_next: i.binds_next,
        }
    }
}

/// A step's answer until the client echoes it: its rows, and the row of
/// the line it answers (the request's last row; 0 = none). Several can hang
/// off one row: a retried request, or concurrent agents' identical first
/// requests — which of them a client continues tells the conversations
/// apart.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub(super) after: u64,
    pub(super) rows: Vec<u64>,
}

/// Unechoed answers kept for matching (older ones stay in the ledger).
const MAX_ANSWERS: usize = 64;

/// Where a request's history leaves a session's active line.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reach {
    /// Messages shared with the active line.
    pub(super) shared: usize,
    /// The answer (index into `answers`) the next message echoes: one
    /// given after the last shared row.
    pub(super) echoes: Option<usize>,
}

impl Reach {
    /// Messages of the request this session already holds.
    pub(super) fn len(&self) -> usize {
        self.shared + usize::from(self.echoes.is_some())
    }
}

impl RowMem {
    /// Whether a message the client sent again at this row's place is this
    /// row: the same after normalization, or the same tool result with its
    /// output cleared by the client (opencode's prune, Claude Code's
    /// microcompact: the same tool-call ids, other content). A call's id
    /// names one execution, so that is an edit of old history, not a rewind.
    pub(super) fn echoed_by(&self, p: &Parsed) -> bool {
        p.norm == self.norm_hash
            || (self.kind == RowKind::ToolResult
                && p.info.kind == RowKind::ToolResult
                && !self.closes().is_empty()
                && *self.closes() == *Calls::of(&p.info).closes)
    }
}

/// What a request changes of a row it maps onto the line (its hashes, and
/// the calls of an answer the client echoed), as it was before.
#[derive(Debug, Clone)]
pub(super) struct Undo {
    pub(super) seq: u64,
    pub(super) raw_hash: u64,
    pub(super) norm_hash: u64,
    pub(super) echo: u64,
    pub(super) calls: Calls,
    pub(super) starts_ok: bool,
}

/// The live state of one ledger session.
pub struct State {
    pub(super) meta: SessionMeta,
    /// The facts last handed to the ledger (None = never): a request only
    /// re-sends them when something other than `last_ms` changed (the
    /// ledger's `Step` keeps the activity time).
    pub(super) recorded_meta: Option<SessionMeta>,
    pub(super) dialect: Dialect,
    /// All rows ever recorded, index = seq − 1.
    pub(super) rows: super::rows::Rows,
    /// Seqs on the active line, in order (what the client's history maps to).
    pub(super) active: Vec<u64>,
    /// Answers not yet echoed, oldest first.
    pub(super) answers: Vec<Answer>,
    /// Steps in flight, with the row each answers.
    pub(super) open: Vec<(u32, u64)>,
    /// Unix ms of the last finished step (0 = none since it was loaded).
    pub(super) answered_ms: i64,
    pub(super) branch: u32,
    pub(super) step: u32,
    pub(super) turn: u32,
    /// First line of each turn's prompt, by turn.
    pub(super) turn_lines: HashMap<u32, (u64, String)>,
    pub(super) tideline: Tideline,
    /// The last row the rendered window left out, as last recorded in a
    /// `Cut` event (what the stub names; at most `tideline.cut_upto()`).
    pub(super) recorded_cut: u64,
    pub(super) needs_seed: bool,
    pub(super) last_usage: Option<Usage>,
    pub(super) pending_est: u64,
    pub(super) override_line: Option<LineSpec>,
    /// The line, its label and the session's override (LineSpec JSON)
    /// last handed to the ledger (a `Line` event).
    pub(super) recorded_line: Option<RecordedLine>,
    pub(super) learned_ceiling: Option<u64>,
    /// The provider counts the request's `max_tokens` against the context
    /// (it answered `input length and max_tokens exceed context limit`):
    /// the line leaves room for all of it, not only the output allowance.
    pub(super) reserves_max_tokens: bool,
    pub(super) tools_fp: u64,
    /// [`RootHashes::system`] of the request that opened the conversation;
    /// 0 = unknown.
    pub(super) system_fp: u64,
    /// Bytes of request JSON per real input token, learned from usage
    /// (row estimates on the request path are text bytes / bytes_per_token
    /// plus what their images and documents cost, [`media`]).
    pub(super) bytes_per_token: f64,
    /// Totals over the session's steps.
    pub totals: Usage,
    /// Last computed numbers, for the meter.
    pub meter: Meter,
    /// The context edits: the edit set in force, the exported file.
    pub(crate) context: crate::context::live::Live,
    /// The in-band recall tool's internal exchanges, re-inserted after
    /// their rows in every later request (memory only).
    pub(crate) hidden: crate::recall_tool::Hidden,
    /// The session's requests carry the in-band recall tool (the stub says so).
    pub(crate) recall_tool: bool,
    /// Bumped whenever rows are hidden (the transcripts' lines move).
    pub(super) hidden_gen: u32,
    /// The state block of the current cut.
    pub(super) block_cache: BlockCache,
    /// The latest request's events, held until its answer's status is
    /// known ([`super::hold`]).
    pub(super) hold: Option<super::hold::Hold>,
    /// Rows the latest request changed, as they were, to roll it back.
    pub(super) undo: Vec<Undo>,
    /// A bound of `limits.session` refused a request of it (recorded once).
    pub(super) stopped: bool,
    /// `ledger.compress`: the tool outputs the window sends as pointers.
    pub(super) compress: super::compress::Compressed,
    /// The hash of the stub message the last recorded window sent, and the
    /// step whose record holds it (`sent`).
    pub(super) sent_stub: Option<(u64, u32)>,
    /// The same for the compress pointers the last recorded window sent.
    pub(super) sent_pointers: Option<(u64, u32)>,
    /// The command calls among the rows ([`RowThread::of`]).
    pub(super) commands: CommandCalls,
    /// The working directory the rows state (the state block resolves
    /// relative paths against it).
    pub(super) cwd: Option<Box<str>>,
    /// The compress pointers the recorded session last sent (a restored
    /// session), sent again while the window stays at their cut.
    pub(super) restored_pointers: Option<oceancode_ledger::store::SentPointers>,
    /// The prompt cache as the session's previous request left it.
    pub(super) cache: CacheState,
}

/// What the next request's prompt cache facts compare against (a session
/// read back from the ledger starts `resumed`, with its models' last
/// times from its steps and nothing else).
#[derive(Debug, Default, Clone)]
pub(super) struct CacheState {
    /// Unix ms and model of the previous upstream request.
    pub(super) previous: Option<(i64, String)>,
    /// The other models this session sent, with when each was last sent
    /// (newest first, at most [`CacheState::MODELS`]): caches are per model.
    pub(super) models: Vec<(String, i64)>,
    /// Read back from the ledger, no request since.
    pub(super) resumed: bool,
    /// The previous request's system and tools hashes.
    pub(super) shape: Option<(u64, u64)>,
    /// The seqs the previous request's messages mapped to.
    pub(super) seqs: Vec<u64>,
    /// The context edit the previous window carried.
    pub(super) edit: u32,
    /// The previous answered step's prompt (input + cache read + write).
    pub(super) prompt: Option<u64>,
    /// Window events so far: requests whose window may differ from the one
    /// before it in more than what the client appended (a cut, a masking
    /// choice, a context edit). Between two events the window only appends.
    pub(super) events: u64,
    /// The previous request's body as the client sent it and as it went
    /// upstream, bytes (what a spend reservation prices the next one by).
    pub(super) sizes: Option<(usize, usize)>,
}

impl CacheState {
    /// Models remembered besides the previous request's: as many as the
    /// ledger reads back for a resumed session, less its last model.
    pub(super) const MODELS: usize = oceancode_ledger::store::RECENT_MODELS - 1;
}

/// [`State::recorded_line`]: the line, its label, the override.
pub(super) type RecordedLine = (u64, String, Option<String>);

impl State {
    pub(super) fn new(meta: SessionMeta, dialect: Dialect, tools_fp: u64, system_fp: u64) -> Self {
        State {
            meta,
            recorded_meta: None,
            dialect,
            rows: Default::default(),
            active: Vec::new(),
            answers: Vec::new(),
            open: Vec::new(),
            answered_ms: 0,
            branch: 0,
            step: 0,
            turn: 0,
            turn_lines: HashMap::new(),
            tideline: Tideline::default(),
            recorded_cut: 0,
            needs_seed: true,
            last_usage: None,
            pending_est: 0,
            override_line: None,
            recorded_line: None,
            learned_ceiling: None,
            reserves_max_tokens: false,
            tools_fp,
            system_fp,
            bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
            totals: Usage::default(),
            meter: Meter::default(),
            context: Default::default(),
            hidden: crate::recall_tool::Hidden::default(),
            recall_tool: false,
            hidden_gen: 0,
            block_cache: BlockCache::default(),
            hold: None,
            undo: Vec::new(),
            stopped: false,
            compress: Default::default(),
            sent_stub: None,
            sent_pointers: None,
            commands: CommandCalls::default(),
            cwd: None,
            restored_pointers: None,
            cache: CacheState::default(),
        }
    }

    /// Mark rows hidden (a branch, rows a sibling took).
    pub(super) fn hide(&mut self, seqs: &[u64]) {
        for &s in seqs {
            if let Some(r) = (s as usize)
                .checked_sub(1)
                .and_then(|i| self.rows.get_mut(i))
            {
                r.set_hidden();
            }
        }
        self.hidden_gen = self.hidden_gen.wrapping_add(1);
    }

    pub(super) fn row(&self, seq: u64) -> &RowMem {
        &self.rows[(seq - 1) as usize]
    }

    /// Length of the common prefix between the active line and `msgs`
    /// (read-only: compares raw hashes, then normalized hashes).
    pub(super) fn lcp(&self, msgs: &[&str], hashes: &[u64]) -> usize {
        let mut p = 0;
        while p < msgs.len() && p < self.active.len() {
            let r = self.row(self.active[p]);
            if r.raw_hash != hashes[p] && !r.echoed_by(&parse_msg(self.dialect, msgs[p])) {
                break;
            }
            p += 1;
        }
        p
    }

    /// How far a request's history follows this session: its common prefix
    /// with the active line, and the unechoed answer it continues with there.
    pub(super) fn reach(&self, msgs: &[&str], hashes: &[u64]) -> Reach {
        let shared = self.lcp(msgs, hashes);
        let at = self.seq_before(shared);
        let echoes = msgs
            .get(shared)
            .and_then(|m| self.echoed(at, m, hashes[shared], shared == self.active.len()));
        Reach { shared, echoes }
    }

    /// The active line's row before position `p` (0 = none).
    fn seq_before(&self, p: usize) -> u64 {
        p.checked_sub(1).map_or(0, |i| self.active[i])
    }

    /// The unechoed answer given after row `after` that `msg` echoes: the
    /// same bytes, the same normalized message, or the same tool call ids
    /// (else the same first text). With `fallback`, an assistant message
    /// echoes the latest answer there even when nothing else tells (a client
    /// that re-serializes what it got), as one answer pending always did.
    pub(super) fn echoed(&self, after: u64, msg: &str, hash: u64, fallback: bool) -> Option<usize> {
        let here = || {
            self.answers
                .iter()
                .enumerate()
                .rev()
                .filter(move |(_, a)| a.after == after)
                .filter_map(|(i, a)| a.rows.first().map(|&seq| (i, self.row(seq))))
        };
        here().next()?;
        if let Some((i, _)) = here().find(|(_, r)| r.raw_hash == hash) {
            return Some(i);
        }
        let p = parse_msg(self.dialect, msg);
        if let Some((i, _)) = here().find(|(_, r)| r.norm_hash == p.norm) {
            return Some(i);
        }
        if p.echo != 0 {
            if let Some((i, _)) = here().find(|(_, r)| r.echo == p.echo) {
                return Some(i);
            }
        }
        (fallback && p.info.kind == RowKind::Assistant)
            .then(|| here().find(|(_, r)| r.kind == RowKind::Assistant))
            .flatten()
            .map(|(i, _)| i)
    }

    /// Where a request leaves the active line, if it does before the line's
    /// end: the last row both share, and the unechoed answer (given there)
    /// it continues with. None when it continues the line or shares nothing.
    pub(super) fn divergence(&self, msgs: &[&str], hashes: &[u64]) -> Option<(u64, Option<usize>)> {
        let reach = self.reach(msgs, hashes);
        (reach.shared > 0 && reach.shared < self.active.len())
            .then(|| (self.seq_before(reach.shared), reach.echoes))
    }

    /// Take an unechoed answer off this session (another conversation
    /// continues it): its rows, to hide.
    pub(super) fn give_away(&mut self, answer: usize) -> Vec<u64> {
        if answer < self.answers.len() {
            let rows = self.answers.remove(answer).rows;
            self.hide(&rows);
            rows
        } else {
            Vec::new()
        }
    }

    /// Whether the active line is still in use: a step in flight, or one
    /// that finished (or a request that arrived) within `window_ms`.
    pub(super) fn live(&self, now: i64, window_ms: i64) -> bool {
        !self.open.is_empty() || now - self.answered_ms.max(self.meta.last_ms) < window_ms
    }

    /// A step was sent upstream: it answers the active line's last row.
    pub(super) fn step_opened(&mut self, step: u32) {
        let tip = self.active.last().copied().unwrap_or(0);
        self.open.push((step, tip));
    }

    /// A step finished (with an answer or not).
    pub(super) fn step_done(&mut self, step: u32, now: i64) {
        self.open.retain(|(s, _)| *s != step);
        self.answered_ms = now;
    }

    /// How many rows of the active line a request must share to continue
    /// this conversation: everything up to and including its first prompt
    /// (the whole line when it has none).
    pub(super) fn root_len(&self) -> usize {
        self.active
            .iter()
            .position(|&seq| self.row(seq).kind == RowKind::Prompt)
            .map_or(self.active.len(), |i| i + 1)
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.rows.len() as u64 + 1
    }

    pub(super) fn push_row(
        &mut self,
        raw: &str,
        bytes: RowBytes<'_>,
        p: Parsed,
        from_response: bool,
        events: &mut Vec<Row>,
    ) -> u64 {
        let seq = self.next_seq();
        if p.info.kind == RowKind::Prompt || p.info.asks {
            self.turn += 1;
            if let Some(l) = &p.info.first_line {
                self.turn_lines.insert(self.turn, (seq, l.clone()));
            }
        }
        let turn = self.turn.max(1);
        let media = media::cost(raw);
        let tokens = media::row_tokens(raw.len(), media, self.bytes_per_token);
        let thread = RowThread::of(
            self.dialect,
            seq,
            &p.info.role,
            p.info.kind,
            raw,
            &mut self.commands,
            &mut self.cwd,
        );
        self.rows.push(RowMem::new(NewRow {
            raw_hash: dialect::raw_hash(raw),
            norm_hash: p.norm,
            kind: p.info.kind,
            starts_ok: p.info.starts_ok,
            calls: Calls::of(&p.info),
            tokens,
            media,
            turn,
            echo: p.echo,
            standing: p.info.standing.clone().into_boxed_slice(),
            compaction: p.info.compaction,
            thread,
            hidden: false,
        }));
        events.push(Row {
            seq,
            role: p.info.role,
            kind: p.info.kind,
            raw: bytes.take(raw),
            tokens,
            turn,
            step: self.step,
            branch: self.branch,
            from_response,
        });
        seq
    }

    /// Keep row `idx`'s hashes as they are, to roll the request back.
    fn remember_hashes(&mut self, idx: usize) {
        let r = &self.rows[idx];
        self.undo.push(Undo {
            seq: idx as u64 + 1,
            raw_hash: r.raw_hash,
            norm_hash: r.norm_hash,
            echo: r.echo,
            calls: r.calls(),
            starts_ok: r.starts_ok(),
        });
    }

    /// Map the client's history onto the active line: record a branch when
    /// it diverges, confirm the answer it echoes, append what is new.
    pub(super) fn absorb(
        &mut self,
        msgs: &[&str],
        hashes: &[u64],
        body: &Bytes,
        events: &mut Vec<Event>,
    ) {
        let id = self.meta.id.clone();
        let mut p = 0;
        while p < msgs.len() && p < self.active.len() {
            let idx = (self.active[p] - 1) as usize;
            if self.rows[idx].raw_hash == hashes[p] {
                p += 1;
                continue;
            }
            let parsed = parse_msg(self.dialect, msgs[p]);
            if !self.rows[idx].echoed_by(&parsed) {
                break;
            }
            // The ledger keeps the bytes first sent (a cleared tool output too).
            self.remember_hashes(idx);
            self.rows[idx].raw_hash = hashes[p];
            p += 1;
        }
        if p < self.active.len() {
            let mut hidden = self.active.split_off(p);
            // The answers given on the abandoned line (its last one, never
            // echoed) end it too.
            let gone: std::collections::HashSet<u64> = hidden.iter().copied().collect();
            self.answers.retain(|a| {
                let keep = !gone.contains(&a.after);
                if !keep {
                    hidden.extend_from_slice(&a.rows);
                }
                keep
            });
            self.branch += 1;
            self.hide(&hidden);
            events.push(Event::Branch {
                session: id.clone(),
                at_seq: self.active.last().copied().unwrap_or(0),
                branch: self.branch,
                hidden,
            });
            self.tideline = Tideline::default();
            self.needs_seed = true;
            self.last_usage = None;
            self.pending_est = 0;
        }
        // The echo of an answer to the line's last row confirms its rows, in order.
        let tip = self.seq_before(p);
        if let Some(i) = msgs
            .get(p)
            .and_then(|m| self.echoed(tip, m, hashes[p], true))
        {
            for seq in self.answers.remove(i).rows {
                let Some(m) = msgs.get(p) else { break };
                let parsed = parse_msg(self.dialect, m);
                let idx = (seq - 1) as usize;
                if parsed.info.kind != RowKind::Assistant
                    || self.rows[idx].kind != RowKind::Assistant
                {
                    break;
                }
                // Confirm even a byte-identical echo: `from_response = 0` on
                // disk is what tells a restart (`State::restore`) that the row
                // is on the active line.
                events.push(Event::Confirm {
                    session: id.clone(),
                    seq,
                    raw: Arc::from(*m),
                });
                self.remember_hashes(idx);
                self.rows[idx].raw_hash = hashes[p];
                self.rows[idx].norm_hash = parsed.norm;
                self.rows[idx].echo = parsed.echo;
                // The window sends the echo's bytes: its calls are what the
                // edit set's closure and check read (a client may leave a
                // call of the answer out: Claude Code drops a `tool_use`
                // whose id it saw before, with the result it never ran).
                self.rows[idx].set_calls(Calls::of(&parsed.info));
                self.rows[idx].set_starts_ok(parsed.info.starts_ok);
                // The ledger keeps the echo's bytes: its transcript lines too.
                let thread = RowThread::of(
                    self.dialect,
                    seq,
                    &parsed.info.role,
                    parsed.info.kind,
                    m,
                    &mut self.commands,
                    &mut self.cwd,
                );
                self.rows[idx].set_thread(thread);
                self.active.push(seq);
                p += 1;
            }
        }
        // Room for every new row at once: a cold request's 2,001 rows
        // grown by doubling held the old and the new vector together.
        let mut rows = Vec::with_capacity(msgs.len() - p);
        let bytes = RowBytes::of(body, &msgs[p..]);
        for m in &msgs[p..] {
            let parsed = parse_msg(self.dialect, m);
            let seq = self.push_row(m, bytes, parsed, false, &mut rows);
            self.pending_est += u64::from(self.row(seq).tokens);
            self.active.push(seq);
        }
        if !rows.is_empty() {
            events.push(Event::Rows { session: id, rows });
        }
    }

    /// Append every message as new (server-side conversation state): the
    /// previous response's rows are taken as confirmed.
    pub(super) fn append_stateful(&mut self, msgs: &[&str], body: &Bytes, events: &mut Vec<Event>) {
        let tip = self.seq_before(self.active.len());
        if let Some(i) = self.answers.iter().rposition(|a| a.after == tip) {
            let answer = self.answers.remove(i);
            self.active.extend(answer.rows);
        }
        let mut rows = Vec::with_capacity(msgs.len());
        let bytes = RowBytes::of(body, msgs);
        for m in msgs {
            let parsed = parse_msg(self.dialect, m);
            let seq = self.push_row(m, bytes, parsed, false, &mut rows);
            self.active.push(seq);
        }
        if !rows.is_empty() {
            events.push(Event::Rows {
                session: self.meta.id.clone(),
                rows,
            });
        }
    }

    /// The active line for window planning. A window may start at a row
    /// only if the row allows it, no tool call made before it is still
    /// unanswered (parallel calls answered one by one), and the row before it
    /// does not bind to it (a reasoning item and its call).
    pub(super) fn row_infos(&self) -> Vec<RowInfo> {
        // The calls open at a row: a set of a few ids (the ids are hashes
        // already), so a vector is cheaper than hashing each id again.
        let mut open: Vec<u64> = Vec::new();
        let mut prev_binds = false;
        self.active
            .iter()
            .map(|&seq| {
                let r = self.row(seq);
                let starts_ok = r.starts_ok() && open.is_empty() && !prev_binds;
                for c in r.closes() {
                    if let Some(i) = open.iter().position(|o| o == c) {
                        open.swap_remove(i);
                    }
                }
                for &c in r.opens() {
                    if !open.contains(&c) {
                        open.push(c);
                    }
                }
                prev_binds = r.binds_next();
                RowInfo {
                    seq,
                    kind: r.kind,
                    starts_ok,
                }
            })
            .collect()
    }

    /// The last row the provider itself drops from every request: the one
    /// before the latest row on the active line holding a server-side
    /// compaction block (0 = none). A window may start at that block without
    /// changing what the provider keeps.
    pub(super) fn compaction_floor(&self) -> u64 {
        self.active
            .iter()
            .rev()
            .find(|&&s| self.row(s).compaction())
            .map_or(0, |&s| s - 1)
    }

    /// Rows on the active line after seq `from` up to `upto` (what a cut
    /// from `from` to `upto` takes out of the window).
    pub(super) fn rows_between(&self, from: u64, upto: u64) -> u64 {
        self.active
            .iter()
            .filter(|&&s| s > from && s <= upto)
            .count() as u64
    }

    pub(super) fn seed_rows(&self) -> Vec<(u64, u64)> {
        self.active
            .iter()
            .map(|&s| (s, u64::from(self.row(s).tokens)))
            .collect()
    }

    /// A step's answer arrived whole: calibrate the byte estimate, take the
    /// real usage into the gauge and the totals, and record the answer's
    /// rows, pending until the client echoes them.
    pub(super) fn take_answer(
        &mut self,
        step: u32,
        collected: &dialect::Collected,
        body_len: usize,
        body_media: Cost,
    ) -> Vec<Row> {
        if let Some(u) = collected.usage {
            // Learned from text alone: images and documents are priced by
            // their own rules, not by their bytes.
            let input = u.input_total();
            if let Some(m) = media::text_bytes_per_token(body_len, input, body_media) {
                self.bytes_per_token = 0.5 * self.bytes_per_token + 0.5 * m.clamp(1.0, 16.0);
            }
            self.last_usage = Some(u);
            self.pending_est = 0;
            // The meter follows the real window once the answer tells it
            // (after a forced cut the request's estimate was the old one).
            self.meter.gauge = u.window_total();
            if input > 0 {
                self.meter.fixed = match self.meter.fixed {
                    0 => input,
                    f => f.min(input),
                };
            }
            if !self.meter.fixed_warned {
                if let Some(note) =
                    oceancode_ledger::status::fixed_part_note(self.meter.fixed, self.meter.line)
                {
                    self.meter.fixed_warned = true;
                    tracing::warn!(session = %self.meta.id, "{note}");
                }
            }
            // What was billed: the window and what came on top of it
            // (server-side compaction), which the gauge never counts.
            self.totals = self.totals.plus(u).plus(collected.detail.extra);
        }
        let mut rows = Vec::new();
        let mut answer = Vec::new();
        for raw in &collected.rows {
            let parsed = parse_msg(self.dialect, raw);
            answer.push(self.push_row(raw, RowBytes::Copy, parsed, true, &mut rows));
        }
        if !answer.is_empty() {
            let after = self
                .open
                .iter()
                .find(|(s, _)| *s == step)
                .map_or_else(|| self.seq_before(self.active.len()), |(_, tip)| *tip);
            self.answers.push(Answer {
                after,
                rows: answer,
            });
            if self.answers.len() > MAX_ANSWERS {
                self.answers.remove(0);
            }
        }
        rows
    }

    /// The images and documents of a body of `messages` messages mapped
    /// onto the active line (its newest rows: all of them unless the
    /// provider holds the history), less what its window left out.
    pub(super) fn sent_media(&self, messages: usize, left_out: Cost) -> Cost {
        self.active[self.active.len().saturating_sub(messages)..]
            .iter()
            .fold(Cost::default(), |c, &s| c.plus(self.row(s).media()))
            .minus(left_out)
    }

    /// Rebuild the live state of a recorded session (parses every row once).
    pub(super) fn restore(l: LoadedSession) -> Self {
        let dialect = l.meta.dialect;
        let mut st = State::new(l.meta, dialect, 0, 0);
        st.recorded_meta = Some(st.meta.clone());
        st.branch = l.branch;
        st.step = l.steps;
        let hidden: std::collections::HashSet<u64> = l.hidden.into_iter().collect();
        // The last answer, until a client row follows it.
        let mut pending = Vec::new();
        for r in &l.rows {
            let p = parse_msg(dialect, &r.raw);
            if p.info.kind == RowKind::Prompt || p.info.asks {
                if let Some(line) = &p.info.first_line {
                    st.turn_lines.insert(r.turn, (r.seq, line.clone()));
                }
            }
            st.turn = st.turn.max(r.turn);
            st.rows.push(RowMem::new(NewRow {
                raw_hash: dialect::raw_hash(&r.raw),
                norm_hash: p.norm,
                kind: r.kind,
                starts_ok: p.info.starts_ok,
                calls: Calls::of(&p.info),
                tokens: r.tokens,
                media: media::cost(&r.raw),
                turn: r.turn,
                echo: p.echo,
                standing: p.info.standing.into_boxed_slice(),
                compaction: p.info.compaction,
                thread: RowThread::of(
                    dialect,
                    r.seq,
                    &r.role,
                    r.kind,
                    &r.raw,
                    &mut st.commands,
                    &mut st.cwd,
                ),
                hidden: hidden.contains(&r.seq),
            }));
            if !hidden.contains(&r.seq) {
                if r.from_response {
                    pending.push(r.seq);
                } else {
                    pending.clear();
                    st.active.push(r.seq);
                }
            }
        }
        if !pending.is_empty() {
            st.answers.push(Answer {
                after: st.seq_before(st.active.len()),
                rows: pending,
            });
        }
        // A restored ledger may miss rows the crash lost: seq numbering must
        // continue from what is on disk, which `rows.len()` does only if the
        // rows are gap-free (the store guarantees an in-order prefix).
        st.last_usage = l.last_usage;
        st.tideline = Tideline::resume(l.cut_upto);
        st.recorded_cut = l.cut_upto;
        st.meter.cut_upto = l.cut_upto;
        st.needs_seed = true;
        st.restored_pointers = l.pointers;
        st.cache.resumed = true;
        // The recorded last activity and model: a proxy restarted within the
        // TTL finds the provider's cache warm.
        st.cache.previous = (st.meta.last_ms > 0).then(|| (st.meta.last_ms, st.meta.model.clone()));
        // And the other models its steps sent, so that switching back to
        // one within its TTL finds it warm after a restart too (each
        // `oceancode-proxy run` is a new proxy).
        st.cache.models = l
            .models
            .into_iter()
            .filter(|(m, _)| *m != st.meta.model)
            .take(CacheState::MODELS)
            .collect();
        st.cache.prompt = st
            .last_usage
            .map(|u| u.input + u.cache_read + u.cache_write);
        // The session's own line override, as its last request recorded it
        // (another proxy may have served it before this one took it over).
        if let Some(o) = &l.line_override {
            match serde_json::from_str(o) {
                Ok(spec) => st.override_line = Some(spec),
                Err(e) => {
                    tracing::warn!(session = %st.meta.id, error = %e, "the recorded line override cannot be read; the session runs on the line in force")
                }
            }
        }
        // The recall tool's internal exchanges, back after their rows: the
        // next request's window is the one the session would have sent.
        for (after, messages) in l.exchanges {
            st.hidden.record(after, messages);
        }
        if let Some((n, set)) = l.context {
            st.context.taken = n;
            match serde_json::from_str(&set) {
                Ok(s) => st.context.set = s,
                Err(e) => {
                    tracing::warn!(session = %st.meta.id, error = %e, "the recorded context edit set cannot be read; the session goes on unedited")
                }
            }
        }
        st
    }

    /// Take what the ledger committed of this session as its state (the
    /// ledger fell behind on it): as after a restart, the client's next full
    /// resend then records the rest. What the ledger does not know of the
    /// live session (fingerprints, overrides, the learned ceiling and byte
    /// ratio, totals, the step count) is kept.
    pub(super) fn resync(&mut self, committed: Option<LoadedSession>) {
        let mut fresh = match committed {
            Some(l) => State::restore(l),
            None => State::new(self.meta.clone(), self.dialect, 0, 0),
        };
        fresh.tools_fp = self.tools_fp;
        fresh.system_fp = self.system_fp;
        fresh.override_line = self.override_line;
        fresh.learned_ceiling = self.learned_ceiling;
        fresh.reserves_max_tokens = self.reserves_max_tokens;
        fresh.bytes_per_token = self.bytes_per_token;
        fresh.totals = self.totals;
        // The edit set in force and the exported file are the live session's;
        // so are the recall tool's exchanges (the newest may not be committed).
        fresh.context = std::mem::take(&mut self.context);
        fresh.hidden = std::mem::take(&mut self.hidden);
        // So are the compress pointers the last window sent (kept while the
        // window stays at their cut).
        fresh.compress = std::mem::take(&mut self.compress);
        fresh.meter = Meter {
            cut_upto: fresh.meter.cut_upto,
            ..self.meter
        };
        fresh.step = fresh.step.max(self.step);
        // Steps in flight still answer (their rows land after the resync).
        fresh.open = std::mem::take(&mut self.open);
        fresh.answered_ms = self.answered_ms;
        tracing::info!(
            session = %self.meta.id,
            recorded = fresh.rows.len(),
            known = self.rows.len(),
            "ledger resync: this request records what the ledger missed"
        );
        *self = fresh;
    }

    /// Session facts.
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }

    /// The line override, if any.
    pub fn override_line(&self) -> Option<LineSpec> {
        self.override_line
    }
}
