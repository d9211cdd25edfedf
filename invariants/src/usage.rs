//! Usage parsing: each dialect's collector reads arbitrary SSE or JSON
//! without panicking; the tap, fed the same answer split anywhere, gathers
//! exactly what the collector gathers from the whole answer; the rows it
//! hands the ledger are JSON objects, and the assistant's messages where the
//! collector puts them together (Anthropic, streamed Chat).

use oceancode_proxy::dialect::{self, Collected};
use oceancode_proxy::sse::SseParser;
use oceancode_proxy::tap::Framing;
use oceancode_window::{Dialect, RowKind};
use serde_json::Value;

/// Input: `[flags, n, n × u16 split points, answer]`; flag bit 0 picks JSON
/// over SSE, bits 1–2 the dialect.
pub fn check(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let json = flags & 1 == 1;
    let d = dialect_of(flags >> 1);
    let (cuts, answer) = crate::cuts_and_payload(rest);
    let mut c = dialect::collector(d);
    if json {
        c.on_json(answer);
    } else {
        let mut p = SseParser::new();
        let emit = &mut |e: oceancode_proxy::sse::SseEvent| c.on_event(&e.event, &e.data);
        p.feed(answer, emit);
        p.finish(emit);
    }
    let direct = c.finish();
    let framing = if json { Framing::Json } else { Framing::Sse };
    let tapped = crate::decode::collected_through_tap(&crate::split_at(answer, &cuts), framing, d);
    assert_eq!(
        tapped, direct,
        "the tap in any split reads what the collector reads"
    );
    well_formed(d, json, &direct);
}

fn well_formed(d: Dialect, json: bool, c: &Collected) {
    for row in &c.rows {
        let v: Value = serde_json::from_str(row).expect("a collected row is JSON");
        assert!(v.is_object(), "a collected row is an object: {row}");
        let info = dialect::classify(d, &v);
        // Chat's JSON answer is recorded as the upstream wrote its message;
        // Anthropic's and every streamed one are put together here.
        let assembled = d == Dialect::Anthropic || (d == Dialect::OpenaiChat && !json);
        if assembled {
            assert_eq!(info.role, "assistant", "{row}");
            assert_eq!(info.kind, RowKind::Assistant, "{row}");
        }
    }
}

/// The dialect picked by two bits.
pub(crate) fn dialect_of(bits: u8) -> Dialect {
    match bits % 3 {
        0 => Dialect::Anthropic,
        1 => Dialect::OpenaiChat,
        _ => Dialect::OpenaiResponses,
    }
}
