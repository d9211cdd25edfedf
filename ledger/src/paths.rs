//! The data-dir layout of the ledger and its file permissions:
//!
//! ```text
//! <data>/oceancode.db                              SQLite, WAL (0600)
//! <data>/sessions/<id>/SESSION.md                  the living page (written elsewhere)
//! <data>/sessions/<id>/transcript/index.md         turns, seq ranges, first lines, tokens
//! <data>/sessions/<id>/transcript/NNNN.md          one file per turn (4-digit, 1-based)
//! ```
//!
//! Directories are created `0700` and files `0600`: the ledger holds whole
//! conversations. Session ids are mapped to a safe directory name by
//! [`sanitize_session_id`].

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Mode of every directory the ledger creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the ledger creates.
pub const FILE_MODE: u32 = 0o600;
/// File name of the database inside the data dir.
pub const DB_FILE: &str = "oceancode.db";
/// Longest directory name derived from a session id (before the hash suffix).
const MAX_ID_LEN: usize = 96;

/// The layout of one data dir (pure path arithmetic; nothing touches disk
/// except the `ensure_*` methods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// A layout rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    /// The data dir itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<data>/oceancode.db`.
    pub fn db_path(&self) -> PathBuf {
        self.root.join(DB_FILE)
    }

    /// `<data>/sessions`.
    pub fn sessions_dir(&self) -> PathBuf {
        self.root.join("sessions")
    }

    /// `<data>/sessions/<sanitized id>`.
    pub fn session_dir(&self, id: &str) -> PathBuf {
        self.sessions_dir().join(sanitize_session_id(id))
    }

    /// `<data>/sessions/<id>/transcript`.
    pub fn transcript_dir(&self, id: &str) -> PathBuf {
        self.session_dir(id).join("transcript")
    }

    /// `<data>/sessions/<id>/transcript/NNNN.md`.
    pub fn turn_file(&self, id: &str, turn: u32) -> PathBuf {
        self.transcript_dir(id).join(turn_file_name(turn))
    }

    /// `<data>/sessions/<id>/transcript/NNNN.rows.md` (the turn file's line index).
    pub fn rows_file(&self, id: &str, turn: u32) -> PathBuf {
        self.transcript_dir(id).join(rows_file_name(turn))
    }

    /// `<data>/sessions/<id>/transcript/index.md`.
    pub fn index_file(&self, id: &str) -> PathBuf {
        self.transcript_dir(id).join("index.md")
    }

    /// `<data>/sessions/<id>/SESSION.md`.
    pub fn session_md(&self, id: &str) -> PathBuf {
        self.session_dir(id).join("SESSION.md")
    }

    /// Create the data dir (if missing, `0700`) and `sessions/` (`0700`).
    pub fn ensure_root(&self) -> io::Result<()> {
        create_private_dir_all(&self.root)?;
        create_private_dir_all(&self.sessions_dir())
    }

    /// Create `sessions/<id>/transcript/` (`0700` for every level created).
    pub fn ensure_transcript_dir(&self, id: &str) -> io::Result<PathBuf> {
        let dir = self.transcript_dir(id);
        create_private_dir_all(&dir)?;
        Ok(dir)
    }
}

/// `NNNN.md` for a turn (at least 4 digits).
pub fn turn_file_name(turn: u32) -> String {
    format!("{turn:04}.md")
}

/// `NNNN.rows.md`: the sidecar of a turn file, where each of its rows is.
pub fn rows_file_name(turn: u32) -> String {
    format!("{turn:04}.rows.md")
}

