//! Access rules of the listener, checked before anything else reads a
//! request: the `Host` must name this machine (`localhost`, an IP address or
//! a configured name: a DNS-rebinding page names its own domain), a request
//! from a web page (`Origin`, `Sec-Fetch-Site`) must come from the proxy's own
//! origin, and the path may hold no dot-segment. The admin token is checked
//! by [`crate::admin`].

use crate::error::ProxyError;
use http::{header, HeaderMap, Uri};
use std::net::{IpAddr, SocketAddr};

/// What the access rules allow besides this machine's own names.
#[derive(Debug, Clone, Default)]
pub struct AccessRules {
    /// Non-loopback listening was allowed (`--allow-remote`).
    pub allow_remote: bool,
    /// Extra host names clients may put in `Host` (`access.allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// The admin token to require; `None`: the one in the data dir (made at
    /// first start), or one for this run alone when the ledger is off.
    pub admin_token: Option<String>,
}

impl AccessRules {
    /// From the config's `access`; the token from `OCEANCODE_ADMIN_TOKEN` if set.
    pub fn from_config(a: &oceancode_config::AccessConfig) -> Self {
        AccessRules {
            allow_remote: a.allow_remote,
            allowed_hosts: a.allowed_hosts.clone(),
            admin_token: crate::token::from_env(),
        }
    }
}

/// Is `addr` a loopback address (`127.0.0.0/8`, `::1`, or `::ffff:127.x`)?
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The host part of an authority (`name`, `name:port`, `[v6]:port`), lower case.
fn host_of(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match a.rsplit_once(':') {
            // `name:port`; a bare v6 address has more than one colon.
            Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => a,
        }
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// May a request name `authority` as its host?
pub fn host_allowed(authority: &str, rules: &AccessRules) -> bool {
    let host = host_of(authority);
    if host.is_empty() {
        return false;
    }
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok()
        || rules
            .allowed_hosts
            .iter()
            .any(|h| h.trim_end_matches('.').eq_ignore_ascii_case(&host))
}

/// The authority the request names: the URI's (HTTP/2, absolute form) or
/// the `Host` header.
fn authority<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    uri.authority()
        .map(|a| a.as_str())
        .or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()))
}

/// Check `Host`, `Origin` and `Sec-Fetch-Site` (see the module doc).
pub fn check(uri: &Uri, headers: &HeaderMap, rules: &AccessRules) -> Result<(), ProxyError> {
    let host = match (authority(uri, headers), headers.get(header::HOST)) {
        (Some(h), _) => Some(h),
        (None, Some(_)) => return Err(ProxyError::Forbidden("the Host header is not text".into())),
        (None, None) => None,
    };
    if let Some(h) = host {
        if !host_allowed(h, rules) {
            return Err(ProxyError::Forbidden(format!(
                "Host {h:?} does not name this machine (localhost or an IP address; add names to access.allowed_hosts)"
            )));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let own = host.map(|h| format!("http://{h}"));
        let ok = match (origin.to_str(), own) {
            (Ok(o), Some(own)) => o.eq_ignore_ascii_case(&own),
            _ => false,
        };
        if !ok {
            return Err(ProxyError::Forbidden(format!(
                "requests from web pages are not accepted (Origin {:?})",
                String::from_utf8_lossy(origin.as_bytes())
            )));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(ProxyError::Forbidden(format!(
                "requests from other sites are not accepted (Sec-Fetch-Site {:?})",
                String::from_utf8_lossy(site.as_bytes())
            )));
        }
    }
    Ok(())
}

/// Refuse a path with a dot-segment (`.`, `..`, also percent-encoded) or an
/// encoded slash or backslash: an upstream behind a path prefix would
/// resolve it to a path outside the prefix.
pub fn check_path(path: &str) -> Result<(), ProxyError> {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || path.contains('\\') {
        return Err(ProxyError::BadTarget(
            "the request path holds an encoded slash or a backslash".into(),
        ));
    }
    for seg in lower.split('/') {
        let dec = seg.replace("%2e", ".");
        if dec == "." || dec == ".." {
            return Err(ProxyError::BadTarget(format!(
                "the request path holds a dot-segment ({seg:?}); send a normalized path"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn ok(pairs: &[(&'static str, &'static str)]) -> bool {
        check(
            &Uri::from_static("/v1/messages"),
            &headers(pairs),
            &AccessRules::default(),
        )
        .is_ok()
    }

    #[test]
    fn hosts_of_this_machine_pass_and_other_names_do_not() {
        assert!(ok(&[("host", "127.0.0.1:8787")]));
        assert!(ok(&[("host", "localhost:8787")]));
        assert!(ok(&[("host", "LOCALHOST.")]));
        assert!(ok(&[("host", "app.localhost:1")]));
        assert!(ok(&[("host", "[::1]:8787")]));
        assert!(ok(&[("host", "10.0.0.7:8787")]));
        assert!(ok(&[]), "no Host at all (HTTP/1.0)");
        assert!(!ok(&[("host", "attacker.example:8787")]));
        assert!(!ok(&[("host", "localhost.attacker.example")]));
        assert!(!ok(&[("host", "")]));
        let rules = AccessRules {
            allow_remote: true,
            allowed_hosts: vec!["build-box".into()],
            admin_token: None,
        };
        assert!(host_allowed("Build-Box:8787", &rules));
        assert!(!host_allowed("build-box.evil", &rules));
        let h2 = Uri::from_static("http://attacker.example/v1/messages");
        assert!(check(&h2, &HeaderMap::new(), &AccessRules::default()).is_err());
    }

    #[test]
    fn only_the_proxys_own_origin_passes() {
        assert!(ok(&[
            ("host", "127.0.0.1:8787"),
            ("origin", "http://127.0.0.1:8787")
        ]));
        assert!(!ok(&[
            ("host", "127.0.0.1:8787"),
            ("origin", "https://evil.example")
        ]));
        assert!(!ok(&[
            ("host", "127.0.0.1:8787"),
            ("origin", "http://localhost:3000")
        ]));
        assert!(!ok(&[("host", "127.0.0.1:8787"), ("origin", "null")]));
        assert!(
            !ok(&[("origin", "http://127.0.0.1:8787")]),
            "no Host to compare with"
        );
        assert!(!ok(&[
            ("host", "127.0.0.1:8787"),
            ("sec-fetch-site", "cross-site")
        ]));
        assert!(ok(&[
            ("host", "127.0.0.1:8787"),
            ("sec-fetch-site", "none")
        ]));
    }

    #[test]
    fn dot_segments_and_encoded_slashes_are_refused() {
        for bad in [
            "/../../admin/secret",
            "/v1/../admin",
            "/v1/./messages",
            "/%2e%2e/admin",
            "/.%2E/admin",
            "/v1/..",
            "/v1/x%2f..%2fadmin",
            "/v1\\..\\admin",
        ] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        for good in [
            "/v1/messages",
            "/s/my.session/v1/messages",
            "/v1/models/a..b",
            "/",
        ] {
            assert!(check_path(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn loopback_addresses() {
        assert!(is_loopback(&"127.0.0.1:1".parse().unwrap()));
        assert!(is_loopback(&"127.3.2.1:1".parse().unwrap()));
        assert!(is_loopback(&"[::1]:1".parse().unwrap()));
        assert!(is_loopback(&"[::ffff:127.0.0.1]:1".parse().unwrap()));
        assert!(!is_loopback(&"0.0.0.0:1".parse().unwrap()));
        assert!(!is_loopback(&"[::]:1".parse().unwrap()));
        assert!(!is_loopback(&"192.168.1.2:1".parse().unwrap()));
    }
}
