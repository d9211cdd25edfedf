//! What a context-limit failure teaches a session, and whether the one
//! retry after it could send less ([`SessionManager::too_long`] cuts).

use super::step::Ticket;
use super::SessionManager;
use crate::overflow::ContextLimit;

impl SessionManager {
    /// A retry of this step could leave rows out: something before the
    /// step's own rows is still in the window (a closed block, or the open
    /// block's rows up to the boundary). Cheap; decides whether a stream's
    /// opening is worth holding back.
    pub fn can_cut(&self, ticket: &Ticket) -> bool {
        if !self.settings.tideline_enabled {
            return false;
        }
        let st = ticket.session.state.lock();
        let t = &st.tideline;
        ticket.boundary > t.cut_upto()
            && (t
                .closed_blocks()
                .first()
                .is_some_and(|b| b.last_seq <= ticket.boundary)
                || t.open_block().first_seq <= ticket.boundary)
    }

    /// Learn from a context-limit error what the next requests must respect:
    /// a limit that counts `max_tokens` makes the line leave room for the
    /// whole of it. (The ceiling itself is learned by [`SessionManager::too_long`].)
    pub fn learn_limit(&self, ticket: &Ticket, limit: ContextLimit) {
        if limit.counts_max_tokens {
            ticket.session.state.lock().reserves_max_tokens = true;
        }
    }
}
