//! Which session a name given to a command means: the ledger id, the
//! client's own session key (the `x-oceancode-session` value, the
//! `/s/<name>` name, Claude Code's or Codex's session id), or a unique
//! prefix of either. An unknown or ambiguous name is an error that lists
//! the closest sessions. Pure: the caller passes the candidates (the
//! ledger's sessions, a running proxy's).
//!
//! A client key names its first session: the others recorded under the
//! same key (sub-agents, a later conversation) are linked to it as their
//! parent and are named by their own id.

use std::collections::BTreeMap;
use std::fmt;

/// One session a name may mean.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Ledger id.
    pub id: String,
    /// Client family (`claude-code`, `codex`, …).
    pub client: String,
    /// The client key (`name:…`, `cc:…`, `codex:…`, `opencode:…`, `fp:…`).
    pub client_session: Option<String>,
    /// The session it is linked to (the key's first session).
    pub parent: Option<String>,
    /// Unix milliseconds of creation.
    pub created_ms: i64,
    /// Unix milliseconds of the latest activity.
    pub last_ms: i64,
}

impl Candidate {
    /// The name the client gave (the key without its family prefix); None
    /// for a fingerprint key or none.
    pub fn name(&self) -> Option<&str> {
        self.client_session.as_deref().and_then(key_name)
    }
}

/// The client's own name in a client key: `name:probe` → `probe`,
/// `cc:<id>` → `<id>`; None for a fingerprint (`fp:…`).
pub fn key_name(key: &str) -> Option<&str> {
    let (family, name) = key.split_once(':')?;
    matches!(family, "name" | "cc" | "codex" | "opencode").then_some(name)
}

/// The name a user gave in a client key (`name:probe` → `probe`, from
/// `/s/<name>/` or `x-oceancode-session`); None for the ids clients make
/// up themselves (`cc:`, `codex:`, `opencode:`) and a fingerprint.
pub fn given_name(key: &str) -> Option<&str> {
    key.strip_prefix("name:")
}

/// Sessions listed with an error, at most.
pub const LISTED: usize = 5;

/// Why a name does not resolve to one session.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// There is no session at all.
    #[error("no session recorded yet")]
    NoSessions,
    /// Nothing matches; the closest sessions, best first.
    #[error("{}", unknown(.spec, .closest, *.total))]
    Unknown {
        /// The name given.
        spec: String,
        /// The closest sessions (at most [`LISTED`]).
        closest: Vec<Candidate>,
        /// Sessions there are.
        total: usize,
    },
    /// More than one session matches, most recent first.
    #[error("{}", ambiguous(.spec, .matches))]
    Ambiguous {
        /// The name given.
        spec: String,
        /// The sessions it matches.
        matches: Vec<Candidate>,
    },
}

/// The session `spec` names among `cands`: an exact ledger id; else an exact
/// client key or client name (its first session); else a unique prefix of
/// an id or a client name.
pub fn resolve(spec: &str, cands: &[Candidate]) -> Result<String, ResolveError> {
    if cands.is_empty() {
        return Err(ResolveError::NoSessions);
    }
    let spec_t = spec.trim();
    if let Some(c) = cands.iter().find(|c| c.id == spec_t) {
        return Ok(c.id.clone());
    }
    if !spec_t.is_empty() {
        let exact = by_key(cands, |key, name| {
            key == spec_t || name.is_some_and(|n| n == spec_t)
        });
        if !exact.is_empty() {
            return one(spec, exact);
        }
        let mut targets = by_key(cands, |_, name| name.is_some_and(|n| n.starts_with(spec_t)));
        for c in cands.iter().filter(|c| c.id.starts_with(spec_t)) {
            if !targets.iter().any(|t| t.id == c.id) {
                targets.push(c.clone());
            }
        }
        if !targets.is_empty() {
            return one(spec, targets);
        }
    }
    Err(ResolveError::Unknown {
        spec: spec.to_string(),
        closest: closest(spec_t, cands),
        total: cands.len(),
    })
}

/// The one session of `targets`, or the ambiguity (most recent first).
fn one(spec: &str, mut targets: Vec<Candidate>) -> Result<String, ResolveError> {
    if targets.len() == 1 {
        return Ok(targets.remove(0).id);
    }
    targets.sort_by(|a, b| b.last_ms.cmp(&a.last_ms).then_with(|| a.id.cmp(&b.id)));
    Err(ResolveError::Ambiguous {
        spec: spec.to_string(),
        matches: targets,
    })
}

