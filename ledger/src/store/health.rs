//! Health both engines report (`/_oceancode/health`) from the writer's
//! shared state, and how long the restorer waits for queued writes.

use super::queue::Shared;
use super::records::{BehindReason, Health, HealthStatus};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Longest the restorer waits for the writer to commit what is queued of
/// the client key it reads.
pub const RESTORE_WAIT: Duration = Duration::from_secs(1);

/// What `health` reports for an engine's shared writer state (the
/// SQLite and PostgreSQL engines alike).
pub(super) fn health_of(s: &Shared) -> Health {
    let (queued, queued_bytes, lag_ms) = s.queue_state();
    let mut reasons = Vec::new();
    {
        let f = s.faults.lock();
        if let Some(c) = &f.commit {
            reasons.push(format!(
                "ledger commits failing for {:.0}s ({} retries, {queued} events waiting): {}",
                c.since.elapsed().as_secs_f64(),
                c.retries,
                c.error
            ));
        }
        if let Some(c) = &f.files {
            reasons.push(format!(
                "transcript writes failing for {:.0}s ({} sessions wait to be written again): {}",
                c.since.elapsed().as_secs_f64(),
                f.files_sessions,
                c.error
            ));
        }
    }
    if s.shedding() {
        reasons.push(format!(
            "the ledger write queue is full ({queued} events, {queued_bytes} bytes): new events are shed"
        ));
    }
    let behind = s.behind_sessions();
    if !behind.is_empty() {
        let count = |r: BehindReason| behind.iter().filter(|(_, b)| b.reason == r).count();
        let mut why = Vec::new();
        for (r, label) in [
            (BehindReason::Shed, "shed"),
            (BehindReason::Gap, "gap"),
            (BehindReason::Failed, "failed"),
        ] {
            let n = count(r);
            if n > 0 {
                why.push(format!("{n} {label}"));
            }
        }
        let reopened = s.reopens.load(Ordering::Relaxed);
        reasons.push(format!(
            "{} sessions behind ({}{}): each heals from its client's next full resend",
            behind.len(),
            why.join(", "),
            if reopened > 0 {
                format!("; the database was opened afresh {reopened} times after its file was deleted or replaced")
            } else {
                String::new()
            }
        ));
    }
    Health {
        status: if reasons.is_empty() {
            HealthStatus::Ok
        } else {
            HealthStatus::Degraded
        },
        reasons,
        lag_ms,
        queued,
        queued_bytes,
        behind: behind.len() as u64,
    }
}
