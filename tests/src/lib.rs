//! Test harness: a fake upstream, a proxy in-process on loopback port 0 with
//! its ledger in a temp dir, a plain HTTP client, and a "replay" upstream that
//! sends fixed bytes with fixed pauses (for byte-equality and timing tests).
// A test harness: a failed setup should panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use oceancode_fakeup::{FakeConfig, FakeHandle, FakeUpstream};
use oceancode_ledger::store::StoreOptions;
use oceancode_proxy::access::AccessRules;
use oceancode_proxy::app::{FrontConfig, NetLimits};
use oceancode_proxy::runtime::{self, ProxyOptions, Running};
use oceancode_proxy::sessions::{Clock, Settings};
use oceancode_proxy::upstream::UpstreamOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;

/// Path of a file under the workspace's `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fixtures")
        .join(rel)
}

/// Proxy options pointing both upstreams at `upstream`, ledger in `data`.
pub fn options(upstream: &str, data: &Path) -> ProxyOptions {
    ProxyOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        front: FrontConfig {
            anthropic_upstream: upstream.to_string(),
            openai_upstream: upstream.to_string(),
            gemini_upstream: upstream.to_string(),
            max_body_bytes: 64 << 20,
            data_dir: data.to_path_buf(),
            idle_stream_timeout: Duration::from_secs(60),
            net: NetLimits::default(),
            access: AccessRules::default(),
            recall: Default::default(),
        },
        upstream: UpstreamOptions {
            connect_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(30),
            pool_idle_timeout: Duration::from_secs(90),
        },
        sessions: Settings {
            // Off here: the tests that assert retained rows byte for byte
            // predate it; tests/tests/compress.rs turns it on.
            compress: oceancode_config::CompressConfig {
                enabled: false,
                ..Default::default()
            },
            ..Settings::new(data)
        },
        store: Some(StoreOptions::default()),
        limits: oceancode_proxy::sessions::SessionLimits::default(),
        database: None,
        merge: None,
        telemetry: None,
    }
}

/// The sessions' clock of a [`Harness`]: the wall clock plus what
/// [`TestClock::advance`] moved it on, so a test of the live window or the
/// time limit lets time pass without waiting for it.
#[derive(Clone, Default)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// The clock for [`Settings::clock`].
    pub fn clock(&self) -> Clock {
        let ahead = self.0.clone();
        Clock::from_fn(move || oceancode_ledger::time::now_ms() + ahead.load(Ordering::SeqCst))
    }

    /// Move the clock on by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_millis() as i64, Ordering::SeqCst);
    }
}

/// A proxy in front of a fake upstream.
pub struct Harness {
    /// The fake upstream.
    pub fake: FakeHandle,
    /// The clock the proxy's sessions read (unless a test's options replace it).
    pub clock: TestClock,
    /// The proxy.
    pub proxy: Option<Running>,
    /// The ledger's data dir.
    pub data: TempDir,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

/// A complete response.
#[derive(Debug)]
pub struct Got {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Bytes,
}

impl Got {
    /// Body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    /// Body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A plain HTTP/1.1 client.
pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

impl Harness {
    /// Fake upstream with `fake`, proxy with default options changed by `tweak`.
    pub async fn start(fake: FakeConfig, tweak: impl FnOnce(&mut ProxyOptions)) -> Harness {
        let fake = FakeUpstream::start(fake).await.expect("fake upstream");
        let data = tempfile::tempdir().expect("tempdir");
        let clock = TestClock::default();
        let mut opts = options(&fake.url(), data.path());
        opts.sessions.clock = clock.clock();
        tweak(&mut opts);
        let proxy = runtime::start(opts).await.expect("proxy starts");
        Harness {
            fake,
            clock,
            proxy: Some(proxy),
            data,
            client: client(),
        }
    }

    /// The proxy.
    pub fn proxy(&self) -> &Running {
        self.proxy.as_ref().expect("proxy running")
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        self.proxy().url()
    }

