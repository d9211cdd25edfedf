//! The admin API under `/_oceancode/` (sessions, meter, tideline, settle,
//! health) and Prometheus `/metrics`, served on the proxy's own listener.
//! Every route needs the admin token ([`token`]) but the registry's
//! instance proof ([`crate::registry::INSTANCE_PATH`]); a write (POST) needs
//! `Content-Type: application/json`, which a web page cannot send to
//! another origin without asking first.

mod context;
pub mod prom;

use crate::app::App;
use crate::error::{error_response, json_response, Envelope, ProxyBody, ProxyError};
use crate::token;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use oceancode_config::{tideline_command, LineSpec, TidelineCommand as TidelineAction};
use prom::Prom;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Does the request carry the admin token (`Authorization: Bearer <token>`)?
pub fn authorized(headers: &http::HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .is_some_and(|t| token::matches(t, token))
}

/// Is the request's body declared as JSON?
fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

fn bad(msg: &str) -> Response<ProxyBody> {
    error_response(
        StatusCode::BAD_REQUEST,
        Envelope::Anthropic,
        "invalid_request_error",
        "invalid_request",
        msg,
    )
}

fn not_found(msg: &str) -> Response<ProxyBody> {
    error_response(
        StatusCode::NOT_FOUND,
        Envelope::Anthropic,
        "not_found_error",
        "not_found",
        msg,
    )
}

fn session_json(app: &App, s: &crate::sessions::Session) -> serde_json::Value {
    let in_force = app.sessions.line_spec_of(s);
    let limits = app.sessions.budget_view(s);
    let st = s.state.lock();
    // What `meter.line` was computed from; before the first request, what
    // the next one will use.
    let line_spec = crate::sessions::line_label(st.meter.spec.unwrap_or(in_force));
    let m = st.meta();
    json!({
        "id": s.id,
        "client": m.client,
        "client_session": m.client_session,
        "dialect": m.dialect.as_str(),
        "model": m.model,
        "parent": m.parent,
        "parent_seq": m.parent_seq,
        "created_ms": m.created_ms,
        "last_ms": m.last_ms,
        "override": st.override_line().map(|l| match l { LineSpec::Percent(p) => format!("{p}%"), LineSpec::Tokens(t) => t.to_string() }),
        "line_spec": line_spec,
        "meter": st.meter,
        "totals": st.totals,
        // Its use against `limits.session` (null: no bound set).
        "limits": limits,
        // The ledger misses some of it until its next full resend.
        "ledger_behind": app.store.as_ref().and_then(|l| l.behind(&s.id)),
        // The live merge of its SESSION.md (null: off or not run yet).
        "merge": app.merge.as_ref().and_then(|m| m.session(&s.id)),
    })
}

/// `/_oceancode/health`: the proxy serves (`ok`); `status` is `degraded`
/// when the ledger falls behind (reasons, lag, sessions behind).
fn health(app: &App) -> serde_json::Value {
    let uptime_s = app.started.elapsed().as_secs();
    let Some(store) = &app.store else {
        return json!({"ok": true, "status": "ok", "uptime_s": uptime_s, "ledger": null});
    };
    let h = store.health();
    let behind: Vec<serde_json::Value> = store
        .behind_sessions()
        .into_iter()
        .take(100)
        .map(|(id, b)| json!({"session": id, "since_ms": b.since_ms, "reason": b.reason, "dropped": b.dropped}))
        .collect();
    json!({
        "ok": true,
        "status": h.status,
        "uptime_s": uptime_s,
        "ledger": {
            "status": h.status,
            "reasons": h.reasons,
            "lag_ms": h.lag_ms,
            "queued": h.queued,
            "queued_bytes": h.queued_bytes,
            "behind": h.behind,
            "behind_sessions": behind,
        },
    })
}

