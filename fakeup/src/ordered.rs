//! An order-preserving parse of the request's content, for segment identities.
//!
//! Identity rules (what the real prompt cache is sensitive to): structural objects
//! (messages, blocks, tool definitions) compare with keys sorted, `cache_control`
//! removed, string escapes decoded and whitespace ignored; data subtrees (`input`,
//! `input_schema`, `parameters`) keep the key order they were received with, since they
//! are rendered into the prompt as given.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value whose objects keep their received key order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Ov {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Ov>),
    Obj(Vec<(String, Ov)>),
}

impl<'de> Deserialize<'de> for Ov {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OvVisitor)
    }
}

struct OvVisitor;

impl<'de> Visitor<'de> for OvVisitor {
    type Value = Ov;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Ov, E> {
        Ok(Ov::Null)
    }
    fn visit_none<E>(self) -> Result<Ov, E> {
        Ok(Ov::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Ov, E> {
        Ok(Ov::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Ov, E> {
        Ok(Ov::Num(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Ov, E> {
        Ok(Ov::Num(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Ov, E> {
        Ok(Ov::Num(
            serde_json::Number::from_f64(v).map_or_else(|| "null".into(), |n| n.to_string()),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Ov, E> {
        Ok(Ov::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Ov, E> {
        Ok(Ov::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ov, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Ov::Arr(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ov, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((k, v)) = map.next_entry::<String, Ov>()? {
            out.push((k, v));
        }
        Ok(Ov::Obj(out))
    }
}

impl Ov {
    pub(crate) fn get(&self, key: &str) -> Option<&Ov> {
        match self {
            Ov::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// A one-text-block list: what a string content stands for.
    pub(crate) fn text_blocks(s: &str) -> Ov {
        Ov::Arr(vec![Ov::Obj(vec![
            ("type".into(), Ov::Str("text".into())),
            ("text".into(), Ov::Str(s.into())),
        ])])
    }

    /// For a message: the same message with a string `content` as one text block.
    pub(crate) fn normalized_message(&self) -> Option<Ov> {
        let Ov::Obj(fields) = self else { return None };
        let Some(Ov::Str(s)) = self.get("content") else {
            return None;
        };
        let fields = fields
            .iter()
            .map(|(k, v)| {
                if k == "content" {
                    (k.clone(), Ov::text_blocks(s))
                } else {
                    (k.clone(), v.clone())
                }
            })
            .collect();
        Some(Ov::Obj(fields))
    }
}

/// Keys whose subtree is data rendered as given (order kept, `cache_control` kept).
fn is_data_key(k: &str) -> bool {
    matches!(k, "input" | "input_schema" | "parameters")
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Canonical compact JSON (see the module docs). `structural = false` inside data.
pub(crate) fn write_canon(v: &Ov, out: &mut Vec<u8>, structural: bool) {
    match v {
        Ov::Null => out.extend_from_slice(b"null"),
        Ov::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Ov::Num(n) => out.extend_from_slice(n.as_bytes()),
        Ov::Str(s) => write_str(s, out),
        Ov::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canon(item, out, structural);
            }
            out.push(b']');
        }
        Ov::Obj(fields) => {
            let mut refs: Vec<&(String, Ov)> = fields
                .iter()
                .filter(|(k, _)| !(structural && k == "cache_control"))
                .collect();
            if structural {
                refs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push(b'{');
            for (i, (k, child)) in refs.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(k, out);
                out.push(b':');
                write_canon(child, out, structural && !is_data_key(k));
            }
            out.push(b'}');
        }
    }
}

/// Keys whose string values are ids/markers, not model-visible text.
fn skip_text_key(k: &str) -> bool {
    matches!(
        k,
        "cache_control"
            | "type"
            | "id"
            | "tool_use_id"
            | "call_id"
            | "tool_call_id"
            | "signature"
            | "encrypted_content"
            | "status"
    )
}

/// The model-visible text: string leaves (structural keys sorted), tool inputs as JSON.
/// Images and documents are not text: what they cost is returned instead
/// ([`crate::media`]).
pub(crate) fn collect_text(v: &Ov, out: &mut String) -> u64 {
    match v {
        Ov::Obj(fields) => {
            if let Some(t) = crate::media::tokens(v) {
                return t;
            }
            let mut refs: Vec<&(String, Ov)> =
                fields.iter().filter(|(k, _)| !skip_text_key(k)).collect();
            refs.sort_by(|a, b| a.0.cmp(&b.0));
            let mut media = 0;
            for (k, child) in refs {
                if k == "input" && matches!(child, Ov::Obj(_) | Ov::Arr(_)) {
                    let mut buf = Vec::new();
                    write_canon(child, &mut buf, false);
                    out.push_str(&String::from_utf8_lossy(&buf));
                    out.push('\n');
                } else {
                    media += collect_text(child, out);
                }
            }
            media
        }
        Ov::Arr(items) => items.iter().map(|i| collect_text(i, out)).sum(),
        Ov::Str(s) => {
            out.push_str(s);
            out.push('\n');
            0
        }
        Ov::Num(n) => {
            out.push_str(n);
            out.push('\n');
            0
        }
        Ov::Bool(b) => {
            out.push_str(if *b { "true\n" } else { "false\n" });
            0
        }
        Ov::Null => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        let v: Ov = serde_json::from_str(s).unwrap();
        let mut out = Vec::new();
        write_canon(&v, &mut out, true);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn structural_sorted_data_kept() {
        assert_eq!(
            canon(
                r#"{"type":"tool_use", "input":{"b":1,"a":"\u00e9"},"id":"x","cache_control":{}}"#
            ),
            r#"{"id":"x","input":{"b":1,"a":"é"},"type":"tool_use"}"#
        );
        assert_ne!(
            canon(r#"{"input":{"b":1,"a":2}}"#),
            canon(r#"{"input":{"a":2,"b":1}}"#)
        );
        assert_eq!(
            canon(r#"{"x":1.5,"y":[true,null]}"#),
            r#"{"x":1.5,"y":[true,null]}"#
        );
    }
}
