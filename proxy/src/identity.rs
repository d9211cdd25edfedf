//! Who is talking: the request's route (dialect and kind), the session name
//! it declares, and the client family — all read from the path, headers and
//! body without touching the conversation.

use crate::dialect::ParsedBody;
use http::HeaderMap;
use oceancode_window::Dialect;

/// What a request is, for the ledger: a turn ([`ReqKind::Main`]),
/// `count_tokens` ([`ReqKind::CountTokens`]: windowed like the conversation,
/// never recorded), or a side request ([`ReqKind::Side`]: title generation,
/// the client's own summary or remote compaction, forwarded untouched, never
/// recorded).
pub use oceancode_window::dialect::Route as ReqKind;

/// The route of a path (without the `/s/<name>` prefix and the query): the
/// dialect whose [`oceancode_window::dialect::DialectSpec::route`] serves it.
pub fn route(path: &str) -> Option<(Dialect, ReqKind)> {
    oceancode_window::dialect::route(path)
}

/// The longest session name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// A session name that cannot be used (answered with a 400 in the
/// provider's error format).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid session name in {from}: {reason}")]
pub struct NameError {
    /// Where the name came from (`the /s/<name>/ path`, a header's name,
    /// `metadata.user_id`).
    pub from: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// The one rule for every session name a request declares — the
/// `/s/<name>/` path prefix, `x-oceancode-session`, Claude Code's session
/// id (header or `metadata.user_id`) and Codex's `session-id`: valid UTF-8,
/// no control characters, 1 to [`MAX_NAME_BYTES`] bytes.
pub fn session_name<'a>(from: &'static str, raw: &'a [u8]) -> Result<&'a str, NameError> {
    let bad = |reason: String| NameError { from, reason };
    let name = std::str::from_utf8(raw).map_err(|_| bad("not valid UTF-8".into()))?;
    if name.is_empty() {
        return Err(bad("empty".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(bad(format!(
            "{} bytes, the most is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(bad(format!(
            "contains the control character U+{:04X}",
            u32::from(c)
        )));
    }
    Ok(name)
}

/// Split `/s/<name>/rest` into (`name`, `/rest`); the name is
/// percent-decoded and must follow [`session_name`] (and not be a dot
/// segment). A path without the prefix is `(Ok(None), path)`.
pub fn strip_session_prefix(path: &str) -> (Result<Option<String>, NameError>, &str) {
    let Some(rest) = path.strip_prefix("/s/") else {
        return (Ok(None), path);
    };
    let (raw, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    const FROM: &str = "the /s/<name>/ path";
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(raw).collect();
    let name = session_name(FROM, &decoded).and_then(|n| match n {
        "." | ".." => Err(NameError {
            from: FROM,
            reason: "a dot segment is not a name".into(),
        }),
        n => Ok(n.to_string()),
    });
    (name.map(Some), tail)
}

/// The identity a request declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Key grouping the requests of one client session (`name:..`, `cc:..`,
    /// `codex:..`); None when only a fingerprint can tell.
    pub client_key: Option<String>,
    /// Client family.
    pub client: &'static str,
    /// The request asked for the 1M-token context (`anthropic-beta: context-1m-…`).
    pub context_1m: bool,
    /// The model the path names, for a dialect whose body does not (Gemini).
    pub model: Option<String>,
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// A session name header, trimmed (absent or blank = None), checked by
/// [`session_name`].
fn name_header<'a>(h: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, NameError> {
    match h.get(name) {
        None => Ok(None),
        Some(v) => {
            let v = v.as_bytes().trim_ascii();
            if v.is_empty() {
                return Ok(None);
            }
            session_name(name, v).map(Some)
        }
    }
}

/// What a request's path says of it besides the provider route: the
/// session name of a `/s/<name>/` prefix (checked by
/// [`strip_session_prefix`]) and the model a Gemini path names
/// (`…/models/gemini-2.5-pro:generateContent`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Route<'a> {
    pub prefix: Option<&'a str>,
    pub model: Option<&'a str>,
}

/// Read the identity: path prefix, `x-oceancode-session`, Claude Code's
/// `X-Claude-Code-Session-Id` / `metadata.user_id.session_id`, Codex
/// `session-id`, opencode's `x-session-id`; otherwise the caller
/// fingerprints the conversation. The name used must follow
/// [`session_name`]. The model is the path's, when it names one.
pub fn identify(
    route: Route<'_>,
    headers: &HeaderMap,
    body: Option<&ParsedBody<'_>>,
) -> Result<Identity, NameError> {
    let ua = header(headers, "user-agent").unwrap_or("");
    let client = if ua.starts_with("claude-cli") || headers.contains_key("x-claude-code-session-id")
    {
        "claude-code"
    } else if ua.starts_with("codex")
        || header(headers, "originator").is_some_and(|o| o.starts_with("codex"))
    {
        "codex"
    } else if ua.starts_with("opencode/") {
        "opencode"
    } else if ua.starts_with("QwenCode/") {
        "qwen-code"
    } else if ua.starts_with("OpenAI/") {
        "openai-sdk"
    } else if ua.starts_with("Anthropic/") {
        "anthropic-sdk"
    } else if ua.starts_with("GeminiCLI") {
        "gemini-cli"
    } else {
        "unknown"
    };
    let key = if let Some(p) = route.prefix {
        Some(format!("name:{p}"))
    } else if let Some(s) = name_header(headers, "x-oceancode-session")? {
        Some(format!("name:{s}"))
    } else if let Some(s) = name_header(headers, "x-claude-code-session-id")? {
        Some(format!("cc:{s}"))
    } else if let Some(s) = body.map(metadata_session_id).transpose()?.flatten() {
        Some(format!("cc:{s}"))
    } else if let Some(s) = name_header(headers, "session-id")? {
        Some(format!("codex:{s}"))
    } else if client == "opencode" {
        name_header(headers, "x-session-id")?.map(|s| format!("opencode:{s}"))
    } else {
        None
    };
    let context_1m = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|b| b.trim().starts_with("context-1m")));
    Ok(Identity {
        client_key: key,
        client,
        context_1m,
        model: route.model.map(str::to_string),
    })
}

