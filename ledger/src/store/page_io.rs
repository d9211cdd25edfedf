//! The database side of `SESSION.md` ([`crate::page`] is the pure page):
//! an empty page with the stored model-merged notes, folding in the turns
//! now wholly past the tideline, and writing it when its bytes change.
//! Shared by the live writer and `ledger rebuild`.

use super::error::{io_err, StoreError};
use super::sql::{read_row, to_i64, ROW_COLS};
use crate::model::{Dialect, Row};
use crate::page::{Note, Page};
use crate::paths::{self, DataDir};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;

/// An empty page with the session's stored model-merged notes.
pub(crate) fn new_page(c: &Connection, session: &str) -> Result<Page, StoreError> {
    let mut page = Page::new();
    let mut stmt = c.prepare_cached(
        "SELECT section, turn, text FROM page_notes WHERE session = ?1 ORDER BY id",
    )?;
    let notes = stmt
        .query_map([session], |r| {
            Ok(Note {
                section: r.get(0)?,
                turn: r.get::<_, i64>(1)? as u32,
                text: r.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    page.add_notes(notes);
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
    c: &Connection,
    session: &str,
    dialect: Dialect,
    page: &mut Page,
) -> Result<bool, StoreError> {
    let mut changed = false;
    if !page.has_goal() {
        let first: Option<(i64, String)> = c
            .prepare_cached(
                "SELECT turn, raw FROM rows WHERE session = ?1 AND hidden = 0 AND kind = 'prompt'
                 ORDER BY seq LIMIT 1",
            )?
            .query_row([session], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((turn, raw)) = first {
            page.set_goal(dialect, turn as u32, &raw);
            changed = true;
        }
    }
    let cuts: Vec<i64> = c
        .prepare_cached(
            "SELECT DISTINCT upto_seq FROM cuts WHERE session = ?1 AND upto_seq > ?2
             ORDER BY upto_seq",
        )?
        .query_map(params![session, to_i64(page.merged_upto_seq())], |r| {
            r.get(0)
        })?
        .collect::<rusqlite::Result<_>>()?;
    let Some(&upto) = cuts.last() else {
        return Ok(changed);
    };
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq"
    ))?;
    for cut in cuts {
        let mut turns: BTreeMap<u32, Vec<(Row, bool)>> = BTreeMap::new();
        for r in stmt.query_map(
            params![session, to_i64(page.merged_upto_seq()), cut],
            read_row,
        )? {
            let (row, hidden) = r?;
            turns.entry(row.turn).or_default().push((row, hidden));
        }
        for (turn, rows) in turns {
            page.merge_turn(dialect, turn, &rows);
            changed = true;
        }
        page.set_merged_upto(cut.max(0) as u64);
    }
    let open: Option<i64> = c
        .prepare_cached(
            "SELECT turn FROM rows WHERE session = ?1 AND seq > ?2 ORDER BY seq LIMIT 1",
        )?
        .query_row(params![session, upto], |r| r.get(0))
        .optional()?;
    let newest: Option<i64> = c
        .prepare_cached(
            "SELECT turn FROM rows WHERE session = ?1 AND hidden = 0 ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([session], |r| r.get(0))
        .optional()?;
    let limit = open.unwrap_or(i64::MAX).min(newest.unwrap_or(0));
    page.set_whole_through(u32::try_from(limit.saturating_sub(1).max(0)).unwrap_or(u32::MAX));
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
    paths::create_private_dir_all(&sdir).map_err(io_err(&sdir))?;
    let path = dir.session_md(session);
    paths::write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
    *last_hash = Some(hash);
    Ok(true)
}
