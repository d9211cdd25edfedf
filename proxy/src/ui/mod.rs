//! The session viewer at `/_oceancode/ui/`: read-only HTML pages served by
//! the proxy (the sessions list, a session with its context chart and its
//! conversation in a *full transcript | model view* toggle, search), built
//! from the ledger's read side ([`LedgerRead`]); the CSS and the small
//! script are embedded in the binary.
//!
//! Access is the admin API's: the listener's Host/Origin/Sec-Fetch-Site
//! rules ([`crate::access`]) run first, then the admin token — handed over
//! once as `?token=` or sent as `Authorization: Bearer`. The hand-over is
//! answered with a redirect that drops the token from the URL and a cookie
//! scoped to this path holding a viewer session ([`token::ViewerSessions`]): a
//! random value of its own, never the token (cookies ignore ports, so any
//! other server on the same host receives them), kept in memory only (a
//! restart ends every one), expiring after [`token::VIEWER_TTL`], revoked at once
//! by `POST /_oceancode/viewer/revoke`.
//! Only GET and HEAD are served: nothing here changes state. Every answer
//! carries a Content-Security-Policy that allows only this path's own
//! script and style (no inline script), so session content — model output,
//! tool output, file contents, all escaped by [`html::Html`] — cannot run.
//!
//! | module | holds |
//! |---|---|
//! | `html` | the escaping HTML writer, URL segments (pure) |
//! | `pages` | the pages (pure) |
//! | `chart` | the context chart as SVG (pure) |
//! | `seen` | what the model saw on a step, from its record and the ledger (pure) |

pub mod chart;
pub mod html;
pub mod pages;
pub mod seen;

use crate::app::App;
use crate::error::{full, ProxyBody};
use crate::token;
use html::BASE;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use oceancode_ledger::store::{LedgerRead, LedgerStore};
use pages::{PageQuery, SessionData, SessionLine, Sort, View};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The viewer's path without its trailing slash.
pub const PREFIX: &str = "/_oceancode/ui";
/// The cookie that keeps the viewer session for the viewer's pages.
pub const COOKIE: &str = "oceancode_ui";
/// Hits a search shows at most.
pub const SEARCH_LIMIT: usize = 200;

/// The Content-Security-Policy of every viewer answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const CSS: &str = include_str!("assets/ui.css");
const JS: &str = include_str!("assets/ui.js");
const ICON: &str = include_str!("assets/icon.svg");

/// Is `path` the viewer's?
pub fn is_ui(path: &str) -> bool {
    path == PREFIX || path.starts_with(BASE)
}

/// The URL that opens the viewer of the proxy at `base` (`http://host:port`)
/// with `token` handed over once.
pub fn open_url(base: &str, token: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    match token {
        Some(t) => format!("{base}{BASE}?token={}", html::qv(t)),
        None => format!("{base}{BASE}"),
    }
}

fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// The query without `token=` (what the redirect after the hand-over keeps).
fn without_token(query: &str) -> String {
    query
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("token="))
        .collect::<Vec<_>>()
        .join("&")
}

/// The viewer session in the viewer's cookie.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == COOKIE).then(|| v.trim().to_string())
        })
}

