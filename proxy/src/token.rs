//! The admin token: 32 random bytes (hex) in `<data dir>/admin-token`
//! (0600), made at the proxy's first start and required on every admin
//! route and `/metrics` (`Authorization: Bearer <token>`). The command line
//! reads it from there; `--admin-token` / `OCEANCODE_ADMIN_TOKEN` give it
//! for a proxy on another machine. Every reader goes through [`read`],
//! which takes only a regular file of this user (no symlink, no FIFO) and
//! makes a group- or world-readable one private again, with a warning. A
//! token the proxy serves with has at least [`MIN_LEN`] characters. The
//! viewer's sessions ([`ViewerSessions`]) are bought with it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// File name of the token inside the data dir.
pub const FILE: &str = "admin-token";

/// Environment variable that gives the token (client side, and the proxy's
/// own token when set: remote use, or a proxy whose ledger is off).
pub const ENV: &str = "OCEANCODE_ADMIN_TOKEN";

/// The fewest characters an admin token may have.
pub const MIN_LEN: usize = 16;

/// The most of the token file read (a token is 64 characters).
const MAX_FILE: u64 = 4096;

/// Why a token is too weak to serve with, naming where it came from;
/// None when it is long enough.
pub fn weakness(token: &str, from: &str) -> Option<String> {
    let n = token.chars().count();
    (n < MIN_LEN).then(|| {
        format!(
            "the admin token from {from} has {n} characters; at least {MIN_LEN} are needed (make one with `openssl rand -hex 32`)"
        )
    })
}

/// `<data_dir>/admin-token`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE)
}

/// The token stored in `data_dir`, if there is one (`Ok(None)` when the file
/// does not exist; an empty file counts as none). The file must be a
/// regular file owned by this user, not a symlink; one that the group or
/// others may read is made 0600 again, with a warning.
pub fn read(data_dir: &Path) -> std::io::Result<Option<String>> {
    let p = path(data_dir);
    use crate::context::io::{open_regular, ReadError};
    // No symlink followed; a FIFO opens without waiting for a writer.
    let (file, meta) = match open_regular(&p) {
        Ok(x) => x,
        Err(ReadError::Missing) => return Ok(None),
        Err(ReadError::Symlink) => {
            return Err(std::io::Error::other(format!(
                "{} is a symbolic link: the admin token must be a file of its own",
                p.display()
            )))
        }
        Err(ReadError::NotRegular(_)) => {
            return Err(std::io::Error::other(format!(
                "{} is not a regular file",
                p.display()
            )))
        }
        Err(ReadError::Io(e)) => return Err(e),
        Err(e) => return Err(std::io::Error::other(e.to_string())),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let me = euid();
        if meta.uid() != me {
            return Err(std::io::Error::other(format!(
                "{} belongs to another user (uid {}, not {me})",
                p.display(),
                meta.uid()
            )));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            tracing::warn!(
                path = %p.display(),
                "the admin token file was readable by others (mode {mode:o}); made it 0600: make a new token if others may have read it (delete the file and restart the proxy)"
            );
        }
    }
    let mut s = String::new();
    file.take(MAX_FILE).read_to_string(&mut s)?;
    Ok(Some(s.trim().to_string()).filter(|t| !t.is_empty()))
}

