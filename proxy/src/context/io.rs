//! Writing `context.txt` behind the request: one thread, a job per file
//! (a newer one replaces the one not yet written: coalesced), atomic
//! replace, `0600`; and the receipt next to it. A file edited since the
//! proxy last wrote it is never overwritten, even by a swap racing the
//! edit (`renameat2(RENAME_EXCHANGE)`, then the stamp of what it took
//! out): the next request reads the edit first.

use super::edits::{Note, Src};
use super::export;
use super::live::{nonce_number, Saved, Slot, SlotState, Stamp};
use crate::dialect::{self, ParsedBody};
use bytes::Bytes;
use oceancode_window::Dialect;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// One refresh of a session's file.
pub struct Job {
    /// The file.
    pub slot: Arc<Slot>,
    /// The session's dialect.
    pub dialect: Dialect,
    /// The nonce the file carries.
    pub nonce: String,
    /// The body sent upstream.
    pub body: Bytes,
    /// Where each of its messages comes from.
    pub layout: Vec<Src>,
    /// The notes in force.
    pub notes: Vec<Note>,
    /// A receipt to write with it.
    pub receipt: Option<String>,
}

/// The jobs not yet written, one per file: keyed by the file's path, not
/// by the session id, because one process can hold two sessions of one id
/// in two data dirs (every test harness does), and a job must never
/// replace another file's job.
#[derive(Default)]
struct Queue(HashMap<PathBuf, Job>);

impl Queue {
    /// Queue `job`, replacing the job of the same file not yet written.
    fn push(&mut self, job: Job) {
        self.0.insert(job.slot.path.clone(), job);
    }

    /// Take any one job.
    fn take(&mut self) -> Option<Job> {
        let k = self.0.keys().next().cloned()?;
        self.0.remove(&k)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The writer's queue.
struct Writer {
    jobs: Mutex<Queue>,
    wake: Condvar,
    /// Jobs taken off the queue and not yet written.
    writing: std::sync::atomic::AtomicUsize,
}

fn writer() -> &'static Writer {
    static W: OnceLock<&'static Writer> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Writer = Box::leak(Box::new(Writer {
            jobs: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            writing: std::sync::atomic::AtomicUsize::new(0),
        }));
        let spawned = std::thread::Builder::new()
            .name("oceancode-context".into())
            .spawn(move || loop {
                let job = {
                    let mut jobs = w.jobs.lock();
                    loop {
                        if let Some(job) = jobs.take() {
                            w.writing.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            break Some(job);
                        }
                        w.wake.wait(&mut jobs);
                    }
                };
                if let Some(job) = job {
                    if let Err(e) = write(&job) {
                        tracing::warn!(session = %job.slot.session, error = %e, "cannot write context.txt");
                    }
                }
                w.writing.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the context.txt writer");
        }
        w
    })
}

/// Queue a refresh (it replaces the file's refresh not yet written).
pub fn submit(job: Job) {
    let w = writer();
    w.jobs.lock().push(job);
    w.wake.notify_one();
}

/// The file's text and record for a window's pieces.
pub fn render(
    d: Dialect,
    session: &str,
    nonce: &str,
    pieces: &[(Src, &str)],
    notes: &[Note],
) -> (String, super::edits::Export) {
    let blocks = export::blocks(d, pieces, notes);
    export::file(session, nonce, &blocks)
}

/// Write `text` as the slot's file unless it was edited since the proxy
/// last wrote (or read) it; then `record` is what edits are read against.
/// Returns whether it wrote.
pub fn replace(slot: &Slot, text: &str, record: super::edits::Export) -> std::io::Result<bool> {
    replace_checked(slot, text, record, || {})
}

/// [`replace`], with `between` run after the stamp check and before the
/// file is swapped in (a test's agent edits the file there).
fn replace_checked(
    slot: &Slot,
    text: &str,
    record: super::edits::Export,
    between: impl FnOnce(),
) -> std::io::Result<bool> {
    let mut st = slot.state.lock();
    let now = Stamp::of(&slot.path);
    if st.stamp.is_some() && now != st.stamp {
        // Edited (or removed) since: the next request reads it first.
        return Ok(false);
    }
    if let Some(dir) = slot.path.parent() {
        oceancode_ledger::paths::create_private_dir_all(dir)?;
    }
    between();
    match st.stamp {
        // Swapped in only if the file taken out is still the one checked:
        // an edit that landed since goes back into place.
        Some(seen) => {
            let unchanged = |m: &std::fs::Metadata| Stamp::of_meta(m) == seen;
            if !oceancode_ledger::paths::replace_if_unchanged(
                &slot.path,
                text.as_bytes(),
                unchanged,
            )? {
                return Ok(false);
            }
        }
        None => oceancode_ledger::paths::write_atomic(&slot.path, text.as_bytes())?,
    }
    st.stamp = Stamp::of(&slot.path);
    st.export = record;
    if let Some(stamp) = st.stamp {
        let saved = Saved {
            export: st.export.clone(),
            stamp,
        };
        let json = serde_json::to_vec(&saved)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        oceancode_ledger::paths::write_atomic(&saved_path(&slot.path), &json)?;
    }
    Ok(true)
}

