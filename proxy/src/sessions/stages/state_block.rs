//! The state block's stage (`ledger.state`): the block follows the stub's
//! text in the same part (every dialect takes it, and the stub's first line
//! keeps its wording).

use super::{Draft, SessionMetrics, State, Window, WindowStage};

/// The state block after the stub.
pub(super) struct StateBlock;

impl WindowStage for StateBlock {
    fn name(&self) -> &'static str {
        "state block"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        let (Some(cut), Some(stub)) = (&d.cut, d.stub.as_mut()) else {
            return;
        };
        let st = d.st;
        let block = d
            .settings
            .state_tokens
            .and_then(|max| crate::sessions::thread::block(st, &cut.plan, &cut.dir, max));
        d.window.state_tokens = block.as_ref().map_or(0, |b| {
            stub.push_str("\n\n");
            stub.push_str(b);
            (b.len() as f64 / st.bytes_per_token).ceil() as u64
        });
    }

    fn record(&self, st: &mut State, w: &mut Window, cut: bool) {
        if cut && w.state_tokens > 0 {
            tracing::debug!(session = %st.meta.id, upto = w.upto, state_tokens = w.state_tokens, "the cut window carries the state block after its stub");
        }
    }

    fn meter(&self, st: &mut State, w: &Window, _m: &SessionMetrics) {
        st.meter.state_tokens = w.state_tokens;
    }
}
