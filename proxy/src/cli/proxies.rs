//! Finding the running proxies a command talks to: `--proxy URL` /
//! `OCEANCODE_PROXY_URL` when given; else every proxy registered in the data
//! dir ([`oceancode_proxy::registry`]) that still runs and answers, asked
//! for the sessions it holds; else the configured listen address. Stale
//! entries (the process is gone, or it does not answer) are skipped with one
//! note, untrusted ones (not this user's private file, not loopback, or the
//! proxy there cannot prove it is the one registered) with another: the
//! admin token — `--admin-token`, else the data dir's own `admin-token`,
//! never a file an entry names — only goes to a URL the user named or a
//! registered proxy that proved itself. A command then takes the proxy that
//! holds its session, else the newest.

use super::admin_client::{AdminClient, AdminError};
use super::out::errln;
use super::AdminTokenFlag;
use oceancode_config::Config;
use oceancode_ledger::resolve::Candidate;
use oceancode_proxy::registry::{self, Entry};
use oceancode_proxy::token;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Why a proxy is not usable when nothing answered.
pub const NO_ANSWER: &str = "does not answer";

/// How long a proxy has to list its sessions.
const WAIT: Duration = Duration::from_secs(2);

/// A proxy that answered, and the sessions it holds in memory.
pub struct Live {
    /// Its admin client.
    pub client: AdminClient,
    /// Its registry entry (None: `--proxy` or the configured address).
    pub entry: Option<Entry>,
    /// Its sessions as `GET /_oceancode/sessions` lists them.
    pub sessions: Vec<Value>,
    /// The data dir it serves, as it answered.
    pub data_dir: Option<std::path::PathBuf>,
}

impl Live {
    /// `the run proxy (python3, pid 9, http://…)`, `the proxy at http://…`.
    pub fn describe(&self) -> String {
        match &self.entry {
            Some(e) => format!("the {}", e.describe()),
            None => format!("the proxy at {}", self.client.url()),
        }
    }

    /// The session `id` as this proxy lists it.
    pub fn session(&self, id: &str) -> Option<&Value> {
        self.sessions.iter().find(|s| s["id"] == id)
    }

    fn newest_session_ms(&self) -> Option<i64> {
        self.sessions
            .iter()
            .filter_map(|s| s["last_ms"].as_i64())
            .max()
    }
}

/// The proxies found for a command.
pub struct Proxies {
    /// Those that answered, newest start first.
    pub live: Vec<Live>,
    /// The URLs asked that gave no usable answer, and why (for the error
    /// of a command that needs a proxy).
    pub unreachable: Vec<(String, String)>,
    /// Whether `--proxy` (or `OCEANCODE_PROXY_URL`) chose the one proxy.
    pub explicit: bool,
}

impl Proxies {
    /// The error of a command that needs a proxy and found none.
    pub fn none_error(&self) -> anyhow::Error {
        match self.unreachable.first() {
            Some((url, why)) if why != NO_ANSWER => {
                anyhow::anyhow!("the proxy at {url} {why}")
            }
            Some((url, _)) => AdminError::Unreachable { url: url.clone() }.into(),
            None => anyhow::anyhow!("no running proxy found"),
        }
    }

    /// Find them (see the module doc); prints the one note on stale entries.
    pub async fn find(
        cfg: &Config,
        data_dir: &Path,
        proxy: Option<&str>,
        flag: &AdminTokenFlag,
    ) -> Proxies {
        Self::find_within(cfg, data_dir, proxy, flag, WAIT, true).await
    }

