//! `recall [SESSION] [--match T] [--before SEQ]`, `recall entry SEQ`,
//! `recall search WORDS…`: the verbatim record read back.

use super::open_store;
use super::out::{errln, out, outln};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::Path;

/// `recall`'s flags.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RecallArgs {
    #[command(subcommand)]
    cmd: Option<RecallCmd>,
    /// Only rows whose text matches (SQL LIKE: `%` and `_` are wildcards).
    #[arg(long = "match", value_name = "TEXT")]
    pattern: Option<String>,
    /// Only rows with a seq below this one (page back with the first seq shown).
    #[arg(long, value_name = "SEQ")]
    before: Option<u64>,
    /// The newest N matching rows (printed oldest first).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Session: ledger id, the client's session name or id, or a unique
    /// prefix (default: the most recent session).
    session: Option<String>,
}

/// `recall`'s subcommands.
#[derive(Subcommand, Debug)]
enum RecallCmd {
    /// Print one row, whole (rendered; `--raw` for the verbatim JSON).
    Entry {
        /// The row's seq.
        seq: u64,
        /// Session: ledger id, the client's session name or id, or a unique
        /// prefix (default: the most recent session).
        #[arg(long)]
        session: Option<String>,
        /// Print the row's verbatim JSON instead of the rendering.
        #[arg(long)]
        raw: bool,
    },
    /// Search every session, newest first; every word must appear.
    Search {
        /// Words to find.
        #[arg(required = true)]
        words: Vec<String>,
        /// Most hits shown.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

/// `recall …`.
pub fn run(dir: &Path, a: &RecallArgs) -> Result<i32> {
    let store = open_store(dir)?;
    store.settle_blocking()?;
    match &a.cmd {
        None => {
            let id = store.resolve_session(a.session.as_deref())?;
            let hits = store.recall_log(&id, a.pattern.as_deref(), a.before, a.limit)?;
            for h in &hits {
                outln!("{}", h.line(false));
            }
            if hits.is_empty() {
                errln!("no rows matched in {id}");
            }
        }
        Some(RecallCmd::Entry { seq, session, raw }) => {
            let id = store.resolve_session(session.as_deref())?;
            let meta = store
                .session_meta(&id)?
                .with_context(|| format!("no session {id}"))?;
            let Some((row, hidden)) = store.recall_entry(&id, *seq)? else {
                bail!("session {id} has no seq {seq}");
            };
            if *raw {
                outln!("{}", row.raw);
            } else {
                outln!(
                    "<!-- {id} · seq {} · turn {} · step {} · {}{} -->",
                    row.seq,
                    row.turn,
                    row.step,
                    row.kind.as_str(),
                    if hidden { " · hidden by a rewind" } else { "" }
                );
                use oceancode_ledger::transcript::{render_entry, row_tools};
                // A tool result names its tool from the call before it.
                let earlier: Vec<oceancode_window::Row> =
                    if row_tools(meta.dialect, &row.raw).results.is_empty() {
                        Vec::new()
                    } else {
                        store
                            .session_rows(&id, true)?
                            .into_iter()
                            .map(|(r, _)| r)
                            .filter(|r| r.seq < row.seq)
                            .collect()
                    };
                out!("{}", render_entry(meta.dialect, &row, &earlier));
            }
        }
        Some(RecallCmd::Search { words, limit }) => {
            let hits = store.search(words, *limit)?;
            for h in &hits {
                outln!("{}", h.line(true));
            }
            if hits.is_empty() {
                errln!("no row contains every word");
            }
        }
    }
    let _ = store.shutdown();
    Ok(0)
}
