//! The one redaction of URLs for errors and log lines: a URL's userinfo
//! (`user:password@`, `token@`) and its query and fragment values may hold
//! credentials, so every message that shows a URL shows
//! [`redact_url`]`(url)` instead.

/// What stands for a removed secret.
pub const MASK: &str = "***";

/// `url` with its credentials masked: a password in the userinfo
/// (`user:***@`), a userinfo without one (`***@`: a bare token), and every
/// query and fragment value (`?key=***`). Anything else is kept, so the
/// message still says which host was meant. Works on malformed input too
/// (no scheme, spaces): it only looks for `@` before the path and for `?`
/// / `#`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    // The authority ends at the first `/`, `?` or `#`.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((info, host)) => match info.split_once(':') {
            Some((user, _)) if !user.is_empty() => format!("{user}:{MASK}@{host}"),
            _ => format!("{MASK}@{host}"),
        },
        None => authority.to_string(),
    };
    let (path, query, fragment) = split_tail(tail);
    let mut out = String::with_capacity(url.len());
    if let Some(s) = scheme {
        out.push_str(s);
        out.push_str("://");
    }
    out.push_str(&authority);
    out.push_str(path);
    if let Some(q) = query {
        out.push('?');
        out.push_str(&mask_pairs(q));
    }
    if let Some(f) = fragment {
        out.push('#');
        if !f.is_empty() {
            out.push_str(MASK);
        }
    }
    out
}

/// `text` with every URL in it (`scheme://…` up to the next whitespace or
/// quote) redacted by [`redact_url`]: for messages that embed URLs they did
/// not build (a library's error).
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters right before `://`.
        let start = rest[..at]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `(path, query, fragment)` of what follows the authority.
fn split_tail(tail: &str) -> (&str, Option<&str>, Option<&str>) {
    let (before_frag, fragment) = match tail.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (tail, None),
    };
    match before_frag.split_once('?') {
        Some((p, q)) => (p, Some(q), fragment),
        None => (before_frag, None, fragment),
    }
}

/// `a=1&b=2` → `a=***&b=***`; a bare `flag` (no `=`) is masked whole.
fn mask_pairs(q: &str) -> String {
    q.split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) => format!("{k}={MASK}"),
            None if kv.is_empty() => String::new(),
            None => MASK.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_and_fragment_are_masked() {
        for (url, want) in [
            (
                "https://user:SECRETPASS2@api.example.com/v1",
                "https://user:***@api.example.com/v1",
            ),
            (
                "https://sk-ant-SECRET@api.example.com",
                "https://***@api.example.com",
            ),
            (
                "https://api.example.com/v1?key=SECRETQ9&x",
                "https://api.example.com/v1?key=***&***",
            ),
            ("https://h/#tok=SECRET", "https://h/#***"),
            (
                "postgres://me:pw@db:5432/l?password=SECRET&sslmode=disable",
                "postgres://me:***@db:5432/l?password=***&sslmode=***",
            ),
            (":pw@host/x", "***@host/x"),
            ("user:pw@host:443", "user:***@host:443"),
            ("https://api.example.com", "https://api.example.com"),
            ("http://[::1]:8080/p", "http://[::1]:8080/p"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn urls_inside_text_are_masked() {
        let t = "error trying to connect to \"https://u:SECRETPASS2@h/x?key=SECRETQ9\": refused; then ftp://a@b ok";
        let got = redact_urls_in(t);
        assert!(!got.contains("SECRET"), "{got}");
        assert_eq!(
            got,
            "error trying to connect to \"https://u:***@h/x?key=***\": refused; then ftp://***@b ok"
        );
        assert_eq!(redact_urls_in("no url here"), "no url here");
        assert_eq!(
            redact_urls_in("«https://a:b@h» é://x"),
            "«https://a:***@h» é://x"
        );
    }
}
