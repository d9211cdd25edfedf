//! What images, PDFs and other files inside a message cost the provider, in
//! tokens, by the providers' documented rules. Pure: no I/O.
//!
//! Binary content is found wherever it sits in a message of any dialect:
//! Anthropic `image` / `document` blocks (in a user message, inside a
//! `tool_result`'s content, inside a document's `content` source), OpenAI Chat
//! `image_url` and `file` parts, Responses `input_image` / `input_file` parts
//! (also inside a `function_call_output`'s output list). An image's size is
//! read from its PNG / JPEG / GIF / WebP header, decoding only the base64 the
//! header needs (a JPEG's segments are skipped by seeking, never decoded).
//!
//! The rules:
//! - Anthropic image: scaled down (aspect kept) to at most
//!   [`ANTHROPIC_MAX_EDGE`] px on the long edge and [`ANTHROPIC_MAX_TOKENS`]
//!   visual tokens, then one token per 28×28 patch, ⌈w/28⌉·⌈h/28⌉ (the older
//!   docs' w·h/750 is within ~5% of it).
//! - OpenAI image (gpt-4o class): `low` = 85; `high` / `auto`: fit in
//!   2048×2048, shortest side down to 768, then 170 per 512-px tile + 85.
//! - An image whose size is unknown (a URL, a file id, an unreadable header)
//!   costs the most an image can cost under the rule (a capped constant).
//! - Gemini image (`inlineData` / `fileData` parts): [`GEMINI_TILE_TOKENS`]
//!   when both sides are at most [`GEMINI_SMALL_EDGE`] px, else that many per
//!   [`GEMINI_TILE`]×[`GEMINI_TILE`] tile, ⌈w/768⌉·⌈h/768⌉; a size unknown is
//!   priced as four tiles.
//! - PDF: [`PDF_PAGE_TOKENS`] per page (a page's text plus its page image;
//!   Gemini: [`GEMINI_TILE_TOKENS`] per page), pages counted from the
//!   `/Type /Page` objects (bounded scan).
//! - A text document is text: it is left to the byte estimate (no binary
//!   bytes, no tokens here); a base64 text file costs its decoded bytes / 4.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, BufRead, Read, Seek, SeekFrom};

/// Anthropic: longest edge an image keeps (px).
pub const ANTHROPIC_MAX_EDGE: u32 = 1568;
/// Anthropic: most visual tokens (28×28 patches) an image keeps.
pub const ANTHROPIC_MAX_TOKENS: u64 = 1568;
/// Anthropic: the side of one visual token (px).
pub const ANTHROPIC_PATCH: u32 = 28;
/// OpenAI `low` detail, and the base of every `high` image.
pub const OPENAI_BASE_TOKENS: u64 = 85;
/// OpenAI: tokens per 512-px tile (`high` / `auto`).
pub const OPENAI_TILE_TOKENS: u64 = 170;
/// OpenAI `high`: the most an image can cost (8 tiles: 2048×768 after scaling).
pub const OPENAI_MAX_TOKENS: u64 = OPENAI_BASE_TOKENS + 8 * OPENAI_TILE_TOKENS;
/// Tokens of one PDF page (its extracted text plus its page image).
pub const PDF_PAGE_TOKENS: u64 = 2_300;
/// Gemini: tokens of a small image, of one tile of a larger one, and of
/// one document page.
pub const GEMINI_TILE_TOKENS: u64 = 258;
/// Gemini: an image with both sides at most this (px) is one tile.
pub const GEMINI_SMALL_EDGE: u32 = 384;
/// Gemini: the side of a tile of a larger image (px).
pub const GEMINI_TILE: u32 = 768;
/// Gemini: an image of unknown size, priced as four tiles.
pub const GEMINI_UNKNOWN_TOKENS: u64 = 4 * GEMINI_TILE_TOKENS;
/// Decoded PDF bytes scanned for page objects (the rest is extrapolated).
const PDF_SCAN_BYTES: usize = 16 << 20;
/// Decoded bytes per base64 chunk.
const CHUNK_CHARS: usize = 4 * 1024;

