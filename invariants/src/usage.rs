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

/// Input: `[flags, limit, n, n × u16 split points, answer]`; flag bit 0
/// picks JSON over SSE, bits 1–2 the dialect; `limit` bounds what the tap
/// and the collector keep (0: the default, else `limit × 16` bytes).
pub fn check(data: &[u8]) {
    let [flags, l, rest @ ..] = data else {
        return;
    };
    let json = flags & 1 == 1;
    let d = dialect_of(flags >> 1);
    let max = if *l == 0 {
        dialect::DEFAULT_KEEP
    } else {
        usize::from(*l) * 16
    };
    let (cuts, answer) = crate::cuts_and_payload(rest);
    // The collector reads the whole answer; an event too long to keep is
    // dropped, and the collector told so, before the next one.
    let mut c = dialect::collector_keeping(d, max);
    if json {
        if answer.len() > max {
            c.truncated();
        } else {
            c.on_json(answer);
        }
    } else {
        let mut p = SseParser::with_limit(max);
        for b in answer.chunks(1) {
            p.feed(b, &mut |e| c.on_event(&e.event, &e.data));
            if p.take_dropped() > 0 {
                c.truncated();
            }
        }
        p.finish(&mut |e| c.on_event(&e.event, &e.data));
        if p.take_dropped() > 0 {
            c.truncated();
        }
    }
    let direct = c.finish();
    let framing = if json { Framing::Json } else { Framing::Sse };
    let tapped =
        crate::decode::collected_through_tap(&crate::split_at(answer, &cuts), framing, d, max);
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
