//! The CUI adapter: every message passes through as it is, one event each.
//!
//! CUI frontends understand the typed messages themselves, so nothing is converted or dropped: built-in
//! types, custom types and lifecycle events alike. Each event carries the message's stamped
//! `metadata.sequence` as its id (SSE writes it as `id:`, which a browser's `EventSource` sends back as
//! `Last-Event-ID` to resume); a message that was never stamped (outside a stream) has no id. The end of the stream is a
//! message too (`stream_end`, added by the stream), so [`Adapter::finish`] adds nothing. An interruption
//! (a subscriber whose history is gone) is an `error` message without an id.

use super::{Adapter, Frame};
use crate::output::{ErrorProps, Outcome, OutputMessage};

/// Renders messages as CUI SSE events.
///
/// ```
/// use agentmux::adapter::{Adapter, CuiAdapter, Payload};
/// use agentmux::output::{Metadata, OutputMessage};
///
/// let mut message = OutputMessage::text("hi");
/// message.metadata = Some(Metadata { sequence: Some(7), ..Default::default() });
/// let mut frames = Vec::new();
/// CuiAdapter.push(&message, &mut frames);
/// assert_eq!(frames[0].id, Some(7));
/// let Payload::Json(json) = &frames[0].payload else { panic!("a JSON event") };
/// assert_eq!(&json[..], br#"{"type":"text","props":{"content":"hi"},"metadata":{"sequence":7}}"#);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CuiAdapter;

impl Adapter for CuiAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) {
        frames.push(Frame::json(message.sequence(), message));
    }

    fn finish(&mut self, _outcome: &Outcome, _frames: &mut Vec<Frame>) {}

    /// An `error` message without an id: it is not part of the log, so a client must not resume from it.
    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        frames.push(Frame::json(None, &OutputMessage::builtin(error.clone())));
    }
}