/// The first session of every client key that `pick(key, name)` accepts.
fn by_key(cands: &[Candidate], pick: impl Fn(&str, Option<&str>) -> bool) -> Vec<Candidate> {
    let mut keys: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
    for c in cands {
        if let Some(k) = c.client_session.as_deref() {
            if pick(k, key_name(k)) {
                keys.entry(k).or_default().push(c);
            }
        }
    }
    keys.into_values()
        .filter_map(|group| first_of(&group))
        .collect()
}

/// A key's first session: the one not linked to another of the key's
/// sessions (the earliest such, should there be several).
fn first_of(group: &[&Candidate]) -> Option<Candidate> {
    let linked_inside = |c: &Candidate| {
        c.parent
            .as_deref()
            .is_some_and(|p| group.iter().any(|g| g.id == p))
    };
    group
        .iter()
        .filter(|c| !linked_inside(c))
        .min_by(|a, b| {
            a.created_ms
                .cmp(&b.created_ms)
                .then_with(|| a.id.cmp(&b.id))
        })
        .or_else(|| group.iter().min_by_key(|c| c.created_ms))
        .map(|c| (*c).clone())
}

/// How close `label` is to `spec`, 0 to 1 (a label containing the spec, or
/// contained in it, counts as close).
fn similarity(spec: &str, label: &str) -> f64 {
    if spec.is_empty() || label.is_empty() {
        return 0.0;
    }
    let (s, l) = (spec.to_lowercase(), label.to_lowercase());
    let edit = strsim::normalized_damerau_levenshtein(&s, &l);
    let contains = if l.contains(&s) || s.contains(&l) {
        0.5 + 0.5 * (s.len().min(l.len()) as f64 / s.len().max(l.len()) as f64)
    } else {
        0.0
    };
    edit.max(contains).max(strsim::jaro_winkler(&s, &l) * 0.9)
}

/// The [`LISTED`] sessions whose id or client name is closest to `spec`,
/// best first (the most recent first among equals).
fn closest(spec: &str, cands: &[Candidate]) -> Vec<Candidate> {
    let mut scored: Vec<(f64, &Candidate)> = cands
        .iter()
        .map(|c| {
            let by_name = c.name().map_or(0.0, |n| similarity(spec, n));
            (similarity(spec, &c.id).max(by_name), c)
        })
        .collect();
    scored.sort_by(|(sa, a), (sb, b)| {
        sb.total_cmp(sa)
            .then_with(|| b.last_ms.cmp(&a.last_ms))
            .then_with(|| a.id.cmp(&b.id))
    });
    scored
        .into_iter()
        .take(LISTED)
        .map(|(_, c)| c.clone())
        .collect()
}

/// One listed session: `  <id>  <name>  <client> · last active <time>`.
fn listed(out: &mut String, c: &Candidate) {
    use fmt::Write as _;
    let name = c.name().unwrap_or("-");
    let _ = write!(
        out,
        "\n  {}  {}  {} · last active {}",
        c.id,
        name,
        c.client,
        crate::transcript::utc_iso(c.last_ms)
    );
    if let Some(p) = &c.parent {
        let _ = write!(out, " · linked to {p}");
    }
}

fn unknown(spec: &str, closest: &[Candidate], total: usize) -> String {
    let mut out = format!(
        "no session {spec:?} (a session is named by its ledger id, the client's session name or id, or a unique prefix of one); the closest of {total}:"
    );
    for c in closest {
        listed(&mut out, c);
    }
    if total > closest.len() {
        out.push_str("\n(`oceancode-proxy ledger list` shows them all)");
    }
    out
}

