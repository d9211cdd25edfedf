//! `context.txt` itself (pure): rendering an export and parsing an edited
//! file back into its blocks, with every reason a file cannot be read.
//!
//! ```text
//! [[context SESSION export NONCE · seq A–B · N messages · edit below this line; see context.receipt.txt]]
//! [[stub · not editable]]
//! [Earlier content of this session is past the tideline: …]
//!
//! [[state · not editable]]
//! [State at the tideline: facts the proxy recorded from the rows that left …]
//!
//! [[m:NONCE 3 user]]
//! Work through the numbered steps.
//!
//! [[m:NONCE 4 assistant]]
//! [[tool_use Bash toolu_1]]
//! { "command": "make test" }
//!
//! [[note 1]]
//! The build log said: two flaky tests, both in net/.
//!
//! [[end of context NONCE]]
//! ```

use super::body::{escape, unescape_line};

/// Largest file read back (a 400k-token window is ~1.6 MB).
pub const MAX_FILE_BYTES: u64 = 32 << 20;

/// A block of an export, as rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// A message of the window: its seq, role and body.
    Msg {
        /// Ledger seq.
        seq: u64,
        /// Role named by the header.
        role: String,
        /// The body (escaped when rendered).
        body: String,
    },
    /// A note of the edit set.
    Note {
        /// Its id.
        id: u32,
        /// Its text.
        text: String,
    },
    /// Something the proxy adds that may not be edited (the stub, a state block).
    Fixed {
        /// What it is (`stub`, `state`).
        label: String,
        /// Its text.
        text: String,
    },
}

/// The header of a block as it reads in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// `[[m:NONCE SEQ ROLE]]`.
    Msg {
        /// The export it names.
        nonce: String,
        /// Ledger seq.
        seq: u64,
        /// Role.
        role: String,
    },
    /// `[[note]]` (new) or `[[note ID]]`.
    Note(Option<u32>),
    /// `[[LABEL · not editable]]`.
    Fixed(String),
}

/// One block read from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBlock {
    /// 1-based line of its header.
    pub line: usize,
    /// Its header.
    pub header: Header,
    /// Its body, unescaped, trailing blank lines removed.
    pub body: String,
    /// Its body as the file has it (escapes and line ends kept), trailing
    /// blank lines removed: what a rewrite reads, where only an unescaped
    /// `[[` line is a marker.
    pub raw: String,
}

/// A file read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFile {
    /// The first line as it is.
    pub first_line: String,
    /// The blocks in order.
    pub blocks: Vec<FileBlock>,
    /// The nonce its last line names, and that line (1-based).
    pub end: (String, usize),
}

/// Why a file cannot be read: the receipt's reason and the line (0 = the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// 1-based line (0 = the whole file).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

fn unreadable(line: usize, reason: impl Into<String>) -> Unreadable {
    Unreadable {
        line,
        reason: reason.into(),
    }
}

/// The first line of an export.
pub fn first_line(session: &str, nonce: &str, seqs: (u64, u64), messages: usize) -> String {
    format!(
        "[[context {session} export {nonce} · seq {}–{} · {messages} messages · edit below this line; see context.receipt.txt]]",
        seqs.0, seqs.1
    )
}

/// The last line of an export (a file without it was cut short).
pub fn end_line(nonce: &str) -> String {
    format!("[[end of context {nonce}]]")
}

/// Trailing blank lines and spaces off a body: what an edit compares.
pub fn norm(body: &str) -> &str {
    body.trim_end()
}

