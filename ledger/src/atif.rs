//! `export --atif`: the session as one ATIF-v1.8 trajectory (Agent
//! Trajectory Interchange Format), built from the database's active line.
//!
//! - `system` rows → `system` steps; prompts → `user` steps; the assistant
//!   rows of one request/response → one `agent` step (text, reasoning,
//!   `tool_calls`); tool results → that agent step's `observation`, keyed by
//!   the call id.
//! - Each agent step that ends a recorded step carries its real usage in
//!   `metrics` (`prompt_tokens` = input + cache read + cache write,
//!   `cached_tokens` = cache read, cost from the price table) with the cache
//!   write in `metrics.extra.cache_write_tokens`.
//! - What the provider billed beyond a step's window (server-side
//!   compaction) is in its metrics too (`extra.beyond_window`), its
//!   reasoning tokens in `extra.reasoning_tokens`, and what it did to the
//!   context on its own (applied context edits, compactions) in
//!   `extra.context_management` of the agent step.
//! - Each tideline cut is a `system` step with `extra.context_management`,
//!   placed before the agent step of the request it happened on.
//!
//! Settles the store first.

use crate::export::ExportError;
use crate::model::{Row, RowKind};
use crate::parts::{self, Part};
use crate::store::{LedgerStore, StoreError};
use crate::transcript::utc_iso;
use oceancode_config::Price;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::Write;

/// The ATIF schema tag written.
pub const SCHEMA_VERSION: &str = "ATIF-v1.8";

struct Step {
    source: &'static str,
    message: String,
    reasoning: Vec<String>,
    calls: Vec<Value>,
    results: Vec<Value>,
    /// The request/response step of the agent's rows.
    llm_step: Option<u32>,
    seqs: Vec<u64>,
    turn: u32,
    extra: Map<String, Value>,
    metrics: Option<Value>,
    model: Option<String>,
    ts_ms: Option<i64>,
}

impl Step {
    fn new(source: &'static str, row: &Row) -> Step {
        Step {
            source,
            message: String::new(),
            reasoning: Vec::new(),
            calls: Vec::new(),
            results: Vec::new(),
            llm_step: None,
            seqs: vec![row.seq],
            turn: row.turn,
            extra: Map::new(),
            metrics: None,
            model: None,
            ts_ms: None,
        }
    }

    /// A proxy-made step (a cut, a context edit) at `ts_ms`.
    fn system(message: String, extra: Map<String, Value>, ts_ms: i64) -> Step {
        Step {
            source: "system",
            message,
            reasoning: Vec::new(),
            calls: Vec::new(),
            results: Vec::new(),
            llm_step: None,
            seqs: Vec::new(),
            turn: 0,
            extra,
            metrics: None,
            model: None,
            ts_ms: Some(ts_ms),
        }
    }

    fn push_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if !self.message.is_empty() {
            self.message.push_str("\n\n");
        }
        self.message.push_str(text);
    }

    fn into_json(self, id: usize) -> Value {
        let mut o = Map::new();
        o.insert("step_id".into(), json!(id));
        if let Some(ts) = self.ts_ms {
            o.insert("timestamp".into(), json!(utc_iso(ts)));
        }
        o.insert("source".into(), json!(self.source));
        if let Some(m) = self.model {
            o.insert("model_name".into(), json!(m));
        }
        o.insert("message".into(), json!(self.message));
        let reasoning: Vec<String> = self
            .reasoning
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect();
        if !reasoning.is_empty() {
            o.insert("reasoning_content".into(), json!(reasoning.join("\n\n")));
        }
        if !self.calls.is_empty() {
            o.insert("tool_calls".into(), Value::Array(self.calls));
        }
        if !self.results.is_empty() {
            o.insert("observation".into(), json!({ "results": self.results }));
        }
        if let Some(m) = self.metrics {
            o.insert("metrics".into(), m);
        }
        let mut extra = self.extra;
        if !self.seqs.is_empty() {
            extra.insert("seqs".into(), json!(self.seqs));
            extra.insert("turn".into(), json!(self.turn));
        }
        if !extra.is_empty() {
            o.insert("extra".into(), Value::Object(extra));
        }
        Value::Object(o)
    }
}

