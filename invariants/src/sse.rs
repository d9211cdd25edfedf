//! The SSE parser fed in arbitrary chunks: the events are the same whatever
//! the split (whole, byte by byte, at the fuzzer's points), and they are
//! what a plain line-by-line reading of the whole stream gives (WHATWG
//! rules: `\r\n`, `\n` or `\r` line ends, `:` comments, one leading space
//! of a value dropped, an event dispatched at a blank line when it has data).

use oceancode_proxy::sse::{SseEvent, SseParser};

/// Input: `[n, n × u16 split points, stream]`.
pub fn check(data: &[u8]) {
    let (cuts, stream) = crate::cuts_and_payload(data);
    let whole = parse(&[stream]);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(parse(&bytes), whole, "byte by byte");
    assert_eq!(
        parse(&crate::split_at(stream, &cuts)),
        whole,
        "split at {cuts:?}"
    );
    assert_eq!(reference(stream), whole, "line-by-line reading");
}

fn parse(chunks: &[&[u8]]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, &mut |e| out.push(e));
    }
    p.finish(&mut |e| out.push(e));
    out
}

/// The stream's lines (the last one may lack its end), read whole.
fn reference(stream: &[u8]) -> Vec<SseEvent> {
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
    let (mut event, mut data, mut has_data) = (String::new(), String::new(), false);
    for line in lines {
        if line.is_empty() {
            if has_data {
                out.push(SseEvent {
                    event: std::mem::take(&mut event),
                    data: std::mem::take(&mut data),
                });
            }
            event.clear();
            has_data = false;
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
                if has_data {
                    data.push('\n');
                }
                data.push_str(&value);
                has_data = true;
            }
            _ => {}
        }
    }
    out
}
