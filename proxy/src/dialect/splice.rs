//! Splitting a body without scanning the part a previous body already had.
//!
//! An agent resends its whole conversation every step: the new body is the
//! previous one with a few messages appended (and the members after the
//! conversation, often tens of KB of tool schemas, again). [`Layout`] keeps
//! where the previous body's members and conversation elements were and the
//! xxh3 of each element (the hashes the session matching needs anyway);
//! [`parse`] checks the new body against it with those hashes and only runs
//! the JSON scanner from the first element that differs. A 200 KB step is
//! split in the time it takes to hash it, and the result is exactly what
//! [`ParsedBody::parse`] returns (property-tested); anything unexpected
//! returns `None` and the caller parses the body in full.

use super::ParsedBody;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64;

/// Where a body's members and conversation elements were.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Bytes up to the first conversation element.
    head_end: usize,
    /// xxh3 of those bytes.
    head_hash: u64,
    /// The members before the conversation: key and value range.
    head_fields: Vec<(String, Range<usize>)>,
    /// Key of the conversation member.
    conv_key: String,
    /// Each conversation element's range.
    elems: Vec<Range<usize>>,
    /// xxh3 of each element (`dialect::raw_hash`).
    hashes: Vec<u64>,
}

impl Layout {
    /// The layout of `bytes` as `parsed` split it (`hashes`: the raw hash of
    /// each message). `None` when the body does not qualify: no conversation
    /// array, or values that are not slices of `bytes`.
    pub fn of(bytes: &[u8], parsed: &ParsedBody<'_>, hashes: &[u64]) -> Option<Layout> {
        let conv = parsed.conv_field?;
        if parsed.messages.is_empty() || hashes.len() != parsed.messages.len() {
            return None;
        }
        let range_of = |s: &str| range_in(bytes, s);
        let elems = parsed
            .messages
            .iter()
            .map(|m| range_of(m))
            .collect::<Option<Vec<_>>>()?;
        let head_end = elems.first()?.start;
        let head_fields = parsed.fields[..conv]
            .iter()
            .map(|(k, v)| Some((k.to_string(), range_of((*v)?)?)))
            .collect::<Option<Vec<_>>>()?;
        if head_fields.iter().any(|(_, r)| r.end > head_end) {
            return None;
        }
        Some(Layout {
            head_end,
            head_hash: xxh3_64(&bytes[..head_end]),
            head_fields,
            conv_key: parsed.fields[conv].0.to_string(),
            elems,
            hashes: hashes.to_vec(),
        })
    }

    /// The layout of `bytes`, which [`parse`] split against `self` with its
    /// first `reused` elements verified: those ranges and hashes, the head
    /// and its hash are this layout's; only the elements after them are
    /// located. What [`Layout::of`] returns, without a pass over the
    /// elements a step shares with the previous body.
    pub fn extend(
        &self,
        bytes: &[u8],
        parsed: &ParsedBody<'_>,
        hashes: &[u64],
        reused: usize,
    ) -> Option<Layout> {
        let conv = parsed.conv_field?;
        if reused == 0
            || reused > self.elems.len()
            || hashes.len() != parsed.messages.len()
            || parsed.messages.len() < reused
            || parsed.fields.get(..conv)?.len() != self.head_fields.len()
        {
            return Layout::of(bytes, parsed, hashes);
        }
        let mut elems = Vec::with_capacity(parsed.messages.len());
        elems.extend_from_slice(&self.elems[..reused]);
        for m in &parsed.messages[reused..] {
            elems.push(range_in(bytes, m)?);
        }
        Some(Layout {
            head_end: self.head_end,
            head_hash: self.head_hash,
            head_fields: self.head_fields.clone(),
            conv_key: self.conv_key.clone(),
            elems,
            hashes: hashes.to_vec(),
        })
    }

    /// Key of the conversation member.
    pub fn conv_key(&self) -> &str {
        &self.conv_key
    }

    /// Conversation elements recorded.
    pub fn len(&self) -> usize {
        self.elems.len()
    }