/// What a binary part is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An image.
    Image,
    /// A PDF document.
    Pdf,
    /// A text document (counted as text).
    Text,
    /// Another file.
    File,
}

/// OpenAI's `detail` of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// 85 tokens, whatever the size.
    Low,
    /// Tiles.
    High,
    /// The provider chooses (priced as `high`).
    Auto,
}

/// Whose pricing rule applies (the block's shape tells).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Anthropic Messages blocks.
    Anthropic,
    /// OpenAI Chat / Responses parts.
    OpenAi(Detail),
    /// Gemini `inlineData` / `fileData` parts.
    Gemini,
}

/// One binary part of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Media {
    /// What it is.
    pub kind: Kind,
    /// The pricing rule.
    pub rule: Rule,
    /// `image/png`, `application/pdf`, ... (the header's format when it was
    /// read, else as declared).
    pub media_type: Option<String>,
    /// Where the content is when it is not inline (`url`, `file`).
    pub by_ref: Option<&'static str>,
    /// Width × height in pixels, when the header was read.
    pub size: Option<(u32, u32)>,
    /// Pages of a PDF, when counted.
    pub pages: Option<u32>,
    /// Bytes of the message's JSON the content takes (its base64, data URL or URL).
    pub bytes: u64,
    /// What the provider charges for it (estimated).
    pub tokens: u64,
}

impl Media {
    /// Facts for a placeholder: `1920×1080 · ~1568 tokens`, `3 pages · ~6900
    /// tokens`, `~1568 tokens` (size unknown); empty for a text document.
    pub fn facts(&self) -> String {
        if self.kind == Kind::Text {
            return String::new();
        }
        let mut s = String::new();
        if let Some((w, h)) = self.size {
            s.push_str(&format!("{w}×{h} · "));
        }
        if let Some(p) = self.pages {
            s.push_str(&format!("{p} page{} · ", if p == 1 { "" } else { "s" }));
        }
        let plural = if self.tokens == 1 { "" } else { "s" };
        s.push_str(&format!("~{} token{plural}", self.tokens));
        s
    }
}

/// A placeholder's text after `image: ` / `document: `: the part's name or
/// type, then its [`Media::facts`] (None when there is nothing to say).
pub fn label(detail: Option<&str>, m: Option<&Media>) -> Option<String> {
    let facts = m.map(Media::facts).unwrap_or_default();
    match (detail, facts.is_empty()) {
        (Some(d), true) => Some(d.to_string()),
        (Some(d), false) => Some(format!("{d} · {facts}")),
        (None, false) => Some(facts),
        (None, true) => None,
    }
}

/// Binary bytes and their tokens, summed over parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Bytes of JSON the parts take.
    pub bytes: u64,
    /// Their estimated tokens.
    pub tokens: u64,
}

impl Cost {
    /// The sum of two costs.
    pub fn plus(self, o: Cost) -> Cost {
        Cost {
            bytes: self.bytes + o.bytes,
            tokens: self.tokens + o.tokens,
        }
    }

    /// `self` less `o` (never below zero).
    pub fn minus(self, o: Cost) -> Cost {
        Cost {
            bytes: self.bytes.saturating_sub(o.bytes),
            tokens: self.tokens.saturating_sub(o.tokens),
        }
    }
}

/// Every binary part of a raw message (any dialect), in order.
pub fn scan(raw: &str) -> Vec<Media> {
    let mut out = Vec::new();
    if might_have_media(raw) {
        if let Ok(v) = serde_json::from_str::<&RawValue>(raw) {
            walk(&v, 0, &mut out);
        }
    }
    out
}

/// The binary parts of a raw message, summed. A message without any costs
/// one substring search.
pub fn cost(raw: &str) -> Cost {
    scan(raw).iter().fold(Cost::default(), |c, m| {
        c.plus(Cost {
            bytes: m.bytes,
            tokens: m.tokens,
        })
    })
}

/// A row's token estimate: its text bytes over the learned bytes per token,
/// plus what its binary parts cost.
pub fn row_tokens(raw_len: usize, media: Cost, bytes_per_token: f64) -> u32 {
    let text = (raw_len as u64).saturating_sub(media.bytes) as f64;
    let t = (text / bytes_per_token.max(0.1)).ceil() as u64 + media.tokens;
    t.min(u64::from(u32::MAX)) as u32
}