/// Claude Code's `metadata.user_id` is a JSON string carrying `session_id`.
fn metadata_session_id(body: &ParsedBody<'_>) -> Result<Option<String>, NameError> {
    let id = || {
        let meta: serde_json::Value = body.get_as("metadata")?;
        let uid = meta.get("user_id")?.as_str()?;
        let inner: serde_json::Value = serde_json::from_str(uid).ok()?;
        inner.get("session_id")?.as_str().map(str::to_string)
    };
    match id() {
        Some(s) if !s.is_empty() => {
            session_name("metadata.user_id", s.as_bytes())?;
            Ok(Some(s))
        }
        _ => Ok(None),
    }
}

/// Title generation and similar side requests, forwarded untouched:
/// - Anthropic requests without tools that ask for a structured output
///   format (Claude Code's title);
/// - opencode's requests that declare no tools (its title and its
///   compaction summary: one user message holding the conversation as text;
///   its agent loop always sends tools);
/// - Responses requests whose last input item is a `compaction_trigger`
///   (Codex's remote compaction, V2): the client's own compaction;
/// - Claude Code's auto-mode classifier, when it runs its own (the answers
///   carried no `safeguard_results`): no tools, the conversation quoted
///   between `<transcript>` and `</transcript>` text blocks under a policy
///   system prompt; and any Anthropic request for `max_tokens: 0` (its
///   server-side review of a sub-agent: a verdict, no answer).
pub fn is_side_request(d: Dialect, body: &ParsedBody<'_>, client: &str) -> bool {
    if client == "opencode" && no_tools(body) {
        return true;
    }
    if d == Dialect::OpenaiResponses {
        return body.messages.last().is_some_and(|m| {
            m.contains("compaction_trigger")
                && serde_json::from_str::<serde_json::Value>(m).is_ok_and(|v| {
                    v.get("type").and_then(|t| t.as_str()) == Some("compaction_trigger")
                })
        });
    }
    if d == Dialect::Gemini {
        return crate::dialect::gemini::is_side_request(body);
    }
    if d != Dialect::Anthropic {
        return false;
    }
    if body.get_as::<u64>("max_tokens") == Some(0) || is_auto_mode_classifier(body) {
        return true;
    }
    // `output_config` first: it is small and usually absent, while `tools`
    // (tens of KB of schemas on a main request) is only looked at then.
    let has_format = body
        .get_as::<serde_json::Value>("output_config")
        .is_some_and(|o| o.get("format").is_some());
    has_format
        && match body.get_as::<Vec<serde::de::IgnoredAny>>("tools") {
            None => body.get("tools").is_none(),
            Some(a) => a.is_empty(),
        }
}