    /// [`Proxies::find`] with each answer awaited at most `wait`, and the
    /// notes on stale or untrusted entries printed only with `notes`.
    pub async fn find_within(
        cfg: &Config,
        data_dir: &Path,
        proxy: Option<&str>,
        flag: &AdminTokenFlag,
        wait: Duration,
        notes: bool,
    ) -> Proxies {
        let token = token::for_client(flag.admin_token.as_deref(), data_dir);
        if let Some(url) = proxy {
            let client = AdminClient::new(url, token);
            let url = client.url().to_string();
            let mut found = Proxies {
                live: Vec::new(),
                unreachable: Vec::new(),
                explicit: true,
            };
            match ask(client, wait).await {
                Ok(l) => found.live.push(l),
                Err(why) => found.unreachable.push((url, why)),
            }
            return found;
        }
        let mut stale: Vec<String> = Vec::new();
        let mut untrusted: Vec<String> = Vec::new();
        let mut asks = Vec::new();
        for f in registry::list(data_dir) {
            let name = f.path.display().to_string();
            match (f.entry, f.untrusted) {
                (_, Some(why)) => untrusted.push(format!("{name} {why}")),
                (None, None) => stale.push(format!("{name} is unreadable")),
                (Some(e), None) if !registry::pid_alive(e.pid) => {
                    stale.push(format!("{} has exited", e.describe()))
                }
                (Some(e), None) => {
                    let token = token.clone();
                    asks.push(async move {
                        match prove(&e, wait).await {
                            Ok(()) => (ask(AdminClient::new(&e.url, token), wait).await, e, true),
                            Err(why) => (Err(why), e, false),
                        }
                    });
                }
            }
        }
        let mut live = Vec::new();
        for (answer, e, proved) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(l) => live.push(Live {
                    entry: Some(e),
                    ..l
                }),
                Err(why) if proved || why == NO_ANSWER => {
                    stale.push(format!("{} {why}", e.describe()))
                }
                Err(why) => untrusted.push(format!("{} {why}", e.describe())),
            }
        }
        if !untrusted.is_empty() && notes {
            errln!(
                "oceancode-proxy: note: not trusting {} entr{} in {} (the admin token is not sent there): {}",
                untrusted.len(),
                if untrusted.len() == 1 { "y" } else { "ies" },
                registry::dir(data_dir).display(),
                untrusted.join("; ")
            );
        }
        if !stale.is_empty() && notes {
            errln!(
                "oceancode-proxy: note: ignoring {} stale entr{} in {}: {}",
                stale.len(),
                if stale.len() == 1 { "y" } else { "ies" },
                registry::dir(data_dir).display(),
                stale.join("; ")
            );
        }
        let mut unreachable = Vec::new();
        if live.is_empty() {
            // No registered proxy: the configured address (a proxy with its
            // ledger off registers nowhere), if it serves this data dir.
            let url = format!("http://{}", cfg.listen);
            match ask(AdminClient::new(&url, token), wait).await {
                Ok(l) => match l.data_dir.as_deref().filter(|d| !same_dir(d, data_dir)) {
                    Some(other) => unreachable.push((
                        url,
                        format!(
                            "serves the data dir {}, not {} (no proxy runs on that one; give --proxy to ask this one anyway)",
                            other.display(),
                            data_dir.display()
                        ),
                    )),
                    None => live.push(l),
                },
                Err(why) => unreachable.push((url, why)),
            }
        }
        Proxies {
            live,
            unreachable,
            explicit: false,
        }
    }

    /// The proxy that holds session `id` (the one it was most recently
    /// active in, should several).
    pub fn holding(&self, id: &str) -> Option<&Live> {
        self.live
            .iter()
            .filter_map(|p| Some((p.session(id)?["last_ms"].as_i64().unwrap_or(0), p)))
            .max_by_key(|(ms, _)| *ms)
            .map(|(_, p)| p)
    }

    /// The most recently active session the running proxies hold, and the
    /// proxy holding it: what a command that names no session means
    /// (`status`, `context` and `evict` alike).
    pub fn latest_session(&self) -> Option<(&Live, String)> {
        self.live
            .iter()
            .flat_map(|p| p.sessions.iter().map(move |s| (p, s)))
            .filter_map(|(p, s)| Some((s["last_ms"].as_i64()?, p, s["id"].as_str()?)))
            .max_by_key(|(ms, _, _)| *ms)
            .map(|(_, p, id)| (p, id.to_string()))
    }

    /// The proxy for a command that names no session: the one holding the
    /// most recently active session, else the newest.
    pub fn for_latest(&self) -> Option<&Live> {
        self.live
            .iter()
            .filter_map(|p| Some((p.newest_session_ms()?, p)))
            .max_by_key(|(ms, _)| *ms)
            .map(|(_, p)| p)
            .or_else(|| self.live.first())
    }

    /// The sessions the ledger of any of these proxies is behind on (their
    /// health answers).
    pub async fn behind(&self) -> Vec<String> {
        let asks = self
            .live
            .iter()
            .map(|p| p.client.get("/_oceancode/health", WAIT));
        let mut out = Vec::new();
        for answer in futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
        {
            let list = answer.json.pointer("/ledger/behind_sessions").cloned();
            for b in list
                .as_ref()
                .and_then(|v| v.as_array())
                .into_iter()
                .flatten()
            {
                if let Some(id) = b["session"].as_str() {
                    out.push(id.to_string());
                }
            }
        }
        out
    }

    /// The live sessions as names may mean them.
    pub fn candidates(&self) -> Vec<Candidate> {
        let s = |v: &Value, k: &str| v[k].as_str().map(str::to_string);
        self.live
            .iter()
            .flat_map(|p| &p.sessions)
            .filter_map(|v| {
                Some(Candidate {
                    id: s(v, "id")?,
                    client: s(v, "client").unwrap_or_default(),
                    client_session: s(v, "client_session"),
                    parent: s(v, "parent"),
                    created_ms: v["created_ms"].as_i64().unwrap_or(0),
                    last_ms: v["last_ms"].as_i64().unwrap_or(0),
                })
            })
            .collect()
    }
}

