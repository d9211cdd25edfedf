//! OpenTelemetry export end to end: a session through the proxy and the
//! fake upstream, its spans posted to a collector on loopback (decoded here
//! from OTLP protobuf); and a collector that is down or never answers,
//! which must cost dropped spans (counted), never a delayed request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_proxy::telemetry::OtlpOptions;
use oceancode_testkit::eventually_async;
use oceancode_tests::{push_tool_step, tool_output, Harness};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: &str = "sk-ant-api03-otel-test-secret-0123456789";
const ASK: &str = "Fix the flaky parser test in crates/zebra-otel-marker.";

/// An OTLP/HTTP collector on loopback keeping every body it is posted.
struct Collector {
    url: String,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

/// How long the exporter may take to deliver what the tests wait for.
const SPANS_WITHIN: Duration = Duration::from_secs(20);

/// Until the collector holds at least `n` spans.
async fn wait_spans(c: &Collector, n: usize) {
    eventually_async(SPANS_WITHIN, &format!("{n} spans"), || {
        std::future::ready(c.spans().len() >= n)
    })
    .await;
}

impl Collector {
    async fn start() -> Collector {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let bodies: Arc<Mutex<Vec<Bytes>>> = Arc::default();
        let keep = bodies.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                let keep = keep.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let keep = keep.clone();
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                            let b = req.into_body().collect().await.unwrap().to_bytes();
                            keep.lock().unwrap().push(b);
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                Bytes::new(),
                            )))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        Collector { url, bodies }
    }

    fn spans(&self) -> Vec<Span> {
        let bodies = self.bodies.lock().unwrap().clone();
        let mut out = Vec::new();
        for b in bodies {
            let req = ExportTraceServiceRequest::decode(b).unwrap();
            for rs in req.resource_spans {
                let res = rs.resource.unwrap();
                assert!(res
                    .attributes
                    .iter()
                    .any(|kv| kv.key == "service.name"
                        && matches!(&kv.value.as_ref().unwrap().value, Some(Any::StringValue(s)) if s == "oceancode-proxy")));
                for ss in rs.scope_spans {
                    out.extend(ss.spans);
                }
            }
        }
        out
    }

    fn raw(&self) -> Vec<u8> {
        self.bodies.lock().unwrap().concat()
    }
}

fn attrs(s: &Span) -> HashMap<String, Value> {
    s.attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                Some(Any::StringValue(s)) => json!(s),
                Some(Any::IntValue(i)) => json!(i),
                Some(Any::BoolValue(b)) => json!(b),
                Some(Any::DoubleValue(d)) => json!(d),
                Some(Any::ArrayValue(a)) => json!(a
                    .values
                    .iter()
                    .map(|v| match &v.value {
                        Some(Any::StringValue(s)) => s.clone(),
                        _ => String::new(),
                    })
                    .collect::<Vec<_>>()),
                _ => Value::Null,
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn options(url: &str, max_queue: usize, capture: bool) -> OtlpOptions {
    OtlpOptions {
        traces_url: oceancode_proxy::telemetry::traces_url(url),
        headers: HashMap::from([(
            "authorization".to_string(),
            "Basic b3RlbDpjb2xsZWN0b3I=".to_string(),
        )]),
        capture_content: capture,
        max_queue,
    }
}

/// A tool-using agent with a small line: the window is cut along the way.
async fn agent(h: &Harness, steps: usize) -> Vec<Duration> {
    let mut history = vec![json!({"role":"user","content": ASK})];
    let hdr = [
        ("x-claude-code-session-id", "otel-session"),
        ("x-api-key", SECRET),
    ];
    let mut took = Vec::new();
    for i in 0..steps {
        let body = json!({"model":"claude-otel","max_tokens":1000,"messages":history});
        let t = Instant::now();
        let got = h.post("/v1/messages", &hdr, body.to_string()).await;
        took.push(t.elapsed());
        assert_eq!(got.status, 200, "step {i}: {}", got.text());
        push_tool_step(&mut history, &got.json()["content"], &tool_output(i));
    }
    took
}

fn small_line(o: &mut oceancode_proxy::runtime::ProxyOptions) {
    o.sessions.models =
        Arc::new(
            |_m: &str, _l: Option<u64>| oceancode_proxy::sessions::ModelLimits {
                context: Some(200_000),
                max_output: Some(32_000),
            },
        );
    o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
}

fn fake() -> FakeConfig {
    FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "make test"})).with_text("Testing."),
    ))
}