/// `OCEANCODE_ADMIN_TOKEN`, when set and not empty.
pub fn from_env() -> Option<String> {
    std::env::var(ENV)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// The token a client sends: `explicit` (a flag or the environment) when
/// given, else the one stored in `data_dir`.
pub fn for_client(explicit: Option<&str>, data_dir: &Path) -> Option<String> {
    explicit
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .or_else(|| read(data_dir).ok().flatten())
}

/// A fresh token: 32 bytes from the OS's random source, hex.
pub fn generate() -> std::io::Result<String> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The token stored in `data_dir`, made (0600, the dir 0700 if it is new)
/// when there is none yet.
pub fn ensure(data_dir: &Path) -> std::io::Result<String> {
    if let Some(t) = read(data_dir)? {
        return Ok(t);
    }
    if !data_dir.exists() {
        std::fs::create_dir_all(data_dir)?;
        set_mode(data_dir, 0o700)?;
    }
    let token = generate()?;
    if write_new(data_dir, &token)? {
        return Ok(token);
    }
    // Another process made it first: use theirs.
    read(data_dir)?
        .ok_or_else(|| std::io::Error::other(format!("{} is empty", path(data_dir).display())))
}

/// Write `token` as `data_dir`'s token file (0600) unless one exists:
/// true when written, false when a file was there already.
pub fn write_new(data_dir: &Path, token: &str) -> std::io::Result<bool> {
    let p = path(data_dir);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(&p) {
        Ok(mut f) => {
            f.write_all(token.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    }
    #[cfg(not(unix))]
    let _ = (p, mode);
    Ok(())
}

/// Constant-time comparison of a presented token with the real one.
pub fn matches(presented: &str, token: &str) -> bool {
    let (a, b) = (presented.as_bytes(), token.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_private_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        assert_eq!(read(&dir).unwrap(), None);
        let t = ensure(&dir).unwrap();
        assert_eq!(t.len(), 64);
        assert!(t.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(ensure(&dir).unwrap(), t, "the second start keeps it");
        assert_eq!(read(&dir).unwrap().as_deref(), Some(t.as_str()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path(&dir)), 0o600);
            assert_eq!(mode(&dir), 0o700);
        }
        assert_eq!(for_client(Some(" other "), &dir).as_deref(), Some("other"));
        assert_eq!(for_client(None, &dir).as_deref(), Some(t.as_str()));
        assert_ne!(generate().unwrap(), t);
    }

    #[test]
    fn comparison_needs_the_whole_token() {
        assert!(matches("abc", "abc"));
        assert!(!matches("abd", "abc"));
        assert!(!matches("ab", "abc"));
        assert!(!matches("", "abc"));
    }
}

/// This process's effective user id.
#[allow(unsafe_code)] // geteuid(2) has no safe std equivalent
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// How long a viewer session lasts after its hand-over.
pub const VIEWER_TTL: std::time::Duration = std::time::Duration::from_secs(12 * 3600);
/// The most viewer sessions kept at once (the oldest goes first).
pub const MAX_VIEWER_SESSIONS: usize = 64;

/// The live viewer sessions: random values handed out as the viewer's
/// cookie in exchange for the admin token, each with its expiry. In
/// memory only: a restart of the proxy revokes them all.
#[derive(Debug, Default)]
pub struct ViewerSessions {
    live: parking_lot::Mutex<Vec<(String, std::time::Instant)>>,
}

impl ViewerSessions {
    /// A new session (32 random bytes, hex) valid for [`VIEWER_TTL`].
    pub fn open(&self) -> std::io::Result<String> {
        let value = generate()?;
        let now = std::time::Instant::now();
        let mut live = self.live.lock();
        live.retain(|(_, until)| *until > now);
        if live.len() >= MAX_VIEWER_SESSIONS {
            live.remove(0);
        }
        live.push((value.clone(), now + VIEWER_TTL));
        Ok(value)
    }

    /// Whether `presented` is a live session (compared in constant time).
    pub fn valid(&self, presented: &str) -> bool {
        let now = std::time::Instant::now();
        self.live
            .lock()
            .iter()
            .filter(|(_, until)| *until > now)
            .fold(false, |ok, (v, _)| matches(presented, v) | ok)
    }

    /// End every session; returns how many were live.
    pub fn revoke_all(&self) -> usize {
        let now = std::time::Instant::now();
        let mut live = self.live.lock();
        let n = live.iter().filter(|(_, until)| *until > now).count();
        live.clear();
        n
    }
}