/// Build the trajectory of `session` as JSON.
pub fn trajectory(
    store: &dyn LedgerStore,
    session: &str,
    pricer: &dyn Fn(&str) -> Option<Price>,
) -> Result<Value, ExportError> {
    store.settle_blocking()?;
    let meta = store
        .session_meta(session)?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let dialect = meta.dialect;
    let all = store.session_rows(session, true)?;
    let hidden_rows = all.iter().filter(|(_, h)| *h).count();
    let records = store.steps(session)?;
    let cuts = store.cuts(session)?;
    let edits = store.context_edits(session)?;

    let mut steps: Vec<Step> = Vec::new();
    // Tool call id → index of the agent step that made it.
    let mut owner: HashMap<String, usize> = HashMap::new();
    for (row, hidden) in &all {
        if *hidden {
            continue;
        }
        let ps = parts::parts(dialect, &row.raw);
        match row.kind {
            RowKind::Assistant => {
                let same = matches!(steps.last(), Some(s) if s.source == "agent"
                    && s.llm_step == Some(row.step) && s.results.is_empty());
                if !same {
                    let mut s = Step::new("agent", row);
                    s.llm_step = Some(row.step);
                    steps.push(s);
                }
                let idx = steps.len() - 1;
                let s = &mut steps[idx];
                if same {
                    s.seqs.push(row.seq);
                }
                for (i, p) in ps.into_iter().enumerate() {
                    match p {
                        Part::Text(t) | Part::Media(t) => s.push_text(&t),
                        Part::Thinking(t) => s.reasoning.push(t),
                        Part::ToolCall { id, name, input } => {
                            let id = id.unwrap_or_else(|| format!("seq{}-{i}", row.seq));
                            let arguments = match input {
                                Value::Object(o) => Value::Object(o),
                                Value::Null => json!({}),
                                other => json!({ "input": other }),
                            };
                            owner.insert(id.clone(), idx);
                            s.calls.push(json!({
                                "tool_call_id": id,
                                "function_name": name,
                                "arguments": arguments,
                            }));
                        }
                        Part::ToolResult { id, is_error, text } => {
                            s.results.push(result(None, id, is_error, text));
                        }
                        Part::Other(o) => s.push_text(&o),
                    }
                }
            }
            RowKind::System => {
                let mut s = Step::new("system", row);
                s.push_text(&parts::plain_text(dialect, &row.raw));
                steps.push(s);
            }
            RowKind::Prompt | RowKind::ToolResult | RowKind::Other => {
                let mut user: Option<Step> = None;
                for p in ps {
                    match p {
                        Part::ToolResult { id, is_error, text } => {
                            let target = id.as_ref().and_then(|i| owner.get(i).copied());
                            match target {
                                Some(t) => {
                                    steps[t].results.push(result(id, None, is_error, text));
                                    if !steps[t].seqs.contains(&row.seq) {
                                        steps[t].seqs.push(row.seq);
                                    }
                                }
                                None => {
                                    // A result whose call is not on the line:
                                    // a system event with the call id in `extra`.
                                    let mut s = Step::new("system", row);
                                    s.results.push(result(None, id, is_error, text));
                                    steps.push(s);
                                }
                            }
                        }
                        Part::Text(t) | Part::Media(t) | Part::Other(t) => user
                            .get_or_insert_with(|| Step::new("user", row))
                            .push_text(&t),
                        Part::Thinking(t) => user
                            .get_or_insert_with(|| Step::new("user", row))
                            .push_text(&t),
                        Part::ToolCall { name, input, .. } => user
                            .get_or_insert_with(|| Step::new("user", row))
                            .push_text(&format!("{name} {input}")),
                    }
                }
                if let Some(mut u) = user {
                    if row.kind == RowKind::Other {
                        u.source = "system";
                        u.extra.insert("row_kind".into(), json!("other"));
                    }
                    steps.push(u);
                }
            }
        }
    }

    // Usage: each recorded step's metrics go to the last agent step it produced.
    let mut last_agent: HashMap<u32, usize> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        if let Some(k) = s.llm_step {
            last_agent.insert(k, i);
        }
    }
    let mut total_cost = 0.0;
    let mut all_priced = true;
    let (mut prompt, mut completion, mut cached, mut cache_write) = (0u64, 0u64, 0u64, 0u64);
    for rec in &records {
        let u = crate::status::billed(rec.usage, &rec.detail);
        prompt += u.input_total();
        completion += u.output;
        cached += u.cache_read;
        cache_write += u.cache_write;
        let cost =
            pricer(&rec.model).map(|p| p.cost_usd(u.input, u.output, u.cache_read, u.cache_write));
        match cost {
            Some(c) => total_cost += c,
            None if u.window_total() > 0 => all_priced = false,
            None => {}
        }
        let Some(&i) = last_agent.get(&rec.step) else {
            continue;
        };
        let mut m = json!({
            "prompt_tokens": u.input_total(),
            "completion_tokens": u.output,
            "cached_tokens": u.cache_read,
            "extra": {
                "cache_write_tokens": u.cache_write,
                "cache_read_tokens": u.cache_read,
                "uncached_input_tokens": u.input,
                "http_status": rec.status,
                "window_rows": rec.window_rows,
                "step": rec.step,
            }
        });
        if let Some(c) = cost {
            m["cost_usd"] = json!(c);
        }
        if let Some(e) = &rec.error {
            m["extra"]["error"] = json!(e);
        }
        let d = &rec.detail;
        if !d.extra.is_zero() {
            m["extra"]["beyond_window"] = json!({
                "uncached_input_tokens": d.extra.input,
                "cache_read_tokens": d.extra.cache_read,
                "cache_write_tokens": d.extra.cache_write,
                "completion_tokens": d.extra.output,
            });
        }
        if d.reasoning > 0 {
            m["extra"]["reasoning_tokens"] = json!(d.reasoning);
        }
        if let Some(c) = &d.compress {
            m["extra"]["compress"] = json!({
                "pointers": c.outputs,
                "pointer_tokens": c.tokens,
                "saved_tokens": c.saved,
            });
        }
        let s = &mut steps[i];
        if d.compactions > 0 || !d.edits.is_empty() {
            let mut cm = json!({ "type": "provider" });
            if d.compactions > 0 {
                cm["compactions"] = json!(d.compactions);
            }
            if !d.edits.is_empty() {
                cm["applied_edits"] = json!(d.edits);
            }
            s.extra.insert("context_management".into(), cm);
        }
        if !d.recalls.is_empty() {
            // The in-band recall tool's calls, answered by the proxy: the
            // client never saw them, so they are no tool call of the step's.
            let calls: Vec<Value> = d
                .recalls
                .iter()
                .map(|r| {
                    json!({
                        "tool_call_id": r.call_id,
                        "function_name": "oceancode_recall",
                        "arguments": serde_json::from_str::<Value>(&r.input).unwrap_or(Value::String(r.input.clone())),
                        "round": r.round,
                        "result_chars": r.result_chars,
                        "continued": r.continued,
                    })
                })
                .collect();
            s.extra
                .insert("oceancode_internal".into(), Value::Array(calls));
        }
        s.metrics = Some(m);
        s.model = Some(rec.model.clone());
        s.ts_ms = Some(rec.ts_ms);
    }

    // Rows whose tool output ledger.compress sent as a pointer: the steps
    // holding them say so (their observation is the original).
    let mut pruned: HashMap<u64, u32> = HashMap::new();
    for rec in &records {
        for &seq in rec.detail.compress.iter().flat_map(|c| c.rows.iter()) {
            pruned.entry(seq).or_insert(rec.step);
        }
    }
    if !pruned.is_empty() {
        for s in &mut steps {
            let mut marked: Vec<Value> = s
                .seqs
                .iter()
                .filter_map(|q| {
                    pruned
                        .get(q)
                        .map(|step| json!({"seq": q, "from_step": step}))
                })
                .collect();
            if !marked.is_empty() {
                marked.sort_by_key(|v| v["seq"].as_u64());
                s.extra
                    .insert("compress_pruned".into(), Value::Array(marked));
            }
        }
    }

    // Cuts go before the first agent step whose response came after them.
    let dir = store.data_dir().session_dir(session);
    let agent_times: Vec<(usize, i64)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.ts_ms.filter(|_| s.source == "agent").map(|t| (i, t)))
        .collect();
    // The index of the first agent step at or after `ts` (the end if none).
    let before = |ts: i64| {
        agent_times
            .iter()
            .find(|(_, t)| *t >= ts)
            .map_or(steps.len(), |(i, _)| *i)
    };
    let mut inserts: Vec<(usize, Step)> = Vec::new();
    // The notes each edit leaves in force (`id`, `after`, `text` of its set).
    let notes_of = |set: &str| -> Vec<Value> {
        let v: Value = serde_json::from_str(set).unwrap_or_default();
        v["notes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| json!({"id": n["id"], "after": n["after"], "text": n["text"]}))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut prev_notes: Vec<Value> = Vec::new();
    for e in &edits {
        let at = before(e.ts_ms);
        let notes = notes_of(&e.set);
        let mut extra = Map::new();
        extra.insert(
            "context_management".into(),
            json!({
                "type": "edit",
                "edit": e.n,
                "seqs": e.seqs,
                "tokens_before": e.tokens_before,
                "tokens_after": e.tokens_after,
                "notes": notes,
            }),
        );
        let mut message = format!(
            "Context edit {}: the agent edited its context (context.txt); seq {} changed in every later request (tokens {} → {}). The ledger keeps every original.",
            e.n,
            e.seqs.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
            e.tokens_before,
            e.tokens_after
        );
        // Notes this edit wrote (new, or with new text), as the agent wrote them.
        for n in notes.iter().filter(|n| !prev_notes.contains(n)) {
            message.push_str(&format!(
                "\nNote {} (after seq {}): {}",
                n["id"],
                n["after"],
                n["text"].as_str().unwrap_or_default()
            ));
        }
        prev_notes = notes;
        inserts.push((at, Step::system(message, extra, e.ts_ms)));
    }
    for c in &cuts {
        let at = before(c.ts_ms);
        let mut extra = Map::new();
        extra.insert(
            "context_management".into(),
            json!({
                "type": "tideline_cut",
                "upto_seq": c.upto_seq,
                "gauge_tokens": c.gauge,
                "line_tokens": c.line,
                "transcript_dir": dir.join("transcript").display().to_string(),
                "session_md": dir.join("SESSION.md").display().to_string(),
            }),
        );
        let message = format!(
            "Tideline cut: every row up to seq {} left the context window, except system messages and the ask of a turn cut midway, which stay (gauge {} ≥ line {}). The verbatim record stays in the ledger.",
            c.upto_seq, c.gauge, c.line
        );
        inserts.push((at, Step::system(message, extra, c.ts_ms)));
    }
    // A failed step (no answer, so no agent step of its own) is a system
    // step where its answer would have been.
    for rec in records.iter().filter(|r| r.error.is_some()) {
        if last_agent.contains_key(&rec.step) {
            continue;
        }
        let at = agent_times
            .iter()
            .find(|(_, t)| *t >= rec.ts_ms)
            .map_or(steps.len(), |(i, _)| *i);
        let error = rec.error.clone().unwrap_or_default();
        let mut extra = Map::new();
        extra.insert(
            "failed_step".into(),
            json!({"step": rec.step, "http_status": rec.status, "error": error}),
        );
        inserts.push((
            at,
            Step {
                source: "system",
                message: format!(
                    "Step {} failed: HTTP {} ({error}); the model's answer is missing.",
                    rec.step, rec.status
                ),
                reasoning: Vec::new(),
                calls: Vec::new(),
                results: Vec::new(),
                llm_step: None,
                seqs: Vec::new(),
                turn: 0,
                extra,
                metrics: None,
                model: None,
                ts_ms: Some(rec.ts_ms),
            },
        ));
    }
    inserts.sort_by_key(|(at, s)| (*at, s.ts_ms));
    let mut ordered: Vec<Step> = Vec::with_capacity(steps.len() + inserts.len());
    let mut inserts = inserts.into_iter().peekable();
    for (i, s) in steps.into_iter().enumerate() {
        while let Some((_, cut)) = inserts.next_if(|(at, _)| *at <= i) {
            ordered.push(cut);
        }
        ordered.push(s);
    }
    ordered.extend(inserts.map(|(_, s)| s));

    let n = ordered.len();
    let steps_json: Vec<Value> = ordered
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.into_json(i + 1))
        .collect();
    let mut final_metrics = json!({
        "total_prompt_tokens": prompt,
        "total_completion_tokens": completion,
        "total_cached_tokens": cached,
        "total_steps": n,
        "extra": {
            "total_cache_write_tokens": cache_write,
            "llm_requests": records.len(),
            "tideline_cuts": cuts.len(),
        }
    });
    if all_priced {
        final_metrics["total_cost_usd"] = json!(total_cost);
    }
    // The same requests unmanaged (no cuts, the client's own cache
    // pattern): an estimate from the ledger.
    if let Some(u) = crate::status::unmanaged(&records, &cuts, pricer) {
        final_metrics["extra"]["unmanaged_cost_usd_estimate"] = json!(u.cost_usd);
    }
    let mut agent_extra = json!({
        "recorded_by": format!("oceancode-proxy {}", env!("CARGO_PKG_VERSION")),
        "dialect": dialect.as_str(),
    });
    if let Some(cs) = &meta.client_session {
        agent_extra["client_session"] = json!(cs);
    }
    let mut root_extra =
        json!({ "ledger_dir": dir.display().to_string(), "hidden_rows": hidden_rows });
    if let Some(p) = &meta.parent {
        root_extra["parent_session"] = json!(p);
    }
    if let Some(s) = meta.parent_seq {
        root_extra["parent_seq"] = json!(s);
    }
    Ok(json!({
        "schema_version": SCHEMA_VERSION,
        "session_id": meta.id,
        "trajectory_id": meta.id,
        "agent": {
            "name": meta.client,
            "version": "unknown",
            "model_name": meta.model,
            "extra": agent_extra,
        },
        "steps": steps_json,
        "notes": "Recorded by oceancode-proxy from the provider traffic (the agent's version is not known to the proxy). Tideline cuts are system steps with extra.context_management; rows hidden by rewinds are left out (extra.hidden_rows).",
        "final_metrics": final_metrics,
        "extra": root_extra,
    }))
}

fn result(source: Option<String>, call_id: Option<String>, is_error: bool, text: String) -> Value {
    let mut o = Map::new();
    if let Some(s) = source {
        o.insert("source_call_id".into(), json!(s));
    }
    o.insert("content".into(), json!(text));
    let mut extra = Map::new();
    if let Some(c) = call_id {
        extra.insert("call_id".into(), json!(c));
    }
    if is_error {
        extra.insert("is_error".into(), json!(true));
    }
    if !extra.is_empty() {
        o.insert("extra".into(), Value::Object(extra));
    }
    Value::Object(o)
}

/// Write the ATIF export of `session` (pretty JSON, newline-terminated).
pub fn write(
    store: &dyn LedgerStore,
    session: &str,
    pricer: &dyn Fn(&str) -> Option<Price>,
    out: &mut dyn Write,
) -> Result<(), ExportError> {
    let v = trajectory(store, session, pricer)?;
    let mut w = std::io::BufWriter::new(out);
    serde_json::to_writer_pretty(&mut w, &v)?;
    w.write_all(b"\n")?;
    w.flush()?;
    Ok(())
}
