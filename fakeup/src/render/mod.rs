//! Rendering a [`Plan`](crate::plan::Plan) in each dialect: SSE event lists (one event
//! per body frame) and non-streaming JSON bodies, shaped like the captured traffic.

pub(crate) mod anthropic;
pub(crate) mod chat;
pub(crate) mod responses;

use bytes::Bytes;

use crate::json::J;
use crate::plan::Ids;

/// Per-response context.
pub(crate) struct Ctx<'a> {
    pub model: &'a str,
    pub ids: &'a Ids,
    pub created: u64,
    pub include_usage: bool,
}

/// One SSE event: `event: NAME\ndata: JSON\n\n` (no `event:` line when `name` is None).
pub(crate) fn sse(name: Option<&str>, data: &J) -> Bytes {
    let data = data.to_vec();
    let mut out = Vec::with_capacity(data.len() + 64);
    if let Some(n) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(n.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