    /// POST through the proxy and read the whole answer.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Got {
        let resp = self
            .send(&self.url(), http::Method::POST, path, headers, body.into())
            .await;
        collect(resp).await
    }

    /// Send a request to `base` and return the streaming response. Admin
    /// paths (`/_oceancode/…`, `/metrics`) get the admin token unless
    /// `headers` name an `authorization` of their own.
    pub async fn send(
        &self,
        base: &str,
        method: http::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Response<Incoming> {
        let admin = path.starts_with("/_oceancode/") || path.starts_with("/metrics");
        let own_auth = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{base}{path}"));
        if admin && !own_auth {
            b = b.header("authorization", format!("Bearer {}", self.admin_token()));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            b = b.header("content-type", "application/json");
        }
        self.client
            .request(b.body(Full::new(body)).expect("request"))
            .await
            .expect("proxy answers")
    }

    /// The running proxy's admin token.
    pub fn admin_token(&self) -> String {
        self.proxy().app.admin_token.clone()
    }

    /// GET a JSON admin endpoint.
    pub async fn admin(&self, path: &str) -> serde_json::Value {
        collect(
            self.send(&self.url(), http::Method::GET, path, &[], Bytes::new())
                .await,
        )
        .await
        .json()
    }

    /// The proxy's `/metrics` text.
    pub async fn metrics(&self) -> String {
        collect(
            self.send(
                &self.url(),
                http::Method::GET,
                "/metrics",
                &[],
                Bytes::new(),
            )
            .await,
        )
        .await
        .text()
    }

    /// The requests the fake upstream received on paths that start with
    /// `prefix`, in order.
    pub fn requests_to(&self, prefix: &str) -> Vec<oceancode_fakeup::Recorded> {
        self.fake
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix))
            .collect()
    }

    /// Wait until every ledger write so far is committed.
    pub async fn settle(&self) {
        if let Some(s) = &self.proxy().app.store {
            s.settle().await.expect("settle");
        }
    }

    /// Stop the proxy (drains the ledger).
    pub async fn stop(&mut self) {
        if let Some(p) = self.proxy.take() {
            p.shutdown().await;
        }
    }

    /// Stop the proxy and start a new one on the same ledger and fake
    /// upstream (default options changed by `tweak`): a restart. The new
    /// proxy listens on another port; [`Harness::url`] follows it.
    pub async fn restart(&mut self, tweak: impl FnOnce(&mut ProxyOptions)) {
        self.stop().await;
        let mut opts = options(&self.fake.url(), self.data.path());
        opts.sessions.clock = self.clock.clock();
        tweak(&mut opts);
        self.proxy = Some(runtime::start(opts).await.expect("proxy restarts"));
    }
}

/// Read a whole response.
pub async fn collect(resp: Response<Incoming>) -> Got {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Got {
        status,
        headers,
        body,
    }
}

/// An upstream that answers every request with the same status, headers and
/// body chunks, pausing `pause` before each chunk.
pub struct Replay {
    /// Its address.
    pub addr: SocketAddr,
    _task: tokio::task::JoinHandle<()>,
}

