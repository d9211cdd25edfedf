//! Session limits (`limits.session`, `--max-spend/--max-steps/--max-time`):
//! what a session may spend at list price, how many steps it may send
//! upstream, and how long it may run. A session that reached one gets, at
//! its next request, an error the agents treat as final
//! ([`crate::error::ProxyError::LimitReached`]): nothing is forwarded.
//!
//! A session is charged together with the sessions linked to it (its
//! sub-agents and siblings: one client session's work); the charge goes
//! to the root of the links. Under `run` ([`SessionLimits::run_wide`]) one
//! budget holds every session the run sees, whatever names they declare.
//! Requests that are not recorded (titles, summaries, remote compaction)
//! are charged too: to their client key's session (or the run).
//!
//! Steps are counted when a request is let through. Spend is reserved
//! when a request is let through — an [`Estimate`]: its body's tokens at
//! the input price and its `max_tokens` (else the model's output
//! allowance) at the output price — and settled to the billed usage when
//! its answer ends (released when it fails), so requests in flight at once
//! cannot pass the cap together: a request whose reservation would take
//! spent + reserved past the cap is refused. Time runs from the root's
//! first request (the run's first under `run`). After a restart the root's
//! own recorded spend and steps are read back once ([`SpendSeed`]).

use super::{Clock, Session, SessionManager};
pub use crate::error::{Limit, LimitHit};
use oceancode_config::{format_duration, Price, SessionLimitsConfig};
use oceancode_ledger::status;
use oceancode_window::Usage;
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
    /// One budget for every session (`run`: the bounds hold for the whole
    /// run, however many sessions or names its agent makes); else one per
    /// session (with its linked sessions).
    pub run_wide: bool,
}

impl SessionLimits {
    /// The bounds of `limits.session`, priced by `pricer`.
    pub fn from_config(c: &SessionLimitsConfig, pricer: Pricer) -> Self {
        SessionLimits {
            spend_usd: c.spend_usd,
            steps: c.steps,
            time: c.time,
            pricer: Some(pricer),
            run_wide: false,
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
    /// USD reserved by the requests in flight (settled when they end).
    #[serde(skip)]
    pub reserved: f64,
    /// Requests in flight holding a reservation.
    #[serde(skip)]
    pub in_flight: u32,
}

impl Spent {
    /// A request in flight that reserved `usd` ended.
    fn release(&mut self, usd: f64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        // None left in flight: exactly nothing reserved (no float residue).
        self.reserved = if self.in_flight == 0 {
            0.0
        } else {
            (self.reserved - usd).max(0.0)
        };
    }
}

/// The most a request may cost: its model and its bounded usage.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// The model it asks for.
    pub model: String,
    /// Input: its body's tokens (within the model's context window);
    /// output: its `max_tokens`, else the model's output allowance.
    pub usage: Usage,
}

/// The key of the run-wide budget.
pub const RUN_KEY: &str = "run";

/// The key of requests no session or client key can be charged to.
pub const UNATTRIBUTED: &str = "(unattributed requests)";

/// A session's use against the bounds, as `status` and the admin API show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetView {
    /// The session charged (the root of the links; `run` under `run`).
    pub charged_to: String,
    /// USD spent at list price.
    pub spent_usd: f64,
    /// USD reserved by requests in flight.
    pub reserved_usd: f64,
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
    /// When its first request came (0: none yet): when the run's time
    /// began under `run`.
    first_ms: std::sync::atomic::AtomicI64,
    /// By root session id (or [`RUN_KEY`], or a client key).
    spent: Mutex<HashMap<String, Spent>>,
    /// The first bound each root reached, in the order reached: its
    /// further requests are refused with it.
    hits: Mutex<Vec<LimitHit>>,
    /// Models without a price, warned about once.
    unpriced: Mutex<HashSet<String>>,
    /// What time limits are read from.
    clock: Clock,
}

