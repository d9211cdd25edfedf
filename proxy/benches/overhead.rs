//! Criterion benchmarks of the proxy's request path, without the network:
//! what `server::provider_request` does on the CPU for one request (parse the
//! body for the identity and side-request check, then `SessionManager::prepare`:
//! split, hash and match the history, record new rows, run the tideline, render
//! the window), and its pure parts.
//!
//! `cargo bench -p oceancode-proxy --bench overhead` (not part of `cargo test`).
//! The end-to-end load runs (direct vs nginx vs proxy) are `bench/run.sh`;
//! see docs/benchmarks.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use oceancode_bench::conv::{Conv, Spec};
use oceancode_config::LineSpec;
use oceancode_proxy::dialect::{self, Collected, ParsedBody};
use oceancode_proxy::identity::{self, ReqKind};
use oceancode_proxy::sessions::{estimate_tokens, Prepared, SessionManager, Settings};
use oceancode_window::tideline::{plan_window, RowInfo};
use oceancode_window::{Dialect, RowKind, Usage};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A manager with the production tideline defaults and a sink that drops events.
fn manager(line: LineSpec) -> SessionManager {
    let settings = Settings {
        line,
        ..Settings::new(std::env::temp_dir().join("oceancode-bench"))
    };
    SessionManager::new(settings, Arc::new(|_events| {}))
}

/// What the server does on the CPU for one request (`provider_request`'s `cpu` block).
fn request(m: &SessionManager, session: &str, body: Bytes) -> Prepared {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-oceancode-session",
        http::HeaderValue::from_str(session).expect("header"),
    );
    // What the server does: one parse for side-request check, identity and window.
    m.prepare_request(
        Dialect::Anthropic,
        ReqKind::Main,
        oceancode_proxy::identity::Route::default(),
        &headers,
        body,
    )
    .expect("a valid session name")
}

/// The step ended with real usage (what the tap reports).
fn complete(p: Prepared, window_tokens: u64) {
    if let Some(t) = p.ticket {
        let collected = Collected {
            usage: Some(Usage {
                input: 3,
                output: 300,
                cache_read: window_tokens,
                cache_write: 500,
            }),
            ..Collected::default()
        };
        t.complete(200, true, &collected);
    }
}

fn spec(bytes: usize, messages: usize, model: &str) -> Spec {
    Spec {
        messages,
        bytes,
        turn_len: 40,
        model: model.into(),
    }
}

/// One warm step per iteration: the session grows by an echoed tool call and
/// its result, as in an agent's tool loop. Each sample starts a new session
/// (its cold first request is not timed).
fn warm_steps(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_path/warm_step");
    g.sample_size(20).measurement_time(Duration::from_secs(8));
    // (name, size, messages, model, line): an unknown model with a 100M line
    // never cuts (the body is forwarded unchanged); claude-sonnet-4-5 at 40%
    // cuts an 8 MB history (the window is re-rendered).
    let cases: [(&str, usize, usize, &str, LineSpec); 4] = [
        (
            "200KB/2000msgs",
            200_000,
            2000,
            "claude-sonnet-4-5",
            LineSpec::Percent(40.0),
        ),
        (
            "8MB/2000msgs/no-cut",
            8_000_000,
            2000,
            "oceancode-bench",
            LineSpec::Tokens(100_000_000),
        ),
        (
            "8MB/2000msgs/cut-40%",
            8_000_000,
            2000,
            "claude-sonnet-4-5",
            LineSpec::Percent(40.0),
        ),
        (
            "2MB/20000msgs",
            2_000_000,
            20_000,
            "claude-sonnet-4-5",
            LineSpec::Percent(40.0),
        ),
    ];
    for (name, bytes, messages, model, line) in cases {
        let base = Conv::new(&spec(bytes, messages, model), "base");
        let mut round = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                round += 1;
                let m = manager(line);
                let tag = format!("warm-{round}");
                let mut conv = base.retag(&tag);
                let p = request(&m, &tag, Bytes::from(conv.body()));
                complete(p, (bytes / 4) as u64);
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    conv.step();
                    let body = Bytes::from(conv.body());
                    let t = Instant::now();
                    let p = black_box(request(&m, &tag, body));
                    total += t.elapsed();
                    complete(p, (bytes / 4) as u64);
                }
                total
            })
        });
    }
    g.finish();
}