impl Replay {
    /// Start a replay upstream.
    pub async fn start(
        status: u16,
        headers: Vec<(&'static str, String)>,
        chunks: Vec<(Duration, Bytes)>,
    ) -> Replay {
        Self::start_with_head_delay(Duration::ZERO, status, headers, chunks).await
    }

    /// Start a replay upstream that waits `head_delay` before its response head.
    pub async fn start_with_head_delay(
        head_delay: Duration,
        status: u16,
        headers: Vec<(&'static str, String)>,
        chunks: Vec<(Duration, Bytes)>,
    ) -> Replay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let chunks = Arc::new(chunks);
        let headers = Arc::new(headers);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let chunks = chunks.clone();
                let headers = headers.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let chunks = chunks.clone();
                        let headers = headers.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            tokio::time::sleep(head_delay).await;
                            let (tx, rx) = tokio::sync::mpsc::channel::<
                                Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
                            >(4);
                            tokio::spawn(async move {
                                for (pause, c) in chunks.iter() {
                                    tokio::time::sleep(*pause).await;
                                    if tx
                                        .send(Ok(hyper::body::Frame::data(c.clone())))
                                        .await
                                        .is_err()
                                    {
                                        return;
                                    }
                                }
                            });
                            let body = http_body_util::StreamBody::new(tokio_stream_from(rx));
                            let mut resp = Response::builder().status(status);
                            for (k, v) in headers.iter() {
                                resp = resp.header(*k, v.as_str());
                            }
                            Ok::<_, std::convert::Infallible>(resp.body(body).expect("response"))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Replay { addr, _task: task }
    }

    /// `http://addr`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core_stream::Stream<Item = T> {
    futures_core_stream::poll_fn_stream(move |cx| rx.poll_recv(cx))
}

/// A minimal `Stream` over a poll function (keeps the harness free of extra deps).
pub mod futures_core_stream {
    pub use futures_util::Stream;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Stream from a poll function.
    pub struct PollFn<F>(F);

    impl<T, F: FnMut(&mut Context<'_>) -> Poll<Option<T>> + Unpin> Stream for PollFn<F> {
        type Item = T;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            (self.0)(cx)
        }
    }

    /// Build a [`PollFn`].
    pub fn poll_fn_stream<T, F: FnMut(&mut Context<'_>) -> Poll<Option<T>> + Unpin>(
        f: F,
    ) -> PollFn<F> {
        PollFn(f)
    }
}

/// One captured request: path, headers and exact body bytes.
pub struct Captured {
    /// Path with query.
    pub path: String,
    /// Headers kept from the capture (no credentials were captured).
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Bytes,
    /// Status the capture's server answered.
    pub status: u16,
}

/// The captured requests of `fixtures/captures/<run>`, in order.
pub fn captured(run: &str) -> Vec<Captured> {
    let dir = fixture(&format!("captures/{run}"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".meta.json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let stem = n.trim_end_matches(".meta.json");
            let meta: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join(&n)).expect("meta"))
                    .expect("meta json");
            let body = std::fs::read(dir.join(format!("{stem}.body"))).expect("body");
            Captured {
                path: meta["path"].as_str().unwrap_or("/").to_string(),
                headers: meta["headers"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|kv| {
                                Some((kv[0].as_str()?.to_string(), kv[1].as_str()?.to_string()))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                body: Bytes::from(body),
                status: meta["status"].as_u64().unwrap_or(0) as u16,
            }
        })
        .collect()
}

impl Harness {
    /// Replay a captured request through the proxy.
    pub async fn replay(&self, c: &Captured) -> Got {
        let headers: Vec<(&str, &str)> = c
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        collect(
            self.send(
                &self.url(),
                http::Method::POST,
                &c.path,
                &headers,
                c.body.clone(),
            )
            .await,
        )
        .await
    }

    /// The ledger store of the running proxy.
    pub fn store(&self) -> &oceancode_ledger::store::Store {
        self.proxy()
            .app
            .store
            .as_deref()
            .and_then(|s| (s as &dyn std::any::Any).downcast_ref())
            .expect("ledger on (SQLite)")
    }
}

/// ~1.7k tokens of varied text: one tool result of a long test session.
pub fn tool_output(step: usize) -> String {
    tool_lines(step, 110, 1)
}

