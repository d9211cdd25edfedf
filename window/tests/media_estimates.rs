//! Images and documents are estimated by what the provider charges, not by
//! their bytes: sizes read from real headers (PNG, JPEG, GIF, WebP) of several
//! sizes, the providers' formulas, every place a binary part can sit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::images::{self, WebP};
use oceancode_window::media::{self, Detail, Kind, Rule};
use proptest::prelude::*;
use serde_json::json;

fn anthropic_image_block(bytes: &[u8], media_type: &str) -> serde_json::Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": images::b64(bytes)}})
}

#[test]
fn sizes_are_read_from_every_header_kind() {
    let cases: Vec<(Vec<u8>, &str, u32, u32)> = vec![
        (images::png(1, 1, 0), "image/png", 1, 1),
        (images::png(640, 480, 2_000), "image/png", 640, 480),
        (images::png(1920, 1080, 50_000), "image/png", 1920, 1080),
        (images::jpeg(800, 600, 0, 100), "image/jpeg", 800, 600),
        // The frame header far behind camera metadata: found by seeking.
        (
            images::jpeg(4032, 3024, 150_000, 100),
            "image/jpeg",
            4032,
            3024,
        ),
        (images::gif(320, 200), "image/gif", 320, 200),
        (
            images::webp(WebP::Lossy, 1024, 768),
            "image/webp",
            1024,
            768,
        ),
        (
            images::webp(WebP::Lossless, 300, 3000),
            "image/webp",
            300,
            3000,
        ),
        (
            images::webp(WebP::Extended, 5000, 2000),
            "image/webp",
            5000,
            2000,
        ),
    ];
    for (bytes, ty, w, h) in cases {
        assert_eq!(media::image_size(&bytes), Some((ty, w, h)), "{ty} {w}x{h}");
        let b64 = images::b64(&bytes);
        assert_eq!(
            media::image_size_b64(&b64),
            Some((ty, w, h)),
            "{ty} {w}x{h} (base64)"
        );
        // MIME-wrapped base64 (76 columns) reads the same.
        let wrapped: String = b64
            .as_bytes()
            .chunks(76)
            .map(|c| format!("{}\r\n", String::from_utf8_lossy(c)))
            .collect();
        assert_eq!(media::image_size_b64(&wrapped), Some((ty, w, h)));
    }
    assert_eq!(media::image_size_b64("bm90IGFuIGltYWdl"), None);
    assert_eq!(media::image_size_b64("%%%not base64%%%"), None);
}

#[test]
fn anthropic_formula_matches_the_documented_examples() {
    // Within the limits: one token per 28×28 patch.
    assert_eq!(media::anthropic_image_tokens(200, 200), 64);
    assert_eq!(media::anthropic_image_tokens(1000, 1000), 36 * 36);
    // The docs' largest 1:1 size that is not resized.
    assert_eq!(media::anthropic_fit(1092, 1092), (1092, 1092));
    assert_eq!(media::anthropic_image_tokens(1092, 1092), 39 * 39);
    // Larger images are scaled down to the cap, never past it.
    for (w, h) in [
        (1920, 1080),
        (3840, 2160),
        (8000, 8000),
        (1568, 20),
        (20, 8000),
    ] {
        let t = media::anthropic_image_tokens(w, h);
        assert!(t <= media::ANTHROPIC_MAX_TOKENS, "{w}x{h}: {t}");
    }
    assert!(media::anthropic_image_tokens(3840, 2160) >= 1_500);
    // The older docs' w·h/750 agrees within a few percent at the docs' sizes.
    for (w, h) in [(1000u32, 1000u32), (1092, 1092), (951, 1268), (896, 1344)] {
        let patch = media::anthropic_image_tokens(w, h) as f64;
        let old = f64::from(w * h) / 750.0;
        assert!(
            (patch / old - 1.0).abs() < 0.06,
            "{w}x{h}: {patch} vs {old}"
        );
    }
}

