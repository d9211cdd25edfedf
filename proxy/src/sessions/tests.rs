//! The manager against a recording event sink: what each step hands the
//! ledger, and that a ticket finishes exactly once.

use super::*;
use crate::dialect::Collected;
use crate::identity::{Identity, ReqKind};
use bytes::Bytes;
use oceancode_window::{Dialect, SessionMeta, Usage};
use std::sync::atomic::Ordering;

type Recorded = Arc<Mutex<Vec<Event>>>;

fn manager() -> (SessionManager, Recorded) {
    let seen: Recorded = Arc::default();
    let s = seen.clone();
    let settings = Settings::for_tests(std::env::temp_dir().join("oceancode-unit"));
    let m = SessionManager::new(settings, Arc::new(move |ev| s.lock().extend(ev)));
    (m, seen)
}

fn ident(name: &str) -> Identity {
    Identity {
        client_key: Some(format!("name:{name}")),
        client: "unknown",
        context_1m: false,
        model: None,
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

fn errors(events: &[Event]) -> Vec<Option<String>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Step { error, .. } => Some(error.clone()),
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
    assert!(take(&seen).is_empty(), "held until the upstream's status");
    let mut t = p.ticket.expect("a main request has a ticket");
    t.answered(200);
    let events = take(&seen);
    assert!(matches!(events[0], Event::Session(_)));
    assert_eq!(row_seqs(&events), vec![1]);
    assert!(steps(&events).is_empty(), "no step before the answer");
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
    let mut t = p.ticket.expect("ticket");
    t.answered(200);
    let events = take(&seen);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Confirm { seq: 2, .. })));
    assert_eq!(row_seqs(&events), vec![3]);
    drop(t);
}

/// Claude Code folds a prompt typed after an interrupted tool call into the
/// message that answers the call: that row starts the next turn.
#[test]
fn a_prompt_typed_after_an_interrupted_call_starts_a_turn() {
    let (m, seen) = manager();
    let call = r#"{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"sleep 100"}}]}"#;
    let typed = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"The user doesn't want to proceed with this tool use.","is_error":true},{"type":"text","text":"[Request interrupted by user for tool use]"},{"type":"text","text":"run the quick tests instead"}]}"#;
    let plain = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"ok"},{"type":"text","text":"<system-reminder>x</system-reminder>"}]}"#;
    let call2 = r#"{"role":"assistant","content":[{"type":"tool_use","id":"t2","name":"Bash","input":{"command":"make"}}]}"#;
    let mut t = send(&m, &ident("i"), &[HELLO, call, typed, call2, plain]);
    t.answered(200);
    let turns: Vec<(u64, u32)> = take(&seen)
        .iter()
        .filter_map(|e| match e {
            Event::Rows { rows, .. } => Some(rows.iter().map(|r| (r.seq, r.turn))),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(turns, vec![(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]);
    drop(t);
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
    assert!(take(&seen).is_empty());
    drop(p);
    let events = take(&seen);
    assert_eq!(
        steps(&events),
        vec![(1, step::CLIENT_CLOSED, Usage::default())]
    );
    assert_eq!(errors(&events), vec![Some("cancelled".to_string())]);
    assert_eq!(row_seqs(&events), vec![1], "the request's rows, no answer");
    let s = m.latest().expect("session");
    assert!(s.state.lock().answers.is_empty());
    assert!(
        s.state.lock().open.is_empty(),
        "the step is no longer in flight"
    );
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
    p.ticket.expect("ticket").fail(502, StepError::Unreachable);
    let events = take(&seen);
    assert_eq!(row_seqs(&events), vec![1], "the request's own rows");
    assert_eq!(steps(&events), vec![(1, 502, Usage::default())]);
    assert_eq!(
        errors(&events),
        vec![Some("upstream_unreachable".to_string())],
        "one step, with why: {events:?}"
    );
    assert!(take(&seen).is_empty(), "nothing on drop");
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
    let mut t = p.ticket.expect("ticket");
    t.answered(200);
    take(&seen);
    // A stream that broke off: usage seen so far, rows not taken.
    t.complete(200, false, &answer(USAGE));
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
    p.ticket.expect("ticket").answered(200);
    assert_eq!(row_seqs(&take(&seen)), vec![1]);
}

/// A client that names no session: keyed by the fingerprint of its opening.
fn headerless() -> Identity {
    Identity {
        client_key: None,
        client: "unknown",
        context_1m: false,
        model: None,
    }
}

fn manager_live(window: std::time::Duration) -> (SessionManager, Recorded) {
    let (m, seen) = manager();
    let mut settings = m.settings().clone();
    settings.live_window = window;
    let s = seen.clone();
    let m = SessionManager::new(settings, Arc::new(move |ev| s.lock().extend(ev)));
    (m, seen)
}

fn text_answer(text: &str) -> Collected {
    Collected {
        rows: vec![format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"{text}"}}]}}"#
        )],
        ..answer(USAGE)
    }
}

