//! `oceancode-limits`: resident memory of an `oceancode-proxy` binary under
//! the hostile inputs of the resource bounds (issue 12, items 6–8).
//!
//! Each case starts a fresh proxy (`--proxy-bin`) in front of an upstream in
//! this process and prints one line: RSS before, peak (`VmHWM`) and after.
//!
//! * `prealloc`: `--conns` connections each send a request head with
//!   `Content-Length: 67108864` and one body byte, and wait.
//! * `gzip-bomb` / `zstd-bomb`: the upstream answers a streamed request with a
//!   small compressed body that decodes to gigabytes of zeros (the client reads
//!   it whole); two at once, while a probe request runs every 100 ms (its worst
//!   latency is printed).
//! * `big-sse`: a 200 MB SSE answer (text deltas) read whole; the data dir's
//!   size after is printed.
//! * `long-line`: a 300 MB SSE answer without a newline.
//!
//! Loopback only; nothing here runs in `cargo test`.
// A measurement tool: a response with static headers cannot fail to build.
#![allow(clippy::expect_used)]

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Parser;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use oceancode_bench::procfs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

#[derive(Parser)]
#[command(name = "oceancode-limits")]
struct Cli {
    /// The proxy binary to measure.
    #[arg(long)]
    proxy_bin: PathBuf,
    /// Cases to run (default: all).
    cases: Vec<String>,
    /// Connections of `prealloc`.
    #[arg(long, default_value_t = 400)]
    conns: usize,
}

const ALL: [&str; 5] = ["prealloc", "gzip-bomb", "zstd-bomb", "big-sse", "long-line"];

/// The compressed bombs, built once.
struct Bombs {
    gzip: Bytes,
    zstd: Bytes,
}

fn bombs() -> Result<Bombs> {
    let zeros = vec![0u8; 1 << 20];
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // 1 GiB of zeros: about 1 MB of gzip.
    for _ in 0..1024 {
        gz.write_all(&zeros)?;
    }
    let gzip = Bytes::from(gz.finish()?);
    let mut zs = zstd::stream::write::Encoder::new(Vec::new(), 19)?;
    // 2 GiB of zeros: tens of KB of zstd.
    for _ in 0..2048 {
        zs.write_all(&zeros)?;
    }
    let zstd = Bytes::from(zs.finish()?);
    Ok(Bombs { gzip, zstd })
}

type Chunks = tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::convert::Infallible>>;

fn stream_body(
    rx: Chunks,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>>> {
    StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (c, rx))
    }))
}