/// Spend reserved for one request let through: settled to what its answer
/// was billed ([`Reservation::settle`]), released when dropped unsettled
/// (no answer, no usage).
pub struct Reservation {
    budget: Arc<Budget>,
    key: String,
    usd: f64,
    /// The model the request asked for (charged when the answer names none).
    model: String,
    done: bool,
}

impl Reservation {
    /// The model the request asked for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The answer was billed `billed` for `model` (the request's when
    /// empty): it replaces the reservation in the spend.
    pub fn settle(mut self, model: &str, billed: Usage) {
        let model = if model.is_empty() {
            self.model.clone()
        } else {
            model.to_string()
        };
        let cost = if billed.window_total() == 0 {
            Some(0.0)
        } else {
            self.budget.cost_warned(&model, billed)
        };
        let mut spent = self.budget.spent.lock();
        let s = spent.entry(self.key.clone()).or_default();
        s.release(self.usd);
        match cost {
            Some(c) => s.usd += c,
            None => s.unpriced = true,
        }
        self.done = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut spent = self.budget.spent.lock();
        if let Some(s) = spent.get_mut(&self.key) {
            s.release(self.usd);
        }
    }
}

/// Output tokens reserved for a request that names no `max_tokens` and
/// whose model's allowance is unknown.
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 32_000;

impl Budget {
    /// A budget for `limits`; `seed` reads a restored session's use back.
    pub fn new(limits: SessionLimits, seed: Option<SpendSeed>) -> Self {
        Budget {
            limits,
            seed,
            first_ms: std::sync::atomic::AtomicI64::new(0),
            spent: Mutex::new(HashMap::new()),
            hits: Mutex::new(Vec::new()),
            unpriced: Mutex::new(HashSet::new()),
            clock: Clock::wall(),
        }
    }

    /// The budget reading the time from `clock`.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The bounds in force.
    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// The bounds reached so far (first per session, in order).
    pub fn hits(&self) -> Vec<LimitHit> {
        self.hits.lock().clone()
    }

