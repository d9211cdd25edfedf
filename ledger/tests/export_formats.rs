//! `export --md` and `export --atif` (validated with the PyPI `atif`
//! package when python3 has it), plus the 10,000-row timing run (ignored).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_config::Price;
use oceancode_ledger::store::{LedgerRead, LedgerStore, LedgerWrite};
use oceancode_ledger::{atif, export};
use oceancode_testkit::ledger::*;
use serde_json::{json, Value};
use std::process::Command;
use std::time::Instant;

fn price(model: &str) -> Option<Price> {
    oceancode_config::lookup(model).and_then(|i| i.price)
}

fn md(store: &oceancode_ledger::store::Store, id: &str) -> String {
    let mut out = Vec::new();
    export::markdown(store, id, &price, &mut out, None).expect("export md");
    String::from_utf8(out).expect("utf-8")
}

fn atif_json(store: &oceancode_ledger::store::Store, id: &str) -> Value {
    let mut out = Vec::new();
    atif::write(store, id, &price, &mut out).expect("export atif");
    serde_json::from_slice(&out).expect("json")
}

/// Validate with `atif.Trajectory`; None when python3 or the package is missing.
fn validate_atif(v: &Value) -> Option<Result<String, String>> {
    let probe = Command::new("python3").args(["-c", "import atif"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!(
                "SKIPPED: ATIF validation needs python3 with the `atif` package \
                 (python3 -m pip install 'atif==1.8.0')"
            );
            return None;
        }
    }
    let tmp = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(tmp.path(), serde_json::to_vec(v).expect("encode")).expect("write");
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys\nfrom atif import Trajectory\nt = Trajectory.model_validate(json.load(open(sys.argv[1])))\nprint(t.schema_version, len(t.steps))",
        ])
        .arg(tmp.path())
        .output()
        .expect("python3");
    Some(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    })
}

#[test]
fn export_markdown_has_frontmatter_turns_and_summary() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-md");
    let doc = md(&store, &s.id);
    assert!(doc.starts_with("---\nsession: \"sess-md\"\nclient: \"claude-code\"\n"));
    assert!(doc.contains("\nturns: 5\n"));
    assert!(doc.contains("\nhidden_rows: 2\n"));
    assert!(doc.contains("\ncuts: 2\n"));
    assert!(doc.contains("\ncost_usd: 0."));
    assert!(doc.contains("\n---\n\n# Session sess-md\n"));
    // Every turn, as the transcript files hold it.
    let dir = store.data_dir();
    for t in 1..=5 {
        let file = std::fs::read_to_string(dir.turn_file(&s.id, t)).expect("turn file");
        assert!(doc.contains(&file), "turn {t} missing");
    }
    assert!(doc.contains("\n## Summary\n\n| Turn | Seq | Rows | Steps | Tool calls | Tokens | Past tideline | First line |\n"));
    assert!(doc.contains("| 1 | 1–7 | 7 | 2 | 2 |"));
    assert!(doc.contains("| claude-opus-5-5 | 9 |"));
    // Built from the database when the files are gone: same document.
    std::fs::remove_dir_all(store.session_dir(&s.id)).expect("rm");
    assert_eq!(md(&store, &s.id), doc);
}