/// The upstream: `x-bench-case` picks the answer.
async fn upstream(bombs: Arc<Bombs>) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let bombs = bombs.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let bombs = bombs.clone();
                    async move {
                        let case = req
                            .headers()
                            .get("x-bench-case")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let _ = req.into_body().collect().await;
                        let (tx, rx) = tokio::sync::mpsc::channel(4);
                        let mut resp = Response::builder()
                            .status(200)
                            .header("content-type", "text/event-stream");
                        let chunks: Vec<Bytes> = match case.as_str() {
                            "gzip-bomb" => {
                                resp = resp.header("content-encoding", "gzip");
                                vec![bombs.gzip.clone()]
                            }
                            "zstd-bomb" => {
                                resp = resp.header("content-encoding", "zstd");
                                vec![bombs.zstd.clone()]
                            }
                            _ => Vec::new(),
                        };
                        tokio::spawn(async move {
                            let send = |b: Bytes| tx.send(Ok(Frame::data(b)));
                            match case.as_str() {
                                "big-sse" => {
                                    let _ = send(Bytes::from_static(SSE_START)).await;
                                    // 200 MB of text deltas, 64 KiB per event.
                                    let text = "x".repeat(64 << 10);
                                    let ev = Bytes::from(format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n"));
                                    for _ in 0..(200 << 20) / ev.len() {
                                        if send(ev.clone()).await.is_err() {
                                            return;
                                        }
                                    }
                                    let _ = send(Bytes::from_static(SSE_END)).await;
                                }
                                "long-line" => {
                                    let _ = send(Bytes::from_static(SSE_START)).await;
                                    let _ = send(Bytes::from_static(b"data: ")).await;
                                    let chunk = Bytes::from(vec![b'a'; 1 << 20]);
                                    for _ in 0..300 {
                                        if send(chunk.clone()).await.is_err() {
                                            return;
                                        }
                                    }
                                }
                                "gzip-bomb" | "zstd-bomb" => {
                                    for c in chunks {
                                        // In 16 KiB frames, as a socket would.
                                        for piece in c.chunks(16 << 10) {
                                            if send(Bytes::copy_from_slice(piece)).await.is_err() {
                                                return;
                                            }
                                        }
                                    }
                                }
                                _ => {
                                    let _ = send(Bytes::from_static(SSE_START)).await;
                                    let _ = send(Bytes::from_static(SSE_END)).await;
                                }
                            }
                        });
                        Ok::<_, std::convert::Infallible>(
                            resp.body(stream_body(rx)).expect("response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

const SSE_START: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
const SSE_END: &[u8] = b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

struct Proxy {
    child: Child,
    url: String,
    data: tempfile::TempDir,
}

impl Proxy {
    fn start(bin: &Path, upstream: &str) -> Result<Proxy> {
        let data = tempfile::tempdir()?;
        let mut child = Command::new(bin)
            .arg("--data-dir")
            .arg(data.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--anthropic-upstream"])
            .arg(upstream)
            .env("OCEANCODE_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start the proxy")?;
        let stderr = child.stderr.take().context("stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let Some(line) = lines.next() else {
                bail!("the proxy exited before listening")
            };
            let line = line?;
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap_or("").to_string();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Ok(Proxy { child, url, data })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn rss(&self) -> u64 {
        procfs::rss(self.pid()).unwrap_or(0)
    }

    fn peak(&self) -> u64 {
        procfs::peak_rss(self.pid()).unwrap_or(0)
    }

    fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }

    fn token(&self) -> Option<String> {
        std::fs::read_to_string(self.data.path().join("admin-token"))
            .ok()
            .map(|t| t.trim().to_string())
    }

    /// A POST of the Messages API with `case` for the upstream; the answer's
    /// bytes and the time it took.
    async fn ask(&self, case: &str) -> Result<(u64, Duration)> {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build_http::<Full<Bytes>>();
        let body = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let req = Request::post(format!("{}/v1/messages", self.url))
            .header("content-type", "application/json")
            .header("x-bench-case", case)
            .body(Full::new(Bytes::from_static(body.as_bytes())))?;
        let t0 = Instant::now();
        let resp = client.request(req).await?;
        let mut body = resp.into_body();
        let mut n = 0u64;
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                Err(_) => break,
            }
        }
        Ok((n, t0.elapsed()))
    }

    async fn settle(&self) {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build_http::<Full<Bytes>>();
        let mut req = Request::post(format!("{}/_oceancode/settle", self.url))
            .header("content-type", "application/json");
        if let Some(t) = self.token() {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Ok(req) = req.body(Full::new(Bytes::from_static(b"{}"))) {
            if let Ok(r) = client.request(req).await {
                let _ = r.into_body().collect().await;
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dir_size(p: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => n += dir_size(&e.path()),
                Ok(m) => n += m.len(),
                Err(_) => {}
            }
        }
    }
    n
}

fn line(case: &str, p: &Proxy, before: u64, extra: &str) {
    println!(
        "{case:<10} rss before {:>10} · peak {:>10} · after {:>10}{extra}",
        procfs::mib(before),
        procfs::mib(p.peak()),
        procfs::mib(p.rss()),
    );
}

async fn prealloc(bin: &Path, up: &str, conns: usize) -> Result<()> {
    let p = Proxy::start(bin, up)?;
    let _ = p.ask("small").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = p.rss();
    let mut socks = Vec::new();
    for _ in 0..conns {
        let mut s = tokio::net::TcpStream::connect(p.addr()).await?;
        let head = format!(
            "POST /v1/messages HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 67108864\r\n\r\n{{",
            p.addr()
        );
        s.write_all(head.as_bytes()).await?;
        socks.push(s);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = p.rss();
    drop(socks);
    tokio::time::sleep(Duration::from_secs(2)).await;
    line(
        "prealloc",
        &p,
        before,
        &format!(" · with {conns} connections open {}", procfs::mib(held)),
    );
    Ok(())
}

async fn bomb(bin: &Path, up: &str, case: &str) -> Result<()> {
    let p = Arc::new(Proxy::start(bin, up)?);
    let _ = p.ask("small").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = p.rss();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let p = p.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((_, t)) = p.ask("small").await {
                    worst = worst.max(t);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            worst
        })
    };
    let (a, b) = tokio::join!(p.ask(case), p.ask(case));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let worst = probe.await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (n, t) = a?;
    let _ = b?;
    line(
        case,
        &p,
        before,
        &format!(
            " · client got {n} bytes in {:.1} s · worst probe latency {} ms",
            t.as_secs_f64(),
            worst.as_millis()
        ),
    );
    Ok(())
}

async fn big(bin: &Path, up: &str, case: &str) -> Result<()> {
    let p = Proxy::start(bin, up)?;
    let _ = p.ask("small").await;
    p.settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = p.rss();
    let disk0 = dir_size(p.data.path());
    let (n, t) = p.ask(case).await?;
    p.settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    line(
        case,
        &p,
        before,
        &format!(
            " · client got {} in {:.1} s · data dir +{}",
            procfs::mib(n),
            t.as_secs_f64(),
            procfs::mib(dir_size(p.data.path()).saturating_sub(disk0))
        ),
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let cases: Vec<String> = if cli.cases.is_empty() {
        ALL.iter().map(|s| s.to_string()).collect()
    } else {
        cli.cases.clone()
    };
    let bombs = Arc::new(bombs()?);
    eprintln!(
        "gzip bomb {} → 1 GiB, zstd bomb {} → 2 GiB",
        procfs::mib(bombs.gzip.len() as u64),
        procfs::mib(bombs.zstd.len() as u64)
    );
    let up = upstream(bombs).await?;
    for c in &cases {
        let r = match c.as_str() {
            "prealloc" => prealloc(&cli.proxy_bin, &up, cli.conns).await,
            "gzip-bomb" | "zstd-bomb" => bomb(&cli.proxy_bin, &up, c).await,
            "big-sse" | "long-line" => big(&cli.proxy_bin, &up, c).await,
            other => bail!("unknown case {other:?} (one of {ALL:?})"),
        };
        if let Err(e) = r {
            println!("{c:<10} failed: {e:#}");
        }
    }
    Ok(())
}
