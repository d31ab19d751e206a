//! [`Adapter`]: the trait every format's state machine implements, from a stream's messages to frames.
//!
//! It sits in a file of its own rather than in `mod.rs`, which declares every adapter, so that an adapter
//! imports the trait without importing the file that declares it. The contract (deterministic frames, fed
//! one message at a time) is in the `adapter` module doc.

use bytes::Bytes;

use super::frame::Frame;
use crate::output::{ErrorProps, Outcome, OutputMessage};

/// A renderer from messages to frames; see the `adapter` module doc.
pub trait Adapter {
    /// Renders one message of the stream, appending its frames to `frames`.
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>);

    /// The same, for a message whose compact JSON is at hand (a logged message carries it, see
    /// [`crate::hub::Entry`]): a format that sends the message as it is sends these bytes rather than
    /// serialising it again. Any other format renders it as [`Adapter::push`] does.
    fn push_logged(&mut self, message: &OutputMessage, _json: &Bytes, frames: &mut Vec<Frame>) {
        self.push(message, frames);
    }

    /// Renders the end of the stream, appending the last frames to `frames`.
    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Frame>);

    /// True once it will render nothing more, whatever comes (the OpenAI adapter after an error): a reader
    /// that took every frame so far has its whole view of the stream.
    fn ended(&self) -> bool {
        false
    }

    /// Renders an error that is not part of the stream but ends one subscriber's view of it (a subscriber
    /// whose next message is no longer kept): the last frames that subscriber receives. Changes no state.
    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>);
}
