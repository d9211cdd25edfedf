//! `ui [--open]`: the URL of the session viewer of the running proxy (the
//! one holding the most recent session, else the newest), with the admin
//! token handed over once; `--open` opens it in the browser.

use super::out::{errln, outln};
use super::proxies::Proxies;
use super::{runtime_block, AdminTokenFlag};
use anyhow::Result;
use clap::Args;
use oceancode_config::Config;
use std::path::Path;

/// `ui`'s flags.
#[derive(Args, Debug)]
pub struct UiArgs {
    /// Open the URL in the browser (xdg-open, open) as well as printing it.
    #[arg(long)]
    open: bool,
    /// Admin URL of the running proxy (default: the proxy registered in the
    /// data dir holding the most recent session, else the newest).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
}

/// `ui`.
pub fn run(dir: &Path, cfg: &Config, a: &UiArgs) -> Result<i32> {
    let found =
        runtime_block(async { Ok(Proxies::find(cfg, dir, a.proxy.as_deref(), &a.token).await) })?;
    let Some(live) = found.for_latest() else {
        return Err(found.none_error());
    };
    let url = oceancode_proxy::ui::open_url(live.client.url(), live.client.token());
    outln!("{url}");
    if a.open {
        let opener = if cfg!(target_os = "macos") {
            "open"
        } else {
            "xdg-open"
        };
        match std::process::Command::new(opener)
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(_) => {}
            Err(e) => {
                errln!("oceancode-proxy: cannot run {opener} ({e}): open the URL above by hand")
            }
        }
    }
    Ok(0)
}
