//! The PostgreSQL engine's half of the writer ([`PgDb`], a [`Db`]; the
//! loop, the retries, the files and their caches are the SQLite engine's,
//! in [`super::super::writer`]). It owns one connection, driven on a
//! current-thread runtime of the writer's thread, made again when lost;
//! a batch is one transaction ([`super::apply`]).
//!
//! Leases: before a batch writes a session it takes or renews the
//! session's lease in the same transaction (a row of `leases`, locked by
//! the upsert until commit); a session another live proxy holds is
//! refused and falls behind, so two proxies never interleave rows of one
//! session. Held leases are renewed every third of their length and
//! released at idle eviction and at shutdown.

use super::super::common::now_ms;
use super::super::effects::{Applied, Known};
use super::super::error::StoreError;
use super::super::source::Source;
use super::super::writer::{Db, Queued, Reopen};
use super::apply::{Attempt, Batch, Mode, Stmts};
use super::schema::{self, DAY_MS, NOW_MS};
use super::text::{self, TextJob};
use super::Leases;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Config, NoTls};
use tracing::{debug, warn};

/// How often the partitions ahead are made sure of.
const PARTITIONS_EVERY: Duration = Duration::from_secs(3600);
/// Sessions whose facts the writer keeps (beyond it, the map starts over).
const KNOWN_SESSIONS: usize = 100_000;

/// Whether a PostgreSQL error is the environment's (the connection, the
/// server's resources or shutdown, a lock or serialization conflict) and
/// worth retrying, rather than the event's.
pub(super) fn transient(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        // No SQLSTATE: the connection (closed, I/O, timeout).
        return true;
    };
    let code = db.code().code();
    code.starts_with("08") // connection exception
        || code.starts_with("53") // insufficient resources
        || code.starts_with("57") // operator intervention (shutdown, cancel)
        || code.starts_with("58") // system error (I/O)
        || code == "40001" // serialization failure
        || code == "40P01" // deadlock
        || code == "55P03" // lock not available
        || code == "55006" // object in use
}

/// The PostgreSQL writer's database.
pub(crate) struct PgDb {
    pub(super) rt: Runtime,
    config: Config,
    client: Option<Client>,
    pub(super) stmts: Stmts,
    leases: Arc<Leases>,
    known: HashMap<String, Known>,
    /// Committed rows whose search text waits for the next flush.
    text: Vec<TextJob>,
    /// Sessions whose lease moved (newly taken, held elsewhere, lost at
    /// renewal) or that were refused: what the writer's files cached of
    /// them may miss what another proxy wrote ([`Db::take_stale`]).
    stale: Vec<String>,
    partitions_checked: Option<Instant>,
    renewed: Instant,
    /// The connection was made again since the writer last asked
    /// ([`Db::ensure`] reports it once).
    reconnected: bool,
}

impl PgDb {
    pub(super) fn new(rt: Runtime, config: Config, client: Client, leases: Arc<Leases>) -> PgDb {
        PgDb {
            rt,
            config,
            client: Some(client),
            stmts: Stmts::default(),
            leases,
            known: HashMap::new(),
            text: Vec::new(),
            stale: Vec::new(),
            partitions_checked: None,
            renewed: Instant::now(),
            reconnected: false,
        }
    }

    /// The open connection.
    pub(super) fn client(&self) -> Result<&Client, StoreError> {
        self.client
            .as_ref()
            .filter(|c| !c.is_closed())
            .ok_or_else(|| StoreError::PgSetup("no connection to the ledger database".into()))
    }

    /// The writer's runtime and connection (made again if lost), to block
    /// on a query.
    pub(super) fn parts(&mut self) -> Result<(&Runtime, &mut Client), StoreError> {
        self.connect()?;
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| StoreError::PgSetup("no connection to the ledger database".into()))?;
        Ok((&self.rt, client))
    }

    /// The connection, made again when closed (noted in `reconnected`,
    /// whoever asked: the writer or a job); the day partitions made sure
    /// of at first and then hourly.
    fn connect(&mut self) -> Result<(), StoreError> {
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            let due = self
                .partitions_checked
                .is_none_or(|t| t.elapsed() >= PARTITIONS_EVERY);
            if due {
                self.partitions_checked = Some(Instant::now());
                let today = now_ms() / DAY_MS;
                if let Some(c) = self.client.as_mut() {
                    let r = self.rt.block_on(schema::ensure_partitions(c, today));
                    if let Err(e) = r {
                        warn!("ledger partitions not made sure of: {e}");
                    }
                }
            }
            return Ok(());
        }
        if self.client.take().is_some() {
            warn!("ledger database connection lost; reconnecting");
        }
        self.stmts.clear();
        let config = self.config.clone();
        let client = self.rt.block_on(async move {
            let (client, conn) = config.connect(NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    debug!("ledger database connection closed: {e}");
                }
            });
            Ok::<_, StoreError>(client)
        })?;
        self.client = Some(client);
        self.reconnected = true;
        Ok(())
    }

    /// Index what recent rows miss of their search text (a crash between
    /// a batch and its text): the day partitions of yesterday and today,
    /// and the older sessions active since yesterday.
    pub(super) fn backfill_text(&mut self) {
        let since = now_ms() / DAY_MS - 1;
        let Some(client) = self.client.as_mut() else {
            return;
        };
        if let Err(e) = self.rt.block_on(text::backfill(client, since)) {
            warn!("ledger search text not checked for missing rows: {e}");
        }
    }

    /// Let go of one session's lease (idle eviction).
    pub(super) fn release(&mut self, session: &str) {
        if !self.leases.held.lock().remove(session) {
            return;
        }
        self.known.remove(session);
        let owner = self.leases.owner.clone();
        let Ok(client) = self.client() else {
            return;
        };
        let r = self.rt.block_on(client.execute(
            "DELETE FROM leases WHERE session = $1 AND owner = $2",
            &[&session, &owner],
        ));
        if let Err(e) = r {
            debug!(session, "ledger lease not released: {e}");
        }
    }

    /// This proxy's name in `leases.owner`.
    pub(super) fn owner(&self) -> String {
        self.leases.owner.clone()
    }

    /// Drop a session from the held set (it was removed).
    pub(super) fn unhold(&mut self, session: &str) {
        self.leases.held.lock().remove(session);
    }
}

