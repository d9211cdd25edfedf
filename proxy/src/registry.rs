//! The proxies running on a data dir. Each `serve` and `run` registers
//! itself in `<data dir>/proxies/<pid>-<port>.json` (0600, written
//! atomically, the directory 0700) while it runs — its admin URL, pid,
//! start time, and where its admin token lives — and removes the file at a
//! clean exit. Commands read the entries to find the proxy that holds a
//! session without `--proxy`. An entry whose process is gone (a killed
//! proxy) is stale: readers skip it, and the next proxy to register removes
//! it.
//!
//! An entry names where a command sends the admin token, so only an entry
//! this user wrote is trusted ([`Found::untrusted`]): a regular file (no
//! symlink) of this user, mode 0600, whose URL is `http://` on a loopback
//! address and which holds the proxy's `instance` secret. Before a command
//! sends the token it has the proxy prove it holds that secret
//! ([`proof`] of a fresh challenge, answered without the token on
//! [`INSTANCE_PATH`]): a reused pid or port answers nothing right. The
//! token itself is only ever read from the data dir's own `admin-token`
//! (the entry's `token_file` is informational).

use oceancode_ledger::paths;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// The registry's directory inside the data dir.
pub const DIR: &str = "proxies";

/// One running proxy, as it registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Admin (and provider) base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// Process id.
    pub pid: u32,
    /// Unix milliseconds of the start.
    pub started_ms: i64,
    /// `serve` or `run`.
    pub kind: String,
    /// The program `run` wraps (its name only, no arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The file holding its admin token; None when the token came from
    /// `OCEANCODE_ADMIN_TOKEN` (a client then needs the same). For people
    /// only: commands read the token from their data dir's `admin-token`,
    /// never from the file an entry names.
    pub token_file: Option<PathBuf>,
    /// The proxy's version.
    pub version: String,
    /// The secret the live proxy proves it holds ([`proof`]); an entry
    /// without one is not trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// The admin route (no token needed) where a proxy answers a challenge
/// with the [`proof`] of its instance secret: `GET
/// /_oceancode/instance?challenge=HEX` → `{"proof": HEX}`.
pub const INSTANCE_PATH: &str = "/_oceancode/instance";

/// The most bytes of an entry file read.
const MAX_ENTRY: u64 = 64 * 1024;

/// The proof of holding `instance` for `challenge`: HMAC-SHA256, hex.
pub fn proof(instance: &str, challenge: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, instance.as_bytes());
    ring::hmac::sign(&key, challenge.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `url` is `http://` on a loopback address (127.0.0.0/8, `[::1]`,
/// `localhost`) with a port and nothing after it: the only URL a command
/// sends the admin token to without being told.
pub fn is_loopback_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let Some((host, port)) = rest.rsplit_once(':') else {
        return false;
    };
    if !matches!(port.parse::<u16>(), Ok(p) if p != 0) {
        return false;
    }
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

impl Entry {
    /// `serve proxy (pid 123, http://127.0.0.1:8787)`, `run proxy (python3,
    /// pid 9, …)`.
    pub fn describe(&self) -> String {
        let cmd = self
            .command
            .as_ref()
            .map(|c| format!("{c}, "))
            .unwrap_or_default();
        format!("{} proxy ({cmd}pid {}, {})", self.kind, self.pid, self.url)
    }
}

/// `<data_dir>/proxies`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// A registration: the entry's file, removed when dropped.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
    keeper: Option<tokio::task::JoinHandle<()>>,
    /// Set when dropped: a keeper's write under way leaves the entry be.
    gone: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How often a kept registration looks for its files.
pub const KEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Registration {
    /// The entry's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keep the entry, and `token` as the data dir's `admin-token` (when
    /// the proxy's token came from there), written again while the
    /// registration lives: after the data dir is deleted, the ledger
    /// reopens it afresh at the next write, and the commands must still
    /// find this proxy and its token there. Nothing is written while the
    /// data dir is missing. Needs a Tokio runtime.
    pub fn keep(mut self, data_dir: &Path, entry: &Entry, token: Option<String>) -> Registration {
        let (dir, path, entry) = (data_dir.to_path_buf(), self.path.clone(), entry.clone());
        let gone = self.gone.clone();
        self.keeper = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(KEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (dir, path, entry, token) =
                    (dir.clone(), path.clone(), entry.clone(), token.clone());
                let gone = gone.clone();
                let restored = tokio::task::spawn_blocking(move || {
                    restore(&dir, &path, &entry, token.as_deref(), &gone)
                })
                .await;
                if restored.is_err() {
                    return;
                }
            }
        }));
        self
    }
}

