//! Proxy-made errors, answered in the provider's own error envelope so the
//! client's SDK surfaces them as its usual typed exceptions.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use serde::Serialize;

/// Errors a response body can end with (upstream failure, idle timeout).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type the proxy answers with.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Which envelope to use for an error: the provider's
/// ([`oceancode_window::dialect::Provider`], `Envelope::from(dialect)`).
pub use oceancode_window::dialect::Provider as Envelope;

/// A failure the proxy itself must answer.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The upstream could not be reached (connect, TLS, reset before headers).
    #[error("oceancode-proxy could not reach the upstream {upstream}: {reason}")]
    Unreachable {
        /// Upstream base URL.
        upstream: String,
        /// What failed.
        reason: String,
    },
    /// The upstream did not answer in time.
    #[error("oceancode-proxy timed out after {secs}s waiting for the upstream {upstream}")]
    Timeout {
        /// Upstream base URL.
        upstream: String,
        /// Seconds waited.
        secs: u64,
    },
    /// The request body is larger than `limits.max_body_bytes`.
    #[error(
        "request body exceeds oceancode-proxy's limit of {limit} bytes (limits.max_body_bytes)"
    )]
    BodyTooLarge {
        /// Configured limit.
        limit: u64,
    },
    /// The client's request could not be read.
    #[error("oceancode-proxy could not read the request body: {0}")]
    BadRequestBody(String),
    /// The upstream URL or the request target is not usable.
    #[error("oceancode-proxy: {0}")]
    BadTarget(String),
    /// A session name the request declares breaks the naming rule.
    #[error("oceancode-proxy: {0}")]
    BadSessionName(#[from] crate::identity::NameError),
    /// A WebSocket upgrade on a provider route: the proxy records and windows
    /// HTTP requests only. 426 makes a client that prefers WebSockets (Codex
    /// with its built-in OpenAI provider) fall back to HTTPS at once.
    #[error("oceancode-proxy does not carry model requests over WebSocket (they could not be recorded); use HTTPS")]
    WebSocket,
    /// The request body did not arrive in time (`limits.body_read_timeout_ms`).
    #[error("oceancode-proxy: the request body did not arrive within {secs}s (limits.body_read_timeout_ms)")]
    BodyTimeout {
        /// Seconds waited.
        secs: u64,
    },
    /// Request bodies in flight already hold `limits.max_bodies_in_flight_bytes`.
    #[error("oceancode-proxy is busy: request bodies in flight hold {limit} bytes (limits.max_bodies_in_flight_bytes); retry shortly")]
    Busy {
        /// Configured budget.
        limit: u64,
    },
    /// The request is refused by the access rules (Host, Origin, remote use).
    #[error("oceancode-proxy refused the request: {0}")]
    Forbidden(String),
    /// An admin route without the right admin token.
    #[error("oceancode-proxy: the admin API needs the admin token (Authorization: Bearer <token>; the token is in <data dir>/admin-token)")]
    Unauthorized,
    /// An admin write whose body is not declared as JSON.
    #[error("oceancode-proxy: admin writes need Content-Type: application/json")]
    NotJson,
    /// The session reached a bound of `limits.session` (`--max-spend`,
    /// `--max-steps`, `--max-time`), with `x-should-retry: false`: in the
    /// Anthropic envelope a 402 `billing_error` (Claude Code sends a 400
    /// `invalid_request_error` again five times, a 402 once), in the OpenAI
    /// one a 400 `invalid_request_error` (Codex retries other 4xx). What
    /// each client stops on at once, no compaction; see docs/operations.md,
    /// "Session limits".
    #[error("{}", .0.message())]
    LimitReached(LimitHit),
    /// With the recall tool on, an answer the proxy could not read whole
    /// (longer than it holds, or compressed): not relayed, since it may
    /// hold the proxy's internal tool call.
    #[error("oceancode-proxy could not read the model's answer whole, so it was not relayed (the recall tool is on): {0}")]
    RecallUnreadable(String),
}

impl ProxyError {
    /// HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Unreachable { .. } | ProxyError::RecallUnreadable(_) => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BadRequestBody(_)
            | ProxyError::BadTarget(_)
            | ProxyError::BadSessionName(_)
            | ProxyError::LimitReached(_) => StatusCode::BAD_REQUEST,
            ProxyError::WebSocket => StatusCode::UPGRADE_REQUIRED,
            ProxyError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Forbidden(_) => StatusCode::FORBIDDEN,
            ProxyError::Unauthorized => StatusCode::UNAUTHORIZED,
            ProxyError::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    fn kinds(&self) -> (&'static str, &'static str) {
        // (anthropic error.type, openai error.code)
        match self {
            ProxyError::Unreachable { .. } => ("api_error", "upstream_unreachable"),
            ProxyError::Timeout { .. } => ("timeout_error", "upstream_timeout"),
            ProxyError::BodyTooLarge { .. } => ("request_too_large", "request_too_large"),
            ProxyError::BadRequestBody(_)
            | ProxyError::BadTarget(_)
            | ProxyError::BadSessionName(_)
            | ProxyError::NotJson => ("invalid_request_error", "invalid_request"),
            ProxyError::WebSocket => ("invalid_request_error", "websocket_unsupported"),
            ProxyError::BodyTimeout { .. } => ("timeout_error", "request_timeout"),
            ProxyError::Busy { .. } => ("overloaded_error", "server_busy"),
            ProxyError::Forbidden(_) => ("permission_error", "forbidden"),
            ProxyError::Unauthorized => ("authentication_error", "unauthorized"),
            ProxyError::LimitReached(_) => ("invalid_request_error", "session_limit_reached"),
            ProxyError::RecallUnreadable(_) => ("api_error", "answer_unreadable"),
        }
    }

