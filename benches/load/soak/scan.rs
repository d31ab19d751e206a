//! Reading a subscriber's socket for the soak: a read into the worker thread's buffer, and [`Scan`], which
//! counts SSE events in what was read and keeps the last bytes of the body to tell how it ended.
//!
//! A body is chunked and each chunk is a batch of whole frames, so an event ends at `\n\n` (a ping at
//! `: ping\n\n`) and the body at the last chunk, `\r\n0\r\n\r\n`; a `lagged` notice is the last event
//! before it. Both are found in the window of the last [`WINDOW`] bytes, which a read of a few bytes at a
//! time (a slow reader) fills as well as a large one. WebSocket readers on raw sockets use the window
//! only.
//!
//! [`read_body`] reads at full speed until the caller's end condition; [`read_slowly`] first reads 16 bytes
//! every 250 ms (64 bytes a second) for 20 to 90 s, the slow reader of both transports.

use std::cell::RefCell;
use std::io;
use std::sync::LazyLock;
use std::time::Duration;

use memchr::memmem::{self, Finder};
use tokio::net::TcpStream;

use super::shared::Counters;

/// The most a fast reader takes in one read.
pub(crate) const READ_BUFFER: usize = 64 << 10;
/// A slow reader's receive buffer (the kernel doubles it), what it reads at a time, how often, and for how
/// many seconds before it reads the rest at full speed.
pub(crate) const SLOW_RECEIVE_BUFFER: u32 = 4 << 10;
const SLOW_READ: usize = 16;
const SLOW_EVERY: Duration = Duration::from_millis(250);
const SLOW_FOR: std::ops::Range<f64> = 20.0..90.0;
/// The bytes of the body kept to tell how it ended.
const WINDOW: usize = 512;

static EVENT_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\n"));

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0; READ_BUFFER]);
}

/// One body's last bytes.
pub(crate) struct Scan {
    window: Vec<u8>,
    /// Count SSE events (not for a WebSocket).
    sse: bool,
}

impl Scan {
    pub(crate) fn sse() -> Scan {
        Scan { window: Vec::new(), sse: true }
    }

    pub(crate) fn websocket() -> Scan {
        Scan { window: Vec::new(), sse: false }
    }

    /// Takes `data`, the next bytes of the body; the events and pings it completes.
    pub(crate) fn feed(&mut self, data: &[u8]) -> (u64, u64) {
        let (events, pings) = if self.sse { self.count(data) } else { (0, 0) };
        if data.len() >= WINDOW {
            self.window.clear();
            self.window.extend_from_slice(&data[data.len() - WINDOW..]);
        } else {
            self.window.extend_from_slice(data);
            let excess = self.window.len().saturating_sub(WINDOW);
            self.window.drain(..excess);
        }
        (events, pings)
    }

    /// The events and pings `data` completes.
    fn count(&self, data: &[u8]) -> (u64, u64) {
        let Some(&first) = data.first() else { return (0, 0) };
        let carry = &self.window[self.window.len().saturating_sub(8)..];
        // The byte `back` places before `data[at]`, from the carry when it is before `data`.
        let before = |at: usize, back: usize| match at.checked_sub(back) {
            Some(i) => data.get(i).copied(),
            None => carry.len().checked_sub(back - at).and_then(|i| carry.get(i).copied()),
        };
        // An event whose `\n\n` starts at `data[at]` (or one byte before it): a ping when `: ping` precedes it.
        let is_ping = |at: usize, offset: usize| (1..=6).all(|j| before(at, j + offset) == Some(b": ping"[6 - j]));
        let (mut events, mut pings) = (0, 0);
        let mut count = |ping: bool| if ping { pings += 1 } else { events += 1 };
        // `\n\n` split between two reads.
        if first == b'\n' && carry.last() == Some(&b'\n') && before(0, 2) != Some(b'\n') {
            count(is_ping(0, 1));
        }
        for at in EVENT_END.find_iter(data) {
            count(is_ping(at, 0));
        }
        (events, pings)
    }

    /// The body ended with its last chunk.
    pub(crate) fn over(&self) -> bool {
        self.window.ends_with(b"\r\n0\r\n\r\n")
    }

    /// The window holds `needle`.
    pub(crate) fn holds(&self, needle: &[u8]) -> bool {
        memmem::find(&self.window, needle).is_some()
    }

    /// The body's last event (or a WebSocket's last message) was a `lagged` notice.
    pub(crate) fn lagged(&self) -> bool {
        self.holds(b"\"lagged\"")
    }
}

/// Reads at most `max` bytes once they are there, feeds them to `scan` and counts them; 0 when the
/// connection is closed.
pub(crate) async fn read_some(
    stream: &TcpStream,
    max: usize,
    scan: &mut Scan,
    counters: &Counters,
) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        let read = BUFFER.with_borrow_mut(|buffer| {
            let n = stream.try_read(&mut buffer[..max.min(READ_BUFFER)])?;
            let (events, pings) = scan.feed(&buffer[..n]);
            Counters::add(&counters.deliveries, events);
            Counters::add(&counters.pings, pings);
            Counters::add(&counters.received_bytes, n as u64);
            io::Result::Ok(n)
        });
        match read {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads until `over` (true) or the connection closes (false).
pub(crate) async fn read_body(
    stream: &TcpStream,
    scan: &mut Scan,
    counters: &Counters,
    over: fn(&Scan) -> bool,
) -> io::Result<bool> {
    while !over(scan) {
        if read_some(stream, READ_BUFFER, scan, counters).await? == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Reads a few bytes at a time for a while, then the rest at full speed, until `over` (true) or the
/// connection closes (false).
pub(crate) async fn read_slowly(
    stream: &TcpStream,
    scan: &mut Scan,
    counters: &Counters,
    over: fn(&Scan) -> bool,
) -> io::Result<bool> {
    let slow_until = tokio::time::Instant::now() + Duration::from_secs_f64(rand::random_range(SLOW_FOR));
    let mut every = tokio::time::interval(SLOW_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !over(scan) && tokio::time::Instant::now() < slow_until {
        every.tick().await;
        if read_some(stream, SLOW_READ, scan, counters).await? == 0 {
            return Ok(false);
        }
    }
    read_body(stream, scan, counters, over).await
}
