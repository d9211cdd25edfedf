//! `setup claude-code [--project | --user] [--dry-run] [--remove]`: put the
//! meter and the steering commands inside Claude Code. It adds to the
//! settings file the `statusLine` (`oceancode-proxy statusline`) and the
//! data dir under `permissions.additionalDirectories` (the stub and the
//! pointers name transcript files there: read without asking), and writes
//! the `/oc-…` custom commands (`commands/oc-*.md`, each running the CLI for
//! `${CLAUDE_SESSION_ID}`). The edit keeps every other key and their order,
//! prints a diff, is idempotent, and backs up the file it changes; what it
//! added is noted in `oceancode-setup.json` beside it, so `--remove` takes
//! out only that, and restores the file byte for byte when nothing else
//! changed it since. Codex and opencode have no comparable hook in the
//! pinned versions (see docs/clients/).

use super::out::outln;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indexmap::IndexMap;
use oceancode_config::Config;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// `setup`'s clients.
#[derive(Subcommand, Debug)]
pub enum SetupCmd {
    /// Claude Code: status line, `/oc-…` commands, the data dir readable.
    ClaudeCode(ClaudeCodeArgs),
}

/// `setup claude-code`'s flags.
#[derive(Args, Debug)]
pub struct ClaudeCodeArgs {
    /// This project's `.claude/settings.local.json` (personal, not
    /// committed) and `.claude/commands/`.
    #[arg(long, conflicts_with = "user")]
    project: bool,
    /// The user's `~/.claude/settings.json` (or `$CLAUDE_CONFIG_DIR`) and
    /// commands: every project (the default).
    #[arg(long)]
    user: bool,
    /// Show the diff, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take out what an earlier `setup` added (only that).
    #[arg(long)]
    remove: bool,
}

/// The note of what `setup` added, beside the settings file.
const NOTE: &str = "oceancode-setup.json";

/// `setup`.
pub fn run(dir: &Path, _cfg: &Config, cmd: &SetupCmd) -> Result<i32> {
    let SetupCmd::ClaudeCode(a) = cmd;
    let claude = if a.project {
        std::env::current_dir()
            .context("no working directory")?
            .join(".claude")
    } else {
        claude_user_dir()?
    };
    let file = if a.project {
        "settings.local.json"
    } else {
        "settings.json"
    };
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_string))
        .unwrap_or_else(|| "oceancode-proxy".into());
    let target = Target {
        settings: claude.join(file),
        commands: claude.join("commands"),
        note: claude.join(NOTE),
        exe,
        data_dir: std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()),
    };
    let plan = if a.remove {
        target.removal()?
    } else {
        target.install()?
    };
    for line in &plan.report {
        outln!("{line}");
    }
    if plan.is_empty() {
        outln!("nothing to change in {}", target.settings.display());
        return Ok(0);
    }
    if a.dry_run {
        outln!("(dry run: nothing written)");
        return Ok(0);
    }
    plan.apply()?;
    Ok(0)
}

/// `$CLAUDE_CONFIG_DIR`, else `~/.claude`.
fn claude_user_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("CLAUDE_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".claude")),
        None => bail!("HOME is not set: give --project, or set CLAUDE_CONFIG_DIR"),
    }
}

/// Where `setup` writes, and what it names.
pub struct Target {
    /// The settings file.
    pub settings: PathBuf,
    /// The custom commands' directory.
    pub commands: PathBuf,
    /// The note of what was added.
    pub note: PathBuf,
    /// The `oceancode-proxy` the commands run.
    pub exe: String,
    /// The data dir (absolute).
    pub data_dir: PathBuf,
}

/// The files to write (None: delete), and what to tell.
#[derive(Default)]
pub struct Plan {
    writes: Vec<(PathBuf, Option<Vec<u8>>)>,
    report: Vec<String>,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Write (or delete) the files; a settings file is replaced through a
    /// temporary file beside it.
    fn apply(&self) -> Result<()> {
        for (path, bytes) in &self.writes {
            match bytes {
                Some(b) => {
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent)
                            .with_context(|| format!("cannot create {}", parent.display()))?;
                    }
                    let tmp = path.with_extension("oceancode-tmp");
                    std::fs::write(&tmp, b)
                        .with_context(|| format!("cannot write {}", tmp.display()))?;
                    std::fs::rename(&tmp, path)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
                None => match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(e).with_context(|| format!("cannot remove {}", path.display()))
                    }
                },
            }
        }
        Ok(())
    }
}

