//! The fake's usage prices images and documents the way the providers do:
//! by the image's size and the page count, not by the base64's bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;

use common::*;
use oceancode_fakeup::images::{self, WebP};
use oceancode_fakeup::{FakeConfig, FakeUpstream, Reply, Script};
use serde_json::{json, Value};

async fn total_input(f: &oceancode_fakeup::FakeHandle, path: &str, body: Value) -> u64 {
    let r = post(&f.url(), path, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = f.requests();
    rec.last()
        .and_then(|r| r.usage)
        .expect("usage")
        .total_input_tokens
}

fn anthropic(content: Value) -> Value {
    json!({"model": "claude-test", "max_tokens": 100, "messages": [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]},
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_cost_their_formula_in_every_dialect() {
    let f =
        FakeUpstream::start(FakeConfig::default().with_script(Script::always(Reply::text("ok"))))
            .await
            .expect("fake");
    let png = images::png(1920, 1080, 1_000_000);
    let b64 = images::b64(&png);
    assert!(b64.len() > 1_300_000);
    let text_only = total_input(&f, "/v1/messages", anthropic(json!("Screenshot taken."))).await;
    let with_image = total_input(
        &f,
        "/v1/messages",
        anthropic(json!([{"type": "text", "text": "Screenshot taken."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}])),
    )
    .await;
    // 1920×1080 → scaled to fit 1568 visual tokens (28×28 patches).
    let image = with_image - text_only;
    assert!((1_500..=1_568).contains(&image), "image cost {image}");

    // Chat: a data URL at high and low detail (gpt-4o tiles).
    let url = format!("data:image/png;base64,{b64}");
    let chat = |detail: &str| {
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": url, "detail": detail}}]}]})
    };
    let chat_text = total_input(
        &f,
        "/v1/chat/completions",
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}]}]}),
    )
    .await;
    let high = total_input(&f, "/v1/chat/completions", chat("high")).await;
    let low = total_input(&f, "/v1/chat/completions", chat("low")).await;
    // 1920×1080 → 1365×768 → 3×2 tiles.
    assert_eq!(high - chat_text, 85 + 170 * 6);
    assert_eq!(low - chat_text, 85);

    // Responses: an image in a function_call_output's output list.
    let webp = images::b64(&images::webp(WebP::Lossless, 512, 512));
    let resp = |output: Value| {
        json!({"model": "gpt-test", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "shoot"}]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": output}]})
    };
    let r_text = total_input(
        &f,
        "/v1/responses",
        resp(json!([{"type": "input_text", "text": "done"}])),
    )
    .await;
    let r_img = total_input(
        &f,
        "/v1/responses",
        resp(json!([{"type": "input_text", "text": "done"},
            {"type": "input_image", "image_url": format!("data:image/webp;base64,{webp}")}])),
    )
    .await;
    assert_eq!(r_img - r_text, 85 + 170);

    // A 4-page PDF document: per page.
    let pdf = images::b64(&images::pdf(4));
    let with_pdf = total_input(
        &f,
        "/v1/messages",
        anthropic(json!([{"type": "text", "text": "Screenshot taken."},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}}])),
    )
    .await;
    assert_eq!(with_pdf - text_only, 4 * 2_300);
}