fn user(text: &str) -> String {
    format!(r#"{{"role":"user","content":"{text}"}}"#)
}

/// The client's echo of an answer: other bytes (a string content) than the
/// proxy's reassembly.
fn echo(text: &str) -> String {
    format!(r#"{{"role":"assistant","content":"{text}"}}"#)
}

fn send(m: &SessionManager, id: &Identity, msgs: &[&str]) -> Ticket {
    m.prepare(Dialect::Anthropic, ReqKind::Main, id, body(msgs))
        .ticket
        .expect("a main request has a ticket")
}

fn sessions_created(events: &[Event]) -> Vec<SessionMeta> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Session(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn branches(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Branch { .. }))
        .count()
}

#[test]
fn two_agents_with_the_same_first_request_part_when_both_continue_it() {
    let (m, seen) = manager();
    let id = headerless();
    // Both send the opening; both answers hang off it.
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("A1"));
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("B1"));
    let first = take(&seen);
    assert_eq!(
        row_seqs(&first),
        vec![1, 2, 3],
        "the opening once, both answers"
    );
    // A continues with its answer: confirmed, the line grows.
    let (a1, a2) = (echo("A1"), user("A2"));
    send(&m, &id, &[HELLO, &a1, &a2]).complete(200, true, &text_answer("A3"));
    let events = take(&seen);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Confirm { seq: 2, .. })));
    assert_eq!(row_seqs(&events), vec![4, 5]);
    // B continues with its own answer: another conversation, a sibling
    // linked after the opening; its answer leaves the first session.
    let (b1, b2) = (echo("B1"), user("B2"));
    send(&m, &id, &[HELLO, &b1, &b2]);
    let events = take(&seen);
    assert_eq!(branches(&events), 0, "no branch: {events:?}");
    let first_id = m
        .sessions()
        .into_iter()
        .find(|s| s.state.lock().meta.parent.is_none())
        .expect("the first session")
        .id
        .clone();
    assert!(events.iter().any(|e| matches!(e,
        Event::Hide { session, seqs } if *session == first_id && *seqs == [3])));
    let created = sessions_created(&events);
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].parent.as_deref(), Some(first_id.as_str()));
    assert_eq!(created[0].parent_seq, Some(1));
    assert_eq!(row_seqs(&events), vec![1, 2, 3], "the sibling's own rows");
    assert_eq!(m.sessions().len(), 2);
    // Each goes on in its own session, without a branch or a copy.
    let (a3, a4) = (echo("A3"), user("A4"));
    send(&m, &id, &[HELLO, &a1, &a2, &a3, &a4]);
    let events = take(&seen);
    assert_eq!(branches(&events), 0);
    assert_eq!(row_seqs(&events), vec![6], "A's next ask only");
    assert!(sessions_created(&events).is_empty());
    // A line set on the first session is not forced on its sibling (another
    // conversation), as it is on a sub-agent.
    m.set_override(Some(&first_id), Some(LineSpec::Tokens(30_000)))
        .expect("override");
    let sibling = created[0].id.as_str();
    let sibling = m.get(sibling).expect("the sibling is live");
    assert_eq!(sibling.state.lock().override_line(), None);
}

#[test]
fn leaving_a_line_with_a_step_in_flight_is_a_sibling_and_a_quiet_one_a_branch() {
    // No time window: only a step in flight makes a line live.
    let (m, seen) = manager_live(std::time::Duration::ZERO);
    let id = headerless();
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("one"));
    let (one, two) = (echo("one"), user("two"));
    let in_flight = send(&m, &id, &[HELLO, &one, &two]);
    take(&seen);
    let other = user("another two");
    send(&m, &id, &[HELLO, &one, &other]).complete(200, true, &text_answer("x"));
    let events = take(&seen);
    assert_eq!(branches(&events), 0);
    let created = sessions_created(&events);
    assert_eq!(created.len(), 1, "a sibling: {events:?}");
    assert_eq!(created[0].parent_seq, Some(2), "after the shared answer");
    in_flight.complete(200, true, &text_answer("three"));
    take(&seen);
    // Now the first line is quiet: leaving it is a rewind.
    let edited = user("two, edited");
    send(&m, &id, &[HELLO, &one, &edited]);
    let events = take(&seen);
    assert_eq!(branches(&events), 1, "{events:?}");
    assert!(sessions_created(&events).is_empty());
}

#[test]
fn a_named_session_is_one_conversation_leaving_its_line_is_a_rewind() {
    let (m, seen) = manager();
    let id = ident("named");
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("one"));
    let (one, two) = (echo("one"), user("two"));
    let _in_flight = send(&m, &id, &[HELLO, &one, &two]);
    take(&seen);
    let other = user("another two");
    send(&m, &id, &[HELLO, &one, &other]);
    let events = take(&seen);
    assert_eq!(branches(&events), 1);
    assert!(sessions_created(&events).is_empty());
    assert_eq!(m.sessions().len(), 1);
}

#[test]
fn a_retried_request_is_no_sibling_and_its_client_continues_either_answer() {
    let (m, seen) = manager();
    let id = headerless();
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("first try"));
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("second try"));
    take(&seen);
    // The client kept the second answer (its first attempt timed out).
    let (got, next) = (echo("second try"), user("next"));
    send(&m, &id, &[HELLO, &got, &next]);
    let events = take(&seen);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Confirm { seq: 3, .. })));
    assert_eq!(row_seqs(&events), vec![4]);
    assert_eq!(m.sessions().len(), 1);
    assert_eq!(branches(&events), 0);
}