#[test]
fn openai_formula_matches_the_documented_examples() {
    assert_eq!(media::openai_image_tokens(1024, 1024, Detail::High), 765);
    assert_eq!(media::openai_image_tokens(2048, 4096, Detail::High), 1105);
    assert_eq!(media::openai_image_tokens(4096, 8192, Detail::Low), 85);
    assert_eq!(media::openai_image_tokens(512, 512, Detail::Auto), 255);
    assert_eq!(
        media::openai_image_tokens(2048, 768, Detail::High),
        media::OPENAI_MAX_TOKENS
    );
}

proptest! {
    #[test]
    fn anthropic_fit_keeps_the_limits_and_the_aspect(w in 1u32..9000, h in 1u32..9000) {
        let (fw, fh) = media::anthropic_fit(w, h);
        prop_assert!(fw <= w && fh <= h, "never scaled up");
        prop_assert!(fw.max(fh) <= media::ANTHROPIC_MAX_EDGE);
        let t = media::anthropic_image_tokens(w, h);
        prop_assert!((1..=media::ANTHROPIC_MAX_TOKENS).contains(&t));
        if (fw, fh) != (w, h) && fw > 28 && fh > 28 {
            let (a, b) = (f64::from(w) / f64::from(h), f64::from(fw) / f64::from(fh));
            prop_assert!((a / b - 1.0).abs() < 0.05, "aspect {a} -> {b}");
        }
        if w <= 1092 && h <= 1092 {
            prop_assert_eq!((fw, fh), (w, h), "small images are not resized");
        }
    }

    #[test]
    fn openai_tokens_are_bounded(w in 1u32..9000, h in 1u32..9000) {
        let t = media::openai_image_tokens(w, h, Detail::High);
        prop_assert!((255..=media::OPENAI_MAX_TOKENS).contains(&t));
        prop_assert_eq!(media::openai_image_tokens(w, h, Detail::Low), 85);
    }


    #[test]
    fn jpeg_sizes_are_found_behind_any_metadata(w in 1u16..9000, h in 1u16..9000, exif in 0usize..200_000) {
        let b64 = images::b64(&images::jpeg(w, h, exif, 10));
        prop_assert_eq!(media::image_size_b64(&b64), Some(("image/jpeg", u32::from(w), u32::from(h))));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn png_sizes_round_trip_through_base64(w in 1u32..2500, h in 1u32..2500) {
        let b64 = images::b64(&images::png(w, h, 0));
        prop_assert_eq!(media::image_size_b64(&b64), Some(("image/png", w, h)));
    }
}

#[test]
fn only_the_header_is_decoded() {
    // What follows the header's 4 KB of base64 is never decoded: garbage
    // there changes nothing.
    let mut b64 = images::b64(&images::png(1280, 800, 10_000));
    b64.truncate(4096);
    b64.push_str(&"!".repeat(2_000_000));
    assert_eq!(media::image_size_b64(&b64), Some(("image/png", 1280, 800)));
    // A JPEG's frame header behind 60 KB of metadata (one segment): the
    // metadata is skipped, not decoded.
    let jpg = images::b64(&images::jpeg(3000, 2000, 60_000, 0));
    let (head, rest) = jpg.split_at(4096);
    let sof = 4 * ((60_000 + 24) / 3) - 4096; // where the frame header starts (base64 chars)
    let mut spoiled: String = head.to_string();
    spoiled.push_str(&"!".repeat(sof - 8_000));
    spoiled.push_str(&rest[sof - 8_000..]);
    assert_eq!(spoiled.len(), jpg.len());
    assert_eq!(
        media::image_size_b64(&spoiled),
        Some(("image/jpeg", 3000, 2000))
    );
}

#[test]
fn a_screenshot_costs_its_formula_not_its_bytes() {
    // About 1 MB of PNG, 1.3 MB of base64.
    let png = images::png(1920, 1080, 1_000_000);
    assert!(png.len() > 900_000, "{}", png.len());
    let row = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "Screenshot taken."},
            anthropic_image_block(&png, "image/png"),
        ]},
    ]})
    .to_string();
    let found = media::scan(&row);
    assert_eq!(found.len(), 1);
    let m = &found[0];
    assert_eq!((m.kind, m.rule), (Kind::Image, Rule::Anthropic));
    assert_eq!(m.size, Some((1920, 1080)));
    assert_eq!(m.media_type.as_deref(), Some("image/png"));
    assert_eq!(m.tokens, media::anthropic_image_tokens(1920, 1080));
    assert_eq!(m.bytes, images::b64(&png).len() as u64);
    let cost = media::cost(&row);
    // The row: ~1,560 tokens of image and a few of text, not 450k.
    let est = media::row_tokens(row.len(), cost, 3.0);
    assert!((1_500..1_700).contains(&est), "{est}");
    assert!(u64::from(est) < row.len() as u64 / 300);
    assert_eq!(m.facts(), format!("1920×1080 · ~{} tokens", m.tokens));
}