#[test]
fn export_atif_is_valid_v1_8() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-atif");
    let v = atif_json(&store, &s.id);
    assert_eq!(v["schema_version"], "ATIF-v1.8");
    assert_eq!(v["session_id"], "sess-atif");
    let steps = v["steps"].as_array().expect("steps");
    for (i, st) in steps.iter().enumerate() {
        assert_eq!(st["step_id"], json!(i + 1));
    }
    // Cuts are system steps with extra.context_management.
    let cuts: Vec<&Value> = steps
        .iter()
        .filter(|s| s["extra"]["context_management"].is_object())
        .collect();
    assert_eq!(cuts.len(), 2);
    assert_eq!(cuts[0]["source"], "system");
    assert_eq!(cuts[0]["extra"]["context_management"]["upto_seq"], 17);
    // Token metrics per agent step, cache write in metrics.extra.
    let agents: Vec<&Value> = steps.iter().filter(|s| s["source"] == "agent").collect();
    let with_metrics = agents.iter().filter(|s| s["metrics"].is_object()).count();
    // One per recorded step whose answer is on the line (step 5's was rewound).
    assert_eq!(with_metrics, 8);
    let first = agents
        .iter()
        .find(|s| s["metrics"].is_object())
        .expect("metrics");
    assert_eq!(first["metrics"]["prompt_tokens"], 6_000);
    assert_eq!(first["metrics"]["cached_tokens"], 0);
    assert_eq!(first["metrics"]["extra"]["cache_write_tokens"], 5_000);
    assert!(first["metrics"]["cost_usd"].as_f64().expect("cost") > 0.0);
    assert_eq!(first["model_name"], "claude-opus-5-5");
    assert_eq!(agents[0]["tool_calls"][0]["function_name"], "TodoWrite");
    assert_eq!(agents[0]["reasoning_content"], "consider it");
    assert_eq!(
        agents[0]["observation"]["results"][0]["source_call_id"],
        agents[0]["tool_calls"][0]["tool_call_id"]
    );
    // The cut before the response of the request it happened on.
    let cut_at = steps
        .iter()
        .position(|s| s["extra"]["context_management"].is_object())
        .expect("cut");
    assert_eq!(steps[cut_at + 1]["source"], "agent");
    assert!(
        v["final_metrics"]["total_cost_usd"]
            .as_f64()
            .expect("total")
            > 0.0
    );
    assert_eq!(
        v["final_metrics"]["extra"]["total_cache_write_tokens"],
        6_800
    );
    // The rewound Write is not on the line.
    assert!(!v.to_string().contains("CHANGELOG.md"));
    match validate_atif(&v) {
        None => {}
        Some(Ok(out)) => assert_eq!(out, format!("ATIF-v1.8 {}", steps.len())),
        Some(Err(e)) => panic!("atif validation failed:\n{e}"),
    }
}

