//! The OTLP exporter's HTTP client: the proxy's own hyper + rustls stack
//! (ring, webpki roots; no OpenSSL), each export bounded in time.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use std::time::Duration;

/// Most bytes of a collector's answer read.
const MAX_ANSWER: usize = 1 << 20;

/// A pooled client for the collector.
#[derive(Clone)]
pub(super) struct HyperClient {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for HyperClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HyperClient")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HyperClient {
    pub(super) fn new(timeout: Duration) -> Result<Self, rustls::Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(HyperClient { client, timeout })
    }
}

#[async_trait::async_trait]
impl HttpClient for HyperClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let req = http::Request::from_parts(parts, Full::new(body));
        let exchange = async {
            let resp = self.client.request(req).await?;
            let (head, body) = resp.into_parts();
            let bytes = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(head, bytes))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err("the collector did not answer in time".into()),
        }
    }
}