#[test]
fn every_shape_and_place_is_found() {
    let png = images::png(1024, 1024, 0);
    let jpg = images::jpeg(1600, 1200, 20_000, 50);
    let data_png = format!("data:image/png;base64,{}", images::b64(&png));
    let data_jpg = format!("data:image/jpeg;base64,{}", images::b64(&jpg));
    let pdf = images::pdf(3);
    let data_pdf = format!("data:application/pdf;base64,{}", images::b64(&pdf));
    let cases: Vec<(serde_json::Value, Vec<(Kind, u64)>)> = vec![
        // Anthropic: a user image, a URL image, a PDF, a text document.
        (
            json!({"role":"user","content":[{"type":"text","text":"look"},anthropic_image_block(&png,"image/png")]}),
            vec![(Kind::Image, 37 * 37)],
        ),
        (
            json!({"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}),
            vec![(Kind::Image, media::ANTHROPIC_MAX_TOKENS)],
        ),
        (
            json!({"role":"user","content":[{"type":"document","title":"r.pdf","source":{"type":"base64","media_type":"application/pdf","data":images::b64(&pdf)}}]}),
            vec![(Kind::Pdf, 3 * media::PDF_PAGE_TOKENS)],
        ),
        (
            json!({"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain words"}}]}),
            vec![(Kind::Text, 0)],
        ),
        // A document made of content blocks: its image is a part of its own.
        (
            json!({"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","text":"t"},anthropic_image_block(&png,"image/png")]}}]}),
            vec![(Kind::Text, 0), (Kind::Image, 37 * 37)],
        ),
        // Chat: data URL images at both details, a PDF file.
        (
            json!({"role":"user","content":[{"type":"image_url","image_url":{"url":data_png,"detail":"low"}},{"type":"image_url","image_url":{"url":data_jpg}}]}),
            vec![
                (Kind::Image, 85),
                (
                    Kind::Image,
                    media::openai_image_tokens(1600, 1200, Detail::Auto),
                ),
            ],
        ),
        (
            json!({"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/x.jpg","detail":"high"}}]}),
            vec![(Kind::Image, media::OPENAI_MAX_TOKENS)],
        ),
        (
            json!({"role":"user","content":[{"type":"file","file":{"filename":"r.pdf","file_data":data_pdf}}]}),
            vec![(Kind::Pdf, 3 * media::PDF_PAGE_TOKENS)],
        ),
        // Responses: a message, a tool output list, a file.
        (
            json!({"type":"message","role":"user","content":[{"type":"input_image","image_url":data_png,"detail":"high"}]}),
            vec![(Kind::Image, 765)],
        ),
        (
            json!({"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"shot"},{"type":"input_image","image_url":data_png}]}),
            vec![(Kind::Image, 765)],
        ),
        (
            json!({"type":"message","role":"user","content":[{"type":"input_file","filename":"r.pdf","file_data":data_pdf}]}),
            vec![(Kind::Pdf, 3 * media::PDF_PAGE_TOKENS)],
        ),
        (
            json!({"type":"message","role":"user","content":[{"type":"input_image","file_id":"file-abc","detail":"low"}]}),
            vec![(Kind::Image, 85)],
        ),
    ];
    for (row, want) in cases {
        let raw = row.to_string();
        let got: Vec<(Kind, u64)> = media::scan(&raw)
            .iter()
            .map(|m| (m.kind, m.tokens))
            .collect();
        assert_eq!(got, want, "{}", &raw[..raw.len().min(200)]);
    }
    // Text rows (and a tool input that merely mentions images) cost nothing.
    for raw in [
        r#"{"role":"user","content":"hello"}"#,
        r#"{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"Write","input":{"content":[{"type":"image","source":{"type":"base64","data":"iVBORw0KGgo="}}]}}]}"#,
        r#"{"type":"function_call","name":"x","arguments":"{\"file\":\"image.png\"}"}"#,
    ] {
        assert_eq!(media::cost(raw), media::Cost::default(), "{raw}");
    }
}