/// Bytes per token of a request's text alone (body bytes and input tokens
/// less its binary parts); None when nothing is left to learn from.
pub fn text_bytes_per_token(body_bytes: usize, input_tokens: u64, media: Cost) -> Option<f64> {
    let bytes = (body_bytes as u64).checked_sub(media.bytes)?;
    let tokens = input_tokens.checked_sub(media.tokens)?;
    (bytes > 0 && tokens > 0).then(|| bytes as f64 / tokens as f64)
}

/// One block given as raw JSON (`{"type":"image",...}`), if it is binary.
pub fn block(raw: &str) -> Option<Media> {
    let v: &RawValue = serde_json::from_str(raw).ok()?;
    let mut out = Vec::new();
    let o = v.obj()?;
    classify(&o, 0, &mut out).then_some(())?;
    out.into_iter().next()
}

/// One block given as a parsed object, if it is binary.
pub fn block_of(o: &Map<String, Value>) -> Option<Media> {
    let mut out = Vec::new();
    classify(&o, 0, &mut out).then_some(())?;
    out.into_iter().next()
}

/// Whether `raw` may hold a binary part (a cheap test before parsing).
pub fn might_have_media(raw: &str) -> bool {
    // Every mark starts with a quote: one memchr scan for quotes, where a
    // search per mark read every row seven times.
    let b = raw.as_bytes();
    memchr::memchr_iter(b'"', b)
        .any(|i| MEDIA_MARKS.iter().any(|m| b[i..].starts_with(m.as_bytes())))
}

/// What a row holding a binary part contains ([`might_have_media`]).
const MEDIA_MARKS: [&str; 7] = [
    "\"image",
    "\"document\"",
    "\"input_image\"",
    "\"input_file\"",
    "\"file\"",
    "\"inlineData\"",
    "\"fileData\"",
];

// ---------------------------------------------------------------------------
// Formulas

/// The size an Anthropic image is scaled to (aspect kept): within
/// [`ANTHROPIC_MAX_EDGE`] and [`ANTHROPIC_MAX_TOKENS`].
pub fn anthropic_fit(w: u32, h: u32) -> (u32, u32) {
    if w == 0 || h == 0 {
        return (w, h);
    }
    let (fw, fh) = (f64::from(w), f64::from(h));
    let long = fw.max(fh);
    let mut s = (f64::from(ANTHROPIC_MAX_EDGE) / long).min(1.0);
    let patch = f64::from(ANTHROPIC_PATCH);
    let area_cap = (ANTHROPIC_MAX_TOKENS as f64 * patch * patch / (fw * fh)).sqrt();
    let dims = |s: f64| -> (u32, u32) {
        (
            ((fw * s).floor() as u32).max(1),
            ((fh * s).floor() as u32).max(1),
        )
    };
    if patches(dims(s)) > ANTHROPIC_MAX_TOKENS {
        s = s.min(area_cap);
        // Rounding up to whole patches can still overshoot: shrink a little.
        for _ in 0..64 {
            if patches(dims(s)) <= ANTHROPIC_MAX_TOKENS {
                break;
            }
            s *= 0.995;
        }
    }
    dims(s)
}

fn patches((w, h): (u32, u32)) -> u64 {
    u64::from(w.div_ceil(ANTHROPIC_PATCH)) * u64::from(h.div_ceil(ANTHROPIC_PATCH))
}

/// Tokens of an Anthropic image of `w`×`h` pixels.
pub fn anthropic_image_tokens(w: u32, h: u32) -> u64 {
    patches(anthropic_fit(w, h))
}

/// Tokens of an OpenAI image of `w`×`h` pixels at `detail`.
pub fn openai_image_tokens(w: u32, h: u32, detail: Detail) -> u64 {
    if detail == Detail::Low || w == 0 || h == 0 {
        return OPENAI_BASE_TOKENS;
    }
    let (mut fw, mut fh) = (f64::from(w), f64::from(h));
    if fw.max(fh) > 2048.0 {
        let s = 2048.0 / fw.max(fh);
        fw *= s;
        fh *= s;
    }
    if fw.min(fh) > 768.0 {
        let s = 768.0 / fw.min(fh);
        fw *= s;
        fh *= s;
    }
    let tiles = (fw / 512.0).ceil() as u64 * (fh / 512.0).ceil() as u64;
    OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles
}

