//! Reading an upstream's answer: the SSE body (parsed by a well-kept SSE crate) as the [`Delta`]s its
//! dialect's [`Decoder`] makes of each event, within the first-byte and idle timeouts.
//!
//! Comments (`: OPENROUTER PROCESSING`, `: keep-alive`) are skipped by the SSE parser, and so are events
//! without data. What an event means is the dialect's to say (`openai.rs`, `anthropic/events.rs`): this file
//! owns only the timing, the end of the body, and stopping after the event the dialect calls the last.
//!
//! The timeouts cost nothing per event: one timer is armed for the answer, and an event only notes when it
//! came. When the timer fires it compares the real deadline (the last event plus the idle timeout) with the
//! time and, unless the deadline has passed, is armed again for it. A timeout per event (`tokio::time::
//! timeout` around each read) would register a timer in the runtime's wheel and remove it again for every
//! chunk of every answer, two locked operations per token that a gateway relaying hundreds of answers at once
//! pays on its hot path.

use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use super::dialect::{Decoder, Delta};
use super::error::UpstreamError;

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// The deltas of one answer.
pub(crate) struct Chunks {
    events: Events,
    decoder: Box<dyn Decoder>,
    first_byte: Duration,
    idle: Duration,
    /// When the answer's head came: the first event is due `first_byte` after it.
    opened: Instant,
    /// When the last event came, once one has.
    last: Option<Instant>,
    /// The one timer, armed for [`Chunks::deadline`] or earlier; never later.
    timer: Pin<Box<Sleep>>,
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
        let opened = Instant::now();
        Chunks {
            events: Box::pin(response.bytes_stream().eventsource()),
            decoder,
            first_byte,
            idle,
            opened,
            last: None,
            timer: Box::pin(tokio::time::sleep_until(opened + first_byte)),
            done: false,
        }
    }

    /// When the next event is due: `first_byte` after the head until one came, then `idle` after the last.
    fn deadline(&self) -> Instant {
        match self.last {
            Some(last) => last + self.idle,
            None => self.opened + self.first_byte,
        }
    }

    /// The next event, or the timeout it did not come within.
    async fn event(&mut self) -> Result<Option<Result<Event, EventStreamError<reqwest::Error>>>, UpstreamError> {
        loop {
            tokio::select! {
                biased;
                event = self.events.next() => return Ok(event),
                () = &mut self.timer => {
                    let deadline = self.deadline();
                    if Instant::now() >= deadline {
                        let (what, after) =
                            if self.last.is_some() { ("idle", self.idle) } else { ("first-byte", self.first_byte) };
                        return Err(UpstreamError::Timeout { what, after });
                    }
                    // Events came meanwhile: wait for the deadline they moved on to.
                    self.timer.as_mut().reset(deadline);
                }
            }
        }
    }

    /// The deltas of the next event that has any; `None` once the answer is complete or the body ended.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<Delta>>, UpstreamError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let event = match self.event().await? {
                None => {
                    self.done = true;
                    return Ok(None);
                }
                Some(Err(error)) => return Err(UpstreamError::Connect(error.to_string())),
                Some(Ok(event)) => event,
            };
            let now = Instant::now();
            // The timer may fire early, never late: after the first event, when `idle` is shorter than what
            // was left of `first_byte`, it is brought forward once (later events only move the deadline on).
            if self.last.is_none() && now + self.idle < self.opened + self.first_byte {
                self.timer.as_mut().reset(now + self.idle);
            }
            self.last = Some(now);
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

#[cfg(all(test, feature = "server"))]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::agent::upstream::dialect::Dialect;
    use crate::agent::upstream::openai::OpenAiChat;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// An answer of `count` events `every` apart, whose body then stays open without another byte.
    fn answer(every: Duration, count: usize) -> reqwest::Response {
        let events = futures::stream::unfold(0, move |n| async move {
            if n == count {
                std::future::pending::<()>().await;
            }
            if n > 0 {
                tokio::time::sleep(every).await;
            }
            let event = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{n}\"}}}}]}}\n\n");
            Some((Ok::<_, std::io::Error>(Bytes::from(event)), n + 1))
        });
        reqwest::Response::from(axum::http::Response::new(reqwest::Body::wrap_stream(events)))
    }

    /// Every delta until the answer fails, and the failure.
    async fn read_to_error(mut chunks: Chunks) -> (usize, UpstreamError) {
        let mut read = 0;
        loop {
            match chunks.next().await {
                Ok(Some(_)) => read += 1,
                Ok(None) => panic!("the body never ends"),
                Err(error) => return (read, error),
            }
        }
    }

    #[tokio::test]
    async fn an_answer_longer_than_the_first_byte_timeout_runs_on_until_it_idles() {
        let started = Instant::now();
        // 12 events over 550 ms, past the 200 ms first-byte timeout: the timer armed for it fires while events
        // come, and is armed again for the idle deadline.
        let chunks = Chunks::new(answer(ms(50), 12), OpenAiChat.decoder(), ms(200), ms(300));
        let (read, error) = read_to_error(chunks).await;
        assert_eq!(read, 12);
        assert!(matches!(error, UpstreamError::Timeout { what: "idle", .. }), "{error:?}");
        let took = started.elapsed();
        assert!(took >= ms(550 + 300) && took < ms(550 + 300 + 700), "{took:?}");
    }

    #[tokio::test]
    async fn an_idle_timeout_shorter_than_the_first_byte_one_is_kept_after_the_first_event() {
        let started = Instant::now();
        let chunks = Chunks::new(answer(ms(10), 1), OpenAiChat.decoder(), Duration::from_secs(30), ms(200));
        let (read, error) = read_to_error(chunks).await;
        assert_eq!(read, 1);
        assert!(matches!(error, UpstreamError::Timeout { what: "idle", .. }), "{error:?}");
        let took = started.elapsed();
        assert!(took >= ms(200) && took < ms(200 + 700), "{took:?}");
    }

    #[tokio::test]
    async fn no_first_event_times_out_after_the_first_byte_timeout() {
        let started = Instant::now();
        let chunks = Chunks::new(answer(ms(10), 0), OpenAiChat.decoder(), ms(150), ms(5000));
        let (read, error) = read_to_error(chunks).await;
        assert_eq!(read, 0);
        assert!(matches!(error, UpstreamError::Timeout { what: "first-byte", .. }), "{error:?}");
        assert!(started.elapsed() < ms(150 + 700), "{:?}", started.elapsed());
    }
}
