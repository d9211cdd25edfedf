//! What a live session keeps of its context edits: the edit set in force,
//! the export the file was last written from (shared with the writer), and
//! the layout of the last window (what `context` exports).

use super::edits::{EditSet, Export, Src};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// What identifies a version of the file on disk (size, mtime, inode): a
/// stat, never a read, tells whether it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stamp {
    /// Bytes.
    pub len: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// Inode (an atomic replace makes a new one).
    pub ino: u64,
}

impl Stamp {
    /// The stamp of `path` itself (None = no file): `lstat`, so a symlink
    /// put in its place is a change, never followed.
    pub fn of(path: &std::path::Path) -> Option<Stamp> {
        std::fs::symlink_metadata(path)
            .ok()
            .map(|m| Stamp::of_meta(&m))
    }

    /// The stamp of a file's metadata.
    pub fn of_meta(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            len: m.len(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            ino: m.ino(),
        }
    }
}

/// The export in the file, shared by the request path (which reads edits
/// against it) and the writer (which replaces it).
#[derive(Debug, Default)]
pub struct SlotState {
    /// What the file was last written from.
    pub export: Export,
    /// The file as the proxy last wrote it or read it (None = not yet).
    pub stamp: Option<Stamp>,
}

/// A session's exported file.
#[derive(Debug)]
pub struct Slot {
    /// Ledger session id.
    pub session: String,
    /// `sessions/<id>/context.txt`.
    pub path: PathBuf,
    /// `sessions/<id>/context.receipt.txt`.
    pub receipt: PathBuf,
    /// The export and the stamp.
    pub state: Mutex<SlotState>,
}

/// What survives a restart of an exported file (`context.state.json` next
/// to it, written with every write of the file): the export it was written
/// from, its stamp, and the highest nonce written, so a session read back
/// from the ledger keeps its file fresh and never repeats a nonce.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    /// The export the file was written from (its nonce included).
    pub export: Export,
    /// The file as written.
    pub stamp: Stamp,
}

/// The number of a nonce (`e7-…` → 7).
pub fn nonce_number(nonce: &str) -> Option<u32> {
    let rest = nonce.strip_prefix('e')?;
    rest.split('-').next()?.parse().ok()
}

/// A nonce: `e<n>-<8 random hex digits>`. The number orders exports; the
/// random part is what no text written before the export can hold, so a
/// block header copied from a tool output (or any older text) never names
/// the export in force.
pub fn nonce(n: u32) -> String {
    let mut b = [0u8; 4];
    if let Err(e) = getrandom::getrandom(&mut b) {
        // The clock's nanoseconds: still unknown to any earlier text.
        tracing::warn!(error = %e, "no OS randomness for a context.txt nonce");
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
        b = t.to_le_bytes();
    }
    format!("e{n}-{:08x}", u32::from_le_bytes(b))
}

/// A live session's context edits.
#[derive(Debug, Default)]
pub struct Live {
    /// The edit set in force.
    pub set: EditSet,
    /// Edits taken so far (the ledger numbers them).
    pub taken: u32,
    /// The exported file (None = nobody exported this session).
    pub slot: Option<Arc<Slot>>,
    /// Exports written (the nonce of the next is `e<exports + 1>-…`).
    pub exports: u32,
    /// The nonce the file carries (changes with every export: the
    /// `context` command, and each edit read, taken or refused).
    pub nonce: String,
    /// The layout of the last window (None = the whole active line, as sent).
    pub layout: Option<Vec<Src>>,
    /// The stub message of the last window.
    pub stub: Option<String>,
    /// A receipt to write with the next refresh of the file.
    pub receipt: Option<String>,
    /// The last receipt written.
    pub last_receipt: Option<String>,
    /// `context.seq_tags`: tool results end with `[seq N]` upstream.
    pub seq_tags: bool,
    /// Tagged tool results by seq: (xxh3 of the client's bytes, the tagged
    /// bytes), so a row is tagged once, not per request.
    pub tagged: Mutex<HashMap<u64, (u64, Arc<str>)>>,
}

impl Live {
    /// Nonces from now on are numbered above `n` (one already written).
    pub fn floor(&mut self, n: u32) {
        self.exports = self.exports.max(n);
    }

    /// A new nonce for the next export.
    pub fn mint(&mut self) -> String {
        self.exports += 1;
        self.nonce = nonce(self.exports);
        self.nonce.clone()
    }
}