impl Rule {
    /// Tokens of an image under this rule (None = size unknown: the cap).
    pub fn image_tokens(self, size: Option<(u32, u32)>) -> u64 {
        match (self, size) {
            (Rule::Anthropic, Some((w, h))) => anthropic_image_tokens(w, h),
            (Rule::Anthropic, None) => ANTHROPIC_MAX_TOKENS,
            (Rule::OpenAi(d), Some((w, h))) => openai_image_tokens(w, h, d),
            (Rule::OpenAi(Detail::Low), None) => OPENAI_BASE_TOKENS,
            (Rule::OpenAi(_), None) => OPENAI_MAX_TOKENS,
            (Rule::Gemini, Some((w, h))) => gemini_image_tokens(w, h),
            (Rule::Gemini, None) => GEMINI_UNKNOWN_TOKENS,
        }
    }

    /// Tokens of one PDF page under this rule.
    pub fn page_tokens(self) -> u64 {
        match self {
            Rule::Gemini => GEMINI_TILE_TOKENS,
            Rule::Anthropic | Rule::OpenAi(_) => PDF_PAGE_TOKENS,
        }
    }
}

/// Gemini's tokens for a `w`×`h` image: one tile when small, else one per
/// 768-px tile.
pub fn gemini_image_tokens(w: u32, h: u32) -> u64 {
    if w <= GEMINI_SMALL_EDGE && h <= GEMINI_SMALL_EDGE {
        return GEMINI_TILE_TOKENS;
    }
    u64::from(w.div_ceil(GEMINI_TILE)) * u64::from(h.div_ceil(GEMINI_TILE)) * GEMINI_TILE_TOKENS
}

// ---------------------------------------------------------------------------
// Headers

/// Format and size of an image from its first bytes (PNG, JPEG, GIF, WebP).
pub fn image_size(bytes: &[u8]) -> Option<(&'static str, u32, u32)> {
    sniff(io::Cursor::new(bytes))
}

/// Format and size of a base64 image, decoding only what the header needs.
pub fn image_size_b64(b64: &str) -> Option<(&'static str, u32, u32)> {
    let clean = clean_b64(b64);
    sniff(B64Reader::new(clean.as_bytes()))
}

fn sniff<R: BufRead + Seek>(mut r: R) -> Option<(&'static str, u32, u32)> {
    let ty = imagesize::reader_type(&mut r).ok()?;
    let name = match ty {
        imagesize::ImageType::Png => "image/png",
        imagesize::ImageType::Jpeg => "image/jpeg",
        imagesize::ImageType::Gif => "image/gif",
        imagesize::ImageType::Webp => "image/webp",
        _ => return None,
    };
    // (The size readers go on from where the type probe stopped.)
    let size = ty.reader_size(&mut r).ok()?;
    let w = u32::try_from(size.width).ok()?;
    let h = u32::try_from(size.height).ok()?;
    (w > 0 && h > 0).then_some((name, w, h))
}

/// Base64 without line breaks (MIME wraps at 76 columns): borrowed when clean.
fn clean_b64(b64: &str) -> Cow<'_, str> {
    let head = &b64.as_bytes()[..b64.len().min(128)];
    if head.iter().any(u8::is_ascii_whitespace) {
        Cow::Owned(b64.chars().filter(|c| !c.is_ascii_whitespace()).collect())
    } else {
        Cow::Borrowed(b64)
    }
}

fn engine() -> GeneralPurpose {
    GeneralPurpose::new(
        &alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    )
}

/// Random access into base64 text as if it were the decoded bytes: a read
/// decodes only the 4-character groups it covers.
struct B64Reader<'a> {
    src: &'a [u8],
    len: u64,
    pos: u64,
    buf: Vec<u8>,
    buf_at: u64,
    engine: GeneralPurpose,
}

