//! oceancode-proxy: a transparent proxy between coding agents and their model
//! APIs. It forwards Anthropic Messages and OpenAI Chat/Responses traffic,
//! reads real usage from every response, keeps the conversation sent upstream
//! under the tideline, and writes a verbatim ledger on the side.
//!
//! Request flow: [`server`] reads the body → [`identity`] names the session →
//! [`sessions`] matches history, records rows, runs the tideline and renders
//! the window → [`upstream`] forwards → [`tap`] streams the answer back frame
//! by frame while [`dialect`] collectors read usage and the assistant's rows.
//! Before any of it, [`conn`] bounds the connections and [`access`] refuses
//! requests from web pages and other hosts' names. [`ui`] is the read-only
//! session viewer the proxy serves at `/_oceancode/ui/`.

pub mod access;
pub mod admin;
pub mod app;
pub mod conn;
pub mod context;
mod cpu;
pub mod dialect;
pub mod error;
mod exchange;
pub mod identity;
pub mod merge;
pub mod overflow;
pub mod recall_tool;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod sessions;
pub mod sse;
pub mod tap;
pub mod telemetry;
pub mod token;
pub mod ui;
pub mod upstream;