fn lines(events: &[Event]) -> Vec<(u64, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Line { line, spec, .. } => Some((*line, spec.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn the_line_in_force_is_recorded_when_it_changes() {
    let (m, seen) = manager();
    let next = r#"{"role":"user","content":"more"}"#;
    let send = |msgs: &[&str]| {
        let p = m.prepare(Dialect::Anthropic, ReqKind::Main, &ident("l"), body(msgs));
        p.ticket
            .expect("ticket")
            .complete(200, true, &answer(USAGE));
        take(&seen)
    };
    // The configured 40% of the 200k context.
    assert_eq!(lines(&send(&[HELLO])), vec![(80_000, "40%".to_string())]);
    assert!(lines(&send(&[HELLO, ANSWER, next])).is_empty(), "unchanged");
    let id = m.latest().expect("session").id.clone();
    m.set_override(Some(&id), Some(LineSpec::Tokens(30_000)))
        .expect("override");
    assert!(
        take(&seen).is_empty(),
        "an override applies from the next request"
    );
    let third = r#"{"role":"user","content":"again"}"#;
    assert_eq!(
        lines(&send(&[HELLO, ANSWER, next, ANSWER, third])),
        vec![(30_000, "30k".to_string())]
    );
}

/// Found by the window fuzz target: after a rewind to a new first message
/// (a branch of the same session), `tideline now` answered with the seq of
/// the abandoned line's cut although the next window left nothing out.
#[test]
fn tideline_now_after_a_rewind_reports_only_what_the_active_line_loses() {
    let (m, _seen) = manager();
    let who = ident("rewind");
    let a1 = r#"{"role":"user","content":"first ask"}"#;
    let a2 = r#"{"role":"user","content":"second ask"}"#;
    let p = m.prepare(Dialect::Anthropic, ReqKind::Main, &who, body(&[a1]));
    let t = p.ticket.expect("a ticket");
    let id = t.session.id.clone();
    t.complete(200, true, &answer(USAGE));
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &who,
        body(&[a1, ANSWER, a2]),
    );
    p.ticket
        .expect("a ticket")
        .complete(200, true, &answer(USAGE));
    let upto = m.cut_now(&id).expect("the first turn can be cut");
    assert!(upto > 0);
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &who,
        body(&[a1, ANSWER, a2]),
    );
    assert!(String::from_utf8_lossy(&p.body).contains("past the tideline"));
    let t = p.ticket.expect("a ticket");
    t.complete(200, true, &answer(USAGE));
    // The client goes back before its first ask and asks something else.
    let b1 = r#"{"role":"user","content":"another first ask"}"#;
    let p = m.prepare(Dialect::Anthropic, ReqKind::Main, &who, body(&[b1]));
    let t = p.ticket.expect("a ticket");
    assert_eq!(t.session.id, id, "a branch of the same session");
    t.complete(200, true, &answer(USAGE));
    let said = m.cut_now(&id);
    let p = m.prepare(
        Dialect::Anthropic,
        ReqKind::Main,
        &who,
        body(&[b1, ANSWER, a2]),
    );
    let stub = String::from_utf8_lossy(&p.body).contains("past the tideline");
    match said {
        Ok(upto) => assert!(stub, "tideline now said rows up to {upto} leave, none did"),
        Err(_) => assert!(!stub),
    }
}

#[test]
fn a_failed_step_records_why_and_the_meter_shows_it() {
    let (m, seen) = manager();
    let id = ident("why");
    send(&m, &id, &[HELLO]).fail(504, StepError::Timeout);
    send(&m, &id, &[HELLO]).complete(500, true, &Collected::default());
    send(&m, &id, &[HELLO]).complete(200, false, &answer(USAGE));
    let cancelled = send(&m, &id, &[HELLO]);
    cancelled.cut_short(200, StepError::Cancelled, &Collected::default());
    send(&m, &id, &[HELLO]).complete(200, true, &answer(USAGE));
    let events = take(&seen);
    let kinds: Vec<Option<&str>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Step { error, .. } => Some(error.as_deref()),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            Some("upstream_timeout"),
            Some("upstream_error"),
            Some("stream_error"),
            Some("cancelled"),
            None
        ]
    );
    assert_eq!(m.metrics.failed_steps.load(Ordering::Relaxed), 4);
    let s = m.latest().expect("session");
    let meter = s.state.lock().meter;
    assert_eq!(meter.failed_steps, 4);
    let last = meter.last_error.expect("the latest failure");
    assert_eq!(
        (last.step, last.status, last.error),
        (4, 200, StepError::Cancelled)
    );
}

#[test]
fn a_request_the_upstream_refuses_leaves_no_trace() {
    let (m, seen) = manager();
    let id = ident("refused");
    // A new session: nothing recorded, nothing left in memory.
    for status in [401, 403] {
        let mut t = send(&m, &id, &[HELLO]);
        t.answered(status);
        t.complete(status, true, &Collected::default());
        assert!(take(&seen).is_empty(), "{status}: nothing recorded");
        assert!(m.sessions().is_empty(), "{status}: no session left");
        assert!(m.latest().is_none());
    }
    assert_eq!(m.metrics.refused.load(Ordering::Relaxed), 2);
    assert_eq!(m.metrics.rows.load(Ordering::Relaxed), 0);
    // An existing session: a refused step changes nothing of it.
    let mut t = send(&m, &id, &[HELLO]);
    t.answered(200);
    t.complete(200, true, &answer(USAGE));
    take(&seen);
    let before = m.latest().expect("session").state.lock().meter;
    let evil = user("evil");
    let mut t = send(&m, &id, &[HELLO, ANSWER, &evil]);
    t.answered(401);
    drop(t);
    assert!(take(&seen).is_empty(), "nothing of the refused request");
    let s = m.latest().expect("session");
    assert_eq!(s.state.lock().meter.steps, before.steps);
    assert_eq!(
        s.state.lock().active,
        vec![1],
        "the answer is unechoed again"
    );
    // The next request is matched as if the refused one never came: the
    // answer is confirmed, its ask is row 3 of step 2.
    let more = user("more");
    let mut t = send(&m, &id, &[HELLO, ANSWER, &more]);
    t.answered(200);
    t.complete(200, true, &answer(USAGE));
    let events = take(&seen);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Confirm { seq: 2, .. })));
    assert_eq!(row_seqs(&events), vec![3, 4]);
    assert_eq!(steps(&events), vec![(2, 200, USAGE)]);
    assert_eq!(m.sessions().len(), 1);
}

#[test]
fn a_refused_request_another_built_on_is_recorded_as_a_failed_step() {
    let (m, seen) = manager();
    let id = ident("raced");
    let mut first = send(&m, &id, &[HELLO]);
    // A second request on the session before the first's answer: it
    // builds on the first's rows, which go to the writer first.
    let more = user("more");
    let mut second = send(&m, &id, &[HELLO, &more]);
    assert_eq!(row_seqs(&take(&seen)), vec![1]);
    first.answered(401);
    first.complete(401, true, &Collected::default());
    let events = take(&seen);
    assert_eq!(steps(&events), vec![(1, 401, Usage::default())]);
    assert_eq!(errors(&events), vec![Some("upstream_error".to_string())]);
    // The second is the session's latest: refused, it is rolled back.
    second.answered(403);
    drop(second);
    assert!(take(&seen).is_empty());
    assert_eq!(m.sessions().len(), 1, "the session has rows: it stays");
    let again = user("again");
    let mut t = send(&m, &id, &[HELLO, &again]);
    t.answered(200);
    assert_eq!(
        row_seqs(&take(&seen)),
        vec![2],
        "as if the second never came"
    );
}

