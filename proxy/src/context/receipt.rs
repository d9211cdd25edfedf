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

/// The receipt of a taken edit.
pub fn taken(nonce: &str, when: &str, t: &Taken, before: u64, after: u64) -> String {
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
    if !t.notes_added.is_empty() {
        out.push_str(&format!("- note {} added\n", ids(&t.notes_added)));
    }
    if !t.notes_changed.is_empty() {
        out.push_str(&format!("- note {} changed\n", ids(&t.notes_changed)));
    }
    if !t.notes_removed.is_empty() {
        out.push_str(&format!("- note {} removed\n", ids(&t.notes_removed)));
    }
    let delta = if after <= before {
        format!("−{}", count(before - after))
    } else {
        format!("+{}", count(after - before))
    };
    out.push_str(&format!(
        "tokens {} → {} ({delta}) in the window sent upstream\nthe ledger keeps every original: oceancode-proxy recall entry SEQ\n",
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
        let r = taken("n1", "now", &t, 48_210, 8_034);
        assert!(r.starts_with("taken · export n1"), "{r}");
        assert!(r.contains("- deleted seq 11, 12"), "{r}");
        assert!(r.contains("tokens 48,210 → 8,034 (−40,176)"), "{r}");
        let r = refused("n1", "now", 7, "seq 3 appears twice");
        assert!(r.starts_with("refused · export n1"), "{r}");
        assert!(r.contains("line 7: seq 3 appears twice"), "{r}");
    }
}
