//! What applying an event changes beyond the database, as the writer
//! loop ([`super::writer`]) and the files ([`super::files`]) use it: an
//! event's [`Outcome`] and [`Change`], a batch's [`Applied`], a session's
//! [`Touch`] and its file-cache [`Effect`]s; and what the writer learns of
//! a session as events commit ([`Known`], [`learn`]). The same on both
//! engines.

use super::queue::lossless;
use super::records::BehindReason;
use crate::model::{Dialect, Event, Row, SessionMeta};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// What a committed event changes in the writer's caches.
pub(super) enum Effect {
    Meta(SessionMeta),
    /// Rows were written. The file caches hold the rows of one turn, the
    /// newest one written, which an event can only continue (its first
    /// turn) or be in (its last): `rows` are those two turns' rows, and
    /// the turns between are in `skipped` (a cache on one of them is
    /// dropped and the turn read back when rendered).
    Append {
        rows: Vec<Row>,
        skipped: Vec<u32>,
    },
    Confirm {
        seq: u64,
        turn: u32,
        raw: Arc<str>,
    },
    Invalidate,
}

/// What a batch changed of one session: caches to update, files to write.
#[derive(Default)]
pub(super) struct Touch {
    pub(super) effects: Vec<Effect>,
    pub(super) turns: BTreeSet<u32>,
    /// The session's facts or its list of turns may change: `index.md`.
    pub(super) index: bool,
    /// Rows, cuts, branches or confirms: `SESSION.md` may change.
    pub(super) page: bool,
}

impl Touch {
    /// Add what a later batch changed of the same session.
    pub(super) fn merge(&mut self, later: Touch) {
        self.effects.extend(later.effects);
        self.turns.extend(later.turns);
        self.index |= later.index;
        self.page |= later.page;
    }
}

/// What applying one event did.
pub(super) enum Outcome {
    /// Applied, and what that changes beyond the database.
    Applied(Change),
    /// Refused (nothing written), and why.
    Refused(String),
}

impl Outcome {
    /// Applied; nothing to do beyond the database.
    pub(super) fn quiet() -> Outcome {
        Outcome::Applied(Change::default())
    }

    /// Applied: `effect` on the file caches, the transcripts of `turns`
    /// and `index.md` to write again.
    pub(super) fn changed(effect: Effect, turns: Vec<u32>) -> Outcome {
        Outcome::Applied(Change {
            effect: Some(effect),
            turns,
            reindex: true,
        })
    }
}

/// What an applied event changes beyond the database: the writer's files.
#[derive(Default)]
pub(super) struct Change {
    /// Its effect on the file caches (None = none).
    pub(super) effect: Option<Effect>,
    /// The turns whose transcripts it touched.
    pub(super) turns: Vec<u32>,
    /// Whether `index.md` changes.
    pub(super) reindex: bool,
}

/// What one successful attempt at a batch did.
#[derive(Default)]
pub(super) struct Applied {
    pub(super) touched: BTreeMap<String, Touch>,
    pub(super) refused: u64,
    /// Sessions that fall behind with this batch.
    pub(super) behind: Vec<Fell>,
    /// Events skipped because their session fell behind earlier in the batch.
    pub(super) skipped: u64,
    /// Sessions that fell behind in this batch (their later events skipped).
    fallen: HashSet<String>,
}

impl Applied {
    /// Whether `ev` is skipped because its session fell behind earlier in
    /// the batch (counted); steps and session facts never are.
    pub(super) fn skips(&mut self, ev: &Event) -> bool {
        let skip = !lossless(ev) && self.fallen.contains(ev.session());
        self.skipped += u64::from(skip);
        skip
    }

    /// `ev` was applied: what it changes of its session.
    pub(super) fn applied(&mut self, ev: &Event, change: Change) {
        let t = self.touched.entry(ev.session().to_string()).or_default();
        t.effects.extend(change.effect);
        t.turns.extend(change.turns);
        t.index |= change.reindex;
        t.page |= !matches!(
            ev,
            Event::Session(_) | Event::Step { .. } | Event::Line { .. } | Event::ContextEdit { .. }
        );
    }

    /// `ev` (queue id `id`) was refused: its session falls behind.
    pub(super) fn refused(&mut self, ev: &Event, id: u64, reason: BehindReason, why: String) {
        let session = ev.session().to_string();
        self.refused += 1;
        self.fallen.insert(session.clone());
        self.behind.push(Fell {
            session,
            id,
            reason,
            why,
        });
    }
}

/// A session that fell behind with a batch, and the event it fell at.
pub(super) struct Fell {
    pub(super) session: String,
    /// The refused event's queue id.
    pub(super) id: u64,
    pub(super) reason: BehindReason,
    /// Why, for the log line.
    pub(super) why: String,
}

/// Facts of a session the writer has committed events for, so a step does
/// not query for them.
#[derive(Clone, Copy, Default)]
pub(super) struct Known {
    pub(super) dialect: Option<Dialect>,
    /// The seq the next `Rows` event must start at (None = ask the database).
    pub(super) next_seq: Option<u64>,
    /// PostgreSQL: the session's partition day.
    pub(super) day: Option<i64>,
}

/// What a committed event teaches the writer about its session.
pub(super) fn learn(known: &mut HashMap<String, Known>, ev: &Event) {
    match ev {
        Event::Session(m) => {
            known.entry(m.id.clone()).or_default().dialect = Some(m.dialect);
        }
        Event::Rows { session, rows } => {
            if let Some(last) = rows.last() {
                known.entry(session.clone()).or_default().next_seq = Some(last.seq + 1);
            }
        }
        _ => {}
    }
}