#[test]
fn events_held_for_one_request_reach_the_writer_before_a_later_steps() {
    let (m, seen) = manager();
    let id = ident("order");
    let mut one = send(&m, &id, &[HELLO]);
    one.answered(200);
    take(&seen);
    // Step 2 is prepared (its rows held) while step 1 is still answering.
    let more = user("more");
    let two = send(&m, &id, &[HELLO, &more]);
    one.complete(200, true, &answer(USAGE));
    let events = take(&seen);
    assert_eq!(
        row_seqs(&events),
        vec![2, 3],
        "step 2's ask, then step 1's answer"
    );
    drop(two);
}

#[test]
fn a_refused_sibling_leaves_its_parent_as_it_was() {
    let (m, seen) = manager_live(std::time::Duration::from_secs(300));
    let id = headerless();
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("A1"));
    send(&m, &id, &[HELLO]).complete(200, true, &text_answer("B1"));
    let (a1, a2) = (echo("A1"), user("A2"));
    send(&m, &id, &[HELLO, &a1, &a2]).complete(200, true, &text_answer("A3"));
    take(&seen);
    // B's continuation would be a sibling; refused, it leaves nothing.
    let (b1, b2) = (echo("B1"), user("B2"));
    let mut t = send(&m, &id, &[HELLO, &b1, &b2]);
    t.answered(401);
    drop(t);
    assert!(take(&seen).is_empty(), "no hide, no sibling");
    assert_eq!(m.sessions().len(), 1);
    assert_eq!(m.metrics.siblings.load(Ordering::Relaxed), 0);
    // Sent again and answered, it is the sibling it would have been.
    let mut t = send(&m, &id, &[HELLO, &b1, &b2]);
    t.answered(200);
    let events = take(&seen);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Hide { seqs, .. } if *seqs == [3])));
    assert_eq!(sessions_created(&events).len(), 1);
    assert_eq!(m.sessions().len(), 2);
}

/// A manager with `ledger.compress` on: no zone, every output pruned.
fn manager_compress() -> (SessionManager, Recorded) {
    manager_compress_with(None)
}

/// [`manager_compress`] with masking first (`ledger.compress.free`).
fn manager_compress_with(free: Option<BlockSpec>) -> (SessionManager, Recorded) {
    let (m, seen) = manager();
    let mut settings = m.settings().clone();
    settings.compress = oceancode_config::CompressConfig {
        enabled: true,
        protect: Some(BlockSpec::Tokens(0)),
        min_tokens: 1,
        free,
    };
    let s = seen.clone();
    (
        SessionManager::new(settings, Arc::new(move |ev| s.lock().extend(ev))),
        seen,
    )
}

#[test]
fn compress_prunes_old_outputs_at_a_cut_only_and_keeps_them_until_the_next() {
    let (m, _seen) = manager_compress();
    let call = |i: usize| {
        format!(
            r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"t{i}","name":"Bash","input":{{"command":"ls {i}"}}}}]}}"#
        )
    };
    let result = |i: usize| {
        format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{i}","is_error":false,"content":"output {i} {}"}}]}}"#,
            "x".repeat(400)
        )
    };
    let mut history: Vec<String> = vec![HELLO.to_string()];
    let mut sent: Vec<String> = Vec::new();
    let mut id = None;
    for i in 0..16 {
        let refs: Vec<&str> = history.iter().map(String::as_str).collect();
        let p = m.prepare(Dialect::Anthropic, ReqKind::Main, &ident("c"), body(&refs));
        let out = String::from_utf8(p.body.to_vec()).unwrap();
        let t = p.ticket.unwrap();
        id = Some(t.session.id.clone());
        // The window grows by 12k a step (line 80k, block 56k): a cut
        // leaves the open block's rows in the window.
        let mut collected = answer(Usage {
            input: 12_000 * (i as u64 + 1),
            ..USAGE
        });
        collected.rows = vec![call(i)];
        t.complete(200, true, &collected);
        history.push(call(i));
        history.push(result(i));
        sent.push(out);
    }
    let pointers = |s: &str| s.matches("[pruned tool output: seq ").count();
    let stub = |s: &str| s.contains("past the tideline");
    let first = sent.iter().position(|s| stub(s)).expect("a cut");
    for (i, s) in sent.iter().enumerate().take(first) {
        assert_eq!(pointers(s), 0, "request {i}: nothing before the cut");
    }
    let at_cut = pointers(&sent[first]);
    assert!(at_cut > 0, "the cut prunes: {}", sent[first]);
    assert!(sent[first].contains(r#""is_error":false,"content":"[pruned tool output: seq "#));
    // The running round (the newest result) stays.
    let newest = format!("output {} xxx", first - 1);
    assert!(sent[first].contains(&newest), "{}", sent[first]);
    // Between cuts: the same pointers, and the request only appends.
    let mut cut_stub = sent[first].split("]\"").next().unwrap().to_string();
    let mut pruned = at_cut;
    for i in first + 1..sent.len() {
        let this_stub = sent[i].split("]\"").next().unwrap().to_string();
        if this_stub != cut_stub {
            // The next cut: a new set.
            cut_stub = this_stub;
            pruned = pointers(&sent[i]);
            continue;
        }
        assert_eq!(pointers(&sent[i]), pruned, "request {i}: only at a cut");
        let prev = sent[i - 1].trim_end_matches("]}");
        assert!(
            sent[i].starts_with(prev),
            "request {i} appends to {}",
            i - 1
        );
    }
    let st = m.get(id.as_deref().unwrap()).unwrap();
    let meter = st.state.lock().meter;
    assert_eq!(meter.pruned_outputs as usize, pruned);
    assert_eq!(meter.pruned_tokens > 0, pruned > 0);
    assert_eq!(meter.saved_tokens > 0, pruned > 0);
}

fn body_of(model: &str, messages: &[String]) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"{model}","max_tokens":100,"messages":[{}]}}"#,
        messages.join(",")
    ))
}

