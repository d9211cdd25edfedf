//! The session model (rows, events) and the pure tideline window logic of
//! oceancode-proxy: the gauge and block state machine, window planning and
//! the stub line, the prompt cache's cold and missed requests (`cache`),
//! what images and documents cost in tokens (`media`), where a tool output
//! sits in a message (`spans`), the one date helper (`time`), and a home
//! per provider dialect (`dialect`: the [`dialect::DialectSpec`] trait, one
//! module per API).
//! No I/O, no clock, no SQLite, so the simulator and the fuzz targets link
//! it alone. The ledger, the proxy and the tests name it directly
//! (`oceancode_window::{tideline, Row, Event, ...}`).

pub mod cache;
pub mod compress;
pub mod dialect;
pub mod media;
pub mod model;
pub mod spans;
pub mod tideline;
pub mod time;

pub use model::{
    AppliedEdit, ByteString, Dialect, Event, InternalRecall, Pruned, Row, RowKind, RowPointers,
    SentPiece, SentWindow, SessionMeta, Standing, StandingKind, StepDetail, Usage,
};
