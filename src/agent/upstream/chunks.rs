//! Reading an upstream's answer: the SSE body (parsed by a well-kept SSE crate) as the [`Delta`]s its
//! dialect's [`Decoder`] makes of each event, within the first-byte and idle timeouts.
//!
//! Comments (`: OPENROUTER PROCESSING`, `: keep-alive`) are skipped by the SSE parser, and so are events
//! without data. What an event means is the dialect's to say (`openai.rs`, `anthropic/events.rs`): this file
//! owns only the timing, the end of the body, and stopping after the event the dialect calls the last.

use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use super::dialect::{Decoder, Delta};
use super::error::UpstreamError;

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// The deltas of one answer.
pub(crate) struct Chunks {
    events: Events,
    decoder: Box<dyn Decoder>,
    first_byte: Duration,
    idle: Duration,
    started: bool,
    done: bool,
}

impl Chunks {
    /// Reads `response`'s body with `decoder`: the first event within `first_byte`, each next one within
    /// `idle`.
    pub(crate) fn new(
        response: reqwest::Response,
        decoder: Box<dyn Decoder>,
        first_byte: Duration,
        idle: Duration,
    ) -> Self {
        Chunks {
            events: Box::pin(response.bytes_stream().eventsource()),
            decoder,
            first_byte,
            idle,
            started: false,
            done: false,
        }
    }

    /// The deltas of the next event that has any; `None` once the answer is complete or the body ended.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<Delta>>, UpstreamError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let (wait, what) = if self.started { (self.idle, "idle") } else { (self.first_byte, "first-byte") };
            let event = match tokio::time::timeout(wait, self.events.next()).await {
                Err(_) => return Err(UpstreamError::Timeout { what, after: wait }),
                Ok(None) => {
                    self.done = true;
                    return Ok(None);
                }
                Ok(Some(Err(error))) => return Err(UpstreamError::Connect(error.to_string())),
                Ok(Some(Ok(event))) => event,
            };
            self.started = true;
            let data = event.data.trim();
            if data.is_empty() {
                continue;
            }
            let decoded = self.decoder.decode(&event.event, data).inspect_err(|_| self.done = true)?;
            self.done = decoded.done;
            if !decoded.deltas.is_empty() {
                return Ok(Some(decoded.deltas));
            }
        }
    }
}
