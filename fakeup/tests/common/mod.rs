//! Test helpers: a plain hyper client that records when each body frame arrived.
#![allow(dead_code)]

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn h2c_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub version: http::Version,
    pub sent_at: Instant,
    pub head_at: Instant,
    pub frames: Vec<(Instant, Bytes)>,
    pub body_error: bool,
}

impl Resp {
    pub fn body(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body()).expect("utf8 body")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body()).expect("json body")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Parsed SSE events: (event name, data JSON; `[DONE]` as a JSON string).
    pub fn events(&self) -> Vec<(Option<String>, Value)> {
        parse_sse(&self.text())
    }

    pub fn event_names(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .map(|(n, d)| {
                n.or_else(|| d.get("type").and_then(Value::as_str).map(String::from))
                    .unwrap_or_else(|| "data".into())
            })
            .collect()
    }
}

pub fn parse_sse(text: &str) -> Vec<(Option<String>, Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            let v = if data == "[DONE]" {
                Value::String(data)
            } else {
                serde_json::from_str(&data).unwrap_or_else(|e| panic!("bad data {data}: {e}"))
            };
            (name, v)
        })
        .collect()
}

pub async fn send_with(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let sent_at = Instant::now();
    let resp = client.request(req).await.expect("response");
    let head_at = Instant::now();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let version = resp.version();
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    let mut body_error = false;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    frames.push((Instant::now(), d));
                }
            }
            Err(_) => {
                body_error = true;
                break;
            }
        }
    }
    Resp {
        status,
        headers,
        version,
        sent_at,
        head_at,
        frames,
        body_error,
    }
}

pub async fn post(url: &str, path: &str, body: &Value) -> Resp {
    send_with(
        &client(),
        Method::POST,
        &format!("{url}{path}"),
        &[],
        serde_json::to_vec(body).expect("ser"),
    )
    .await
}

pub fn user_msg(text: &str) -> Value {
    serde_json::json!({"role": "user", "content": text})
}