fn usage_in(input: u64) -> Usage {
    Usage {
        input: 100,
        output: 50,
        cache_read: input - 100,
        cache_write: 0,
    }
}

fn cuts(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Cut { upto_seq, .. } => Some(*upto_seq),
            _ => None,
        })
        .collect()
}

/// `t` answered with a text billed `read` and `write` cache tokens: the
/// cache note its step recorded.
fn cache_note_of(
    seen: &Recorded,
    mut t: Ticket,
    read: u64,
    write: u64,
) -> oceancode_window::cache::CacheNote {
    t.answered(200);
    let usage = Usage {
        input: 100,
        output: 50,
        cache_read: read,
        cache_write: write,
    };
    t.complete(200, true, &text_answer("a1").with_usage(usage));
    cache_notes(&take(seen)).pop().expect("a cache note")
}

fn cache_notes(events: &[Event]) -> Vec<oceancode_window::cache::CacheNote> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Step { detail, .. } => detail.cache.clone(),
            _ => None,
        })
        .collect()
}

/// Line 80k, block 56k (40% of 200k, 70%): steps 1–4 grow the window to
/// 73k, a block closed (73k + 56k is past the line, a cut is due within
/// the next block) and nothing cut; `step5` prepares the fifth request.
/// Returns the fifth request's events once answered.
fn cold_scenario(
    step5: impl FnOnce(&SessionManager, &[String]) -> Ticket,
) -> (Vec<Event>, Vec<Event>) {
    cold_scenario_with(true, step5)
}

fn cold_scenario_with(
    cold_cut: bool,
    step5: impl FnOnce(&SessionManager, &[String]) -> Ticket,
) -> (Vec<Event>, Vec<Event>) {
    let (m, seen) = manager();
    let mut settings = m.settings.clone();
    settings.cold_cut = cold_cut;
    let sink = seen.clone();
    let m = SessionManager::new(settings, Arc::new(move |ev| sink.lock().extend(ev)));
    let id = ident("cold");
    let mut msgs = vec![user("t1")];
    let mut before = Vec::new();
    for (i, input) in [10_000, 70_000, 72_000, 73_000].into_iter().enumerate() {
        let mut t = m
            .prepare(
                Dialect::Anthropic,
                ReqKind::Main,
                &id,
                body_of("claude-x", &msgs),
            )
            .ticket
            .expect("ticket");
        t.answered(200);
        t.complete(
            200,
            true,
            &text_answer(&format!("a{i}")).with_usage(usage_in(input)),
        );
        msgs.push(echo(&format!("a{i}")));
        msgs.push(user(&format!("t{}", i + 2)));
        before.extend(take(&seen));
    }
    let mut t = step5(&m, &msgs);
    t.answered(200);
    // A cut window: the system prompt read, the rest written again.
    let cut = Usage {
        input: 100,
        output: 50,
        cache_read: 2_000,
        cache_write: 18_000,
    };
    t.complete(200, true, &text_answer("a5").with_usage(cut));
    (before, take(&seen))
}

trait WithUsage {
    fn with_usage(self, u: Usage) -> Self;
}

impl WithUsage for Collected {
    fn with_usage(mut self, u: Usage) -> Self {
        self.usage = Some(u);
        self
    }
}

#[test]
fn a_request_after_a_model_switch_takes_the_cut_due_within_the_next_block() {
    let (before, events) = cold_scenario(|m, msgs| {
        m.prepare(
            Dialect::Anthropic,
            ReqKind::Main,
            &ident("cold"),
            body_of("claude-y", msgs),
        )
        .ticket
        .expect("ticket")
    });
    assert!(cuts(&before).is_empty(), "nothing cut while warm");
    assert_eq!(cuts(&events).len(), 1, "the cold request cuts: {events:?}");
    let note = cache_notes(&events).pop().expect("a cache note");
    assert_eq!(note.cold, Some(oceancode_window::cache::Cold::ModelSwitch));
    assert!(note.free_cut);
}

#[test]
fn a_request_after_the_ttl_takes_the_cut_and_a_warm_one_does_not() {
    let run = |gap_ms: i64| {
        cold_scenario(|m, msgs| {
            for s in m.sessions() {
                let mut st = s.state.lock();
                if let Some((at, _)) = st.cache.previous.as_mut() {
                    *at -= gap_ms;
                }
            }
            send_model(m, msgs)
        })
        .1
    };
    let warm = run(60_000);
    assert!(cuts(&warm).is_empty(), "a minute later the cache is warm");
    let cold = run(6 * 60_000);
    assert_eq!(cuts(&cold).len(), 1, "six minutes later it is cold");
    let note = cache_notes(&cold).pop().expect("a cache note");
    assert_eq!(note.cold, Some(oceancode_window::cache::Cold::TtlExpired));
    // The cut rewrote the prefix: a miss, and its cause is the cut.
    assert_eq!(note.miss, Some(oceancode_window::cache::MissCause::Cut));
}

#[test]
fn cold_cut_off_waits_for_the_line() {
    let (_, events) = cold_scenario_with(false, |m, msgs| {
        m.prepare(
            Dialect::Anthropic,
            ReqKind::Main,
            &ident("cold"),
            body_of("claude-y", msgs),
        )
        .ticket
        .expect("ticket")
    });
    assert!(cuts(&events).is_empty(), "off: no cut under the line");
    let note = cache_notes(&events).pop().expect("a cache note");
    assert_eq!(note.cold, Some(oceancode_window::cache::Cold::ModelSwitch));
    assert!(!note.free_cut);
}