/// `SessionManager::prepare` alone (without the server's first parse of the
/// body for the identity and side-request check): the difference with
/// `warm_step` is that extra parse.
fn prepare_only(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_path/prepare_only");
    g.sample_size(20).measurement_time(Duration::from_secs(6));
    for (name, bytes) in [
        ("200KB/2000msgs", 200_000usize),
        ("8MB/2000msgs/no-cut", 8_000_000),
    ] {
        let base = Conv::new(&spec(bytes, 2000, "oceancode-bench"), "base");
        let mut round = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                round += 1;
                let m = manager(LineSpec::Tokens(100_000_000));
                let tag = format!("prep-{round}");
                let ident = identity::Identity {
                    client_key: Some(format!("name:{tag}")),
                    client: "unknown",
                    context_1m: false,
                    model: None,
                };
                let mut conv = base.retag(&tag);
                let p = m.prepare(
                    Dialect::Anthropic,
                    ReqKind::Main,
                    &ident,
                    Bytes::from(conv.body()),
                );
                complete(p, (bytes / 4) as u64);
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    conv.step();
                    let body = Bytes::from(conv.body());
                    let t = Instant::now();
                    let p = black_box(m.prepare(Dialect::Anthropic, ReqKind::Main, &ident, body));
                    total += t.elapsed();
                    complete(p, (bytes / 4) as u64);
                }
                total
            })
        });
    }
    g.finish();
}

/// Per-request cost against session length at a fixed message size (~100 B):
/// the request path scans and hashes every message, so the cost should grow
/// linearly with the body and nothing else.
fn session_length(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_path/session_length");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for messages in [500usize, 2000, 8000, 20_000] {
        let base = Conv::new(&spec(messages * 100, messages, "oceancode-bench"), "len");
        let mut round = 0u64;
        g.bench_function(BenchmarkId::from_parameter(messages), |b| {
            b.iter_custom(|iters| {
                round += 1;
                let m = manager(LineSpec::Tokens(100_000_000));
                let tag = format!("len-{round}");
                let mut conv = base.retag(&tag);
                let p = request(&m, &tag, Bytes::from(conv.body()));
                complete(p, 50_000);
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    conv.step();
                    let body = Bytes::from(conv.body());
                    let t = Instant::now();
                    let p = black_box(request(&m, &tag, body));
                    total += t.elapsed();
                    complete(p, 50_000);
                }
                total
            })
        });
    }
    g.finish();
}

/// A session's first request: every message of the history is parsed,
/// estimated (tiktoken) and recorded.
fn cold(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_path/cold_first_request");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, bytes) in [
        ("200KB/2000msgs", 200_000usize),
        ("2MB/2000msgs", 2_000_000),
    ] {
        let base = Conv::new(&spec(bytes, 2000, "claude-sonnet-4-5"), "cold");
        let body = Bytes::from(base.body());
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_batched(
                || manager(LineSpec::Percent(40.0)),
                |m| black_box(request(&m, "cold", body.clone())),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// The pure parts: body split, tideline planning, token estimates.
fn parts(c: &mut Criterion) {
    let mut g = c.benchmark_group("parts");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    for (name, bytes) in [("200KB", 200_000usize), ("8MB", 8_000_000)] {
        let body = Conv::new(&spec(bytes, 2000, "m"), "p").body();
        g.bench_function(BenchmarkId::new("parse_body", name), |b| {
            b.iter(|| {
                let p = ParsedBody::parse(black_box(&body), "messages").expect("parse");
                black_box(p.messages.len())
            })
        });
        g.bench_function(BenchmarkId::new("parse_and_hash_messages", name), |b| {
            b.iter(|| {
                let p = ParsedBody::parse(black_box(&body), "messages").expect("parse");
                let h: u64 = p
                    .messages
                    .iter()
                    .map(|m| dialect::raw_hash(m))
                    .fold(0, |a, x| a ^ x);
                black_box(h)
            })
        });
    }
    let rows: Vec<RowInfo> = (1..=10_000u64)
        .map(|seq| {
            let kind = match seq % 40 {
                1 => RowKind::Prompt,
                k if k % 2 == 0 => RowKind::Assistant,
                _ => RowKind::ToolResult,
            };
            RowInfo {
                seq,
                kind,
                starts_ok: kind != RowKind::ToolResult,
            }
        })
        .collect();
    g.bench_function("plan_window/10k_rows", |b| {
        b.iter(|| black_box(plan_window(black_box(&rows), 6_001)))
    });
    let mut rng = oceancode_bench::conv::Rng::new(3);
    let text = oceancode_bench::conv::filler(&mut rng, 4_000);
    let _ = estimate_tokens("warm");
    g.bench_function("estimate_tokens/4KB", |b| {
        b.iter(|| black_box(estimate_tokens(black_box(&text))))
    });
    g.finish();
}

criterion_group!(
    benches,
    warm_steps,
    prepare_only,
    session_length,
    cold,
    parts
);
criterion_main!(benches);
