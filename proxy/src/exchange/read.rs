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
/// declared `Content-Length` nor `limits.max_body_bytes`; to the declared
/// length at once when a quarter of it has arrived, so a 200 KB body is
/// copied on growth once, not twice): a header alone reserves nothing, and
/// a buffer is never more than four times what arrived (or 64 KiB). Each
/// growth is taken from the budget all connections share (waiting while it
/// is spent, see [`crate::app::BodyBudget`]), and given back when the
/// permit drops. Each frame is copied as it arrives and dropped, so the
/// connection's read buffer is reused.
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
            let grown = grown_capacity(buf.capacity(), need, ceiling);
            permit.grow((grown - buf.capacity()) as u64).await;
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok((Bytes::from(buf), permit))
}

/// The capacity a body buffer of `capacity` grows to for `need` bytes, with
/// `ceiling` the most it may hold (the declared length, else the limit).
fn grown_capacity(capacity: usize, need: usize, ceiling: usize) -> usize {
    if ceiling / 4 <= need {
        return ceiling.max(need);
    }
    capacity
        .saturating_mul(2)
        .max(MIN_BODY_GROWTH)
        .min(ceiling)
        .max(need)
}

#[cfg(test)]
mod tests {
    use super::{grown_capacity, MIN_BODY_GROWTH};

    /// Every capacity a body of `total` bytes passes through, frames of `frame`.
    fn growths(total: usize, frame: usize, ceiling: usize) -> Vec<usize> {
        let (mut cap, mut len, mut seen) = (0, 0, vec![]);
        while len < total {
            let need = (len + frame).min(total);
            if need > cap {
                cap = grown_capacity(cap, need, ceiling);
                assert!(cap >= need && cap <= ceiling.max(need));
                assert!(cap <= (4 * need).max(MIN_BODY_GROWTH), "{cap} for {need}");
                seen.push(cap);
            }
            len = need;
        }
        seen
    }

    #[test]
    fn a_declared_body_grows_to_its_length_once_a_quarter_arrived() {
        // 200 KB declared, 16 KiB frames: 64 KiB, then the whole length.
        assert_eq!(growths(200_000, 16 << 10, 200_000), vec![64 << 10, 200_000]);
        // 8 MB declared: doubling until 2 MB arrived, then 8 MB.
        let g = growths(8_000_000, 64 << 10, 8_000_000);
        assert_eq!(g.last(), Some(&8_000_000));
        assert_eq!(g.len(), 7, "{g:?}");
    }

    #[test]
    fn a_header_alone_reserves_nothing_and_an_undeclared_body_doubles() {
        // A 64 MiB Content-Length and one byte: the first 64 KiB only.
        assert_eq!(growths(1, 1, 64 << 20), vec![64 << 10]);
        // No length: the limit is the ceiling; doubling as before.
        let g = growths(1 << 20, 16 << 10, 64 << 20);
        assert_eq!(g, vec![64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]);
    }
}
