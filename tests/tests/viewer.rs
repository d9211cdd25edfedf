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
    let (h, id, _) = recorded_with(steps, |_| {}).await;
    (h, id)
}

/// [`recorded`] with more options set; also returns the client's history.
async fn recorded_with(
    steps: usize,
    tweak: impl FnOnce(&mut oceancode_proxy::runtime::ProxyOptions),
) -> (Harness, String, Vec<Value>) {
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
        tweak(o);
    })
    .await;
    let mut history: Vec<Value> = vec![json!({"role":"user","content": XSS})];
    for step in 0..steps {
        one_more_step(&h, &mut history, step).await;
    }
    h.settle().await;
    let id = h.admin("/_oceancode/sessions").await["sessions"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    (h, id, history)
}

/// One tool step of the `viewer-test` session: `history` goes through the
/// proxy; the answer and the tool's output are appended to it.
async fn one_more_step(h: &Harness, history: &mut Vec<Value>, step: usize) {
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
    push_tool_step(history, &content, &tool_output(step));
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

/// The viewer's cookie (`oceancode_ui=…`) of a fresh hand-over of the
/// admin token.
async fn cookie_of(h: &Harness) -> String {
    let over = get(
        h,
        &format!("/_oceancode/ui/?token={}", h.admin_token()),
        &[],
    )
    .await;
    assert_eq!(over.status, 303, "{}", over.text());
    let set = over.headers["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

/// GET `path` as the signed-in viewer: with the cookie the hand-over left.
async fn signed_in(h: &Harness, path: &str) -> Got {
    signed_in_with(h, path, &[]).await
}

/// [`signed_in`] with `more` headers after the cookie.
async fn signed_in_with(h: &Harness, path: &str, more: &[(&str, &str)]) -> Got {
    let cookie = cookie_of(h).await;
    let mut headers = vec![("cookie", cookie.as_str())];
    headers.extend_from_slice(more);
    get(h, path, &headers).await
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
    let set = over.headers["set-cookie"].to_str().unwrap().to_string();
    // A viewer session of its own, never the admin token: cookies ignore
    // ports, so any other server on this host receives it (issue 40, item 6).
    let value = set
        .strip_prefix("oceancode_ui=")
        .and_then(|r| r.strip_suffix("; Path=/_oceancode/ui/; HttpOnly; SameSite=Strict"))
        .unwrap_or_else(|| panic!("{set}"));
    assert_ne!(value, token);
    assert!(!value.contains(&token[..16]), "{set}");
    assert_eq!(value.len(), 64, "{set}");
    let cookie = format!("oceancode_ui={value}");
    let page = get(&h, "/_oceancode/ui/?sort=rows", &[("cookie", &cookie)]).await;
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
    let api = signed_in(&h, "/_oceancode/sessions").await;
    assert_eq!(api.status, 401);
    // The token itself is no cookie.
    let as_cookie = get(
        &h,
        "/_oceancode/ui/",
        &[("cookie", &format!("oceancode_ui={token}"))],
    )
    .await;
    assert_eq!(as_cookie.status, 401);
    // Revoked through the admin API: every viewer session ends.
    let revoke = h
        .send(
            &h.url(),
            Method::POST,
            "/_oceancode/viewer/revoke",
            &[
                ("authorization", &format!("Bearer {token}")),
                ("content-type", "application/json"),
            ],
            Bytes::from_static(b"{}"),
        )
        .await;
    let revoke = oceancode_tests::collect(revoke).await;
    assert_eq!(revoke.status, 200, "{}", revoke.text());
    assert!(
        revoke.json()["revoked"].as_u64().unwrap() >= 2,
        "{}",
        revoke.text()
    );
    let after = get(&h, "/_oceancode/ui/", &[("cookie", &cookie)]).await;
    assert_eq!(after.status, 401);
    // A restart ends them too.
    let mut h = h;
    let cookie = cookie_of(&h).await;
    assert_eq!(
        get(&h, "/_oceancode/ui/", &[("cookie", &cookie)])
            .await
            .status,
        200
    );
    h.restart(|_| {}).await;
    assert_eq!(
        get(&h, "/_oceancode/ui/", &[("cookie", &cookie)])
            .await
            .status,
        401
    );
    // Without its trailing slash the cookie path would not match: redirected.
    let bare = get(&h, "/_oceancode/ui", &[]).await;
    assert_eq!(bare.status, 308);
    assert_eq!(bare.headers["location"], "/_oceancode/ui/");
}

/// The page that asks for the token is styled (the embedded assets need no
/// token) and shows the command as code, not between backticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_page_is_styled_and_shows_the_command_as_code() {
    let (h, _) = recorded(1).await;
    let none = get(&h, "/_oceancode/ui/", &[]).await;
    assert_eq!(none.status, 401);
    let page = none.text();
    assert!(page.contains("<code>oceancode-proxy ui</code>"), "{page}");
    assert!(!page.contains('`'), "{page}");
    assert!(page.contains("/_oceancode/ui/assets/ui.css"), "{page}");
    let css = get(&h, "/_oceancode/ui/assets/ui.css", &[]).await;
    assert_eq!(css.status, 200, "{}", css.text());
    assert!(css.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    // Nothing of the ledger is served without it.
    assert_eq!(
        get(&h, "/_oceancode/ui/search?q=zephyrword", &[])
            .await
            .status,
        401
    );
}

/// A session the user named (`x-oceancode-session`) is listed under its
/// name, and the filter finds it by that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_list_shows_and_filters_the_name_the_user_gave() {
    let (h, id) = recorded(1).await;
    let page = signed_in(&h, "/_oceancode/ui/").await.text();
    assert!(
        page.contains("<span class=\"name\">viewer-test</span>"),
        "{page}"
    );
    let page = signed_in(&h, "/_oceancode/ui/?filter=viewer-te")
        .await
        .text();
    assert!(page.contains("1 of 1 sessions"), "{page}");
    assert!(page.contains(&format!("data-session=\"{id}\"")), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_refuses_other_hosts_origins_and_writes() {
    let (h, id) = recorded(1).await;
    let c = cookie_of(&h).await;
    let ok = signed_in_with(&h, "/_oceancode/ui/", &[("sec-fetch-site", "same-origin")]).await;
    assert_eq!(ok.status, 200);
    let host = signed_in_with(&h, "/_oceancode/ui/", &[("host", "attacker.example")]).await;
    assert_eq!(host.status, 403, "DNS rebinding: {}", host.text());
    let origin = signed_in_with(
        &h,
        "/_oceancode/ui/",
        &[("origin", "http://attacker.example")],
    )
    .await;
    assert_eq!(origin.status, 403);
    let site = signed_in_with(&h, "/_oceancode/ui/", &[("sec-fetch-site", "cross-site")]).await;
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
    for path in [
        format!("/_oceancode/ui/s/{id}"),
        format!("/_oceancode/ui/s/{id}?view=model"),
        "/_oceancode/ui/search?q=onerror".to_string(),
    ] {
        let page = signed_in(&h, &path).await;
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
            "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;&lt;img src=x <mark>onerror</mark>=alert(1)&gt;"
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
    let store = h.proxy().app.store.clone().unwrap();
    let steps = oceancode_ledger::store::LedgerRead::steps(store.as_ref(), &id).unwrap();
    let cuts = oceancode_ledger::store::LedgerRead::cuts(store.as_ref(), &id).unwrap();
    assert_eq!(steps.len(), 14);
    assert!(
        !cuts.is_empty(),
        "a 20k line over 14 steps of ~4k tokens cuts"
    );

    let full = signed_in(&h, &format!("/_oceancode/ui/s/{id}"))
        .await
        .text();
    assert_eq!(
        full.matches("<circle class=\"pt").count(),
        14,
        "one point per step"
    );
    // A step whose cut rewrote the cached prefix is marked as a miss.
    assert!(
        full.contains("<circle class=\"pt miss\"") && full.contains("cache miss: cut"),
        "the cut's miss is marked"
    );
    assert_eq!(
        full.matches("<line class=\"cut\"").count(),
        cuts.len(),
        "one marker per cut"
    );
    assert!(full.contains(&format!("data-steps=\"14\" data-cuts=\"{}\"", cuts.len())));
    assert!(full.contains("class=\"tideline\""), "the line is drawn");
    let rows =
        oceancode_ledger::store::LedgerRead::session_rows(store.as_ref(), &id, true).unwrap();
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
    // Each cut's marker links to the stub of the step that made it.
    let cut_steps: Vec<u32> = steps
        .iter()
        .filter(|s| s.detail.sent.as_ref().is_some_and(|w| w.stub.is_some()))
        .map(|s| s.step)
        .collect();
    assert_eq!(cut_steps.len(), cuts.len(), "a new stub at every cut");
    for k in &cut_steps {
        assert!(
            full.contains(&format!(
                "href=\"/_oceancode/ui/s/{id}?view=model&amp;step={k}#stub\""
            )),
            "the marker of the cut at step {k}"
        );
    }

    let model = signed_in(&h, &format!("/_oceancode/ui/s/{id}?view=model"))
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
    let md = signed_in(&h, &format!("/_oceancode/ui/s/{id}/export.md")).await;
    assert_eq!(md.status, 200);
    assert!(md.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment;"));
    assert!(md.text().contains("zephyrword"));
    let atif = signed_in(&h, &format!("/_oceancode/ui/s/{id}/export.atif.json")).await;
    assert_eq!(atif.status, 200);
    assert!(atif.json().is_object());

    // Live: the stamp moves with a new step.
    let live = signed_in(&h, &format!("/_oceancode/ui/s/{id}/live"))
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
    let page = signed_in(&h, "/_oceancode/ui/search?q=zephyrword").await;
    assert_eq!(page.status, 200);
    let text = page.text();
    let link = format!("href=\"/_oceancode/ui/s/{id}?seq=");
    let at = text.find(&link).expect("a hit links into the session");
    let rest = &text[at + link.len()..];
    let seq: u64 = rest[..rest.find('#').unwrap()].parse().unwrap();
    assert!(rest.starts_with(&format!("{seq}#r-{seq}\"")));
    let target = signed_in(&h, &format!("/_oceancode/ui/s/{id}?seq={seq}"))
        .await
        .text();
    assert!(target.contains(&format!("id=\"r-{seq}\"")));
    let none = signed_in(&h, "/_oceancode/ui/search?q=nosuchwordanywhere")
        .await
        .text();
    assert!(none.contains("0 rows hold every word"));
    let missing = signed_in(&h, "/_oceancode/ui/s/no-such-session").await;
    assert_eq!(missing.status, 404);
    // Issue 33.3: a query past the bounds is refused as too broad, at once.
    let q = (0..9)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join("+");
    let broad = signed_in(&h, &format!("/_oceancode/ui/search?q={q}")).await;
    assert_eq!(broad.status, 400);
    assert!(broad.text().contains("query too broad: 9 distinct words"));
    let q = vec!["zephyrword"; 40].join("+");
    let repeated = signed_in(&h, &format!("/_oceancode/ui/search?q={q}")).await;
    assert_eq!(repeated.status, 200, "a repeated word is one word");
    assert!(repeated.text().contains(&link));
}

/// The messages of every request the fake upstream received, in order.
fn received(h: &Harness) -> Vec<Vec<Value>> {
    h.fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/messages"))
        .map(|r| r.json().unwrap()["messages"].as_array().cloned().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_view_is_what_the_upstream_received_on_every_step_with_an_edit_the_state_block_and_compress(
) {
    let steps = 14;
    let (h, id, mut history) = recorded_with(steps, |o| {
        o.sessions.state_tokens = Some(2_000);
        // A 35% block keeps more than the protected zone after a cut (as in
        // tests/tests/compress.rs): older outputs become pointers.
        o.sessions.block = oceancode_config::BlockSpec::PercentOfLine(35.0);
        o.sessions.compress = oceancode_config::CompressConfig {
            enabled: true,
            protect: Some(oceancode_config::BlockSpec::Tokens(3_000)),
            ..Default::default()
        };
    })
    .await;
    // An edit without the file: every tool round but the running one
    // leaves, and a note takes their place.
    let edit = oceancode_tests::collect(
        h.send(
            &h.url(),
            Method::POST,
            "/_oceancode/context",
            &[],
            Bytes::from(
                json!({"session": "viewer-test", "drop": ["t"], "note": "viewer-note: the earlier rounds passed"})
                    .to_string(),
            ),
        )
        .await,
    )
    .await;
    assert_eq!(edit.status, 200, "{}", edit.text());
    let receipt = edit.json()["receipt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(receipt.starts_with("taken"), "{receipt}");
    for step in steps + 1..steps + 3 {
        one_more_step(&h, &mut history, step).await;
    }
    h.settle().await;
    let got = received(&h);
    assert_eq!(got.len(), steps + 2);
    // Every step's model view, message by message, is what the upstream got.
    for (i, want) in got.iter().enumerate() {
        let step = i + 1;
        let sent = signed_in(&h, &format!("/_oceancode/ui/s/{id}/sent.json?step={step}")).await;
        assert_eq!(sent.status, 200, "step {step}: {}", sent.text());
        let v = sent.json();
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), want.len(), "step {step}: message count");
        for (k, (a, b)) in msgs.iter().zip(want).enumerate() {
            assert_eq!(a, b, "step {step}, message {k}");
        }
    }
    // The last step: a stub with the state block, the edit in force, the note.
    let last = got.last().unwrap();
    let stub_text = last[0].to_string();
    assert!(
        stub_text.contains("State at the tideline"),
        "the state block follows the stub: {stub_text}"
    );
    assert!(
        last.iter().any(|m| m
            .to_string()
            .contains("viewer-note: the earlier rounds passed")),
        "the note was sent"
    );
    // Compress sent old tool output as pointers: the model view has them.
    let pointed = |msgs: &[Value]| {
        msgs.iter()
            .filter(|m| m.to_string().contains("oceancode-proxy recall entry"))
            .count()
    };
    let with_pointers = got.iter().filter(|m| pointed(m) > 0).count();
    assert!(with_pointers > 0, "compress pruned something");
    let latest = signed_in(&h, &format!("/_oceancode/ui/s/{id}/sent.json"))
        .await
        .json();
    assert_eq!(latest["step"], steps + 2);
    assert_eq!(latest["edit"], 1, "the edit in force");
    // The page shows the same messages: one item each, in order.
    let page = signed_in(&h, &format!("/_oceancode/ui/s/{id}?view=model"))
        .await
        .text();
    assert_eq!(page.matches("<li class=\"row").count(), last.len());
    assert!(page.contains("state block ·"), "the state block is shown");
    assert!(page.contains("data-src=\"note\""), "the note is shown");
    assert!(page.contains("context edit #1 in force"));
    if pointed(last) > 0 {
        assert!(page.contains("data-src=\"pruned\""), "pointers are shown");
    }
    assert!(page.contains(&format!("step {} of {}", steps + 2, steps + 2)));
    // A step before the edit: what it sent then, not what the latest sent.
    let early = signed_in(&h, &format!("/_oceancode/ui/s/{id}?view=model&step=3"))
        .await
        .text();
    assert_eq!(early.matches("<li class=\"row").count(), got[2].len());
    assert!(early.contains("step 3 of"));
    assert!(!early.contains("data-src=\"note\""));
    // The full view dims what the edit leaves out.
    let full = signed_in(&h, &format!("/_oceancode/ui/s/{id}"))
        .await
        .text();
    assert!(
        full.contains("left out by an edit"),
        "edited rows are marked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_prices_spend_with_the_configured_prices() {
    let configured = oceancode_config::Price {
        input: 300.0,
        output: 1500.0,
        cache_read: 30.0,
        cache_write: 375.0,
    };
    let (h, id, _) = recorded_with(3, move |o| {
        o.limits.pricer = Some(Arc::new(move |_m: &str| Some(configured)));
    })
    .await;
    let store = h.proxy().app.store.clone().unwrap();
    let steps = oceancode_ledger::store::LedgerRead::steps(&*store, &id).unwrap();
    let (want, _) = oceancode_ledger::status::totals(&steps, &|_m: &str| Some(configured));
    let (builtin, _) = oceancode_ledger::status::totals(&steps, &oceancode_proxy::ui::price);
    let want = format!("${:.2}", want.cost_usd);
    assert_ne!(
        want,
        format!("${:.2}", builtin.cost_usd),
        "the prices differ"
    );
    let page = signed_in(&h, &format!("/_oceancode/ui/s/{id}"))
        .await
        .text();
    assert!(
        page.contains(&format!("<dt>spend</dt><dd>{want}</dd>")),
        "{want}: {page}"
    );
    let list = signed_in(&h, "/_oceancode/ui/").await.text();
    assert!(
        list.contains(&format!("<td class=\"n\">{want}</td>")),
        "{want}"
    );
}

/// Issue 40 item 4: the viewer reads `SESSION.md` with no link followed,
/// only a regular file, bounded. A link to a file outside the data dir put
/// that file into the page; a link to `/dev/zero` grew one page view to
/// 3.6 GB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_reads_no_session_page_through_a_link() {
    let (h, id) = recorded(1).await;
    let store = h.proxy().app.store.clone().unwrap();
    let page = store.data_dir().session_md(&id);
    let before = signed_in(&h, &format!("/_oceancode/ui/s/{id}")).await;
    assert_eq!(before.status, 200);
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("notes.md");
    std::fs::write(&secret, "# OUTSIDE-SECRET\n").unwrap();
    for target in [secret.as_path(), std::path::Path::new("/dev/zero")] {
        std::fs::remove_file(&page).unwrap();
        std::os::unix::fs::symlink(target, &page).unwrap();
        let got = signed_in(&h, &format!("/_oceancode/ui/s/{id}")).await;
        assert_eq!(got.status, 200, "{}", target.display());
        let text = got.text();
        assert!(!text.contains("OUTSIDE-SECRET"), "{}", target.display());
        assert!(
            text.len() < before.text().len() + 4096,
            "{}: {} bytes",
            target.display(),
            text.len()
        );
    }
}
