//! Per-session limits (`limits.session`, `--max-spend/--max-steps/--max-time`):
//! what a session may spend at list price, how many steps it may send
//! upstream, and how long it may run. A session that reached one gets, at
//! its next request, an error the agents treat as final
//! ([`crate::error::ProxyError::LimitReached`]): nothing is forwarded.
//!
//! A session is charged together with the sessions linked to it (its
//! sub-agents and siblings: one client session's work); the charge goes
//! to the root of the links. Steps are counted when a request is let
//! through (so concurrent requests cannot overshoot), spend when its
//! answer tells its usage (the step that crosses the cap completes),
//! time from the root's first request. After a restart the root's own
//! recorded spend and steps are read back once ([`SpendSeed`]).

use super::{now_ms, Session, SessionManager};
use oceancode_config::{format_duration, Price, SessionLimitsConfig};
use oceancode_ledger::Usage;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The list price of a model (None = not in the price table).
pub type Pricer = Arc<dyn Fn(&str) -> Option<Price> + Send + Sync>;

/// What the ledger holds of a session's spend and steps (after a restart,
/// or once it left memory); called once per session, outside every lock.
pub type SpendSeed = Arc<dyn Fn(&str) -> Option<Spent> + Send + Sync>;

/// The bounds in force (each off when None) and the price table.
#[derive(Clone, Default)]
pub struct SessionLimits {
    /// Most USD at list price.
    pub spend_usd: Option<f64>,
    /// Most steps sent upstream.
    pub steps: Option<u32>,
    /// Longest run, from the session's first request.
    pub time: Option<Duration>,
    /// Prices (required for the spend bound to count anything).
    pub pricer: Option<Pricer>,
}

impl SessionLimits {
    /// The bounds of `limits.session`, priced by `pricer`.
    pub fn from_config(c: &SessionLimitsConfig, pricer: Pricer) -> Self {
        SessionLimits {
            spend_usd: c.spend_usd,
            steps: c.steps,
            time: c.time,
            pricer: Some(pricer),
        }
    }

    /// Whether any bound is set.
    pub fn any(&self) -> bool {
        self.spend_usd.is_some() || self.steps.is_some() || self.time.is_some()
    }
}

/// What a session (with its linked sessions) has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spent {
    /// USD at list price of the priced steps.
    pub usd: f64,
    /// Steps let through.
    pub steps: u32,
    /// Some step's model had no price (`usd` misses it).
    pub unpriced: bool,
}

/// Which bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// `limits.session.spend_usd`, `--max-spend`.
    Spend,
    /// `limits.session.steps`, `--max-steps`.
    Steps,
    /// `limits.session.time`, `--max-time`.
    Time,
}

impl Limit {
    /// `spend`, `step`, `time`: as the messages name it.
    pub fn noun(self) -> &'static str {
        match self {
            Limit::Spend => "spend",
            Limit::Steps => "step",
            Limit::Time => "time",
        }
    }

    /// The config key and the flag that set it.
    pub fn source(self) -> &'static str {
        match self {
            Limit::Spend => "limits.session.spend_usd, --max-spend",
            Limit::Steps => "limits.session.steps, --max-steps",
            Limit::Time => "limits.session.time, --max-time",
        }
    }
}

/// A session that reached a bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitHit {
    /// Which bound.
    pub limit: Limit,
    /// The session charged (the root of the links).
    pub session: String,
    /// What it used: `$0.0512`, `5 steps`, `30m5s`.
    pub used: String,
    /// The bound: `$0.05`, `5 steps`, `30m`.
    pub cap: String,
}

impl LimitHit {
    /// `session … reached its spend limit: $0.0512 spent of $0.05 (…)`.
    pub fn describe(&self) -> String {
        let verb = match self.limit {
            Limit::Spend => "spent",
            Limit::Steps => "made",
            Limit::Time => "elapsed",
        };
        format!(
            "session {} reached its {} limit: {} {verb} of {} ({})",
            self.session,
            self.limit.noun(),
            self.used,
            self.cap,
            self.limit.source()
        )
    }

    /// What the refused request's error says.
    pub fn message(&self) -> String {
        format!(
            "oceancode-proxy: {}. The proxy refuses this session's further requests: the run is over, do not retry.",
            self.describe()
        )
    }
}

/// A session's use against the bounds, as `status` and the admin API show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetView {
    /// The session charged (the root of the links).
    pub charged_to: String,
    /// USD spent at list price.
    pub spent_usd: f64,
    /// Some step had no price (`spent_usd` misses it).
    pub unpriced: bool,
    /// The spend bound.
    pub spend_cap_usd: Option<f64>,
    /// Steps let through.
    pub steps: u32,
    /// The step bound.
    pub steps_cap: Option<u32>,
    /// Milliseconds since the root's first request.
    pub elapsed_ms: u64,
    /// The time bound, ms.
    pub time_cap_ms: Option<u64>,
    /// The bound reached, if one was.
    pub hit: Option<LimitHit>,
    /// What it reached, said ([`LimitHit::describe`]).
    pub stopped: Option<String>,
}

