//! The session viewer (`/_oceancode/ui/`) over a real proxy and a session
//! recorded through the fake upstream: the access rules (Host, Origin,
//! Sec-Fetch-Site, the admin token handed over once and kept in a cookie),
//! read-only routes, escaping of hostile content under a strict CSP, the
//! chart (one point per step, one marker per cut), the two views, search,
//! the exports and the live stamp.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{client, collect, push_tool_step, tool_output, Got, Harness};
use serde_json::{json, Value};
use std::sync::Arc;

const XSS: &str =
    "Fix it <script>alert('xss')</script><img src=x onerror=alert(1)> \"quoted\" & done";

/// A proxy with a 20k line (200k context) and a session of `steps` tool
/// steps whose first prompt carries an XSS payload; returns its ledger id.
async fn recorded(steps: usize) -> (Harness, String) {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "cargo test"}))
            .with_text("Running the tests: zephyrword."),
    ));
    let h = Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(32_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await;
    let mut history: Vec<Value> = vec![json!({"role":"user","content": XSS})];
    for step in 0..steps {
        let body = json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "tools": [{"name":"Bash","description":"Run","input_schema":{"type":"object"}}],
            "messages": history,
        });
        let got = h
            .post(
                "/v1/messages",
                &[("x-oceancode-session", "viewer-test")],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let content = got.json()["content"].clone();
        push_tool_step(&mut history, &content, &tool_output(step));
    }
    h.settle().await;
    let id = h.admin("/_oceancode/sessions").await["sessions"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    (h, id)
}

/// GET `path` on the proxy with exactly `headers` (no token added).
async fn get(h: &Harness, path: &str, headers: &[(&str, &str)]) -> Got {
    get_method(h, Method::GET, path, headers).await
}

