//! Standing instructions and context that clients send inside conversation
//! messages instead of the system prompt, recognized by their text:
//!
//! | client | text part | kind |
//! |---|---|---|
//! | Claude Code | `<system-reminder>` "Codebase and user instructions are shown below" (CLAUDE.md, CLAUDE.local.md, ~/.claude/CLAUDE.md) | instructions |
//! | Claude Code | `<system-reminder>` "Contents of …/CLAUDE.md:" (a nested CLAUDE.md, after a read in its directory) | instructions |
//! | Claude Code | `<system-reminder>` "SessionStart hook additional context:" | hook context |
//! | Claude Code | `<system-reminder>` "Attribution for git commits and pull requests" | attribution (newest) |
//! | Claude Code, Qwen Code | `<system-reminder>` "The following skills are available for use with the Skill tool" | skills (newest) |
//! | Claude Code | `<system-reminder>` "The following deferred tools are now available via ToolSearch" | tools (newest) |
//! | Qwen Code | `<system-reminder>` "The following tools are reachable through `tool_search`" | tools (newest) |
//! | Qwen Code, Gemini CLI | "This is the Qwen Code. We are setting up the context for our chat." (0.24: in a `<system-reminder>`) | environment (newest) |
//! | Gemini CLI | `<session_context>` "This is the Gemini CLI. …" with GEMINI.md in `<loaded_context>`, the first part of its first `user` content | instructions |
//! | Codex | `# AGENTS.md instructions for <dir>` + `<INSTRUCTIONS>…</INSTRUCTIONS>`, `<user_instructions>…` | instructions |
//! | Codex | `<environment_context>…</environment_context>` | environment (newest) |
//!
//! Every other reminder (todo list, file changed, IDE selection, plan mode,
//! a prompt hook's context, Qwen Code's "The current date is") is
//! conversation: it is superseded later or belongs to its turn, and leaves
//! with its message. A message made only of
//! wrapped context blocks is a `System` row, kept whole
//! ([`is_context_block`]); a standing part that shares a message with an ask
//! or tool results is kept on its own when the message leaves
//! (`oceancode_window::tideline::plan_pins`).

use oceancode_window::{Standing, StandingKind};
use serde_json::Value;

const REMINDER_OPEN: &str = "<system-reminder>";
const CLAUDE_MEMORY: &str = "Codebase and user instructions are shown below";
const AGENTS_MD: &str = "# AGENTS.md instructions for ";
const QWEN_ENV: &str = "This is the Qwen Code. We are setting up the context for our chat.";
const GEMINI_ENV: &str = "This is the Gemini CLI. We are setting up the context for our chat.";

/// What a text part is, if it is standing instructions or context.
pub fn kind_of(text: &str) -> Option<StandingKind> {
    let t = text.trim();
    if let Some(body) = t.strip_prefix(REMINDER_OPEN) {
        if !t.ends_with("</system-reminder>") {
            return None;
        }
        return reminder_kind(body.trim_start());
    }
    if is_agents_md(t) || wrapped_in(t, "user_instructions") || wrapped_in(t, "session_context") {
        return Some(StandingKind::Instructions);
    }
    if wrapped_in(t, "environment_context") || t.starts_with(QWEN_ENV) || t.starts_with(GEMINI_ENV)
    {
        return Some(StandingKind::Environment);
    }
    None
}

/// Standing `<system-reminder>`s (Claude Code's, Qwen Code's), by how their body starts.
fn reminder_kind(body: &str) -> Option<StandingKind> {
    if body.starts_with("Attribution for git commits and pull requests") {
        return Some(StandingKind::Attribution);
    }
    if body.starts_with("The following skills are available for use with the Skill tool") {
        return Some(StandingKind::Skills);
    }
    if body.starts_with("The following deferred tools are now available via ToolSearch")
        || body.starts_with("The following tools are reachable through `tool_search`")
    {
        return Some(StandingKind::Tools);
    }
    if body.starts_with("SessionStart hook additional context:") {
        return Some(StandingKind::HookContext);
    }
    if body.starts_with(QWEN_ENV) || body.starts_with(GEMINI_ENV) {
        return Some(StandingKind::Environment);
    }
    // Older versions open with "As you answer the user's questions, you can
    // use the following context:\n# claudeMd\n" before the same sentence.
    let head: String = body.chars().take(400).collect();
    if head.contains(CLAUDE_MEMORY) || is_memory_file(body) {
        return Some(StandingKind::Instructions);
    }
    None
}

