//! The SSE parser fed in arbitrary chunks: the events (and the count of
//! events dropped for their size) are the same whatever the split (whole,
//! byte by byte, at the fuzzer's points), and they are what a plain
//! line-by-line reading of the whole stream gives (WHATWG rules: `\r\n`,
//! `\n` or `\r` line ends, `:` comments, one leading space of a value
//! dropped, an event dispatched at a blank line when it has data), with the
//! parser's bound: an event with a line or data over the limit is dropped
//! whole.

use oceancode_proxy::sse::{SseEvent, SseParser, DEFAULT_MAX_EVENT};

/// Input: `[limit, n, n × u16 split points, stream]`; `limit` 0 is the
/// default bound, else `limit × 8` bytes.
pub fn check(data: &[u8]) {
    let Some((&l, rest)) = data.split_first() else {
        return;
    };
    let max = if l == 0 {
        DEFAULT_MAX_EVENT
    } else {
        usize::from(l) * 8
    };
    let (cuts, stream) = crate::cuts_and_payload(rest);
    let whole = parse(&[stream], max);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(parse(&bytes, max), whole, "byte by byte");
    assert_eq!(
        parse(&crate::split_at(stream, &cuts), max),
        whole,
        "split at {cuts:?}"
    );
    assert_eq!(reference(stream, max), whole, "line-by-line reading");
    for e in &whole.0 {
        assert!(
            e.data.len() <= max,
            "an event of {} bytes past {max}",
            e.data.len()
        );
    }
}

/// The events and how many were dropped.
type Parsed = (Vec<SseEvent>, u64);

fn parse(chunks: &[&[u8]], max: usize) -> Parsed {
    let mut p = SseParser::with_limit(max);
    let mut out = Vec::new();
    let mut dropped = 0;
    for c in chunks {
        p.feed(c, &mut |e| out.push(e));
        dropped += p.take_dropped();
    }
    p.finish(&mut |e| out.push(e));
    (out, dropped + p.take_dropped())
}

/// The stream's lines (the last one may lack its end), read whole.
fn reference(stream: &[u8], max: usize) -> Parsed {
    let mut lines: Vec<&[u8]> = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < stream.len() {
        match stream[i] {
            b'\r' => {
                lines.push(&stream[start..i]);
                i += if stream.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = i;
            }
            b'\n' => {
                lines.push(&stream[start..i]);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < stream.len() {
        lines.push(&stream[start..]);
    }
    lines.push(b""); // the end of the stream dispatches what is pending
    let mut out = Vec::new();
    let mut dropped = 0;
    let (mut event, mut data, mut has_data) = (String::new(), String::new(), false);
    let mut oversize = false;
    for line in lines {
        if line.is_empty() {
            if oversize {
                dropped += 1;
            } else if has_data {
                out.push(SseEvent {
                    event: std::mem::take(&mut event),
                    data: std::mem::take(&mut data),
                });
            }
            event.clear();
            data.clear();
            (has_data, oversize) = (false, false);
            continue;
        }
        if line.len() > max {
            oversize = true;
            continue;
        }
        if line[0] == b':' {
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => event = value.into_owned(),
            b"data" => {
                let had_data = std::mem::replace(&mut has_data, true);
                if oversize || data.len() + value.len() + 1 > max {
                    oversize = true;
                    continue;
                }
                if had_data {
                    data.push('\n');
                }
                data.push_str(&value);
            }
            _ => {}
        }
    }
    (out, dropped)
}
