//! What the meter shows for a session, and how a line spec reads to a person.

use oceancode_config::LineSpec;

/// What the meter shows for a session.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Meter {
    /// Gauge (tokens): the last answer's real window (input, cache read and
    /// write, output); between a request and its answer, the request's
    /// estimate.
    pub gauge: u64,
    /// The line in force.
    pub line: u64,
    /// The spec `line` was computed from at the last request (a change
    /// applies from the next one).
    #[serde(skip)]
    pub spec: Option<LineSpec>,
    /// Block size.
    pub block: u64,
    /// The model's context window, if known.
    pub context: Option<u64>,
    /// Last seq past the tideline.
    pub cut_upto: u64,
    /// Rows on the active line.
    pub active_rows: usize,
    /// Rows sent in the last window.
    pub window_rows: usize,
    /// Estimated tokens of the standing instructions (CLAUDE.md, AGENTS.md
    /// parts of rows that left) the last window kept with its stub.
    pub pinned_tokens: u64,
    /// Estimated tokens of the state block the last window carried after
    /// its stub.
    pub state_tokens: u64,
    /// Steps so far.
    pub steps: u32,
    /// Cuts so far.
    pub cuts: u32,
    /// Rows the last request cut out of the window (0: it cut none).
    pub last_cut_rows: u64,
    /// Tool outputs the last window sent as pointers (`ledger.compress`).
    pub pruned_outputs: u32,
    /// Their estimated tokens.
    pub pruned_tokens: u64,
    /// The saved estimate the gauge adds for them.
    pub saved_tokens: u64,
    /// The smallest input a step of the session had since it was loaded:
    /// what stays in every window whatever is cut (the system prompt, the
    /// tools, the ask kept after the stub), as far as the steps show it.
    pub fixed: u64,
    /// The warning that `fixed` is over half the line was logged.
    #[serde(skip)]
    pub fixed_warned: bool,
    /// Steps that failed (no whole answer) since the session was loaded.
    pub failed_steps: u32,
    /// The latest of them.
    pub last_error: Option<LastError>,
    /// The latest cut, for the span of the step that made it
    /// (`crate::telemetry`).
    #[serde(skip)]
    pub last_cut: Option<crate::telemetry::CutNote>,
}

/// A failed step as the meter shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LastError {
    /// Step number.
    pub step: u32,
    /// The status the client got.
    pub status: u16,
    /// Why it failed.
    pub error: super::StepError,
}

/// How a line spec reads to a person: `40%`, `20k`, `ceiling`.
pub fn line_label(spec: LineSpec) -> String {
    match spec {
        LineSpec::Percent(p) => format!("{p}%"),
        LineSpec::Tokens(0) => "ceiling".to_string(),
        LineSpec::Tokens(t) => oceancode_ledger::status::tokens(t),
    }
}
