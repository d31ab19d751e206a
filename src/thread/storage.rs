//! [`ThreadStorage`]: where threads are kept besides this process's memory. It is the seam between the
//! thread registry and the engines, as [`crate::hub::Storage`] is for streams: `thread/` calls the trait,
//! and the engines implement it beside themselves (the embedded store in `store/thread_storage.rs`, Redis
//! in `cluster/thread_storage.rs`), so `thread/` depends on none of them.
//!
//! A storage is one of two kinds, and the trait's methods serve both:
//!
//! - A journal of this process's threads: [`MemoryThreadStorage`], which keeps nothing (threads last as long
//!   as the process), or the embedded store, read back at start (`Store::restore_threads`, as its streams
//!   are). The registry's map is the record. Each change is handed over at once, under the thread's lock, so
//!   the journal has a thread's changes in the order they were made ([`ThreadStorage::changed`]); a thread
//!   deleted or evicted is forgotten ([`ThreadStorage::forget`]). A journal is never read and has nothing
//!   to commit: the methods only a shared record uses have defaults that do nothing.
//! - A record every node shares (Redis; [`ThreadStorage::is_record`]): the registry's map holds this node's
//!   copies (`replica.rs`). Each use reads the thread as the storage holds it now
//!   ([`ThreadStorage::read`]), and each change is committed only onto what was read
//!   ([`ThreadStorage::commit`]).
//!
//! The types here are what passes through the seam: a [`Change`] handed over, the [`Commit`] a shared
//! record makes of it, a thread as a shared record holds it ([`RecordedThread`]), and one a journal kept
//! from before a restart ([`RestoredThread`]).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::audit::AuditEntry;
use super::error::ThreadError;
use crate::conversation::ToolCall;
use crate::hub::{Hub, Stream};

/// Where threads are kept besides this process's memory (see the module doc).
pub(crate) trait ThreadStorage: Send + Sync + std::fmt::Debug {
    /// Takes what changed in a thread, under the thread's lock. A journal keeps it now and answers `None`; a
    /// shared record answers the commit to make once the lock is let go ([`ThreadStorage::commit`]), or
    /// `None` when nothing changed that it holds. `None` says the storage has all the thread's entries.
    fn changed(&self, change: &Change<'_>) -> Option<Commit>;

    /// This process let go of thread `id` (deleted, or evicted after its TTL without use): a journal forgets
    /// it; a shared record, which expires threads itself, keeps it.
    fn forget(&self, id: &str);

    /// How long this process keeps a thread nobody used, for threads that live `ttl` (zero: forever).
    fn kept_for(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// True when the storage, not this process's map, holds the threads' record: a record every node
    /// shares, which each use reads again. False for a journal.
    fn is_record(&self) -> bool {
        false
    }

    /// Thread `id` as the storage holds it now (`None`: it holds no such thread): only its entries from
    /// position `known.1` on when the reader holds them already and the thread is still the one made at
    /// epoch `known.0`.
    fn read<'a>(
        &'a self,
        _id: &'a str,
        _known: Option<(&'a str, usize)>,
    ) -> BoxFuture<'a, Result<Option<RecordedThread>, ThreadError>> {
        Box::pin(async { Ok(None) })
    }

    /// Makes thread `id` with `entries` unless one has the id: true when one had it already.
    fn create<'a>(&'a self, made: Made<'a>) -> BoxFuture<'a, Result<bool, ThreadError>> {
        let _ = made;
        Box::pin(async { Ok(false) })
    }

    /// Applies `commit` if the thread is still as it was read: false when it changed since.
    fn commit<'a>(&'a self, _commit: &'a Commit) -> BoxFuture<'a, Result<bool, ThreadError>> {
        Box::pin(async { Ok(true) })
    }

    /// Deletes thread `id` as made at `epoch` (a thread made again under the id since is left alone).
    fn delete<'a>(&'a self, _id: &'a str, _epoch: &'a str) -> BoxFuture<'a, Result<(), ThreadError>> {
        Box::pin(async { Ok(()) })
    }

    /// How often a thread with a run going on is to be kept alive ([`ThreadStorage::renew`]); zero: never.
    fn renew_every(&self) -> Duration {
        Duration::ZERO
    }

    /// Keeps thread `id` for another TTL (while a run goes on in it).
    fn renew<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), ThreadError>> {
        Box::pin(async { Ok(()) })
    }

    /// The stream of a run, wherever it was written, in `hub` (`None`: it is gone).
    fn stream<'a>(&'a self, hub: &'a Hub, id: &'a str) -> BoxFuture<'a, Result<Option<Arc<Stream>>, ThreadError>> {
        Box::pin(async move { Ok(hub.get(id)) })
    }

    /// Whether stream `id`, which this process has as open, has ended elsewhere or is about to.
    fn stream_ending<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<bool, ThreadError>> {
        Box::pin(async { Ok(false) })
    }
}

