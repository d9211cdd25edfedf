//! OpenAI remote compaction, both shapes Codex uses:
//! - V1: `POST /v1/responses/compact` answers a `response.compaction` object whose
//!   `output` is the input's user messages followed by one `compaction` item;
//! - V2: a `/v1/responses` request whose last input item is `{"type":"compaction_trigger"}`
//!   answers (streamed or not) exactly one `compaction` output item.
//!
//! The item's `encrypted_content` is opaque to clients: a token this fake issues and
//! checks when it comes back in a later input (a changed one is refused with a 400, as
//! the provider refuses content it cannot decrypt). Compaction never consumes a
//! scripted reply.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::json::{obj, J};
use crate::plan::Ids;

const PREFIX: &str = "gAAAAB";
const SEAL: u64 = 0x0c0d_e5ea_1ed0_0001;

/// A new opaque `encrypted_content` for a compaction of `items` input items.
pub(crate) fn seal(ids: &Ids, items: usize) -> String {
    let body = format!("{}{}{:06x}", ids.hex(32), ids.hex(32), items.min(0xff_ffff));
    let check = xxh3_64_with_seed(body.as_bytes(), SEAL);
    format!("{PREFIX}{body}{check:016x}")
}

/// Whether `s` is an `encrypted_content` this fake issued, unchanged.
pub(crate) fn verify(s: &str) -> bool {
    let Some(rest) = s.strip_prefix(PREFIX) else {
        return false;
    };
    if rest.len() <= 16 || !rest.is_ascii() {
        return false;
    }
    let (body, check) = rest.split_at(rest.len() - 16);
    u64::from_str_radix(check, 16).is_ok_and(|c| c == xxh3_64_with_seed(body.as_bytes(), SEAL))
}

/// `{"type":"compaction_trigger"}` (V2).
pub(crate) fn is_trigger(item: &Value) -> bool {
    item.get("type").and_then(Value::as_str) == Some("compaction_trigger")
}

/// The output item: `{"id","type":"compaction","encrypted_content"}`.
pub(crate) fn item(ids: &Ids, encrypted: &str) -> J {
    obj! {
        "id": format!("cmp_{}", ids.hex(24)),
        "type": "compaction",
        "encrypted_content": encrypted,
    }
}

/// V1's retained input: every user message, re-rendered as the provider does
/// (`input_text` parts, an id, `status: completed`).
pub(crate) fn retained_users(ids: &Ids, input: &[Value]) -> Vec<J> {
    input
        .iter()
        .filter(|m| {
            m.get("role").and_then(Value::as_str) == Some("user")
                && matches!(
                    m.get("type").and_then(Value::as_str),
                    None | Some("message")
                )
        })
        .map(|m| {
            let content = match m.get("content") {
                Some(Value::String(s)) => J::A(vec![obj! { "type": "input_text", "text": s }]),
                Some(c) => J::V(c.clone()),
                None => J::A(Vec::new()),
            };
            obj! {
                "id": format!("msg_{}", ids.hex(20)),
                "type": "message",
                "status": "completed",
                "content": content,
                "role": "user",
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_content_verifies_and_a_changed_one_does_not() {
        let ids = Ids::new();
        let a = seal(&ids, 12);
        let b = seal(&ids, 12);
        assert_ne!(a, b, "every compaction gets its own content");
        assert!(verify(&a) && verify(&b));
        let mut bad = a.clone().into_bytes();
        let i = PREFIX.len() + 3;
        bad[i] = if bad[i] == b'0' { b'1' } else { b'0' };
        assert!(!verify(&String::from_utf8(bad).unwrap()));
        assert!(!verify(&a[1..]));
        assert!(!verify("gAAAAB"));
        assert!(!verify(""));
    }
}