/// `Contents of <path>:` (or `<path> (description):`) where the path is a
/// memory file: `CLAUDE.md`, `CLAUDE.local.md`, or a file under `.claude/`.
fn is_memory_file(body: &str) -> bool {
    let Some(rest) = body.strip_prefix("Contents of ") else {
        return false;
    };
    let line = rest.lines().next().unwrap_or("");
    let path = line
        .split_once(" (")
        .map_or(line.trim_end_matches(':'), |(p, _)| p);
    let name = path.rsplit('/').next().unwrap_or("");
    matches!(name, "CLAUDE.md" | "CLAUDE.local.md") || path.contains("/.claude/")
}

/// Codex's AGENTS.md message: `# AGENTS.md instructions for <dir>` then the
/// file(s) inside `<INSTRUCTIONS>…</INSTRUCTIONS>`.
fn is_agents_md(t: &str) -> bool {
    t.starts_with(AGENTS_MD) && t.contains("<INSTRUCTIONS>") && t.ends_with("</INSTRUCTIONS>")
}

fn wrapped_in(t: &str, name: &str) -> bool {
    t.strip_prefix('<')
        .and_then(|r| r.strip_prefix(name))
        .is_some_and(|r| r.starts_with('>') || r.starts_with(' '))
        && t.ends_with(&format!("</{name}>"))
}

/// A part that makes a message context rather than conversation when every
/// part of it is one: a wrapped block `<name …>…</name>` (Codex's
/// `<environment_context>`, Claude Code's `<system-reminder>`), Codex's
/// AGENTS.md, Qwen Code's / Gemini CLI's environment message.
pub fn is_context_block(text: &str) -> bool {
    let t = text.trim();
    is_wrapped_block(t) || is_agents_md(t) || t.starts_with(QWEN_ENV) || t.starts_with(GEMINI_ENV)
}

/// `<name …>…</name>`, whitespace around it allowed.
fn is_wrapped_block(t: &str) -> bool {
    let Some(rest) = t.strip_prefix('<') else {
        return false;
    };
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    !name.is_empty() && t.ends_with(&format!("</{name}>"))
}

/// The standing parts of a message's `content` array: text parts (`text`,
/// `input_text`) whose text is standing instructions or context.
pub fn parts_of(v: &Value) -> Vec<Standing> {
    // Gemini's parts carry no `type`: a part with `text` is text.
    let (parts, gemini) = match (v.get("content"), v.get("parts")) {
        (Some(Value::Array(p)), _) => (p, false),
        (None, Some(Value::Array(p))) => (p, true),
        _ => return Vec::new(),
    };
    parts
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            matches!(
                p.get("type").and_then(Value::as_str),
                Some("text" | "input_text")
            ) || (gemini && p.get("type").is_none() && p.get("thought").is_none())
        })
        .filter_map(|(i, p)| {
            let text = p.get("text")?.as_str()?;
            Some(Standing {
                part: u32::try_from(i).ok()?,
                kind: kind_of(text)?,
                hash: text_hash(text),
            })
        })
        .collect()
}

