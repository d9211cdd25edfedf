//! Small real images and documents made on the fly, for tests and
//! benchmarks: a decodable PNG of any size and weight, JPEG / GIF / WebP files
//! whose headers are what real encoders write (the pixel data is not
//! decodable), and a PDF with N pages. No binary fixtures needed.

use base64::Engine as _;
use flate2::write::ZlibEncoder;
use flate2::{Compression, Crc};
use std::io::Write as _;

/// A decodable 8-bit RGB PNG of `w`×`h` whose file is about `bytes` long
/// (at least what the image compresses to): a band of noise on a flat
/// background.
pub fn png(w: u32, h: u32, bytes: usize) -> Vec<u8> {
    let row = 1 + 3 * w as usize;
    let raw_len = row * h as usize;
    let noise = bytes.min(raw_len);
    let mut raw = vec![0u8; raw_len];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(w) << 20 ^ u64::from(h);
    for (i, b) in raw.iter_mut().enumerate() {
        if i % row == 0 {
            continue; // filter byte: none
        }
        *b = if i < noise {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        } else {
            0xE0
        };
    }
    let mut z = ZlibEncoder::new(Vec::new(), Compression::fast());
    let _ = z.write_all(&raw);
    let idat = z.finish().unwrap_or_default();
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no filter, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, ty: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(ty);
    out.extend_from_slice(data);
    let mut crc = Crc::new();
    crc.update(ty);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
}

/// A baseline JPEG header of `w`×`h` (JFIF, then `exif` bytes of APP1
/// segments before the frame header, as a camera writes them), then
/// `payload` bytes of scan data and EOI.
pub fn jpeg(w: u16, h: u16, exif: usize, payload: usize) -> Vec<u8> {
    let mut out = vec![0xFF, 0xD8];
    out.extend_from_slice(&[0xFF, 0xE0, 0, 16]);
    out.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
    let mut left = exif;
    while left > 0 {
        let n = left.min(65_533);
        out.extend_from_slice(&[0xFF, 0xE1]);
        out.extend_from_slice(&((n + 2) as u16).to_be_bytes());
        out.extend((0..n).map(|i| (i % 251) as u8));
        left -= n;
    }
    out.extend_from_slice(&[0xFF, 0xC0, 0, 17, 8]);
    out.extend_from_slice(&h.to_be_bytes());
    out.extend_from_slice(&w.to_be_bytes());
    out.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    out.extend_from_slice(&[0xFF, 0xDA, 0, 12, 3, 1, 0, 2, 0x11, 3, 0x11, 0, 0x3F, 0]);
    out.extend((0..payload).map(|i| (i % 200) as u8 + 1));
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

/// A GIF89a of `w`×`h` (one frame, one colour).
pub fn gif(w: u16, h: u16) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&h.to_le_bytes());
    out.extend_from_slice(&[0x80, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF]);
    out.extend_from_slice(&[0x2C, 0, 0, 0, 0]);
    out.extend_from_slice(&w.to_le_bytes());
    out.extend_from_slice(&h.to_le_bytes());
    out.extend_from_slice(&[0, 2, 2, 0x44, 0x01, 0, 0x3B]);
    out
}

/// WebP container flavours.
#[derive(Clone, Copy, Debug)]
pub enum WebP {
    /// Lossy (`VP8 `).
    Lossy,
    /// Lossless (`VP8L`).
    Lossless,
    /// Extended (`VP8X`, as written with alpha or animation).
    Extended,
}

/// A WebP of `w`×`h` (dimensions up to 16383; 16M for `Extended`).
pub fn webp(kind: WebP, w: u32, h: u32) -> Vec<u8> {
    let mut body = b"WEBP".to_vec();
    match kind {
        WebP::Lossy => {
            body.extend_from_slice(b"VP8 ");
            body.extend_from_slice(&18u32.to_le_bytes());
            body.extend_from_slice(&[0x30, 0x01, 0x00, 0x9D, 0x01, 0x2A]);
            body.extend_from_slice(&((w & 0x3FFF) as u16).to_le_bytes());
            body.extend_from_slice(&((h & 0x3FFF) as u16).to_le_bytes());
            body.extend_from_slice(&[0; 8]);
        }
        WebP::Lossless => {
            body.extend_from_slice(b"VP8L");
            body.extend_from_slice(&5u32.to_le_bytes());
            let bits = ((w - 1) & 0x3FFF) | (((h - 1) & 0x3FFF) << 14);
            body.push(0x2F);
            body.extend_from_slice(&bits.to_le_bytes());
            body.push(0);
        }
        WebP::Extended => {
            body.extend_from_slice(b"VP8X");
            body.extend_from_slice(&10u32.to_le_bytes());
            body.extend_from_slice(&[0x10, 0, 0, 0]);
            body.extend_from_slice(&(w - 1).to_le_bytes()[..3]);
            body.extend_from_slice(&(h - 1).to_le_bytes()[..3]);
        }
    }
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A PDF with `pages` pages of one line of text each (uncompressed objects).
pub fn pdf(pages: u32) -> Vec<u8> {
    let mut s = String::from("%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n");
    let kids: Vec<String> = (0..pages).map(|i| format!("{} 0 R", 3 + i)).collect();
    s.push_str(&format!(
        "2 0 obj << /Type /Pages /Kids [{}] /Count {pages} >> endobj\n",
        kids.join(" ")
    ));
    for i in 0..pages {
        s.push_str(&format!(
            "{} 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >> endobj\n% page {} text: the quick brown fox\n",
            3 + i,
            i + 1
        ));
    }
    s.push_str("trailer << /Root 1 0 R >>\n%%EOF\n");
    s.into_bytes()
}

/// Standard base64 (what clients put in `data` / data URLs).
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
