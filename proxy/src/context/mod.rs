//! The agent edits its own context: `context.txt` (the session's live
//! window as a file to edit), the edit set it yields (kept in the ledger,
//! applied to every later request), and the receipt that says whether an
//! edit was taken.
//!
//! | module | holds | I/O |
//! |---|---|---|
//! | `body` | one message as a block body and back (rewrites) | none |
//! | `file` | rendering an export, parsing an edited file | none |
//! | `edits` | the edit set, the changes a file makes, closure, notes, the check | none |
//! | `receipt` | the receipt's text | none |
//! | `live` | what a live session keeps: the edit set, the export, the last layout | stat |
//! | `export` | the blocks of a window, and the export record an edit is read against | none |
//! | `seq_tag` | `context.seq_tags`: a tool result's `[seq N]`, spliced into the client's bytes | none |
//! | `io` | writing the file (behind the request) and the receipt | files |

pub mod body;
pub mod edits;
pub mod export;
pub mod file;
pub mod io;
pub mod live;
pub mod receipt;
pub mod seq_tag;
