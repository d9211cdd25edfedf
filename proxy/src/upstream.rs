//! The upstream client: hyper-util's pooled client over rustls (HTTP/1.1 and
//! HTTP/2 by ALPN; plain http for loopback test upstreams), with connect and
//! response-header timeouts mapped to [`ProxyError`]s and idle pooled
//! connections closed after `limits.upstream_pool_idle_timeout_ms`.

use crate::error::ProxyError;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, Uri};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// Request body type sent upstream.
pub type UpBody = BoxBody<Bytes, hyper::Error>;

/// Timeouts and pool settings.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamOptions {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Time allowed until the response headers arrive.
    pub header_timeout: Duration,
    /// Idle pooled connections are closed after this.
    pub pool_idle_timeout: Duration,
}

impl UpstreamOptions {
    /// From the config's `limits`.
    pub fn from_config(l: &oceancode_config::LimitsConfig) -> Self {
        UpstreamOptions {
            connect_timeout: l.connect_timeout(),
            header_timeout: l.response_header_timeout(),
            pool_idle_timeout: l.upstream_pool_idle_timeout(),
        }
    }
}

/// A pooled HTTPS/HTTP client.
#[derive(Clone)]
pub struct Upstream {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, UpBody>,
    opts: UpstreamOptions,
}

impl Upstream {
    /// Build the client (rustls with the webpki roots, ring provider).
    pub fn new(opts: UpstreamOptions) -> Result<Self, ProxyError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(opts.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| ProxyError::BadTarget(format!("TLS setup failed: {e}")))?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        // The pool's idle timeout needs a timer: without one it never fires
        // and idle upstream connections stay open for good.
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(opts.pool_idle_timeout)
            .pool_max_idle_per_host(256)
            .build(https);
        Ok(Upstream { client, opts })
    }

    /// Send a request; `base` names the upstream in errors.
    pub async fn send(
        &self,
        req: Request<UpBody>,
        base: &str,
    ) -> Result<Response<Incoming>, ProxyError> {
        let secs = self.opts.header_timeout.as_secs();
        match tokio::time::timeout(self.opts.header_timeout, self.client.request(req)).await {
            Err(_) => Err(ProxyError::Timeout {
                upstream: base.to_string(),
                secs,
            }),
            Ok(Err(e)) => Err(ProxyError::Unreachable {
                upstream: base.to_string(),
                reason: error_chain(&e),
            }),
            Ok(Ok(r)) => Ok(r),
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The upstream URI for a base URL plus a path-and-query.
pub fn join(base: &str, path_and_query: &str) -> Result<Uri, ProxyError> {
    let base = base.trim_end_matches('/');
    format!("{base}{path_and_query}")
        .parse::<Uri>()
        .map_err(|e| {
            let shown = oceancode_config::redact_url(&format!("{base}{path_and_query}"));
            ProxyError::BadTarget(format!("bad upstream URL {shown}: {e}"))
        })
}

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Copy end-to-end headers (RFC 9110 §7.6.1: drop hop-by-hop ones and any
/// named in `Connection`), plus extra names to drop.
pub fn end_to_end(src: &HeaderMap, extra_drop: &[&str]) -> HeaderMap {
    let listed: Vec<String> = src
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(src.len());
    for (name, value) in src {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || extra_drop.contains(&n) || listed.iter().any(|l| l == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// Header names the proxy consumes and never forwards.
pub const OWN_HEADERS: [&str; 1] = ["x-oceancode-session"];

/// Is this header a credential (never logged or recorded)?
pub fn is_secret(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "authorization" | "x-api-key" | "proxy-authorization" | "cookie" | "api-key"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_are_dropped_and_auth_kept() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, x-foo"));
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("x-api-key", HeaderValue::from_static("sk-ant-secret"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("x-oceancode-session", HeaderValue::from_static("s"));
        h.append("anthropic-beta", HeaderValue::from_static("a"));
        h.append("anthropic-beta", HeaderValue::from_static("b"));
        let out = end_to_end(&h, &OWN_HEADERS);
        assert!(out.get("connection").is_none());
        assert!(out.get("x-foo").is_none());
        assert!(out.get("keep-alive").is_none());
        assert!(out.get("transfer-encoding").is_none());
        assert!(out.get("x-oceancode-session").is_none());
        assert_eq!(out.get("x-api-key").unwrap(), "sk-ant-secret");
        assert_eq!(out.get("authorization").unwrap(), "Bearer t");
        assert_eq!(out.get_all("anthropic-beta").iter().count(), 2);
    }

    #[test]
    fn join_keeps_query() {
        assert_eq!(
            join("http://127.0.0.1:9/", "/v1/messages?beta=true")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:9/v1/messages?beta=true"
        );
    }
}
