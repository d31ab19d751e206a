//! Server-sent event responses from a [`Subscription`]: one body chunk per batch, `: ping` in silences.
//!
//! Each batch the hub hands out (every frame a subscriber is behind, up to the batch limit) becomes one body
//! chunk, so it goes out in one write (hyper's, or `event_connection.rs`'s). A subscriber that keeps up with
//! a fast producer gathers for a moment after each write ([`GATHER`]), so messages that come that fast share
//! a write. After `keep_alive` without a batch (zero: never) a `: ping` comment goes out, which every SSE
//! client and OpenAI SDK ignores. The body ends when the subscription does: after `data: [DONE]` for OpenAI,
//! after `stream_end` or a `lagged` notice for CUI. `Cache-Control: no-cache` and `X-Accel-Buffering: no`
//! keep proxies from holding the events back.
//!
//! The chunks come from a [`Relay`], which a transport that writes events itself takes out of the response
//! ([`Direct`]) instead of polling the body: `event_connection.rs` does, to hand a waiting relay to its
//! stream's feed (`feed.rs`), which takes its batches with [`Relay::try_batch`]. This file knows neither:
//! the feeds are the connection's to find, not the response's to carry.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use tokio::time::{Instant, Sleep};

use crate::http::edge::metrics::SubscriberMeter;
use crate::hub::{Batch, Stream, Subscription};

const PING: Bytes = Bytes::from_static(b": ping\n\n");

/// Runs when the response body is dropped before the subscription ended: the client went away.
pub(crate) struct OnDisconnect(Option<Box<dyn FnOnce() + Send>>);

impl OnDisconnect {
    pub(crate) fn new(action: impl FnOnce() + Send + 'static) -> Self {
        OnDisconnect(Some(Box::new(action)))
    }

