//! What travels from the handles to the writer thread (events, barriers,
//! jobs), and the state both sides share: pending events and counters.

use super::writer::Writer;
use crate::model::Event;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::SyncSender;
use std::time::Instant;
use tokio::sync::oneshot;

/// Counters and pending events, shared by the handles and the writer.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) next_id: AtomicU64,
    /// Enqueue time of every queued-but-uncommitted event, by id.
    pub(super) pending: Mutex<BTreeMap<u64, Instant>>,
    pub(super) lags_us: Mutex<VecDeque<u64>>,
    pub(super) events: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) commits_failed: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) queue_full_waits: AtomicU64,
    pub(super) transcript_errors: AtomicU64,
    pub(super) pages_written: AtomicU64,
    pub(super) sessions_removed: AtomicU64,
}

impl Shared {
    /// The events `ids` left the queue (committed, refused or lost).
    pub(super) fn forget(&self, ids: impl Iterator<Item = u64>) {
        let mut p = self.pending.lock();
        for id in ids {
            p.remove(&id);
        }
    }
}

/// Where a settle barrier answers.
pub(super) enum Reply {
    Async(oneshot::Sender<()>),
    Blocking(SyncSender<()>),
}

impl Reply {
    pub(super) fn send(self) {
        match self {
            Reply::Async(tx) => {
                let _ = tx.send(());
            }
            Reply::Blocking(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

/// Work run on the writer thread, in queue order with the events.
pub(super) type Job = Box<dyn FnOnce(&mut Writer) + Send>;

/// One command of the writer's queue.
pub(super) enum Cmd {
    Event { ev: Event, id: u64, at: Instant },
    Settle(Reply),
    Job(Job),
    Shutdown,
}