impl<'a> B64Reader<'a> {
    fn new(src: &'a [u8]) -> Self {
        let mut n = src.len();
        while n > 0 && src[n - 1] == b'=' {
            n -= 1;
        }
        let len = (n / 4 * 3 + (n % 4).saturating_sub(1)) as u64;
        B64Reader {
            src: &src[..n],
            len,
            pos: 0,
            buf: Vec::new(),
            buf_at: 0,
            engine: engine(),
        }
    }
}

impl BufRead for B64Reader<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos >= self.len {
            return Ok(&[]);
        }
        let end = self.buf_at + self.buf.len() as u64;
        if !(self.buf_at..end).contains(&self.pos) {
            let group = (self.pos / 3) as usize;
            let from = group * 4;
            let to = (from + CHUNK_CHARS).min(self.src.len());
            self.buf = self
                .engine
                .decode(&self.src[from..to])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            self.buf_at = group as u64 * 3;
        }
        let off = (self.pos - self.buf_at) as usize;
        Ok(&self.buf[off.min(self.buf.len())..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos += amt as u64;
    }
}

impl Read for B64Reader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl Seek for B64Reader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let next = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
        };
        self.pos = next.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

/// Pages of a PDF given as base64 (decoded in chunks, at most
/// `PDF_SCAN_BYTES`; the rest extrapolated).
pub fn pdf_pages_b64(b64: &str) -> u32 {
    let clean = clean_b64(b64);
    let src = clean.as_bytes();
    let eng = engine();
    let mut counter = PageCounter::default();
    let chunk = 64 * 1024;
    let mut at = 0;
    while at < src.len() && counter.scanned < PDF_SCAN_BYTES {
        let to = (at + chunk).min(src.len());
        match eng.decode(&src[at..to]) {
            Ok(bytes) => counter.feed(&bytes),
            Err(_) => break,
        }
        at = to;
    }
    let total = (src.len() / 4 * 3) as u64;
    counter.pages(total)
}

/// Pages of a PDF given as bytes.
pub fn pdf_pages(bytes: &[u8]) -> u32 {
    let mut counter = PageCounter::default();
    counter.feed(&bytes[..bytes.len().min(PDF_SCAN_BYTES)]);
    counter.pages(bytes.len() as u64)
}

/// Counts `/Type /Page` objects (not `/Pages`) and the largest `/Count`
/// across chunk borders.
#[derive(Default)]
struct PageCounter {
    tail: Vec<u8>,
    pages: u64,
    count: u64,
    scanned: usize,
}

impl PageCounter {
    fn feed(&mut self, chunk: &[u8]) {
        let mut hay = std::mem::take(&mut self.tail);
        let keep = hay.len();
        hay.extend_from_slice(chunk);
        self.scanned += chunk.len();
        let mut i = 0;
        while let Some(j) = find(&hay[i..], b"/Type") {
            let p = i + j + 5;
            let mut k = p;
            while k < hay.len() && hay[k].is_ascii_whitespace() {
                k += 1;
            }
            // Only matches that end in this chunk's new bytes are counted
            // (a match inside the kept tail was counted last time).
            if hay[k..].starts_with(b"/Page")
                && k + 5 < hay.len()
                && k + 5 >= keep
                && !hay[k + 5].is_ascii_alphanumeric()
            {
                self.pages += 1;
            }
            i = p;
        }
        let mut i = 0;
        while let Some(j) = find(&hay[i..], b"/Count") {
            let mut k = i + j + 6;
            while k < hay.len() && hay[k].is_ascii_whitespace() {
                k += 1;
            }
            let digits: Vec<u8> = hay[k..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .copied()
                .collect();
            if let Ok(n) = std::str::from_utf8(&digits).unwrap_or("").parse::<u64>() {
                self.count = self.count.max(n.min(100_000));
            }
            i = k;
        }
        let t = hay.len().saturating_sub(24);
        self.tail = hay[t..].to_vec();
    }

    fn pages(&self, total: u64) -> u32 {
        let scanned = (self.scanned as u64).max(1);
        let pages = if self.pages > 0 {
            // Extrapolate over what was not scanned.
            self.pages * total.max(scanned) / scanned
        } else if self.count > 0 {
            self.count
        } else {
            // Page objects hidden in compressed object streams: by size.
            1 + total / 100_000
        };
        pages.clamp(1, 100_000) as u32
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(j) = hay[i..].iter().position(|&b| b == needle[0]) {
        if hay[i + j..].starts_with(needle) {
            return Some(i + j);
        }
        i += j + 1;
    }
    None
}

// ---------------------------------------------------------------------------
// Finding the parts

/// A JSON node, borrowed from raw text or from a parsed value.
trait Node<'a>: Sized {
    type Obj: Obj<'a, Node = Self>;
    fn obj(&self) -> Option<Self::Obj>;
    fn string(&self) -> Option<Cow<'a, str>>;
    fn items(&self) -> Option<Vec<Self>>;
}

trait Obj<'a> {
    type Node: Node<'a>;
    fn get(&self, key: &str) -> Option<Self::Node>;
    fn str(&self, key: &str) -> Option<Cow<'a, str>> {
        self.get(key)?.string()
    }
}