/// Have the proxy at a registered entry's URL prove (without the admin
/// token) that it holds the entry's instance secret; Err says why not
/// ([`NO_ANSWER`] when nothing answered).
async fn prove(e: &Entry, wait: Duration) -> Result<(), String> {
    let Some(instance) = e.instance.as_deref() else {
        return Err("holds no instance secret".into());
    };
    let challenge = token::generate().map_err(|e| e.to_string())?;
    let path = format!("{}?challenge={challenge}", registry::INSTANCE_PATH);
    match AdminClient::new(&e.url, None).get(&path, wait).await {
        Ok(a) if a.json["proof"].as_str().is_some_and(|p| {
            token::matches(p, &registry::proof(instance, &challenge))
        }) =>
        {
            Ok(())
        }
        Ok(_) => Err("did not prove it is the proxy that registered (another program answers at its address)".into()),
        Err(_) => Err(NO_ANSWER.into()),
    }
}

/// Whether a proxy's data dir `theirs` is `ours` (a relative one, from a
/// working directory unknown here, is taken to be).
fn same_dir(theirs: &Path, ours: &Path) -> bool {
    if theirs.is_relative() || theirs == ours {
        return true;
    }
    match (theirs.canonicalize(), ours.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Ask a proxy for its sessions; Err says why it is not usable.
async fn ask(client: AdminClient, wait: Duration) -> Result<Live, String> {
    match client.get("/_oceancode/sessions", wait).await {
        Ok(a) if a.status.is_success() => Ok(Live {
            sessions: a.json["sessions"].as_array().cloned().unwrap_or_default(),
            data_dir: a.json["data_dir"].as_str().map(std::path::PathBuf::from),
            client,
            entry: None,
        }),
        Ok(a) if a.status == http::StatusCode::UNAUTHORIZED => {
            Err("refused the admin token (give the proxy's with --admin-token)".into())
        }
        Ok(a) => Err(format!("answered {}", a.status)),
        Err(_) => Err(NO_ANSWER.into()),
    }
}