/// Append an Anthropic answer (its `content`) and the result of its tool
/// call to a client-side `history`, as an agent would.
pub fn push_tool_step(
    history: &mut Vec<serde_json::Value>,
    content: &serde_json::Value,
    result: &str,
) {
    let id = content
        .as_array()
        .and_then(|a| a.iter().find(|b| b["type"] == "tool_use"))
        .and_then(|b| b["id"].as_str())
        .expect("the answer makes a tool call")
        .to_string();
    history.push(serde_json::json!({"role": "assistant", "content": content}));
    history.push(serde_json::json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": result}]}));
}

/// `lines` lines of varied tool output (~14 tokens a line) for `step`;
/// `salt` varies the hashes (another agent's checkout).
pub fn tool_lines(step: usize, lines: usize, salt: usize) -> String {
    let mut s = String::with_capacity(lines * 72);
    for i in 0..lines {
        s.push_str(&format!(
            "step {step} line {i}: src/mod_{}/file_{}.rs ok {} bytes, hash {:08x}\n",
            i % 7,
            (step * 31 + i) % 97,
            step * 13 + i,
            (salt * step * 2654435761 + i * 40503) as u32
        ));
    }
    s
}

/// The last seq a stub message names, if `msg` is a stub (Anthropic shape).
pub fn stub_seq(msg: &serde_json::Value) -> Option<u64> {
    let text = msg["content"][0]["text"].as_str()?;
    let rest = text.strip_prefix(
        "[Earlier content of this session is past the tideline: every row up to seq ",
    )?;
    rest.split_whitespace().next()?.parse().ok()
}

/// What the in-band recall tool's tests and its numbers example share
/// (issue 16): a proxy with the tool in front of a scripted fake, each
/// dialect's path and messages, and what the fake received.
pub mod recall {
    use super::Harness;
    use oceancode_fakeup::{FakeConfig, Recorded, Script};
    use oceancode_proxy::dialect::{conv_key, ParsedBody};
    use oceancode_proxy::recall_tool::RecallTool;
    use oceancode_window::Dialect;

    /// A proxy running the tool as `tool` says, in front of a fake
    /// answering with `script`.
    pub async fn harness(script: Script, tool: RecallTool) -> Harness {
        Harness::start(
            FakeConfig {
                script,
                ..FakeConfig::default()
            },
            move |o| o.front.recall = tool,
        )
        .await
    }

    /// The dialect's model path.
    pub fn path(d: Dialect) -> &'static str {
        match d {
            Dialect::Anthropic => "/v1/messages",
            Dialect::OpenaiChat => "/v1/chat/completions",
            Dialect::OpenaiResponses => "/v1/responses",
            Dialect::Gemini => "/v1beta/models/gemini-2.5-flash:generateContent",
        }
    }

    /// A user / an assistant text message of the dialect (the kit's).
    pub use oceancode_testkit::{assistant, user};

    /// The model requests (not count_tokens) of dialect `d` the fake received.
    pub fn model_requests(h: &Harness, d: Dialect) -> Vec<Recorded> {
        h.fake
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with(path(d)) && !r.path.contains("count_tokens"))
            .collect()
    }

    /// The raw `tools` member and conversation of a request the fake received.
    pub fn split(d: Dialect, r: &Recorded) -> (String, Vec<String>) {
        let p = ParsedBody::parse(&r.body, conv_key(d)).expect("a request the proxy sent parses");
        (
            p.get("tools").unwrap_or("").to_string(),
            p.messages.iter().map(|m| m.to_string()).collect(),
        )
    }
}

#[cfg(test)]
mod coverage {
    /// `autotests = false`: a file under `tests/tests/` runs only if it is
    /// a `[[test]]` of `Cargo.toml` or a `#[path]` module of `suite.rs`. A
    /// file added to neither would silently never run; this fails instead.
    #[test]
    fn every_test_file_is_a_test_binary_or_a_suite_module() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let toml = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let suite = std::fs::read_to_string(root.join("tests/suite.rs")).unwrap();
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(root.join("tests")).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if !name.ends_with(".rs") {
                continue;
            }
            let binary = toml.contains(&format!("path = \"tests/{name}\""));
            let module = suite.contains(&format!("#[path = \"{name}\"]"));
            if binary == module {
                missing.push(format!("{name} (binary: {binary}, suite module: {module})"));
            }
        }
        assert!(
            missing.is_empty(),
            "each file of tests/tests/ must be exactly one of a [[test]] in tests/Cargo.toml \
             or a #[path] module of tests/suite.rs: {missing:?}"
        );
    }
}