/// The bounds and what each session used.
pub struct Budget {
    limits: SessionLimits,
    seed: Option<SpendSeed>,
    /// By root session id.
    spent: Mutex<HashMap<String, Spent>>,
    /// Session id → the root it is charged to.
    roots: Mutex<HashMap<String, String>>,
    /// The first bound each root reached, in the order reached.
    hits: Mutex<Vec<LimitHit>>,
    /// Models without a price, warned about once.
    unpriced: Mutex<HashSet<String>>,
}

impl Budget {
    /// A budget for `limits`; `seed` reads a restored session's use back.
    pub fn new(limits: SessionLimits, seed: Option<SpendSeed>) -> Self {
        Budget {
            limits,
            seed,
            spent: Mutex::new(HashMap::new()),
            roots: Mutex::new(HashMap::new()),
            hits: Mutex::new(Vec::new()),
            unpriced: Mutex::new(HashSet::new()),
        }
    }

    /// The bounds in force.
    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// The bounds reached so far (first per session, in order).
    pub fn hits(&self) -> Vec<LimitHit> {
        self.hits.lock().clone()
    }

    /// The cost of one step's billed usage (None: no price for `model`).
    fn cost(&self, model: &str, u: Usage) -> Option<f64> {
        let p = self.limits.pricer.as_ref().and_then(|p| p(model))?;
        Some(p.cost_usd(u.input, u.output, u.cache_read, u.cache_write))
    }

    /// A finished step of session `id`: add its billed usage (the window
    /// and what came on top of it) to its root's spend.
    pub fn charge(&self, id: &str, model: &str, billed: Usage) {
        if billed.window_total() == 0 {
            return;
        }
        let Some(root) = self.roots.lock().get(id).cloned() else {
            return;
        };
        let cost = self.cost(model, billed);
        if cost.is_none()
            && self.limits.spend_usd.is_some()
            && self.unpriced.lock().insert(model.to_string())
        {
            tracing::warn!(model, "no price for this model: the spend limit cannot count its steps (set providers.<id>.models[].price)");
        }
        let mut spent = self.spent.lock();
        let s = spent.entry(root).or_default();
        match cost {
            Some(c) => s.usd += c,
            None => s.unpriced = true,
        }
    }

    /// The first bound `s` reached, if any.
    fn reached(&self, root: &str, s: &Spent, elapsed_ms: u64) -> Option<LimitHit> {
        let l = &self.limits;
        let hit = |limit, used: String, cap: String| LimitHit {
            limit,
            session: root.to_string(),
            used,
            cap,
        };
        if let Some(cap) = l.spend_usd {
            if s.usd >= cap {
                return Some(hit(Limit::Spend, usd(s.usd), usd(cap)));
            }
        }
        if let Some(cap) = l.steps {
            if s.steps >= cap {
                return Some(hit(Limit::Steps, steps(s.steps), steps(cap)));
            }
        }
        if let Some(cap) = l.time {
            if elapsed_ms >= cap.as_millis() as u64 {
                return Some(hit(
                    Limit::Time,
                    format_duration(Duration::from_millis(elapsed_ms)),
                    format_duration(cap),
                ));
            }
        }
        None
    }
}

/// `$0.0512` (four decimals under a dollar, else cents).
pub fn usd(v: f64) -> String {
    if v < 1.0 {
        format!("${v:.4}")
    } else {
        format!("${v:.2}")
    }
}

fn steps(n: u32) -> String {
    format!("{n} step{}", if n == 1 { "" } else { "s" })
}

impl SessionManager {
    /// The root a session is charged to (the end of its links among the
    /// sessions in memory) and when it began.
    fn budget_root(&self, session: &Session) -> (String, i64) {
        let (mut id, mut created, mut parent) = {
            let st = session.state.lock();
            (
                st.meta.id.clone(),
                st.meta.created_ms,
                st.meta.parent.clone(),
            )
        };
        for _ in 0..32 {
            let Some(p) = parent.take().and_then(|p| self.get(&p)) else {
                break;
            };
            let st = p.state.lock();
            id.clone_from(&st.meta.id);
            created = st.meta.created_ms;
            parent.clone_from(&st.meta.parent);
        }
        (id, created)
    }

