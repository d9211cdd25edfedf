//! The session model (rows, events) and the pure tideline window logic of
//! oceancode-proxy: the gauge and block state machine, window planning and
//! the stub line, and what images and documents cost in tokens (`media`).
//! No I/O, no clock, no SQLite, so the simulator and the fuzz targets link
//! it alone; `oceancode-ledger` re-exports it under its old paths
//! (`oceancode_ledger::{tideline, media}`, `oceancode_ledger::{Row, Event, ...}`).

pub mod media;
pub mod model;
pub mod tideline;

pub use model::{
    AppliedEdit, Dialect, Event, InternalRecall, Row, RowKind, SessionMeta, Standing, StandingKind,
    StepDetail, Usage,
};
