//! The dialect conformance suite: every dialect of
//! [`oceancode_window::dialect::ALL`] through the same cases, against the
//! fake upstream's validators and provider-shaped answers. A new dialect is
//! covered by adding itself to `ALL` (and writing its `DialectSpec`).
//!
//! The conversation of every case: a prompt, a tool call, its result, an
//! answer, a follow-up prompt.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, FakeHandle, FakeUpstream};
use oceancode_proxy::dialect::{classify, collector, ParsedBody};
use oceancode_proxy::identity::{route, ReqKind};
use oceancode_window::compress;
use oceancode_window::dialect::{spec, DialectSpec, StreamCut, ALL};
use oceancode_window::Dialect;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;

const MODEL: &str = "model-x";

/// The five messages of the case, raw.
fn conversation(s: &dyn DialectSpec) -> Vec<String> {
    vec![
        s.user_message("list the files"),
        s.tool_call_message("call_1", "ls", &json!({"path": "."})),
        s.tool_result_message("call_1", "ls", "a.txt\nb.txt", false),
        s.assistant_message("two files"),
        s.user_message("thanks"),
    ]
}

/// POST `body` to the dialect's main route; (status, body).
fn post(fake: &FakeHandle, s: &dyn DialectSpec, body: &str) -> (u16, Vec<u8>) {
    let path = s.main_path(MODEL);
    let mut c = TcpStream::connect(fake.addr()).expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        fake.addr(),
        body.len()
    );
    c.write_all(head.as_bytes()).expect("write");
    c.write_all(body.as_bytes()).expect("write");
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).expect("read");
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head");
    let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
    let status = head[9..12].parse().expect("status");
    let mut rest = raw[at + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        rest = dechunk(&rest);
    }
    (status, rest)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 4 + n..];
    }
    out
}

fn fake() -> FakeHandle {
    FakeUpstream::start_background(FakeConfig::default()).expect("fake upstream")
}

fn parsed(raw: &str) -> Value {
    serde_json::from_str(raw).expect("message is JSON")
}

#[test]
fn routes_names_and_stream_errors() {
    for d in ALL {
        let s = spec(d);
        assert_eq!(s.dialect(), d);
        assert_eq!(Dialect::parse(d.as_str()), Some(d), "{d:?}");
        assert_eq!(
            route(&s.main_path(MODEL)),
            Some((d, ReqKind::Main)),
            "{d:?}"
        );
        for cut in [StreamCut::Idle, StreamCut::Broken] {
            let ev = s.stream_error_event(cut, "gone");
            let data = ev
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("a data line");
            let v: Value = serde_json::from_str(data).expect("JSON data");
            assert!(v.to_string().contains("gone"), "{d:?}: {ev}");
            assert!(ev.ends_with("\n\n"), "{d:?}");
        }
    }
}

#[test]
fn a_conversation_parses_and_its_calls_and_results_pair() {
    for d in ALL {
        let s = spec(d);
        let msgs = conversation(s);
        let body = s.request_body(MODEL, &msgs);
        let p = ParsedBody::parse(body.as_bytes(), s.conv_key()).expect("parses");
        assert_eq!(
            p.messages,
            msgs.iter().map(String::as_str).collect::<Vec<_>>()
        );
        let info: Vec<_> = msgs.iter().map(|m| classify(d, &parsed(m))).collect();
        let opens: Vec<_> = info.iter().map(|i| i.opens.clone()).collect();
        let closes: Vec<_> = info.iter().map(|i| i.closes.clone()).collect();
        let one = vec!["call_1".to_string()];
        assert_eq!(
            opens,
            [vec![], one.clone(), vec![], vec![], vec![]],
            "{d:?}"
        );
        assert_eq!(
            closes,
            [vec![], vec![], one.clone(), vec![], vec![]],
            "{d:?}"
        );
        assert_eq!(s.calls(&parsed(&msgs[1])), one, "{d:?}");
        let r = s.results(&parsed(&msgs[2]));
        assert_eq!(r.len(), 1, "{d:?}");
        assert_eq!(
            (r[0].id.as_str(), r[0].is_error),
            ("call_1", false),
            "{d:?}"
        );
        let failed = s.tool_result_message("call_1", "ls", "no such dir", true);
        assert_eq!(s.results(&parsed(&failed))[0].id, "call_1", "{d:?}");
        assert!(info[0].starts_ok && !info[2].starts_ok, "{d:?}");
    }
}