    /// When the first request came (now, for the first).
    fn first_request_ms(&self) -> i64 {
        use std::sync::atomic::Ordering;
        let now = self.clock.now_ms();
        match self
            .first_ms
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => now,
            Err(first) => first,
        }
    }

    /// The cost of one step's billed usage (None: no price for `model`).
    fn cost(&self, model: &str, u: Usage) -> Option<f64> {
        let p = self.limits.pricer.as_ref().and_then(|p| p(model))?;
        Some(p.cost_usd(u.input, u.output, u.cache_read, u.cache_write))
    }

    /// [`Budget::cost`], warning once per model without a price.
    fn cost_warned(&self, model: &str, u: Usage) -> Option<f64> {
        let cost = self.cost(model, u);
        if cost.is_none()
            && self.limits.spend_usd.is_some()
            && self.unpriced.lock().insert(model.to_string())
        {
            tracing::warn!(model, "no price for this model: the spend limit cannot count its steps (set providers.<id>.models[].price)");
        }
        cost
    }

    /// Let a request charged to `key` through, or the bound it reached:
    /// its step counted (`step`: a recorded step), the most it may cost
    /// (`est`) reserved, all at once under the lock (so requests in flight
    /// together cannot pass the cap together). A key that was refused once
    /// stays refused.
    fn take(
        self: &Arc<Self>,
        key: &str,
        started_ms: i64,
        est: Option<&Estimate>,
        step: bool,
    ) -> Result<Reservation, LimitHit> {
        let want = est
            .filter(|_| self.limits.spend_usd.is_some())
            .and_then(|e| self.cost_warned(&e.model, e.usage))
            .unwrap_or(0.0);
        let elapsed = u64::try_from(self.clock.now_ms().saturating_sub(started_ms)).unwrap_or(0);
        let mut spent = self.spent.lock();
        let s = spent.entry(key.to_string()).or_default();
        let refused = {
            let hits = self.hits.lock();
            hits.iter().find(|h| h.session == key).cloned()
        };
        if let Some(hit) = refused {
            return Err(hit);
        }
        if let Some(hit) = self.reached(key, s, elapsed, want) {
            drop(spent);
            let mut hits = self.hits.lock();
            if !hits.iter().any(|h| h.session == hit.session) {
                tracing::warn!(session = %key, "{}: its further requests are refused", hit.describe());
                hits.push(hit.clone());
            }
            return Err(hit);
        }
        if step {
            s.steps += 1;
        }
        s.reserved += want;
        s.in_flight += 1;
        Ok(Reservation {
            budget: self.clone(),
            key: key.to_string(),
            usd: want,
            model: est.map(|e| e.model.clone()).unwrap_or_default(),
            done: false,
        })
    }

    /// The first bound `s` reached, or that a request reserving `want`
    /// USD would pass, if any.
    fn reached(&self, root: &str, s: &Spent, elapsed_ms: u64, want: f64) -> Option<LimitHit> {
        let l = &self.limits;
        let hit = |limit, used: String, cap: String| LimitHit {
            limit,
            session: root.to_string(),
            used,
            cap,
            pending: None,
            run: l.run_wide,
        };
        if let Some(cap) = l.spend_usd {
            if s.usd >= cap {
                return Some(hit(Limit::Spend, usd(s.usd), usd(cap)));
            }
            if want > 0.0 && s.usd + s.reserved + want > cap {
                let n = s.in_flight;
                let held = format!(
                    "{} reserved by {n} request{} in flight, up to {} for this one",
                    usd(s.reserved),
                    if n == 1 { "" } else { "s" },
                    usd(want)
                );
                return Some(LimitHit {
                    pending: Some(held),
                    ..hit(Limit::Spend, usd(s.usd), usd(cap))
                });
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

    /// What `session`'s requests are charged to, and since when time runs.
    fn budget_key(&self, b: &Budget, session: &Session) -> (String, i64) {
        if b.limits.run_wide {
            return (RUN_KEY.to_string(), b.first_request_ms());
        }
        self.budget_root(session)
    }

    /// Whether a bound is set (requests are then admitted one by one).
    pub fn budgeted(&self) -> bool {
        self.budget.is_some()
    }

    /// The most a request for `model` of `body_len` bytes asking for
    /// `max_tokens` may cost: the body's tokens (at most the model's
    /// context window) and its `max_tokens` (at most the model's output
    /// allowance; without it the allowance, else
    /// [`DEFAULT_OUTPUT_ESTIMATE`]).
    pub(super) fn estimate(
        &self,
        model: &str,
        body_len: usize,
        max_tokens: Option<u64>,
    ) -> Estimate {
        let m = (self.settings.models)(model, None);
        let input = (body_len as f64 / super::DEFAULT_BYTES_PER_TOKEN).ceil() as u64;
        let input = m.context.map_or(input, |c| input.min(c));
        let output = match (max_tokens, m.max_output) {
            (Some(t), Some(most)) => t.min(most),
            (Some(t), None) => t,
            (None, Some(most)) => most,
            (None, None) => DEFAULT_OUTPUT_ESTIMATE,
        };
        Estimate {
            model: model.to_string(),
            usage: Usage {
                input,
                output,
                ..Usage::default()
            },
        }
    }

    /// Let a request of `session` through, counting its step and reserving
    /// `est`, or the bound its session already reached (or `est` would pass).
    pub(super) fn admit(
        &self,
        session: &Session,
        est: Option<&Estimate>,
    ) -> Result<Option<Reservation>, LimitHit> {
        let Some(b) = &self.budget else {
            return Ok(None);
        };
        let (key, started) = self.budget_key(b, session);
        if !b.limits.run_wide && !b.spent.lock().contains_key(&key) {
            // A root with recorded steps came back from the ledger: what it
            // used before counts (read outside every lock).
            let restored = self.get(&key).is_some_and(|r| r.state.lock().step > 0);
            let seeded = if restored {
                b.seed.as_ref().and_then(|f| f(&key))
            } else {
                None
            };
            b.spent
                .lock()
                .entry(key.clone())
                .or_insert(seeded.unwrap_or_default());
        }
        b.take(&key, started, est, true).map(Some)
    }

    /// The first request a bound refused on a recorded session leaves its
    /// trace in the ledger, for `status` and the viewer once the proxy is
    /// gone: a failed step whose error is [`status::STOPPED`] and why
    /// (the client got the refusal: Anthropic 402, OpenAI 400).
    pub(super) fn record_stop(&self, session: &Session, model: &str, hit: &LimitHit) {
        let mut st = session.state.lock();
        if st.stopped {
            return;
        }
        st.stopped = true;
        st.step += 1;
        let code = if st.dialect == oceancode_window::Dialect::Anthropic {
            402
        } else {
            400
        };
        let ev = oceancode_window::Event::Step {
            session: st.meta.id.clone(),
            step: st.step,
            model: model.to_string(),
            status: code,
            usage: Usage::default(),
            window_rows: 0,
            ts_ms: self.now_ms(),
            error: Some(format!("{}{}", status::STOPPED, hit.describe())),
            detail: Box::default(),
        };
        st.emit(&self.sink, vec![ev]);
    }

    /// Let a request that records no step through (a title, a summary,
    /// remote compaction; a request when the ledger is off), reserving
    /// `est`: charged to the session of its client key (the run under
    /// `run`; the key itself when it has no session yet; else one budget
    /// for every request without a key). Counts a step when `step` (a turn
    /// of the conversation the ledger does not record: it is off).
    pub(super) fn admit_unrecorded(
        &self,
        client_key: Option<&str>,
        est: Option<&Estimate>,
        step: bool,
    ) -> Result<Option<Reservation>, LimitHit> {
        let Some(b) = &self.budget else {
            return Ok(None);
        };
        let (key, started) = if b.limits.run_wide {
            (RUN_KEY.to_string(), b.first_request_ms())
        } else {
            let session = client_key.and_then(|k| self.candidates(k).into_iter().next());
            match (session, client_key) {
                (Some(s), _) => self.budget_root(&s),
                (None, Some(k)) => (k.to_string(), self.now_ms()),
                (None, None) => (UNATTRIBUTED.to_string(), b.first_request_ms()),
            }
        };
        b.take(&key, started, est, step).map(Some)
    }

    /// The bounds reached so far (what `run` reports).
    pub fn limit_hits(&self) -> Vec<LimitHit> {
        self.budget.as_ref().map(|b| b.hits()).unwrap_or_default()
    }

    /// A session's use against the bounds (None: no bound is set).
    pub fn budget_view(&self, session: &Session) -> Option<BudgetView> {
        let b = self.budget.as_ref()?;
        let (root, created) = self.budget_key(b, session);
        let s = b.spent.lock().get(&root).copied().unwrap_or_default();
        let hit = b.hits.lock().iter().find(|h| h.session == root).cloned();
        let l = &b.limits;
        Some(BudgetView {
            elapsed_ms: u64::try_from(self.now_ms().saturating_sub(created)).unwrap_or(0),
            charged_to: root,
            spent_usd: s.usd,
            reserved_usd: s.reserved,
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
        let clock = self.settings.clock.clone();
        self.budget = limits
            .any()
            .then(|| Arc::new(Budget::new(limits, seed).with_clock(clock)));
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: failures panic
    use super::*;
    use oceancode_ledger::time::now_ms;

    fn budget(spend: Option<f64>, steps: Option<u32>, time: Option<Duration>) -> Arc<Budget> {
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        };
        Arc::new(Budget::new(
            SessionLimits {
                spend_usd: spend,
                steps,
                time,
                pricer: Some(Arc::new(move |m: &str| (m == "priced").then_some(price))),
                run_wide: false,
            },
            None,
        ))
    }

    fn est(input: u64, output: u64) -> Estimate {
        Estimate {
            model: "priced".into(),
            usage: Usage {
                input,
                output,
                ..Usage::default()
            },
        }
    }

    #[test]
    fn spend_counts_cache_reads_and_writes_at_their_prices() {
        let b = budget(Some(2.0), None, None);
        let r = b.take("root", now_ms(), None, true).unwrap();
        let u = Usage {
            input: 100_000,
            output: 10_000,
            cache_read: 1_000_000,
            cache_write: 200_000,
        };
        r.settle("priced", u);
        let s = b.spent.lock()["root"];
        // 0.3 + 0.15 + 0.3 + 0.75
        assert!((s.usd - 1.5).abs() < 1e-9, "{}", s.usd);
        assert_eq!(b.reached("root", &s, 0, 0.0), None);
        let s2 = Spent { usd: 2.5, ..s };
        let hit = b.reached("root", &s2, 0, 0.0).unwrap();
        assert_eq!(hit.limit, Limit::Spend);
        assert_eq!((hit.used.as_str(), hit.cap.as_str()), ("$2.50", "$2.00"));
        assert!(hit.message().contains("spend limit: $2.50 spent of $2.00"));
        // A model without a price is marked, not counted.
        let r = b.take("root", now_ms(), None, true).unwrap();
        r.settle("unknown", u);
        let s = b.spent.lock()["root"];
        assert!(s.unpriced && (s.usd - 1.5).abs() < 1e-9);
    }

    #[test]
    fn a_reservation_holds_the_spend_until_it_is_settled_or_dropped() {
        let b = budget(Some(1.0), None, None);
        // Each may cost 0.3 (100k in at $3/M, none out): three fit, not four.
        let e = est(100_000, 0);
        let held: Vec<_> = (0..3)
            .map(|_| b.take("r", now_ms(), Some(&e), true).unwrap())
            .collect();
        let hit = b.take("r", now_ms(), Some(&e), true).err().unwrap();
        assert_eq!(hit.limit, Limit::Spend);
        assert_eq!(
            hit.describe(),
            "session r would pass its spend limit: $0.0000 spent, $0.9000 reserved by 3 requests in flight, up to $0.3000 for this one, of $1.00 (limits.session.spend_usd, --max-spend)"
        );
        // Refused once, refused after: the hit stands.
        drop(held);
        assert_eq!(b.spent.lock()["r"].reserved, 0.0);
        assert!(b.take("r", now_ms(), Some(&e), true).is_err());
        // Settling replaces the reservation by the billed cost.
        let b = budget(Some(1.0), None, None);
        let r = b.take("r", now_ms(), Some(&e), true).unwrap();
        assert!((b.spent.lock()["r"].reserved - 0.3).abs() < 1e-9);
        r.settle(
            "",
            Usage {
                input: 10_000,
                ..Usage::default()
            },
        );
        let s = b.spent.lock()["r"];
        assert!((s.usd - 0.03).abs() < 1e-9 && s.reserved == 0.0 && s.in_flight == 0);
    }

    #[test]
    fn each_bound_is_reached_at_its_amount() {
        let b = budget(None, Some(3), Some(Duration::from_secs(1800)));
        let s = Spent {
            steps: 2,
            ..Spent::default()
        };
        assert_eq!(b.reached("r", &s, 1_799_999, 0.0), None);
        let s3 = Spent { steps: 3, ..s };
        let hit = b.reached("r", &s3, 0, 0.0).unwrap();
        assert_eq!(hit.limit, Limit::Steps);
        assert_eq!(
            hit.describe(),
            "session r reached its step limit: 3 steps made of 3 steps (limits.session.steps, --max-steps)"
        );
        let hit = b.reached("r", &s, 1_805_000, 0.0).unwrap();
        assert_eq!(hit.limit, Limit::Time);
        assert_eq!((hit.used.as_str(), hit.cap.as_str()), ("30m5s", "30m"));
    }
}
