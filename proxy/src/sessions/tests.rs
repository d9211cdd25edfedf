//! The manager against a recording event sink: what each step hands the
//! ledger, and that a ticket finishes exactly once.

use super::*;
use crate::dialect::Collected;
use crate::identity::{Identity, ReqKind};
use bytes::Bytes;
use oceancode_ledger::{Dialect, Usage};

type Recorded = Arc<Mutex<Vec<Event>>>;

fn manager() -> (SessionManager, Recorded) {
    let seen: Recorded = Arc::default();
    let s = seen.clone();
    let settings = Settings {
        data_dir: std::env::temp_dir().join("oceancode-unit"),
        line: LineSpec::Percent(40.0),
        block: BlockSpec::PercentOfLine(70.0),
        models: Arc::new(|_: &str, _: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(8_000),
        }),
        tideline_enabled: true,
    };
    let m = SessionManager::new(settings, Arc::new(move |ev| s.lock().extend(ev)));
    (m, seen)
}

fn ident(name: &str) -> Identity {
    Identity {
        client_key: Some(format!("name:{name}")),
        client: "unknown",
        context_1m: false,
    }
}

fn body(messages: &[&str]) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"claude-x","max_tokens":100,"messages":[{}]}}"#,
        messages.join(",")
    ))
}

const HELLO: &str = r#"{"role":"user","content":"hello"}"#;
const ANSWER: &str = r#"{"role":"assistant","content":[{"type":"text","text":"hi"}]}"#;

fn take(seen: &Recorded) -> Vec<Event> {
    std::mem::take(&mut *seen.lock())
}

fn steps(events: &[Event]) -> Vec<(u32, u16, Usage)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Step {
                step,
                status,
                usage,
                ..
            } => Some((*step, *status, *usage)),
            _ => None,
        })
        .collect()
}

fn row_seqs(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Rows { rows, .. } => Some(rows.iter().map(|r| r.seq)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn answer(usage: Usage) -> Collected {
    Collected {
        usage: Some(usage),
        model: Some("claude-x".into()),
        rows: vec![ANSWER.to_string()],
        terminal: true,
        ..Collected::default()
    }
}

const USAGE: Usage = Usage {
    input: 10,
    output: 5,
    cache_read: 0,
    cache_write: 0,
};

#[test]
fn a_request_records_its_rows_and_its_answer_one_step() {
    let (m, seen) = manager();
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &ident("a"),
        body(&[HELLO]),
    );
    let events = take(&seen);
    assert!(matches!(events[0], Event::Session(_)));
    assert_eq!(row_seqs(&events), vec![1]);
    assert!(steps(&events).is_empty(), "no step before the answer");
    let t = p.ticket.expect("a main request has a ticket");
    t.complete(200, true, &answer(USAGE));
    let events = take(&seen);
    assert_eq!(row_seqs(&events), vec![2], "the answer's row");
    assert_eq!(steps(&events), vec![(1, 200, USAGE)]);
    // The next request echoes the answer: confirmed, not a new row.
    let next = r#"{"role":"user","content":"more"}"#;
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &ident("a"),
        body(&[HELLO, ANSWER, next]),
    );
    let events = take(&seen);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Confirm { seq: 2, .. })));
    assert_eq!(row_seqs(&events), vec![3]);
    drop(p);
}

#[test]
fn a_ticket_dropped_unfinished_records_a_failed_step_once() {
    let (m, seen) = manager();
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &ident("d"),
        body(&[HELLO]),
    );
    take(&seen);
    drop(p);
    let events = take(&seen);
    assert_eq!(
        steps(&events),
        vec![(1, step::CLIENT_CLOSED, Usage::default())]
    );
    assert!(row_seqs(&events).is_empty(), "no answer rows");
    let s = m.latest().expect("session");
    assert!(s.state.lock().pending.is_empty());
}

#[test]
fn a_failed_ticket_records_one_step_and_no_answer() {
    let (m, seen) = manager();
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &ident("f"),
        body(&[HELLO]),
    );
    take(&seen);
    p.ticket.expect("ticket").fail(502, StepError::Unreachable);
    let events = take(&seen);
    assert_eq!(steps(&events), vec![(1, 502, Usage::default())]);
    assert_eq!(events.len(), 1, "the fail, and nothing on drop: {events:?}");
}

#[test]
fn an_error_answer_records_the_step_without_rows() {
    let (m, seen) = manager();
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &ident("e"),
        body(&[HELLO]),
    );
    take(&seen);
    // A stream that broke off: usage seen so far, rows not taken.
    p.ticket
        .expect("ticket")
        .complete(200, false, &answer(USAGE));
    let events = take(&seen);
    assert!(row_seqs(&events).is_empty());
    assert_eq!(steps(&events), vec![(1, 200, USAGE)]);
}

#[test]
fn side_and_count_requests_record_nothing() {
    let (m, seen) = manager();
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Side,
        &ident("s"),
        body(&[HELLO]),
    );
    assert!(p.ticket.is_none());
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::CountTokens,
        &ident("s"),
        body(&[HELLO]),
    );
    assert!(p.ticket.is_none());
    assert!(take(&seen).is_empty());
}

#[test]
fn a_slow_restore_holds_up_no_other_client() {
    use std::sync::mpsc;
    use std::time::Duration;
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(gate_rx);
    let entered = Mutex::new(entered_tx);
    // The restorer of `slow` blocks as a ledger behind a busy writer would.
    let restorer: Restorer = Arc::new(move |key: &str| {
        if key == "name:slow" {
            let _ = entered.lock().send(());
            let _ = gate.lock().recv_timeout(Duration::from_secs(20));
        }
        Ok(Vec::new())
    });
    let m = Arc::new(manager().0.with_restorer(restorer));
    let slow = {
        let m = m.clone();
        std::thread::spawn(move || {
            m.prepare(
                Dialect::Anthropic,
                ReqKind::Main,
                &ident("slow"),
                body(&[HELLO]),
            )
            .ticket
            .is_some()
        })
    };
    entered_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the slow restore started");
    let (done_tx, done_rx) = mpsc::channel::<bool>();
    let fast = {
        let m = m.clone();
        std::thread::spawn(move || {
            let p = m.prepare(
                Dialect::Anthropic,
                ReqKind::Main,
                &ident("fast"),
                body(&[HELLO]),
            );
            let _ = done_tx.send(p.ticket.is_some());
        })
    };
    // Another client's request goes through while the restore is blocked.
    let fast_done = done_rx.recv_timeout(Duration::from_secs(5));
    gate_tx.send(()).expect("release the restore");
    assert!(slow.join().expect("slow thread"));
    fast.join().expect("fast thread");
    assert_eq!(
        fast_done,
        Ok(true),
        "the fast client waited for the slow restore"
    );
    assert_eq!(m.sessions().len(), 2);
}

#[test]
fn a_failing_restore_still_records_the_request() {
    let (m, seen) = manager();
    let m = m.with_restorer(Arc::new(|_: &str| Err("database is locked".into())));
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &ident("r"),
        body(&[HELLO]),
    );
    assert!(p.ticket.is_some());
    assert_eq!(row_seqs(&take(&seen)), vec![1]);
}
