//! Helpers shared by the binary-level tests: a child-process guard, the
//! binary with a clean environment, and a `serve` process on port 0.
#![allow(dead_code)]

use oceancode_testkit::eventually;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Kills (SIGKILL) and reaps the child when dropped.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("child still owned")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The binary with a clean environment: no user config, data or proxy vars.
pub fn proxy_cmd(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oceancode-proxy"));
    for v in [
        "OCEANCODE_CONFIG",
        "OCEANCODE_DATA_DIR",
        "OCEANCODE_LISTEN",
        "OCEANCODE_CONTEXT_TOKENS",
        "OCEANCODE_PROXY_URL",
        "OCEANCODE_ADMIN_TOKEN",
        "OCEANCODE_LOG",
        "ANTHROPIC_BASE_URL",
        "OPENAI_BASE_URL",
        "GOOGLE_GEMINI_BASE_URL",
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        c.env_remove(v);
    }
    c.env("XDG_CONFIG_HOME", home.join("xdg-config"))
        .env("XDG_DATA_HOME", home.join("xdg-data"))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("HOME", home);
    c
}

/// Run a command to completion (killed after 20 s) and capture its output.
pub fn output(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let mut guard = ChildGuard(Some(child));
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = exited(
        &mut guard,
        Duration::from_secs(20),
        &format!("{cmd:?} to end"),
    );
    guard.0 = None;
    Output {
        status,
        stdout: o.join().expect("stdout reader"),
        stderr: e.join().expect("stderr reader"),
    }
}

/// The child's exit status once it ended (it is still owned by `guard`);
/// panics naming `what` after `within`.
pub fn exited(guard: &mut ChildGuard, within: Duration, what: &str) -> ExitStatus {
    eventually(within, what, || guard.child().try_wait().expect("try_wait"))
}

/// A `serve` process and what it printed on stderr.
pub struct Served {
    pub guard: ChildGuard,
    pub url: String,
    pub stderr: Arc<Mutex<String>>,
}

/// Start `serve` on port 0; `extra` are more arguments (e.g. `--config F`).
pub fn serve(home: &Path, data: &Path, fake: &str, extra: &[&str], env: &[(&str, &str)]) -> Served {
    let mut cmd = proxy_cmd(home);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(["--anthropic-upstream", fake, "--openai-upstream", fake])
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn oceancode-proxy serve");
    let err = child.stderr.take().expect("stderr");
    let mut guard = ChildGuard(Some(child));
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<String>();
    let sink = log.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("oceancode-proxy listening on http://").nth(1) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
            }
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let Ok(addr) = rx.recv_timeout(Duration::from_secs(15)) else {
        let _ = guard.child().kill();
        let _ = guard.child().wait();
        std::thread::sleep(Duration::from_millis(100));
        panic!("serve did not start; stderr:\n{}", log.lock().unwrap());
    };
    let port: u16 = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert!(
        addr.starts_with("127.0.0.1:") && port != 0,
        "serve must report the bound port, got {addr:?}"
    );
    Served {
        guard,
        url: format!("http://{addr}"),
        stderr: log,
    }
}
