//! Shared pieces of oceancode-proxy's benchmarks (see `docs/benchmarks.md`):
//!
//! * [`conv`]: synthetic Anthropic conversations of a given size and message
//!   count (valid tool_use/tool_result pairs, one growing tool loop per session);
//! * [`stats`]: percentiles and Markdown tables;
//! * [`procfs`]: resident memory of a process (`VmHWM`/`VmRSS`, peak reset);
//! * [`svg`]: a hand-written line chart (no plotting crate).
//!
//! Nothing here runs in `cargo test`: the binaries are benchmarks, driven by
//! `bench/run.sh`.

pub mod conv;
pub mod procfs;
pub mod stats;
pub mod svg;

/// `nproc` and the CPU model, for the tables' "machine" note.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!(", {} GiB RAM", (kb + (1 << 19)) >> 20))
        .unwrap_or_default();
    format!("{cpus} CPU ({model}){mem}")
}