#[test]
fn pdf_pages_are_counted_across_chunks() {
    for pages in [1, 2, 7, 40, 600] {
        let pdf = images::pdf(pages);
        assert_eq!(media::pdf_pages(&pdf), pages);
        assert_eq!(
            media::pdf_pages_b64(&images::b64(&pdf)),
            pages,
            "{pages} pages"
        );
    }
    // Page objects in compressed object streams: by size, at least one page.
    assert_eq!(media::pdf_pages(b"%PDF-1.7 compressed"), 1);
}

#[test]
fn the_text_ratio_leaves_binary_parts_out() {
    let cost = media::Cost {
        bytes: 1_300_000,
        tokens: 1_568,
    };
    // 60 KB of text that is 20k tokens, plus the image.
    let r = media::text_bytes_per_token(1_360_000, 21_568, cost).unwrap();
    assert!((r - 3.0).abs() < 1e-9, "{r}");
    assert_eq!(media::text_bytes_per_token(1_000, 100, cost), None);
    assert_eq!(
        media::text_bytes_per_token(3_000, 1_000, media::Cost::default()),
        Some(3.0)
    );
}

/// Gemini (`inlineData` / `fileData` parts, in a content's `parts` or a
/// `functionResponse`'s): 258 tokens for an image within 384×384, else 258
/// per 768×768 tile; 258 per PDF page; a file by reference by its kind.
#[test]
fn gemini_parts_cost_their_tiles_and_pages() {
    assert_eq!(media::gemini_image_tokens(384, 300), 258);
    assert_eq!(media::gemini_image_tokens(385, 100), 258);
    assert_eq!(media::gemini_image_tokens(1600, 900), 258 * 3 * 2);
    assert_eq!(media::gemini_image_tokens(768, 768), 258);
    let png = images::png(1920, 1080, 5_000);
    let pdf = images::pdf(7);
    let content = json!({"role": "user", "parts": [
        {"text": "what is on these?"},
        {"inlineData": {"mimeType": "image/png", "data": images::b64(&png)}},
        {"inlineData": {"mimeType": "application/pdf", "data": images::b64(&pdf)}},
        {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc"}},
        {"functionResponse": {"name": "shot", "response": {"ok": true}, "parts": [
            {"inlineData": {"mimeType": "image/png", "data": images::b64(&images::png(200, 100, 0))}}
        ]}}
    ]});
    let found = media::scan(&content.to_string());
    let got: Vec<(Kind, Rule, u64)> = found.iter().map(|m| (m.kind, m.rule, m.tokens)).collect();
    assert_eq!(
        got,
        vec![
            (Kind::Image, Rule::Gemini, 258 * 3 * 2),
            (Kind::Pdf, Rule::Gemini, 7 * 258),
            (Kind::Image, Rule::Gemini, media::GEMINI_UNKNOWN_TOKENS),
            (Kind::Image, Rule::Gemini, 258),
        ]
    );
    assert_eq!(found[0].size, Some((1920, 1080)));
    assert_eq!(found[1].pages, Some(7));
}