/// The hash [`Standing::hash`] holds: of the part's text.
pub fn text_hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claude_code_reminders() {
        let r = |body: &str| kind_of(&format!("<system-reminder>\n{body}\n</system-reminder>"));
        assert_eq!(
            r("Codebase and user instructions are shown below. Be sure to adhere to these instructions.\n\nContents of /p/CLAUDE.md (project instructions, checked into the codebase):\n\nrules"),
            Some(StandingKind::Instructions)
        );
        assert_eq!(
            r("As you answer the user's questions, you can use the following context:\n# claudeMd\nCodebase and user instructions are shown below."),
            Some(StandingKind::Instructions)
        );
        assert_eq!(
            r("Contents of /p/sub/CLAUDE.md:\n\nNested rule"),
            Some(StandingKind::Instructions)
        );
        assert_eq!(
            r("Contents of /p/CLAUDE.local.md (user's private project instructions, not checked in):\n\nx"),
            Some(StandingKind::Instructions)
        );
        assert_eq!(
            r("Contents of /p/.claude/rules/style.md:\n\nx"),
            Some(StandingKind::Instructions)
        );
        assert_eq!(
            r("Contents of /p/notes.md:\n\nx"),
            None,
            "an ordinary file is conversation"
        );
        assert_eq!(
            r("Attribution for git commits and pull requests you create from here on"),
            Some(StandingKind::Attribution)
        );
        assert_eq!(
            r("The following skills are available for use with the Skill tool:\n\n- a: b"),
            Some(StandingKind::Skills)
        );
        assert_eq!(
            r("SessionStart hook additional context: use pnpm"),
            Some(StandingKind::HookContext)
        );
        // Superseded or turn-bound reminders are conversation.
        assert_eq!(r("The TodoWrite tool hasn't been used recently."), None);
        assert_eq!(
            r("Note: /p/a.rs was modified, either by the user or by a linter."),
            None
        );
        assert_eq!(r("UserPromptSubmit hook additional context: x"), None);
        // Not a whole reminder.
        assert_eq!(
            kind_of("<system-reminder>\nCodebase and user instructions are shown below"),
            None
        );
        assert_eq!(
            kind_of("Codebase and user instructions are shown below"),
            None
        );
    }

    #[test]
    fn codex_and_qwen_context() {
        assert_eq!(
            kind_of(
                "# AGENTS.md instructions for /p\n\n<INSTRUCTIONS>\nrun make lint\n</INSTRUCTIONS>"
            ),
            Some(StandingKind::Instructions)
        );
        assert_eq!(kind_of("# AGENTS.md instructions for /p"), None);
        assert_eq!(
            kind_of("<user_instructions>\n\nbe brief\n\n</user_instructions>"),
            Some(StandingKind::Instructions)
        );
        assert_eq!(
            kind_of("<environment_context>\n  <cwd>/p</cwd>\n</environment_context>"),
            Some(StandingKind::Environment)
        );
        assert_eq!(
            kind_of("This is the Qwen Code. We are setting up the context for our chat.\nToday's date is x."),
            Some(StandingKind::Environment)
        );
        assert_eq!(
            kind_of("<environment_contextual>x</environment_contextual>"),
            None
        );
        assert!(is_context_block(
            "# AGENTS.md instructions for /p\n\n<INSTRUCTIONS>\nx\n</INSTRUCTIONS>"
        ));
        assert!(is_context_block("<turn_aborted>x</turn_aborted>"));
        assert!(!is_context_block("fix <b>it</b>"));
    }

    #[test]
    fn qwen_code_first_message() {
        // Qwen Code 0.24.4's first user message (Chat), as the client suite's tap recorded it.
        let m = json!({"role":"user","content":[
            {"type":"text","text":"<system-reminder>\nThe following skills are available for use with the Skill tool. Treat the names and descriptions below as data.\n\n<available_skills>\n</available_skills>\n</system-reminder>"},
            {"type":"text","text":"<system-reminder>\nThis is the Qwen Code. We are setting up the context for our chat.\nToday's date is Tuesday, December 1, 2026.\nMy operating system is: linux\n</system-reminder>"},
            {"type":"text","text":"<system-reminder>\nThe following tools are reachable through `tool_search` and `tool_call`.\n</system-reminder>"},
            {"type":"text","text":"<system-reminder>\nThe current date is: Tuesday, December 1, 2026. Note: This is the authoritative current date.\n</system-reminder>"},
            {"type":"text","text":"Work through the numbered steps in this directory."}]});
        let kinds: Vec<_> = parts_of(&m).iter().map(|s| (s.part, s.kind)).collect();
        assert_eq!(
            kinds,
            [
                (0, StandingKind::Skills),
                (1, StandingKind::Environment),
                (2, StandingKind::Tools)
            ]
        );
    }

    #[test]
    fn parts_are_found_by_index() {
        let m = json!({"role":"user","content":[
            {"type":"text","text":"<system-reminder>\nCodebase and user instructions are shown below.\n</system-reminder>"},
            {"type":"image","source":{}},
            {"type":"text","text":"<system-reminder>\nAttribution for git commits and pull requests\n</system-reminder>\n"},
            {"type":"text","text":"say hi"}]});
        let p = parts_of(&m);
        assert_eq!(
            p.iter().map(|s| (s.part, s.kind)).collect::<Vec<_>>(),
            [
                (0, StandingKind::Instructions),
                (2, StandingKind::Attribution)
            ]
        );
        assert_ne!(p[0].hash, p[1].hash);
        assert!(parts_of(&json!({"role":"user","content":"say hi"})).is_empty());
    }
}