fn secure(mut r: Response<ProxyBody>) -> Response<ProxyBody> {
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn answer(
    status: StatusCode,
    ctype: &'static str,
    body: impl Into<bytes::Bytes>,
) -> Response<ProxyBody> {
    let mut r = Response::new(full(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    secure(r)
}

fn html_answer(status: StatusCode, body: String) -> Response<ProxyBody> {
    answer(status, "text/html; charset=utf-8", body)
}

fn redirect(status: StatusCode, to: &str) -> Response<ProxyBody> {
    let mut r = answer(status, "text/plain; charset=utf-8", "");
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn not_found(what: &str) -> Response<ProxyBody> {
    html_answer(
        StatusCode::NOT_FOUND,
        pages::message_page("Not found", what),
    )
}

/// Handle a request under [`PREFIX`] (the listener's access rules passed).
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<ProxyBody> {
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = html_answer(
            StatusCode::METHOD_NOT_ALLOWED,
            pages::message_page(
                "Read-only",
                "The viewer only reads: GET and HEAD are served here.",
            ),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if path == PREFIX {
        let to = match query.as_str() {
            "" => BASE.to_string(),
            q => format!("{BASE}?{q}"),
        };
        return redirect(StatusCode::PERMANENT_REDIRECT, &to);
    }
    // The embedded style, script and icon hold nothing of the ledger: served
    // without the token, so the page that asks for it is styled too.
    if let Some(r) = asset(path.get(BASE.len()..).unwrap_or("")) {
        return r;
    }
    // The token handed over in the URL: kept in a cookie, dropped from the URL.
    if let Some(t) = query_value(&query, "token") {
        if !token::matches(t.trim(), &app.admin_token) {
            app.metrics.access_denied.fetch_add(1, Ordering::Relaxed);
            return html_answer(
                StatusCode::UNAUTHORIZED,
                pages::message_page("Wrong token", "The token in this link is not this proxy's admin token: run `oceancode-proxy ui` for a fresh link."),
            );
        }
        let rest = without_token(&query);
        let to = if rest.is_empty() {
            path.clone()
        } else {
            format!("{path}?{rest}")
        };
        let session = match app.viewer.open() {
            Ok(s) => s,
            Err(e) => {
                return html_answer(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    pages::message_page("No viewer session", &e.to_string()),
                )
            }
        };
        let mut r = redirect(StatusCode::SEE_OTHER, &to);
        let cookie = format!("{COOKIE}={session}; Path={BASE}; HttpOnly; SameSite=Strict");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    let by_cookie = cookie_token(req.headers()).is_some_and(|t| app.viewer.valid(&t));
    if !by_cookie && !crate::admin::authorized(req.headers(), &app.admin_token) {
        app.metrics.access_denied.fetch_add(1, Ordering::Relaxed);
        let mut r = html_answer(
            StatusCode::UNAUTHORIZED,
            pages::message_page(
                "The admin token is needed",
                "Open the link that `oceancode-proxy ui` prints (it hands the admin token over once for a viewer session, kept in a cookie for this path; sessions end after 12 hours, at a restart of the proxy, or when revoked).",
            ),
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    }
    let rest = path[BASE.len()..].to_string();
    let mut r = route(app, &rest, &query).await;
    if head {
        *r.body_mut() = full(bytes::Bytes::new());
    }
    r
}

/// An embedded asset (`rest`: the path after [`BASE`]).
fn asset(rest: &str) -> Option<Response<ProxyBody>> {
    Some(match rest {
        "assets/ui.css" => answer(StatusCode::OK, "text/css; charset=utf-8", CSS),
        "assets/ui.js" => answer(StatusCode::OK, "text/javascript; charset=utf-8", JS),
        "assets/icon.svg" => answer(StatusCode::OK, "image/svg+xml", ICON),
        _ => return None,
    })
}

async fn route(app: Arc<App>, rest: &str, query: &str) -> Response<ProxyBody> {
    if app.store.is_none() {
        return html_answer(
            StatusCode::OK,
            pages::message_page("No ledger", "This proxy runs with its ledger off (ledger.enabled: false): there is nothing to show."),
        );
    }
    let rest = rest.to_string();
    let query = query.to_string();
    let blocking = tokio::task::spawn_blocking(move || {
        let Some(store) = app.store.as_ref() else {
            return not_found("no ledger");
        };
        page(&app, store.as_ref(), &rest, &query)
    })
    .await;
    match blocking {
        Ok(r) => r,
        Err(e) => html_answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            pages::message_page("The page failed", &e.to_string()),
        ),
    }
}

/// The built-in price of a model: what a proxy started without a
/// configuration (tests, benches) prices with.
pub fn price(model: &str) -> Option<oceancode_config::Price> {
    oceancode_config::lookup(model).and_then(|i| i.price)
}

/// The prices the viewer shows spend at: the proxy's configured ones
/// (`providers.<id>.models[].price` over the built-in table, what `status`,
/// the exports and the session limits use), else the built-in table.
pub fn prices(app: &App) -> impl Fn(&str) -> Option<oceancode_config::Price> + '_ {
    move |model: &str| match &app.prices {
        Some(p) => p(model),
        None => price(model),
    }
}

fn store_failed(e: &dyn std::fmt::Display) -> Response<ProxyBody> {
    html_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::message_page("The ledger did not answer", &e.to_string()),
    )
}

fn page(app: &App, store: &dyn LedgerStore, rest: &str, query: &str) -> Response<ProxyBody> {
    if rest.is_empty() {
        return match sessions_lines(store, &prices(app)) {
            Ok(lines) => {
                let total = lines.len();
                let sort = Sort::parse(&query_value(query, "sort").unwrap_or_default());
                let filter = query_value(query, "filter").unwrap_or_default();
                let lines = pages::arrange(lines, sort, &filter);
                html_answer(
                    StatusCode::OK,
                    pages::sessions_page(&lines, sort, &filter, total),
                )
            }
            Err(e) => store_failed(&e),
        };
    }
    if rest == "search" {
        let q = query_value(query, "q").unwrap_or_default();
        let words: Vec<String> = q.split_whitespace().map(str::to_string).collect();
        if words.is_empty() {
            return html_answer(StatusCode::OK, pages::search_page("", &[], SEARCH_LIMIT));
        }
        return match store.search(&words, SEARCH_LIMIT) {
            Ok(hits) => html_answer(StatusCode::OK, pages::search_page(&q, &hits, SEARCH_LIMIT)),
            Err(oceancode_ledger::store::StoreError::TooBroad(e)) => html_answer(
                StatusCode::BAD_REQUEST,
                pages::message_page(
                    "Query too broad",
                    &format!("{e}; search fewer, rarer words"),
                ),
            ),
            Err(e) => store_failed(&e),
        };
    }
    let Some(s) = rest.strip_prefix("s/") else {
        return not_found("No such page in the viewer.");
    };
    let (id_seg, tail) = s.split_once('/').unwrap_or((s, ""));
    let id = percent_encoding::percent_decode_str(id_seg)
        .decode_utf8_lossy()
        .into_owned();
    match tail {
        "" => session(app, store, &id, query),
        "live" => match store.session_summary(&id) {
            Ok(Some(sum)) => {
                let steps = store.steps(&id).map(|s| s.len()).unwrap_or(0);
                let cuts = store.cuts(&id).map(|c| c.len()).unwrap_or(0);
                let body = serde_json::json!({
                    "stamp": pages::stamp(sum.rows, sum.last_ms, steps, cuts),
                    "rows": sum.rows,
                    "steps": steps,
                    "cuts": cuts,
                    "last_ms": sum.last_ms,
                });
                answer(StatusCode::OK, "application/json", body.to_string())
            }
            Ok(None) => not_found("No such session."),
            Err(e) => store_failed(&e),
        },
        "sent.json" => sent_json(store, &id, query),
        "export.md" | "export.atif.json" => export(store, &id, tail, &prices(app)),
        _ => not_found("No such page in the viewer."),
    }
}

/// `s/<id>/sent.json?step=N`: what step N (default: the latest) sent
/// upstream, message by message, as the model view shows it.
fn sent_json<S: LedgerRead + ?Sized>(store: &S, id: &str, query: &str) -> Response<ProxyBody> {
    let read = || -> Result<Option<String>, oceancode_ledger::store::StoreError> {
        let steps = store.steps(id)?;
        let Some(step) = query_value(query, "step")
            .and_then(|s| s.parse().ok())
            .or(steps.last().map(|s| s.step))
        else {
            return Ok(None);
        };
        let rows = store.session_rows(id, true)?;
        let edits = store.context_edits(id)?;
        let row = |seq: u64| {
            rows.binary_search_by_key(&seq, |(r, _)| r.seq)
                .ok()
                .map(|i| &rows[i].0)
        };
        let dialect = store
            .session_meta(id)?
            .map_or(oceancode_window::Dialect::Anthropic, |m| m.dialect);
        Ok(seen::seen(dialect, &steps, step, row, &edits).map(|s| {
            format!(
                "{{\"session\":{},\"step\":{},\"upto\":{},\"edit\":{},\"stateful\":{},\"messages\":{}}}",
                serde_json::Value::from(id),
                s.step,
                s.upto,
                s.edit.as_ref().map_or(0, |e| e.n),
                s.stateful,
                s.messages_json()
            )
        }))
    };
    match read() {
        Ok(Some(body)) => answer(StatusCode::OK, "application/json", body),
        Ok(None) => {
            not_found("No such step, or it was recorded before the proxy kept what each step sent.")
        }
        Err(e) => store_failed(&e),
    }
}

fn export(
    store: &dyn LedgerStore,
    id: &str,
    what: &str,
    price: &dyn Fn(&str) -> Option<oceancode_config::Price>,
) -> Response<ProxyBody> {
    match store.session_meta(id) {
        Ok(Some(_)) => {}
        Ok(None) => return not_found("No such session."),
        Err(e) => return store_failed(&e),
    }
    let mut out = Vec::new();
    let (done, ctype) = if what == "export.md" {
        (
            oceancode_ledger::export::markdown(store, id, price, &mut out, None),
            "text/markdown; charset=utf-8",
        )
    } else {
        (
            oceancode_ledger::atif::write(store, id, price, &mut out),
            "application/json",
        )
    };
    if let Err(e) = done {
        return store_failed(&e);
    }
    let mut r = answer(StatusCode::OK, ctype, out);
    let name = format!(
        "attachment; filename=\"{}.{}\"",
        oceancode_ledger::paths::sanitize_session_id(id),
        what.trim_start_matches("export.")
    );
    if let Ok(v) = HeaderValue::from_str(&name) {
        r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

fn sessions_lines<S: LedgerRead + ?Sized>(
    store: &S,
    price: &dyn Fn(&str) -> Option<oceancode_config::Price>,
) -> Result<Vec<SessionLine>, oceancode_ledger::store::StoreError> {
    let list = store.list_sessions()?;
    let mut children: std::collections::HashMap<String, Vec<String>> = Default::default();
    for s in &list {
        if let Some(p) = &s.parent {
            children.entry(p.clone()).or_default().push(s.id.clone());
        }
    }
    let mut out = Vec::with_capacity(list.len());
    for s in list {
        let steps = store.steps(&s.id)?;
        let cuts = store.cuts(&s.id)?.len();
        let (totals, _) = oceancode_ledger::status::totals(&steps, price);
        let priced = totals.unpriced.is_empty() || totals.cost_usd > 0.0;
        out.push(SessionLine {
            steps: steps.len() as u32,
            cuts,
            spend: (priced && !steps.is_empty()).then_some(totals.cost_usd),
            children: children.remove(&s.id).unwrap_or_default(),
            summary: s,
        });
    }
    Ok(out)
}

/// Read what a session page shows.
pub fn session_data<S: LedgerRead + ?Sized>(
    store: &S,
    id: &str,
    live: bool,
) -> Result<Option<SessionData>, oceancode_ledger::store::StoreError> {
    let Some(summary) = store.session_summary(id)? else {
        return Ok(None);
    };
    let Some(loaded) = store.load_session(id)? else {
        return Ok(None);
    };
    let hidden: std::collections::HashSet<u64> = loaded.hidden.iter().copied().collect();
    let rows: Vec<_> = loaded
        .rows
        .iter()
        .map(|r| (r.clone(), hidden.contains(&r.seq)))
        .collect();
    let meta = loaded.meta.clone();
    let steps = store.steps(id)?;
    // The latest step's record says what it sent: the window need not be
    // rebuilt from the rows (which parses every row), only the active line.
    let view = if steps.last().is_some_and(|s| s.detail.sent.is_some()) {
        crate::sessions::ModelView {
            active: loaded
                .rows
                .iter()
                .filter(|r| !r.from_response && !hidden.contains(&r.seq))
                .map(|r| r.seq)
                .collect(),
            ..Default::default()
        }
    } else {
        crate::sessions::model_view(store.data_dir().root(), loaded)
    };
    let children = store
        .list_sessions()?
        .into_iter()
        .filter(|s| s.parent.as_deref() == Some(id))
        .map(|s| s.id)
        .collect();
    let dir = store.data_dir();
    let page_md = dir
        .read_text(&dir.session_md(id), oceancode_ledger::inside::READ_MAX)
        .ok();
    Ok(Some(SessionData {
        edits: store.context_edits(id)?,
        summary,
        meta,
        rows,
        steps,
        cuts: store.cuts(id)?,
        line: store.recorded_line(id)?,
        view,
        page_md,
        children,
        live,
    }))
}

fn session<S: LedgerRead + ?Sized>(
    app: &App,
    store: &S,
    id: &str,
    query: &str,
) -> Response<ProxyBody> {
    let live = app.sessions.get(id).is_some();
    let d = match session_data(store, id, live) {
        Ok(Some(d)) => d,
        Ok(None) => return not_found("No such session in the ledger."),
        Err(e) => return store_failed(&e),
    };
    let q = PageQuery {
        view: match query_value(query, "view").as_deref() {
            Some("model") => View::Model,
            _ => View::Full,
        },
        page: query_value(query, "page").and_then(|p| p.parse().ok()),
        seq: query_value(query, "seq").and_then(|p| p.parse().ok()),
        step: query_value(query, "step").and_then(|p| p.parse().ok()),
    };
    html_answer(StatusCode::OK, pages::session_page(&d, q, &prices(app)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_leaves_the_query() {
        assert_eq!(without_token("token=abc"), "");
        assert_eq!(
            without_token("view=model&token=abc&page=2"),
            "view=model&page=2"
        );
        assert_eq!(
            query_value("a=1&q=two+words%21", "q").as_deref(),
            Some("two words!")
        );
        assert_eq!(query_value("a=1", "q"), None);
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("x=1; oceancode_ui=tok ; y=2"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("tok"));
        assert!(is_ui("/_oceancode/ui"));
        assert!(is_ui("/_oceancode/ui/s/x"));
        assert!(!is_ui("/_oceancode/uix"));
        assert_eq!(
            open_url("http://127.0.0.1:9/", Some("ab")),
            "http://127.0.0.1:9/_oceancode/ui/?token=ab"
        );
    }
}
