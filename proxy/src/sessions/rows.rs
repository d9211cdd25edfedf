//! A session's rows in memory ([`RowMem`], index = seq − 1), kept in
//! fixed-size chunks: a session that grows never copies its rows into a
//! vector twice the size (a `Vec` holds the old and the new buffer at once
//! while it grows, and keeps up to 2× what it needs after), and a cold
//! request of 2,001 rows allocates 2,001 rows' room, not 2,048 then 4,096.

use super::rowmem::RowMem;

/// Rows a chunk holds. The first chunk grows as a `Vec` up to this (a short
/// session pays for its own rows only); every later chunk is made whole.
const CHUNK: usize = 256;

/// Rows in chunks of [`CHUNK`]: every chunk but the last is full.
#[derive(Debug, Default)]
pub(super) struct Rows {
    chunks: Vec<Vec<RowMem>>,
    len: usize,
}

impl Rows {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn push(&mut self, row: RowMem) {
        match self.chunks.last_mut() {
            Some(c) if c.len() < CHUNK => c.push(row),
            last => {
                let mut c = if last.is_none() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHUNK)
                };
                c.push(row);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut RowMem> {
        self.chunks.get_mut(i / CHUNK)?.get_mut(i % CHUNK)
    }

    /// Keep the first `len` rows.
    pub(super) fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let chunks = len.div_ceil(CHUNK);
        self.chunks.truncate(chunks);
        if let Some(c) = self.chunks.last_mut() {
            c.truncate(len - (chunks - 1) * CHUNK);
        }
        self.len = len;
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &RowMem> {
        self.chunks.iter().flatten()
    }

    /// Rows the chunks have room for (the rows and the last chunk's rest).
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }
}

impl std::ops::Index<usize> for Rows {
    type Output = RowMem;
    fn index(&self, i: usize) -> &RowMem {
        &self.chunks[i / CHUNK][i % CHUNK]
    }
}

impl std::ops::IndexMut<usize> for Rows {
    fn index_mut(&mut self, i: usize) -> &mut RowMem {
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }
}