impl<'a> Node<'a> for &'a RawValue {
    type Obj = HashMap<String, &'a RawValue>;
    fn obj(&self) -> Option<Self::Obj> {
        let s: &'a str = (*self).get();
        s.starts_with('{').then(|| serde_json::from_str(s).ok())?
    }
    fn string(&self) -> Option<Cow<'a, str>> {
        let s: &'a str = (*self).get();
        let inner = s.strip_prefix('"')?.strip_suffix('"')?;
        if inner.contains('\\') {
            serde_json::from_str::<String>(s).ok().map(Cow::Owned)
        } else {
            Some(Cow::Borrowed(inner))
        }
    }
    fn items(&self) -> Option<Vec<Self>> {
        let s: &'a str = (*self).get();
        s.starts_with('[').then(|| serde_json::from_str(s).ok())?
    }
}

impl<'a> Obj<'a> for HashMap<String, &'a RawValue> {
    type Node = &'a RawValue;
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        HashMap::get(self, key).copied()
    }
}

impl<'a> Node<'a> for &'a Value {
    type Obj = &'a Map<String, Value>;
    fn obj(&self) -> Option<Self::Obj> {
        self.as_object()
    }
    fn string(&self) -> Option<Cow<'a, str>> {
        self.as_str().map(Cow::Borrowed)
    }
    fn items(&self) -> Option<Vec<Self>> {
        self.as_array().map(|a| a.iter().collect())
    }
}

impl<'a> Obj<'a> for &'a Map<String, Value> {
    type Node = &'a Value;
    fn get(&self, key: &str) -> Option<&'a Value> {
        Map::get(self, key)
    }
}

const MAX_DEPTH: u8 = 12;

fn walk<'a, N: Node<'a>>(n: &N, depth: u8, out: &mut Vec<Media>) {
    if depth > MAX_DEPTH {
        return;
    }
    if let Some(items) = n.items() {
        for i in &items {
            walk(i, depth + 1, out);
        }
        return;
    }
    let Some(o) = n.obj() else { return };
    if classify(&o, depth, out) {
        return;
    }
    // Containers: message / tool result `content`, Responses `output`,
    // Gemini `parts` (a content's, a `functionResponse`'s).
    for key in ["content", "output", "parts", "functionResponse"] {
        if let Some(c) = o.get(key) {
            walk(&c, depth + 1, out);
        }
    }
}

/// A `data:<type>;base64,<payload>` URL: (declared type, payload).
fn data_url(url: &str) -> Option<(Option<&str>, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (head, payload) = rest.split_once(',')?;
    let mt = head.strip_suffix(";base64")?;
    Some(((!mt.is_empty()).then_some(mt), payload))
}

fn detail_of(s: Option<Cow<'_, str>>) -> Detail {
    match s.as_deref() {
        Some("low") => Detail::Low,
        Some("high") => Detail::High,
        _ => Detail::Auto,
    }
}