#[test]
fn a_cold_request_cuts_the_open_blocks_oldest_rows_down_to_a_due_cuts_level() {
    // Line 80k, block 56k: a due cut keeps 24k. The window grows by ~5k a
    // step and no block closes before the line, so before this a cold
    // request under the line cut nothing.
    let run = |switch_model: bool| {
        let (m, seen) = manager();
        let id = ident("cold-split");
        let big = |tag: &str| user(&format!("{tag} {}", "lorem ipsum ".repeat(1_700)));
        let mut msgs = vec![big("t1")];
        for i in 0..8u64 {
            let mut t = send_model_id(&m, &id, &msgs);
            t.answered(200);
            let answer = text_answer(&format!("a{i}")).with_usage(usage_in(10_000 + 5_000 * i));
            t.complete(200, true, &answer);
            msgs.push(echo(&format!("a{i}")));
            msgs.push(big(&format!("t{}", i + 2)));
        }
        assert!(cuts(&take(&seen)).is_empty(), "nothing cut while warm");
        let gauge = |m: &SessionManager| m.sessions()[0].state.lock().tideline.gauge();
        let before = gauge(&m);
        let model = if switch_model {
            "claude-y"
        } else {
            // Six minutes later: past the 5-minute TTL.
            age(&m, 6 * 60_000);
            "claude-x"
        };
        let mut t = send_as(&m, &id, model, &msgs);
        let after = gauge(&m);
        t.answered(200);
        t.complete(200, true, &text_answer("a9").with_usage(usage_in(26_000)));
        (before, after, msgs.len() as u64, take(&seen))
    };
    let (before, after, n, events) = run(false);
    let upto = cuts(&events);
    assert_eq!(upto.len(), 1, "the cold request cuts: {events:?}");
    assert!(
        upto[0] > 1 && upto[0] < n - 1,
        "the oldest rows, not the newest round: {upto:?}"
    );
    assert!(before > 38_000, "over a quarter block past 24k: {before}");
    assert!(
        (20_000..=26_000).contains(&after),
        "down to about what a due cut keeps: {before} → {after}"
    );
    let note = cache_notes(&events).pop().expect("a cache note");
    assert_eq!(note.cold, Some(oceancode_window::cache::Cold::TtlExpired));
    assert!(note.free_cut);
    // A switch to a model the session has not sent is as cold.
    let (_, after, _, events) = run(true);
    assert_eq!(cuts(&events).len(), 1, "the switch cuts: {events:?}");
    assert!((20_000..=26_000).contains(&after), "{after}");
    let note = cache_notes(&events).pop().expect("a cache note");
    assert_eq!(note.cold, Some(oceancode_window::cache::Cold::ModelSwitch));
    assert!(note.free_cut);
}

#[test]
fn a_switch_back_within_the_ttl_finds_that_models_cache_warm() {
    use oceancode_window::cache::Cold;
    let (m, seen) = manager();
    let id = ident("back");
    let mut msgs = vec![user("t1")];
    let mut step = |model: &str, age_ms: i64| {
        age(&m, age_ms);
        let mut t = send_as(&m, &id, model, &msgs);
        t.answered(200);
        t.complete(200, true, &text_answer("a").with_usage(usage_in(10_000)));
        let n = msgs.len();
        msgs.push(echo(&format!("a{n}")));
        msgs.push(user(&format!("t{n}")));
        cache_notes(&take(&seen)).pop().and_then(|n| n.cold)
    };
    assert_eq!(step("claude-x", 0), None, "a new session");
    assert_eq!(step("claude-y", 0), Some(Cold::ModelSwitch), "y never sent");
    assert_eq!(step("claude-x", 0), None, "x sent a moment ago");
    assert_eq!(step("claude-y", 0), None, "y too");
    assert_eq!(
        step("claude-x", 6 * 60_000),
        Some(Cold::ModelSwitch),
        "x last sent over 5 minutes ago"
    );
}

/// Move every session's prompt cache times `ms` into the past.
fn age(m: &SessionManager, ms: i64) {
    for s in m.sessions() {
        let mut st = s.state.lock();
        if let Some((at, _)) = st.cache.previous.as_mut() {
            *at -= ms;
        }
        for (_, at) in &mut st.cache.models {
            *at -= ms;
        }
    }
}

fn send_model(m: &SessionManager, msgs: &[String]) -> Ticket {
    send_model_id(m, &ident("cold"), msgs)
}

fn send_model_id(m: &SessionManager, id: &Identity, msgs: &[String]) -> Ticket {
    send_as(m, id, "claude-x", msgs)
}

/// Prepare `msgs` on `id` with `model`.
fn send_as(m: &SessionManager, id: &Identity, model: &str, msgs: &[String]) -> Ticket {
    m.prepare(Dialect::Anthropic, ReqKind::Main, id, body_of(model, msgs))
        .ticket
        .expect("ticket")
}

#[test]
fn a_miss_names_where_the_client_changed_its_request() {
    let (m, seen) = manager();
    let id = ident("miss");
    let tools = |t: &str| {
        Bytes::from(format!(
            r#"{{"model":"claude-x","max_tokens":100,"tools":[{{"name":"{t}","input_schema":{{}}}}],"messages":[{},{},{}]}}"#,
            user("t1"),
            echo("a0"),
            user("t2")
        ))
    };
    let mut t = send_model_id(&m, &id, &[user("t1")]);
    t.answered(200);
    t.complete(200, true, &text_answer("a0").with_usage(usage_in(30_000)));
    take(&seen);
    let t = m
        .prepare(Dialect::Anthropic, ReqKind::Main, &id, tools("edit"))
        .ticket
        .expect("ticket");
    // Only the system prompt was read: the rest was written again.
    let note = cache_note_of(&seen, t, 2_000, 29_000);
    assert_eq!(
        note.miss,
        Some(oceancode_window::cache::MissCause::ClientChanged)
    );
    assert_eq!(note.changed.as_deref(), Some("tools"));
    assert_eq!(note.miss_tokens, 28_000);
    let i = oceancode_window::cache::MissCause::ALL
        .iter()
        .position(|c| *c == oceancode_window::cache::MissCause::ClientChanged)
        .expect("a cause");
    assert_eq!(m.metrics.cache_misses[i].load(Ordering::Relaxed), 1);
}

