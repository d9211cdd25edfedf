//! The optional model merge of `SESSION.md` (`ledger.merge.model`, off by
//! default): the prompt that asks a model for the page's merged sections
//! (Decisions, Environment, Errors and fixes, Code map, Open questions, Next
//! step) from the transcripts of turns wholly past the tideline, and the
//! parser of its answer. Pure; the caller makes the model call and stores
//! the lines with [`crate::store::LedgerStore::add_page_notes`], so a later
//! mechanical `ledger rebuild` reproduces them without calling a model.

use crate::inside::READ_MAX;
use crate::model::Usage;
use crate::page::{stamp, Note, NOTE_SECTIONS};
use crate::paths::DataDir;

/// Section name of the marker note recording how far the model merge got
/// (never rendered).
pub const MARKER_SECTION: &str = "";
/// Most transcript characters sent in one merge request.
pub const MAX_PROMPT_CHARS: usize = 400_000;
/// Most of `SESSION.md` sent in one merge request (bytes; the page is in a
/// dir the agent can write, so its size is not the proxy's to trust).
pub const MAX_PAGE_CHARS: usize = 100_000;

/// The merge request text for turns `from..=to` of a session.
pub fn prompt(session: &str, page: &str, transcripts: &[(u32, String)]) -> String {
    let (from, to) = match (transcripts.first(), transcripts.last()) {
        (Some(f), Some(l)) => (f.0, l.0),
        _ => (0, 0),
    };
    let mut out = format!(
        "You keep SESSION.md, the living page of coding-agent session {session}.\n\
         Below are the page as it stands and the verbatim transcripts of turns {} to {} \
         (they left the model's context window).\n\
         Write only NEW facts from these turns, one per line, exactly in the form\n\
         SECTION | tNN | fact\n\
         where SECTION is one of: {}; tNN is the turn the fact comes from; the fact is one \
         line of at most 160 characters. Write nothing else. Write no line when there is \
         nothing new.\n\n=== SESSION.md ===\n",
        stamp(from),
        stamp(to),
        NOTE_SECTIONS.join(", ")
    );
    if page.len() > MAX_PAGE_CHARS {
        out.push_str(&page[..floor_boundary(page, MAX_PAGE_CHARS)]);
        out.push_str("\n[… SESSION.md clipped]\n");
    } else {
        out.push_str(page);
        out.push('\n');
    }
    let mut budget = MAX_PROMPT_CHARS;
    for (turn, text) in transcripts {
        out.push_str(&format!("\n=== transcript of {} ===\n", stamp(*turn)));
        if text.len() > budget {
            out.push_str(&text[..floor_boundary(text, budget)]);
            out.push_str("\n[… transcript clipped]\n");
            break;
        }
        budget -= text.len();
        out.push_str(text);
    }
    out
}

/// The largest char boundary of `s` at or below `at`.
fn floor_boundary(s: &str, at: usize) -> usize {
    let mut cut = at.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

/// What a merge of turns `from..=to` of `session` sends: `SESSION.md` and
/// the turn files, read with no link followed ([`DataDir::read_text`]);
/// the turns only until they hold [`MAX_PROMPT_CHARS`] (the rest would be
/// clipped by [`prompt`] anyway), so a session dir the agent filled with
/// large files is not read whole. A file that cannot be read is left out.
pub fn read_inputs(
    dir: &DataDir,
    session: &str,
    from: u32,
    to: u32,
) -> (String, Vec<(u32, String)>) {
    let page = dir
        .read_text(&dir.session_md(session), READ_MAX)
        .unwrap_or_default();
    let mut held = 0usize;
    let mut transcripts = Vec::new();
    for t in from..=to {
        if held >= MAX_PROMPT_CHARS {
            break;
        }
        if let Ok(s) = dir.read_text(&dir.turn_file(session, t), READ_MAX) {
            held += s.len();
            transcripts.push((t, s));
        }
    }
    (page, transcripts)
}

/// Parse the model's answer: `SECTION | tNN | fact` lines (a leading `- `
/// is tolerated; unknown sections and malformed lines are dropped; a turn
/// outside `from..=to` is clamped into it).
pub fn parse_notes(answer: &str, from: u32, to: u32) -> Vec<Note> {
    let mut notes = Vec::new();
    for line in answer.lines() {
        let line = line.trim().trim_start_matches("- ").trim();
        let mut cols = line.splitn(3, '|').map(str::trim);
        let (Some(section), Some(turn), Some(text)) = (cols.next(), cols.next(), cols.next())
        else {
            continue;
        };
        let Some(section) = NOTE_SECTIONS
            .iter()
            .find(|s| s.eq_ignore_ascii_case(section))
        else {
            continue;
        };
        let text = crate::page::squash(text);
        if text.is_empty() {
            continue;
        }
        let turn = turn
            .trim_start_matches(['t', 'T'])
            .parse::<u32>()
            .unwrap_or(to)
            .clamp(from, to.max(from));
        let text = crate::page::clip(&text, crate::page::LINE_MAX);
        notes.push(Note {
            section: section.to_string(),
            turn,
            text,
        });
    }
    notes
}

/// The marker note: the model merge covered every turn up to `to`.
pub fn marker(to: u32) -> Note {
    Note {
        section: MARKER_SECTION.to_string(),
        turn: to,
        text: format!("model merge through {}", stamp(to)),
    }
}

/// The marker note of one merge call, with what it used: the model and
/// the tokens its answer reported (the meter's `merge` row sums these).
pub fn marker_with(to: u32, model: &str, usage: &Usage) -> Note {
    Note {
        section: MARKER_SECTION.to_string(),
        turn: to,
        text: format!(
            "model merge through {} · {} · input {} · output {} · cache read {} · cache write {}",
            stamp(to),
            crate::page::squash(model),
            usage.input,
            usage.output,
            usage.cache_read,
            usage.cache_write
        ),
    }
}

/// What one merge call used, read back from its marker's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeUse {
    /// The merge model.
    pub model: String,
    /// The tokens its answer reported.
    pub usage: Usage,
}

