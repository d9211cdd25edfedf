//! Where a tool output sits in a raw message: its content value as a byte
//! span ([`Span`]), and the raw members the dialects read to find it (a
//! leaf: the dialect modules find the spans, `compress` prunes them).

use crate::media;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Removed bytes per saved token (the seed's estimate).
pub const SAVED_BYTES_PER_TOKEN: u64 = 4;

/// One tool output inside a raw message: `raw[start..end]` is its content
/// value (a JSON string or array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Index of the output in the message (Anthropic: the block's index in
    /// `content`; Chat and Responses: 0).
    pub part: u32,
    /// Byte offset of the content value.
    pub start: usize,
    /// Byte offset past it.
    pub end: usize,
    /// Its images and documents.
    pub media: media::Cost,
}

impl Span {
    /// Estimated tokens of the content: text bytes ÷ 4, plus what its
    /// images and documents cost.
    pub fn tokens(&self) -> u64 {
        let text = ((self.end - self.start) as u64).saturating_sub(self.media.bytes);
        text.div_ceil(SAVED_BYTES_PER_TOKEN) + self.media.tokens
    }
}

/// The members of a message the dialects' `tool_outputs` look at, raw.
#[derive(Deserialize)]
pub(crate) struct Top<'a> {
    #[serde(borrow, default)]
    pub(crate) role: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow, default)]
    pub(crate) kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) parts: Option<&'a RawValue>,
}

/// A content block's type and content, raw.
#[derive(Deserialize)]
pub(crate) struct Block<'a> {
    #[serde(rename = "type", borrow, default)]
    pub(crate) kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) content: Option<&'a RawValue>,
}

/// Where `sub` (a slice of `base`) starts in `base`.
fn offset(base: &str, sub: &str) -> Option<usize> {
    let at = (sub.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    (at + sub.len() <= base.len()).then_some(at)
}

/// The span of content value `v` (a slice of `base`) as output `part`;
/// None for a null content.
pub(crate) fn span(base: &str, part: u32, v: &RawValue) -> Option<Span> {
    let s = v.get();
    // A missing or null content has nothing to prune.
    if s == "null" {
        return None;
    }
    let start = offset(base, s)?;
    Some(Span {
        part,
        start,
        end: start + s.len(),
        media: media::cost(s),
    })
}
