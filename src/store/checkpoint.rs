//! [`Checkpointer`]: copies the write-ahead log back into the database file on a thread of its own, so the
//! writer's commits seldom wait for it; and [`start_over`], the write that begins the log again once it is
//! copied back, which the writer's thread makes while nothing waits for it.
//!
//! In WAL mode a commit appends pages to the log; a checkpoint copies them into the database file and syncs
//! it, so the log can start over. SQLite runs one by itself in the committing connection once the log passes
//! 1,000 pages, which put a copy of 4 MB and two syncs (about 35 ms here) in the path of whichever
//! acknowledgement, and every reader waiting on it, came next. This thread runs a passive checkpoint (one
//! that never blocks the writer or a reader) once the log is [`CHECKPOINTER_PAGES`] long (it looks ten times
//! a second), on a connection of its own, so the copying and syncing happen beside the writer. Under writes
//! that never pause, a passive checkpoint may not reach the log's end, and the log starts over only after one
//! has: the writer's thread checkpoints too once the log passes [`WRITER_PAGES`] (in place of SQLite's
//! automatic checkpoint, which would run in whichever thread committed), as the bound, and then finds little
//! left to copy. The writer also truncates the log after deletions (`writer.rs`, compaction).
//!
//! # Starting over costs a sync
//!
//! The first write after a checkpoint that copied the whole log back starts the log again from its beginning,
//! and SQLite syncs the log's new header then (with `synchronous = NORMAL`, the one sync a commit ever makes:
//! without it, a power cut could leave new pages behind an old header and corrupt the file). That sync took
//! 0.4 to 1 ms here, in the commit of whatever came first: when this thread copied the log back every tenth of
//! a second whatever its length, nearly every relayed request that came after a pause paid it in its stream's
//! first commit, so in its time to first token (`docs/benchmarks-history.md`, session 29). So the log is
//! copied back only once it is long (a restart per [`CHECKPOINTER_PAGES`] written, not per pause), and a log
//! copied back whole is started over by the writer's thread as soon as it has nothing to commit
//! ([`start_over`], told by this thread's `copied_back`), so the sync falls in a pause, not in a commit
//! someone waits for.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often this thread looks at the log's length.
const EVERY: Duration = Duration::from_millis(100);

/// The log's length, in pages, from which this thread copies it back (4 MiB).
pub(crate) const CHECKPOINTER_PAGES: u64 = 1024;

/// The log's length, in pages, past which the writer's thread copies it back itself (16 MiB).
pub(crate) const WRITER_PAGES: u64 = 4096;

/// Copies what it can of the log back into the database file, blocking no writer and no reader (a passive
/// checkpoint). True when it copied the whole log: the next write starts it over.
pub(crate) fn copy_back(connection: &Connection) -> bool {
    // (busy, pages in the log, pages copied back): -1 pages when the file is not in WAL mode.
    let copied = connection.query_row("PRAGMA wal_checkpoint(PASSIVE);", [], |row| {
        Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match copied {
        Ok((busy, log, back)) => busy == 0 && log > 0 && back == log,
        Err(error) => {
            tracing::warn!("the store could not copy its log back into the database: {error}");
            false
        }
    }
}

/// Starts the log over (see the module doc): a write of one page that changes nothing (the schema's version,
/// set to what it is), so that SQLite writes and syncs the log's new header now, not in the next commit.
pub(crate) fn start_over(connection: &Connection) {
    let version = connection.pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0));
    let written = version.and_then(|version| connection.pragma_update(None, "user_version", version));
    if let Err(error) = written {
        tracing::warn!("the store could not start its log over: {error}");
    }
}

/// The checkpointing thread; it stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    _stop: Sender<()>,
}

impl Checkpointer {
    /// Starts the thread on the file at `path`: `pages` is the log's length after the writer's last commit,
    /// `copied_back` tells the writer the log was copied back whole.
    pub(crate) fn start(
        path: &Path,
        pages: Arc<AtomicU64>,
        copied_back: impl Fn() + Send + 'static,
    ) -> std::io::Result<Checkpointer> {
        let (stop, stopped) = channel::<()>();
        let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
            .and_then(|c| c.busy_timeout(Duration::from_secs(5)).map(|()| c))
            .map_err(std::io::Error::other)?;
        std::thread::Builder::new().name("agentmux-checkpoint".into()).spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
                if pages.load(Ordering::Relaxed) >= CHECKPOINTER_PAGES && copy_back(&connection) {
                    copied_back();
                }
            }
        })?;
        Ok(Checkpointer { _stop: stop })
    }
}
