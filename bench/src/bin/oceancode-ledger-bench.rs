//! `oceancode-ledger-bench`: the ledger's writer under a burst, and the export
//! of a 10,000-row session, through `oceancode_ledger::store::Store`.
//!
//! * Writer lag: every event's enqueue-to-commit time, read by polling the
//!   store's committed-event counter (`StoreMetrics::events`, FIFO writer)
//!   every 200 µs; the store's own p50/p99 (last 1,024 events) as a cross-check.
//!   Burst "open": `--sessions` sessions open at once, each with its whole
//!   history (`--open-rows` rows) in one `Rows` event. Burst "steps": every
//!   session then takes `--steps` steps at once (`Session`, `Rows` of an echoed
//!   tool call and its result, `Step`), as a proxy under load would submit them.
//! * Export: one session of `--export-rows` rows (~1 KB each) is recorded, then
//!   `export --md` and `export --atif` are timed (`oceancode_ledger::export::markdown`,
//!   `oceancode_ledger::atif::write`), next to `Store::load_session` plus
//!   rendering every turn with `transcript::render_turn`.

use anyhow::{Context, Result};
use clap::Parser;
use oceancode_bench::conv::{Conv, Spec};
use oceancode_bench::stats::{ms, Samples, Table};
use oceancode_config::Config;
use oceancode_ledger::store::{open_ledger, LedgerStore, StoreOptions};
use oceancode_ledger::transcript;
use oceancode_window::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "oceancode-ledger-bench",
    about = "Ledger writer lag under a burst and export of a large session"
)]
struct Args {
    /// Sessions in the bursts.
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Rows each session opens with (its history).
    #[arg(long, default_value_t = 2001)]
    open_rows: usize,
    /// Bytes of the opening history of one session.
    #[arg(long, default_value = "200000")]
    open_bytes: usize,
    /// Steps each session takes in the "steps" burst.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Rows of the exported session.
    #[arg(long, default_value_t = 10_000)]
    export_rows: usize,
    /// Repetitions of each export timing (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Sessions that open (`--open-rows` rows each) at the head of the
    /// "mixed" burst, before every session's next step (SQLite only).
    #[arg(long, default_value_t = 10)]
    mixed_opens: usize,
    /// Steps of the live-step measurement (one step at a time, settled).
    #[arg(long, default_value_t = 400)]
    live_steps: usize,
    /// Data directory (default: a temporary directory, removed at the end).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// The ledger's PostgreSQL database (`postgres://…`, an empty one);
    /// default: SQLite in the data dir.
    #[arg(long)]
    database: Option<String>,
}

fn meta(id: &str) -> SessionMeta {
    SessionMeta {
        id: id.to_string(),
        client: "claude-code".into(),
        client_session: Some(format!("name:{id}")),
        dialect: Dialect::Anthropic,
        model: "claude-sonnet-4-5".into(),
        parent: None,
        parent_seq: None,
        created_ms: 1_790_000_000_000,
        last_ms: 1_790_000_000_000,
    }
}

/// The messages of a synthetic conversation as ledger rows.
fn rows_of(conv: &Conv) -> Result<Vec<Row>> {
    let v: serde_json::Value = serde_json::from_slice(&conv.body()).context("conversation JSON")?;
    let msgs = v["messages"].as_array().context("messages")?;
    let mut turn = 0u32;
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("user").to_string();
        let kind = match (role.as_str(), &m["content"]) {
            ("assistant", _) => RowKind::Assistant,
            ("user", serde_json::Value::String(_)) => RowKind::Prompt,
            _ => RowKind::ToolResult,
        };
        if kind == RowKind::Prompt {
            turn += 1;
        }
        let raw = serde_json::to_string(m)?;
        out.push(Row {
            seq: i as u64 + 1,
            role,
            kind,
            tokens: (raw.len() / 4) as u32,
            raw: raw.into(),
            turn: turn.max(1),
            step: 1,
            branch: 0,
            from_response: false,
        });
    }
    Ok(out)
}

