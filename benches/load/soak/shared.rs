//! What every task of the soak shares: the counters, the board of streams subscribers pick from, the gate
//! that keeps handshakes few at a time, and the connection guard that counts the connections held.
//!
//! Counters are relaxed atomics, read by the sampler while the tasks run. An error is counted once, under
//! a short description (`notes`, the first kinds with their counts), and only before the soak is stopped:
//! what the teardown breaks is not the server's doing.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

/// Connects and handshakes in flight at once (the server's listen queue holds 4,096; a re-subscription
/// storm after a busy stream ends must not overflow an older server's 128 either).
const HANDSHAKES: usize = 64;
/// One slow reader in this many reads a bulk stream: each of those makes the server hold megabytes in its
/// socket's send buffer, so a few hundred at once would put the kernel under TCP memory pressure.
const SLOW_ON_BULK: u32 = 10;
/// Error kinds kept with their counts.
const NOTE_KINDS: usize = 24;

/// Every count of the soak.
#[derive(Default)]
pub(crate) struct Counters {
    /// Subscriber connections open now (producers excluded).
    pub(crate) held: AtomicI64,
    /// Subscriber connections opened in all.
    pub(crate) opened: AtomicU64,
    pub(crate) streams_created: AtomicU64,
    /// Ended by the producer: `end` (completed or with an error outcome) or `cancel`.
    pub(crate) streams_ended: AtomicU64,
    pub(crate) appends: AtomicU64,
    pub(crate) messages_appended: AtomicU64,
    /// SSE events and WebSocket messages that carry a stream's message or chunk (pings, acknowledgements
    /// and `done` excluded; replays of what a stream held when subscribed included).
    pub(crate) deliveries: AtomicU64,
    pub(crate) pings: AtomicU64,
    pub(crate) received_bytes: AtomicU64,
    /// Subscriptions started, and how the finished ones ended.
    pub(crate) subscriptions: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) lagged: AtomicU64,
    /// Every error: `http_errors` and `died` are among them.
    pub(crate) errors: AtomicU64,
    /// Answers other than the one expected (2xx, `101`).
    pub(crate) http_errors: AtomicU64,
    /// Connections that closed or failed while a subscriber still expected data.
    pub(crate) died: AtomicU64,
    notes: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn held(&self) -> i64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The error kinds seen, most frequent first.
    pub(crate) fn notes(&self) -> Vec<(String, u64)> {
        let notes = self.notes.lock().map(|n| n.clone()).unwrap_or_default();
        let mut notes: Vec<(String, u64)> = notes.into_iter().collect();
        notes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        notes
    }
}

/// How an error counts besides `errors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A status other than the one expected.
    Http,
    /// A connection closed or failed under a subscriber that expected more.
    Died,
    /// Anything else (a connect that failed, a reply not understood).
    Other,
}

/// The open streams subscribers pick from (bulk ones apart: only slow readers take those), and the quiet
/// streams idle subscribers hold.
#[derive(Default)]
pub(crate) struct Board {
    active: Mutex<Vec<Arc<str>>>,
    bulk: Mutex<Vec<Arc<str>>>,
    quiet: Mutex<Vec<Arc<str>>>,
}

impl Board {
    fn list(&self, bulk: bool) -> &Mutex<Vec<Arc<str>>> {
        if bulk { &self.bulk } else { &self.active }
    }

    pub(crate) fn add(&self, id: Arc<str>, bulk: bool) {
        if let Ok(mut list) = self.list(bulk).lock() {
            list.push(id);
        }
    }

    pub(crate) fn remove(&self, id: &str, bulk: bool) {
        if let Ok(mut list) = self.list(bulk).lock()
            && let Some(at) = list.iter().position(|a| &**a == id)
        {
            list.swap_remove(at);
        }
    }

    /// Open streams, bulk ones included.
    pub(crate) fn active(&self) -> usize {
        self.active.lock().map_or(0, |a| a.len()) + self.bulk.lock().map_or(0, |b| b.len())
    }