/// A request the upstream refused (401/403) never reached its prompt
/// cache: the next request's miss is not blamed on the refused request's
/// model (or its tools, or its gap).
#[test]
fn a_refused_request_leaves_the_cache_facts_as_they_were() {
    let (m, seen) = manager();
    let id = ident("refused-cache");
    let mut t = send_model_id(&m, &id, &[user("t1")]);
    t.answered(200);
    t.complete(200, true, &text_answer("a0").with_usage(usage_in(30_000)));
    take(&seen);
    // Another model, refused: nothing of it reached the provider's cache.
    let mut t = m
        .prepare(
            Dialect::Anthropic,
            ReqKind::Main,
            &id,
            body_of("claude-y", &[user("t1"), echo("a0"), user("t2")]),
        )
        .ticket
        .expect("ticket");
    t.answered(401);
    t.complete(401, true, &Collected::default());
    assert!(take(&seen).is_empty(), "nothing of the refused request");
    // The same model as the first: its prefix was written again.
    let t = send_model_id(&m, &id, &[user("t1"), echo("a0"), user("t3")]);
    let note = cache_note_of(&seen, t, 0, 30_000);
    assert_ne!(
        note.miss,
        Some(oceancode_window::cache::MissCause::ModelSwitch),
        "the model the upstream refused never switched the cache"
    );
}

/// A manager under a spend cap of `cap` USD, pricing the models `priced`
/// takes at $3 / $15 per million input / output tokens.
fn budgeted(cap: f64, priced: fn(&str) -> bool) -> SessionManager {
    let (m, _seen) = manager();
    let price = oceancode_config::Price {
        input: 3.0,
        output: 15.0,
        cache_read: 0.3,
        cache_write: 3.75,
    };
    m.with_budget(
        SessionLimits {
            spend_usd: Some(cap),
            pricer: Some(Arc::new(move |model: &str| priced(model).then_some(price))),
            ..SessionLimits::default()
        },
        None,
    )
}

/// A Gemini body names no model; its path does. With the ledger off a
/// request under a spend bound is still priced by that model (an unpriced
/// reservation would let it past the bound).
#[test]
fn an_unrecorded_gemini_request_is_priced_by_the_model_its_path_names() {
    let m = budgeted(5.0, |model| model == "gemini-2.5-pro");
    let body = Bytes::from_static(br#"{"contents":[{"role":"user","parts":[{"text":"hello"}]}]}"#);
    let route = crate::identity::Route {
        prefix: None,
        model: Some("gemini-2.5-pro"),
    };
    let p = m
        .prepare_unrecorded(
            Dialect::Gemini,
            ReqKind::Main,
            route,
            &http::HeaderMap::new(),
            body,
            false,
        )
        .expect("prepared");
    let r = p.reservation.expect("a reservation under the spend bound");
    assert_eq!(r.model(), "gemini-2.5-pro");
}

/// A spend reservation prices the window a request will send, not the
/// client's whole body: after a cut, a long history the client resends
/// no longer reserves what it would cost uncut (which refused requests
/// the cap had room for, and a refusal stays).
#[test]
fn a_spend_reservation_prices_the_window_sent_after_a_cut() {
    let m = budgeted(0.5, |_| true);
    let who = ident("reserve");
    // 300 KB: 100k tokens by the estimate, $0.30 to send uncut.
    let big = user(&"x".repeat(300_000));
    // Each answer is billed $0.08.
    let billed = Usage {
        input: 26_667,
        ..Usage::default()
    };
    let step = |msgs: &[&str]| {
        let p = m.prepare(
            Dialect::Anthropic,
            ReqKind::Main,
            &who,
            body_of(
                "claude-x",
                &msgs.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ),
        );
        assert!(
            p.refused.is_none(),
            "refused at {} messages: {:?}",
            msgs.len(),
            p.refused
        );
        let len = p.body.len();
        let mut t = p.ticket.expect("a ticket");
        t.answered(200);
        t.complete(200, true, &answer(billed));
        len
    };
    let (a2, a3, a4) = (user("second"), user("third"), user("fourth"));
    step(&[&big]);
    step(&[&big, ANSWER, &a2]);
    let id = m.latest().expect("session").id.clone();
    m.cut_now(&id).expect("the first turn can be cut");
    let cut = step(&[&big, ANSWER, &a2, ANSWER, &a3]);
    assert!(cut < 100_000, "the big ask left the window ({cut} bytes)");
    // $0.24 spent: the whole body would reserve $0.30 more (past the
    // $0.50 cap); the window sent is a few KB.
    step(&[&big, ANSWER, &a2, ANSWER, &a3, ANSWER, &a4]);
}

/// Masking first (`ledger.compress.free`): when the window reaches the
/// line and masking alone brings it under `line − free`, the request masks
/// without a cut: no stub, pointers, a new window event whose cache miss
/// would be the pointers' (`edit`); the next request only appends, at the
/// same event.
#[test]
fn a_masking_only_event_is_a_window_event_and_the_next_request_appends() {
    let (m, _seen) = manager_compress_with(Some(BlockSpec::PercentOfLine(10.0)));
    let call = |i: usize| {
        format!(
            r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"t{i}","name":"Bash","input":{{"command":"ls {i}"}}}}]}}"#
        )
    };
    let result = |i: usize| {
        format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{i}","content":"output {i} {}"}}]}}"#,
            "x".repeat(40_000)
        )
    };
    let mut history: Vec<String> = vec![HELLO.to_string()];
    let mut sent: Vec<(String, u64, bool, bool)> = Vec::new();
    for i in 0..12 {
        let refs: Vec<&str> = history.iter().map(String::as_str).collect();
        let p = m.prepare(
            Dialect::Anthropic,
            ReqKind::Main,
            &ident("mask"),
            body(&refs),
        );
        let out = String::from_utf8(p.body.to_vec()).unwrap();
        let t = p.ticket.unwrap();
        sent.push((out.clone(), t.window_event, t.cache.cut, t.cache.edit));
        // Each output is ~10k tokens, and the usage is the body sent: the
        // ninth request is over the 80k line, and masking the outputs
        // before the newest brings it under 72k (`line − free`).
        let mut collected = answer(Usage {
            input: out.len() as u64 / 4,
            ..USAGE
        });
        collected.rows = vec![call(i)];
        t.complete(200, true, &collected);
        history.push(call(i));
        history.push(result(i));
    }
    let pointers = |s: &str| s.matches("[pruned tool output: seq ").count();
    let first = sent
        .iter()
        .position(|(s, ..)| pointers(s) > 0)
        .expect("masking fired");
    let (out, event, cut, edit) = &sent[first];
    assert!(
        !out.contains("past the tideline"),
        "request {first}: no cut"
    );
    assert!(
        !cut && *edit,
        "a masking event, labelled as the pointers' change"
    );
    assert_eq!(*event, sent[first - 1].1 + 1, "a new window event");
    let (next, next_event, ..) = &sent[first + 1];
    assert_eq!(next_event, event, "no event at the next request");
    assert!(
        next.starts_with(out.trim_end_matches("]}")),
        "request {}: it appends",
        first + 1
    );
}

