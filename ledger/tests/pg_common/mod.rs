//! The backends the shared store tests run against: SQLite always, and
//! PostgreSQL when `OCEANCODE_TEST_DATABASE_URL` names a server (`.ci/run`
//! starts a throwaway cluster and exports it; `.ci/pg.sh start DIR` does so
//! by hand). Each PostgreSQL test gets a database of its own. Without the
//! variable the PostgreSQL half is skipped with a line saying so, except
//! under CI (`CI` set), where it fails.
#![allow(dead_code)]

use oceancode_ledger::store::pg::PgStore;
use oceancode_ledger::store::{LedgerStore, Store, StoreOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub const URL_VAR: &str = "OCEANCODE_TEST_DATABASE_URL";

/// The server's URL, if the PostgreSQL half runs.
pub fn server_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("{URL_VAR} is not set under CI: the PostgreSQL store tests must run");
            }
            eprintln!(
                "SKIPPED: the PostgreSQL half of this test ({URL_VAR} is not set; `.ci/pg.sh start DIR` starts a server)"
            );
            None
        }
    }
}

/// `url` with another database name.
pub fn with_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    format!("{base}/{db}{query}")
}

/// Run SQL on the server's own database.
pub fn admin(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test server");
        tokio::spawn(conn);
        c.batch_execute(sql).await.expect("admin sql");
    });
}

/// A fresh, empty database on the test server: its URL.
pub fn fresh_db() -> Option<String> {
    static N: AtomicU32 = AtomicU32::new(0);
    let url = server_url()?;
    let name = format!(
        "oc_test_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    admin(&url, &format!("CREATE DATABASE {name}"));
    Some(with_db(&url, &name))
}

/// One backend of the parameterized suite.
#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    Postgres(String),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    pub fn open(&self, dir: &Path) -> Arc<dyn LedgerStore> {
        self.open_with(dir, StoreOptions::default())
    }

    pub fn open_with(&self, dir: &Path, opts: StoreOptions) -> Arc<dyn LedgerStore> {
        match self {
            Backend::Sqlite => Arc::new(Store::open(dir, opts).expect("open sqlite store")),
            Backend::Postgres(url) => {
                Arc::new(PgStore::open(url, dir, opts).expect("open postgres store"))
            }
        }
    }
}

/// SQLite, then PostgreSQL (a database of its own) when a server is set.
pub fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Sqlite];
    if let Some(url) = fresh_db() {
        v.push(Backend::Postgres(url));
    }
    v
}