/// Map a session id to a directory name that is safe on any filesystem:
/// ASCII letters, digits, `-`, `_` and `.` are kept, anything else becomes
/// `_`, a leading `.` becomes `_`, and the name is capped at 96 characters.
/// When the id had to be changed, `-` and 8 hex digits of its hash are
/// appended so two different ids never share a directory. An id that is
/// already safe maps to itself.
pub fn sanitize_session_id(id: &str) -> String {
    let mut out: String = id
        .chars()
        .take(MAX_ID_LEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    if out.is_empty() {
        out.push('_');
    }
    if out != id {
        let h = xxhash_rust::xxh3::xxh3_64(id.as_bytes());
        out.push_str(&format!("-{:08x}", h as u32));
    }
    out
}

/// Create `dir` and its missing parents with mode `0700` (existing
/// directories are left as they are).
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Set a file's mode to `0600` (no-op if it does not exist).
pub fn make_private(path: &Path) -> io::Result<()> {
    match fs::set_permissions(path, Permissions::from_mode(FILE_MODE)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Create the database file `0600` if it is missing and fix the mode of an
/// existing one (and of its `-wal`/`-shm` companions) to `0600`.
///
/// An existing database is never opened here: POSIX record locks belong to
/// the process, so closing any descriptor of the file drops the locks
/// SQLite holds on it through its own. A proxy that lost its shared lock
/// this way let the next CLI command that closed the database take it for
/// itself, checkpoint and delete the WAL the proxy was still writing to.
pub fn prepare_db_file(db: &Path) -> io::Result<()> {
    if !db.exists() {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(db)
        {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    make_private(db)?;
    for suffix in ["-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        make_private(Path::new(&p))?;
    }
    Ok(())
}

/// Replace `path` atomically with `contents`: write a `0600` temp file in
/// the same directory, then rename it over `path`, so a reader sees either
/// the old or the new file, never a torn one. (No fsync: transcripts can be
/// rebuilt from the database.)
pub fn write_atomic(path: &Path, contents: &[u8]) -> io::Result<()> {
    let tmp = write_temp_beside(path, contents)?;
    let result = fs::rename(&tmp, path);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// A new `0600` temp file next to `path` holding `contents`.
fn write_temp_beside(path: &Path, contents: &[u8]) -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.tmp{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)?;
        f.write_all(contents)
    })();
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Replace file `path` with `contents` unless the file taken out of its
/// place is no longer the one the caller last saw (`unchanged` of its
/// `lstat` says no): that file then goes back and the answer is
/// `Ok(false)`, as it is when `path` is gone. The swap is one
/// `renameat2(RENAME_EXCHANGE)`, so a write that lands on `path` after the
/// caller looked and before the swap (another program editing the file) is
/// never lost. Where the file system cannot exchange, a plain atomic
/// replace (the caller's own check is then the only one).
pub fn replace_if_unchanged(
    path: &Path,
    contents: &[u8],
    unchanged: impl Fn(&fs::Metadata) -> bool,
) -> io::Result<bool> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    use rustix::io::Errno;
    let tmp = write_temp_beside(path, contents)?;
    let exchange = || renameat_with(CWD, &tmp, CWD, path, RenameFlags::EXCHANGE);
    match exchange() {
        Ok(()) => {}
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            let renamed = fs::rename(&tmp, path);
            if renamed.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            return renamed.map(|()| true);
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return if e == Errno::NOENT {
                Ok(false)
            } else {
                Err(e.into())
            };
        }
    }
    // `tmp` now names the file that was in place.
    let kept = fs::symlink_metadata(&tmp).is_ok_and(|m| unchanged(&m));
    if !kept {
        exchange()?;
    }
    fs::remove_file(&tmp)?;
    Ok(kept)
}

/// Create `path` with `contents` unless it exists (then `Ok(false)`): a
/// `0600` temp file linked into place, so a reader never sees a torn file
/// and a file another writer put there meanwhile is never replaced.
pub fn write_new(path: &Path, contents: &[u8]) -> io::Result<bool> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.new{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)?;
        f.write_all(contents)?;
        drop(f);
        match fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    })();
    let _ = fs::remove_file(&tmp);
    result
}

/// Remove a file, treating "already gone" as success.
pub fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
