//! [`Checkpointer`]: copies the write-ahead log back into the database file on a thread of its own, so the
//! writer's commits seldom wait for it.
//!
//! In WAL mode a commit appends pages to the log; a checkpoint copies them into the database file and syncs
//! it, so the log can start over. SQLite runs one by itself in the committing connection once the log passes
//! 1,000 pages, which put a copy of 4 MB and two syncs (about 35 ms here) in the path of whichever
//! acknowledgement, and every reader waiting on it, came next. This thread runs a passive checkpoint (one
//! that never blocks the writer or a reader) ten times a second on a connection of its own, so the copying
//! and syncing happen beside the writer. Under writes that never pause, a passive checkpoint may not reach the
//! log's end, and the log starts over only after one has: the writer's thread checkpoints too once the log
//! passes [`WRITER_PAGES`] (in place of SQLite's automatic checkpoint, which would run in whichever thread
//! committed), as the bound, and then finds little left to copy. The writer also truncates the log
//! after deletions (`writer.rs`, compaction).

use std::path::Path;
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the log is copied back.
const EVERY: Duration = Duration::from_millis(100);

/// The log's length, in pages, past which the writer's thread copies it back itself (16 MiB).
pub(crate) const WRITER_PAGES: u64 = 4096;

/// Copies what it can of the log back into the database file, blocking no writer and no reader (a passive
/// checkpoint).
pub(crate) fn copy_back(connection: &Connection) {
    let copied = connection.query_row("PRAGMA wal_checkpoint(PASSIVE);", [], |_| Ok(()));
    if let Err(error) = copied {
        tracing::warn!("the store could not copy its log back into the database: {error}");
    }
}

/// The checkpointing thread; it stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    _stop: Sender<()>,
}

impl Checkpointer {
    pub(crate) fn start(path: &Path) -> std::io::Result<Checkpointer> {
        let (stop, stopped) = channel::<()>();
        let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
            .and_then(|c| c.busy_timeout(Duration::from_secs(5)).map(|()| c))
            .map_err(std::io::Error::other)?;
        std::thread::Builder::new().name("agentmux-checkpoint".into()).spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
                copy_back(&connection);
            }
        })?;
        Ok(Checkpointer { _stop: stop })
    }
}
