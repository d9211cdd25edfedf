//! The receipt's text (pure): what a taken edit changed and the tokens
//! before → after, or why an edit was refused and on which line.

use super::edits::Taken;

fn seqs(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

fn ids(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// A thousands-separated count.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Where a note stands in a window: after the message of that seq.
fn place(id: u32, at: &[(u32, u64)]) -> String {
    match at.iter().find(|(n, _)| *n == id) {
        Some((_, 0)) => ", before every message".into(),
        Some((_, s)) => format!(", after seq {s}"),
        None => String::new(),
    }
}

/// The receipt of a taken edit. `at`: where each note stands in the
/// window (the seq of the message before it); `sent`: the window was sent
/// upstream (else it applies from the next request).
pub fn taken(
    nonce: &str,
    when: &str,
    t: &Taken,
    (before, after): (u64, u64),
    at: &[(u32, u64)],
    sent: bool,
) -> String {
    let mut out = format!("taken · export {nonce} · {when}\n");
    if t.is_empty() {
        out.push_str("- nothing changed\n");
    }
    if !t.deleted.is_empty() {
        out.push_str(&format!("- deleted seq {}\n", seqs(&t.deleted)));
    }
    if !t.rewritten.is_empty() {
        out.push_str(&format!("- rewritten seq {}\n", seqs(&t.rewritten)));
    }
    if !t.restored.is_empty() {
        out.push_str(&format!("- restored seq {}\n", seqs(&t.restored)));
    }
    for id in &t.notes_added {
        out.push_str(&format!("- note {id} added{}\n", place(*id, at)));
    }
    for id in &t.notes_changed {
        out.push_str(&format!("- note {id} changed{}\n", place(*id, at)));
    }
    if !t.notes_removed.is_empty() {
        out.push_str(&format!("- note {} removed\n", ids(&t.notes_removed)));
    }
    let delta = if after <= before {
        format!("−{}", count(before - after))
    } else {
        format!("+{}", count(after - before))
    };
    let whose = if sent {
        "in the window sent upstream"
    } else {
        "in the window from the next request on"
    };
    out.push_str(&format!(
        "tokens {} → {} ({delta}) {whose}\nthe ledger keeps every original: oceancode-proxy recall entry SEQ\n",
        count(before),
        count(after)
    ));
    out
}

/// The receipt of a refused edit.
pub fn refused(nonce: &str, when: &str, line: usize, reason: &str) -> String {
    let at = if line > 0 {
        format!("line {line}: ")
    } else {
        String::new()
    };
    format!(
        "refused · export {nonce} · {when}\n{at}{reason}\nnothing changed: the request went out as if the file had not been touched; the file was written again from the window\n"
    )
}

/// The receipt of a request the edits in force could not be applied to:
/// it went upstream as the client sent it.
pub fn unapplied(nonce: &str, when: &str, reason: &str) -> String {
    format!(
        "not applied · export {nonce} · {when}\nthe edits in force would leave this request invalid: {reason}\nthe request went out as the client sent it; the edits stay in force for the next one\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_read_plainly() {
        let t = Taken {
            deleted: vec![11, 12],
            notes_added: vec![1],
            ..Taken::default()
        };
        let r = taken("n1", "now", &t, (48_210, 8_034), &[(1, 9)], true);
        assert!(r.starts_with("taken · export n1"), "{r}");
        assert!(r.contains("- deleted seq 11, 12"), "{r}");
        assert!(r.contains("- note 1 added, after seq 9\n"), "{r}");
        assert!(
            r.contains("tokens 48,210 → 8,034 (−40,176) in the window sent upstream"),
            "{r}"
        );
        let r = taken("n1", "now", &t, (48_210, 8_034), &[], false);
        assert!(r.contains("- note 1 added\n"), "{r}");
        assert!(r.contains("from the next request on"), "{r}");
        let r = refused("n1", "now", 7, "seq 3 appears twice");
        assert!(r.starts_with("refused · export n1"), "{r}");
        assert!(r.contains("line 7: seq 3 appears twice"), "{r}");
    }
}
