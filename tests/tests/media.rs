//! Screenshots and documents through the proxy (issue 23): a 1 MB PNG in a
//! tool result is ~1,560 tokens for the provider, not 450k; the gauge must
//! price it that way, so a screenshot never wipes the window, and many
//! screenshots cut only when the real window is over the line. Anthropic,
//! Chat and Responses shapes, against the fake upstream (which charges the
//! providers' image rules).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::images;
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{push_tool_step, Harness};
use serde_json::{json, Value};
use std::sync::Arc;

const CONTEXT: u64 = 200_000;
const LINE: u64 = 80_000; // the default 40% of 200k
const STUB: &str = "[Earlier content of this session is past the tideline";

async fn harness(fake: FakeConfig, line: Option<u64>) -> Harness {
    Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(CONTEXT),
            max_output: Some(32_000),
        });
        if let Some(l) = line {
            o.sessions.line = oceancode_config::LineSpec::Tokens(l);
        }
    })
    .await
}

/// ~1.8k tokens of build output.
fn text_output(step: usize) -> String {
    (0..60)
        .map(|i| {
            format!(
                "[{step}:{i:03}] compiling crate_{} v0.{}.{} (src/unit_{}.rs) warnings={} t={}ms\n",
                (step * 7 + i) % 53,
                i % 9,
                (step + i) % 17,
                (step * 131 + i * 17) % 997,
                i % 4,
                (step * 37 + i * 11) % 5000
            )
        })
        .collect()
}

fn model_requests(h: &Harness) -> Vec<Recorded> {
    h.fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/") && !r.path.contains("count_tokens"))
        .collect()
}

fn window(r: &Recorded) -> u64 {
    r.usage.as_ref().map_or(0, |u| u.total_input_tokens)
}

fn has_stub(r: &Recorded) -> bool {
    String::from_utf8_lossy(&r.body).contains(STUB)
}

/// A 1920×1080 screenshot of about `bytes` bytes, as base64.
fn screenshot(bytes: usize, n: usize) -> String {
    images::b64(&images::png(1920, 1080 - n as u32, bytes))
}

/// No request was cut, the text (~20k) was all there, and each screenshot
/// step added about a screenshot.
fn assert_never_cut(h: &Harness, windows: &[u64]) {
    assert!(
        model_requests(h).iter().all(|r| !has_stub(r)),
        "a screenshot cut the window"
    );
    assert!(windows[0] > 19_000, "{windows:?}");
    for w in windows.windows(2) {
        assert!((1_000..2_500).contains(&(w[1] - w[0])), "{windows:?}");
    }
}

