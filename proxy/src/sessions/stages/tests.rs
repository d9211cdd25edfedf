//! The stages through their extension point: the declared order, and a
//! test-only stage added to it.

use super::{Draft, WindowStage, ORDER};
use crate::dialect::{Collected, ParsedBody};
use crate::identity::{Identity, ReqKind};
use crate::sessions::window::{render, render_with};
use crate::sessions::{SessionManager, Settings};
use bytes::Bytes;
use oceancode_window::{Dialect, Usage};
use std::sync::Arc;

const MARKER: &str = "[test stage marker]";

/// A stage that ends the stub's text with [`MARKER`].
struct Marker;

impl WindowStage for Marker {
    fn name(&self) -> &'static str {
        "marker"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        if let Some(stub) = d.stub.as_mut() {
            stub.push('\n');
            stub.push_str(MARKER);
        }
    }
}

fn body(messages: &[String]) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"claude-x","max_tokens":100,"messages":[{}]}}"#,
        messages.join(",")
    ))
}

fn user(i: usize) -> String {
    format!(r#"{{"role":"user","content":"question {i}"}}"#)
}

fn assistant(i: usize) -> String {
    format!(r#"{{"role":"assistant","content":[{{"type":"text","text":"answer {i}"}}]}}"#)
}

/// A session whose window grew past the line (a cut), its id, and the
/// last request's body.
fn cut_session() -> (SessionManager, String, Bytes) {
    let settings = Settings::for_tests(std::env::temp_dir().join("oceancode-unit-stages"));
    let m = SessionManager::new(settings, Arc::new(|_| {}));
    let ident = Identity {
        client_key: Some("name:stages".into()),
        client: "unknown",
        context_1m: false,
        model: None,
    };
    let mut history = vec![user(0)];
    for i in 0..12 {
        let b = body(&history);
        let p = m.prepare(Dialect::Anthropic, ReqKind::Main, &ident, b.clone());
        let t = p.ticket.expect("a recorded request");
        let id = t.session.id.clone();
        if String::from_utf8_lossy(&p.body).contains("past the tideline") {
            drop(t);
            return (m, id, b);
        }
        t.complete(
            200,
            true,
            &Collected {
                usage: Some(Usage {
                    input: 12_000 * (i as u64 + 1),
                    output: 5,
                    cache_read: 0,
                    cache_write: 0,
                }),
                model: Some("claude-x".into()),
                rows: vec![assistant(i)],
                terminal: true,
                ..Collected::default()
            },
        );
        history.push(assistant(i));
        history.push(user(i + 1));
    }
    panic!("no cut in 12 requests");
}

#[test]
fn the_stages_run_in_the_declared_order() {
    let names: Vec<&str> = ORDER.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "tideline",
            "recall note",
            "state block",
            "standing parts",
            "compress",
            "context edits",
            "recall exchanges",
            "seq tags"
        ]
    );
}

#[test]
fn a_stage_added_to_the_order_changes_only_its_part_of_the_window() {
    let (m, id, b) = cut_session();
    let session = m.get(&id).expect("the session");
    let st = session.state.lock();
    let parsed = ParsedBody::parse(&b, "messages").expect("the body");
    let plain = render(m.settings(), &st, &parsed);
    // After the state block, before the standing parts.
    let mut order: Vec<&dyn WindowStage> = ORDER.to_vec();
    order.insert(3, &Marker);
    let marked = render_with(&order, m.settings(), &st, &parsed);
    let plain_body = String::from_utf8(plain.body.expect("a cut window")).expect("utf-8");
    let marked_body = String::from_utf8(marked.body.expect("a cut window")).expect("utf-8");
    assert!(plain_body.contains("past the tideline"), "{plain_body}");
    assert!(!plain_body.contains(MARKER));
    assert_eq!(marked_body.matches(MARKER).count(), 1, "{marked_body}");
    assert!(marked.stub.as_deref().is_some_and(|s| s.contains(MARKER)));
    assert_eq!(marked_body.replace(&format!("\\n{MARKER}"), ""), plain_body);
    assert_eq!((marked.rows, marked.upto), (plain.rows, plain.upto));
}

#[test]
fn a_stage_added_to_the_order_leaves_an_uncut_request_as_it_came() {
    let (m, id, _) = cut_session();
    let session = m.get(&id).expect("the session");
    let mut st = session.state.lock();
    st.tideline = Default::default();
    let b = body(&[user(0)]);
    let parsed = ParsedBody::parse(&b, "messages").expect("the body");
    let mut order: Vec<&dyn WindowStage> = ORDER.to_vec();
    order.push(&Marker);
    let w = render_with(&order, m.settings(), &st, &parsed);
    assert!(w.body.is_none() && w.stub.is_none());
}