#[test]
fn export_atif_openai_shapes_validate() {
    use oceancode_window::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let id = "sess-responses";
    store
        .submit(Event::Session(SessionMeta {
            id: id.into(),
            client: "codex".into(),
            client_session: None,
            dialect: Dialect::OpenaiResponses,
            model: "gpt-5.2-codex".into(),
            parent: None,
            parent_seq: None,
            created_ms: T0,
            last_ms: T0,
        }))
        .expect("session");
    let raws = [
        (
            RowKind::System,
            r#"{"type":"message","role":"developer","content":[{"type":"input_text","text":"be precise"}]}"#,
        ),
        (
            RowKind::Prompt,
            r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"list the files"}]}"#,
        ),
        (
            RowKind::Assistant,
            r#"{"type":"reasoning","summary":[{"type":"summary_text","text":"use ls"}]}"#,
        ),
        (
            RowKind::Assistant,
            r#"{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"ls\"}","call_id":"call_1"}"#,
        ),
        (
            RowKind::Assistant,
            r#"{"type":"custom_tool_call","name":"apply_patch","input":"*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch","call_id":"call_2"}"#,
        ),
        (
            RowKind::ToolResult,
            r#"{"type":"function_call_output","call_id":"call_1","output":"Process exited with code 0\na.txt"}"#,
        ),
        (
            RowKind::ToolResult,
            r#"{"type":"custom_tool_call_output","call_id":"call_2","output":"Done"}"#,
        ),
        (
            RowKind::ToolResult,
            r#"{"type":"function_call_output","call_id":"call_unknown","output":"orphan"}"#,
        ),
        (
            RowKind::Assistant,
            r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a.txt"}]}"#,
        ),
    ];
    let rows: Vec<Row> = raws
        .iter()
        .enumerate()
        .map(|(i, (kind, raw))| Row {
            seq: i as u64 + 1,
            role: "x".into(),
            kind: *kind,
            raw: (*raw).into(),
            tokens: 10,
            turn: 1,
            step: if i < 5 { 1 } else { 2 },
            branch: 0,
            from_response: false,
        })
        .collect();
    store
        .submit(Event::Rows {
            session: id.into(),
            rows,
        })
        .expect("rows");
    for step in 1..=2 {
        store
            .submit(Event::Step {
                session: id.into(),
                step,
                model: "gpt-5.2-codex".into(),
                status: 200,
                usage: Usage {
                    input: 100,
                    output: 20,
                    cache_read: 50,
                    cache_write: 0,
                },
                window_rows: 9,
                ts_ms: T0 + i64::from(step),
                error: None,
                detail: Default::default(),
            })
            .expect("step");
    }
    let v = atif_json(&store, id);
    let steps = v["steps"].as_array().expect("steps");
    let agent = steps
        .iter()
        .find(|s| s["source"] == "agent")
        .expect("agent");
    assert_eq!(agent["tool_calls"][0]["arguments"], json!({"cmd": "ls"}));
    assert_eq!(
        agent["tool_calls"][1]["arguments"]["input"]
            .as_str()
            .map(|s| s.starts_with("*** Begin")),
        Some(true)
    );
    assert_eq!(agent["reasoning_content"], "use ls");
    assert_eq!(
        agent["observation"]["results"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(v.to_string().contains("call_unknown"));
    match validate_atif(&v) {
        None => {}
        Some(Ok(_)) => {}
        Some(Err(e)) => panic!("atif validation failed:\n{e}"),
    }
}

/// `cargo test --release -p oceancode-ledger --test export_formats -- --ignored --nocapture`
#[test]
#[ignore]
fn export_timing_10k_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut s = Sim::new(&store, "sess-10k", T0);
    let started = Instant::now();
    let mut t = 0u32;
    while s.seq < 10_000 {
        t += 1;
        s.prompt(&format!(
            "turn {t}: continue with the next part of the refactor"
        ));
        for k in 0..4 {
            let id = format!("c{t}-{k}");
            s.call(
                &id,
                "Bash",
                json!({"command": format!("cargo test -p crate{k}")}),
            );
            s.result(
                &id,
                &"test result: ok. 42 passed; 0 failed\n".repeat(20),
                false,
            );
        }
        s.say("Done with this part; moving on.");
        s.end_step(500, 400, 80_000, 2_000);
        if t.checked_rem(10) == Some(0) {
            s.cut(s.seq - 12);
        }
    }
    s.settle();
    let live = started.elapsed();
    let dir = store.session_dir(&s.id);
    let before = snapshot(&dir);

    let t0 = Instant::now();
    let mut out = Vec::new();
    export::markdown(&store, &s.id, &price, &mut out, None).expect("md");
    let md_time = t0.elapsed();
    let md_len = out.len();

    let t0 = Instant::now();
    let mut out = Vec::new();
    atif::write(&store, &s.id, &price, &mut out).expect("atif");
    let atif_time = t0.elapsed();
    let atif_len = out.len();

    std::fs::remove_dir_all(&dir).expect("rm");
    let t0 = Instant::now();
    let report = store.rebuild(&s.id, None).expect("rebuild");
    let rebuild_time = t0.elapsed();
    assert_eq!(snapshot(&dir), before, "rebuild is byte-identical");

    println!(
        "10k-row session: {} rows, {} turns; live write {:?}; export --md {:?} ({} bytes); \
         export --atif {:?} ({} bytes); rebuild {:?} ({} turn files)",
        s.seq, t, live, md_time, md_len, atif_time, atif_len, rebuild_time, report.turns
    );
}

#[test]
fn a_failed_step_is_marked_in_both_exports() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut s = Sim::new(&store, "sess-failed", T0);
    s.prompt("build it");
    s.fail_step(502, "upstream_unreachable");
    s.say("built");
    s.end_step(1_000, 50, 0, 0);
    s.settle();
    let doc = md(&store, &s.id);
    assert!(
        doc.contains("| Step | Status | Error | Time |"),
        "a failed-steps table: {doc}"
    );
    assert!(doc.contains("| 1 | 502 | upstream_unreachable |"), "{doc}");
    let v = atif_json(&store, &s.id);
    let steps = v["steps"].as_array().expect("steps");
    let failed: Vec<&Value> = steps
        .iter()
        .filter(|s| s["extra"]["failed_step"].is_object())
        .collect();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["source"], "system");
    assert_eq!(failed[0]["extra"]["failed_step"]["http_status"], 502);
    assert_eq!(
        failed[0]["extra"]["failed_step"]["error"],
        "upstream_unreachable"
    );
    // Where its answer would have been: after the ask, before the answer
    // of the step that followed.
    let at = steps
        .iter()
        .position(|s| s["extra"]["failed_step"].is_object())
        .unwrap();
    assert_eq!(steps[at - 1]["source"], "user");
    assert_eq!(steps[at + 1]["source"], "agent");
    match validate_atif(&v) {
        None => {}
        Some(Ok(out)) => assert_eq!(out, format!("ATIF-v1.8 {}", steps.len())),
        Some(Err(e)) => panic!("atif validation failed:\n{e}"),
    }
}
