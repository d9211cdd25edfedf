//! `POST /_oceancode/context`: export a session's window to its
//! `context.txt` (`{"session": S}`), edit it without the file
//! (`"drop": [SPANS], "keep": [SEQS], "note": TEXT`), or read the last
//! receipt (`"receipt": true`).

use super::{bad, live_session, no_live_session};
use crate::app::App;
use crate::error::{error_response, json_response, Envelope, ProxyBody};
use http::{Response, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

fn unavailable(msg: &str) -> Response<ProxyBody> {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        Envelope::Anthropic,
        "api_error",
        "ledger_unavailable",
        msg,
    )
}

/// The session's rows as the ledger holds them (settled first).
async fn rows(app: &App, id: &str) -> Result<HashMap<u64, Arc<str>>, Response<ProxyBody>> {
    let Some(store) = &app.store else {
        return Err(bad(
            "the ledger is off (ledger.enabled: false): there is no context to export",
        ));
    };
    if let Err(e) = store.settle().await {
        return Err(unavailable(&format!("ledger settle failed: {e}")));
    }
    let rows = store
        .session_rows(id, false)
        .map_err(|e| unavailable(&format!("cannot read the session's rows: {e}")))?;
    Ok(rows
        .into_iter()
        .map(|(r, _)| (r.seq, Arc::from(&*r.raw)))
        .collect())
}

/// Handle the request body `v`.
pub(super) async fn handle(app: &App, v: &Value) -> Response<ProxyBody> {
    let spec = v.get("session").and_then(Value::as_str).unwrap_or("latest");
    let session = match live_session(app, spec) {
        Ok(s) => s,
        Err(e) => return no_live_session(spec, &e),
    };
    if v.get("receipt").and_then(Value::as_bool) == Some(true) {
        return json_response(
            StatusCode::OK,
            json!({"session": session.id, "receipt": app.sessions.context_receipt(&session)})
                .to_string(),
        );
    }
    let strings = |k: &str| -> Vec<String> {
        match v.get(k) {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| match x {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        }
    };
    let drop = strings("drop");
    let keep: Result<Vec<u64>, String> = strings("keep")
        .iter()
        .flat_map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| format!("--keep takes seqs: {s:?} is not one"))
        })
        .collect();
    let keep = match keep {
        Ok(k) => k,
        Err(e) => return bad(&e),
    };
    let note = v.get("note").and_then(Value::as_str);
    let rows = match rows(app, &session.id).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if !drop.is_empty() || !keep.is_empty() || note.is_some() {
        return match app
            .sessions
            .edit_context(&session, &drop, &keep, note, &rows)
        {
            Ok(receipt) => json_response(
                StatusCode::OK,
                json!({"session": session.id, "receipt": receipt}).to_string(),
            ),
            Err(e) => bad(&e),
        };
    }
    match app.sessions.export_context(&session, &rows) {
        Ok(a) => json_response(
            StatusCode::OK,
            serde_json::to_string(&a).unwrap_or_default(),
        ),
        Err(e) => unavailable(&e),
    }
}