/// The `/oc-…` commands: name, description, argument hint, CLI words.
const COMMANDS: &[(&str, &str, &str, &str)] = &[
    (
        "oc-status",
        "oceancode: this session's meter (window, line, cuts, cache, spend)",
        "",
        "status ${CLAUDE_SESSION_ID}",
    ),
    (
        "oc-tideline",
        "oceancode: show or move this session's tideline",
        "[50% | 500k | now | default]",
        "tideline --session ${CLAUDE_SESSION_ID} $ARGUMENTS",
    ),
    (
        "oc-evict",
        "oceancode: cut this session's window now",
        "[PERCENT | through TURN]",
        "evict ${CLAUDE_SESSION_ID} $ARGUMENTS",
    ),
    (
        "oc-context",
        "oceancode: export or edit this session's window (context.txt)",
        "[--drop SPANS] [--note TEXT] [--receipt]",
        "context ${CLAUDE_SESSION_ID} $ARGUMENTS",
    ),
    (
        "oc-recall",
        "oceancode: read back this session's verbatim record",
        "[--match TEXT] [--limit N]",
        "recall $ARGUMENTS ${CLAUDE_SESSION_ID}",
    ),
];

/// A shell word, single-quoted when it needs quoting.
fn sh(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:=@%".contains(&b))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

impl Target {
    /// `oceancode-proxy --data-dir DIR` as a shell command prefix.
    fn cli(&self) -> String {
        format!(
            "{} --data-dir {}",
            sh(&self.exe),
            sh(&self.data_dir.to_string_lossy())
        )
    }

    /// The `statusLine` value.
    fn status_line(&self) -> Value {
        json!({"type": "command", "command": format!("{} statusline", self.cli()), "padding": 0})
    }

    /// A command file's text.
    fn command_file(&self, desc: &str, hint: &str, words: &str) -> String {
        let hint = if hint.is_empty() {
            String::new()
        } else {
            format!("argument-hint: {hint}\n")
        };
        format!(
            "---\ndescription: {desc}\n{hint}allowed-tools: Bash({}:*)\n---\n!`{} {words}`\n\nShow the output above to the user as it is, and do nothing else.\n",
            sh(&self.exe),
            self.cli()
        )
    }

    /// The plan of an install (empty when everything is in place).
    pub fn install(&self) -> Result<Plan> {
        let mut plan = Plan::default();
        let before = read_opt(&self.settings)?;
        let note_before = read_opt(&self.note)?;
        let mut note: Value = match &note_before {
            Some(b) => serde_json::from_slice(b).unwrap_or_else(|_| json!({})),
            None => json!({}),
        };
        let text = match &before {
            Some(b) => String::from_utf8(b.clone())
                .with_context(|| format!("{} is not UTF-8", self.settings.display()))?,
            None => String::new(),
        };
        let mut top = parse_object(&text, &self.settings)?;
        let mut changed = false;
        // The status line.
        let ours = self.status_line();
        let current = top.get("statusLine").map(|r| parse_value(r.get()));
        if current.as_ref() != Some(&ours) {
            if let Some(old) = current {
                if note.get("replaced_status_line").is_none() {
                    note["replaced_status_line"] = old;
                }
            }
            top.insert("statusLine".into(), raw(&ours, 1)?);
            note["status_line"] = ours.clone();
            changed = true;
        }
        // The data dir, readable without asking.
        let dir = Value::String(self.data_dir.to_string_lossy().into_owned());
        let mut perms: IndexMap<String, Value> = match top.get("permissions") {
            Some(r) => serde_json::from_str(r.get()).with_context(|| {
                format!("{}: permissions is not an object", self.settings.display())
            })?,
            None => IndexMap::new(),
        };
        let dirs = perms
            .entry("additionalDirectories".to_string())
            .or_insert_with(|| json!([]));
        let Some(list) = dirs.as_array_mut() else {
            bail!(
                "{}: permissions.additionalDirectories is not a list",
                self.settings.display()
            );
        };
        if !list.contains(&dir) {
            list.push(dir.clone());
            note["additional_directory"] = dir;
            top.insert("permissions".into(), raw(&perms, 1)?);
            changed = true;
        }
        let after = if changed {
            let mut s = serde_json::to_string_pretty(&top)?;
            s.push('\n');
            Some(s.into_bytes())
        } else {
            None
        };
        // The commands.
        let mut commands = Vec::new();
        for (name, desc, hint, words) in COMMANDS {
            let path = self.commands.join(format!("{name}.md"));
            let body = self.command_file(desc, hint, words);
            commands.push(Value::String(format!("{name}.md")));
            match read_opt(&path)? {
                Some(b) if b == body.as_bytes() => {}
                Some(_) if !note_lists(&note, name) => {
                    plan.report.push(format!(
                        "note: {} is not ours: left as it is",
                        path.display()
                    ));
                }
                _ => {
                    plan.report.push(format!("+ {}", path.display()));
                    plan.writes.push((path, Some(body.into_bytes())));
                }
            }
        }
        if let Some(after) = after {
            plan.report.push(format!("--- {}", self.settings.display()));
            plan.report.push(format!("+++ {}", self.settings.display()));
            plan.report
                .push(diff(&text, &String::from_utf8_lossy(&after)));
            if note_before.is_none() {
                // The first install: the file as it was, for a removal that
                // finds it unchanged since.
                let backup = self.settings.with_extension("json.oceancode-backup");
                note["existed"] = Value::Bool(before.is_some());
                if let Some(b) = &before {
                    plan.writes.push((backup.clone(), Some(b.clone())));
                    plan.report.push(format!("backup: {}", backup.display()));
                }
                note["backup"] = Value::String(backup.to_string_lossy().into_owned());
            }
            note["written_sha256"] = Value::String(sha256(&after));
            plan.writes.push((self.settings.clone(), Some(after)));
        }
        if !plan.writes.is_empty() {
            note["settings"] = Value::String(self.settings.to_string_lossy().into_owned());
            note["commands"] = Value::Array(commands);
            let mut n = serde_json::to_string_pretty(&note)?;
            n.push('\n');
            plan.writes.push((self.note.clone(), Some(n.into_bytes())));
        }
        Ok(plan)
    }

    /// The plan of a removal: only what the note says `setup` added.
    pub fn removal(&self) -> Result<Plan> {
        let mut plan = Plan::default();
        let Some(note) = read_opt(&self.note)? else {
            plan.report.push(format!(
                "no {} here: nothing of setup's to remove",
                self.note.display()
            ));
            return Ok(plan);
        };
        let note: Value = serde_json::from_slice(&note)
            .with_context(|| format!("{} is not JSON", self.note.display()))?;
        for (name, desc, hint, words) in COMMANDS {
            let path = self.commands.join(format!("{name}.md"));
            match read_opt(&path)? {
                Some(b) if b == self.command_file(desc, hint, words).as_bytes() => {
                    plan.report.push(format!("- {}", path.display()));
                    plan.writes.push((path, None));
                }
                Some(_) if note_lists(&note, name) => plan.report.push(format!(
                    "note: {} was changed since: left as it is",
                    path.display()
                )),
                _ => {}
            }
        }
        let before = read_opt(&self.settings)?;
        let backup = note["backup"].as_str().map(PathBuf::from);
        let unchanged = before
            .as_ref()
            .is_some_and(|b| Some(sha256(b).as_str()) == note["written_sha256"].as_str());
        let text = before
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        let restored: Option<Option<Vec<u8>>> = if unchanged {
            // Nothing else changed it: back to the very bytes it had.
            match (&note["existed"], &backup) {
                (Value::Bool(false), _) => Some(None),
                (_, Some(b)) => {
                    Some(Some(std::fs::read(b).with_context(|| {
                        format!("cannot read the backup {}", b.display())
                    })?))
                }
                _ => None,
            }
        } else if before.is_some() {
            self.take_out(&text, &note)?.map(Some)
        } else {
            None
        };
        if let Some(after) = restored {
            plan.report.push(format!("--- {}", self.settings.display()));
            plan.report.push(format!("+++ {}", self.settings.display()));
            let shown = after
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            plan.report.push(diff(&text, &shown));
            plan.writes.push((self.settings.clone(), after));
        }
        if let Some(b) = backup {
            plan.writes.push((b, None));
        }
        plan.writes.push((self.note.clone(), None));
        Ok(plan)
    }

    /// The settings without what the note says was added (None: nothing of
    /// it is left), for a file changed since.
    fn take_out(&self, text: &str, note: &Value) -> Result<Option<Vec<u8>>> {
        let mut top = parse_object(text, &self.settings)?;
        let mut changed = false;
        let ours = &note["status_line"];
        if !ours.is_null()
            && top.get("statusLine").map(|r| parse_value(r.get())).as_ref() == Some(ours)
        {
            match note.get("replaced_status_line") {
                Some(old) => top.insert("statusLine".into(), raw(old, 1)?),
                None => top.shift_remove("statusLine"),
            };
            changed = true;
        }
        if let (Some(dir), Some(r)) = (note.get("additional_directory"), top.get("permissions")) {
            let mut perms: IndexMap<String, Value> =
                serde_json::from_str(r.get()).unwrap_or_default();
            if let Some(list) = perms
                .get_mut("additionalDirectories")
                .and_then(Value::as_array_mut)
            {
                let n = list.len();
                list.retain(|d| d != dir);
                if list.len() != n {
                    changed = true;
                    if list.is_empty() {
                        perms.shift_remove("additionalDirectories");
                    }
                    if perms.is_empty() {
                        top.shift_remove("permissions");
                    } else {
                        top.insert("permissions".into(), raw(&perms, 1)?);
                    }
                }
            }
        }
        if !changed {
            return Ok(None);
        }
        let mut s = serde_json::to_string_pretty(&top)?;
        s.push('\n');
        Ok(Some(s.into_bytes()))
    }
}

/// Whether the note lists command `name` as setup's.
fn note_lists(note: &Value, name: &str) -> bool {
    note["commands"]
        .as_array()
        .is_some_and(|c| c.iter().any(|n| n.as_str() == Some(&format!("{name}.md"))))
}

/// The file's bytes, None when there is none.
fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The top-level object of a settings file, its keys in order and their
/// values as they are written (an empty file: no keys).
fn parse_object(text: &str, path: &Path) -> Result<IndexMap<String, Box<RawValue>>> {
    if text.trim().is_empty() {
        return Ok(IndexMap::new());
    }
    serde_json::from_str(text)
        .with_context(|| format!("{} is not a JSON object; fix it first", path.display()))
}

fn parse_value(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or(Value::Null)
}

/// `v` pretty-printed for a place `depth` levels deep.
fn raw<T: serde::Serialize + ?Sized>(v: &T, depth: usize) -> Result<Box<RawValue>> {
    let pad = "  ".repeat(depth);
    let text = serde_json::to_string_pretty(v)?.replace('\n', &format!("\n{pad}"));
    Ok(RawValue::from_string(text)?)
}

fn sha256(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A line diff of `a` to `b` (`-`/`+` lines, context lines indented).
fn diff(a: &str, b: &str) -> String {
    let (x, y): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // Longest common subsequence, table from the end.
    let mut t = vec![vec![0u32; y.len() + 1]; x.len() + 1];
    for i in (0..x.len()).rev() {
        for j in (0..y.len()).rev() {
            t[i][j] = if x[i] == y[j] {
                t[i + 1][j + 1] + 1
            } else {
                t[i + 1][j].max(t[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < x.len() || j < y.len() {
        if i < x.len() && j < y.len() && x[i] == y[j] {
            out.push(format!("  {}", x[i]));
            i += 1;
            j += 1;
        } else if j < y.len() && (i == x.len() || t[i][j + 1] >= t[i + 1][j]) {
            out.push(format!("+ {}", y[j]));
            j += 1;
        } else {
            out.push(format!("- {}", x[i]));
            i += 1;
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic
    use super::*;

    fn target(dir: &Path) -> Target {
        let claude = dir.join(".claude");
        Target {
            settings: claude.join("settings.json"),
            commands: claude.join("commands"),
            note: claude.join(NOTE),
            exe: "/opt/bin/oceancode-proxy".into(),
            data_dir: dir.join("data dir"),
        }
    }

    const USER: &str = "{\n  \"model\": \"opus\",\n  \"env\": {\"B\": \"1\", \"A\": \"2\"},\n  \"permissions\": {\n    \"allow\": [\"Bash(ls:*)\"],\n    \"deny\": []\n  },\n  \"zeta\": true\n}\n";

    fn install(t: &Target) -> Plan {
        let p = t.install().unwrap();
        p.apply().unwrap();
        p
    }

    #[test]
    fn install_keeps_other_keys_in_order_and_a_second_run_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path());
        std::fs::create_dir_all(t.settings.parent().unwrap()).unwrap();
        std::fs::write(&t.settings, USER).unwrap();
        install(&t);
        let after = std::fs::read_to_string(&t.settings).unwrap();
        let v: Value = serde_json::from_str(&after).unwrap();
        assert_eq!(
            v["statusLine"]["command"],
            format!(
                "/opt/bin/oceancode-proxy --data-dir '{}' statusline",
                t.data_dir.display()
            )
        );
        assert_eq!(v["permissions"]["allow"], json!(["Bash(ls:*)"]));
        assert_eq!(
            v["permissions"]["additionalDirectories"],
            json!([t.data_dir.to_string_lossy()])
        );
        // Unknown keys stay, in their order, their values as written.
        let pos = |k: &str| after.find(&format!("\"{k}\"")).unwrap();
        assert!(
            pos("model") < pos("env")
                && pos("env") < pos("permissions")
                && pos("permissions") < pos("zeta")
        );
        assert!(after.contains("{\"B\": \"1\", \"A\": \"2\"}"), "{after}");
        let cmd = std::fs::read_to_string(t.commands.join("oc-tideline.md")).unwrap();
        assert!(
            cmd.contains("allowed-tools: Bash(/opt/bin/oceancode-proxy:*)"),
            "{cmd}"
        );
        assert!(
            cmd.contains("tideline --session ${CLAUDE_SESSION_ID} $ARGUMENTS"),
            "{cmd}"
        );
        // Idempotent: nothing left to do, and the file is the same.
        let again = t.install().unwrap();
        assert!(again.is_empty(), "{:?}", again.report);
        assert_eq!(std::fs::read_to_string(&t.settings).unwrap(), after);
    }

    #[test]
    fn remove_restores_the_file_byte_for_byte_when_nothing_else_changed() {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path());
        std::fs::create_dir_all(t.settings.parent().unwrap()).unwrap();
        // Odd spacing, no final newline: bytes a rewrite would not keep.
        let odd = "{ \"model\":\"opus\",\n\t\"statusLine\": {\"type\": \"command\", \"command\": \"mine\"} }";
        std::fs::write(&t.settings, odd).unwrap();
        install(&t);
        install(&t);
        let p = t.removal().unwrap();
        p.apply().unwrap();
        assert_eq!(std::fs::read(&t.settings).unwrap(), odd.as_bytes());
        assert!(!t.settings.with_extension("json.oceancode-backup").exists());
        assert!(!t.note.exists() && !t.commands.join("oc-status.md").exists());
    }

    #[test]
    fn remove_of_a_settings_file_setup_created_deletes_it() {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path());
        install(&t);
        assert!(t.settings.exists());
        t.removal().unwrap().apply().unwrap();
        assert!(!t.settings.exists() && !t.note.exists());
    }

    #[test]
    fn remove_after_another_edit_takes_out_only_what_setup_added() {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path());
        std::fs::create_dir_all(t.settings.parent().unwrap()).unwrap();
        let odd = "{\"statusLine\": {\"type\": \"command\", \"command\": \"mine\"}, \"permissions\": {\"additionalDirectories\": [\"/x\"]}}";
        std::fs::write(&t.settings, odd).unwrap();
        install(&t);
        // The user adds a key since.
        let mut v: IndexMap<String, Value> =
            serde_json::from_str(&std::fs::read_to_string(&t.settings).unwrap()).unwrap();
        v.insert("theme".into(), json!("dark"));
        std::fs::write(&t.settings, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        t.removal().unwrap().apply().unwrap();
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(&t.settings).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"statusLine": {"type": "command", "command": "mine"}, "permissions": {"additionalDirectories": ["/x"]}, "theme": "dark"})
        );
    }

    #[test]
    fn a_changed_command_file_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path());
        install(&t);
        let f = t.commands.join("oc-evict.md");
        std::fs::write(&f, "mine now").unwrap();
        t.removal().unwrap().apply().unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "mine now");
        assert!(!t.commands.join("oc-status.md").exists());
    }
}
