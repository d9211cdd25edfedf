//! The one date helper (`oceancode_window::time`, pure) and the one clock
//! read, [`now_ms`], for the ledger and the proxy.

pub use oceancode_window::time::{civil_from_days, id_stamp, utc_iso, Utc};

/// Unix milliseconds now (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