/// A live session by its ledger id, the client's session name or id, or a
/// unique prefix ([`oceancode_ledger::resolve`]); the most recent one for
/// `latest`.
fn live_session(
    app: &App,
    spec: &str,
) -> Result<Arc<crate::sessions::Session>, oceancode_ledger::resolve::ResolveError> {
    use oceancode_ledger::resolve::{resolve, ResolveError};
    if spec == "latest" {
        return app.sessions.latest().ok_or(ResolveError::NoSessions);
    }
    if let Some(s) = app.sessions.get(spec) {
        return Ok(s);
    }
    let cands: Vec<oceancode_ledger::resolve::Candidate> = app
        .sessions
        .sessions()
        .iter()
        .map(|s| {
            let st = s.state.lock();
            let m = st.meta();
            oceancode_ledger::resolve::Candidate {
                id: s.id.clone(),
                client: m.client.clone(),
                client_session: m.client_session.clone(),
                parent: m.parent.clone(),
                created_ms: m.created_ms,
                last_ms: m.last_ms,
            }
        })
        .collect();
    let id = resolve(spec, &cands)?;
    app.sessions.get(&id).ok_or(ResolveError::NoSessions)
}

/// The 404 of a session name no live session answers to.
fn no_live_session(spec: &str, e: &oceancode_ledger::resolve::ResolveError) -> Response<ProxyBody> {
    match e {
        oceancode_ledger::resolve::ResolveError::NoSessions => {
            not_found(&format!("no live session {spec:?}: this proxy holds none"))
        }
        e => not_found(&format!("no live session: {e}")),
    }
}

/// A path segment, percent-decoded (a client name may hold any character).
fn decoded(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg)
        .decode_utf8_lossy()
        .into_owned()
}