/// A session's rows take the room they need (chunks), not a vector doubled
/// past them; a rolled-back request gives its rows back across chunks.
#[test]
fn a_long_history_takes_the_room_of_its_rows_and_rolls_back_whole() {
    let (m, seen) = manager();
    let id = ident("long");
    let texts: Vec<String> = (0..2049).map(|i| user(&format!("m{i}"))).collect();
    let msgs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut t = send(&m, &id, &msgs[..200]);
    t.answered(200);
    t.complete(200, true, &Collected::default());
    let mut t = send(&m, &id, &msgs);
    t.answered(200);
    t.complete(200, true, &Collected::default());
    take(&seen);
    let s = m.latest().expect("session");
    {
        let st = s.state.lock();
        assert_eq!(st.rows.len(), 2049);
        assert!(
            st.rows.capacity() < 2049 + 256,
            "room for {} rows",
            st.rows.capacity()
        );
        assert_eq!(st.row(2049).raw_hash, crate::dialect::raw_hash(msgs[2048]));
        assert_eq!(st.row(257).raw_hash, crate::dialect::raw_hash(msgs[256]));
    }
    // A request the upstream refuses: its 600 rows (three chunks) go.
    let more: Vec<String> = (0..600).map(|i| user(&format!("n{i}"))).collect();
    let all: Vec<&str> = msgs
        .iter()
        .copied()
        .chain(more.iter().map(String::as_str))
        .collect();
    let mut t = send(&m, &id, &all);
    t.answered(401);
    drop(t);
    {
        let st = s.state.lock();
        assert_eq!(st.rows.len(), 2049);
        assert_eq!(st.rows.iter().count(), 2049);
        assert_eq!(st.active.len(), 2049);
    }
    // And the next request records them again after row 2,049.
    let mut t = send(&m, &id, &all);
    t.answered(200);
    assert_eq!(row_seqs(&take(&seen)), (2050..=2649).collect::<Vec<u64>>());
    drop(t);
    let st = s.state.lock();
    assert_eq!(st.row(2649).raw_hash, crate::dialect::raw_hash(all[2648]));
}

fn new_rows(events: &[Event]) -> Vec<oceancode_window::Row> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Rows { rows, .. } => Some(rows.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn within(body: &Bytes, raw: &str) -> bool {
    let (start, p) = (body.as_ptr() as usize, raw.as_ptr() as usize);
    p >= start && p + raw.len() <= start + body.len()
}

/// A cold request's rows share its body's bytes (the writer's queue holds
/// no second copy of the history); a step's few new rows are copies (they
/// must not keep a whole body alive until the writer has them).
#[test]
fn a_cold_requests_rows_share_its_body_and_a_steps_rows_are_copies() {
    let (m, seen) = manager();
    let id = ident("slices");
    let texts: Vec<String> = (0..50).map(|i| user(&format!("m{i}"))).collect();
    let msgs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let cold = body(&msgs);
    let mut t = m
        .prepare(Dialect::Anthropic, ReqKind::Main, &id, cold.clone())
        .ticket
        .expect("ticket");
    t.answered(200);
    let events = take(&seen);
    let held: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::Rows { rows, .. } => Some(rows.capacity()),
            _ => None,
        })
        .collect();
    assert_eq!(held, vec![50], "one Rows event, room for its rows only");
    let rows = new_rows(&events);
    assert_eq!(rows.len(), 50);
    for (r, m) in rows.iter().zip(&msgs) {
        assert_eq!(&*r.raw, *m, "verbatim");
        assert!(
            within(&cold, &r.raw),
            "row {} is a slice of the body",
            r.seq
        );
    }
    t.complete(200, true, &Collected::default());
    take(&seen);
    let more = user("more");
    let all: Vec<&str> = msgs.iter().copied().chain([more.as_str()]).collect();
    let step = body(&all);
    let mut t = m
        .prepare(Dialect::Anthropic, ReqKind::Main, &id, step.clone())
        .ticket
        .expect("ticket");
    t.answered(200);
    let rows = new_rows(&take(&seen));
    assert_eq!(rows.len(), 1);
    assert_eq!(&*rows[0].raw, more.as_str(), "verbatim");
    assert!(!within(&step, &rows[0].raw), "a step's row is a copy");
    drop(t);
}
