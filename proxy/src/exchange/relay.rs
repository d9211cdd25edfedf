//! The relay branch: the upstream's answer through the usage tap
//! ([`crate::tap`]) to the client; the tap finishes the step once.

use super::relay_head;
use crate::app::App;
use crate::dialect;
use crate::error::{BoxError, Envelope, ProxyBody, ProxyError};
use crate::sessions::{Reservation, StepError, Ticket};
use crate::tap::{Framing, TapBody, TapEnd};
use bytes::Bytes;
use http::{header, Response};
use http_body::Body;
use http_body_util::BodyExt;
use oceancode_window::Dialect;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The answer relayed to the client through the usage tap, which records
/// it on `ticket`'s step (when there is one) and counts it for `/metrics`.
pub(crate) fn tap_response<B>(
    app: &Arc<App>,
    dialect: Dialect,
    ticket: Option<Ticket>,
    head: http::response::Parts,
    body: B,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    tap_response_charged(app, dialect, ticket, None, head, body)
}

/// [`tap_response`] for a request that records no step but holds spend
/// reserved by `limits.session` (`reservation`): settled with the usage
/// its answer tells, released when it tells none.
pub(super) fn tap_response_charged<B>(
    app: &Arc<App>,
    dialect: Dialect,
    ticket: Option<Ticket>,
    reservation: Option<Reservation>,
    head: http::response::Parts,
    body: B,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    let mut relay = relay_head(&head);
    if let Some(t) = &ticket {
        relay = super::meter_headers(relay, &t.session.id, t.meter);
    }
    let status = head.status.as_u16();
    let framing = Framing::from_content_type(
        head.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let encoding = head
        .headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let sized = head.headers.contains_key(header::CONTENT_LENGTH);
    let metrics = app.metrics.clone();
    let merge = app.merge.clone();
    let on_finish = Box::new(move |o: crate::tap::TapOutcome| {
        if let (Some(r), Some(u)) = (reservation, o.collected.usage) {
            let model = o.collected.model.clone().unwrap_or_default();
            r.settle(&model, u.plus(o.collected.detail.extra));
        }
        if let Some(u) = o.collected.usage {
            // Billed: the window and what came on top of it (compaction).
            let u = u.plus(o.collected.detail.extra);
            metrics.input_tokens.fetch_add(u.input, Ordering::Relaxed);
            metrics.output_tokens.fetch_add(u.output, Ordering::Relaxed);
            metrics
                .cache_read_tokens
                .fetch_add(u.cache_read, Ordering::Relaxed);
            metrics
                .cache_write_tokens
                .fetch_add(u.cache_write, Ordering::Relaxed);
        }
        if o.end == TapEnd::Cancelled && !o.collected.terminal {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(o.end, TapEnd::Error(_)) {
            metrics.streams_cut.fetch_add(1, Ordering::Relaxed);
        }
        if o.collected.truncated {
            metrics.answers_truncated.fetch_add(1, Ordering::Relaxed);
        }
        if o.decode_stopped {
            metrics.decode_stopped.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = ticket {
            // A client may close right after the terminal event, before the
            // upstream's end of stream: the answer is complete all the same.
            let whole =
                o.end == TapEnd::Complete || (o.end == TapEnd::Cancelled && o.collected.terminal);
            let ok = whole && o.collected.error.is_none();
            let session = t.session.clone();
            if o.end == TapEnd::Cancelled && !whole {
                t.cut_short(status, StepError::Cancelled, &o.collected);
            } else {
                t.complete(status, ok, &o.collected);
            }
            if let Some(m) = &merge {
                // The live merge starts in the background when the cut moved.
                let cut = session.state.lock().meter.cut_upto;
                m.after_step(&session.id, cut);
            }
        }
    });
    let limits = app.cfg.net.tap;
    let mut tap = TapBody::with_limits(
        body,
        framing,
        encoding.as_deref(),
        dialect::collector_keeping(dialect, limits.max_kept),
        on_finish,
        limits,
    )
    .with_idle_timeout(app.cfg.idle_stream_timeout);
    if !sized {
        // A chunked stream can end with one more event; a sized one cannot.
        tap = tap.with_error_event(dialect, framing, encoding.as_deref());
    }
    match relay.body(tap.boxed_unsync()) {
        Ok(r) => r,
        Err(e) => ProxyError::BadTarget(e.to_string()).into_response(Envelope::from(dialect)),
    }
}
