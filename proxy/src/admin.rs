//! The admin API under `/_oceancode/` (sessions, meter, tideline, settle,
//! health) and Prometheus `/metrics`, served on the proxy's own listener.

use crate::error::{error_response, json_response, Envelope, ProxyBody};
use crate::server::App;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use oceancode_config::{tideline_command, LineSpec, TidelineCommand as TidelineAction};
use serde_json::json;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
        "last_ms": m.last_ms,
        "override": st.override_line().map(|l| match l { LineSpec::Percent(p) => format!("{p}%"), LineSpec::Tokens(t) => t.to_string() }),
        "line_spec": line_spec,
        "meter": st.meter,
        "totals": st.totals,
    })
}

/// A live session by id, or the most recent one for `latest`.
fn live_session(app: &App, id: &str) -> Option<Arc<crate::sessions::Session>> {
    if id == "latest" {
        app.sessions.latest()
    } else {
        app.sessions.get(id)
    }
}

/// Handle an admin request.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<ProxyBody> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/metrics") => metrics(&app),
        (Method::GET, "/_oceancode/health") => json_response(
            StatusCode::OK,
            json!({"ok": true, "uptime_s": app.started.elapsed().as_secs()}).to_string(),
        ),
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
            let id = &p["/_oceancode/sessions/".len()..];
            match live_session(&app, id) {
                Some(s) => json_response(StatusCode::OK, session_json(&app, &s).to_string()),
                None => not_found(&format!("no live session {id:?}")),
            }
        }
        (Method::GET, p) if p == "/_oceancode/meter" || p.starts_with("/_oceancode/meter/") => {
            // The context meter alone: `/meter` (latest session) or `/meter/<id>`.
            let id = p
                .strip_prefix("/_oceancode/meter/")
                .filter(|id| !id.is_empty())
                .unwrap_or("latest");
            match live_session(&app, id) {
                Some(s) => {
                    let meter = s.state.lock().meter;
                    json_response(
                        StatusCode::OK,
                        json!({"session": s.id, "meter": meter}).to_string(),
                    )
                }
                None => not_found(&format!("no live session {id:?}")),
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
            let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return bad(&format!("cannot read body: {e}")),
            };
            let v: serde_json::Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    return bad(&format!(
                        "body must be JSON {{\"session\":..,\"value\":..}}: {e}"
                    ))
                }
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
        _ => not_found(&format!("no admin endpoint {path}")),
    }
}

fn tideline(app: &App, session: Option<String>, args: Vec<String>) -> Response<ProxyBody> {
    let action = match tideline_command(&args) {
        Ok(a) => a,
        Err(e) => return bad(&e.to_string()),
    };
    if !app.sessions.enabled() {
        return bad("the ledger is off (ledger.enabled: false): requests are relayed as sent and no tideline applies");
    }
    let session = match session.as_deref() {
        Some("latest") => app.sessions.latest().map(|s| s.id.clone()),
        other => other.map(|id| app.sessions.resolve(id).unwrap_or_else(|| id.to_string())),
    };
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
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    };
    counter(
        "oceancode_requests_total",
        "Requests on provider routes.",
        m.requests.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_prepare_microseconds_total",
        "Time spent preparing provider requests (parse, match, tideline, render), µs.",
        m.prepare_us.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_bodies_spliced_total",
        "Request bodies split against the client's previous body (shared prefix hashed, not parsed).",
        s.bodies_spliced.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_passthrough_total",
        "Requests passed through untouched.",
        m.passthrough.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_proxy_errors_total",
        "Errors answered by the proxy itself.",
        m.proxy_errors.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_upstream_errors_total",
        "Upstream answers with status >= 400.",
        m.upstream_errors.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_cancelled_total",
        "Responses the client stopped reading.",
        m.cancelled.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_cuts_total",
        "Tideline cuts.",
        s.cuts.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_tokens_kept_out_total",
        "Estimated tokens kept out of upstream windows (summed per request).",
        s.tokens_kept_out.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_rewritten_total",
        "Requests whose conversation was windowed.",
        s.rewritten.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_too_long_retries_total",
        "Retries after a too-long error.",
        s.too_long_retries.load(Ordering::Relaxed),
    );
    counter(
        "oceancode_branches_total",
        "Branches recorded.",
        s.branches.load(Ordering::Relaxed),
    );
    let ir = m.input_tokens.load(Ordering::Relaxed);
    let cr = m.cache_read_tokens.load(Ordering::Relaxed);
    let cw = m.cache_write_tokens.load(Ordering::Relaxed);
    let _ = writeln!(out, "# HELP oceancode_tokens_total Tokens reported by upstreams.\n# TYPE oceancode_tokens_total counter");
    let _ = writeln!(out, "oceancode_tokens_total{{kind=\"input\"}} {ir}");
    let _ = writeln!(
        out,
        "oceancode_tokens_total{{kind=\"output\"}} {}",
        m.output_tokens.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "oceancode_tokens_total{{kind=\"cache_read\"}} {cr}");
    let _ = writeln!(out, "oceancode_tokens_total{{kind=\"cache_write\"}} {cw}");
    let total_in = ir + cr + cw;
    let ratio = if total_in == 0 {
        0.0
    } else {
        cr as f64 / total_in as f64
    };
    let _ = writeln!(out, "# HELP oceancode_cache_read_ratio Cache reads over all input tokens.\n# TYPE oceancode_cache_read_ratio gauge\noceancode_cache_read_ratio {ratio:.4}");
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
                "Ledger batches lost after a retry.",
                w.commits_failed,
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
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(out, "# HELP oceancode_ledger_queued Ledger events queued and not yet committed.\n# TYPE oceancode_ledger_queued gauge\noceancode_ledger_queued {}", w.queued);
        let _ = writeln!(out, "# HELP oceancode_ledger_commit_lag_seconds Enqueue-to-commit lag of recent ledger events.\n# TYPE oceancode_ledger_commit_lag_seconds gauge");
        for (q, us) in [
            ("0.5", w.lag_p50_us),
            ("0.99", w.lag_p99_us),
            ("1", w.lag_max_us),
        ] {
            let _ = writeln!(
                out,
                "oceancode_ledger_commit_lag_seconds{{quantile=\"{q}\"}} {:.6}",
                us as f64 / 1e6
            );
        }
    }
    let lag = app.store.as_ref().map(|s| s.writer_lag_ms()).unwrap_or(0);
    let _ = writeln!(out, "# HELP oceancode_writer_lag_ms Age of the oldest queued ledger write.\n# TYPE oceancode_writer_lag_ms gauge\noceancode_writer_lag_ms {lag}");
    let _ = writeln!(out, "# HELP oceancode_sessions Sessions in memory.\n# TYPE oceancode_sessions gauge\noceancode_sessions {}", app.sessions.sessions().len());
    let mut r = Response::new(crate::error::full(out));
    if let Ok(v) = http::HeaderValue::from_str("text/plain; version=0.0.4") {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}