async fn get_method(h: &Harness, m: Method, path: &str, headers: &[(&str, &str)]) -> Got {
    let mut b = Request::builder()
        .method(m)
        .uri(format!("{}{path}", h.url()));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    collect(
        client()
            .request(b.body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap(),
    )
    .await
}

fn cookie_of(h: &Harness) -> String {
    format!("oceancode_ui={}", h.admin_token())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_needs_the_token_handed_over_once_and_kept_in_a_cookie() {
    let (h, _) = recorded(1).await;
    let none = get(&h, "/_oceancode/ui/", &[]).await;
    assert_eq!(none.status, 401, "{}", none.text());
    assert!(none.text().contains("oceancode-proxy ui"));
    let wrong = get(&h, "/_oceancode/ui/?token=0000", &[]).await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.headers.get("set-cookie").is_none());
    let bad_cookie = get(&h, "/_oceancode/ui/", &[("cookie", "oceancode_ui=0000")]).await;
    assert_eq!(bad_cookie.status, 401);

    // The hand-over: a cookie scoped to the viewer, the token out of the URL.
    let token = h.admin_token();
    let over = get(&h, &format!("/_oceancode/ui/?sort=rows&token={token}"), &[]).await;
    assert_eq!(over.status, 303);
    assert_eq!(over.headers["location"], "/_oceancode/ui/?sort=rows");
    let set = over.headers["set-cookie"].to_str().unwrap();
    assert_eq!(
        set,
        format!("oceancode_ui={token}; Path=/_oceancode/ui/; HttpOnly; SameSite=Strict")
    );
    let page = get(
        &h,
        "/_oceancode/ui/?sort=rows",
        &[("cookie", &cookie_of(&h))],
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(
        page.text().contains("<table class=\"sessions\""),
        "{}",
        page.text()
    );
    // The bearer token works too (scripts), and the cookie does not open the
    // rest of the admin API.
    let bearer = get(
        &h,
        "/_oceancode/ui/",
        &[("authorization", &format!("Bearer {token}"))],
    )
    .await;
    assert_eq!(bearer.status, 200);
    let api = get(&h, "/_oceancode/sessions", &[("cookie", &cookie_of(&h))]).await;
    assert_eq!(api.status, 401);
    // Without its trailing slash the cookie path would not match: redirected.
    let bare = get(&h, "/_oceancode/ui", &[]).await;
    assert_eq!(bare.status, 308);
    assert_eq!(bare.headers["location"], "/_oceancode/ui/");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_refuses_other_hosts_origins_and_writes() {
    let (h, id) = recorded(1).await;
    let c = cookie_of(&h);
    let ok = get(
        &h,
        "/_oceancode/ui/",
        &[("cookie", &c), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(ok.status, 200);
    let host = get(
        &h,
        "/_oceancode/ui/",
        &[("cookie", &c), ("host", "attacker.example")],
    )
    .await;
    assert_eq!(host.status, 403, "DNS rebinding: {}", host.text());
    let origin = get(
        &h,
        "/_oceancode/ui/",
        &[("cookie", &c), ("origin", "http://attacker.example")],
    )
    .await;
    assert_eq!(origin.status, 403);
    let site = get(
        &h,
        "/_oceancode/ui/",
        &[("cookie", &c), ("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(site.status, 403);
    // A cross-site page cannot even hand a token over.
    let token = h.admin_token();
    let handed = get(
        &h,
        &format!("/_oceancode/ui/?token={token}"),
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(handed.status, 403);
    for m in [Method::POST, Method::PUT, Method::DELETE] {
        let w = get_method(
            &h,
            m.clone(),
            &format!("/_oceancode/ui/s/{id}"),
            &[("cookie", &c)],
        )
        .await;
        assert_eq!(w.status, 405, "{m}");
        assert_eq!(w.headers["allow"], "GET, HEAD");
    }
    let head = get_method(&h, Method::HEAD, "/_oceancode/ui/", &[("cookie", &c)]).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_content_is_escaped_under_a_policy_without_inline_script() {
    let (h, id) = recorded(2).await;
    let c = cookie_of(&h);
    for path in [
        format!("/_oceancode/ui/s/{id}"),
        format!("/_oceancode/ui/s/{id}?view=model"),
        "/_oceancode/ui/search?q=onerror".to_string(),
    ] {
        let page = get(&h, &path, &[("cookie", &c)]).await;
        assert_eq!(page.status, 200, "{path}");
        let csp = page.headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        assert_eq!(page.headers["x-content-type-options"], "nosniff");
        let text = page.text();
        assert!(!text.contains("<script>alert"), "{path}: raw script");
        assert!(!text.contains("<img src=x"), "{path}: raw img");
        let escaped = if path.contains("search") {
            "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;&lt;img src=x [onerror]=alert(1)&gt;"
        } else {
            "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
        };
        assert!(text.contains(escaped), "{path}: {text}");
        // Only the viewer's own script and the chart's JSON data.
        let scripts: Vec<&str> = text
            .match_indices("<script")
            .map(|(i, _)| &text[i..i + 60.min(text.len() - i)])
            .collect();
        for s in &scripts {
            assert!(
                s.starts_with("<script src=\"/_oceancode/ui/assets/ui.js\"")
                    || s.starts_with("<script type=\"application/json\" id=\"chart-data\">"),
                "{path}: {s}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_page_has_the_chart_the_cuts_and_both_views() {
    let (h, id) = recorded(14).await;
    let c = cookie_of(&h);
    let store = h.proxy().app.store.clone().unwrap();
    let steps = oceancode_ledger::store::LedgerRead::steps(&store, &id).unwrap();
    let cuts = oceancode_ledger::store::LedgerRead::cuts(&store, &id).unwrap();
    assert_eq!(steps.len(), 14);
    assert!(
        !cuts.is_empty(),
        "a 20k line over 14 steps of ~4k tokens cuts"
    );

    let full = get(&h, &format!("/_oceancode/ui/s/{id}"), &[("cookie", &c)])
        .await
        .text();
    assert_eq!(
        full.matches("<circle class=\"pt\"").count(),
        14,
        "one point per step"
    );
    assert_eq!(
        full.matches("<line class=\"cut\"").count(),
        cuts.len(),
        "one marker per cut"
    );
    assert!(full.contains(&format!("data-steps=\"14\" data-cuts=\"{}\"", cuts.len())));
    assert!(full.contains("class=\"tideline\""), "the line is drawn");
    let rows = oceancode_ledger::store::LedgerRead::session_rows(&store, &id, true).unwrap();
    assert_eq!(
        full.matches("<li class=\"row").count(),
        rows.len(),
        "every row in the full view"
    );
    assert!(
        full.contains("class=\"row out"),
        "what left the window is dimmed"
    );
    assert!(full.contains("left the window"));
    // The latest cut's marker links to the stub.
    assert!(full.contains(&format!("href=\"/_oceancode/ui/s/{id}?view=model#stub\"")));

    let model = get(
        &h,
        &format!("/_oceancode/ui/s/{id}?view=model"),
        &[("cookie", &c)],
    )
    .await
    .text();
    assert!(
        model.contains("id=\"stub\""),
        "the model view opens with the stub"
    );
    assert!(model
        .contains("[Earlier content of this session is past the tideline: every row up to seq"));
    assert!(
        !model.contains("class=\"row out"),
        "nothing dimmed: only what was sent"
    );
    // What the fake upstream got last is what the model view lists.
    let last = h
        .fake
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path.starts_with("/v1/messages"))
        .unwrap();
    let sent = last.json().unwrap()["messages"].as_array().unwrap().len();
    assert_eq!(
        model.matches("<li class=\"row").count(),
        sent,
        "model view = the last request's messages"
    );
    let stub_upto = oceancode_tests::stub_seq(&last.json().unwrap()["messages"][0]).unwrap();
    assert!(model.contains(&format!("the window starts after seq {stub_upto}")));
    // The ask is pinned after the stub; the first answer left.
    assert!(model.contains("id=\"r-1\""), "the newest ask is never cut");
    assert!(
        !model.contains("id=\"r-2\""),
        "the first answer left the window"
    );
    assert!(full.contains("id=\"r-2\""));

    // The cuts table, SESSION.md, the exports.
    assert!(full.contains("id=\"cuts\""));
    let md = get(
        &h,
        &format!("/_oceancode/ui/s/{id}/export.md"),
        &[("cookie", &c)],
    )
    .await;
    assert_eq!(md.status, 200);
    assert!(md.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment;"));
    assert!(md.text().contains("zephyrword"));
    let atif = get(
        &h,
        &format!("/_oceancode/ui/s/{id}/export.atif.json"),
        &[("cookie", &c)],
    )
    .await;
    assert_eq!(atif.status, 200);
    assert!(atif.json().is_object());

    // Live: the stamp moves with a new step.
    let live = get(
        &h,
        &format!("/_oceancode/ui/s/{id}/live"),
        &[("cookie", &c)],
    )
    .await
    .json();
    assert_eq!(live["steps"], 14);
    assert!(full.contains(&format!(
        "data-stamp=\"{}\"",
        live["stamp"].as_str().unwrap()
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_finds_a_word_and_links_to_its_row() {
    let (h, id) = recorded(2).await;
    let c = cookie_of(&h);
    let page = get(&h, "/_oceancode/ui/search?q=zephyrword", &[("cookie", &c)]).await;
    assert_eq!(page.status, 200);
    let text = page.text();
    let link = format!("href=\"/_oceancode/ui/s/{id}?seq=");
    let at = text.find(&link).expect("a hit links into the session");
    let rest = &text[at + link.len()..];
    let seq: u64 = rest[..rest.find('#').unwrap()].parse().unwrap();
    assert!(rest.starts_with(&format!("{seq}#r-{seq}\"")));
    let target = get(
        &h,
        &format!("/_oceancode/ui/s/{id}?seq={seq}"),
        &[("cookie", &c)],
    )
    .await
    .text();
    assert!(target.contains(&format!("id=\"r-{seq}\"")));
    let none = get(
        &h,
        "/_oceancode/ui/search?q=nosuchwordanywhere",
        &[("cookie", &c)],
    )
    .await
    .text();
    assert!(none.contains("0 rows hold every word"));
    let missing = get(&h, "/_oceancode/ui/s/no-such-session", &[("cookie", &c)]).await;
    assert_eq!(missing.status, 404);
}