async fn anthropic_step(h: &Harness, history: &[Value]) -> Value {
    let body = json!({
        "model": "claude-test-200k", "max_tokens": 8192,
        "system": [{"type": "text", "text": "You are a careful coding agent."}],
        "tools": [{"name": "Shot", "description": "Screenshot or build", "input_schema": {"type": "object"}}],
        "messages": history,
    });
    let got = h
        .post(
            "/v1/messages",
            &[("x-oceancode-session", "shots")],
            body.to_string(),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    got.json()["content"].clone()
}

/// The last tool_use's result is `content` (blocks).
fn push_blocks(history: &mut Vec<Value>, answer: &Value, content: Value) {
    push_tool_step(history, answer, "");
    let last = history.len() - 1;
    history[last]["content"][0]["content"] = content;
}

fn shot_blocks(b64: String) -> Value {
    json!([{"type": "text", "text": "Screenshot of the page."},
           {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screenshot_does_not_wipe_the_window() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Shot", json!({"what": "next"})).with_text("Next."),
    ));
    let h = harness(fake, None).await;
    let mut history =
        vec![json!({"role": "user", "content": "Fix the layout bug; check it with screenshots."})];
    // ~20k tokens of text, three tool steps whose result is a 1 MB PNG, one
    // more text step.
    let mut windows = Vec::new();
    for n in 0..16 {
        let a = anthropic_step(&h, &history).await;
        if (12..15).contains(&n) {
            // This request carries screenshot n - 11.
            windows.push(window(model_requests(&h).last().unwrap()));
        }
        if (11..14).contains(&n) {
            let b64 = screenshot(1_000_000, n);
            assert!(b64.len() > 1_300_000, "{}", b64.len());
            push_blocks(&mut history, &a, shot_blocks(b64));
        } else {
            push_tool_step(&mut history, &a, &text_output(n));
        }
    }
    h.settle().await;

    let reqs = model_requests(&h);
    println!("upstream window after each 1 MB screenshot: {windows:?}");
    for (i, r) in reqs.iter().enumerate() {
        assert!(!has_stub(r), "request {i} was cut (window {})", window(r));
        assert!(window(r) < LINE);
    }
    assert!(
        windows[0] > 19_000,
        "the text is all still there: {windows:?}"
    );
    for w in windows.windows(2) {
        let grew = w[1] - w[0];
        assert!(
            (1_500..2_500).contains(&grew),
            "a screenshot step adds ~1.6k: {windows:?}"
        );
    }
    // The ledger's row estimates price the image by its formula, and the
    // text after it by a ratio learned from text alone.
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let s = store.load_session(&id).unwrap().unwrap();
    let img_rows: Vec<u32> = s
        .rows
        .iter()
        .filter(|r| r.raw.contains("\"image\""))
        .map(|r| r.tokens)
        .collect();
    assert_eq!(img_rows.len(), 3);
    for t in &img_rows {
        assert!((1_500..1_700).contains(t), "image row estimate {t}");
    }
    let text_rows: Vec<u32> = s
        .rows
        .iter()
        .filter(|r| r.raw.contains("compiling crate_"))
        .map(|r| r.tokens)
        .collect();
    let (before, after) = (text_rows[5], *text_rows.last().unwrap());
    assert!(
        (after as f64 / before as f64 - 1.0).abs() < 0.25,
        "text rows before {before} and after {after} the screenshots"
    );
    // The meter agrees with the real window.
    let sess = h.admin(&format!("/_oceancode/sessions/{id}")).await;
    let gauge = sess["meter"]["gauge"].as_u64().unwrap();
    assert!(gauge < LINE && gauge > 20_000, "gauge {gauge}");
    // The transcript shows a placeholder, never the data.
    let dir = h.data.path().join("sessions").join(&id).join("transcript");
    let mut md = String::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        md.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    assert!(
        md.contains("*[image: image/png · 1920×1069 · ~"),
        "no placeholder"
    );
    assert!(!md.contains("iVBORw0KGgo"), "image data in a transcript");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_screenshots_cut_only_when_the_real_window_is_over_the_line() {
    const LINE_20K: u64 = 20_000;
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Shot", json!({"what": "next"})).with_text("Next."),
    ));
    let h = harness(fake, Some(LINE_20K)).await;
    let mut history =
        vec![json!({"role": "user", "content": "Compare the pages, one screenshot each."})];
    for step in 0..4 {
        let a = anthropic_step(&h, &history).await;
        push_tool_step(&mut history, &a, &text_output(step));
    }
    for n in 0..16 {
        let a = anthropic_step(&h, &history).await;
        push_blocks(&mut history, &a, shot_blocks(screenshot(150_000, n)));
    }
    anthropic_step(&h, &history).await;
    let reqs = model_requests(&h);
    let first_cut = reqs
        .iter()
        .position(has_stub)
        .expect("the screenshots pushed it over");
    let windows: Vec<u64> = reqs.iter().map(window).collect();
    println!("windows at a 20k line: {windows:?} (first cut at request {first_cut})");
    // Before the cut the real window was under the line, and grew by about a
    // screenshot a step; the cut came when it reached the line.
    assert!(
        first_cut > 5,
        "cut before any screenshot pushed it over: {windows:?}"
    );
    let before = windows[first_cut - 1];
    assert!(
        before + 2_500 >= LINE_20K,
        "cut while the real window {before} + one step was under the line: {windows:?}"
    );
    assert!(windows[..first_cut].iter().all(|&w| w < LINE_20K));
    // The cut left out a block, not everything, and the window stays bounded.
    let after = windows[first_cut];
    assert!(
        after < before && after > 4_000,
        "cut to {after} from {before}"
    );
    assert!(
        windows.iter().all(|&w| w < LINE_20K + 14_000),
        "{windows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_screenshots_in_user_messages_do_not_wipe_the_window() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "shot",
        json!({"what": "next"}),
    )));
    let h = harness(fake, None).await;
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful coding agent."}),
        json!({"role": "user", "content": "Fix the layout bug; check it with screenshots."}),
    ];
    let mut windows = Vec::new();
    for n in 0..15 {
        let body = json!({"model": "gpt-test", "tools": [{"type": "function", "function": {"name": "shot", "parameters": {"type": "object"}}}], "messages": messages});
        let got = h
            .post(
                "/v1/chat/completions",
                &[("x-oceancode-session", "chat-shots")],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        if n >= 12 {
            windows.push(window(model_requests(&h).last().unwrap()));
        }
        let m = got.json()["choices"][0]["message"].clone();
        let id = m["tool_calls"][0]["id"].as_str().unwrap().to_string();
        messages.push(m);
        if n < 11 {
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": text_output(n)}));
        } else {
            // Chat tool messages carry text: the screenshot follows as a user message.
            messages.push(
                json!({"role": "tool", "tool_call_id": id, "content": "screenshot attached"}),
            );
            let url = format!("data:image/png;base64,{}", screenshot(1_000_000, n));
            messages.push(json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "high"}}]}));
        }
    }
    println!("chat windows after each 1 MB screenshot: {windows:?}");
    assert_never_cut(&h, &windows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_screenshots_in_tool_outputs_do_not_wipe_the_window() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "shot",
        json!({"what": "next"}),
    )));
    let h = harness(fake, None).await;
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the layout bug; check it with screenshots."}]}),
    ];
    let mut windows = Vec::new();
    for n in 0..15 {
        let body = json!({"model": "gpt-test", "store": false, "tools": [{"type": "function", "name": "shot", "parameters": {"type": "object"}}], "input": input});
        let got = h
            .post(
                "/v1/responses",
                &[("session-id", "resp-shots")],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        if n >= 12 {
            windows.push(window(model_requests(&h).last().unwrap()));
        }
        let output = got.json()["output"].as_array().unwrap().clone();
        let call = output
            .iter()
            .find(|i| i["type"] == "function_call")
            .and_then(|i| i["call_id"].as_str())
            .unwrap()
            .to_string();
        input.extend(output);
        let out = if n < 11 {
            json!(text_output(n))
        } else {
            let url = format!("data:image/png;base64,{}", screenshot(1_000_000, n));
            json!([{"type": "input_text", "text": "screenshot"}, {"type": "input_image", "image_url": url}])
        };
        input.push(json!({"type": "function_call_output", "call_id": call, "output": out}));
    }
    println!("responses windows after each 1 MB screenshot: {windows:?}");
    assert_never_cut(&h, &windows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_claude_code_image_read_is_priced_by_its_size() {
    // Claude Code's Read tool on an 800×500 PNG (clients/test_claude_code_image.py).
    let reqs = oceancode_tests::captured("anthropic_12_read_png");
    let body: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    let msgs = body["messages"].as_array().unwrap();
    let shot = msgs.last().unwrap();
    assert_eq!(shot["content"][0]["type"], "tool_result");
    assert_eq!(shot["content"][0]["content"][0]["type"], "image");
    let h = harness(FakeConfig::default(), None).await;
    let got = h.replay(&reqs[0]).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;
    let r = &model_requests(&h)[0];
    assert!(!has_stub(r));
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let s = store.load_session(&id).unwrap().unwrap();
    let row = s.rows.iter().find(|r| r.raw.contains("\"image\"")).unwrap();
    let formula = oceancode_window::media::anthropic_image_tokens(800, 500);
    assert_eq!(formula, 29 * 18);
    assert!(
        (formula as u32..formula as u32 + 100).contains(&row.tokens),
        "row estimate {} for a {formula}-token image ({} bytes)",
        row.tokens,
        row.raw.len()
    );
    let md = std::fs::read_to_string(
        h.data
            .path()
            .join("sessions")
            .join(&id)
            .join("transcript")
            .join("0001.md"),
    )
    .unwrap();
    assert!(
        md.contains("*[image: image/png · 800×500 · ~522 tokens]*"),
        "{md}"
    );
}

/// The proxy's estimate (read from the header, never decoded) against what
/// the fake upstream charges (the whole payload decoded, the documented rule
/// applied by its own code), for images of several kinds and sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_estimates_match_what_the_upstream_charges() {
    use oceancode_fakeup::images::WebP;
    use oceancode_window::media;
    let fake = oceancode_fakeup::FakeUpstream::start(
        FakeConfig::default().with_script(Script::always(Reply::text("ok"))),
    )
    .await
    .unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("png 200×200", images::png(200, 200, 0), "image/png"),
        ("png 800×500", images::png(800, 500, 12_000), "image/png"),
        ("png 1092×1092", images::png(1092, 1092, 0), "image/png"),
        (
            "png 1920×1080 (1 MB)",
            images::png(1920, 1080, 1_000_000),
            "image/png",
        ),
        ("png 2880×1800", images::png(2880, 1800, 0), "image/png"),
        (
            "jpeg 4032×3024",
            images::jpeg(4032, 3024, 30_000, 200_000),
            "image/jpeg",
        ),
        ("gif 640×480", images::gif(640, 480), "image/gif"),
        (
            "webp 1024×768",
            images::webp(WebP::Lossy, 1024, 768),
            "image/webp",
        ),
        (
            "webp 300×3000",
            images::webp(WebP::Lossless, 300, 3000),
            "image/webp",
        ),
    ];
    let post = |content: Value, chat: bool| {
        let url = fake.url();
        async move {
            let (path, body) = if chat {
                (
                    "/v1/chat/completions",
                    json!({"model": "gpt-test", "messages": [{"role": "user", "content": content}]}),
                )
            } else {
                (
                    "/v1/messages",
                    json!({"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": content}]}),
                )
            };
            let got = oceancode_tests::collect(
                oceancode_tests::client()
                    .request(
                        http::Request::post(format!("{url}{path}"))
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(bytes::Bytes::from(
                                body.to_string(),
                            )))
                            .unwrap(),
                    )
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(got.status, 200, "{}", got.text());
        }
    };
    let charged = |h: &oceancode_fakeup::FakeHandle| {
        h.requests()
            .last()
            .and_then(|r| r.usage)
            .unwrap()
            .total_input_tokens
    };
    post(json!([{"type": "text", "text": "look"}]), false).await;
    let base_a = charged(&fake);
    post(json!([{"type": "text", "text": "look"}]), true).await;
    let base_o = charged(&fake);
    println!(
        "| image | Anthropic charged | estimated | error | OpenAI charged | estimated | error |"
    );
    let mut worst = 0f64;
    for (name, bytes, ty) in &cases {
        let b64 = images::b64(bytes);
        let a_block =
            json!({"type": "image", "source": {"type": "base64", "media_type": ty, "data": b64}});
        let o_block =
            json!({"type": "image_url", "image_url": {"url": format!("data:{ty};base64,{b64}")}});
        post(
            json!([{"type": "text", "text": "look"}, a_block.clone()]),
            false,
        )
        .await;
        let a_real = charged(&fake) - base_a;
        post(
            json!([{"type": "text", "text": "look"}, o_block.clone()]),
            true,
        )
        .await;
        let o_real = charged(&fake) - base_o;
        let a_est = media::block(&a_block.to_string()).unwrap().tokens;
        let o_est = media::block(&o_block.to_string()).unwrap().tokens;
        let err = |e: u64, r: u64| e as f64 / r as f64 - 1.0;
        println!(
            "| {name} | {a_real} | {a_est} | {:+.1}% | {o_real} | {o_est} | {:+.1}% |",
            100.0 * err(a_est, a_real),
            100.0 * err(o_est, o_real)
        );
        worst = worst
            .max(err(a_est, a_real).abs())
            .max(err(o_est, o_real).abs());
    }
    assert!(worst <= 0.02, "worst estimate error {:.1}%", 100.0 * worst);
}