/// Submits `events` in order and returns every event's enqueue-to-commit lag (µs).
fn burst(store: &Arc<dyn LedgerStore>, events: Vec<Event>) -> Result<(Vec<u64>, Duration)> {
    let before = store.metrics().events;
    let tracked = vec![true; events.len()];
    let counter = {
        let store = store.clone();
        move || Ok(store.metrics().events - before)
    };
    burst_by(store, events, tracked, counter)
}

/// Submits `events` in order and returns the enqueue-to-commit lag (µs) of
/// those `tracked`, read by polling `committed` (how many tracked events
/// are committed; they commit in order among themselves) every 200 µs.
fn burst_by(
    store: &Arc<dyn LedgerStore>,
    events: Vec<Event>,
    tracked: Vec<bool>,
    committed: impl Fn() -> Result<u64> + Send + 'static,
) -> Result<(Vec<u64>, Duration)> {
    let n = tracked.iter().filter(|t| **t).count() as u64;
    let poller = std::thread::spawn(move || -> Result<Vec<(Instant, u64)>> {
        let mut samples: Vec<(Instant, u64)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let e = committed()?;
            let now = Instant::now();
            if samples.last().is_none_or(|&(_, last)| last != e) {
                samples.push((now, e));
            }
            if e >= n || now > deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(samples)
    });
    let t0 = Instant::now();
    let mut submitted = Vec::with_capacity(events.len());
    for (ev, t) in events.into_iter().zip(&tracked) {
        if *t {
            submitted.push(Instant::now());
        }
        store.submit(ev).context("submit")?;
    }
    store.settle_blocking().context("settle")?;
    let total = t0.elapsed();
    let samples = poller
        .join()
        .map_err(|_| anyhow::anyhow!("poller panicked"))??;
    let mut lags = Vec::with_capacity(submitted.len());
    let mut j = 0;
    for (k, at) in submitted.iter().enumerate() {
        while j < samples.len() && samples[j].1 < k as u64 + 1 {
            j += 1;
        }
        let committed = samples.get(j).map_or(t0 + total, |s| s.0);
        lags.push(committed.saturating_duration_since(*at).as_micros() as u64);
    }
    Ok((lags, total))
}

/// The last two messages of a conversation (an echoed tool call and its
/// result), as raw JSON.
fn last_pair(conv: &Conv) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_slice(&conv.body())?;
    let msgs = v["messages"].as_array().context("messages")?;
    Ok(msgs[msgs.len() - 2..]
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?)
}

