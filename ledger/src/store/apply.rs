//! Applying one event, the part both engines decide alike: the checks
//! before an event writes (its session must be recorded, `Rows` must
//! continue the session gap-free), the [`Outcome`] built from what its SQL
//! returned, and how a batch takes that outcome ([`take`]).
//!
//! What stays per engine, and why: the SQL (two dialects) and how it runs.
//! SQLite (`lite/apply.rs`) runs each event synchronously under its own
//! savepoint on one rusqlite connection. PostgreSQL (`pg/apply.rs`) runs a
//! batch asynchronously over a socket, where round trips are the cost: it
//! takes the sessions' leases first, pipelines an event's statements, keeps
//! each session's partition day, and runs without savepoints until an
//! event fails (`Mode::Fast`/`Careful`). Those are two execution models of
//! the same decisions, so only the decisions are shared, as functions each
//! engine calls between its statements, not an interface both executors
//! would have to bend to.

use super::effects::{learn, Applied, Change, Effect, Known, Outcome};
use super::records::BehindReason;
use crate::model::{Event, Row, SessionMeta};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// The refusal of an event whose session the ledger does not hold (every
/// event but the session's facts needs them recorded first).
pub(super) fn unknown_session() -> Outcome {
    Outcome::Refused("unknown session".into())
}

/// The seq the next `Rows` event of `session` must start at, when the
/// writer knows it (None = the engine asks its database, [`next_after`]).
pub(super) fn known_next_seq(known: &HashMap<String, Known>, session: &str) -> Option<u64> {
    known.get(session).and_then(|k| k.next_seq)
}

/// The seq after `max`, the highest one stored (0 = none).
pub(super) fn next_after(max: i64) -> u64 {
    max.max(0) as u64 + 1
}

/// Whether `rows` may be written where the session's next seq is
/// `expected`: None = yes; else the refusal (they would leave a gap, and
/// what is stored stays a gap-free, in-order prefix).
pub(super) fn check_rows(rows: &[Row], expected: u64) -> Option<Outcome> {
    rows_gap(rows, expected).map(Outcome::Refused)
}

/// The session's facts were written, `meta` as a read gives them back.
pub(super) fn session_written(meta: SessionMeta) -> Outcome {
    Outcome::changed(Effect::Meta(meta), Vec::new())
}

/// `rows` were written: appended to the file caches, their turns' files
/// written again. Only the rows of the first and the last turn are copied
/// for the caches ([`Effect::Append`]): a cold open's thousands of rows in
/// between would be dropped by them anyway.
pub(super) fn rows_written(rows: &[Row]) -> Outcome {
    let mut turns = Vec::new();
    for r in rows {
        if turns.last() != Some(&r.turn) {
            turns.push(r.turn);
        }
    }
    let ends = [turns.first().copied(), turns.last().copied()];
    let kept = rows
        .iter()
        .filter(|r| ends.contains(&Some(r.turn)))
        .cloned()
        .collect();
    let skipped = turns
        .iter()
        .copied()
        .filter(|t| !ends.contains(&Some(*t)))
        .collect();
    Outcome::changed(
        Effect::Append {
            rows: kept,
            skipped,
        },
        turns,
    )
}

/// A `Confirm` of `seq` with `raw`, given what its update returned: the
/// row's turn and whether it is hidden (None = no such row: refused).
pub(super) fn confirmed(seq: u64, raw: &Arc<str>, hit: Option<(i64, bool)>) -> Outcome {
    let Some((turn, hidden)) = hit else {
        return Outcome::Refused(format!("confirm of unknown seq {seq}"));
    };
    let turn = turn.max(0) as u32;
    Outcome::Applied(Change {
        effect: Some(Effect::Confirm {
            seq,
            turn,
            raw: raw.clone(),
        }),
        turns: if hidden { Vec::new() } else { vec![turn] },
        reindex: false,
    })
}

/// Rows were hidden (a branch, or rows a sibling took), in `turns`: those
/// turns' files are written again and the cached rows dropped.
pub(super) fn hidden(turns: impl IntoIterator<Item = i64>) -> Outcome {
    let turns: BTreeSet<u32> = turns.into_iter().map(|t| t.max(0) as u32).collect();
    Outcome::changed(Effect::Invalidate, turns.into_iter().collect())
}

/// Take what applying `ev` (queue id `id`) came to into the batch:
/// applied, the writer learns from it; refused (`Ok(Refused)`: it does not
/// continue what is stored) or failed for good (`Err`: the database's
/// error for this event alone), its session falls behind. Whether it was
/// applied (if not, the engine drops what it queued for it).
pub(super) fn take(
    out: &mut Applied,
    known: &mut HashMap<String, Known>,
    ev: &Event,
    id: u64,
    outcome: Result<Outcome, String>,
) -> bool {
    let (reason, why) = match outcome {
        Ok(Outcome::Applied(change)) => {
            learn(known, ev);
            out.applied(ev, change);
            return true;
        }
        Ok(Outcome::Refused(why)) => (BehindReason::Gap, why),
        Err(why) => (BehindReason::Failed, why),
    };
    out.refused(ev, id, reason, why);
    false
}

/// Why `rows` do not continue a session whose next seq is `expected`
/// (None = they do: they start there and have no gap). What is on disk
/// stays a gap-free, in-order prefix.
fn rows_gap(rows: &[Row], expected: u64) -> Option<String> {
    let first = rows.first()?;
    if first.seq != expected {
        return Some(format!(
            "rows start at seq {} but the ledger expects {expected}",
            first.seq
        ));
    }
    rows.windows(2)
        .find(|w| w[1].seq != w[0].seq + 1)
        .map(|w| format!("rows jump from seq {} to {}", w[0].seq, w[1].seq))
}
