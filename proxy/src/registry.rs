//! The proxies running on a data dir. Each `serve` and `run` registers
//! itself in `<data dir>/proxies/<pid>-<port>.json` (0600, written
//! atomically, the directory 0700) while it runs — its admin URL, pid,
//! start time, and where its admin token lives — and removes the file at a
//! clean exit. Commands read the entries to find the proxy that holds a
//! session without `--proxy`. An entry whose process is gone (a killed
//! proxy) is stale: readers skip it, and the next proxy to register removes
//! it.

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
    /// The file holding its admin token; None when the token came from the
    /// config or `OCEANCODE_ADMIN_TOKEN` (a client then needs the same).
    pub token_file: Option<PathBuf>,
    /// The proxy's version.
    pub version: String,
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

/// This process's effective user id.
#[allow(unsafe_code)] // geteuid(2) has no safe std equivalent
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// `<data_dir>/proxies`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// A registration: the entry's file, removed when dropped.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
}

impl Registration {
    /// The entry's file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
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
    Ok(Registration { path })
}

/// An entry file found in the registry.
#[derive(Debug)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Its entry (None: unreadable, e.g. written by something else).
    pub entry: Option<Entry>,
}

impl Found {
    /// Whether the entry is readable and its process still runs.
    pub fn alive(&self) -> bool {
        self.entry.as_ref().is_some_and(|e| pid_alive(e.pid))
    }
}

/// Every entry of `data_dir`'s registry, newest start first (unreadable ones
/// last). A missing registry is an empty one.
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
            let entry = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
            Found { path, entry }
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
}
