//! An incremental Server-Sent Events parser: feed it bytes split anywhere,
//! get whole events out. Used on a *copy* of the stream by the usage tap.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (empty when absent).
    pub event: String,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// Incremental parser state (WHATWG event-stream rules: `\n`, `\r\n` or `\r`
/// line ends, `:` comments, fields without a colon, one leading space).
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
    last_was_cr: bool,
}

impl SseParser {
    /// A fresh parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; `emit` is called for every event completed by them.
    pub fn feed(&mut self, mut bytes: &[u8], emit: &mut dyn FnMut(SseEvent)) {
        while !bytes.is_empty() {
            if self.last_was_cr {
                self.last_was_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    self.line.extend_from_slice(&bytes[..i]);
                    self.last_was_cr = bytes[i] == b'\r';
                    bytes = &bytes[i + 1..];
                    let line = std::mem::take(&mut self.line);
                    self.process_line(&line, emit);
                }
                None => {
                    self.line.extend_from_slice(bytes);
                    break;
                }
            }
        }
    }

    /// Dispatch a trailing event that was not followed by a blank line.
    pub fn finish(&mut self, emit: &mut dyn FnMut(SseEvent)) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, emit);
        }
        self.dispatch(emit);
    }

    fn process_line(&mut self, line: &[u8], emit: &mut dyn FnMut(SseEvent)) {
        if line.is_empty() {
            self.dispatch(emit);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => self.event = value.into_owned(),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, emit: &mut dyn FnMut(SseEvent)) {
        let event = std::mem::take(&mut self.event);
        if self.has_data {
            self.has_data = false;
            emit(SseEvent {
                event,
                data: std::mem::take(&mut self.data),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut |e| out.push(e));
        }
        p.finish(&mut |e| out.push(e));
        out
    }

    #[test]
    fn parses_events_comments_and_multiline_data() {
        let s = b"event: a\ndata: {\"x\":1}\n\n: comment\ndata: l1\ndata:l2\n\nevent: b\r\ndata: z\r\n\r\n";
        let ev = parse_all(&[s]);
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].event, "a");
        assert_eq!(ev[0].data, "{\"x\":1}");
        assert_eq!(ev[1].event, "");
        assert_eq!(ev[1].data, "l1\nl2");
        assert_eq!(ev[2].event, "b");
        assert_eq!(ev[2].data, "z");
    }

    #[test]
    fn event_without_data_is_not_dispatched_and_trailing_event_is() {
        let ev = parse_all(&[b"event: ping\n\ndata: tail"]);
        assert_eq!(
            ev,
            vec![SseEvent {
                event: String::new(),
                data: "tail".into()
            }]
        );
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_events(cuts in proptest::collection::vec(0usize..200, 0..20)) {
            let s: &[u8] = b"event: message_start\ndata: {\"a\":1}\n\nevent: x\r\ndata: 2\r\n\r\ndata: 3\rdata: 4\r\r: c\n\n";
            let whole = parse_all(&[s]);
            let mut idx: Vec<usize> = cuts.into_iter().map(|c| c % (s.len() + 1)).collect();
            idx.sort_unstable();
            let mut chunks = Vec::new();
            let mut prev = 0;
            for i in idx { chunks.push(&s[prev..i]); prev = i; }
            chunks.push(&s[prev..]);
            prop_assert_eq!(parse_all(&chunks), whole);
        }
    }
}