/// Threads kept nowhere but in this process's memory: a restart loses them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MemoryThreadStorage;

impl ThreadStorage for MemoryThreadStorage {
    fn changed(&self, _change: &Change<'_>) -> Option<Commit> {
        None
    }

    fn forget(&self, _id: &str) {}
}

/// A thread as it is now, handed to [`ThreadStorage::changed`].
#[derive(Debug)]
pub(crate) struct Change<'a> {
    pub(crate) id: &'a str,
    /// Which thread of that id it is, in a shared record (empty elsewhere).
    pub(crate) epoch: &'a str,
    pub(crate) owner: Option<&'a str>,
    /// When it was made (Unix ms).
    pub(crate) created_ms: u64,
    /// Now, by the hub's clock: when it was last used.
    pub(crate) used_ms: u64,
    /// When its history last changed (Unix ms).
    pub(crate) updated_ms: u64,
    /// How many of `entries` the storage has.
    pub(crate) kept: usize,
    /// Every entry of the thread.
    pub(crate) entries: &'a [Arc<AuditEntry>],
    /// The calls its last run handed to the client, not yet answered.
    pub(crate) pending: &'a [ToolCall],
    /// The stream of the run the storage has as going on.
    pub(crate) running: Option<&'a str>,
    /// The run going on now.
    pub(crate) run: Option<RecordedRun>,
}

impl Change<'_> {
    /// The entries the storage does not have yet.
    pub(crate) fn new_entries(&self) -> &[Arc<AuditEntry>] {
        self.entries.get(self.kept..).unwrap_or_default()
    }
}

/// A thread to make in a shared record ([`ThreadStorage::create`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Made<'a> {
    pub(crate) id: &'a str,
    pub(crate) epoch: &'a str,
    pub(crate) owner: Option<&'a str>,
    pub(crate) created_ms: u64,
    pub(crate) entries: &'a [AuditEntry],
}

/// A change to a thread read at `epoch` with `len` entries and `running`, for a shared record.
#[derive(Debug, Clone)]
pub(crate) struct Commit {
    pub(crate) id: String,
    pub(crate) epoch: String,
    pub(crate) len: usize,
    pub(crate) running: Option<String>,
    /// The run from now on.
    pub(crate) run: Option<RecordedRun>,
    /// The calls it waits on, as JSON.
    pub(crate) pending: String,
    pub(crate) updated_ms: u64,
    /// The entries to append, as JSON.
    pub(crate) entries: Vec<String>,
}

/// A thread as a shared record holds it.
#[derive(Debug, Clone)]
pub(crate) struct RecordedThread {
    pub(crate) epoch: String,
    pub(crate) owner: Option<String>,
    pub(crate) created_ms: u64,
    pub(crate) updated_ms: u64,
    /// The calls it waits on, as JSON.
    pub(crate) pending: String,
    pub(crate) running: Option<RecordedRun>,
    /// How many entries the record holds.
    pub(crate) len: usize,
    /// The entries from [`RecordedThread::from`] on, as JSON.
    pub(crate) entries: Vec<String>,
    /// The position of the first of `entries`: where the reader said it was, or 0 for a thread it did not
    /// know (another epoch).
    pub(crate) from: usize,
}

/// The run going on in a thread, as a shared record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordedRun {
    pub(crate) stream: String,
    pub(crate) model: String,
    /// When it started (Unix ms).
    pub(crate) started_ms: u64,
}

/// A thread a journal kept from before a restart, handed back to the registry ([`super::Threads::restore`]).
#[derive(Debug, Clone)]
pub(crate) struct RestoredThread {
    pub(crate) id: String,
    pub(crate) owner: Option<String>,
    /// When it was made (Unix ms).
    pub(crate) created_ms: u64,
    /// When it was last used, by the hub's clock.
    pub(crate) used_ms: u64,
    pub(crate) pending: Vec<ToolCall>,
    pub(crate) entries: Vec<AuditEntry>,
}