    /// The error as a response in the given envelope.
    pub fn into_response(self, env: Envelope) -> Response<ProxyBody> {
        let (mut atype, ocode) = self.kinds();
        let mut status = self.status();
        if matches!(self, ProxyError::LimitReached(_)) && env == Envelope::Anthropic {
            (status, atype) = (StatusCode::PAYMENT_REQUIRED, "billing_error");
        }
        let mut r = error_response(status, env, atype, ocode, &self.to_string());
        if matches!(self, ProxyError::Busy { .. }) {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, ProxyError::LimitReached(_)) {
            // The SDKs (Anthropic, OpenAI) and Claude Code read it before
            // the status: this answer is final.
            r.headers_mut()
                .insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        r
    }
}

/// Build an error response in a provider's envelope.
pub fn error_response(
    status: StatusCode,
    env: Envelope,
    anthropic_type: &str,
    openai_code: &str,
    message: &str,
) -> Response<ProxyBody> {
    let body = env.error_body(status.as_u16(), anthropic_type, openai_code, message);
    let mut resp = json_response(status, body.to_string());
    // Only the proxy's own errors carry the marker (never an answer of the
    // upstream's, nor the proxy's successful answers).
    resp.headers_mut()
        .insert(PROXY_ERROR_HEADER, HeaderValue::from_static("error"));
    resp
}

/// The header the provider SDKs read to decide on a retry.
pub const SHOULD_RETRY: &str = "x-should-retry";

/// The header marking an error the proxy made (`x-oceancode-proxy: error`).
pub const PROXY_ERROR_HEADER: &str = "x-oceancode-proxy";

/// A JSON response with the given body.
pub fn json_response(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A complete body from bytes.
pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_json(r: Response<ProxyBody>) -> serde_json::Value {
        let b = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&b).unwrap()
    }

    #[tokio::test]
    async fn envelopes_match_provider_formats() {
        let e = ProxyError::Unreachable {
            upstream: "http://127.0.0.1:1".into(),
            reason: "connection refused".into(),
        };
        let r = e.into_response(Envelope::Anthropic);
        assert_eq!(r.status(), 502);
        let v = body_json(r).await;
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connection refused"));

        let r = ProxyError::BodyTooLarge { limit: 10 }.into_response(Envelope::OpenAi);
        assert_eq!(r.status(), 413);
        let v = body_json(r).await;
        assert_eq!(v["error"]["code"], "request_too_large");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}

// What a `limits.session` refusal says (`crate::sessions::Budget` decides).

/// Which bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// `limits.session.spend_usd`, `--max-spend`.
    Spend,
    /// `limits.session.steps`, `--max-steps`.
    Steps,
    /// `limits.session.time`, `--max-time`.
    Time,
}

impl Limit {
    /// `spend`, `step`, `time`: as the messages name it.
    pub fn noun(self) -> &'static str {
        match self {
            Limit::Spend => "spend",
            Limit::Steps => "step",
            Limit::Time => "time",
        }
    }

    /// The config key and the flag that set it.
    pub fn source(self) -> &'static str {
        match self {
            Limit::Spend => "limits.session.spend_usd, --max-spend",
            Limit::Steps => "limits.session.steps, --max-steps",
            Limit::Time => "limits.session.time, --max-time",
        }
    }
}

/// A session (or the run) that reached a bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitHit {
    /// Which bound.
    pub limit: Limit,
    /// What is charged: the root of the links, `RUN_KEY` under `run`, a
    /// client key for requests of no recorded session.
    pub session: String,
    /// What it used: `$0.0512`, `5 steps`, `30m5s`.
    pub used: String,
    /// The bound: `$0.05`, `5 steps`, `30m`.
    pub cap: String,
    /// The spend was under the cap, but the requests in flight and this
    /// one could pass it: `$0.3000 reserved by 1 request in flight, up to
    /// $0.3000 for this one`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// One budget for the whole run (`run`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub run: bool,
}

impl LimitHit {
    /// `session … reached its spend limit: $0.0512 spent of $0.05 (…)`.
    pub fn describe(&self) -> String {
        let who = if self.run {
            "the run (every session)".to_string()
        } else {
            format!("session {}", self.session)
        };
        let verb = match self.limit {
            Limit::Spend => "spent",
            Limit::Steps => "made",
            Limit::Time => "elapsed",
        };
        match &self.pending {
            Some(p) => format!(
                "{who} would pass its {} limit: {} {verb}, {p}, of {} ({})",
                self.limit.noun(),
                self.used,
                self.cap,
                self.limit.source()
            ),
            None => format!(
                "{who} reached its {} limit: {} {verb} of {} ({})",
                self.limit.noun(),
                self.used,
                self.cap,
                self.limit.source()
            ),
        }
    }

    /// What the refused request's error says.
    pub fn message(&self) -> String {
        let whose = if self.run {
            "the run's"
        } else {
            "this session's"
        };
        format!(
            "oceancode-proxy: {}. The proxy refuses {whose} further requests: the run is over, do not retry.",
            self.describe()
        )
    }
}
