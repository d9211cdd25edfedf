//! The files the ledger keeps inside its data dir (`sessions/<id>/…`),
//! reached without following a link: every path below the data dir is
//! walked one component at a time from the data dir itself (`openat` with
//! `O_NOFOLLOW`), so a symlink anywhere below it — `sessions/`, a session
//! dir, `transcript/`, a turn file — is never written or read through, and
//! a directory that is a link (or not a directory) is refused with an error
//! naming it. Files are read only when they are regular files (opened
//! non-blocking, so a FIFO never hangs a reader), up to a bound. The data
//! dir itself may be a link: it is the user's choice.

use crate::paths::{DataDir, DIR_MODE, FILE_MODE};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most levels of directories [`DataDir::remove_dir_all`] descends (one
/// open descriptor and one stack frame a level); a deeper tree is refused.
pub const MAX_DEPTH: usize = 64;

/// Most bytes a turn file or `SESSION.md` is read back with (a longer one
/// is refused; the exports render the turn from the database instead).
pub const READ_MAX: u64 = 64 << 20;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn not_followed(name: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is a symlink or not a directory; the ledger does not write or read through it (remove it)",
            name.display()
        ),
    )
}

/// The parts of `path` below the data dir (`None`: it is not below it, or
/// it climbs with `..`).
fn below<'p>(dir: &DataDir, path: &'p Path) -> io::Result<Vec<&'p Path>> {
    let rel = path.strip_prefix(dir.root()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not inside the data dir {}",
                path.display(),
                dir.root().display()
            ),
        )
    })?;
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(Path::new(n)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a plain path below the data dir", path.display()),
            )),
        })
        .collect()
}

/// Open directory `rel` below the data dir, one component at a time with
/// no link followed; `create`: missing ones are made (`0700`).
fn open_dir(dir: &DataDir, parts: &[&Path], create: bool) -> io::Result<OwnedFd> {
    let mut fd = rfs::open(
        dir.root(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for (i, part) in parts.iter().enumerate() {
        let opened = match rfs::openat(&fd, *part, DIR_FLAGS, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) if create => {
                match rfs::mkdirat(&fd, *part, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                rfs::openat(&fd, *part, DIR_FLAGS, Mode::empty())
            }
            other => other,
        };
        fd = match opened {
            Ok(f) => f,
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                let name: std::path::PathBuf = parts[..=i].iter().collect();
                return Err(not_followed(&dir.root().join(name)));
            }
            Err(e) => return Err(e.into()),
        };
    }
    Ok(fd)
}

/// The directory `path` is in (opened with no link followed) and its name.
fn parent_of<'p>(dir: &DataDir, path: &'p Path, create: bool) -> io::Result<(OwnedFd, &'p Path)> {
    let parts = below(dir, path)?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file below the data dir", path.display()),
        ));
    };
    Ok((open_dir(dir, parents, create)?, name))
}

impl DataDir {
    /// Create directory `path` below the data dir and its missing parents
    /// (`0700`; the data dir too), refusing any that is a link.
    pub fn create_dir(&self, path: &Path) -> io::Result<()> {
        crate::paths::create_private_dir_all(self.root())?;
        open_dir(self, &below(self, path)?, true).map(drop)
    }

    /// Replace file `path` below the data dir atomically with `contents`
    /// (a `0600` temp file renamed over it: a link there is replaced, never
    /// followed). Its directory must exist and be no link.
    pub fn write_atomic(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        let (fd, name) = parent_of(self, path, false)?;
        let tmp = temp_name(name, "tmp");
        write_temp(&fd, &tmp, contents)?;
        let renamed = rfs::renameat(&fd, &tmp, &fd, name);
        if renamed.is_err() {
            let _ = rfs::unlinkat(&fd, &tmp, AtFlags::empty());
        }
        Ok(renamed?)
    }

    /// Create file `path` below the data dir with `contents` unless
    /// something is there (then `Ok(false)`): a `0600` temp file linked into
    /// place, so a reader never sees a torn file and nothing is replaced.
    pub fn write_new(&self, path: &Path, contents: &[u8]) -> io::Result<bool> {
        let (fd, name) = parent_of(self, path, false)?;
        let tmp = temp_name(name, "new");
        write_temp(&fd, &tmp, contents)?;
        let linked = rfs::linkat(&fd, &tmp, &fd, name, AtFlags::empty());
        let _ = rfs::unlinkat(&fd, &tmp, AtFlags::empty());
        match linked {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::EXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Remove file `path` below the data dir (a link there is removed
    /// itself); already gone is success.
    pub fn remove_file(&self, path: &Path) -> io::Result<()> {
        let (fd, name) = match parent_of(self, path, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        match rfs::unlinkat(&fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Remove directory `path` below the data dir and everything in it, no
    /// link followed (a link there, or in it, is removed itself); already
    /// gone is success.
    pub fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let (fd, name) = match parent_of(self, path, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        remove_tree(&fd, name, 0)
    }

    /// The names in directory `path` below the data dir (no link followed).
    pub fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let fd = open_dir(self, &below(self, path)?, false)?;
        let mut out = Vec::new();
        for entry in rfs::Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy();
            if name != "." && name != ".." {
                out.push(name.into_owned());
            }
        }
        Ok(out)
    }

    /// Read file `path` below the data dir: a regular file reached with no
    /// link followed, at most `max` bytes (a longer one is an error).
    pub fn read_file(&self, path: &Path, max: u64) -> io::Result<Vec<u8>> {
        let (dirfd, name) = parent_of(self, path, false)?;
        let fd = match rfs::openat(
            &dirfd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        ) {
            Err(rustix::io::Errno::LOOP) => return Err(not_followed(path)),
            other => other?,
        };
        let st = rfs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file; not read", path.display()),
            ));
        }
        let too_long = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is longer than {max} bytes; not read", path.display()),
            )
        };
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > max {
            return Err(too_long());
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        File::from(fd).take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(too_long());
        }
        Ok(bytes)
    }

    /// [`DataDir::read_file`] as text (invalid UTF-8 replaced).
    pub fn read_text(&self, path: &Path, max: u64) -> io::Result<String> {
        let bytes = self.read_file(path, max)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }
}

