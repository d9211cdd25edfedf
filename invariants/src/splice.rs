//! The body splitter against a full parse: a body split against the
//! previous body's layout (`dialect::splice`) is exactly what
//! `ParsedBody::parse` makes of it, or the splice declines; a body splices
//! onto its own layout in full.

use oceancode_proxy::dialect::splice::{self, Layout};
use oceancode_proxy::dialect::{raw_hash, ParsedBody};

/// Input: `[key, len: u16, previous body (len bytes), keep: u16, tail]`;
/// the next body is the previous one's first `keep` bytes (modulo its
/// length plus one) followed by `tail`, so that the two share a prefix as an agent's
/// consecutive requests do. `key` picks `messages` or `input`.
pub fn check(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let key = if k & 1 == 0 { "messages" } else { "input" };
    let Some((a, rest)) = take_prefixed(rest) else {
        return;
    };
    let (keep, tail) = match rest {
        [x, y, tail @ ..] => (usize::from(u16::from_le_bytes([*x, *y])), tail),
        _ => (a.len(), rest),
    };
    let mut b = a[..keep % (a.len() + 1)].to_vec();
    b.extend_from_slice(tail);

    let Ok(prev) = ParsedBody::parse(a, key) else {
        return;
    };
    let hashes: Vec<u64> = prev.messages.iter().map(|m| raw_hash(m)).collect();
    let Some(layout) = Layout::of(a, &prev, &hashes) else {
        return;
    };
    // A body splices onto its own layout, every element verified.
    let (own, n) = splice::parse(a, &layout).expect("a body splices onto its own layout");
    assert_eq!(n, layout.len());
    same(&own, &prev);

    let full = ParsedBody::parse(&b, key);
    if let Some((p, n)) = splice::parse(&b, &layout) {
        let full = match full {
            Ok(f) => f,
            Err(e) => panic!("the splice accepted a body the full parse refuses: {e}"),
        };
        same(&p, &full);
        assert!(
            n >= 1 && n <= layout.len(),
            "verified {n} of {}",
            layout.len()
        );
        for i in 0..n {
            assert_eq!(
                layout.hash(i),
                raw_hash(p.messages[i]),
                "hash of element {i}"
            );
            assert_eq!(
                p.messages[i], prev.messages[i],
                "element {i} is the previous one"
            );
        }
    }
}

fn take_prefixed(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = match data {
        [x, y, rest @ ..] => (usize::from(u16::from_le_bytes([*x, *y])), rest),
        _ => return None,
    };
    Some(rest.split_at(len.min(rest.len())))
}

fn same(a: &ParsedBody<'_>, b: &ParsedBody<'_>) {
    assert_eq!(a.fields, b.fields, "members");
    assert_eq!(a.conv_field, b.conv_field, "conversation member");
    assert_eq!(a.messages, b.messages, "conversation elements");
}
