//! OpenTelemetry export: one span per model request (a step), following
//! the GenAI semantic conventions (v1.41.0), with the proxy's own
//! `oceancode.*` attributes, a cut as a span event, and the too-long
//! retries and the recall tool's internal rounds as child spans.
//!
//! Off unless `telemetry.otlp.endpoint` is set ([`Telemetry::off`]: no
//! task, no exporter, every hook one branch). When on, the request path
//! only builds the finished span and hands it to a bounded queue
//! (`try_send`, never waits); one task exports batches over OTLP/HTTP
//! (protobuf). A full queue or a failed export drops spans, counted in
//! `/metrics` (`oceancode_otlp_spans_dropped_total`) and logged at most
//! once a minute. Message content is exported only with the content-capture
//! switch on; request headers (API keys) never.

mod client;
mod span;

pub use span::{Bounds, Child, CutNote, StepFacts, StepTrace, SEMCONV_VERSION};

use oceancode_config::OtlpConfig;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spans sent in one export.
const BATCH: usize = 512;
/// An export not done in this long fails (its spans dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one warning about dropped spans this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Why the export could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The headers variable holds something that is not `key=value,...`.
    #[error("{var}: expected key=value pairs separated by commas ({why})")]
    Headers {
        /// The variable's name (never its value).
        var: String,
        /// What was wrong, without the value.
        why: String,
    },
    /// The exporter could not be built.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// What the export is started with (`telemetry.otlp`).
#[derive(Clone)]
pub struct OtlpOptions {
    /// Where spans are posted (`…/v1/traces`).
    pub traces_url: String,
    /// Headers sent with each export (auth); never logged.
    pub headers: HashMap<String, String>,
    /// Export message content.
    pub capture_content: bool,
    /// Most spans waiting for export.
    pub max_queue: usize,
}

impl std::fmt::Debug for OtlpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The headers hold credentials: their names only.
        let mut names: Vec<&str> = self.headers.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("OtlpOptions")
            .field("traces_url", &self.traces_url)
            .field("headers", &names)
            .field("capture_content", &self.capture_content)
            .field("max_queue", &self.max_queue)
            .finish()
    }
}

impl OtlpOptions {
    /// From the config; None when no endpoint is set. The headers are read
    /// from the variable `headers_env` names, through `env`.
    pub fn from_config(
        c: &OtlpConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TelemetryError> {
        let Some(endpoint) = c.endpoint.as_deref() else {
            return Ok(None);
        };
        let headers = match env(&c.headers_env) {
            Some(v) => parse_headers(&v).map_err(|why| TelemetryError::Headers {
                var: c.headers_env.clone(),
                why,
            })?,
            None => HashMap::new(),
        };
        Ok(Some(OtlpOptions {
            traces_url: traces_url(endpoint),
            headers,
            capture_content: c.capture_content,
            max_queue: c.max_queue.max(1),
        }))
    }
}

/// The traces URL for a collector base URL: `/v1/traces` added unless the
/// URL already ends with it.
pub fn traces_url(endpoint: &str) -> String {
    let e = endpoint.trim_end_matches('/');
    if e.ends_with("/v1/traces") {
        e.to_string()
    } else {
        format!("{e}/v1/traces")
    }
}

/// `key=value,key2=value2` (values may be percent-encoded, as in
/// `OTEL_EXPORTER_OTLP_HEADERS`). Errors never quote a value.
fn parse_headers(v: &str) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for (i, pair) in v.split(',').enumerate() {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((k, val)) = pair.split_once('=') else {
            return Err(format!("pair {} has no '='", i + 1));
        };
        let k = k.trim();
        let val = percent_encoding::percent_decode_str(val.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of {k:?} is not UTF-8"))?;
        if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            return Err(format!("{k:?} is not a header name"));
        }
        if http::HeaderValue::from_str(&val).is_err() {
            return Err(format!("the value of {k:?} is not a header value"));
        }
        out.insert(k.to_string(), val.into_owned());
    }
    Ok(out)
}

/// Export counters, shown in `/metrics`.
#[derive(Debug, Default)]
pub struct ExportMetrics {
    /// Spans exported.
    pub exported: AtomicU64,
    /// Spans dropped: the queue was full, or their export failed.
    pub dropped: AtomicU64,
}

struct Shared {
    tx: tokio::sync::mpsc::Sender<SpanData>,
    capture_content: bool,
    bounds: Bounds,
    metrics: Arc<ExportMetrics>,
    warned: Mutex<Option<Instant>>,
    /// Spans queued or being exported.
    pending: AtomicU64,
}

impl Shared {
    fn dropped(&self, n: u64, why: &dyn std::fmt::Display) {
        self.metrics.dropped.fetch_add(n, Ordering::Relaxed);
        let mut w = self.warned.lock();
        if w.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *w = Some(Instant::now());
            drop(w);
            tracing::warn!(
                dropped_total = self.metrics.dropped.load(Ordering::Relaxed),
                "OTLP export: spans dropped ({why}); requests are not held up (logged at most once a minute)"
            );
        }
    }
}

/// The export handle the request path holds: off, or the queue of the
/// export task.
#[derive(Clone, Default)]
pub struct Telemetry {
    shared: Option<Arc<Shared>>,
    metrics: Arc<ExportMetrics>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("on", &self.shared.is_some())
            .finish()
    }
}