    /// No elements (never true for a layout made by [`Layout::of`]).
    pub fn is_empty(&self) -> bool {
        self.elems.is_empty()
    }

    /// The raw hash of element `i` (valid for the first `verified` elements
    /// of a body [`parse`] accepted).
    pub fn hash(&self, i: usize) -> u64 {
        self.hashes[i]
    }
}

/// Where `s`, a slice of `bytes`, lies in it.
fn range_in(bytes: &[u8], s: &str) -> Option<Range<usize>> {
    let start = (s.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
    let end = start + s.len();
    (end <= bytes.len()).then_some(start..end)
}

/// Split `bytes` using the previous body's layout. Returns the body and how
/// many leading elements are byte-identical to the previous body's (their
/// hashes are [`Layout::hash`]); `None` if the body does not start like the
/// previous one or does not parse (the caller then parses it in full, which
/// also reports the error).
pub fn parse<'a>(bytes: &'a [u8], layout: &Layout) -> Option<(ParsedBody<'a>, usize)> {
    let head_end = layout.head_end;
    if bytes.len() <= head_end || xxh3_64(&bytes[..head_end]) != layout.head_hash {
        return None;
    }
    let mut verified = 0;
    let mut pos = head_end;
    for (i, r) in layout.elems.iter().enumerate() {
        if r.end > bytes.len()
            || (i == 0 && r.start != head_end)
            || (i > 0 && !is_separator(&bytes[pos..r.start]))
            || xxh3_64(&bytes[r.clone()]) != layout.hashes[i]
        {
            break;
        }
        verified = i + 1;
        pos = r.end;
    }
    if verified == 0 {
        return None;
    }
    // The verified prefix is byte-identical to a body that parsed: it is
    // valid UTF-8 and every range falls on a character boundary. Checked
    // again (a hash is not a proof), with SIMD: this is a warm step's
    // longest pass over the body.
    let prefix = simdutf8::basic::from_utf8(&bytes[..pos]).ok()?;
    let mut fields: Vec<(Cow<'a, str>, Option<&'a str>)> = layout
        .head_fields
        .iter()
        .map(|(k, r)| Some((Cow::Owned(k.clone()), Some(prefix.get(r.clone())?))))
        .collect::<Option<_>>()?;
    let conv_field = fields.len();
    fields.push((Cow::Owned(layout.conv_key.clone()), None));
    let mut messages: Vec<&'a str> = Vec::with_capacity(layout.elems.len() + 8);
    for r in &layout.elems[..verified] {
        messages.push(prefix.get(r.clone())?);
    }
    // The rest of the array.
    loop {
        pos = skip_ws(bytes, pos);
        match bytes.get(pos)? {
            b']' => {
                pos += 1;
                break;
            }
            b',' => {
                let (v, end) = raw_value(bytes, pos + 1)?;
                messages.push(v);
                pos = end;
            }
            _ => return None,
        }
    }
    // The members after it; a key seen before means the body is refused
    // (the full parse reports it).
    let mut seen = super::Seen::default();
    for (k, _) in &fields {
        seen.insert(k);
    }
    loop {
        pos = skip_ws(bytes, pos);
        match bytes.get(pos)? {
            b'}' => {
                pos += 1;
                break;
            }
            b',' => {
                let (key, end) = key(bytes, pos + 1)?;
                pos = skip_ws(bytes, end);
                if bytes.get(pos) != Some(&b':') {
                    return None;
                }
                let (v, end) = raw_value(bytes, pos + 1)?;
                if !seen.insert(&key) {
                    return None;
                }
                fields.push((Cow::Owned(key), Some(v)));
                pos = end;
            }
            _ => return None,
        }
    }
    if skip_ws(bytes, pos) != bytes.len() {
        return None;
    }
    Some((
        ParsedBody {
            fields,
            conv_field: Some(conv_field),
            messages,
        },
        verified,
    ))
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while matches!(bytes.get(pos), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        pos += 1;
    }
    pos
}