async fn metric(h: &Harness, name: &str) -> u64 {
    let text = h.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_exports_genai_spans_with_its_cuts_and_no_secret_or_text() {
    let c = Collector::start().await;
    let url = c.url.clone();
    let h = Harness::start(fake(), |o| {
        small_line(o);
        o.telemetry = Some(options(&url, 1024, false));
    })
    .await;
    const STEPS: usize = 24;
    agent(&h, STEPS).await;
    let id = h.admin("/_oceancode/sessions/latest").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_spans(&c, STEPS).await;
    let spans = c.spans();
    assert_eq!(spans.len(), STEPS, "one span per step");
    let mut steps_seen = Vec::new();
    let mut cut_events = 0;
    for s in &spans {
        let a = attrs(s);
        assert_eq!(s.name, "chat claude-otel");
        assert_eq!(s.kind, 3, "CLIENT");
        assert!(s.parent_span_id.is_empty(), "a step is a root span");
        assert_eq!(a["gen_ai.operation.name"], "chat");
        assert_eq!(a["gen_ai.provider.name"], "anthropic");
        assert_eq!(a["gen_ai.request.model"], "claude-otel");
        assert!(a["gen_ai.response.model"].is_string(), "{a:?}");
        assert!(
            a["gen_ai.response.id"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{a:?}"
        );
        assert_eq!(a["gen_ai.conversation.id"], json!(id));
        assert!(
            a["gen_ai.usage.input_tokens"].as_i64().unwrap() > 0,
            "{a:?}"
        );
        assert!(a["gen_ai.usage.output_tokens"].as_i64().unwrap() > 0);
        assert!(a.contains_key("gen_ai.usage.cache_read.input_tokens"));
        assert!(a.contains_key("gen_ai.usage.cache_creation.input_tokens"));
        assert_eq!(a["gen_ai.response.finish_reasons"], json!(["tool_use"]));
        assert!(!a.contains_key("error.type"));
        assert_eq!(a["oceancode.line.tokens"], 20_000);
        assert!(a["oceancode.window.rows"].as_i64().unwrap() > 0);
        assert!(a.contains_key("oceancode.state_block.tokens"));
        assert!(a.contains_key("oceancode.compress.pointers"));
        assert!(a.contains_key("oceancode.context_edit"));
        assert_eq!(a["oceancode.limits.context_tokens"], 200_000);
        steps_seen.push(a["oceancode.step"].as_i64().unwrap());
        let cut = a["oceancode.cut.made"].as_bool().unwrap();
        let events: Vec<_> = s
            .events
            .iter()
            .filter(|e| e.name == "oceancode.cut")
            .collect();
        assert_eq!(cut, !events.is_empty(), "the cut attribute and event agree");
        for e in events {
            cut_events += 1;
            let ea: HashMap<_, _> = e
                .attributes
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.clone()))
                .collect();
            assert!(ea.contains_key("oceancode.cut.upto_seq"));
            assert!(a["oceancode.cut.rows"].as_i64().unwrap() > 0, "{a:?}");
            assert!(
                a["oceancode.window.rows_out"].as_i64().unwrap() > 0,
                "{a:?}"
            );
        }
    }
    steps_seen.sort_unstable();
    assert_eq!(steps_seen, (1..=STEPS as i64).collect::<Vec<_>>());
    assert!(cut_events >= 1, "the session was cut along the way");
    // Nothing of the request's headers or messages is exported by default.
    let raw = c.raw();
    let has = |needle: &str| raw.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(!has(SECRET), "the API key never leaves");
    assert!(!has("zebra-otel-marker"), "no message text by default");
    assert!(!has("Testing."), "no answer text by default");
    assert!(metric(&h, "oceancode_otlp_spans_exported_total").await >= STEPS as u64);
    assert_eq!(metric(&h, "oceancode_otlp_spans_dropped_total").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_capture_exports_messages_but_never_the_key() {
    let c = Collector::start().await;
    let url = c.url.clone();
    let h = Harness::start(fake(), |o| {
        small_line(o);
        o.telemetry = Some(options(&url, 1024, true));
    })
    .await;
    agent(&h, 2).await;
    wait_spans(&c, 2).await;
    let spans = c.spans();
    assert_eq!(spans.len(), 2);
    let a = attrs(&spans[0]);
    assert!(a["gen_ai.input.messages"]
        .as_str()
        .unwrap()
        .contains("zebra-otel-marker"));
    assert!(a["gen_ai.output.messages"]
        .as_str()
        .unwrap()
        .contains("Testing."));
    let raw = c.raw();
    assert!(!raw.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
}

/// A collector that takes connections and never answers.
async fn silent_collector() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_or_silent_collector_costs_dropped_spans_never_delayed_requests() {
    for down in [true, false] {
        let url = if down {
            // Nothing listens there: every export is refused at once.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", l.local_addr().unwrap());
            drop(l);
            url
        } else {
            silent_collector().await
        };
        let h = Harness::start(fake(), |o| {
            small_line(o);
            o.telemetry = Some(options(&url, 2, false));
        })
        .await;
        let took = agent(&h, 12).await;
        let slowest = took.iter().max().unwrap();
        // The export waits up to 5 s on a silent collector; a request
        // never waits on it.
        assert!(
            *slowest < Duration::from_secs(3),
            "down={down}: slowest request {slowest:?}"
        );
        // Drops are counted.
        let hr = &h;
        let dropped = eventually_async(SPANS_WITHIN, "drops are counted", move || async move {
            let n = metric(hr, "oceancode_otlp_spans_dropped_total").await;
            (n >= 1).then_some(n)
        })
        .await;
        assert!(dropped >= 1, "down={down}: drops are counted");
        assert_eq!(metric(&h, "oceancode_otlp_spans_exported_total").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_too_long_retry_is_a_child_span_and_a_relayed_error_has_its_type() {
    let c = Collector::start().await;
    let url = c.url.clone();
    let h = Harness::start(fake(), |o| {
        small_line(o);
        o.telemetry = Some(options(&url, 1024, false));
    })
    .await;
    let hdr = [("x-claude-code-session-id", "otel-retry")];
    let mut history = vec![json!({"role":"user","content": ASK})];
    let post = |history: &Vec<Value>| {
        json!({"model":"claude-otel","max_tokens":1000,"messages":history}).to_string()
    };
    for i in 0..30 {
        let got = h.post("/v1/messages", &hdr, post(&history)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        push_tool_step(&mut history, &got.json()["content"], &tool_output(i));
    }
    // "prompt is too long": every closed block cut, one retry.
    h.fake.push_reply(oceancode_fakeup::Reply::too_long());
    let got = h.post("/v1/messages", &hdr, post(&history)).await;
    assert_eq!(got.status, 200, "retried: {}", got.text());
    push_tool_step(&mut history, &got.json()["content"], &tool_output(99));
    // Nothing left to cut: the error is relayed.
    h.fake
        .set_script(Script::always(oceancode_fakeup::Reply::too_long()));
    let got = h.post("/v1/messages", &hdr, post(&history)).await;
    assert_eq!(got.status, 400);
    eventually_async(SPANS_WITHIN, "32 step spans", || {
        let roots = c
            .spans()
            .iter()
            .filter(|s| s.parent_span_id.is_empty())
            .count();
        std::future::ready(roots >= 32)
    })
    .await;
    let spans = c.spans();
    assert!(spans.len() >= 33, "32 steps and their retries");
    let step = |n: i64| {
        spans
            .iter()
            .find(|s| {
                s.parent_span_id.is_empty() && attrs(s).get("oceancode.step") == Some(&json!(n))
            })
            .unwrap()
    };
    let retried = step(31);
    let child: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == retried.span_id)
        .collect();
    assert_eq!(child.len(), 1);
    let child = child[0];
    assert_eq!(child.trace_id, retried.trace_id);
    assert_eq!(child.parent_span_id, retried.span_id);
    assert_eq!(attrs(child)["oceancode.retry.reason"], "too_long");
    assert_eq!(attrs(child)["gen_ai.operation.name"], "chat");
    assert!(child.start_time_unix_nano >= retried.start_time_unix_nano);
    assert!(child.end_time_unix_nano <= retried.end_time_unix_nano);
    assert_eq!(attrs(retried)["oceancode.cut.made"], true, "the retry cut");
    let failed = attrs(step(32));
    assert_eq!(failed["error.type"], "400");
    assert_eq!(step(32).status.as_ref().unwrap().code, 2, "ERROR");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_tool_round_is_a_child_span() {
    use oceancode_tests::recall::{assistant, path, user};
    let d = oceancode_window::Dialect::Anthropic;
    let c = Collector::start().await;
    let url = c.url.clone();
    let h = Harness::start(
        FakeConfig {
            script: Script::replies([
                Reply::text("first answer about the parser"),
                Reply::recall(json!({"match": "parser"})),
            ])
            .then(Reply::text("FINAL after recall")),
            ..FakeConfig::default()
        },
        |o| {
            o.front.recall = oceancode_proxy::recall_tool::RecallTool {
                enabled: true,
                max_rounds: 4,
                ..Default::default()
            };
            o.telemetry = Some(options(&url, 1024, false));
        },
    )
    .await;
    let hdr = [("x-oceancode-session", "otel-recall")];
    let body = |msgs: Vec<Value>| {
        json!({"model":"claude-otel","max_tokens":1024,"messages":msgs}).to_string()
    };
    let got = h
        .post(
            path(d),
            &hdr,
            body(vec![user(d, "tell me about the parser")]),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;
    let m2 = vec![
        user(d, "tell me about the parser"),
        assistant(d, "first answer about the parser"),
        user(d, "what did you say before?"),
    ];
    let got = h.post(path(d), &hdr, body(m2)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.text().contains("FINAL after recall"));
    wait_spans(&c, 3).await;
    let spans = c.spans();
    assert_eq!(spans.len(), 3, "two steps and one internal round");
    let root = spans
        .iter()
        .find(|s| s.parent_span_id.is_empty() && attrs(s)["oceancode.step"] == 2)
        .unwrap();
    assert_eq!(attrs(root)["oceancode.recall.calls"], 1);
    let child = spans.iter().find(|s| !s.parent_span_id.is_empty()).unwrap();
    assert_eq!(child.parent_span_id, root.span_id);
    assert_eq!(child.trace_id, root.trace_id);
    let a = attrs(child);
    assert_eq!(a["oceancode.call"], "recall");
    assert_eq!(a["oceancode.recall.round"], 2);
    assert_eq!(a["oceancode.recall.calls"], 1);
}
