//! Resident memory of processes from `/proc/<pid>/status`.

/// A `kB` field of `/proc/<pid>/status` (e.g. `VmHWM`, `VmRSS`), in bytes.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Peak resident set (`VmHWM`) of `pid`, bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    status_kb(pid, "VmHWM")
}

/// Current resident set (`VmRSS`) of `pid`, bytes.
pub fn rss(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS")
}

/// Reset the peak (`VmHWM`) of `pid` to its current RSS (`echo 5 >
/// /proc/<pid>/clear_refs`; needs the right to write there). False if refused.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Sum of `f(pid)` over `pids` (None if any is unreadable).
pub fn sum(pids: &[u32], f: impl Fn(u32) -> Option<u64>) -> Option<u64> {
    pids.iter().map(|&p| f(p)).sum()
}

/// `pid` and its direct children (nginx: master + workers).
pub fn with_children(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Bytes as `12.3 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Clock ticks per second of `/proc/*/stat` times.
#[allow(unsafe_code)] // sysconf(3) has no safe std equivalent
fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a `stat` line, in seconds.
fn stat_cpu(stat: &str) -> Option<f64> {
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... utime(11) stime(12).
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / ticks_per_sec())
}

/// CPU time (user + system) used so far by `pid`, all its threads, seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU time of the threads of `pid` whose name starts with `name`, seconds.
pub fn thread_cpu_seconds(pid: u32, name: &str) -> Option<f64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0.0;
    let mut found = false;
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(name) {
            if let Some(s) = std::fs::read_to_string(p.join("stat"))
                .ok()
                .and_then(|s| stat_cpu(&s))
            {
                total += s;
                found = true;
            }
        }
    }
    found.then_some(total)
}

/// Sum of `f(pid)` over `pids` for float readings (None if any is unreadable).
pub fn sum_f(pids: &[u32], f: impl Fn(u32) -> Option<f64>) -> Option<f64> {
    pids.iter().map(|&p| f(p)).sum()
}
