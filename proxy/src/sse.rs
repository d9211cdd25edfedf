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

/// What [`SseParser::feed_items`] hands over, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A whole event.
    Event(SseEvent),
    /// An event dropped for its size, where it ended.
    Dropped,
}

/// Most bytes of one event a parser from [`SseParser::new`] keeps.
pub const DEFAULT_MAX_EVENT: usize = 16 << 20;

/// Incremental parser state (WHATWG event-stream rules: `\n`, `\r\n` or `\r`
/// line ends, `:` comments, fields without a colon, one leading space).
///
/// Memory is bounded: an event whose lines or data grow past `max` bytes
/// is dropped (counted by [`SseParser::take_dropped`]); the parser skips to
/// its end and keeps nothing of it, however long the line.
#[derive(Debug)]
pub struct SseParser {
    line: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
    last_was_cr: bool,
    max: usize,
    /// The current line is over `max`: discard bytes until its end.
    skip_line: bool,
    /// The current event lost bytes: it is not dispatched.
    oversize: bool,
    dropped: u64,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT)
    }
}

impl SseParser {
    /// A fresh parser keeping events up to [`DEFAULT_MAX_EVENT`] bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh parser keeping events up to `max` bytes.
    pub fn with_limit(max: usize) -> Self {
        SseParser {
            line: Vec::new(),
            event: String::new(),
            data: String::new(),
            has_data: false,
            last_was_cr: false,
            max,
            skip_line: false,
            oversize: false,
            dropped: 0,
        }
    }

    /// Events dropped for their size since the last call.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// Inside an event: a line or fields not yet dispatched.
    pub fn mid_event(&self) -> bool {
        !self.line.is_empty() || self.skip_line || self.has_data || !self.event.is_empty()
    }

    /// Feed bytes; `emit` is called for every event completed by them.
    pub fn feed(&mut self, bytes: &[u8], emit: &mut dyn FnMut(SseEvent)) {
        self.feed_items(bytes, &mut |i| {
            if let SseItem::Event(e) = i {
                emit(e)
            }
        });
    }

    /// [`SseParser::feed`], with a [`SseItem::Dropped`] where an event too
    /// long to keep ended (so that a reader knows what came after it).
    pub fn feed_items(&mut self, mut bytes: &[u8], emit: &mut dyn FnMut(SseItem)) {
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
                    self.last_was_cr = bytes[i] == b'\r';
                    let piece = &bytes[..i];
                    bytes = &bytes[i + 1..];
                    if std::mem::take(&mut self.skip_line) {
                        continue;
                    }
                    if self.line.len() + piece.len() > self.max {
                        self.line.clear();
                        self.oversize = true;
                        continue;
                    }
                    self.line.extend_from_slice(piece);
                    let line = std::mem::take(&mut self.line);
                    self.process_line(&line, emit);
                }
                None => {
                    if self.skip_line {
                        break;
                    }
                    if self.line.len() + bytes.len() > self.max {
                        self.line = Vec::new();
                        self.skip_line = true;
                        self.oversize = true;
                    } else {
                        self.line.extend_from_slice(bytes);
                    }
                    break;
                }
            }
        }
    }

    /// Dispatch a trailing event that was not followed by a blank line.
    pub fn finish(&mut self, emit: &mut dyn FnMut(SseEvent)) {
        self.finish_items(&mut |i| {
            if let SseItem::Event(e) = i {
                emit(e)
            }
        });
    }

    /// [`SseParser::finish`], with [`SseItem::Dropped`] as in [`SseParser::feed_items`].
    pub fn finish_items(&mut self, emit: &mut dyn FnMut(SseItem)) {
        if !self.line.is_empty() && !self.skip_line {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, emit);
        }
        self.skip_line = false;
        self.dispatch(emit);
    }

    fn process_line(&mut self, line: &[u8], emit: &mut dyn FnMut(SseItem)) {
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
                if self.oversize || self.data.len() + value.len() + 1 > self.max {
                    self.oversize = true;
                    self.has_data = true;
                    self.data = String::new();
                    return;
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, emit: &mut dyn FnMut(SseItem)) {
        let event = std::mem::take(&mut self.event);
        if std::mem::take(&mut self.oversize) {
            self.has_data = false;
            self.data = String::new();
            self.dropped += 1;
            emit(SseItem::Dropped);
            return;
        }
        if self.has_data {
            self.has_data = false;
            emit(SseItem::Event(SseEvent {
                event,
                data: std::mem::take(&mut self.data),
            }));
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

    #[test]
    fn an_event_over_the_limit_is_dropped_and_nothing_of_it_kept() {
        let mut p = SseParser::with_limit(64);
        let mut out = Vec::new();
        p.feed(b"event: a\ndata: small\n\n", &mut |e| out.push(e));
        // A line with no end in sight, fed in pieces: never kept.
        p.feed(b"event: big\ndata: ", &mut |e| out.push(e));
        for _ in 0..1000 {
            p.feed(&[b'x'; 1000], &mut |e| out.push(e));
            assert!(p.line.capacity() <= 64 && p.data.capacity() <= 64);
        }
        assert!(p.mid_event());
        p.feed(b"\n\nevent: b\ndata: after\n\n", &mut |e| out.push(e));
        // Many data lines that add up past the limit.
        for _ in 0..10 {
            p.feed(b"data: 0123456789\n", &mut |e| out.push(e));
        }
        p.feed(b"\ndata: last\n\n", &mut |e| out.push(e));
        let names: Vec<&str> = out.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(names, ["small", "after", "last"]);
        assert_eq!(out[1].event, "b");
        assert_eq!(p.take_dropped(), 2);
        assert_eq!(p.take_dropped(), 0);
        assert!(!p.mid_event());
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
