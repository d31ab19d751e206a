//! The CUI adapter: every message passes through as it is, one SSE event each.
//!
//! CUI frontends understand the typed messages themselves, so nothing is converted or dropped: built-in
//! types, custom types and lifecycle events alike. Each event carries `id: <sequence>` from the message's
//! stamped `metadata.sequence`, which is what a browser's `EventSource` sends back as `Last-Event-ID` to
//! resume; a message that was never stamped (outside a stream) has no `id:` line. The end of the stream is a
//! message too (`stream_end`, added by the stream), so [`Adapter::finish`] adds nothing. An interruption
//! (a subscriber that lagged) is an `error` message without an `id:` line.

use bytes::Bytes;

use super::{Adapter, sse};
use crate::output::{ErrorProps, Outcome, OutputMessage};

/// Renders messages as CUI SSE events.
///
/// ```
/// use agentmux::adapter::{Adapter, CuiAdapter};
/// use agentmux::output::{Metadata, OutputMessage};
///
/// let mut message = OutputMessage::text("hi");
/// message.metadata = Some(Metadata { sequence: Some(7), ..Default::default() });
/// let mut frames = Vec::new();
/// CuiAdapter.push(&message, &mut frames);
/// assert_eq!(&frames[0][..], b"id: 7\ndata: {\"type\":\"text\",\"props\":{\"content\":\"hi\"},\"metadata\":{\"sequence\":7}}\n\n");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CuiAdapter;

impl Adapter for CuiAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Bytes>) {
        frames.push(sse::event(message.sequence(), message));
    }

    fn finish(&mut self, _outcome: &Outcome, _frames: &mut Vec<Bytes>) {}

    /// An `error` message without an `id:` line: it is not part of the log, so a client must not resume
    /// from it.
    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Bytes>) {
        frames.push(sse::event(None, &OutputMessage::builtin(error.clone())));
    }
}