    /// Let a request of `session` through, counting its step, or the bound
    /// its session already reached.
    pub(super) fn admit(&self, session: &Session) -> Result<(), LimitHit> {
        let Some(b) = &self.budget else {
            return Ok(());
        };
        let (root, created) = self.budget_root(session);
        b.roots.lock().insert(session.id.clone(), root.clone());
        let known = b.spent.lock().contains_key(&root);
        if !known {
            // A root with recorded steps came back from the ledger: what it
            // used before counts (read outside every lock).
            let restored = self.get(&root).is_some_and(|r| r.state.lock().step > 0);
            let seeded = if restored {
                b.seed.as_ref().and_then(|f| f(&root))
            } else {
                None
            };
            b.spent
                .lock()
                .entry(root.clone())
                .or_insert(seeded.unwrap_or_default());
        }
        let elapsed = u64::try_from(now_ms().saturating_sub(created)).unwrap_or(0);
        let mut spent = b.spent.lock();
        let s = spent.entry(root.clone()).or_default();
        if let Some(hit) = b.reached(&root, s, elapsed) {
            drop(spent);
            let mut hits = b.hits.lock();
            if !hits.iter().any(|h| h.session == hit.session) {
                tracing::warn!(session = %root, "{}: its further requests are refused", hit.describe());
                hits.push(hit.clone());
            }
            return Err(hit);
        }
        s.steps += 1;
        Ok(())
    }

    /// The bounds reached so far (what `run` reports).
    pub fn limit_hits(&self) -> Vec<LimitHit> {
        self.budget.as_ref().map(|b| b.hits()).unwrap_or_default()
    }

    /// A session's use against the bounds (None: no bound is set).
    pub fn budget_view(&self, session: &Session) -> Option<BudgetView> {
        let b = self.budget.as_ref()?;
        let (root, created) = self.budget_root(session);
        let s = b.spent.lock().get(&root).copied().unwrap_or_default();
        let hit = b.hits.lock().iter().find(|h| h.session == root).cloned();
        let l = &b.limits;
        Some(BudgetView {
            elapsed_ms: u64::try_from(now_ms().saturating_sub(created)).unwrap_or(0),
            charged_to: root,
            spent_usd: s.usd,
            unpriced: s.unpriced,
            spend_cap_usd: l.spend_usd,
            steps: s.steps,
            steps_cap: l.steps,
            time_cap_ms: l.time.map(|d| d.as_millis() as u64),
            stopped: hit.as_ref().map(LimitHit::describe),
            hit,
        })
    }

    /// Apply `limits` (none set: no budget is kept).
    pub fn with_budget(mut self, limits: SessionLimits, seed: Option<SpendSeed>) -> Self {
        self.budget = limits.any().then(|| Arc::new(Budget::new(limits, seed)));
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: failures panic
    use super::*;

    fn budget(spend: Option<f64>, steps: Option<u32>, time: Option<Duration>) -> Budget {
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        };
        Budget::new(
            SessionLimits {
                spend_usd: spend,
                steps,
                time,
                pricer: Some(Arc::new(move |m: &str| (m == "priced").then_some(price))),
            },
            None,
        )
    }

    #[test]
    fn spend_counts_cache_reads_and_writes_at_their_prices() {
        let b = budget(Some(1.0), None, None);
        b.roots.lock().insert("child".into(), "root".into());
        let u = Usage {
            input: 100_000,
            output: 10_000,
            cache_read: 1_000_000,
            cache_write: 200_000,
        };
        b.charge("child", "priced", u);
        let s = b.spent.lock()["root"];
        // 0.3 + 0.15 + 0.3 + 0.75
        assert!((s.usd - 1.5).abs() < 1e-9, "{}", s.usd);
        let hit = b.reached("root", &s, 0).unwrap();
        assert_eq!(hit.limit, Limit::Spend);
        assert_eq!((hit.used.as_str(), hit.cap.as_str()), ("$1.50", "$1.00"));
        assert!(hit.message().contains("spend limit: $1.50 spent of $1.00"));
        // A model without a price is marked, not counted.
        b.charge("child", "unknown", u);
        let s = b.spent.lock()["root"];
        assert!(s.unpriced && (s.usd - 1.5).abs() < 1e-9);
    }

    #[test]
    fn each_bound_is_reached_at_its_amount() {
        let b = budget(None, Some(3), Some(Duration::from_secs(1800)));
        let s = Spent {
            steps: 2,
            ..Spent::default()
        };
        assert_eq!(b.reached("r", &s, 1_799_999), None);
        let s3 = Spent { steps: 3, ..s };
        let hit = b.reached("r", &s3, 0).unwrap();
        assert_eq!(hit.limit, Limit::Steps);
        assert_eq!(
            hit.describe(),
            "session r reached its step limit: 3 steps made of 3 steps (limits.session.steps, --max-steps)"
        );
        let hit = b.reached("r", &s, 1_805_000).unwrap();
        assert_eq!(hit.limit, Limit::Time);
        assert_eq!((hit.used.as_str(), hit.cap.as_str()), ("30m5s", "30m"));
    }
}