/// Render an export.
pub fn render(first: &str, nonce: &str, blocks: &[Block]) -> String {
    let cap = blocks
        .iter()
        .map(|b| match b {
            Block::Msg { body, .. } => body.len() + 40,
            Block::Note { text, .. } => text.len() + 16,
            Block::Fixed { text, .. } => text.len() + 32,
        })
        .sum::<usize>()
        + first.len()
        + 64;
    let mut out = String::with_capacity(cap);
    out.push_str(first);
    out.push('\n');
    for b in blocks {
        let (header, body) = match b {
            Block::Msg { seq, role, body } => (format!("[[m:{nonce} {seq} {role}]]"), body),
            Block::Note { id, text } => (format!("[[note {id}]]"), text),
            Block::Fixed { label, text } => (format!("[[{label} · not editable]]"), text),
        };
        out.push_str(&header);
        out.push('\n');
        if matches!(b, Block::Msg { .. }) {
            // Message bodies come escaped from `body::read`.
            out.push_str(body);
        } else {
            escape(body, &mut out);
        }
        out.push_str("\n\n");
    }
    out.push_str(&end_line(nonce));
    out.push('\n');
    out
}

fn parse_header(line: &str, n: usize) -> Result<Option<Header>, Unreadable> {
    if line.ends_with(" · kept as is]]") {
        // A body's placeholder (`[[note · kept as is]]` for a part of
        // type `note`): never a header.
        return Ok(None);
    }
    if let Some(rest) = line.strip_prefix("[[m:") {
        let inner = rest.strip_suffix("]]").ok_or_else(|| {
            unreadable(
                n,
                format!("header mangled: {line:?} (want [[m:NONCE SEQ ROLE]])"),
            )
        })?;
        let mut w = inner.split(' ');
        let (Some(nonce), Some(seq), Some(role), None) = (w.next(), w.next(), w.next(), w.next())
        else {
            return Err(unreadable(
                n,
                format!("header mangled: {line:?} (want [[m:NONCE SEQ ROLE]])"),
            ));
        };
        let seq: u64 = seq.parse().map_err(|_| {
            unreadable(n, format!("header mangled: {line:?}: {seq:?} is not a seq"))
        })?;
        return Ok(Some(Header::Msg {
            nonce: nonce.to_string(),
            seq,
            role: role.to_string(),
        }));
    }
    if line == "[[note]]" {
        return Ok(Some(Header::Note(None)));
    }
    if let Some(rest) = line.strip_prefix("[[note ") {
        let id = rest
            .strip_suffix("]]")
            .and_then(|x| x.trim().parse::<u32>().ok())
            .ok_or_else(|| {
                unreadable(
                    n,
                    format!("header mangled: {line:?} (want [[note]] or [[note ID]])"),
                )
            })?;
        return Ok(Some(Header::Note(Some(id))));
    }
    if let Some(label) = line
        .strip_prefix("[[")
        .and_then(|r| r.strip_suffix(" · not editable]]"))
    {
        return Ok(Some(Header::Fixed(label.to_string())));
    }
    Ok(None)
}