    pub(crate) fn none() -> Self {
        OnDisconnect(None)
    }

    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for OnDisconnect {
    fn drop(&mut self) {
        if let Some(action) = self.0.take() {
            action();
        }
    }
}

/// An SSE response that relays `subscription`, with `stream_id` in `x-agentmux-stream-id`; `retry` starts it
/// with the reconnection hint [`RETRY`] (for `EventSource` readers only: see `docs/decisions.md`, "SSE retry hint"); `meter` is
/// the subscriber in the metrics, for as long as the response lives.
///
/// The response's extensions hold its relay as a [`Direct`], for a transport that writes the events
/// itself (`event_connection.rs`, which hands a waiting reader to its stream's feed); the body then has
/// nothing. A transport that polls the body (hyper) gets every chunk from it.
pub(crate) fn response(
    subscription: Subscription,
    stream_id: &str,
    keep_alive: Duration,
    on_disconnect: OnDisconnect,
    retry: bool,
    meter: SubscriberMeter,
) -> Response {
    // A zero keep-alive turns pings off.
    let pings = (!keep_alive.is_zero()).then(|| Pings::new(keep_alive));
    let relay =
        Relay { subscription, on_disconnect, pings, wrote: None, gather: false, retry, meter, pieces: Vec::new() };
    let direct = Direct { relay: Arc::new(Mutex::new(Some(Box::new(relay)))) };
    let cell = Arc::clone(&direct.relay);
    let body = futures::stream::unfold(None, move |relay: Option<Box<Relay>>| {
        let cell = Arc::clone(&cell);
        async move {
            let mut relay = match relay {
                Some(relay) => relay,
                None => crate::sync::lock(&cell).take()?,
            };
            let chunk = relay.next().await?;
            Some((Ok::<_, Infallible>(chunk), Some(relay)))
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    response.extensions_mut().insert(direct);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(id) = HeaderValue::from_str(stream_id) {
        headers.insert("x-agentmux-stream-id", id);
    }
    response
}

/// An SSE response's relay, for a transport that writes its events itself rather than poll its body:
/// taken once (the body is empty after).
#[derive(Clone)]
pub(crate) struct Direct {
    relay: Arc<Mutex<Option<Box<Relay>>>>,
}

impl Direct {
    /// The relay, unless the body has started.
    pub(crate) fn take(&self) -> Option<Box<Relay>> {
        crate::sync::lock(&self.relay).take()
    }
}

/// What a response body holds: the subscription, the disconnect action, the ping timer, and whether to
/// gather before the next batch.
pub(crate) struct Relay {
    subscription: Subscription,
    on_disconnect: OnDisconnect,
    pings: Option<Pings>,
    /// When the last batch went out.
    wrote: Option<Instant>,
    /// Gather before the next batch: the last one took everything there was, and came soon after the one
    /// before it.
    gather: bool,
    /// The reconnection hint is still to be sent, first.
    retry: bool,
    /// This subscriber in the metrics, while it is connected.
    meter: SubscriberMeter,
    /// The last batch's pieces still to go, last first: each is a frame of the body, and a transport that
    /// finds them ready at once writes them together (see `event_connection.rs`).
    pieces: Vec<Bytes>,
}

/// How long an `EventSource` waits before it reconnects after the connection drops: a block with only a
/// `retry:` field, which sets it and dispatches no event.
const RETRY: Bytes = Bytes::from_static(b"retry: 2000\n\n");

impl Relay {
    /// The next chunk: a batch, or a ping after a silence; `None` when the subscription ended.
    ///
    /// A reader that keeps up with a fast producer gathers: when its last batch took everything there was
    /// and came less than [`BUSY`] after the one before, it takes the next one no sooner than [`GATHER`]
    /// after the last, so messages that come that fast (tokens posted one at a time to many readers) share a
    /// write instead of costing one write per message per reader, which is where the kernel's time goes.
    /// A message after a pause, a reader catching up, a reader whose turns are already further apart
    /// (many readers share the cores, so each already takes several messages a turn), and the lone reader
    /// of a stream (nothing to share: see [`shares_writes`]) are never held.
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        let next = self.next_chunk().await;
        if next.is_none() {
            // Ended with the subscription: the client did not go away.
            self.on_disconnect.disarm();
        }
        next
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(piece) = self.pieces.pop() {
            return Some(piece);
        }
        if std::mem::take(&mut self.retry) {
            self.meter.sent(RETRY.len());
            return Some(RETRY);
        }
        if self.gather
            && let Some(wrote) = self.wrote
            && Instant::now() < wrote + GATHER
        {
            // Boxed: held in the body's state only while it waits, so an idle reader does not carry a timer.
            Box::pin(tokio::time::sleep_until(wrote + GATHER)).await;
        }
        let batch = match self.pings.as_mut() {
            None => self.subscription.next().await,
            // `Subscription::next` only waits on a watch channel, so dropping it when a ping wins loses nothing.
            Some(pings) => tokio::select! {
                biased;
                batch = self.subscription.next() => batch,
                () = pings.due() => {
                    self.meter.sent(PING.len());
                    return Some(PING);
                }
            },
        };
        self.wrote();
        let batch = batch?;
        self.meter.delivered(&batch);
        self.pieces.extend(batch.pieces().iter().rev().cloned());
        Some(self.pieces.pop().unwrap_or_default())
    }

    /// The next piece of the last batch, when one is still to go: ready without waiting.
    pub(crate) fn ready_piece(&mut self) -> Option<Bytes> {
        self.pieces.pop()
    }

    /// True when everything there was went out and the reader waits for more: a feed can write what comes
    /// next (see `feed.rs`).
    pub(crate) fn is_waiting(&self) -> bool {
        self.pieces.is_empty() && !self.retry && self.subscription.is_live()
    }

    /// The subscription, for a feed to wait on its stream.
    pub(crate) fn subscription(&self) -> &Subscription {
        &self.subscription
    }

    /// The next batch if there is one now, counted as sent (a feed writes it at `now`): `Some(None)` once
    /// the subscription ended, `None` when there is nothing yet.
    pub(crate) fn try_batch(&mut self, now: Instant) -> Option<Option<Batch>> {
        let batch = self.subscription.try_next()?;
        if let Some(batch) = &batch {
            self.meter.delivered(batch);
            if let Some(pings) = self.pings.as_mut() {
                pings.sent(now);
            }
        }
        Some(batch)
    }

    /// When the next ping is due if nothing goes out before: `None` without pings.
    pub(crate) fn ping_due(&self) -> Option<Instant> {
        self.pings.as_ref().map(|pings| pings.last_sent + pings.period)
    }

    /// A ping, counted as sent now.
    pub(crate) fn ping(&mut self) -> Bytes {
        if let Some(pings) = self.pings.as_mut() {
            pings.sent(Instant::now());
        }
        self.meter.sent(PING.len());
        PING
    }

    /// A batch goes out now.
    fn wrote(&mut self) {
        let now = Instant::now();
        if let Some(pings) = self.pings.as_mut() {
            pings.sent(now);
        }
        let soon = self.wrote.is_some_and(|before| now < before + BUSY);
        self.gather = soon && self.subscription.is_live() && shares_writes(&self.subscription);
        self.wrote = Some(now);
    }
}

/// True when holding a write back pays for `subscription`'s stream: several readers share its messages, so a
/// message written at once costs a write per reader, and a hold saves that many. A lone reader (a chat
/// completion's own answer, the relay's case) gains nothing from one: one write per message is all it costs,
/// and each held message reaches the client up to [`GATHER`] (a timer tick more, in fact) late.
fn shares_writes(subscription: &Subscription) -> bool {
    shares_writes_of(subscription.stream())
}

/// The same for a stream's writer (`feed.rs`).
pub(crate) fn shares_writes_of(stream: &Stream) -> bool {
    stream.subscribers() > 1
}

/// Batches this close together mark a reader that keeps up with a fast producer; see [`Relay::next`].
pub(crate) const BUSY: Duration = Duration::from_micros(2500);

/// How long a reader that keeps up gathers messages before its next write; see [`Relay::next`]. (The
/// runtime's timer rounds a deadline up to its next millisecond tick, so a hold lasts up to about 2 ms.)
/// Writes are most of a delivery's cost: at 300 µs (a hold of up to a millisecond) a reader of one token
/// per POST wrote about every second token; at 1.5 ms token streaming to 100 readers delivers 1.45× as
/// much with the same publish-to-receive p99, since the cores are less busy (`docs/benchmarks-history.md`, session 14).
/// It must stay under [`BUSY`], or a held reader would never count as busy again.
pub(crate) const GATHER: Duration = Duration::from_micros(1500);
const _: () = assert!(GATHER.as_micros() < BUSY.as_micros(), "a held reader must still count as busy");

/// The keep-alive timer: one timer per subscriber, moved only when it fires.
///
/// A fresh timeout around every wait cost a timer-wheel insert and removal per batch per subscriber, which
/// in fan-out is per delivery; this one notes when the last chunk went out (a clock read) and, when it
/// fires early, sleeps again until a whole period has passed since then.
struct Pings {
    timer: Pin<Box<Sleep>>,
    period: Duration,
    last_sent: Instant,
}

impl Pings {
    fn new(period: Duration) -> Self {
        let now = Instant::now();
        Pings { timer: Box::pin(tokio::time::sleep_until(now + period)), period, last_sent: now }
    }

    /// A chunk went out at `now`.
    fn sent(&mut self, now: Instant) {
        self.last_sent = now;
    }

    /// Completes when a period has passed without a chunk; the ping then counts as one.
    async fn due(&mut self) {
        loop {
            self.timer.as_mut().await;
            let now = Instant::now();
            let due = self.last_sent + self.period;
            if now >= due {
                self.last_sent = now;
                self.timer.as_mut().reset(now + self.period);
                return;
            }
            self.timer.as_mut().reset(due);
        }
    }
}
