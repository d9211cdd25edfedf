//! `oceancode-load`: the load generator of the overhead benchmarks.
//!
//! * `run`: sessions of `--messages` messages and about `--size` bytes
//!   (Anthropic Messages, `stream: true`) at `--concurrency`; every measured
//!   request is one step of an agent's tool loop (the session grows by an
//!   echoed tool call and its result). First the cold requests (a session's
//!   first request: the proxy records its whole history), then the measured
//!   warm requests. Prints one JSON line: latency, time to first byte, requests/s,
//!   peak RSS of `--pid` (and its children).
//! * `scale`: `--sessions` sessions stepping concurrently; latency by session
//!   length and RSS as the sessions grow.
//! * `report`: the Markdown tables (with ratios) of JSON lines from `run`/`scale`.
//!
//! Loopback only; every loop is bounded by a request count and a time cap.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use http::{Request, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oceancode_bench::conv::{Conv, Spec};
use oceancode_bench::procfs;
use oceancode_bench::stats::{ms, ms_signed, Samples, Table};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "oceancode-load",
    about = "Load generator of oceancode-proxy's overhead benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Overhead run against one target.
    Run(RunArgs),
    /// Many concurrent sessions growing: latency by session length, RSS.
    Scale(ScaleArgs),
    /// Print a free loopback TCP port (for the scripts).
    FreePort,
    /// Markdown tables from JSON lines.
    Report {
        /// Files of JSON lines written by `run` / `scale`.
        files: Vec<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct Common {
    /// Base URL of the target (`http://127.0.0.1:PORT`).
    #[arg(long)]
    target: String,
    /// Target name in the tables (`direct`, `nginx`, `oceancode-proxy`).
    #[arg(long)]
    label: String,
    /// Scenario name (rows with the same scenario are compared).
    #[arg(long)]
    scenario: String,
    /// Base body size: bytes, or with a k/m suffix (`200k`, `8m`).
    #[arg(long, value_parser = parse_size)]
    size: usize,
    /// Messages in the base history.
    #[arg(long, default_value_t = 2000)]
    messages: usize,
    /// Messages per turn.
    #[arg(long, default_value_t = 40)]
    turn_len: usize,
    /// Model sent in the requests.
    #[arg(long, default_value = "claude-sonnet-4-5")]
    model: String,
    /// Processes whose memory is reported (their direct children are added).
    #[arg(long)]
    pid: Vec<u32>,
    /// Admin URL of an oceancode-proxy: sample its writer lag, settle at
    /// the end. Repeat it for each proxy behind a load balancer (the lag is
    /// the largest of theirs; each is settled).
    #[arg(long)]
    admin: Vec<String>,
    /// Append the JSON result to this file (and print it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Stop issuing requests after this many seconds.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    c: Common,
    /// Concurrent clients.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Measured (warm) requests in all.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Steps one session takes at most (more sessions are opened to spread the requests).
    #[arg(long, default_value_t = 50)]
    max_steps: usize,
}

#[derive(Args, Clone)]
struct ScaleArgs {
    #[command(flatten)]
    c: Common,
    /// Concurrent sessions (one client each).
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Steps each session takes.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Latency buckets over the steps.
    #[arg(long, default_value_t = 4)]
    buckets: usize,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1_000.0),
        Some('m') => (&s[..s.len() - 1], 1_000_000.0),
        _ => (s.as_str(), 1.0),
    };
    num.parse::<f64>()
        .map(|n| (n * mult) as usize)
        .map_err(|e| format!("bad size {s:?}: {e}"))
}

/// A request body made of shared frames.
struct Frames {
    frames: VecDeque<Bytes>,
    len: u64,
}

