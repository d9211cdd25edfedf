//! Phase 1: the request body, read whole within the body budget.

use crate::app::{App, BodyPermit};
use crate::error::ProxyError;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// The first reservation for a body, and the least a buffer grows by.
const MIN_BODY_GROWTH: usize = 64 << 10;

/// Read a request body whole, within `limits.body_read_timeout_ms`. The
/// buffer grows with the bytes that arrive (doubling, never past the
/// declared `Content-Length` nor `limits.max_body_bytes`): a header alone
/// reserves nothing. Each growth is taken from the budget all connections
/// share (waiting while it is spent, see [`crate::app::BodyBudget`]), and given back when
/// the permit drops. Each frame is copied as it
/// arrives and dropped, so the connection's read buffer is reused.
pub(super) async fn read_body(
    app: &App,
    body: Incoming,
    declared: Option<u64>,
) -> Result<(Bytes, BodyPermit<'_>), ProxyError> {
    let limit = app.cfg.max_body_bytes;
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let wait = app.cfg.net.body_read_timeout;
    match tokio::time::timeout(wait, collect_body(app, body, declared)).await {
        Ok(r) => r,
        Err(_) => Err(ProxyError::BodyTimeout {
            secs: wait.as_secs(),
        }),
    }
}

async fn collect_body(
    app: &App,
    mut body: Incoming,
    declared: Option<u64>,
) -> Result<(Bytes, BodyPermit<'_>), ProxyError> {
    let limit = app.cfg.max_body_bytes;
    let ceiling = usize::try_from(declared.unwrap_or(limit).min(limit)).unwrap_or(usize::MAX);
    let mut permit = BodyPermit::new(&app.bodies);
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProxyError::BadRequestBody(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let need = buf.len() + data.len();
        if need as u64 > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        if need > buf.capacity() {
            let grown = buf
                .capacity()
                .saturating_mul(2)
                .max(MIN_BODY_GROWTH)
                .min(ceiling)
                .max(need);
            permit.grow((grown - buf.capacity()) as u64).await;
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok((Bytes::from(buf), permit))
}
