//! The database side of `SESSION.md` ([`crate::page`] is the pure page):
//! an empty page with the stored model-merged notes, folding in the turns
//! now wholly past the tideline, and writing it when its bytes change.
//! Shared by the live writer and `ledger rebuild`.

use super::error::{io_err, StoreError};
use super::source::Source;
use crate::model::{Dialect, Row};
use crate::page::Page;
use crate::paths::DataDir;
use std::collections::BTreeMap;

/// An empty page with the session's stored model-merged notes.
pub(crate) fn new_page(src: &dyn Source, session: &str) -> Result<Page, StoreError> {
    let mut page = Page::new();
    page.add_notes(src.page_notes(session)?);
    Ok(page)
}

/// Fold into `page` the goal (first ask on the active line) and every row
/// now past the tideline, block by block: at each recorded cut (ascending
/// `upto_seq`), the rows (hidden ones too) after the last block folded up
/// to the cut, turn by turn. Live and `ledger rebuild` fold the same blocks
/// (the cuts table), so the bytes are the same. The last turn wholly past
/// the tideline (all of its rows at or below the highest cut, a newer turn
/// on the active line) is noted for the model merge. Returns whether
/// anything changed.
pub(crate) fn advance_page(
    src: &dyn Source,
    session: &str,
    dialect: Dialect,
    page: &mut Page,
) -> Result<bool, StoreError> {
    let mut changed = false;
    if !page.has_goal() {
        if let Some((turn, raw)) = src.first_prompt(session)? {
            page.set_goal(dialect, turn, &raw);
            changed = true;
        }
    }
    let cuts = src.cuts_after(session, page.merged_upto_seq())?;
    let Some(&upto) = cuts.last() else {
        return Ok(changed);
    };
    for cut in cuts {
        let mut turns: BTreeMap<u32, Vec<(Row, bool)>> = BTreeMap::new();
        for (row, hidden) in src.rows_between(session, page.merged_upto_seq(), cut)? {
            turns.entry(row.turn).or_default().push((row, hidden));
        }
        for (turn, rows) in turns {
            page.merge_turn(dialect, turn, &rows);
            changed = true;
        }
        page.set_merged_upto(cut);
    }
    let open = src.turn_after(session, upto)?;
    let newest = src.newest_turn(session)?;
    let limit = open.unwrap_or(u32::MAX).min(newest.unwrap_or(0));
    page.set_whole_through(limit.saturating_sub(1));
    Ok(changed)
}

/// Write `SESSION.md` when the page has content and its bytes differ from
/// the last write (`last_hash`). Returns whether it wrote.
pub(crate) fn write_page(
    dir: &DataDir,
    session: &str,
    page: &Page,
    last_hash: &mut Option<u64>,
) -> Result<bool, StoreError> {
    if !page.has_content() {
        return Ok(false);
    }
    let text = page.render(session);
    let hash = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
    if *last_hash == Some(hash) {
        return Ok(false);
    }
    let sdir = dir.session_dir(session);
    dir.create_dir(&sdir).map_err(io_err(&sdir))?;
    let path = dir.session_md(session);
    dir.write_atomic(&path, text.as_bytes())
        .map_err(io_err(&path))?;
    *last_hash = Some(hash);
    Ok(true)
}
