//! An engine's hold on its writer thread, the same on both engines: the
//! command channel and the thread. Events are admitted against the queue's
//! budget and sent; settles, jobs and shutdown go the same way, in queue
//! order. Each engine's handle ([`super::Store`], [`super::pg::PgStore`])
//! owns one and adds its reads.

use super::backend::SettleFuture;
use super::error::StoreError;
use super::queue::{Admit, Cmd, Reply, Shared};
use crate::model::Event;
use parking_lot::{Mutex, RwLock};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::oneshot;
use tracing::warn;

/// The channel to a writer thread (`W` = the writer its jobs get) and the
/// thread. Dropped, it shuts the writer down.
pub(super) struct WriterHandle<W: 'static> {
    tx: RwLock<Option<Sender<Cmd<W>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl<W: 'static> Drop for WriterHandle<W> {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            warn!("ledger writer shutdown on drop: {e}");
        }
    }
}

impl<W: 'static> WriterHandle<W> {
    /// The handle of the writer `thread` reading `tx`'s channel.
    pub(super) fn new(
        tx: Sender<Cmd<W>>,
        thread: JoinHandle<()>,
        shared: Arc<Shared>,
    ) -> WriterHandle<W> {
        WriterHandle {
            tx: RwLock::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            shared,
        }
    }

    /// Queue an event: never blocks. One that does not fit the budget is
    /// shed (its session falls behind) when `shed`, else handed back
    /// ([`StoreError::QueueFull`]).
    pub(super) fn enqueue(&self, ev: Event, shed: bool) -> Result<(), StoreError> {
        let shared = &self.shared;
        let guard = self.tx.read();
        let tx = guard.as_ref().ok_or(StoreError::Closed)?;
        let (id, at) = match shared.admit(&ev, shed) {
            Admit::Queue { id, at } => (id, at),
            Admit::Dropped => return Ok(()),
            Admit::Full => return Err(StoreError::QueueFull(Box::new(ev))),
        };
        tx.send(Cmd::Event { ev, id, at }).map_err(|_| {
            shared.forget(std::iter::once(id));
            StoreError::Closed
        })
    }

    /// Send a command behind what is queued.
    pub(super) fn send(&self, cmd: Cmd<W>) -> Result<(), StoreError> {
        let guard = self.tx.read();
        let tx = guard.as_ref().ok_or(StoreError::Closed)?;
        tx.send(cmd).map_err(|_| StoreError::Closed)
    }

    /// Resolves once everything queued before it is committed and its
    /// files are written.
    pub(super) fn settle(&self) -> SettleFuture<'_> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.send(Cmd::Settle(Reply::Async(tx)))?;
            rx.await.map_err(|_| StoreError::Closed)
        })
    }

    /// Blocking form of [`WriterHandle::settle`].
    pub(super) fn settle_blocking(&self) -> Result<(), StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Cmd::Settle(Reply::Blocking(tx)))?;
        rx.recv().map_err(|_| StoreError::Closed)
    }

    /// [`WriterHandle::settle_blocking`] for at most `wait`: whether it settled.
    pub(super) fn settle_within(&self, wait: Duration) -> Result<bool, StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Cmd::Settle(Reply::Blocking(tx)))?;
        match rx.recv_timeout(wait) {
            Ok(()) => Ok(true),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(false),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(StoreError::Closed),
        }
    }

    /// Run `f` on the writer thread after everything queued before it, and
    /// wait for its result (blocking; from async code use a blocking
    /// thread). A panic in it is an error, not the writer's end.
    pub(super) fn run_job<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut W) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Cmd::Job(Box::new(move |w: &mut W| {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(w)))
                .unwrap_or_else(|_| Err(StoreError::Corrupt("ledger job panicked".into())));
            let _ = tx.send(result);
        })))?;
        rx.recv().map_err(|_| StoreError::Closed)?
    }

    /// Drain, commit and join the writer. Idempotent.
    pub(super) fn shutdown(&self) -> Result<(), StoreError> {
        // A batch the writer cannot commit is retried for a grace period
        // only, so shutdown ends.
        self.shared.stopping.store(true, Ordering::Release);
        if let Some(tx) = self.tx.write().take() {
            let _ = tx.send(Cmd::Shutdown);
        }
        let mut thread = self.thread.lock();
        if let Some(handle) = thread.take() {
            handle.join().map_err(|_| StoreError::Closed)?;
        }
        Ok(())
    }
}
