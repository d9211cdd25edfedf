//! An HTML writer that escapes by default: text and attribute values are
//! always escaped; markup comes only from `&'static str` (tag names,
//! attribute names and the literals of this crate), so no string read from
//! a session can become markup. URLs are built by [`ui_url`] and
//! [`seg`] from the viewer's own paths and percent-encoded segments, never
//! taken from content. Pure.

use std::fmt::Write as _;

/// The viewer's path prefix.
pub const BASE: &str = "/_oceancode/ui/";

/// A document or fragment being written.
#[derive(Default)]
pub struct Html {
    out: String,
}

/// `&`, `<`, `>`, `"` and `'` escaped (text and attribute values alike).
pub fn escape_into(out: &mut String, s: &str) {
    let mut last = 0;
    for (i, b) in s.bytes().enumerate() {
        let rep = match b {
            b'&' => "&amp;",
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            b'\'' => "&#39;",
            _ => continue,
        };
        out.push_str(&s[last..i]);
        out.push_str(rep);
        last = i + 1;
    }
    out.push_str(&s[last..]);
}

/// [`escape_into`] into a new string.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_into(&mut out, s);
    out
}

/// A path segment, percent-encoded (a session id may hold any character).
pub fn seg(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, SET).to_string()
}

/// A query value, percent-encoded.
pub fn qv(s: &str) -> String {
    seg(s)
}

/// `/_oceancode/ui/<rest>` (`rest` is built from literals and [`seg`]).
pub fn ui_url(rest: &str) -> String {
    format!("{BASE}{rest}")
}

/// The URL of a session's page.
pub fn session_url(id: &str) -> String {
    ui_url(&format!("s/{}", seg(id)))
}

impl Html {
    /// An empty writer.
    pub fn new() -> Html {
        Html {
            out: String::with_capacity(64 * 1024),
        }
    }

    /// Markup written by this crate.
    pub fn raw(&mut self, s: &'static str) -> &mut Html {
        self.out.push_str(s);
        self
    }

    /// Text, escaped.
    pub fn text(&mut self, s: &str) -> &mut Html {
        escape_into(&mut self.out, s);
        self
    }

    /// JSON inside a `<script type="application/json">` (a raw-text
    /// element: entities are not decoded there, so `<`, `>` and `&` become
    /// JSON escapes and nothing can close the element).
    pub fn text_json(&mut self, json: &str) -> &mut Html {
        for c in json.chars() {
            match c {
                '<' => self.out.push_str("\\u003c"),
                '>' => self.out.push_str("\\u003e"),
                '&' => self.out.push_str("\\u0026"),
                c => self.out.push(c),
            }
        }
        self
    }

    /// A number (or anything whose `Display` is markup-free: numbers).
    pub fn num(&mut self, n: impl Into<f64>) -> &mut Html {
        let n: f64 = n.into();
        if n.fract() == 0.0 && n.abs() < 1e15 {
            let _ = write!(self.out, "{}", n as i64);
        } else {
            let _ = write!(self.out, "{n:.2}");
        }
        self
    }

    /// `<tag a="v" ...>` with every value escaped.
    pub fn open(&mut self, tag: &'static str, attrs: &[(&'static str, &str)]) -> &mut Html {
        self.out.push('<');
        self.out.push_str(tag);
        for (k, v) in attrs {
            self.out.push(' ');
            self.out.push_str(k);
            self.out.push_str("=\"");
            escape_into(&mut self.out, v);
            self.out.push('"');
        }
        self.out.push('>');
        self
    }

    /// `</tag>`.
    pub fn close(&mut self, tag: &'static str) -> &mut Html {
        self.out.push_str("</");
        self.out.push_str(tag);
        self.out.push('>');
        self
    }

    /// `<tag attrs>text</tag>`.
    pub fn el(
        &mut self,
        tag: &'static str,
        attrs: &[(&'static str, &str)],
        text: &str,
    ) -> &mut Html {
        self.open(tag, attrs).text(text).close(tag)
    }

    /// A void element (`<tag attrs>` / `<tag attrs/>` for SVG).
    pub fn void(&mut self, tag: &'static str, attrs: &[(&'static str, &str)]) -> &mut Html {
        self.open(tag, attrs);
        if !matches!(tag, "br" | "input" | "link" | "meta" | "hr") {
            self.out.pop();
            self.out.push_str("/>");
        }
        self
    }

    /// A link to one of the viewer's own URLs.
    pub fn link(&mut self, href: &str, text: &str) -> &mut Html {
        self.el("a", &[("href", href)], text)
    }

    /// Another writer's output (it escaped its own content).
    pub fn append(&mut self, other: Html) -> &mut Html {
        self.out.push_str(&other.out);
        self
    }

    /// The bytes written.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// The HTML.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_attributes_are_escaped() {
        let mut h = Html::new();
        h.open("a", &[("title", "\"><script>alert(1)</script>")])
            .text("<img src=x onerror=alert(1)> & 'q'")
            .close("a");
        let s = h.finish();
        assert_eq!(
            s,
            "<a title=\"&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;\">&lt;img src=x onerror=alert(1)&gt; &amp; &#39;q&#39;</a>"
        );
        assert!(!s.contains("<script"));
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(seg("a b/../c\"<"), "a%20b%2F..%2Fc%22%3C");
        assert_eq!(session_url("s-1_x.y"), "/_oceancode/ui/s/s-1_x.y");
    }

    #[test]
    fn numbers() {
        let mut h = Html::new();
        h.num(12u32).raw(" ").num(1.5f64);
        assert_eq!(h.finish(), "12 1.50");
    }
}
