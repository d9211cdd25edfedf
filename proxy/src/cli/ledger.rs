//! `ledger path | list | rebuild | vacuum`.

use super::out::outln;
use super::progress::{progress_bar, session_rows};
use super::proxies::Proxies;
use super::{merge, open_store, runtime_block, AdminTokenFlag};
use anyhow::Result;
use clap::Subcommand;
use oceancode_config::Config;
use std::path::Path;

/// `ledger`'s subcommands.
#[derive(Subcommand, Debug)]
pub enum LedgerCmd {
    /// Print a session's ledger directory (default: the most recent session).
    Path {
        /// Session: ledger id, the client's session name or id, or a unique
        /// prefix (default: the most recent session).
        session: Option<String>,
    },
    /// List sessions: id, name, client, model, turns, rows, last activity, and what
    /// a sibling or sub-agent is linked to.
    List,
    /// Rebuild transcripts, index.md, SESSION.md and the search index from
    /// the database alone (no model call; byte-identical to the live writer).
    Rebuild {
        /// Session: ledger id, the client's session name or id, or a unique
        /// prefix (default: the most recent session).
        session: Option<String>,
        /// Rebuild every session.
        #[arg(long, conflicts_with = "session")]
        all: bool,
        /// Also fold the merge backlog into SESSION.md with the model of
        /// `ledger.merge.model` (model calls; asks y/N).
        #[arg(long)]
        merge: bool,
        /// Do not ask before the model calls of `--merge`.
        #[arg(long, requires = "merge")]
        yes: bool,
    },
    /// Apply `retention.days` now, then compact the database.
    Vacuum,
    /// `export` is a command of its own: answered with the command to use.
    #[command(hide = true)]
    Export {
        /// Whatever followed `ledger export`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `ledger …`.
pub fn run(dir: &Path, cfg: &Config, cmd: &LedgerCmd) -> Result<i32> {
    if let LedgerCmd::Export { args } = cmd {
        let rest = if args.is_empty() {
            "--md [SESSION]".to_string()
        } else {
            args.join(" ")
        };
        anyhow::bail!(
            "`export` is a command of its own, not one of `ledger`: oceancode-proxy export {rest}"
        );
    }
    let store = open_store(dir)?;
    match cmd {
        LedgerCmd::Path { session } => {
            let id = store.resolve_session(session.as_deref())?;
            outln!("{}", store.data_dir().session_dir(&id).display());
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                super::out::errln!(
                    "oceancode-proxy: `oceancode-proxy context {id}` writes its live window to {} to edit",
                    store.data_dir().session_dir(&id).join("context.txt").display()
                );
            }
        }
        LedgerCmd::Rebuild {
            session,
            all,
            merge,
            yes,
        } => {
            store.settle_blocking()?;
            let ids = if *all {
                store.list_sessions()?.into_iter().map(|s| s.id).collect()
            } else {
                vec![store.resolve_session(session.as_deref())?]
            };
            for id in &ids {
                let rows = session_rows(&*store, id);
                let bar = progress_bar(rows, "rebuild");
                let started = std::time::Instant::now();
                let r = store.rebuild(id, bar.as_ref().map(|(_, p)| p.clone()))?;
                if let Some((b, _)) = bar {
                    b.finish_and_clear();
                }
                outln!(
                    "rebuilt {}: {} rows, {} turn files{}, index.md, {}search index ({} ms)",
                    r.session,
                    r.rows,
                    r.turns,
                    if r.removed > 0 {
                        format!(" ({} stale removed)", r.removed)
                    } else {
                        String::new()
                    },
                    if r.page { "SESSION.md, " } else { "" },
                    started.elapsed().as_millis()
                );
            }
            if *merge {
                let code = merge::run(&*store, cfg, &ids, *yes)?;
                let _ = store.shutdown();
                return Ok(code);
            }
        }
        LedgerCmd::Vacuum => {
            let swept = store.sweep(cfg.retention.days)?;
            for id in &swept.removed {
                outln!("removed idle session {id}");
            }
            let v = store.vacuum()?;
            outln!(
                "retention: {} session{} removed ({} rows; retention.days = {}); database {} → {} bytes",
                swept.removed.len(),
                if swept.removed.len() == 1 { "" } else { "s" },
                swept.rows,
                cfg.retention.days,
                v.bytes_before,
                v.bytes_after
            );
        }
        // Answered above.
        LedgerCmd::Export { .. } => {}
        LedgerCmd::List => {
            let list = store.list_sessions()?;
            // A running proxy's ledger may be behind on some sessions.
            let behind = runtime_block(async {
                let p = Proxies::find(cfg, dir, None, &AdminTokenFlag::default()).await;
                Ok(p.behind().await)
            })?;
            outln!(
                "{:<34} {:<20} {:<13} {:<26} {:>6} {:>7}  last activity",
                "id",
                "name",
                "client",
                "model",
                "turns",
                "rows"
            );
            for s in list {
                // A linked session says to what, after its last activity.
                let link = match (&s.parent, s.parent_seq) {
                    (Some(p), Some(seq)) => format!("  sibling of {p} after seq {seq}"),
                    (Some(p), None) => format!("  sub-agent of {p}"),
                    _ => String::new(),
                };
                outln!(
                    "{:<34} {:<20} {:<13} {:<26} {:>6} {:>7}  {}{link}{}",
                    s.id,
                    s.name.as_deref().unwrap_or("-"),
                    s.client,
                    s.model,
                    s.turns,
                    s.rows,
                    oceancode_ledger::transcript::utc_iso(s.last_ms),
                    if behind.contains(&s.id) {
                        "  behind (heals at its next request)"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    let _ = store.shutdown();
    Ok(0)
}