/// Remove `name` in `dir`: a directory with what it holds (opened with no
/// link followed), anything else (a link, a file) itself. `depth`: the
/// levels above it; a directory at [`MAX_DEPTH`] is refused (the agent can
/// nest its session dir; each level holds a descriptor and a stack frame).
fn remove_tree(dir: &OwnedFd, name: &Path, depth: usize) -> io::Result<()> {
    let sub = match rfs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(sub) => sub,
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            return match rfs::unlinkat(dir, name, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if depth >= MAX_DEPTH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: directories nested deeper than {MAX_DEPTH} levels; not removed (remove it by hand)",
                name.display()
            ),
        ));
    }
    let mut names = Vec::new();
    for entry in rfs::Dir::read_from(&sub)? {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(std::ffi::OsStr::from_bytes(n).to_owned());
        }
    }
    for n in names {
        remove_tree(&sub, Path::new(&n), depth + 1)?;
    }
    match rfs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A temp file's name next to `name` (dot-prefixed; pid and a counter).
fn temp_name(name: &Path, kind: &str) -> std::path::PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::path::PathBuf::from(format!(
        ".{}.{kind}{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Create `tmp` in `dir` (`0600`, new, no link followed) with `contents`.
fn write_temp(dir: &OwnedFd, tmp: &Path, contents: &[u8]) -> io::Result<()> {
    let fd = rfs::openat(
        dir,
        tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )?;
    let written = File::from(fd).write_all(contents);
    if written.is_err() {
        let _ = rfs::unlinkat(dir, tmp, AtFlags::empty());
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn data() -> (tempfile::TempDir, DataDir) {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = DataDir::new(tmp.path().join("data"));
        dir.create_dir(&dir.transcript_dir("s")).expect("dirs");
        (tmp, dir)
    }

    #[test]
    fn reads_only_a_regular_file_within_the_bound() {
        let (_tmp, dir) = data();
        let path = dir.turn_file("s", 1);
        dir.write_atomic(&path, b"turn one\n").expect("write");
        assert_eq!(dir.read_file(&path, 9).expect("read"), b"turn one\n");
        let long = dir.read_file(&path, 8).expect_err("over the bound");
        assert_eq!(long.kind(), io::ErrorKind::InvalidData, "{long}");
        // A FIFO is refused at once (opened non-blocking), never read.
        let fifo = dir.turn_file("s", 2);
        rfs::mknodat(
            rfs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        let e = dir.read_file(&fifo, 1 << 20).expect_err("a fifo");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // A link to /dev/zero is not followed.
        let zero = dir.turn_file("s", 3);
        symlink("/dev/zero", &zero).expect("link");
        let e = dir.read_file(&zero, 1 << 20).expect_err("a link");
        assert!(e.to_string().contains("symlink"), "{e}");
    }

    /// A session dir the agent nested thousands of levels deep: removing
    /// it (the retention sweep, on a blocking thread of the proxy) must not
    /// overflow the thread's stack, which aborts the whole process.
    #[test]
    fn a_deep_tree_does_not_overflow_the_stack() {
        let (_tmp, dir) = data();
        let top = dir.session_dir("s");
        let mut fd = rfs::open(&top, DIR_FLAGS, Mode::empty()).expect("open");
        for _ in 0..2_000 {
            rfs::mkdirat(&fd, "d", Mode::from_raw_mode(DIR_MODE)).expect("mkdir");
            fd = rfs::openat(&fd, "d", DIR_FLAGS, Mode::empty()).expect("open");
        }
        drop(fd);
        let shallow = dir.session_dir("t");
        dir.create_dir(&shallow.join("a").join("b")).expect("dirs");
        let got = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                (
                    dir.remove_dir_all(&top).map_err(|e| e.to_string()),
                    dir.remove_dir_all(&shallow).map_err(|e| e.to_string()),
                    top,
                    shallow,
                )
            })
            .expect("thread")
            .join()
            .expect("the thread ended");
        let (deep, small, top, shallow) = got;
        assert!(
            deep.as_ref().is_err_and(|e| e.contains("deeper than")),
            "{deep:?}"
        );
        assert!(top.exists(), "refused, left whole");
        assert_eq!(small, Ok(()));
        assert!(!shallow.exists());
    }

    #[test]
    fn a_linked_file_is_replaced_never_written_through() {
        let (tmp, dir) = data();
        let outside = tmp.path().join("outside.md");
        std::fs::write(&outside, b"keep").expect("outside");
        let path = dir.index_file("s");
        symlink(&outside, &path).expect("link");
        assert!(!dir.write_new(&path, b"new").expect("write_new"));
        dir.write_atomic(&path, b"index").expect("write");
        assert_eq!(std::fs::read(&outside).expect("read"), b"keep");
        assert_eq!(dir.read_file(&path, 64).expect("read"), b"index");
        dir.remove_file(&path).expect("rm");
        assert!(outside.exists());
    }
}
