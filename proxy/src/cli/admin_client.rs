//! The one client of a running proxy's admin API (`/_oceancode/…`) that
//! every command uses: base URL, the optional admin token, timeouts, and
//! the JSON answers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use serde_json::Value;
use std::time::Duration;

/// An admin answer: its status and JSON body (`Null` when not JSON).
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: http::StatusCode,
    /// The body as JSON.
    pub json: Value,
}

impl Answer {
    /// The message of an error answer (`error.message`), or `error`.
    pub fn error_message(&self) -> &str {
        self.json
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .unwrap_or("error")
    }
}

/// Why a running proxy gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Nothing answered (connection refused, reset, or no answer in time).
    #[error(
        "no proxy answering at {url} (start one with `oceancode-proxy serve`, or pass --proxy URL)"
    )]
    Unreachable {
        /// The admin URL tried.
        url: String,
    },
    /// The request could not be built (a bad URL).
    #[error("bad proxy URL {url:?}: {reason}")]
    BadUrl {
        /// The admin URL given.
        url: String,
        /// Why it is unusable.
        reason: String,
    },
}

/// A client of one proxy's admin API.
pub struct AdminClient {
    base: String,
    token: Option<String>,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl AdminClient {
    /// A client of the proxy at `url` (`http://host:port`), sending `token`
    /// as `Authorization: Bearer` when given.
    pub fn new(url: &str, token: Option<String>) -> Self {
        AdminClient {
            base: url.trim_end_matches('/').to_string(),
            token,
            http: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
        }
    }

    /// The proxy's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The admin token it sends, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// `GET path`, waiting at most `wait` for the answer head and again for
    /// its body.
    pub async fn get(&self, path: &str, wait: Duration) -> Result<Answer, AdminError> {
        self.send(http::Method::GET, path, None, Some(wait)).await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Answer, AdminError> {
        self.send(http::Method::POST, path, Some(body.to_string()), None)
            .await
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<String>,
        wait: Option<Duration>,
    ) -> Result<Answer, AdminError> {
        let url = format!("{}{path}", self.base);
        let mut req = http::Request::builder().method(method).uri(&url);
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| AdminError::BadUrl {
                url: self.base.clone(),
                reason: e.to_string(),
            })?;
        let unreachable = || AdminError::Unreachable {
            url: self.base.clone(),
        };
        let resp = within(wait, self.http.request(req))
            .await
            .ok_or_else(unreachable)?
            .map_err(|_| unreachable())?;
        let status = resp.status();
        let bytes = within(wait, resp.into_body().collect())
            .await
            .ok_or_else(unreachable)?
            .map_err(|_| unreachable())?
            .to_bytes();
        Ok(Answer {
            status,
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        })
    }
}

/// `f`, or None when `wait` passes first.
async fn within<F: std::future::Future>(wait: Option<Duration>, f: F) -> Option<F::Output> {
    match wait {
        Some(d) => tokio::time::timeout(d, f).await.ok(),
        None => Some(f.await),
    }
}
