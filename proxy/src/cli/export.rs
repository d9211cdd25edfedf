//! `export --md | --atif [SESSION] [--out FILE]`: one session as a Markdown
//! document or an ATIF-v1.8 trajectory (files 0600).

use super::out::errln;
use super::progress::{progress_bar, session_rows};
use super::{open_store, pricer};
use anyhow::{Context, Result};
use clap::{ArgGroup, Args};
use oceancode_config::Config;
use std::path::Path;

/// `export`'s flags.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("format").required(true).args(["md", "atif"])))]
pub struct ExportArgs {
    /// Markdown: frontmatter, every turn, a `## Summary` table.
    #[arg(long)]
    md: bool,
    /// ATIF-v1.8 JSON trajectory.
    #[arg(long)]
    atif: bool,
    /// Session: ledger id, the client's session name or id, or a unique
    /// prefix (default: the most recent session).
    session: Option<String>,
    /// Output file, or `-` for stdout.
    #[arg(long, value_name = "FILE|-", default_value = "-")]
    out: String,
}

/// Create (or truncate) an export file readable by its owner only: it holds
/// the whole conversation.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// `export`.
pub fn run(dir: &Path, cfg: &Config, a: &ExportArgs) -> Result<i32> {
    let store = open_store(dir)?;
    store.settle_blocking()?;
    let id = store.resolve_session(a.session.as_deref())?;
    let price = pricer(cfg);
    let mut out: Box<dyn std::io::Write> = if a.out == "-" {
        super::out::stdout_writer()
    } else {
        Box::new(
            private_file(Path::new(&a.out)).with_context(|| format!("cannot create {}", a.out))?,
        )
    };
    let bar = progress_bar(session_rows(&*store, &id), "export");
    if a.md {
        oceancode_ledger::export::markdown(
            &*store,
            &id,
            &price,
            &mut out,
            bar.as_ref().map(|(_, p)| p),
        )?;
    } else {
        if let Some((b, _)) = &bar {
            b.set_message("export (ATIF)");
            b.enable_steady_tick(std::time::Duration::from_millis(120));
        }
        oceancode_ledger::atif::write(&*store, &id, &price, &mut out)?;
    }
    if let Some((b, _)) = bar {
        b.finish_and_clear();
    }
    out.flush()?;
    if a.out != "-" {
        errln!("exported {id} to {}", a.out);
    }
    let _ = store.shutdown();
    Ok(0)
}