impl Db for PgDb {
    fn ensure(&mut self) -> Result<Reopen, StoreError> {
        // What was cached may have changed meanwhile (another proxy),
        // also when a job made the connection again.
        self.connect()?;
        Ok(if std::mem::take(&mut self.reconnected) {
            Reopen::Reconnected
        } else {
            Reopen::No
        })
    }

    fn apply(&mut self, events: &[Queued]) -> Result<Applied, StoreError> {
        if self.known.len() > KNOWN_SESSIONS {
            self.known.clear();
        }
        let mut mode = Mode::Fast;
        let mark = self.text.len();
        loop {
            let client = self.client.as_mut().ok_or_else(|| {
                StoreError::PgSetup("no connection to the ledger database".into())
            })?;
            let mut batch = Batch {
                stmts: &self.stmts,
                known: &mut self.known,
                leases: &self.leases,
                mode,
                text: &mut self.text,
                stale: &mut self.stale,
            };
            match self.rt.block_on(batch.run(client, events)) {
                Ok(Attempt::Done(applied)) => return Ok(applied),
                Ok(Attempt::Again) => {
                    // Rolled back: forget what the attempt learned.
                    self.known.clear();
                    self.text.truncate(mark);
                    mode = Mode::Careful;
                }
                Err(e) => {
                    self.known.clear();
                    self.text.truncate(mark);
                    return Err(e);
                }
            }
        }
    }

    fn source(&self) -> &dyn Source {
        self
    }

    fn deferred(&self) -> usize {
        self.text.len()
    }

    fn flush_deferred(&mut self) -> bool {
        let jobs = std::mem::take(&mut self.text);
        let Some(client) = self.client.as_mut().filter(|c| !c.is_closed()) else {
            self.text = jobs;
            return true;
        };
        match self.rt.block_on(text::write(client, &jobs)) {
            Ok(()) => false,
            Err(StoreError::Postgres(e)) if transient(&e) => {
                // Tried again with the next flush.
                debug!("ledger search text of {} rows deferred: {e}", jobs.len());
                self.text = jobs;
                true
            }
            Err(e) => {
                // The rows are committed; the next open indexes what is missing.
                warn!("ledger search text of {} rows: {e}", jobs.len());
                false
            }
        }
    }

    /// Renew every lease this proxy holds; the ones another proxy took
    /// meanwhile (this one stalled past their length) are let go.
    fn housekeeping(&mut self) {
        if self.renewed.elapsed() < self.leases.ttl / 3 {
            return;
        }
        self.renewed = Instant::now();
        let held: Vec<String> = self.leases.held.lock().iter().cloned().collect();
        if held.is_empty() {
            return;
        }
        let owner = self.leases.owner.clone();
        let ttl = self.leases.ttl.as_millis() as i64;
        let Ok(client) = self.client() else {
            return;
        };
        let sql = format!(
            "UPDATE leases SET expires_ms = {NOW_MS} + $3
             WHERE owner = $1 AND session = ANY($2) RETURNING session"
        );
        let r = self.rt.block_on(client.query(&sql, &[&owner, &held, &ttl]));
        match r {
            Ok(rows) => {
                let kept: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
                let mut h = self.leases.held.lock();
                for s in held.iter().filter(|s| !kept.contains(*s)) {
                    debug!(session = %s, "ledger lease lost to another proxy");
                    h.remove(s);
                    self.known.remove(s);
                    self.stale.push(s.clone());
                }
            }
            Err(e) => debug!("ledger leases not renewed: {e}"),
        }
    }

    fn next_housekeeping(&self) -> Option<Instant> {
        Some(self.renewed + self.leases.ttl / 3)
    }

    fn take_stale(&mut self) -> Vec<String> {
        std::mem::take(&mut self.stale)
    }

    fn forget(&mut self, session: &str) {
        self.known.remove(session);
    }

    fn forget_all(&mut self) {
        self.known.clear();
    }

    /// Let go of every lease (shutdown): other proxies take over at once.
    fn stop(&mut self) {
        let held: Vec<String> = self.leases.held.lock().drain().collect();
        if held.is_empty() {
            return;
        }
        let owner = self.leases.owner.clone();
        let Ok(client) = self.client() else {
            return;
        };
        let r = self.rt.block_on(client.execute(
            "DELETE FROM leases WHERE owner = $1 AND session = ANY($2)",
            &[&owner, &held],
        ));
        if let Err(e) = r {
            debug!("ledger leases not released at shutdown: {e}");
        }
    }
}
