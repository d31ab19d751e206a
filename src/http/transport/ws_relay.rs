//! [`WsRelay`]: the subscription of a WebSocket connection opened on one stream, as its connection
//! (`ws.rs`) and, while it waits, its stream's feed (`feed.rs`) write it; [`try_write`] and [`write`], how
//! a batch's pieces go to the socket.
//!
//! A WebSocket rendition renders each frame whole, header included (`crate::render::ws`), so a batch's
//! pieces are written as they are, in one vectored write, with no framing added per connection: what a feed
//! does for an SSE reader with the chunked framing (`chunked.rs`), without it.

use std::io::{self, IoSlice};

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::chunked::{unwritten, write_all_to};
use crate::http::edge::metrics::SubscriberMeter;
use crate::hub::{Batch, Subscription};

/// The most pieces one vectored write takes.
const SLICES: usize = 64;

/// A one-stream WebSocket connection's subscription, counted in the metrics while it lives.
pub(crate) struct WsRelay {
    subscription: Subscription,
    meter: SubscriberMeter,
    /// A batch said the subscriber lagged: its history is gone, and the connection closes with `lagged`.
    pub(crate) lagged: bool,
}

impl WsRelay {
    pub(crate) fn new(subscription: Subscription, meter: SubscriberMeter) -> Self {
        WsRelay { subscription, meter, lagged: false }
    }

    /// The next batch, waiting for one; `None` once the subscription ended.
    pub(crate) async fn next(&mut self) -> Option<Batch> {
        let batch = self.subscription.next().await?;
        self.took(&batch);
        Some(batch)
    }

    /// The next batch if there is one now: `Some(None)` once the subscription ended, `None` when there is
    /// nothing yet (see `Subscription::try_next`).
    pub(crate) fn try_batch(&mut self, _now: Instant) -> Option<Option<Batch>> {
        let batch = self.subscription.try_next()?;
        if let Some(batch) = &batch {
            self.took(batch);
        }
        Some(batch)
    }

    fn took(&mut self, batch: &Batch) {
        self.lagged |= batch.lagged;
        self.meter.delivered(batch);
    }

    /// True when the last batch took everything there was: a feed can write what comes next.
    pub(crate) fn is_waiting(&self) -> bool {
        self.subscription.is_live()
    }

    /// The subscription, for a feed to wait on its stream.
    pub(crate) fn subscription(&self) -> &Subscription {
        &self.subscription
    }
}

/// Writes `pieces` as far as the socket takes them now, without waiting: `Err` with what it did not take,
/// which the connection writes itself.
pub(crate) fn try_write(tcp: &TcpStream, pieces: &[Bytes]) -> Result<(), Vec<Bytes>> {
    let mut from = 0;
    while from < pieces.len() {
        let group = &pieces[from..pieces.len().min(from + SLICES)];
        let slices = slices(group);
        let total: usize = group.iter().map(Bytes::len).sum();
        let written = tcp.try_write_vectored(&slices[..group.len()]).unwrap_or(0);
        if written < total {
            let mut rest = Vec::new();
            unwritten(pieces[from..].iter().cloned(), written, &mut rest);
            return Err(rest);
        }
        from += group.len();
    }
    Ok(())
}

/// Writes every byte of `pieces`, waiting for the socket to take them. The slices are on the heap, not in
/// the future: a connection's task holds room for its largest future even while it waits, and an array of
/// slices there cost every idle connection a kilobyte.
pub(crate) async fn write(tcp: &TcpStream, pieces: &[Bytes]) -> io::Result<()> {
    for group in pieces.chunks(SLICES) {
        let mut slices: Vec<IoSlice<'_>> = group.iter().map(|piece| IoSlice::new(piece)).collect();
        write_all_to(tcp, &mut slices).await?;
    }
    Ok(())
}

/// The slices of `group` (at most [`SLICES`] pieces), on the stack.
fn slices(group: &[Bytes]) -> [IoSlice<'_>; SLICES] {
    let mut slices = [IoSlice::new(&[]); SLICES];
    for (slice, piece) in slices.iter_mut().zip(group) {
        *slice = IoSlice::new(piece);
    }
    slices
}