impl Frames {
    fn new(frames: impl IntoIterator<Item = Bytes>) -> Frames {
        let frames: VecDeque<Bytes> = frames.into_iter().filter(|f| !f.is_empty()).collect();
        let len = frames.iter().map(|f| f.len() as u64).sum();
        Frames { frames, len }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let f = self.frames.pop_front();
        if let Some(b) = &f {
            self.len -= b.len() as u64;
        }
        Poll::Ready(f.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

type Http = Client<HttpConnector, Frames>;

fn client(max_idle: usize) -> Http {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .pool_idle_timeout(Duration::from_secs(120))
        .build(conn)
}

#[derive(Clone, Copy, Debug)]
struct Timing {
    ttfb: Duration,
    total: Duration,
}

/// One streamed request; the answer must be a 200 whose stream ends with `message_stop`.
async fn send(http: &Http, url: &str, session: &str, conv: &Conv) -> Result<Timing> {
    let req = Request::post(format!("{url}/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", "sk-ant-bench")
        .header("x-oceancode-session", session)
        .body(Frames::new(conv.frames()))?;
    let t0 = Instant::now();
    let resp = http.request(req).await.context("request failed")?;
    let status = resp.status();
    let mut body = resp.into_body();
    let mut ttfb = None;
    let mut tail: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("response body failed")?;
        if let Some(d) = frame.data_ref() {
            if ttfb.is_none() && !d.is_empty() {
                ttfb = Some(t0.elapsed());
            }
            tail.extend_from_slice(d);
            if tail.len() > 4096 {
                tail.drain(..tail.len() - 1024);
            }
        }
    }
    let total = t0.elapsed();
    if status != StatusCode::OK {
        bail!("status {status}: {}", String::from_utf8_lossy(&tail));
    }
    if !tail.windows(12).any(|w| w == b"message_stop") {
        bail!("stream did not end with message_stop");
    }
    Ok(Timing {
        ttfb: ttfb.unwrap_or(total),
        total,
    })
}

/// Percentiles of a sample set, in µs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default)]
struct Pcts {
    n: usize,
    p50: u64,
    p99: u64,
    mean: u64,
    max: u64,
}

impl Pcts {
    fn of(s: &Samples) -> Pcts {
        Pcts {
            n: s.len(),
            p50: s.pct(50.0),
            p99: s.pct(99.0),
            mean: s.mean(),
            max: s.pct(100.0),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct RunResult {
    kind: String,
    scenario: String,
    target: String,
    size: usize,
    body_bytes: usize,
    messages: usize,
    concurrency: usize,
    sessions: usize,
    cold: Pcts,
    latency: Pcts,
    ttfb: Pcts,
    rps: f64,
    errors: usize,
    first_error: Option<String>,
    peak_rss: Option<u64>,
    rss_before: Option<u64>,
    rss_after_cold: Option<u64>,
    rss_end: Option<u64>,
    writer_lag_max_ms: Option<u64>,
    settle_ms: Option<u64>,
    /// Time the ledger took to catch up with the cold requests (`settle`
    /// before the measured steps start), ms.
    #[serde(default)]
    cold_settle_ms: Option<u64>,
    /// CPU time (user + system) of `--pid` processes per measured request, ms.
    cpu_ms_per_request: Option<f64>,
    /// Of which the ledger writer thread (`oceancode-write…`), ms.
    writer_cpu_ms_per_request: Option<f64>,
    /// Scale runs: latency by step bucket.
    buckets: Vec<Bucket>,
    seconds: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct Bucket {
    from_messages: usize,
    to_messages: usize,
    latency: Pcts,
    rss: Option<u64>,
}

fn pids_of(c: &Common) -> Vec<u32> {
    let mut v: Vec<u32> = c
        .pid
        .iter()
        .flat_map(|&p| procfs::with_children(p))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `Authorization: Bearer $OCEANCODE_ADMIN_TOKEN` for admin requests (the
/// proxy's admin API needs its token; `bench/run.sh` sets it for both).
fn with_admin_token(mut b: http::request::Builder) -> http::request::Builder {
    if let Ok(t) = std::env::var("OCEANCODE_ADMIN_TOKEN") {
        b = b.header("authorization", format!("Bearer {}", t.trim()));
    }
    b
}

/// Samples the proxies' `oceancode_writer_lag_seconds` every 100 ms until
/// stopped: the largest seen (ms; None = no proxy to ask).
fn lag_sampler(admin: Vec<String>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Option<u64>> {
    tokio::spawn(async move {
        if admin.is_empty() {
            return None;
        }
        let http: Client<HttpConnector, http_body_util::Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let mut max = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for url in &admin {
                let Ok(req) = with_admin_token(Request::get(format!("{url}/metrics")))
                    .body(http_body_util::Empty::new())
                else {
                    continue;
                };
                let Ok(resp) = http.request(req).await else {
                    continue;
                };
                let Ok(b) = resp.into_body().collect().await else {
                    continue;
                };
                let text = String::from_utf8_lossy(&b.to_bytes()).into_owned();
                if let Some(v) = text
                    .lines()
                    .find(|l| l.starts_with("oceancode_writer_lag_seconds "))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|s| (s * 1000.0).round() as u64)
                {
                    max = max.max(v);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(max)
    })
}

/// `POST /_oceancode/settle` on every proxy's admin URL, at once: ms until
/// the last answered (None = no proxy to ask, or one did not answer).
async fn settle(admin: &[String]) -> Option<u64> {
    if admin.is_empty() {
        return None;
    }
    let http: Client<HttpConnector, http_body_util::Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let t = Instant::now();
    let each = admin.iter().map(|url| {
        let http = http.clone();
        let req = with_admin_token(Request::post(format!("{url}/_oceancode/settle")))
            .header("content-type", "application/json")
            .body(http_body_util::Empty::new());
        async move {
            let resp = http.request(req.ok()?).await.ok()?;
            resp.into_body().collect().await.ok()?;
            Some(())
        }
    });
    for r in futures_util::future::join_all(each).await {
        r?;
    }
    Some(t.elapsed().as_millis() as u64)
}

/// (process CPU, writer-thread CPU) of `pids`, seconds.
fn cpu_now(pids: &[u32]) -> (Option<f64>, Option<f64>) {
    if pids.is_empty() {
        return (None, None);
    }
    let total = procfs::sum_f(pids, procfs::cpu_seconds);
    let writer = pids
        .iter()
        .filter_map(|&p| procfs::thread_cpu_seconds(p, "oceancode-writ"))
        .reduce(|a, b| a + b);
    (total, writer)
}

/// Per-request ms between two [`cpu_now`] readings (CPU still spent by the
/// writer after the run, until `settle`, is included).
fn cpu_per_request(
    a: (Option<f64>, Option<f64>),
    b: (Option<f64>, Option<f64>),
    n: usize,
) -> (Option<f64>, Option<f64>) {
    let per = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if n > 0 => Some((y - x) * 1000.0 / n as f64),
        _ => None,
    };
    (per(a.0, b.0), per(a.1, b.1))
}

fn emit(out: &Option<PathBuf>, r: &RunResult) -> Result<()> {
    let line = serde_json::to_string(r)?;
    println!("{line}");
    if let Some(p) = out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("opening {}", p.display()))?;
        writeln!(f, "{line}")?;
    }
    Ok(())
}

fn spec(c: &Common) -> Spec {
    Spec {
        messages: c.messages,
        bytes: c.size,
        turn_len: c.turn_len,
        model: c.model.clone(),
    }
}

async fn run(a: RunArgs) -> Result<()> {
    let c = &a.c;
    let conc = a.concurrency.max(1);
    let per_worker = a.requests.div_ceil(conc).max(1);
    let sessions_per_worker = per_worker.div_ceil(a.max_steps.max(1)).max(1);
    let base = Conv::new(&spec(c), "base");
    let body_bytes = base.len();
    let pids = pids_of(c);
    for &p in &pids {
        procfs::reset_peak(p);
    }
    let rss_before = procfs::sum(&pids, procfs::rss);
    let http = client(conc * 2);
    let deadline = Instant::now() + Duration::from_secs(c.max_seconds);
    let stop = Arc::new(AtomicBool::new(false));
    let run_id = std::process::id();
    // Cold: every session's first request (all workers at once).
    let t_start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..conc {
        let http = http.clone();
        let url = c.target.clone();
        let base = base.clone();
        let label = c.label.clone();
        let scenario = c.scenario.clone();
        set.spawn(async move {
            let mut convs = Vec::new();
            let mut cold = Vec::new();
            let mut errors = Vec::new();
            for k in 0..sessions_per_worker {
                let tag = format!("{label}-{scenario}-{run_id}-w{w}-s{k}");
                let conv = base.retag(&tag);
                match send(&http, &url, &tag, &conv).await {
                    Ok(t) => cold.push(t.total),
                    Err(e) => errors.push(format!("{e:#}")),
                }
                convs.push((tag, conv));
            }
            (w, convs, cold, errors)
        });
    }
    let mut workers = Vec::new();
    let mut cold = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    while let Some(r) = set.join_next().await {
        let (w, convs, c1, e1) = r?;
        workers.push((w, convs));
        cold.extend(c1);
        errors.extend(e1);
    }
    let rss_after_cold = procfs::sum(&pids, procfs::rss);
    // The ledger records every cold history (2,001 rows each) behind the
    // responses: let it catch up so the measured steps see the steady state
    // (the cold cost is reported on its own: cold latency and this settle).
    let cold_settle_ms = settle(&c.admin).await;
    let sampler = lag_sampler(c.admin.clone(), stop.clone());
    let cpu0 = cpu_now(&pids);
    // Warm: the measured steps.
    let left = Arc::new(AtomicUsize::new(a.requests));
    let t_warm = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (_, mut convs) in workers {
        let http = http.clone();
        let url = c.target.clone();
        let left = left.clone();
        set.spawn(async move {
            let mut out = Vec::new();
            let mut errors = Vec::new();
            let mut i = 0usize;
            while Instant::now() < deadline
                && left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
            {
                let n = convs.len();
                let (tag, conv) = &mut convs[i % n];
                i += 1;
                conv.step();
                match send(&http, &url, tag, conv).await {
                    Ok(t) => out.push(t),
                    Err(e) => errors.push(format!("{e:#}")),
                }
            }
            (out, errors)
        });
    }
    let mut warm: Vec<Timing> = Vec::new();
    while let Some(r) = set.join_next().await {
        let (o, e) = r?;
        warm.extend(o);
        errors.extend(e);
    }
    let warm_secs = t_warm.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let lag = sampler.await.ok().flatten();
    let settle_ms = settle(&c.admin).await;
    let (cpu_ms, writer_ms) = cpu_per_request(cpu0, cpu_now(&pids), warm.len());
    let r = RunResult {
        kind: "run".into(),
        cpu_ms_per_request: cpu_ms,
        writer_cpu_ms_per_request: writer_ms,
        scenario: c.scenario.clone(),
        target: c.label.clone(),
        size: c.size,
        body_bytes,
        messages: base.base_messages,
        concurrency: conc,
        sessions: conc * sessions_per_worker,
        cold: Pcts::of(&Samples::from_durations(cold)),
        latency: Pcts::of(&Samples::from_durations(warm.iter().map(|t| t.total))),
        ttfb: Pcts::of(&Samples::from_durations(warm.iter().map(|t| t.ttfb))),
        rps: warm.len() as f64 / warm_secs.max(1e-9),
        errors: errors.len(),
        first_error: errors.first().cloned(),
        peak_rss: procfs::sum(&pids, procfs::peak_rss),
        rss_before,
        rss_after_cold,
        rss_end: procfs::sum(&pids, procfs::rss),
        writer_lag_max_ms: lag,
        settle_ms,
        cold_settle_ms,
        buckets: Vec::new(),
        seconds: t_start.elapsed().as_secs_f64(),
    };
    emit(&c.out, &r)
}

async fn scale(a: ScaleArgs) -> Result<()> {
    let c = &a.c;
    let n = a.sessions.max(1);
    let base = Conv::new(&spec(c), "base");
    let body_bytes = base.len();
    let pids = pids_of(c);
    for &p in &pids {
        procfs::reset_peak(p);
    }
    let rss_before = procfs::sum(&pids, procfs::rss);
    let http = client(n * 2);
    let deadline = Instant::now() + Duration::from_secs(c.max_seconds);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = lag_sampler(c.admin.clone(), stop.clone());
    let run_id = std::process::id();
    let t_start = Instant::now();
    // All sessions open at once.
    let mut set = tokio::task::JoinSet::new();
    for w in 0..n {
        let http = http.clone();
        let url = c.target.clone();
        let tag = format!("{}-{}-{run_id}-w{w}", c.label, c.scenario);
        let conv = base.retag(&tag);
        set.spawn(async move {
            let r = send(&http, &url, &tag, &conv).await;
            (tag, conv, r)
        });
    }
    let mut convs = Vec::new();
    let mut cold = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    while let Some(r) = set.join_next().await {
        let (tag, conv, res) = r?;
        match res {
            Ok(t) => cold.push(t.total),
            Err(e) => errors.push(format!("{e:#}")),
        }
        convs.push((tag, conv));
    }
    let rss_after_cold = procfs::sum(&pids, procfs::rss);
    let cold_settle_ms = settle(&c.admin).await;
    // Steps in lockstep buckets so that every session has the same length
    // while a bucket is measured; RSS read at each bucket's end.
    let buckets = a.buckets.clamp(1, a.steps.max(1));
    let per = a.steps.max(1).div_ceil(buckets);
    let mut out_buckets = Vec::new();
    let t_warm = Instant::now();
    let mut warm_n = 0usize;
    for b in 0..buckets {
        if Instant::now() >= deadline {
            break;
        }
        let from = convs.first().map_or(0, |(_, c)| c.messages() + 2);
        let mut set = tokio::task::JoinSet::new();
        for (tag, mut conv) in convs.drain(..) {
            let http = http.clone();
            let url = c.target.clone();
            set.spawn(async move {
                let mut lat = Vec::new();
                let mut errs = Vec::new();
                for _ in 0..per {
                    if Instant::now() >= deadline {
                        break;
                    }
                    conv.step();
                    match send(&http, &url, &tag, &conv).await {
                        Ok(t) => lat.push(t.total),
                        Err(e) => errs.push(format!("{e:#}")),
                    }
                }
                (tag, conv, lat, errs)
            });
        }
        let mut lat = Vec::new();
        while let Some(r) = set.join_next().await {
            let (tag, conv, l, e) = r?;
            lat.extend(l);
            errors.extend(e);
            convs.push((tag, conv));
        }
        warm_n += lat.len();
        let to = convs.first().map_or(0, |(_, c)| c.messages());
        out_buckets.push(Bucket {
            from_messages: from,
            to_messages: to,
            latency: Pcts::of(&Samples::from_durations(lat)),
            rss: procfs::sum(&pids, procfs::rss),
        });
        let _ = b;
    }
    let warm_secs = t_warm.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let lag = sampler.await.ok().flatten();
    let settle_ms = settle(&c.admin).await;
    let all: Vec<u64> = Vec::new();
    let r = RunResult {
        kind: "scale".into(),
        cpu_ms_per_request: None,
        writer_cpu_ms_per_request: None,
        scenario: c.scenario.clone(),
        target: c.label.clone(),
        size: c.size,
        body_bytes,
        messages: base.base_messages,
        concurrency: n,
        sessions: n,
        cold: Pcts::of(&Samples::from_durations(cold)),
        latency: Pcts::of(&Samples::from_us(all)),
        ttfb: Pcts::default(),
        rps: warm_n as f64 / warm_secs.max(1e-9),
        errors: errors.len(),
        first_error: errors.first().cloned(),
        peak_rss: procfs::sum(&pids, procfs::peak_rss),
        rss_before,
        rss_after_cold,
        rss_end: procfs::sum(&pids, procfs::rss),
        writer_lag_max_ms: lag,
        settle_ms,
        cold_settle_ms,
        buckets: out_buckets,
        seconds: t_start.elapsed().as_secs_f64(),
    };
    emit(&c.out, &r)
}

fn opt_mib(b: Option<u64>) -> String {
    b.map(procfs::mib).unwrap_or_else(|| "–".into())
}

fn size_label(n: usize) -> String {
    if n >= 1_000_000 {
        format!("{:.1} MB", n as f64 / 1e6)
    } else {
        format!("{:.0} KB", n as f64 / 1e3)
    }
}

/// A scenario's runs by target, in order of first appearance; each target's
/// runs in the order they ran (its rounds).
fn rounds_of<'a>(runs: &[&'a RunResult]) -> Vec<(String, Vec<&'a RunResult>)> {
    let mut out: Vec<(String, Vec<&RunResult>)> = Vec::new();
    for r in runs {
        match out.iter_mut().find(|(t, _)| *t == r.target) {
            Some((_, v)) => v.push(r),
            None => out.push((r.target.clone(), vec![r])),
        }
    }
    out
}

fn median_of<T: Copy + PartialOrd>(mut v: Vec<T>) -> Option<T> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len().saturating_sub(1) / 2).copied()
}

fn merge_pcts(p: &[Pcts]) -> Pcts {
    let n: usize = p.iter().map(|p| p.n).sum();
    Pcts {
        n,
        p50: median_of(p.iter().map(|p| p.p50).collect()).unwrap_or(0),
        p99: median_of(p.iter().map(|p| p.p99).collect()).unwrap_or(0),
        mean: (p.iter().map(|p| p.mean as u128 * p.n as u128).sum::<u128>() / n.max(1) as u128)
            as u64,
        max: p.iter().map(|p| p.max).max().unwrap_or(0),
    }
}

/// One row for a target's rounds: medians of their figures, summed counts,
/// the highest peak RSS.
fn merge_rounds(runs: &[&RunResult]) -> RunResult {
    let Some(first) = runs.first() else {
        return RunResult::default();
    };
    let mut m = (*first).clone();
    if runs.len() == 1 {
        return m;
    }
    let pcts =
        |f: fn(&RunResult) -> Pcts| merge_pcts(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
    m.latency = pcts(|r| r.latency);
    m.ttfb = pcts(|r| r.ttfb);
    m.cold = pcts(|r| r.cold);
    m.rps = median_of(runs.iter().map(|r| r.rps).collect()).unwrap_or(0.0);
    m.errors = runs.iter().map(|r| r.errors).sum();
    m.first_error = runs.iter().find_map(|r| r.first_error.clone());
    m.peak_rss = runs.iter().filter_map(|r| r.peak_rss).max();
    m.cpu_ms_per_request = median_of(runs.iter().filter_map(|r| r.cpu_ms_per_request).collect());
    m.writer_cpu_ms_per_request = median_of(
        runs.iter()
            .filter_map(|r| r.writer_cpu_ms_per_request)
            .collect(),
    );
    m.seconds = runs.iter().map(|r| r.seconds).sum();
    m
}

/// A target's added latency against direct over paired rounds (µs).
struct Added {
    median: i64,
    min: i64,
    max: i64,
    rounds: usize,
}

impl Added {
    fn of(target: &[&RunResult], direct: &[&RunResult], f: fn(&RunResult) -> u64) -> Option<Added> {
        let d: Vec<i64> = target
            .iter()
            .zip(direct)
            .map(|(t, d)| f(t) as i64 - f(d) as i64)
            .collect();
        Some(Added {
            median: median_of(d.clone())?,
            min: *d.iter().min()?,
            max: *d.iter().max()?,
            rounds: d.len(),
        })
    }

    fn label(&self) -> String {
        if self.rounds < 2 {
            return ms_signed(self.median);
        }
        format!(
            "{} (median of {} rounds; {} … {})",
            ms_signed(self.median),
            self.rounds,
            ms_signed(self.min),
            ms_signed(self.max)
        )
    }
}

fn report(files: &[PathBuf]) -> Result<()> {
    let mut results: Vec<RunResult> = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        for line in text.lines().filter(|l| l.trim_start().starts_with('{')) {
            results.push(
                serde_json::from_str(line)
                    .with_context(|| format!("bad line in {}", f.display()))?,
            );
        }
    }
    println!("Machine: {}\n", oceancode_bench::machine());
    let mut scenarios: BTreeMap<(usize, usize, String), Vec<&RunResult>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.kind == "run") {
        scenarios
            .entry((r.size, r.concurrency, r.scenario.clone()))
            .or_default()
            .push(r);
    }
    let mut goals: Vec<String> = Vec::new();
    let rounds_used = scenarios
        .values()
        .map(|rows| {
            rounds_of(rows)
                .into_iter()
                .map(|(_, r)| r.len())
                .max()
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    if !scenarios.is_empty() {
        println!(
            "### Overhead (streamed Anthropic requests through the fake upstream, loopback)\n"
        );
        let mut t = Table::new([
            "scenario",
            "target",
            "requests",
            "p50",
            "p99",
            "added p50",
            "added p99",
            "TTFB p50",
            "TTFB p99",
            "added TTFB p50",
            "req/s",
            "req/s vs direct",
            "peak RSS",
            "CPU/request (writer)",
            "cold 1st request p50",
            "errors",
        ]);
        for ((size, conc, _), runs) in &scenarios {
            // Several runs of a target are rounds (bench/run.sh alternates
            // the targets round by round): one row each, merged; the added
            // latency is the median of the rounds' paired differences.
            let rounds = rounds_of(runs);
            let direct_runs = rounds.iter().find(|(t, _)| t == "direct").map(|(_, r)| r);
            let merged: Vec<RunResult> = rounds.iter().map(|(_, r)| merge_rounds(r)).collect();
            let rows: Vec<&RunResult> = merged.iter().collect();
            let direct = rows.iter().find(|r| r.target == "direct");
            let name = format!(
                "{} · {} msgs · c={conc}",
                size_label(*size),
                rows.first().map_or(0, |r| r.messages)
            );
            let runs_of = |target: &str| rounds.iter().find(|(t, _)| t == target).map(|(_, r)| r);
            let paired = |r: &RunResult, f: fn(&RunResult) -> u64| -> Option<Added> {
                Added::of(runs_of(&r.target)?, direct_runs?, f)
            };
            let added = |r: &RunResult, f: fn(&RunResult) -> u64| -> String {
                paired(r, f).map_or("–".into(), |a| ms_signed(a.median))
            };
            for r in &rows {
                t.row([
                    name.clone(),
                    r.target.clone(),
                    r.latency.n.to_string(),
                    ms(r.latency.p50),
                    ms(r.latency.p99),
                    added(r, |r| r.latency.p50),
                    added(r, |r| r.latency.p99),
                    ms(r.ttfb.p50),
                    ms(r.ttfb.p99),
                    added(r, |r| r.ttfb.p50),
                    format!("{:.1}", r.rps),
                    direct.map_or("–".into(), |d| format!("{:.2}×", r.rps / d.rps.max(1e-9))),
                    if r.target == "direct" {
                        "–".into()
                    } else {
                        opt_mib(r.peak_rss)
                    },
                    match (r.cpu_ms_per_request, r.writer_cpu_ms_per_request) {
                        (Some(c), Some(w)) => format!("{c:.2} ms ({w:.2})"),
                        (Some(c), None) => format!("{c:.2} ms"),
                        _ => "–".into(),
                    },
                    ms(r.cold.p50),
                    r.errors.to_string(),
                ]);
            }
            // Goals, for every build of the proxy in the run (a baseline
            // `oceancode-proxy@before` too).
            let p50 = |r: &RunResult| r.latency.p50;
            let nginx = rows.iter().find(|r| r.target == "nginx");
            for proxy in rows
                .iter()
                .filter(|r| r.target.starts_with("oceancode-proxy"))
            {
                let who = &proxy.target;
                let Some(pa) = paired(proxy, p50) else {
                    continue;
                };
                if *size <= 1_000_000 {
                    goals.push(format!(
                        "- {name}: {who} added p50 {} — goal ≤ 1 ms: **{}**",
                        pa.label(),
                        if pa.median <= 1_000 { "met" } else { "not met" }
                    ));
                    if let Some(na) = nginx.and_then(|n| paired(n, p50)) {
                        let ok = pa.median <= 2 * na.median.max(0) || pa.median <= 0;
                        goals.push(format!(
                            "- {name}: nginx added p50 {}; {who} within 2× of nginx: **{}**",
                            na.label(),
                            if ok { "met" } else { "not met" }
                        ));
                    }
                    if *conc > 1 {
                        if let Some(d) = direct {
                            let x = proxy.rps / d.rps.max(1e-9);
                            goals.push(format!(
                                "- {name}: {who} throughput {x:.2}× direct — goal ≥ 0.95×: **{}**",
                                if x >= 0.95 { "met" } else { "not met" }
                            ));
                        }
                    }
                } else {
                    goals.push(format!(
                        "- {name}: {who} added p50 {} — goal < 20 ms: **{}**",
                        pa.label(),
                        if pa.median < 20_000 { "met" } else { "not met" }
                    ));
                    if *conc > 1 {
                        if let Some(rss) = proxy.peak_rss {
                            goals.push(format!(
                                "- {name}: {who} peak RSS {} with {} errors — goal < 300 MB, no error: **{}**",
                                opt_mib(Some(rss)),
                                proxy.errors,
                                if rss < 300_000_000 && proxy.errors == 0 { "met" } else { "not met" }
                            ));
                        }
                    }
                }
            }
        }
        println!("{}", t.render());
        if rounds_used > 1 {
            println!(
                "Each target ran in up to {rounds_used} rounds, the targets alternating with a fresh fake upstream each time: a row shows the median of the rounds' percentiles (requests summed, peak RSS the highest); \"added\" is the median of the rounds' paired differences against direct, its range in the goals below.\n"
            );
        }
        let notes: Vec<String> = results
            .iter()
            .filter(|r| r.kind == "run" && (r.writer_lag_max_ms.is_some() || r.settle_ms.is_some()))
            .map(|r| {
                format!(
                    "- {} · c={}: ledger caught up with the cold requests in {} ms (settled before the measured steps); writer lag during the steps (sampled every 100 ms) max {} ms; settle after the run {} ms; {} sessions; RSS before {} → after cold requests {} → end {}",
                    size_label(r.size),
                    r.concurrency,
                    r.cold_settle_ms.unwrap_or(0),
                    r.writer_lag_max_ms.unwrap_or(0),
                    r.settle_ms.unwrap_or(0),
                    r.sessions,
                    opt_mib(r.rss_before),
                    opt_mib(r.rss_after_cold),
                    opt_mib(r.rss_end)
                )
            })
            .collect();
        if !notes.is_empty() {
            println!("oceancode-proxy's ledger and memory during these runs:\n");
            println!("{}\n", notes.join("\n"));
        }
        let errs: Vec<String> = results
            .iter()
            .filter(|r| r.errors > 0)
            .map(|r| {
                format!(
                    "- {} {}: {} errors, first: {}",
                    r.scenario,
                    r.target,
                    r.errors,
                    r.first_error.clone().unwrap_or_default()
                )
            })
            .collect();
        if !errs.is_empty() {
            println!("Errors:\n\n{}\n", errs.join("\n"));
        }
        if !goals.is_empty() {
            println!("Goals:\n\n{}\n", goals.join("\n"));
        }
    }
    let scale: Vec<&RunResult> = results.iter().filter(|r| r.kind == "scale").collect();
    if !scale.is_empty() {
        let direct = scale.iter().find(|r| r.target == "direct");
        for r in &scale {
            println!(
                "### Scale: {} sessions of {} messages ({}), {} — cold first requests p50 {} / p99 {}; {:.0} req/s\n",
                r.sessions,
                r.messages,
                size_label(r.body_bytes),
                r.target,
                ms(r.cold.p50),
                ms(r.cold.p99),
                r.rps
            );
        }
        let mut t = Table::new([
            "session length (messages)",
            "target",
            "requests",
            "p50",
            "p99",
            "added p50",
            "added p99",
            "RSS at end of bucket",
        ]);
        for r in &scale {
            for (i, b) in r.buckets.iter().enumerate() {
                let d = direct.and_then(|d| d.buckets.get(i));
                t.row([
                    format!("{}–{}", b.from_messages, b.to_messages),
                    r.target.clone(),
                    b.latency.n.to_string(),
                    ms(b.latency.p50),
                    ms(b.latency.p99),
                    d.map_or("–".into(), |d| {
                        ms_signed(b.latency.p50 as i64 - d.latency.p50 as i64)
                    }),
                    d.map_or("–".into(), |d| {
                        ms_signed(b.latency.p99 as i64 - d.latency.p99 as i64)
                    }),
                    if r.target == "direct" {
                        "–".into()
                    } else {
                        opt_mib(b.rss)
                    },
                ]);
            }
        }
        println!("{}", t.render());
        for r in scale.iter().filter(|r| r.target != "direct") {
            let per_session = match (r.rss_before, r.rss_after_cold) {
                (Some(a), Some(b)) if b > a => format!(
                    "{:.1} KiB",
                    (b - a) as f64 / 1024.0 / r.sessions.max(1) as f64
                ),
                _ => "–".into(),
            };
            println!(
                "- {}: RSS before {} → after opening {} sessions {} (≈ {per_session} per session) → end {}; peak {}; writer lag max {} ms, settle {} ms",
                r.target,
                opt_mib(r.rss_before),
                r.sessions,
                opt_mib(r.rss_after_cold),
                opt_mib(r.rss_end),
                opt_mib(r.peak_rss),
                r.writer_lag_max_ms.unwrap_or(0),
                r.settle_ms.unwrap_or(0)
            );
        }
        for r in scale.iter().filter(|r| r.target != "direct") {
            if let Some(rss) = r.rss_after_cold {
                println!(
                    "- {}: {} sessions × {} messages open in {} — goal < 100 MB: **{}**",
                    r.target,
                    r.sessions,
                    r.messages,
                    opt_mib(Some(rss)),
                    if rss < 100_000_000 { "met" } else { "not met" }
                );
            }
        }
        println!();
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.cmd {
        Cmd::Run(a) => rt.block_on(run(a)),
        Cmd::Scale(a) => rt.block_on(scale(a)),
        Cmd::Report { files } => report(&files),
        Cmd::FreePort => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            println!("{}", l.local_addr()?.port());
            Ok(())
        }
    }
}