/// Write the entry (and the token) again if the data dir is there without
/// them; see [`Registration::keep`].
fn restore(
    data_dir: &Path,
    path: &Path,
    entry: &Entry,
    token: Option<&str>,
    gone: &std::sync::atomic::AtomicBool,
) {
    if !data_dir.is_dir() || gone.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    if let Some(t) = token {
        let file = crate::token::path(data_dir);
        if !file.exists() {
            match crate::token::write_new(data_dir, t) {
                Ok(true) => {
                    tracing::info!(path = %file.display(), "the admin token file was gone (the data dir was deleted?): written again")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(path = %file.display(), error = %e, "cannot write the admin token file again")
                }
            }
        }
    }
    if !path.exists() {
        let json = match serde_json::to_vec_pretty(entry) {
            Ok(j) => j,
            Err(_) => return,
        };
        let written = paths::create_private_dir_all(&dir(data_dir))
            .and_then(|()| paths::write_atomic(path, &json));
        match written {
            Ok(()) => {
                tracing::info!(path = %path.display(), "the proxy's registry entry was gone (the data dir was deleted?): written again")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the proxy's registry entry again")
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.gone.store(true, std::sync::atomic::Ordering::Release);
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        if let Err(e) = paths::remove_if_exists(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the proxy's registry entry");
        }
    }
}

/// Register `entry` in `data_dir` (removing the entries of proxies whose
/// process is gone); the entry stays until the [`Registration`] drops.
pub fn register(data_dir: &Path, entry: &Entry) -> io::Result<Registration> {
    let dir = dir(data_dir);
    paths::create_private_dir_all(&dir)?;
    for found in list(data_dir) {
        if !found.alive() {
            let _ = paths::remove_if_exists(&found.path);
        }
    }
    let port = entry.url.rsplit(':').next().unwrap_or("0");
    let path = dir.join(format!("{}-{port}.json", entry.pid));
    let json = serde_json::to_vec_pretty(entry).map_err(io::Error::other)?;
    paths::write_atomic(&path, &json)?;
    Ok(Registration {
        path,
        keeper: None,
        gone: Default::default(),
    })
}

/// An entry file found in the registry.
#[derive(Debug)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Its entry (None: unreadable, e.g. written by something else).
    pub entry: Option<Entry>,
    /// Why the entry is not trusted (see the module doc); None: trusted.
    pub untrusted: Option<String>,
}

impl Found {
    /// Whether the entry is readable and its process still runs.
    pub fn alive(&self) -> bool {
        self.entry.as_ref().is_some_and(|e| pid_alive(e.pid))
    }
}

/// Read an entry file: a regular file of this user, mode 0600, no symlink
/// followed; `Err` says why it is not trusted (the entry when it parsed).
fn read_entry(path: &Path) -> (Option<Entry>, Option<String>) {
    use crate::context::io::{open_regular, ReadError};
    use std::io::Read;
    let (file, meta) = match open_regular(path) {
        Ok(x) => x,
        Err(ReadError::NotRegular(_)) => return (None, Some("is not a regular file".into())),
        Err(e) => return (None, Some(format!("cannot be opened ({e})"))),
    };
    let mut why = None;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != crate::token::euid() {
            why = Some(format!("belongs to another user (uid {})", meta.uid()));
        } else if meta.mode() & 0o077 != 0 {
            why = Some(format!(
                "is readable or writable by others (mode {:o})",
                meta.mode() & 0o777
            ));
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_ENTRY).read_to_end(&mut bytes) {
        return (None, Some(format!("cannot be read ({e})")));
    }
    let Ok(entry) = serde_json::from_slice::<Entry>(&bytes) else {
        return (None, why);
    };
    let why = why.or_else(|| {
        if !is_loopback_url(&entry.url) {
            Some(format!(
                "names {:?}, not a loopback http:// address",
                oceancode_config::redact_url(&entry.url)
            ))
        } else if entry.instance.as_deref().is_none_or(|i| i.len() < 32) {
            Some("holds no instance secret (an older version wrote it)".into())
        } else {
            None
        }
    });
    (Some(entry), why)
}

/// Every entry of `data_dir`'s registry, newest start first (unreadable ones
/// last), each with whether it is trusted. A missing registry is an empty
/// one.
pub fn list(data_dir: &Path) -> Vec<Found> {
    let Ok(rd) = std::fs::read_dir(dir(data_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<Found> = rd
        .filter_map(Result::ok)
        .map(|d| d.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_name()
                    .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
        })
        .map(|path| {
            let (entry, untrusted) = read_entry(&path);
            Found {
                path,
                entry,
                untrusted,
            }
        })
        .collect();
    out.sort_by_key(|f| std::cmp::Reverse(f.entry.as_ref().map_or(i64::MIN, |e| e.started_ms)));
    out
}

/// Whether process `pid` exists (signal 0; a process of another user
/// counts as existing).
#[allow(unsafe_code)] // kill(2) has no safe std equivalent
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: u32, port: u16, started_ms: i64) -> Entry {
        Entry {
            url: format!("http://127.0.0.1:{port}"),
            pid,
            started_ms,
            kind: "serve".into(),
            command: None,
            token_file: None,
            version: "0".into(),
            instance: Some("i".repeat(64)),
        }
    }

    #[test]
    fn registered_private_listed_newest_first_and_removed_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let me = std::process::id();
        let a = register(&data, &entry(me, 1001, 10)).unwrap();
        let b = register(&data, &entry(me, 1002, 20)).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(a.path()), 0o600);
            assert_eq!(mode(&dir(&data)), 0o700);
        }
        let found = list(&data);
        let ports: Vec<&str> = found
            .iter()
            .map(|f| f.entry.as_ref().unwrap().url.rsplit(':').next().unwrap())
            .collect();
        assert_eq!(ports, vec!["1002", "1001"], "newest first");
        assert!(found.iter().all(Found::alive));
        drop(b);
        assert_eq!(list(&data).len(), 1);
        drop(a);
        assert!(list(&data).is_empty());
    }

    #[test]
    fn stale_and_unreadable_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        // A process that has exited: its pid is free (until reused).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        std::fs::create_dir_all(dir(data)).unwrap();
        let stale = dir(data).join(format!("{gone}-1.json"));
        std::fs::write(&stale, serde_json::to_vec(&entry(gone, 1, 1)).unwrap()).unwrap();
        std::fs::write(dir(data).join("junk.json"), b"{").unwrap();
        std::fs::write(dir(data).join(".x.json.tmp1-0"), b"{").unwrap();
        let found = list(data);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| !f.alive()), "{found:?}");
        // The next proxy to register sweeps them.
        let r = register(data, &entry(std::process::id(), 2, 2)).unwrap();
        let found = list(data);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, r.path());
        assert!(!pid_alive(0));
        assert!(pid_alive(std::process::id()));
    }

    #[test]
    fn a_fifo_or_a_link_to_dev_zero_in_the_registry_is_skipped_at_once() {
        // The attack on 33.4: a FIFO named `evil.json` hung `status` for
        // good (std::fs::read waits for a writer) and a link to /dev/zero
        // grew it to 432 MB in 10 s. Both are refused at once, unread.
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        std::fs::create_dir_all(dir(data)).unwrap();
        let fifo = dir(data).join("evil.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        std::os::unix::fs::symlink("/dev/zero", dir(data).join("zero.json")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = data.to_path_buf();
        std::thread::spawn(move || tx.send(list(&d)).unwrap());
        let found = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("listing the registry hung on a FIFO");
        assert_eq!(found.len(), 2);
        for f in &found {
            assert!(f.entry.is_none(), "{:?}", f.path);
            assert!(f.untrusted.is_some(), "{:?}", f.path);
        }
    }

    #[test]
    fn only_private_loopback_entries_with_a_secret_are_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let me = std::process::id();
        let r = register(data, &entry(me, 1, 1)).unwrap();
        let write = |name: &str, e: &Entry, mode: u32| {
            let p = dir(data).join(name);
            std::fs::write(&p, serde_json::to_vec(e).unwrap()).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("a.json", &entry(me, 2, 2), 0o644);
        let mut far = entry(me, 3, 3);
        far.url = "http://192.0.2.1:3".into();
        write("b.json", &far, 0o600);
        let mut old = entry(me, 4, 4);
        old.instance = None;
        write("c.json", &old, 0o600);
        std::os::unix::fs::symlink(r.path(), dir(data).join("d.json")).unwrap();
        let found = list(data);
        let why = |n: &str| {
            found
                .iter()
                .find(|f| f.path.ends_with(n))
                .unwrap()
                .untrusted
                .clone()
        };
        assert_eq!(why(&r.path().file_name().unwrap().to_string_lossy()), None);
        assert!(why("a.json").unwrap().contains("mode 644"));
        assert!(why("b.json").unwrap().contains("not a loopback"));
        assert!(why("c.json").unwrap().contains("no instance secret"));
        assert!(why("d.json").unwrap().contains("cannot be opened"));
    }

    #[test]
    fn loopback_urls_and_proofs() {
        for ok in [
            "http://127.0.0.1:8787",
            "http://127.9.9.9:1/",
            "http://[::1]:8787",
            "http://localhost:2",
        ] {
            assert!(is_loopback_url(ok), "{ok}");
        }
        for bad in [
            "https://127.0.0.1:8787",
            "http://127.0.0.1",
            "http://127.0.0.1:0",
            "http://10.0.0.1:80",
            "http://localhost.evil.example:80",
            "http://127.0.0.1:80/x",
            "http://u@127.0.0.1:80",
        ] {
            assert!(!is_loopback_url(bad), "{bad}");
        }
        let p = proof("secret", "c1");
        assert_eq!(p.len(), 64);
        assert_eq!(p, proof("secret", "c1"));
        assert_ne!(p, proof("secret", "c2"));
        assert_ne!(p, proof("other", "c1"));
    }
}
