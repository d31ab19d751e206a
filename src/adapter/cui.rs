//! The CUI adapter: every message passes through as it is, one event each.
//!
//! CUI frontends understand the typed messages themselves, so nothing is converted or dropped: built-in
//! types, custom types and lifecycle events alike. Each event carries the message's stamped
//! `metadata.sequence` as its id (SSE writes it as `id:`, which a browser's `EventSource` sends back as
//! `Last-Event-ID` to resume); a message that was never stamped (outside a stream) has no id. The end of the stream is a
//! message too (`stream_end`, added by the stream), so [`Adapter::finish`] adds nothing. An interruption
//! (a subscriber whose history is gone) is an `error` message without an id.

use bytes::Bytes;

use super::frame::{Frame, Payload};
use super::machine::Adapter;
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

    /// The logged JSON is the message as it is: sent without serialising it again.
    fn push_logged(&mut self, message: &OutputMessage, json: &Bytes, frames: &mut Vec<Frame>) {
        frames.push(Frame { event: None, id: message.sequence(), payload: Payload::Json(json.clone()) });
    }

    fn finish(&mut self, _outcome: &Outcome, _frames: &mut Vec<Frame>) {}

    /// An `error` message without an id: it is not part of the log, so a client must not resume from it.
    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        frames.push(Frame::json(None, &OutputMessage::builtin(error.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::Entry;
    use crate::output::{DeltaAction, Metadata};

    /// The bytes a logged message carries are the event `push` would have serialised: a subscriber reads the
    /// same event whether its rendition had the JSON at hand or not.
    #[test]
    fn a_logged_message_is_sent_as_push_would_send_it() {
        let mut delta = OutputMessage::text("Hel\"lo\n").with_message_id("m1").as_delta(DeltaAction::Append, None);
        delta.metadata = Some(Metadata { sequence: Some(9), timestamp: Some(1_700), trace_id: Some("t".into()) });
        delta.props.insert("z".into(), serde_json::json!({"b": 1.5, "a": [null, true]}));
        let mut tool = OutputMessage::text("x");
        tool.kind = "custom_kind".into();
        for message in [delta, tool] {
            let (mut pushed, mut logged) = (Vec::new(), Vec::new());
            CuiAdapter.push(&message, &mut pushed);
            let Entry::Message { message, json: Some(json), .. } = Entry::message(message) else { unreachable!() };
            CuiAdapter.push_logged(&message, &json, &mut logged);
            assert_eq!(pushed, logged);
        }
    }
}
