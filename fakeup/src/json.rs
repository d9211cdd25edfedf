//! A tiny insertion-ordered JSON value, so emitted events keep the key order of the real
//! APIs (`"type"` first) whatever `serde_json` features the workspace enables.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

/// Ordered JSON: objects serialize their keys in insertion order.
#[derive(Clone, Debug)]
pub(crate) enum J {
    Null,
    Bool(bool),
    U(u64),
    S(String),
    A(Vec<J>),
    O(Vec<(&'static str, J)>),
    V(Value),
}

impl J {
    /// Compact JSON bytes.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    #[cfg(test)]
    pub(crate) fn to_json_string(&self) -> String {
        String::from_utf8(self.to_vec()).unwrap_or_default()
    }
}

impl Serialize for J {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            J::Null => s.serialize_unit(),
            J::Bool(b) => s.serialize_bool(*b),
            J::U(n) => s.serialize_u64(*n),
            J::S(x) => s.serialize_str(x),
            J::A(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            J::O(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
            J::V(v) => v.serialize(s),
        }
    }
}

impl From<&str> for J {
    fn from(v: &str) -> Self {
        J::S(v.to_string())
    }
}
impl From<String> for J {
    fn from(v: String) -> Self {
        J::S(v)
    }
}
impl From<&String> for J {
    fn from(v: &String) -> Self {
        J::S(v.clone())
    }
}
impl From<u64> for J {
    fn from(v: u64) -> Self {
        J::U(v)
    }
}
impl From<usize> for J {
    fn from(v: usize) -> Self {
        J::U(v as u64)
    }
}
impl From<bool> for J {
    fn from(v: bool) -> Self {
        J::Bool(v)
    }
}
impl From<Value> for J {
    fn from(v: Value) -> Self {
        J::V(v)
    }
}
impl From<&Value> for J {
    fn from(v: &Value) -> Self {
        J::V(v.clone())
    }
}
impl From<Vec<J>> for J {
    fn from(v: Vec<J>) -> Self {
        J::A(v)
    }
}
impl<T: Into<J>> From<Option<T>> for J {
    fn from(v: Option<T>) -> Self {
        v.map_or(J::Null, Into::into)
    }
}
impl From<()> for J {
    fn from(_: ()) -> Self {
        J::Null
    }
}

/// Builds an ordered object: `obj! { "type": "ping", "index": 0usize }`.
macro_rules! obj {
    ($($k:literal : $v:expr),* $(,)?) => {
        $crate::json::J::O(vec![$(($k, $crate::json::J::from($v))),*])
    };
}
pub(crate) use obj;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_insertion_order() {
        let j = obj! { "type": "x", "a": 1u64, "n": (), "arr": vec![J::from(true)] };
        assert_eq!(
            j.to_json_string(),
            r#"{"type":"x","a":1,"n":null,"arr":[true]}"#
        );
    }
}