/// `context.state.json` next to `context.txt`.
pub fn saved_path(file: &std::path::Path) -> std::path::PathBuf {
    file.with_file_name("context.state.json")
}

/// What a restart reads back of a session's exported file: the slot to
/// keep fresh (None = the file is gone, or its record is: `context` exports
/// it again) and the highest nonce number written, from the record and the
/// file's own first line (a nonce is never used twice).
pub fn resume(session: &str, file: &std::path::Path) -> (Option<SlotState>, u32) {
    let saved: Option<Saved> = read_file(&saved_path(file), MAX_SAVED_BYTES)
        .ok()
        .and_then(|(b, _)| serde_json::from_slice(&b).ok());
    // Only its first line matters (the nonce written); a file over the
    // bound is on disk all the same (an edit of it is refused when read).
    let mut head = Vec::with_capacity(512);
    let on_disk = match open_regular(file) {
        Ok((f, _)) => {
            use std::io::Read;
            let _ = f.take(4096).read_to_end(&mut head);
            true
        }
        Err(ReadError::Missing) => false,
        Err(_) => true,
    };
    let first = String::from_utf8_lossy(&head);
    let first = first.lines().next().unwrap_or_default();
    let written = super::edits::nonce_of(first).and_then(nonce_number);
    let floor = saved
        .as_ref()
        .and_then(|s| nonce_number(&s.export.nonce))
        .max(written)
        .unwrap_or(0);
    match saved {
        Some(s) if on_disk => (
            Some(SlotState {
                export: s.export,
                stamp: Some(s.stamp),
            }),
            floor,
        ),
        _ => {
            if on_disk {
                tracing::info!(
                    session,
                    "context.txt has no record to read edits against: `context` exports it again"
                );
            }
            (None, floor)
        }
    }
}

/// Write a receipt.
pub fn write_receipt(slot: &Slot, text: &str) -> std::io::Result<()> {
    if let Some(dir) = slot.receipt.parent() {
        oceancode_ledger::paths::create_private_dir_all(dir)?;
    }
    oceancode_ledger::paths::write_atomic(&slot.receipt, text.as_bytes())
}

fn write(job: &Job) -> std::io::Result<()> {
    let parsed = ParsedBody::parse(&job.body, dialect::conv_key(job.dialect))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let pieces: Vec<(Src, &str)> = job
        .layout
        .iter()
        .copied()
        .zip(parsed.messages.iter().copied())
        .collect();
    let (text, record) = render(
        job.dialect,
        &job.slot.session,
        &job.nonce,
        &pieces,
        &job.notes,
    );
    replace(&job.slot, &text, record)?;
    if let Some(r) = &job.receipt {
        write_receipt(&job.slot, r)?;
    }
    Ok(())
}

/// Why a file of the session dir was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not there.
    #[error("the file is gone")]
    Missing,
    /// A symlink (never followed: it could lead out of the session dir).
    #[error("the file is a symlink: only a regular file is read there, never followed")]
    Symlink,
    /// A FIFO, socket, device or directory.
    #[error("the file is not a regular file (a {0}): only a regular file is read there")]
    NotRegular(&'static str),
    /// Larger than the bound (refused unread).
    #[error("the file is {len} bytes, over the {max} bytes read back")]
    TooLarge {
        /// Its size.
        len: u64,
        /// The bound.
        max: u64,
    },
    /// Any other error of `open(2)` or `read(2)`.
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_dir() {
        "directory"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// Read a file of a directory the agent can write (the session dir): only
/// a regular file, opened without following a symlink (`O_NOFOLLOW`) and
/// without blocking on a FIFO (`O_NONBLOCK`), checked with `fstat` after
/// the open, at most `max` bytes (a larger one is refused unread). Returns
/// the bytes and the stamp of the file read.
pub fn read_file(path: &std::path::Path, max: u64) -> Result<(Vec<u8>, Stamp), ReadError> {
    use std::io::Read;
    let (f, m) = open_regular(path)?;
    if m.len() > max {
        return Err(ReadError::TooLarge { len: m.len(), max });
    }
    let mut out = Vec::with_capacity(m.len() as usize);
    (&f).take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(ReadError::TooLarge {
            len: out.len() as u64,
            max,
        });
    }
    Ok((out, Stamp::of_meta(&m)))
}

/// Open a regular file the way [`read_file`] does: no symlink followed, a
/// FIFO opened without waiting for a writer, anything but a regular file
/// refused. Every file the proxy reads from a directory someone else may
/// write (a session dir, the registry, the admin token) opens here.
pub(crate) fn open_regular(
    path: &std::path::Path,
) -> Result<(std::fs::File, std::fs::Metadata), ReadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => ReadError::Symlink,
            Some(libc::ENOENT) => ReadError::Missing,
            _ => ReadError::Io(e),
        })?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(ReadError::NotRegular(kind_of(m.file_type())));
    }
    Ok((f, m))
}