/// Parse a file's bytes.
pub fn parse(bytes: &[u8]) -> Result<ParsedFile, Unreadable> {
    if bytes.is_empty() {
        return Err(unreadable(0, "the file is empty"));
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(unreadable(
            0,
            format!(
                "the file is {} bytes, over the {} bytes read back",
                bytes.len(),
                MAX_FILE_BYTES
            ),
        ));
    }
    if bytes.contains(&0) {
        return Err(unreadable(0, "the file is binary (it holds NUL bytes)"));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        unreadable(
            0,
            format!("the file is not UTF-8 text (at byte {})", e.valid_up_to()),
        )
    })?;
    let mut lines = text.split('\n').enumerate();
    let first_line = lines.next().map(|(_, l)| l.to_string()).unwrap_or_default();
    let mut blocks: Vec<FileBlock> = Vec::new();
    let mut body: Vec<&str> = Vec::new();
    let mut ended = false;
    let mut end = (String::new(), 0);
    // Body lines keep their line ends (a CRLF tool output is bytes of its
    // message); only a header's `\r` is dropped to read it.
    let flush = |blocks: &mut Vec<FileBlock>, body: &mut Vec<&str>| {
        if let Some(b) = blocks.last_mut() {
            let joined: Vec<&str> = body.iter().map(|l| unescape_line(l)).collect();
            b.body = norm(&joined.join("\n")).to_string();
            b.raw = norm(&body.join("\n")).to_string();
        }
        body.clear();
    };
    for (i, raw_line) in lines {
        let n = i + 1;
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        if ended {
            if !line.trim().is_empty() {
                return Err(unreadable(n, "text after the [[end of context …]] line"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("[[end of context") {
            flush(&mut blocks, &mut body);
            ended = true;
            let nonce = rest.strip_suffix("]]").unwrap_or(rest).trim();
            end = (nonce.to_string(), n);
            continue;
        }
        match parse_header(line, n)? {
            Some(header) => {
                flush(&mut blocks, &mut body);
                blocks.push(FileBlock {
                    line: n,
                    header,
                    body: String::new(),
                    raw: String::new(),
                });
            }
            None if blocks.is_empty() => {
                if !line.trim().is_empty() {
                    return Err(unreadable(
                        n,
                        "text before the first block header (notes go under a [[note]] line)",
                    ));
                }
            }
            None => body.push(raw_line),
        }
    }
    if !ended {
        return Err(unreadable(
            0,
            "the file is truncated: its last line [[end of context NONCE]] is missing",
        ));
    }
    Ok(ParsedFile {
        first_line,
        blocks,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> String {
        let blocks = vec![
            Block::Fixed {
                label: "stub".into(),
                text: "[Earlier content …]".into(),
            },
            Block::Msg {
                seq: 3,
                role: "user".into(),
                body: "hello\n\\[[m:x 1 user]]".into(),
            },
            Block::Note {
                id: 1,
                text: "remember [[this]]".into(),
            },
        ];
        render(&first_line("s1", "n1", (3, 3), 1), "n1", &blocks)
    }

    #[test]
    fn an_export_parses_back() {
        let f = parse(sample().as_bytes()).unwrap();
        assert_eq!(f.first_line, first_line("s1", "n1", (3, 3), 1));
        assert_eq!(f.blocks.len(), 3);
        assert_eq!(f.blocks[0].header, Header::Fixed("stub".into()));
        assert_eq!(
            f.blocks[1].header,
            Header::Msg {
                nonce: "n1".into(),
                seq: 3,
                role: "user".into()
            }
        );
        assert_eq!(f.blocks[1].body, "hello\n[[m:x 1 user]]");
        assert_eq!(f.blocks[2].header, Header::Note(Some(1)));
        assert_eq!(f.blocks[2].body, "remember [[this]]");
    }

    #[test]
    fn bad_files_are_unreadable_with_a_reason() {
        assert!(parse(b"").unwrap_err().reason.contains("empty"));
        assert!(parse(b"abc\0def").unwrap_err().reason.contains("binary"));
        assert!(parse(&[0xff, 0xfe, b'a'])
            .unwrap_err()
            .reason
            .contains("UTF-8"));
        let s = sample();
        let cut = &s[..s.len() - 30];
        assert!(parse(cut.as_bytes())
            .unwrap_err()
            .reason
            .contains("truncated"));
        let mangled = s.replace("[[m:n1 3 user]]", "[[m:n1 three user]]");
        let e = parse(mangled.as_bytes()).unwrap_err();
        assert!(e.reason.contains("mangled") && e.line == 5, "{e:?}");
        let mangled = s.replace("[[m:n1 3 user]]", "[[m:n1 3]]");
        assert!(parse(mangled.as_bytes())
            .unwrap_err()
            .reason
            .contains("mangled"));
        let big = vec![b'a'; MAX_FILE_BYTES as usize + 1];
        assert!(parse(&big).unwrap_err().reason.contains("over the"));
        let stray = s.replacen("\n[[stub", "\nstray words\n[[stub", 1);
        assert!(parse(stray.as_bytes())
            .unwrap_err()
            .reason
            .contains("before the first block"));
    }
}