/// Whitespace, one comma, whitespace.
fn is_separator(gap: &[u8]) -> bool {
    let mut commas = 0;
    for b in gap {
        match b {
            b',' => commas += 1,
            b' ' | b'\n' | b'\r' | b'\t' => {}
            _ => return false,
        }
    }
    commas == 1
}

/// One JSON value starting at `pos` (after optional whitespace): the value
/// as a slice of `bytes` and the position after it.
fn raw_value(bytes: &[u8], pos: usize) -> Option<(&str, usize)> {
    let rest = bytes.get(pos..)?;
    let mut stream = serde_json::Deserializer::from_slice(rest).into_iter::<&RawValue>();
    let v = stream.next()?.ok()?;
    Some((v.get(), pos + stream.byte_offset()))
}

/// One object key (a JSON string) starting at `pos`, unescaped.
fn key(bytes: &[u8], pos: usize) -> Option<(String, usize)> {
    let start = skip_ws(bytes, pos);
    if bytes.get(start) != Some(&b'"') {
        return None;
    }
    let rest = bytes.get(start..)?;
    let mut stream = serde_json::Deserializer::from_slice(rest).into_iter::<String>();
    let k = stream.next()?.ok()?;
    Some((k, start + stream.byte_offset()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::raw_hash;
    use proptest::prelude::*;

    fn layout(src: &[u8], key: &str) -> Layout {
        let p = ParsedBody::parse(src, key).unwrap();
        let h: Vec<u64> = p.messages.iter().map(|m| raw_hash(m)).collect();
        Layout::of(src, &p, &h).unwrap()
    }

    fn same(a: &ParsedBody<'_>, b: &ParsedBody<'_>) {
        assert_eq!(a.fields, b.fields);
        assert_eq!(a.conv_field, b.conv_field);
        assert_eq!(a.messages, b.messages);
    }

    #[test]
    fn an_appended_step_reuses_the_prefix() {
        let a = br#"{"model":"m", "messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"tools":[{"name":"Bash"}],"stream":true}"#;
        let b = br#"{"model":"m", "messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"} ,
 {"role":"user","content":"c \"q\""}],"tools":[{"name":"Bash"}],"stream":true,"x\u0041":1}"#;
        let l = layout(a, "messages");
        let (p, n) = parse(b, &l).unwrap();
        assert_eq!(n, 2);
        same(&p, &ParsedBody::parse(b, "messages").unwrap());
        assert_eq!(p.get("xA"), Some("1"));
        assert_eq!(l.hash(1), raw_hash(r#"{"role":"assistant","content":"b"}"#));
    }

    #[test]
    fn anything_else_falls_back() {
        let a = br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":0}"#;
        let l = layout(a, "messages");
        for b in [
            &br#"{"model":"n","messages":[{"a":1},{"b":2}],"z":0}"#[..], // head differs
            br#"{"model":"m","messages":[{"a":2},{"b":2}],"z":0}"#,      // first element differs
            br#"{"model":"m","messages":[{"a":1},{"b":2},],"z":0}"#,     // trailing comma
            br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":0} x"#,    // trailing bytes
            br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":}"#,       // bad value
            br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":0"#,       // truncated
            br#"{"model":"m","messages":[{"a":1}"#,                      // shorter
        ] {
            let full = ParsedBody::parse(b, "messages");
            match parse(b, &l) {
                None => {}
                Some((p, _)) => same(&p, &full.expect("splice accepted what parse refuses")),
            }
        }
        // A key after the conversation that repeats one before it (or in
        // the tail): the full parse refuses the body, and so does the splice.
        for b in [
            &br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":0,"model":"other"}"#[..],
            br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":0,"messages":[]}"#,
            br#"{"model":"m","messages":[{"a":1},{"b":2}],"z":0,"z":1}"#,
        ] {
            assert!(ParsedBody::parse(b, "messages").is_err());
            assert!(parse(b, &l).is_none(), "{}", String::from_utf8_lossy(b));
        }
        // A changed element stops the reuse there; the rest is parsed.
        let b = br#"{"model":"m","messages":[{"a":1},{"b":3},{"c":4}],"z":0}"#;
        let (p, n) = parse(b, &l).unwrap();
        assert_eq!(n, 1);
        same(&p, &ParsedBody::parse(b, "messages").unwrap());
    }

    fn value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i32>().prop_map(serde_json::Value::from),
            "[ -~\\n\"\\\\é😀]{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-z\"]{1,4}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn body(
        head: &[(String, serde_json::Value)],
        msgs: &[serde_json::Value],
        tail: &[(String, serde_json::Value)],
        pad: &str,
    ) -> Vec<u8> {
        let member = |(k, v): &(String, serde_json::Value)| {
            format!("{}{pad}:{pad}{v}", serde_json::Value::from(k.as_str()))
        };
        let mut out = format!("{pad}{{");
        for f in head {
            out.push_str(&member(f));
            out.push(',');
        }
        out.push_str(&format!("\"messages\":{pad}["));
        let items: Vec<String> = msgs.iter().map(|m| format!("{pad}{m}")).collect();
        out.push_str(&items.join(&format!(",{pad}")));
        out.push(']');
        for f in tail {
            out.push(',');
            out.push_str(&member(f));
        }
        out.push_str(&format!("{pad}}}{pad}"));
        out.into_bytes()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whatever the next body is, a splice either declines or returns
        /// exactly what the full parse returns.
        #[test]
        fn splice_equals_the_full_parse(
            head in prop::collection::vec(("[a-l]{1,3}", value()), 0..3),
            msgs in prop::collection::vec(value(), 1..8),
            tail in prop::collection::vec(("[m-z\"]{1,3}", value()), 0..3),
            extra in prop::collection::vec(value(), 0..3),
            edit in 0usize..6,
            at in any::<prop::sample::Index>(),
            pad in prop_oneof![Just(""), Just(" "), Just("\n ")],
            new_tail in prop::collection::vec(("[m-z]{1,3}", value()), 0..2),
            junk in "[,}\\]\"a 0]{1,3}",
        ) {
            let a = body(&head, &msgs, &tail, pad);
            // A first body with a repeated key is refused; nothing to splice against.
            prop_assume!(ParsedBody::parse(&a, "messages").is_ok());
            let l = layout(&a, "messages");
            let mut msgs2 = msgs.clone();
            let mut tail2 = tail.clone();
            let mut b;
            match edit {
                0 => { msgs2.extend(extra); b = body(&head, &msgs2, &tail2, pad) }
                1 => { let i = at.index(msgs2.len()); msgs2[i] = serde_json::json!({"edited": i}); b = body(&head, &msgs2, &tail2, pad) }
                2 => { tail2.extend(new_tail); msgs2.extend(extra); b = body(&head, &msgs2, &tail2, pad) }
                3 => { msgs2.truncate(at.index(msgs2.len())); b = body(&head, &msgs2, &tail2, pad) }
                4 => { msgs2.extend(extra); b = body(&head, &msgs2, &tail2, pad); let i = at.index(b.len() + 1); b.splice(i..i, junk.bytes()); }
                _ => { b = body(&head, &msgs2, &tail2, if pad.is_empty() { " " } else { "" }) }
            }
            let full = ParsedBody::parse(&b, "messages");
            if let Some((p, n)) = parse(&b, &l) {
                let full = full.expect("splice accepted a body the full parse refuses");
                same(&p, &full);
                prop_assert!(n <= l.len());
                for i in 0..n {
                    prop_assert_eq!(l.hash(i), raw_hash(p.messages[i]));
                }
                // The next layout, extended from this one, is the one a
                // full pass makes.
                let h: Vec<u64> = p.messages.iter().map(|m| raw_hash(m)).collect();
                let (ext, of) = (l.extend(&b, &p, &h, n), Layout::of(&b, &p, &h));
                prop_assert_eq!(format!("{ext:?}"), format!("{of:?}"));
            }
        }
    }
}