/// Read an edited `context.txt` (at most [`super::file::MAX_FILE_BYTES`]),
/// the rule of [`read_file`].
pub fn read(path: &std::path::Path) -> Result<(Vec<u8>, Stamp), String> {
    read_file(path, super::file::MAX_FILE_BYTES).map_err(|e| e.to_string())
}

/// Largest `context.state.json` read back (an export's record: ~60 bytes a block).
const MAX_SAVED_BYTES: u64 = 16 << 20;

/// Largest receipt read back.
pub const MAX_RECEIPT_BYTES: u64 = 1 << 20;

/// Wait until no refresh is queued or being written (tests, the `context`
/// command).
pub fn drain(timeout: std::time::Duration) {
    let until = std::time::Instant::now() + timeout;
    let busy = || {
        let w = writer();
        let queued = !w.jobs.lock().is_empty();
        queued || w.writing.load(std::sync::atomic::Ordering::SeqCst) > 0
    };
    while busy() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(dir: &std::path::Path, nonce: &str) -> Job {
        Job {
            slot: Arc::new(Slot {
                session: "e1".into(),
                path: dir.join("context.txt"),
                receipt: dir.join("context.receipt.txt"),
                state: Mutex::new(SlotState::default()),
            }),
            dialect: Dialect::Anthropic,
            nonce: nonce.into(),
            body: Bytes::new(),
            layout: Vec::new(),
            notes: Vec::new(),
            receipt: None,
        }
    }

    /// Two data dirs each holding a session `e1` (two proxies in one
    /// process, as in the tests): the second job must not replace the
    /// first (it did when the queue was keyed by session id, and a
    /// refused edit's receipt was then never written). A newer job of
    /// the same file still replaces the older one.
    #[test]
    fn a_job_replaces_only_the_job_of_its_own_file() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut q = Queue::default();
        q.push(job(a.path(), "n1"));
        q.push(job(b.path(), "n2"));
        q.push(job(a.path(), "n3"));
        let mut taken: Vec<(PathBuf, String)> = std::iter::from_fn(|| q.take())
            .map(|j| (j.slot.path.clone(), j.nonce))
            .collect();
        taken.sort();
        let mut want = vec![
            (a.path().join("context.txt"), "n3".to_string()),
            (b.path().join("context.txt"), "n2".to_string()),
        ];
        want.sort();
        assert_eq!(taken, want);
        assert!(q.is_empty());
    }

    /// An agent's edit that lands after the stamp check, before the new
    /// file goes into place, is kept: the file is not replaced, and the
    /// next request reads the edit.
    #[test]
    fn an_edit_made_while_the_file_is_replaced_is_never_lost() {
        let dir = tempfile::tempdir().unwrap();
        let slot = job(dir.path(), "n1").slot;
        let record = || super::super::edits::Export::default();
        assert!(replace(&slot, "proxy v1\n", record()).unwrap());
        let path = slot.path.clone();
        for (how, edit) in [
            ("renamed into place", "agent edit A\n"),
            ("written in place", "agent edit B, longer\n"),
        ] {
            let wrote = replace_checked(&slot, "proxy v2\n", record(), || match how {
                "renamed into place" => {
                    oceancode_ledger::paths::write_atomic(&path, edit.as_bytes()).unwrap()
                }
                _ => std::fs::write(&path, edit).unwrap(),
            })
            .unwrap();
            assert!(!wrote, "{how}: the edit is not replaced");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), edit, "{how}");
            // The proxy takes the file as it is now (as reading the edit would).
            slot.state.lock().stamp = Stamp::of(&path);
        }
        // No temporary file is left beside it.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.contains(".tmp") && !n.contains(".swap")),
            "{names:?}"
        );
    }
}