fn image(rule: Rule, payload: Option<&str>, declared: Option<&str>, bytes: usize) -> Media {
    let found = payload.and_then(image_size_b64);
    Media {
        kind: Kind::Image,
        rule,
        media_type: found
            .map(|(t, _, _)| t.to_string())
            .or_else(|| declared.map(str::to_string)),
        by_ref: None,
        size: found.map(|(_, w, h)| (w, h)),
        pages: None,
        bytes: bytes as u64,
        tokens: rule.image_tokens(found.map(|(_, w, h)| (w, h))),
    }
}

fn by_ref(kind: Kind, rule: Rule, what: &'static str, bytes: usize) -> Media {
    let tokens = match kind {
        Kind::Image => rule.image_tokens(None),
        // Pages unknown: priced as one.
        Kind::Pdf => rule.page_tokens(),
        Kind::Text | Kind::File => 0,
    };
    Media {
        kind,
        rule,
        media_type: None,
        by_ref: Some(what),
        size: None,
        pages: None,
        bytes: bytes as u64,
        tokens,
    }
}

/// A text document: its text is counted as text.
fn text_doc(media_type: Option<Cow<'_, str>>) -> Media {
    Media {
        media_type: media_type.map(Cow::into_owned),
        by_ref: None,
        ..by_ref(Kind::Text, Rule::Anthropic, "text", 0)
    }
}

/// A base64 file: a PDF by its pages, anything else as decoded text.
fn file_b64(
    rule: Rule,
    payload: &str,
    declared: Option<&str>,
    name: Option<&str>,
    bytes: usize,
) -> Media {
    let is_pdf = declared == Some("application/pdf")
        || payload.starts_with("JVBER")
        || name.is_some_and(|n| n.to_ascii_lowercase().ends_with(".pdf"));
    if !is_pdf {
        if let Some((t, _, _)) = image_size_b64(payload) {
            // An image sent as a file.
            return Media {
                media_type: Some(t.to_string()),
                ..image(rule, Some(payload), declared, bytes)
            };
        }
    }
    let (kind, pages, tokens) = if is_pdf {
        let p = pdf_pages_b64(payload);
        (Kind::Pdf, Some(p), u64::from(p) * rule.page_tokens())
    } else {
        (Kind::File, None, (payload.len() as u64 / 4 * 3).div_ceil(4))
    };
    Media {
        kind,
        rule,
        media_type: declared
            .map(str::to_string)
            .or_else(|| is_pdf.then(|| "application/pdf".to_string())),
        by_ref: None,
        size: None,
        pages,
        bytes: bytes as u64,
        tokens,
    }
}

/// A Gemini part holding binary content: `inlineData` (`mimeType`, base64
/// `data`) or `fileData` (`mimeType`, `fileUri`).
fn gemini_part<'a, O: Obj<'a>>(o: &O) -> Option<Media> {
    let kind_of = |mt: Option<&str>| match mt {
        Some(t) if t.starts_with("image/") => Kind::Image,
        Some("application/pdf") => Kind::Pdf,
        Some(t) if t.starts_with("text/") => Kind::Text,
        _ => Kind::File,
    };
    if let Some(d) = o.get("inlineData").and_then(|v| v.obj()) {
        let mt = d.str("mimeType");
        let data = d.str("data").unwrap_or_default();
        return Some(match kind_of(mt.as_deref()) {
            Kind::Image => image(Rule::Gemini, Some(&data), mt.as_deref(), data.len()),
            _ => file_b64(Rule::Gemini, &data, mt.as_deref(), None, data.len()),
        });
    }
    let f = o.get("fileData").and_then(|v| v.obj())?;
    let mt = f.str("mimeType");
    let n = f.str("fileUri").map_or(0, |u| u.len());
    Some(match kind_of(mt.as_deref()) {
        Kind::Text => text_doc(mt),
        k => Media {
            media_type: mt.map(Cow::into_owned),
            ..by_ref(k, Rule::Gemini, "file", n)
        },
    })
}