/// Handle an admin request.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<ProxyBody> {
    // The proof a command asks for before it sends the token (no token).
    if req.uri().path() == crate::registry::INSTANCE_PATH && req.method() == Method::GET {
        let challenge = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("challenge="))
            .filter(|c| (32..=128).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_hexdigit()));
        return match challenge {
            Some(c) => json_response(
                StatusCode::OK,
                json!({"proof": crate::registry::proof(&app.instance, c)}).to_string(),
            ),
            None => bad("challenge= must be 32 to 128 hex digits"),
        };
    }
    if !authorized(req.headers(), &app.admin_token) {
        app.metrics.access_denied.fetch_add(1, Ordering::Relaxed);
        return ProxyError::Unauthorized.into_response(Envelope::Anthropic);
    }
    if req.method() != Method::GET && !is_json(req.headers()) {
        app.metrics.access_denied.fetch_add(1, Ordering::Relaxed);
        return ProxyError::NotJson.into_response(Envelope::Anthropic);
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/metrics") => metrics(&app),
        (Method::GET, "/_oceancode/health") => {
            json_response(StatusCode::OK, health(&app).to_string())
        }
        (Method::GET, "/_oceancode/sessions") => {
            let mut list: Vec<serde_json::Value> = app
                .sessions
                .sessions()
                .iter()
                .map(|s| session_json(&app, s))
                .collect();
            list.sort_by_key(|v| std::cmp::Reverse(v["last_ms"].as_i64().unwrap_or(0)));
            json_response(
                StatusCode::OK,
                json!({"sessions": list, "data_dir": app.cfg.data_dir}).to_string(),
            )
        }
        (Method::GET, p) if p.starts_with("/_oceancode/sessions/") => {
            let id = decoded(&p["/_oceancode/sessions/".len()..]);
            match live_session(&app, &id) {
                Ok(s) => json_response(StatusCode::OK, session_json(&app, &s).to_string()),
                Err(e) => no_live_session(&id, &e),
            }
        }
        (Method::GET, p) if p == "/_oceancode/meter" || p.starts_with("/_oceancode/meter/") => {
            // The context meter alone: `/meter` (latest session) or `/meter/<id>`.
            let id = decoded(
                p.strip_prefix("/_oceancode/meter/")
                    .filter(|id| !id.is_empty())
                    .unwrap_or("latest"),
            );
            match live_session(&app, &id) {
                Ok(s) => {
                    let meter = s.state.lock().meter;
                    json_response(
                        StatusCode::OK,
                        json!({"session": s.id, "meter": meter}).to_string(),
                    )
                }
                Err(e) => no_live_session(&id, &e),
            }
        }
        (Method::POST, "/_oceancode/settle") => {
            if let Some(store) = &app.store {
                if let Err(e) = store.settle().await {
                    return error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        Envelope::Anthropic,
                        "api_error",
                        "ledger_unavailable",
                        &format!("ledger settle failed: {e}"),
                    );
                }
            }
            json_response(StatusCode::OK, json!({"settled": true}).to_string())
        }
        (Method::GET, "/_oceancode/tideline") => {
            let session = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("session="))
                .map(str::to_string);
            tideline(&app, session, vec![])
        }
        (Method::POST, "/_oceancode/tideline") => {
            let v = match json_body(req, 64 * 1024, r#"{"session":..,"value":..}"#).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            let session = v
                .get("session")
                .and_then(|s| s.as_str())
                .map(str::to_string);
            let args: Vec<String> = v
                .get("value")
                .and_then(|s| s.as_str())
                .map(|s| vec![s.to_string()])
                .unwrap_or_default();
            tideline(&app, session, args)
        }
        (Method::POST, "/_oceancode/evict") => {
            let v = match json_body(req, 64 * 1024, r#"{"session":..,"value":..}"#).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            let spec = v
                .get("session")
                .and_then(|s| s.as_str())
                .unwrap_or("latest");
            let s = match live_session(&app, spec) {
                Ok(s) => s,
                Err(e) => return no_live_session(spec, &e),
            };
            let words: Vec<String> = v
                .get("value")
                .and_then(|s| s.as_str())
                .map(|s| s.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default();
            match crate::sessions::Evict::parse(&words).and_then(|how| app.sessions.evict(&s, how))
            {
                Ok(e) => json_response(
                    StatusCode::OK,
                    serde_json::to_string(&e).unwrap_or_default(),
                ),
                Err(e) => bad(&e),
            }
        }
        (Method::POST, "/_oceancode/viewer/revoke") => json_response(
            StatusCode::OK,
            json!({"revoked": app.viewer.revoke_all()}).to_string(),
        ),
        (Method::POST, "/_oceancode/context") => {
            let shape = r#"{"session":..,"drop":[..],"keep":[..],"note":..}"#;
            match json_body(req, 1 << 20, shape).await {
                Ok(v) => context::handle(&app, &v).await,
                Err(r) => r,
            }
        }
        _ => not_found(&format!("no admin endpoint {path}")),
    }
}

/// An admin write's JSON body, at most `limit` bytes; else the 400 that
/// names the expected `shape`.
async fn json_body(
    req: Request<Incoming>,
    limit: usize,
    shape: &str,
) -> Result<serde_json::Value, Response<ProxyBody>> {
    let body = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(bad(&format!("cannot read body: {e}"))),
    };
    serde_json::from_slice(&body).map_err(|e| bad(&format!("body must be JSON {shape}: {e}")))
}

