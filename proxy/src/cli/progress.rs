//! Progress bars for long ledger work (rebuild, export) on a terminal.

use oceancode_ledger::rebuild::Progress;
use oceancode_ledger::store::LedgerStore;
use std::sync::Arc;

/// Rows of a session on the active line (0 if unknown).
pub(super) fn session_rows(store: &dyn LedgerStore, id: &str) -> u64 {
    store
        .session_summary(id)
        .ok()
        .flatten()
        .map_or(0, |s| s.rows)
}

/// Rows from which rebuild and export show a progress bar (on a terminal).
const PROGRESS_MIN_ROWS: u64 = 2_000;

/// A progress bar on stderr for large sessions (drawn only on a terminal).
pub(super) fn progress_bar(rows: u64, what: &str) -> Option<(indicatif::ProgressBar, Progress)> {
    if rows < PROGRESS_MIN_ROWS {
        return None;
    }
    let bar = indicatif::ProgressBar::new(rows);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} rows ({eta})")
    {
        bar.set_style(style.progress_chars("█▉ "));
    }
    bar.set_message(what.to_string());
    let b = bar.clone();
    let progress: Progress = Arc::new(move |done, total| {
        b.set_length(total);
        b.set_position(done);
    });
    Some((bar, progress))
}
