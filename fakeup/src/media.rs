//! What the providers charge for images and documents, as the fake's usage
//! counts them: the whole payload is decoded (as a provider does), the image's
//! size read from it, and the documented rule applied.
//!
//! - Anthropic `image`: scaled (aspect kept) until the long edge is at most
//!   1568 px and it is at most 1568 visual tokens, then one token per 28×28
//!   patch.
//! - OpenAI `image_url` / `input_image`: `low` = 85; otherwise fit in
//!   2048×2048, shortest side down to 768, 170 per 512-px tile + 85.
//! - An image the fake cannot see (URL, file id, undecodable) is priced as a
//!   1024×768 one.
//! - A PDF (`document`, `file`, `input_file`): 2,300 tokens per `/Type /Page`
//!   object. Any other base64 file: its decoded bytes / 4.

use base64::Engine as _;

use crate::ordered::Ov;

/// Tokens per PDF page (its text and its page image).
pub(crate) const PDF_PAGE: u64 = 2_300;
/// What an image the fake cannot see is taken to be.
const UNSEEN: (u32, u32) = (1024, 768);

/// The tokens of a binary block, or None when `o` is not one.
pub(crate) fn tokens(o: &Ov) -> Option<u64> {
    let ty = str_at(o, &["type"])?;
    match ty {
        "image" => Some(anthropic_image(size_of(payload_b64(o.get("source")?)))),
        "document" => {
            let src = o.get("source")?;
            match str_at(src, &["type"]) {
                // Text documents are text: counted with the rest of the message.
                Some("text" | "content") => None,
                _ => Some(file_tokens(payload_b64(src))),
            }
        }
        "image_url" | "input_image" => {
            let (url, detail) = match o.get("image_url") {
                Some(nested @ Ov::Obj(_)) => {
                    (str_at(nested, &["url"]), str_at(nested, &["detail"]))
                }
                _ => (str_at(o, &["image_url"]), str_at(o, &["detail"])),
            };
            let bytes = url.and_then(data_url).and_then(decode);
            Some(openai_image(size_of(bytes), detail == Some("low")))
        }
        "file" | "input_file" => {
            let data = str_at(o, &["file", "file_data"]).or_else(|| str_at(o, &["file_data"]));
            Some(file_tokens(
                data.map(|d| data_url(d).unwrap_or(d)).and_then(decode),
            ))
        }
        _ => None,
    }
}

fn str_at<'a>(mut v: &'a Ov, path: &[&str]) -> Option<&'a str> {
    for k in path {
        v = v.get(k)?;
    }
    match v {
        Ov::Str(s) => Some(s),
        _ => None,
    }
}

/// The decoded bytes of an Anthropic `source` of type `base64`.
fn payload_b64(src: &Ov) -> Option<Vec<u8>> {
    (str_at(src, &["type"]) == Some("base64"))
        .then(|| str_at(src, &["data"]))
        .flatten()
        .and_then(decode)
}

fn data_url(url: &str) -> Option<&str> {
    let (head, payload) = url.strip_prefix("data:")?.split_once(',')?;
    head.ends_with(";base64").then_some(payload)
}

fn decode(b64: &str) -> Option<Vec<u8>> {
    let clean: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(clean).ok()
}

fn size_of(bytes: Option<Vec<u8>>) -> (u32, u32) {
    bytes
        .and_then(|b| imagesize::blob_size(&b).ok())
        .and_then(|s| Some((u32::try_from(s.width).ok()?, u32::try_from(s.height).ok()?)))
        .filter(|&(w, h)| w > 0 && h > 0)
        .unwrap_or(UNSEEN)
}

/// Anthropic: shrink the long edge a pixel at a time until the patches fit.
pub(crate) fn anthropic_image((w, h): (u32, u32)) -> u64 {
    let patches = |w: u64, h: u64| w.div_ceil(28) * h.div_ceil(28);
    let (w, h) = (u64::from(w), u64::from(h));
    let (long, short) = (w.max(h), w.min(h));
    let mut edge = long.min(1568);
    let other = |edge: u64| (short * edge / long).max(1);
    while edge > 1 && patches(edge, other(edge)) > 1568 {
        edge -= 1;
    }
    patches(edge, other(edge))
}

/// OpenAI (gpt-4o class) tiles.
pub(crate) fn openai_image((w, h): (u32, u32), low: bool) -> u64 {
    if low {
        return 85;
    }
    let (mut w, mut h) = (f64::from(w), f64::from(h));
    let fit = 2048.0 / w.max(h);
    if fit < 1.0 {
        w *= fit;
        h *= fit;
    }
    let short = 768.0 / w.min(h);
    if short < 1.0 {
        w *= short;
        h *= short;
    }
    85 + 170 * ((w / 512.0).ceil() * (h / 512.0).ceil()) as u64
}

fn file_tokens(bytes: Option<Vec<u8>>) -> u64 {
    let Some(b) = bytes else {
        return PDF_PAGE;
    };
    if b.starts_with(b"%PDF") {
        let pages = count(&b, b"/Type /Page") + count(&b, b"/Type/Page")
            - count(&b, b"/Type /Pages")
            - count(&b, b"/Type/Pages");
        return pages.max(1) * PDF_PAGE;
    }
    if imagesize::blob_size(&b).is_ok() {
        return anthropic_image(size_of(Some(b)));
    }
    (b.len() as u64).div_ceil(4)
}

fn count(hay: &[u8], needle: &[u8]) -> u64 {
    hay.windows(needle.len()).filter(|w| *w == needle).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_examples() {
        // Anthropic: within the limits, ⌈w/28⌉·⌈h/28⌉.
        assert_eq!(anthropic_image((200, 200)), 64);
        assert_eq!(anthropic_image((1092, 1092)), 39 * 39);
        // Large images are scaled to at most 1568 tokens.
        let big = anthropic_image((3840, 2160));
        assert!((1500..=1568).contains(&big), "{big}");
        // OpenAI's documented examples.
        assert_eq!(openai_image((1024, 1024), false), 765);
        assert_eq!(openai_image((2048, 4096), false), 1105);
        assert_eq!(openai_image((4096, 8192), true), 85);
    }
}