#[test]
fn the_request_a_cut_window_and_a_compressed_output_are_valid() {
    let fake = fake();
    for d in ALL {
        let s = spec(d);
        let msgs = conversation(s);
        let full = s.request_body(MODEL, &msgs);
        let (st, b) = post(&fake, s, &full);
        assert_eq!(st, 200, "{d:?}: {}", String::from_utf8_lossy(&b));
        // Cut the first block (prompt, call, result): the stub takes its place.
        let p = ParsedBody::parse(full.as_bytes(), s.conv_key()).expect("parses");
        let stub = s.stub_message("[3 messages left the window]", &[]);
        let window = p.render_with(&[stub.as_str(), p.messages[3], p.messages[4]]);
        let (st, b) = post(&fake, s, std::str::from_utf8(&window).expect("utf8"));
        assert_eq!(st, 200, "{d:?}: {}", String::from_utf8_lossy(&b));
        // A cut between the call and its result is not a valid request.
        let torn = p.render_with(&[stub.as_str(), p.messages[2], p.messages[3], p.messages[4]]);
        let (st, _) = post(&fake, s, std::str::from_utf8(&torn).expect("utf8"));
        assert_eq!(st, 400, "{d:?}: an orphan result must be refused");
        // The tool output spans the result's content; its pointer keeps it valid.
        assert!(s.tool_outputs(&msgs[1]).is_empty(), "{d:?}");
        let spans = s.tool_outputs(&msgs[2]);
        assert_eq!(spans.len(), 1, "{d:?}");
        assert!(
            msgs[2][spans[0].start..spans[0].end].contains("a.txt"),
            "{d:?}"
        );
        let pointed =
            compress::rewrite(d, &msgs[2], &[(spans[0].part, "[pruned]")]).expect("rewritten");
        assert_eq!(
            s.results(&parsed(&pointed)),
            s.results(&parsed(&msgs[2])),
            "{d:?}"
        );
        let mut with = msgs.clone();
        with[2] = pointed;
        let (st, b) = post(&fake, s, &s.request_body(MODEL, &with));
        assert_eq!(st, 200, "{d:?}: {}", String::from_utf8_lossy(&b));
        // The recall tool's declaration is a valid tool of the dialect.
        let tools = format!("[{}]", s.recall_tool());
        let body = p.with_member("tools", &tools).render_with(&p.messages);
        let (st, b) = post(&fake, s, std::str::from_utf8(&body).expect("utf8"));
        assert_eq!(st, 200, "{d:?}: {}", String::from_utf8_lossy(&b));
        // The stub with pinned parts is one valid user message.
        let pinned = s.stub_message("note", &[r#"{"text":"kept"}"#]);
        assert!(
            pinned.contains("kept") && parsed(&pinned).is_object(),
            "{d:?}"
        );
    }
}

#[test]
fn too_long_errors_and_the_error_envelope_are_the_providers() {
    let fake = FakeUpstream::start_background(FakeConfig::default().with_max_context(64))
        .expect("fake upstream");
    for d in ALL {
        let s = spec(d);
        let long = s.user_message(&"many words here ".repeat(200));
        let (st, b) = post(&fake, s, &s.request_body(MODEL, &[long]));
        assert_eq!(st, 400, "{d:?}: {}", String::from_utf8_lossy(&b));
        let theirs: Value = serde_json::from_slice(&b).expect("JSON error");
        let limit = s.context_limit(&theirs).expect("a too-long error");
        // The ceiling, where the provider names it (Responses does not).
        assert!(matches!(limit.ceiling, None | Some(64)), "{d:?}: {theirs}");
        assert!(s.error_message(&theirs).is_some(), "{d:?}: {theirs}");
        // Not every error is a too-long one.
        let other = s.error_body(400, "invalid_request_error", "invalid_request", "bad field");
        assert_eq!(s.context_limit(&other), None, "{d:?}");
        // The proxy's own errors have the provider's envelope.
        assert_eq!(
            s.error_message(&other).as_deref(),
            Some("bad field"),
            "{d:?}"
        );
        // Every member the proxy's envelope has, the provider's has (it may
        // add its own, e.g. Anthropic's `request_id`).
        let keys = |v: &Value| -> Vec<String> {
            v.as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        for (ours, of) in [(&other, &theirs), (&other["error"], &theirs["error"])] {
            let missing: Vec<_> = keys(ours)
                .into_iter()
                .filter(|k| of.get(k).is_none())
                .collect();
            assert!(
                missing.is_empty(),
                "{d:?}: {missing:?} of {other} not in {theirs}"
            );
        }
        assert!(!keys(&other["error"]).is_empty(), "{d:?}");
    }
}

#[test]
fn usage_is_read_from_the_answer() {
    let fake = fake();
    for d in ALL {
        let s = spec(d);
        let (st, b) = post(&fake, s, &s.request_body(MODEL, &conversation(s)));
        assert_eq!(st, 200, "{d:?}");
        let answer: Value = serde_json::from_slice(&b).expect("JSON answer");
        let (usage, _) = s
            .usage(&answer[s.usage_key()])
            .unwrap_or_else(|| panic!("{d:?}: no usage in {answer}"));
        assert!(
            usage.input_total() > 0 && usage.output > 0,
            "{d:?}: {usage:?}"
        );
        assert_eq!(s.usage(&json!("nope")), None, "{d:?}");
        let mut c = collector(d);
        c.on_json(&b);
        assert_eq!(c.finish().usage, Some(usage), "{d:?}");
    }
}