fn tideline(app: &App, session: Option<String>, args: Vec<String>) -> Response<ProxyBody> {
    let action = match tideline_command(&args) {
        Ok(a) => a,
        Err(e) => return bad(&e.to_string()),
    };
    if !app.sessions.enabled() {
        return bad("the ledger is off (ledger.enabled: false): requests are relayed as sent and no tideline applies");
    }
    // A session that is named must be found: an unknown name never falls
    // back to the latest session.
    let session = match session.as_deref() {
        Some("latest") => app.sessions.latest().map(|s| s.id.clone()),
        Some(spec) => match live_session(app, spec) {
            Ok(s) => Some(s.id.clone()),
            Err(e) => return no_live_session(spec, &e),
        },
        None => None,
    };
    if let TidelineAction::Set(l) = &action {
        if let Err(why) = app.sessions.check_line(session.as_deref(), *l) {
            return bad(&why);
        }
    }
    let result = match &action {
        TidelineAction::Show => Ok(None),
        TidelineAction::Set(l) => app
            .sessions
            .set_override(session.as_deref(), Some(*l))
            .map(|_| None),
        TidelineAction::Default => app
            .sessions
            .set_override(session.as_deref(), None)
            .map(|_| None),
        TidelineAction::Now => match session
            .clone()
            .or_else(|| app.sessions.latest().map(|s| s.id.clone()))
        {
            Some(id) => app.sessions.cut_now(&id).map(Some),
            None => Err("no session to cut".to_string()),
        },
    };
    match result {
        Err(e) => not_found(&e),
        Ok(cut) => {
            let s = session
                .as_deref()
                .and_then(|id| app.sessions.get(id))
                .or_else(|| app.sessions.latest());
            let (name, note) = match action {
                TidelineAction::Show => ("show", "current state"),
                TidelineAction::Set(_) => ("set", "applies from the next request"),
                TidelineAction::Default => ("default", "applies from the next request"),
                TidelineAction::Now => ("now", "the next request cuts"),
            };
            let mut v = json!({
                "action": name,
                "scope": session.unwrap_or_else(|| "all sessions".into()),
                "note": note,
                "session": s.map(|s| session_json(app, &s)),
            });
            if let TidelineAction::Set(l) = action {
                v["value"] = json!(crate::sessions::line_label(l));
            }
            if let Some(upto) = cut {
                // `now`: the last row the next window leaves out.
                v["cut_upto"] = json!(upto);
            }
            json_response(StatusCode::OK, v.to_string())
        }
    }
}