/// Claude Code's own auto-mode classifier request: no tools, and a user
/// message holding a text block that is just `<transcript>` (the quoted
/// conversation follows it).
fn is_auto_mode_classifier(body: &ParsedBody<'_>) -> bool {
    no_tools(body)
        && body.messages.iter().any(|m| {
            m.contains("<transcript>")
                && serde_json::from_str::<serde_json::Value>(m).is_ok_and(|v| {
                    v.get("role").and_then(|r| r.as_str()) == Some("user")
                        && v.get("content")
                            .and_then(|c| c.as_array())
                            .is_some_and(|blocks| {
                                blocks.iter().any(|b| {
                                    b.get("text").and_then(|t| t.as_str()).map(str::trim)
                                        == Some("<transcript>")
                                })
                            })
                })
        })
}

/// `tools` absent, null or `[]`.
fn no_tools(body: &ParsedBody<'_>) -> bool {
    match body.get("tools") {
        None => true,
        Some(_) => body
            .get_as::<Option<Vec<serde::de::IgnoredAny>>>("tools")
            .is_some_and(|t| t.is_none_or(|t| t.is_empty())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn routes_and_prefixes() {
        assert_eq!(
            route("/v1/messages"),
            Some((Dialect::Anthropic, ReqKind::Main))
        );
        assert_eq!(
            route("/v1/messages/count_tokens"),
            Some((Dialect::Anthropic, ReqKind::CountTokens))
        );
        assert_eq!(
            route("/v1/responses"),
            Some((Dialect::OpenaiResponses, ReqKind::Main))
        );
        assert_eq!(route("/v1/models"), None);
        assert_eq!(
            strip_session_prefix("/s/my-run.1/v1/messages"),
            (Ok(Some("my-run.1".into())), "/v1/messages")
        );
        assert!(strip_session_prefix("/s/../v1").0.is_err());
        assert_eq!(
            strip_session_prefix("/v1/messages"),
            (Ok(None), "/v1/messages")
        );
    }

    fn hdr(name: &'static str, value: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_bytes(value).unwrap());
        h
    }

    fn key(h: &HeaderMap, body: Option<&ParsedBody<'_>>) -> Result<Option<String>, NameError> {
        identify(Route::default(), h, body).map(|i| i.client_key)
    }

    #[test]
    fn one_naming_rule_for_the_path_the_headers_and_the_body() {
        // UTF-8 is a name in every form, and the same name.
        assert_eq!(
            strip_session_prefix("/s/caf%C3%A9/v1/messages"),
            (Ok(Some("café".into())), "/v1/messages")
        );
        assert_eq!(
            key(&hdr("x-oceancode-session", "café".as_bytes()), None),
            Ok(Some("name:café".into()))
        );
        // Control characters are refused wherever they come from.
        assert!(strip_session_prefix("/s/a%00b/v1/messages").0.is_err());
        assert!(strip_session_prefix("/s/a%1B%5D52/v1/messages").0.is_err());
        for name in [
            "x-oceancode-session",
            "x-claude-code-session-id",
            "session-id",
        ] {
            let e = key(&hdr(name, "a\u{9b}b".as_bytes()), None).unwrap_err();
            assert_eq!(e.from, name);
            assert!(e.reason.contains("U+009B"), "{e}");
            assert!(key(&hdr(name, b"a\tb"), None).is_err(), "{name}: a tab");
            assert!(
                key(&hdr(name, &[0xe9, b't', 0xe9]), None).is_err(),
                "{name}: Latin-1"
            );
        }
        let nul = br#"{"metadata":{"user_id":"{\"session_id\":\"a\\u0000b\"}"},"messages":[]}"#;
        let p = ParsedBody::parse(nul, "messages").unwrap();
        let e = key(&HeaderMap::new(), Some(&p)).unwrap_err();
        assert_eq!(e.from, "metadata.user_id");
        // At most 128 bytes, in every form.
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        assert!(key(&hdr("x-oceancode-session", long.as_bytes()), None).is_err());
        assert!(strip_session_prefix(&format!("/s/{long}/v1/messages"))
            .0
            .is_err());
        let most = "é".repeat(MAX_NAME_BYTES / 2);
        assert!(key(&hdr("x-oceancode-session", most.as_bytes()), None).is_ok());
        let over = format!("{most}x");
        assert!(key(&hdr("x-oceancode-session", over.as_bytes()), None).is_err());
        // A blank header is no name; an empty path name is refused.
        assert_eq!(key(&hdr("x-oceancode-session", b"  "), None), Ok(None));
        assert!(strip_session_prefix("/s//v1/messages").0.is_err());
    }

    #[test]
    fn identity_precedence() {
        let body = br#"{"metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"abc\"}"},"messages":[]}"#;
        let p = ParsedBody::parse(body, "messages").unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            "user-agent",
            HeaderValue::from_static("claude-cli/2.1.332 (external, sdk-cli)"),
        );
        let id = identify(Route::default(), &h, Some(&p)).unwrap();
        assert_eq!(id.client_key.as_deref(), Some("cc:abc"));
        assert_eq!(id.client, "claude-code");
        h.insert("x-claude-code-session-id", HeaderValue::from_static("hdr"));
        assert_eq!(
            identify(Route::default(), &h, Some(&p))
                .unwrap()
                .client_key
                .as_deref(),
            Some("cc:hdr")
        );
        h.insert("x-oceancode-session", HeaderValue::from_static("mine"));
        assert_eq!(
            identify(Route::default(), &h, Some(&p))
                .unwrap()
                .client_key
                .as_deref(),
            Some("name:mine")
        );
        assert_eq!(
            identify(
                Route {
                    prefix: Some("pfx"),
                    model: None
                },
                &h,
                Some(&p)
            )
            .unwrap()
            .client_key
            .as_deref(),
            Some("name:pfx")
        );
        let mut h = HeaderMap::new();
        h.insert("session-id", HeaderValue::from_static("0199"));
        h.insert("originator", HeaderValue::from_static("codex_exec"));
        let id = identify(Route::default(), &h, None).unwrap();
        assert_eq!(id.client_key.as_deref(), Some("codex:0199"));
        assert_eq!(id.client, "codex");
        assert_eq!(
            identify(Route::default(), &HeaderMap::new(), None)
                .unwrap()
                .client_key,
            None
        );
    }

    #[test]
    fn title_requests_are_side_requests() {
        let t = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"output_config":{"format":{"type":"json_schema"}}}"#;
        assert!(is_side_request(
            Dialect::Anthropic,
            &ParsedBody::parse(t, "messages").unwrap(),
            "claude-code"
        ));
        let m = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"name":"Bash"}],"output_config":{"effort":"medium"}}"#;
        assert!(!is_side_request(
            Dialect::Anthropic,
            &ParsedBody::parse(m, "messages").unwrap(),
            "claude-code"
        ));
        let side = |b: &[u8]| {
            is_side_request(
                Dialect::Anthropic,
                &ParsedBody::parse(b, "messages").unwrap(),
                "anthropic-sdk",
            )
        };
        assert!(side(br#"{"messages":[],"output_config":{"format":{}}}"#));
        assert!(!side(
            br#"{"messages":[],"tools":[{"name":"Bash"}],"output_config":{"format":{}}}"#
        ));
        assert!(!side(
            br#"{"messages":[],"tools":null,"output_config":{"format":{}}}"#
        ));
        assert!(!side(br#"{"messages":[],"tools":[]}"#));
    }

    /// Claude Code's auto mode: its own classifier (no tools, the
    /// conversation between `<transcript>` blocks) and a `max_tokens: 0`
    /// review are side requests; a main request carrying `safeguards` is not.
    #[test]
    fn auto_mode_classifier_requests_are_side_requests() {
        let side = |b: &[u8]| {
            is_side_request(
                Dialect::Anthropic,
                &ParsedBody::parse(b, "messages").unwrap(),
                "claude-code",
            )
        };
        let classifier = br#"{"model":"m","max_tokens":64,"system":[{"type":"text","text":"You are a security monitor"}],"stop_sequences":["</block>"],"messages":[{"role":"user","content":[{"type":"text","text":"<transcript>\n"},{"type":"text","text":"User: list files\n"},{"type":"text","text":"</transcript>\n"},{"type":"text","text":"Bash: touch x"}]}]}"#;
        assert!(side(classifier));
        let split = br#"{"model":"m","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"<transcript>\n"}]},{"role":"user","content":[{"type":"text","text":"User: hi"}]}]}"#;
        assert!(side(split));
        let review = br#"{"model":"m","max_tokens":0,"tools":[{"name":"Bash"}],"safeguards":[{"type":"dangerous_tool_use"}],"messages":[{"role":"user","content":"x"}]}"#;
        assert!(side(review));
        let main = br#"{"model":"m","max_tokens":32000,"tools":[{"name":"Bash"}],"safeguards":[{"type":"dangerous_tool_use","classifier_context":{"v":1}}],"messages":[{"role":"user","content":[{"type":"text","text":"<transcript>\n"}]}]}"#;
        assert!(!side(main), "tools: the agent's own request");
        let quoted = br#"{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"what does <transcript> mean?"}]}"#;
        assert!(!side(quoted));
    }

    #[test]
    fn opencode_sessions_and_side_requests() {
        let mut h = HeaderMap::new();
        h.insert(
            "user-agent",
            HeaderValue::from_static(
                "opencode/1.18.33 ai-sdk/provider-utils/4.0.46 runtime/bun/1.3.14",
            ),
        );
        h.insert("x-session-id", HeaderValue::from_static("ses_dccfb09a"));
        let id = identify(Route::default(), &h, None).unwrap();
        assert_eq!(id.client, "opencode");
        assert_eq!(id.client_key.as_deref(), Some("opencode:ses_dccfb09a"));
        // Another client's `x-session-id` names nothing the proxy knows.
        h.insert("user-agent", HeaderValue::from_static("curl/8.0"));
        assert_eq!(
            identify(Route::default(), &h, None).unwrap().client_key,
            None
        );
        h.insert(
            "user-agent",
            HeaderValue::from_static("QwenCode/0.24.4 (linux; x64)"),
        );
        assert_eq!(
            identify(Route::default(), &h, None).unwrap().client,
            "qwen-code"
        );

        let parse = |b: &'static [u8]| ParsedBody::parse(b, "messages").unwrap();
        // Title and compaction summary: no tools. The agent loop: tools.
        let summary = parse(br#"{"system":"You are a context summarization agent.","messages":[{"role":"user","content":"Here is the conversation so far"}]}"#);
        let main = parse(br#"{"system":"You are OpenCode.","tools":[{"name":"bash"}],"messages":[{"role":"user","content":"go"}]}"#);
        assert!(is_side_request(Dialect::Anthropic, &summary, "opencode"));
        assert!(!is_side_request(Dialect::Anthropic, &main, "opencode"));
        assert!(!is_side_request(
            Dialect::Anthropic,
            &summary,
            "anthropic-sdk"
        ));
        let chat = ParsedBody::parse(
            br#"{"tools":null,"messages":[{"role":"user","content":"t"}]}"#,
            "messages",
        )
        .unwrap();
        assert!(is_side_request(Dialect::OpenaiChat, &chat, "opencode"));
        assert!(!is_side_request(Dialect::OpenaiChat, &chat, "openai-sdk"));
    }

    #[test]
    fn codex_remote_compaction_is_the_clients_own() {
        assert_eq!(
            route("/v1/responses/compact"),
            Some((Dialect::OpenaiResponses, ReqKind::Side))
        );
        let parse = |b: &'static [u8]| ParsedBody::parse(b, "input").unwrap();
        let v2 = parse(br#"{"input":[{"role":"user","content":"go"},{"type":"compaction_trigger"}],"tools":[]}"#);
        assert!(is_side_request(Dialect::OpenaiResponses, &v2, "codex"));
        // Only as the last item; a message that merely mentions it is a turn.
        let early =
            parse(br#"{"input":[{"type":"compaction_trigger"},{"role":"user","content":"go"}]}"#);
        assert!(!is_side_request(Dialect::OpenaiResponses, &early, "codex"));
        let text =
            parse(br#"{"input":[{"role":"user","content":"what is a compaction_trigger?"}]}"#);
        assert!(!is_side_request(Dialect::OpenaiResponses, &text, "codex"));
        let next = parse(br#"{"input":[{"role":"user","content":"go"},{"type":"compaction","encrypted_content":"gAAAAB"}]}"#);
        assert!(!is_side_request(Dialect::OpenaiResponses, &next, "codex"));
    }
}
