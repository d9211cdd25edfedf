//! One test binary for the smaller end-to-end suites (each file its own
//! module, as it was its own binary): linking the proxy once instead of
//! once per file. A suite that reads process-wide state (a counter, the
//! context file writer, a global subscriber) or measures timings stays a
//! binary of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

#[path = "compress.rs"]
mod compress;
#[path = "media.rs"]
mod media;
#[path = "merge_live.rs"]
mod merge_live;
#[path = "meter_headers.rs"]
mod meter_headers;
#[path = "pins.rs"]
mod pins;
#[path = "safeguards.rs"]
mod safeguards;
#[path = "siblings.rs"]
mod siblings;
#[path = "telemetry.rs"]
mod telemetry;