impl Telemetry {
    /// Nothing is exported.
    pub fn off() -> Self {
        Telemetry::default()
    }

    /// Export is on.
    pub fn enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// The export counters.
    pub fn metrics(&self) -> &Arc<ExportMetrics> {
        &self.metrics
    }

    /// Start the export task (on the current tokio runtime).
    pub fn start(opts: &OtlpOptions, bounds: Bounds) -> Result<Telemetry, TelemetryError> {
        let client = client::HyperClient::new(EXPORT_TIMEOUT)
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(opts.traces_url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(opts.headers.clone())
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        exporter.set_resource(&span::resource());
        let (tx, rx) = tokio::sync::mpsc::channel(opts.max_queue);
        let metrics = Arc::new(ExportMetrics::default());
        let shared = Arc::new(Shared {
            tx,
            capture_content: opts.capture_content,
            bounds,
            metrics: metrics.clone(),
            warned: Mutex::new(None),
            pending: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&shared);
        tokio::spawn(export_loop(exporter, rx, metrics.clone(), weak));
        tracing::info!(url = %opts.traces_url, headers = opts.headers.len(), "exporting OpenTelemetry GenAI spans over OTLP/HTTP");
        Ok(Telemetry {
            shared: Some(shared),
            metrics,
        })
    }

    /// Wait (at most `grace`) until every queued span was exported or
    /// dropped (at shutdown).
    pub async fn flush(&self, grace: Duration) {
        let Some(s) = &self.shared else { return };
        let deadline = Instant::now() + grace;
        while s.pending.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A step whose request arrived at `since`: its trace, when export is on.
    pub fn start_step(&self, since: Instant) -> Option<Box<StepTrace>> {
        let shared = self.shared.as_ref()?;
        let start = std::time::SystemTime::now()
            .checked_sub(since.elapsed())
            .unwrap_or_else(std::time::SystemTime::now);
        Some(Box::new(StepTrace::new(
            Sink(shared.clone()),
            shared.capture_content,
            shared.bounds,
            start,
        )))
    }
}

/// Where a finished step's spans go.
#[derive(Clone)]
pub(crate) struct Sink(Arc<Shared>);

impl Sink {
    /// Queue `spans` for export; never waits (a full queue drops them).
    pub(crate) fn send(&self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        for (i, s) in spans.into_iter().enumerate() {
            self.0.pending.fetch_add(1, Ordering::AcqRel);
            if self.0.tx.try_send(s).is_err() {
                self.0.pending.fetch_sub(1, Ordering::AcqRel);
                self.0.dropped(n - i as u64, &"the export queue is full");
                return;
            }
        }
    }
}

async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: tokio::sync::mpsc::Receiver<SpanData>,
    metrics: Arc<ExportMetrics>,
    shared: std::sync::Weak<Shared>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let n = batch.len() as u64;
        let spans = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(spans)).await {
            Ok(Ok(())) => {
                metrics.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Err(e)) => match shared.upgrade() {
                Some(s) => s.dropped(n, &e),
                None => {
                    metrics.dropped.fetch_add(n, Ordering::Relaxed);
                }
            },
            Err(_) => match shared.upgrade() {
                Some(s) => s.dropped(n, &"the collector did not answer in time"),
                None => {
                    metrics.dropped.fetch_add(n, Ordering::Relaxed);
                }
            },
        }
        if let Some(s) = shared.upgrade() {
            s.pending.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url_adds_the_path_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:6006"),
            "http://127.0.0.1:6006/v1/traces"
        );
        assert_eq!(
            traces_url("https://cloud.langfuse.com/api/public/otel/"),
            "https://cloud.langfuse.com/api/public/otel/v1/traces"
        );
        assert_eq!(
            traces_url("http://h:4318/v1/traces"),
            "http://h:4318/v1/traces"
        );
    }

    #[test]
    fn headers_parse_and_errors_never_quote_values() {
        let h = parse_headers("Authorization=Basic%20c2VjcmV0, x-team = a").unwrap();
        assert_eq!(h["Authorization"], "Basic c2VjcmV0");
        assert_eq!(h["x-team"], "a");
        let e = parse_headers("Authorization Basic c2VjcmV0").unwrap_err();
        assert!(!e.contains("c2VjcmV0"), "{e}");
        let e = parse_headers("x=ok,bad name=s3cr3t").unwrap_err();
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn options_debug_shows_header_names_only() {
        let c = OtlpConfig {
            endpoint: Some("http://127.0.0.1:4318".into()),
            ..OtlpConfig::default()
        };
        let env = |k: &str| {
            (k == "OCEANCODE_OTLP_HEADERS").then(|| "authorization=Bearer%20sk-123".to_string())
        };
        let o = OtlpOptions::from_config(&c, &env).unwrap().unwrap();
        let shown = format!("{o:?}");
        assert!(shown.contains("authorization"), "{shown}");
        assert!(!shown.contains("sk-123"), "{shown}");
        assert_eq!(o.traces_url, "http://127.0.0.1:4318/v1/traces");
        let off = OtlpConfig::default();
        assert!(OtlpOptions::from_config(&off, &env).unwrap().is_none());
    }
}
