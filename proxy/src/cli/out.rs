//! Everything the commands print goes through here. On a terminal, control
//! characters other than newline and tab — those the ledger holds in model
//! names and message content, such as an OSC 52 clipboard write, a title
//! change or a screen clear — are written escaped (`\u{1b}`), so they are
//! shown instead of run; into a pipe or a file the text goes as it is.
//! What goes to standard error (error lines, notes, the log) has the
//! credentials of any URL in it masked ([`oceancode_config::redact_urls_in`]).

use std::io::{self, IsTerminal, Write};
use std::sync::OnceLock;

/// Where a line goes.
#[derive(Clone, Copy)]
pub enum Stream {
    /// Standard output.
    Out,
    /// Standard error.
    Err,
}

impl Stream {
    /// Whether the stream is a terminal (asked once per process).
    fn is_terminal(self) -> bool {
        static OUT: OnceLock<bool> = OnceLock::new();
        static ERR: OnceLock<bool> = OnceLock::new();
        match self {
            Stream::Out => *OUT.get_or_init(|| io::stdout().is_terminal()),
            Stream::Err => *ERR.get_or_init(|| io::stderr().is_terminal()),
        }
    }
}

/// Write `text` to `stream`, escaped on a terminal. A write error (a closed
/// reader) is not a reason to panic: the command ends as it would anyway.
pub fn write(stream: Stream, text: &str) {
    let redacted;
    let text = match stream {
        Stream::Err if text.contains("://") => {
            redacted = oceancode_config::redact_urls_in(text);
            redacted.as_str()
        }
        _ => text,
    };
    let bytes = if stream.is_terminal() {
        escape_controls(text)
    } else {
        text.as_bytes().to_vec()
    };
    let _ = match stream {
        Stream::Out => io::stdout().lock().write_all(&bytes),
        Stream::Err => io::stderr().lock().write_all(&bytes),
    };
}

/// `text` with every control character but `\n` and `\t` (C0, DEL, and the
/// C1 range U+0080–U+009F) written as `\u{XX}`.
pub fn escape_controls(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut e = Escaper::default();
    e.push(text.as_bytes(), &mut out);
    e.finish(&mut out);
    out
}

/// Standard output as a writer (for reports written in pieces, such as an
/// export), escaped like [`write`] on a terminal.
pub fn stdout_writer() -> Box<dyn Write> {
    if Stream::Out.is_terminal() {
        Box::new(Escaping {
            inner: io::stdout().lock(),
            escaper: Escaper::default(),
        })
    } else {
        Box::new(io::stdout().lock())
    }
}

/// Standard error for the log: each write (the log writes a line at a
/// time) with the credentials of its URLs masked.
pub fn log_writer() -> RedactingStderr {
    RedactingStderr
}

/// See [`log_writer`].
pub struct RedactingStderr;

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut err = io::stderr().lock();
        if buf.windows(3).any(|w| w == b"://") {
            let text = oceancode_config::redact_urls_in(&String::from_utf8_lossy(buf));
            err.write_all(text.as_bytes())?;
        } else {
            err.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// The escaping state between pieces of a byte stream: a C1 control is two
/// bytes in UTF-8 (`C2 80`–`C2 9F`), which a piece may split.
#[derive(Default)]
struct Escaper {
    c2: bool,
}

impl Escaper {
    fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        for &b in bytes {
            if std::mem::take(&mut self.c2) {
                if (0x80..=0x9f).contains(&b) {
                    escaped(u32::from(b), out);
                    continue;
                }
                out.push(0xc2);
            }
            match b {
                b'\n' | b'\t' => out.push(b),
                0x00..=0x1f | 0x7f => escaped(u32::from(b), out),
                0xc2 => self.c2 = true,
                _ => out.push(b),
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.c2) {
            out.push(0xc2);
        }
    }
}

fn escaped(c: u32, out: &mut Vec<u8>) {
    let _ = write!(out, "\\u{{{c:x}}}");
}

/// A writer that escapes what it passes on.
struct Escaping<W: Write> {
    inner: W,
    escaper: Escaper,
}

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len());
        self.escaper.push(buf, &mut out);
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Drop for Escaping<W> {
    fn drop(&mut self) {
        let mut out = Vec::new();
        self.escaper.finish(&mut out);
        let _ = self.inner.write_all(&out);
    }
}

/// `println!` through [`write`] to standard output.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out::write($crate::cli::out::Stream::Out, &format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`write`] to standard output.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::write($crate::cli::out::Stream::Out, &format!($($arg)*))
    };
}

/// `eprintln!` through [`write`] to standard error.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::out::write($crate::cli::out::Stream::Err, &format!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` through [`write`] to standard error.
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::cli::out::write($crate::cli::out::Stream::Err, &format!($($arg)*))
    };
}

pub(crate) use {err, errln, out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_text_is_kept() {
        let s = "model \u{1b}]52;c;SGk=\u{7} a\u{9b}2J\r\u{7f} café ok\n\tnext";
        let e = String::from_utf8(escape_controls(s)).unwrap();
        assert_eq!(
            e,
            "model \\u{1b}]52;c;SGk=\\u{7} a\\u{9b}2J\\u{d}\\u{7f} café ok\n\tnext"
        );
        assert!(!e.chars().any(|c| c.is_control() && c != '\n' && c != '\t'));
    }

    #[test]
    fn a_c1_control_split_between_writes_is_escaped_too() {
        let mut buf = Vec::new();
        {
            let mut w = Escaping {
                inner: &mut buf,
                escaper: Escaper::default(),
            };
            for b in "x\u{9b}y é\u{c2}".as_bytes().chunks(1) {
                w.write_all(b).unwrap();
            }
        }
        assert_eq!(String::from_utf8(buf).unwrap(), "x\\u{9b}y é\u{c2}");
    }
}