/// Push the binary part `o` is (true), or nothing (false: not binary).
fn classify<'a, O: Obj<'a>>(o: &O, depth: u8, out: &mut Vec<Media>) -> bool {
    if let Some(m) = gemini_part(o) {
        out.push(m);
        return true;
    }
    let Some(ty) = o.str("type") else {
        return false;
    };
    match &*ty {
        "image" => {
            let src = o.get("source").and_then(|s| s.obj());
            let stype = src.as_ref().and_then(|s| s.str("type"));
            out.push(match (stype.as_deref(), &src) {
                (Some("base64"), Some(s)) => {
                    let data = s.str("data");
                    let mt = s.str("media_type");
                    let n = data.as_ref().map_or(0, |d| d.len());
                    image(Rule::Anthropic, data.as_deref(), mt.as_deref(), n)
                }
                (Some("url"), Some(s)) => {
                    let n = s.str("url").map_or(0, |u| u.len());
                    by_ref(Kind::Image, Rule::Anthropic, "url", n)
                }
                _ => by_ref(Kind::Image, Rule::Anthropic, "file", 0),
            });
            true
        }
        "document" => {
            let src = o.get("source").and_then(|s| s.obj());
            let stype = src.as_ref().and_then(|s| s.str("type"));
            let title = o.str("title");
            let m = match (stype.as_deref(), &src) {
                (Some("base64"), Some(s)) => {
                    let data = s.str("data").unwrap_or_default();
                    let mt = s.str("media_type");
                    file_b64(
                        Rule::Anthropic,
                        &data,
                        mt.as_deref(),
                        title.as_deref(),
                        data.len(),
                    )
                }
                (Some("text"), Some(s)) => text_doc(s.str("media_type")),
                (Some("content"), Some(s)) => {
                    // Its text counts as text; images inside are parts of their own.
                    out.push(text_doc(None));
                    if let Some(c) = s.get("content") {
                        walk(&c, depth + 1, out);
                    }
                    return true;
                }
                (Some("url"), Some(s)) => {
                    let n = s.str("url").map_or(0, |u| u.len());
                    by_ref(Kind::Pdf, Rule::Anthropic, "url", n)
                }
                _ => by_ref(Kind::Pdf, Rule::Anthropic, "file", 0),
            };
            out.push(m);
            true
        }
        "image_url" | "input_image" => {
            // Chat: {"image_url": {"url", "detail"}}; Responses: {"image_url": "...", "detail"}.
            let nested = o.get("image_url").and_then(|v| v.obj());
            let (url, detail) = match &nested {
                Some(n) => (n.str("url"), detail_of(n.str("detail"))),
                None => (o.str("image_url"), detail_of(o.str("detail"))),
            };
            let rule = Rule::OpenAi(detail);
            out.push(match url.as_deref().map(|u| (u, data_url(u))) {
                Some((u, Some((mt, payload)))) => image(rule, Some(payload), mt, u.len()),
                Some((u, None)) => by_ref(Kind::Image, rule, "url", u.len()),
                None => by_ref(Kind::Image, rule, "file", 0),
            });
            true
        }
        "file" | "input_file" => {
            // Chat: {"file": {"file_data", "file_id", "filename"}}; Responses: flat.
            let nested = o.get("file").and_then(|v| v.obj());
            let (data, name, url) = match &nested {
                Some(n) => (n.str("file_data"), n.str("filename"), None),
                None => (o.str("file_data"), o.str("filename"), o.str("file_url")),
            };
            let rule = Rule::OpenAi(Detail::Auto);
            out.push(match (data.as_deref(), url.as_deref()) {
                (Some(d), _) => {
                    let (mt, payload) = data_url(d).unwrap_or((None, d));
                    file_b64(rule, payload, mt, name.as_deref(), d.len())
                }
                (None, Some(u)) => by_ref(Kind::Pdf, rule, "url", u.len()),
                (None, None) => by_ref(Kind::Pdf, rule, "file", 0),
            });
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{might_have_media, MEDIA_MARKS};

    proptest::proptest! {
        /// The one-scan test says what a search per mark said.
        #[test]
        fn might_have_media_is_any_mark_contained(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "\"", "image", "document", "input_image", "input_file", "file", "inlineData",
                "fileData", "\\\"", ":", "{", "}", "x", "é", "\"type\":",
            ]), 0..16)
        ) {
            let raw = pieces.concat();
            let by_find = MEDIA_MARKS.iter().any(|m| raw.contains(m));
            proptest::prop_assert_eq!(might_have_media(&raw), by_find, "{:?}", raw);
        }
    }
}