    /// A random open stream other than those in `avoid`.
    pub(crate) fn pick(&self, avoid: &[Arc<str>]) -> Option<Arc<str>> {
        let active = self.active.lock().ok()?;
        if active.is_empty() {
            return None;
        }
        // Few tries: `avoid` holds at most a couple of ids.
        for _ in 0..8 {
            let id = &active[rand::random_range(0..active.len())];
            if !avoid.contains(id) {
                return Some(Arc::clone(id));
            }
        }
        active.iter().find(|id| !avoid.contains(id)).cloned()
    }

    /// What a slow reader reads: a bulk stream one time in [`SLOW_ON_BULK`], another open stream otherwise.
    pub(crate) fn pick_slow(&self) -> Option<Arc<str>> {
        if rand::random_range(0..SLOW_ON_BULK) == 0 {
            let bulk = self.bulk.lock().ok()?;
            if !bulk.is_empty() {
                return Some(Arc::clone(&bulk[rand::random_range(0..bulk.len())]));
            }
        }
        self.pick(&[])
    }

    pub(crate) fn set_quiet(&self, ids: Vec<Arc<str>>) {
        if let Ok(mut quiet) = self.quiet.lock() {
            *quiet = ids;
        }
    }

    /// The `i`-th subscriber's quiet stream.
    pub(crate) fn quiet(&self, i: usize) -> Option<Arc<str>> {
        let quiet = self.quiet.lock().ok()?;
        quiet.get(i % quiet.len().max(1)).cloned()
    }
}

/// What the soak's tasks share.
pub(crate) struct Shared {
    pub(crate) server: SocketAddr,
    pub(crate) counters: Counters,
    pub(crate) board: Board,
    /// Fires when the soak is over: tasks stop, and nothing that fails after it counts.
    pub(crate) stop: CancellationToken,
    handshakes: Semaphore,
}

impl Shared {
    pub(crate) fn new(server: SocketAddr) -> Arc<Shared> {
        Arc::new(Shared {
            server,
            counters: Counters::default(),
            board: Board::default(),
            stop: CancellationToken::new(),
            handshakes: Semaphore::new(HANDSHAKES),
        })
    }

    /// Counts an error (unless the soak is stopping) under `note`.
    pub(crate) fn error(&self, failure: Failure, note: impl Into<String>) {
        if self.stop.is_cancelled() {
            return;
        }
        let counters = &self.counters;
        Counters::add(&counters.errors, 1);
        match failure {
            Failure::Http => Counters::add(&counters.http_errors, 1),
            Failure::Died => Counters::add(&counters.died, 1),
            Failure::Other => {}
        }
        if let Ok(mut notes) = counters.notes.lock() {
            let note = note.into();
            if let Some(count) = notes.get_mut(&note) {
                *count += 1;
            } else if notes.len() < NOTE_KINDS {
                notes.insert(note, 1);
            }
        }
    }

    /// A turn to handshake: held from the connect to the response head.
    pub(crate) async fn handshake(&self) -> Option<SemaphorePermit<'_>> {
        self.handshakes.acquire().await.ok()
    }

    /// Waits `duration`, or less if the soak stops; false once it has.
    pub(crate) async fn pause(&self, duration: Duration) -> bool {
        tokio::select! {
            () = self.stop.cancelled() => false,
            () = tokio::time::sleep(duration) => true,
        }
    }
}

/// A subscriber connection counted in [`Counters::held`] while it lives.
pub(crate) struct Held<T> {
    pub(crate) inner: T,
    shared: Arc<Shared>,
}

impl<T> Held<T> {
    pub(crate) fn new(shared: &Arc<Shared>, inner: T) -> Held<T> {
        shared.counters.held.fetch_add(1, Ordering::Relaxed);
        Counters::add(&shared.counters.opened, 1);
        Held { inner, shared: Arc::clone(shared) }
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        self.shared.counters.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A TCP connection from `source` to `server`; with `receive_buffer`, the socket's receive buffer is set
/// that small before connecting, so a slow reader's kernel holds little and the server's cursor stays behind.
pub(crate) async fn connect(
    server: SocketAddr,
    source: Ipv4Addr,
    receive_buffer: Option<u32>,
) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(size) = receive_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    socket.bind(SocketAddr::new(source.into(), 0))?;
    let stream = match tokio::time::timeout(Duration::from_secs(10), socket.connect(server)).await {
        Ok(stream) => stream?,
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}