/// The use a marker records ([`marker_with`]); `None` for a marker
/// without it (written before usage was kept).
pub fn marker_use(text: &str) -> Option<MergeUse> {
    let mut parts = text.split(" · ");
    parts.next()?.strip_prefix("model merge through ")?;
    let model = parts.next()?.to_string();
    let mut num =
        |name: &str| -> Option<u64> { parts.next()?.strip_prefix(name)?.trim().parse().ok() };
    let usage = Usage {
        input: num("input ")?,
        output: num("output ")?,
        cache_read: num("cache read ")?,
        cache_write: num("cache write ")?,
    };
    Some(MergeUse { model, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let a = "Decisions | t03 | use FTS5\n- next step | t9 | ship it\nnoise\nBogus | t1 | x\n";
        let n = parse_notes(a, 2, 5);
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].section, "Decisions");
        assert_eq!(n[0].turn, 3);
        assert_eq!(n[1].section, "Next step");
        assert_eq!(n[1].turn, 5);
    }

    #[test]
    fn a_marker_keeps_what_the_call_used() {
        let u = Usage {
            input: 12_345,
            output: 67,
            cache_read: 8,
            cache_write: 9,
        };
        let n = marker_with(4, "claude-haiku-4-5", &u);
        assert_eq!(n.section, MARKER_SECTION);
        assert_eq!(n.turn, 4);
        assert_eq!(
            marker_use(&n.text),
            Some(MergeUse {
                model: "claude-haiku-4-5".into(),
                usage: u
            })
        );
        assert_eq!(marker_use(&marker(3).text), None);
    }

    #[test]
    fn prompt_names_the_turns() {
        let p = prompt(
            "s1",
            "# SESSION s1\n",
            &[(2, "# Turn 2\n".into()), (3, "# Turn 3\n".into())],
        );
        assert!(p.contains("turns t02 to t03"));
        assert!(p.contains("=== transcript of t03 ===\n# Turn 3"));
    }

    /// `SESSION.md` sits in a dir the agent can write: a page of megabytes
    /// must not become a merge request of megabytes.
    #[test]
    fn a_huge_page_is_clipped_in_the_prompt() {
        let page = "x".repeat(8 << 20);
        let p = prompt("s1", &page, &[(2, "# Turn 2\n".into())]);
        assert!(
            p.len() < MAX_PAGE_CHARS + 4_096,
            "a prompt of {} bytes",
            p.len()
        );
        assert!(p.contains("[… SESSION.md clipped]"));
        assert!(p.contains("=== transcript of t02 ===\n# Turn 2"));
    }

    /// Turn files are read only until they fill the prompt; a FIFO or a
    /// link among them is left out, never waited on or followed.
    #[test]
    fn the_inputs_are_read_up_to_the_prompt_bound() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = DataDir::new(tmp.path().join("data"));
        dir.create_dir(&dir.transcript_dir("s")).expect("dirs");
        let turn = "t".repeat(MAX_PROMPT_CHARS / 4 + 1);
        for t in 1..=40 {
            dir.write_atomic(&dir.turn_file("s", t), turn.as_bytes())
                .expect("turn");
        }
        std::os::unix::fs::symlink("/dev/zero", dir.session_md("s")).expect("link");
        let (page, transcripts) = read_inputs(&dir, "s", 1, 40);
        assert_eq!(page, "");
        assert_eq!(transcripts.len(), 4, "read past the bound");
        assert_eq!(transcripts.last().map(|t| t.0), Some(4));
    }
}