fn ambiguous(spec: &str, matches: &[Candidate]) -> String {
    let mut out = format!(
        "session {spec:?} is ambiguous: it names {} sessions; give more of the id or the name:",
        matches.len()
    );
    for c in matches.iter().take(LISTED * 2) {
        listed(&mut out, c);
    }
    if matches.len() > LISTED * 2 {
        out.push_str(&format!("\n… and {} more", matches.len() - LISTED * 2));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, key: Option<&str>, parent: Option<&str>, t: i64) -> Candidate {
        Candidate {
            id: id.into(),
            client: "anthropic-sdk".into(),
            client_session: key.map(str::to_string),
            parent: parent.map(str::to_string),
            created_ms: t,
            last_ms: t + 10,
        }
    }

    fn set() -> Vec<Candidate> {
        vec![
            c("20260101-100000-s-aaaaaa", Some("name:probe"), None, 1),
            c(
                "20260101-100500-s-bbbbbb",
                Some("name:probe"),
                Some("20260101-100000-s-aaaaaa"),
                2,
            ),
            c("20260102-090000-cc-cccccc", Some("cc:7f3e-11"), None, 3),
            c(
                "20260102-090000-codex-dddddd",
                Some("codex:0199ab"),
                None,
                4,
            ),
            c("20260103-120000-s-eeeeee", Some("fp:00aa"), None, 5),
            c("20260103-130000-s-ffffff", Some("name:my-task"), None, 6),
            c("20260103-140000-s-999999", Some("name:my-other"), None, 7),
        ]
    }

    #[test]
    fn ids_prefixes_and_client_names() {
        let s = set();
        assert_eq!(resolve("20260102-090000-cc-cccccc", &s).unwrap(), s[2].id);
        assert_eq!(resolve("20260102-090000-cc", &s).unwrap(), s[2].id);
        // A client name names the key's first session, not its linked ones.
        assert_eq!(resolve("probe", &s).unwrap(), s[0].id);
        assert_eq!(resolve("name:probe", &s).unwrap(), s[0].id);
        assert_eq!(resolve("7f3e-11", &s).unwrap(), s[2].id);
        assert_eq!(resolve("cc:7f3e-11", &s).unwrap(), s[2].id);
        assert_eq!(resolve("0199ab", &s).unwrap(), s[3].id);
        assert_eq!(resolve("0199", &s).unwrap(), s[3].id, "a name prefix");
        assert_eq!(resolve("my-t", &s).unwrap(), s[5].id);
        // A linked session by its own id.
        assert_eq!(resolve(&s[1].id, &s).unwrap(), s[1].id);
        // A fingerprint key is no name, but the whole key is.
        assert!(resolve("00aa", &s).is_err());
        assert_eq!(resolve("fp:00aa", &s).unwrap(), s[4].id);
    }

    #[test]
    fn unknown_lists_the_closest_first() {
        let s = set();
        let e = resolve("prbe", &s).unwrap_err();
        let ResolveError::Unknown { closest, total, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*total, 7);
        assert_eq!(closest.len(), LISTED);
        assert_eq!(closest[0].name(), Some("probe"), "{closest:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("no session \"prbe\""), "{msg}");
        assert!(
            msg.contains("20260101-100000-s-aaaaaa  probe  anthropic-sdk"),
            "{msg}"
        );
        assert!(msg.contains("ledger list"), "{msg}");
        let e = resolve("my-tsak", &s).unwrap_err().to_string();
        let first = e.lines().nth(1).unwrap();
        assert!(first.contains("my-task"), "{e}");
        assert_eq!(resolve("x", &[]), Err(ResolveError::NoSessions));
        assert!(matches!(resolve("", &s), Err(ResolveError::Unknown { .. })));
    }

    #[test]
    fn ambiguous_lists_every_match() {
        let s = set();
        let e = resolve("2026010", &s).unwrap_err();
        let ResolveError::Ambiguous { matches, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(matches.len(), 7, "{matches:?}");
        assert!(matches.windows(2).all(|w| w[0].last_ms >= w[1].last_ms));
        assert!(
            e.to_string().contains("ambiguous: it names 7 sessions"),
            "{e}"
        );
        // Two client names starting alike.
        let e = resolve("my-", &s).unwrap_err().to_string();
        assert!(e.contains("my-task") && e.contains("my-other"), "{e}");
        // The same name under two families.
        let mut two = s.clone();
        two.push(c("20260104-000000-cc-121212", Some("cc:probe"), None, 8));
        let e = resolve("probe", &two).unwrap_err();
        assert!(
            matches!(&e, ResolveError::Ambiguous { matches, .. } if matches.len() == 2),
            "{e:?}"
        );
    }
}