fn metrics(app: &App) -> Response<ProxyBody> {
    let m = &app.metrics;
    let s = &app.sessions.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut p = Prom::new();
    for (name, help, v) in [
        ("oceancode_requests_total", "Requests on provider routes.", load(&m.requests)),
        ("oceancode_bodies_spliced_total", "Request bodies split against the client's previous body (shared prefix hashed, not parsed).", load(&s.bodies_spliced)),
        ("oceancode_passthrough_total", "Requests passed through untouched.", load(&m.passthrough)),
        ("oceancode_proxy_errors_total", "Errors answered by the proxy itself.", load(&m.proxy_errors)),
        ("oceancode_upstream_errors_total", "Upstream answers with status >= 400.", load(&m.upstream_errors)),
        ("oceancode_cancelled_total", "Responses the client stopped reading.", load(&m.cancelled)),
        ("oceancode_access_denied_total", "Requests refused by the access rules (Host, Origin, admin token, admin Content-Type).", load(&m.access_denied)),
        ("oceancode_busy_total", "Requests answered 503 because request bodies in flight held limits.max_bodies_in_flight_bytes.", load(&m.busy)),
        ("oceancode_body_timeouts_total", "Request bodies that did not arrive within limits.body_read_timeout_ms.", load(&m.body_timeouts)),
        ("oceancode_limit_refusals_total", "Requests refused because their session reached a limits.session bound (spend, steps, time).", load(&m.limit_refusals)),
        ("oceancode_streams_cut_total", "Upstream answers cut mid-way (reset, idle timeout).", load(&m.streams_cut)),
        ("oceancode_answers_truncated_total", "Answers longer than limits.max_recorded_response_bytes, recorded truncated.", load(&m.answers_truncated)),
        ("oceancode_decode_stopped_total", "Compressed answers whose copy decoded past limits.max_decoded_response_bytes (usage unknown).", load(&m.decode_stopped)),
        ("oceancode_recalls_total", "oceancode_recall calls the proxy answered itself (ledger.recall_tool).", load(&m.recalls)),
        ("oceancode_cuts_total", "Tideline cuts.", load(&s.cuts)),
        ("oceancode_cold_cuts_total", "Tideline cuts made at a request whose prompt cache was already cold (TTL past, model switch, resumed session): free.", load(&s.cold_cuts)),
        ("oceancode_tokens_kept_out_total", "Estimated tokens kept out of upstream windows (summed per request).", load(&s.tokens_kept_out)),
        ("oceancode_rewritten_total", "Requests whose conversation was windowed.", load(&s.rewritten)),
        ("oceancode_compress_outputs_total", "Tool outputs ledger.compress made pointers (counted at the cut that chose them).", load(&s.compress_outputs)),
        ("oceancode_compress_saved_tokens_total", "The saved estimate of the compress pointers sent (removed bytes / 4, summed per request).", load(&s.compress_saved_tokens)),
        ("oceancode_too_long_retries_total", "Retries after a too-long error.", load(&s.too_long_retries)),
        ("oceancode_branches_total", "Branches recorded.", load(&s.branches)),
        ("oceancode_failed_steps_total", "Steps recorded as failed (unreachable, timeout, broken stream, cancelled, an error status or event).", load(&s.failed_steps)),
        ("oceancode_refused_requests_total", "Requests the upstream refused with 401/403: nothing of them recorded.", load(&s.refused)),
        ("oceancode_siblings_total", "Sibling sessions: headerless conversations that left a live line with the same opening.", load(&s.siblings)),
    ] {
        p.counter(name, help, v);
    }
    let t = app.telemetry.metrics();
    p.counter(
        "oceancode_otlp_spans_exported_total",
        "Spans the OTLP export sent (telemetry.otlp).",
        load(&t.exported),
    );
    p.counter(
        "oceancode_otlp_spans_dropped_total",
        "Spans the OTLP export dropped: its queue was full, or the collector was down, slow or refusing.",
        load(&t.dropped),
    );
    if let Some(merge) = &app.merge {
        let ms = &merge.stats;
        for (name, help, v) in [
            (
                "oceancode_merge_calls_total",
                "Live merges of SESSION.md that stored their lines (ledger.merge.model).",
                load(&ms.calls),
            ),
            (
                "oceancode_merge_failures_total",
                "Live merges of SESSION.md that failed (the first is logged).",
                load(&ms.failures),
            ),
            (
                "oceancode_merge_lines_total",
                "Lines the live merge added to SESSION.md pages.",
                load(&ms.lines),
            ),
            (
                "oceancode_merge_input_tokens_total",
                "Input tokens of the live merge's model calls (cache reads and writes included).",
                load(&ms.input_tokens),
            ),
            (
                "oceancode_merge_output_tokens_total",
                "Output tokens of the live merge's model calls.",
                load(&ms.output_tokens),
            ),
        ] {
            p.counter(name, help, v);
        }
        p.gauge(
            "oceancode_merge_cost_usd",
            "What the live merge's model calls cost at list price, USD (not in any session's spend).",
            load(&ms.cost_micro_usd) as f64 / 1e6,
        );
    }
    p.seconds_total(
        "oceancode_prepare_seconds_total",
        "Time spent preparing provider requests (parse, match, tideline, render).",
        load(&m.prepare_us),
    );
    let misses: Vec<(&str, f64)> = oceancode_window::cache::MissCause::ALL
        .iter()
        .zip(&s.cache_misses)
        .map(|(c, n)| (c.label(), load(n) as f64))
        .collect();
    p.labeled(
        "oceancode_cache_miss_total",
        "Steps that wrote (or sent uncached) more of the prompt than they appended, by cause.",
        "counter",
        "cause",
        &misses,
    );
    let ir = load(&m.input_tokens);
    let cr = load(&m.cache_read_tokens);
    let cw = load(&m.cache_write_tokens);
    p.labeled(
        "oceancode_tokens_total",
        "Tokens reported by upstreams.",
        "counter",
        "kind",
        &[
            ("input", ir as f64),
            ("output", load(&m.output_tokens) as f64),
            ("cache_read", cr as f64),
            ("cache_write", cw as f64),
        ],
    );
    let total_in = ir + cr + cw;
    let ratio = if total_in == 0 {
        0.0
    } else {
        ((cr as f64 / total_in as f64) * 1e4).round() / 1e4
    };
    p.gauge(
        "oceancode_cache_read_ratio",
        "Cache reads over all input tokens.",
        ratio,
    );
    p.gauge(
        "oceancode_connections",
        "Client connections open.",
        load(&m.connections) as f64,
    );
    p.gauge(
        "oceancode_body_bytes_in_flight",
        "Bytes of request bodies the proxy holds now.",
        app.bodies.in_use() as f64,
    );
    if let Some(store) = &app.store {
        let w = store.metrics();
        for (name, help, v) in [
            (
                "oceancode_ledger_events_total",
                "Ledger events committed (refused ones included).",
                w.events,
            ),
            (
                "oceancode_ledger_batches_total",
                "Ledger transactions committed.",
                w.batches,
            ),
            (
                "oceancode_ledger_rejected_total",
                "Ledger events refused (seq gap, unknown session, SQL error).",
                w.rejected,
            ),
            (
                "oceancode_ledger_commits_failed_total",
                "Ledger batches given up at shutdown after retrying.",
                w.commits_failed,
            ),
            (
                "oceancode_ledger_commit_retries_total",
                "Ledger commit attempts that failed and were retried.",
                w.commit_retries,
            ),
            (
                "oceancode_ledger_shed_total",
                "Ledger events shed (write queue full, or their session behind).",
                w.shed,
            ),
            (
                "oceancode_ledger_reopens_total",
                "Ledger databases opened afresh after their file was deleted or replaced.",
                w.reopens,
            ),
            (
                "oceancode_ledger_files_healed_total",
                "Sessions whose transcript files were written again after a failure or a hole.",
                w.files_healed,
            ),
            (
                "oceancode_ledger_transcript_errors_total",
                "Transcript, index or SESSION.md writes that failed.",
                w.transcript_errors,
            ),
            (
                "oceancode_ledger_pages_written_total",
                "SESSION.md writes.",
                w.pages_written,
            ),
            (
                "oceancode_retention_sessions_removed_total",
                "Sessions removed by the retention sweep.",
                w.sessions_removed,
            ),
        ] {
            p.counter(name, help, v);
        }
        p.gauge(
            "oceancode_ledger_queued",
            "Ledger events queued and not yet committed.",
            w.queued as f64,
        );
        p.gauge(
            "oceancode_ledger_queued_bytes",
            "Bytes of ledger events queued.",
            w.queued_bytes as f64,
        );
        p.gauge(
            "oceancode_ledger_behind_sessions",
            "Sessions the ledger misses events of until their next full resend.",
            w.behind as f64,
        );
        p.labeled(
            "oceancode_ledger_commit_lag_seconds",
            "Enqueue-to-commit lag of recent ledger events.",
            "gauge",
            "quantile",
            &[
                ("0.5", w.lag_p50_us as f64 / 1e6),
                ("0.99", w.lag_p99_us as f64 / 1e6),
                ("1", w.lag_max_us as f64 / 1e6),
            ],
        );
    }
    let lag_ms = app
        .store
        .as_ref()
        .map(|s| s.metrics().writer_lag_ms)
        .unwrap_or(0);
    p.gauge(
        "oceancode_writer_lag_seconds",
        "Age of the oldest queued ledger write.",
        lag_ms as f64 / 1e3,
    );
    p.gauge(
        "oceancode_sessions",
        "Sessions in memory.",
        app.sessions.sessions().len() as f64,
    );
    let mut r = Response::new(crate::error::full(p.finish()));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}