/// One step of session `id` as a proxy submits it: its facts, the rows of
/// `pair` from `seq` on, the step's usage.
fn step_events(id: &str, pair: &[String], seq: u64, turn: u32, step: u32) -> Vec<Event> {
    let mut m = meta(id);
    m.last_ms += i64::from(step);
    let rows = pair
        .iter()
        .enumerate()
        .map(|(k, raw)| Row {
            seq: seq + k as u64,
            role: if k == 0 { "assistant" } else { "user" }.into(),
            kind: if k == 0 {
                RowKind::Assistant
            } else {
                RowKind::ToolResult
            },
            raw: raw.as_str().into(),
            tokens: (raw.len() / 4) as u32,
            turn,
            step,
            branch: 0,
            from_response: false,
        })
        .collect();
    vec![
        Event::Session(m),
        Event::Rows {
            session: id.to_string(),
            rows,
        },
        Event::Step {
            session: id.to_string(),
            step,
            model: "claude-sonnet-4-5".into(),
            status: 200,
            usage: Usage {
                input: 3,
                output: 300,
                cache_read: 50_000,
                cache_write: 600,
            },
            window_rows: seq as u32 + 1,
            ts_ms: 1_790_000_000_000 + i64::from(step),
            error: None,
            detail: Default::default(),
        },
    ]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn main() -> Result<()> {
    let a = Args::parse();
    let tmp = tempfile::tempdir()?;
    let dir = a
        .data_dir
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let cfg = Config::default();
    let store = open_ledger(
        a.database.as_deref(),
        &dir,
        StoreOptions {
            queue_capacity: cfg.writer.queue_capacity,
            queue_bytes: usize::try_from(cfg.writer.queue_bytes).unwrap_or(usize::MAX),
            batch_max: cfg.writer.batch_max,
            ..StoreOptions::default()
        },
    )?;
    println!("Machine: {}\n", oceancode_bench::machine());
    match &a.database {
        Some(url) => println!(
            "Database: {} (PostgreSQL); files in {}\n",
            oceancode_ledger::store::pg::redact_url(url),
            dir.display()
        ),
        None => println!("Data dir: {} (WAL, synchronous=NORMAL)\n", dir.display()),
    }

    // --- Bursts.
    let base = Conv::new(
        &Spec {
            messages: a.open_rows,
            bytes: a.open_bytes,
            turn_len: 40,
            model: "claude-sonnet-4-5".into(),
        },
        "base",
    );
    let base_rows = rows_of(&base)?;
    let mut open = Vec::new();
    for s in 0..a.sessions {
        let id = format!("bench-{s:03}");
        open.push(Event::Session(meta(&id)));
        open.push(Event::Rows {
            session: id,
            rows: base_rows.clone(),
        });
    }
    let open_n = open.len();
    let (open_lags, open_time) = burst(&store, open)?;
    let open_store = store.metrics();
    let mut step_conv = base.clone();
    let mut steps = Vec::new();
    let mut next_seq = base_rows.len() as u64 + 1;
    let turn = base_rows.last().map_or(1, |r| r.turn);
    for st in 0..a.steps {
        step_conv.step();
        let pair = last_pair(&step_conv)?;
        for sess in 0..a.sessions {
            let id = format!("bench-{sess:03}");
            steps.extend(step_events(&id, &pair, next_seq, turn, st as u32 + 2));
        }
        next_seq += 2;
    }
    let steps_n = steps.len();
    let (step_lags, step_time) = burst(&store, steps)?;
    let step_store = store.metrics();
    // Mixed: new sessions open with their whole history, and every session's
    // next step queues behind them; the steps' lag (their `Step` events
    // commit in order among themselves: the count of committed steps).
    let mut mixed_run = None;
    if a.database.is_none() && a.mixed_opens > 0 {
        let mut mixed = Vec::new();
        let mut tracked = Vec::new();
        for k in 0..a.mixed_opens {
            let id = format!("cold-{k:03}");
            mixed.push(Event::Session(meta(&id)));
            mixed.push(Event::Rows {
                session: id,
                rows: base_rows.clone(),
            });
            tracked.extend([false, false]);
        }
        step_conv.step();
        let pair = last_pair(&step_conv)?;
        for sess in 0..a.sessions {
            let id = format!("bench-{sess:03}");
            mixed.extend(step_events(&id, &pair, next_seq, turn, a.steps as u32 + 2));
            tracked.extend([false, false, true]);
        }
        let db = rusqlite::Connection::open_with_flags(
            oceancode_ledger::paths::DataDir::new(&dir).db_path(),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        let count = |db: &rusqlite::Connection| -> Result<u64> {
            Ok(db.query_row("SELECT COUNT(*) FROM steps", [], |r| r.get::<_, i64>(0))? as u64)
        };
        let before = count(&db)?;
        let mixed_n = mixed.len();
        let (lags, time) = burst_by(&store, mixed, tracked, move || {
            Ok(count(&db)?.saturating_sub(before))
        })?;
        mixed_run = Some((mixed_n, lags, time, store.metrics()));
    }
    let mut t = Table::new([
        "burst",
        "events",
        "wall time",
        "events/s",
        "lag p50",
        "lag p99",
        "lag max",
        "store's p50 / p99 (last 1,024)",
    ]);
    for (name, n, lags, time, m) in [
        (
            format!(
                "open: {} sessions × {} rows ({} KB each)",
                a.sessions,
                base_rows.len(),
                base.len() / 1000
            ),
            open_n,
            open_lags,
            open_time,
            open_store,
        ),
        (
            format!(
                "steps: {} sessions × {} steps (Session + 2 rows + Step)",
                a.sessions, a.steps
            ),
            steps_n,
            step_lags,
            step_time,
            step_store,
        ),
    ]
    .into_iter()
    .chain(mixed_run.map(|(n, lags, time, m)| {
        (
            format!(
                "mixed: {} sessions open ({} rows each) ahead of {} sessions' steps (lag of the steps)",
                a.mixed_opens,
                base_rows.len(),
                a.sessions
            ),
            n,
            lags,
            time,
            m,
        )
    })) {
        let s = Samples::from_us(lags);
        t.row([
            name,
            n.to_string(),
            ms(time.as_micros() as u64),
            format!("{:.0}", n as f64 / time.as_secs_f64().max(1e-9)),
            ms(s.pct(50.0)),
            ms(s.pct(99.0)),
            ms(s.pct(100.0)),
            format!("{} / {}", ms(m.lag_p50_us), ms(m.lag_p99_us)),
        ]);
    }
    println!("### Ledger writer under a burst\n");
    println!("{}", t.render());
    let m = store.metrics();
    println!(
        "Writer: {} events in {} transactions, {} refused, {} transcript errors, {} shed.\n",
        m.events, m.batches, m.rejected, m.transcript_errors, m.shed
    );

    // --- Live steps: one step at a time (as a single agent's session), the
    // writer's time per step as the session grows, with the steps in one
    // long turn (an agent's tool loop) or in turns of 20 steps.
    let mut t = Table::new([
        "steps (one at a time, settled)",
        "turn layout",
        "per step, first 50",
        "per step, last 50",
        "newest turn at the end (rows)",
    ]);
    for (layout, every) in [("one long turn", 0usize), ("a new turn every 20 steps", 20)] {
        let id = format!("bench-live-{every}");
        store.submit(Event::Session(meta(&id)))?;
        store.submit(Event::Rows {
            session: id.clone(),
            rows: base_rows.clone(),
        })?;
        store.settle_blocking()?;
        let mut conv = base.clone();
        let mut seq = base_rows.len() as u64 + 1;
        let mut turn = base_rows.last().map_or(1, |r| r.turn);
        let mut turn_rows = base_rows.iter().filter(|r| r.turn == turn).count();
        let mut times = Vec::new();
        for st in 0..a.live_steps {
            conv.step();
            let body = conv.body();
            let v: serde_json::Value = serde_json::from_slice(&body)?;
            let msgs = v["messages"].as_array().context("messages")?;
            let asst = serde_json::to_string(&msgs[msgs.len() - 2])?;
            let new_turn = every > 0 && (st + 1) % every == 0;
            let (user, kind) = if new_turn {
                (
                    serde_json::json!({"role": "user", "content": format!("next task {st}")})
                        .to_string(),
                    RowKind::Prompt,
                )
            } else {
                (
                    serde_json::to_string(&msgs[msgs.len() - 1])?,
                    RowKind::ToolResult,
                )
            };
            let mk = |seq: u64, role: &str, kind, raw: &str, turn| Row {
                seq,
                role: role.into(),
                kind,
                raw: raw.into(),
                tokens: (raw.len() / 4) as u32,
                turn,
                step: st as u32 + 2,
                branch: 0,
                from_response: false,
            };
            let r1 = mk(seq, "assistant", RowKind::Assistant, &asst, turn);
            if new_turn {
                turn += 1;
                turn_rows = 0;
            }
            let r2 = mk(seq + 1, "user", kind, &user, turn);
            turn_rows += if new_turn { 1 } else { 2 };
            seq += 2;
            let mut m = meta(&id);
            m.last_ms += st as i64 + 1;
            let t0 = Instant::now();
            store.submit(Event::Session(m))?;
            store.submit(Event::Rows {
                session: id.clone(),
                rows: vec![r1, r2],
            })?;
            store.submit(Event::Step {
                session: id.clone(),
                step: st as u32 + 2,
                model: "claude-sonnet-4-5".into(),
                status: 200,
                usage: Usage::default(),
                window_rows: 100,
                ts_ms: 1_790_000_000_000 + st as i64,
                error: None,
                detail: Default::default(),
            })?;
            store.settle_blocking()?;
            times.push(t0.elapsed().as_micros() as u64);
        }
        let k = times.len().min(50);
        let first = Samples::from_us(times[..k].to_vec());
        let last = Samples::from_us(times[times.len() - k..].to_vec());
        t.row([
            format!("{} steps after {} rows", a.live_steps, base_rows.len()),
            layout.to_string(),
            format!("{} (p50)", ms(first.pct(50.0))),
            format!("{} (p50)", ms(last.pct(50.0))),
            turn_rows.to_string(),
        ]);
    }
    println!("### Ledger writer, one step at a time\n");
    println!("{}", t.render());

    // --- Export of a large session.
    let big = Conv::new(
        &Spec {
            messages: a.export_rows,
            bytes: a.export_rows * 1_000,
            turn_len: 40,
            model: "claude-sonnet-4-5".into(),
        },
        "export",
    );
    let rows = rows_of(&big)?;
    let id = "bench-export";
    store.submit(Event::Session(meta(id)))?;
    let t_rec = Instant::now();
    for chunk in rows.chunks(500) {
        store.submit(Event::Rows {
            session: id.into(),
            rows: chunk.to_vec(),
        })?;
    }
    for step in 1..=(rows.len() as u32 / 2) {
        store.submit(Event::Step {
            session: id.into(),
            step,
            model: "claude-sonnet-4-5".into(),
            status: 200,
            usage: Usage {
                input: 3,
                output: 300,
                cache_read: 40_000,
                cache_write: 500,
            },
            window_rows: 100,
            ts_ms: 1_790_000_000_000 + step as i64,
            error: None,
            detail: Default::default(),
        })?;
    }
    store.settle_blocking()?;
    let record_time = t_rec.elapsed();
    let pricer = |model: &str| oceancode_config::price(model, &cfg);
    let n_turns = rows.iter().map(|r| r.turn).max().unwrap_or(0);
    let mut md = Vec::new();
    let mut atif = Vec::new();
    let mut load = Vec::new();
    let mut md_bytes = 0;
    let mut atif_bytes = 0;
    let mut render_bytes = 0;
    for _ in 0..a.repeat.max(1) {
        let t = Instant::now();
        let mut out = Vec::new();
        oceancode_ledger::export::markdown(&*store, id, &pricer, &mut out, None)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        md.push(t.elapsed());
        md_bytes = out.len();
        let t = Instant::now();
        let mut out = Vec::new();
        oceancode_ledger::atif::write(&*store, id, &pricer, &mut out)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        atif.push(t.elapsed());
        atif_bytes = out.len();
        let t = Instant::now();
        let loaded = store.load_session(id)?.context("session")?;
        let mut by_turn: std::collections::BTreeMap<u32, Vec<Row>> = Default::default();
        for r in loaded.rows {
            by_turn.entry(r.turn).or_default().push(r);
        }
        let mut bytes = 0;
        for (turn, rows) in &by_turn {
            bytes += transcript::render_turn(Dialect::Anthropic, *turn, rows).len();
        }
        load.push(t.elapsed());
        render_bytes = bytes;
    }
    println!(
        "### Export of a {}-row session ({} turns, {:.1} MB of rows; recorded in {})\n",
        rows.len(),
        n_turns,
        big.len() as f64 / 1e6,
        ms(record_time.as_micros() as u64)
    );
    let mut t = Table::new(["operation", "median time", "output"]);
    t.row([
        "export --md (`export::markdown`, settle included)".to_string(),
        ms(median(md).as_micros() as u64),
        format!("{:.1} MB", md_bytes as f64 / 1e6),
    ]);
    t.row([
        "export --atif (`atif::write`, settle included)".to_string(),
        ms(median(atif).as_micros() as u64),
        format!("{:.1} MB", atif_bytes as f64 / 1e6),
    ]);
    t.row([
        "`Store::load_session` + `transcript::render_turn` of every turn".to_string(),
        ms(median(load).as_micros() as u64),
        format!("{:.1} MB", render_bytes as f64 / 1e6),
    ]);
    println!("{}", t.render());
    store.shutdown()?;
    Ok(())
}
