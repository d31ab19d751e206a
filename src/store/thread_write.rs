//! [`ThreadWrite`]: one change to the threads' tables, as the writer's thread applies it.
//!
//! A file of its own because both sides name it: the threads' storage (`thread_storage.rs`) makes these and
//! sends them through the writer, and the writer (`writer.rs`) applies them in its transaction, beside the
//! streams' rows, so a thread's change and the stream it ran commit in the same order they happened.

use rusqlite::{Transaction, params};

/// One change to the threads.
#[derive(Debug, Clone)]
pub(crate) enum ThreadWrite {
    /// A thread, new or changed.
    Thread { id: String, created_ms: u64, used_ms: u64, pending: String, owner: Option<String> },
    /// An audit entry at `position` of `thread`.
    Entry { thread: String, position: u64, entry: String },
    /// A thread deleted or evicted.
    Delete { id: String },
}

impl ThreadWrite {
    pub(crate) fn apply(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        match self {
            ThreadWrite::Thread { id, created_ms, used_ms, pending, owner } => {
                tx.execute(
                    "INSERT INTO threads (id, created_ms, used_ms, pending, owner) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT(id) DO UPDATE SET used_ms = ?3, pending = ?4",
                    params![id, *created_ms as i64, *used_ms as i64, pending, owner],
                )?;
            }
            ThreadWrite::Entry { thread, position, entry } => {
                tx.execute(
                    "INSERT OR REPLACE INTO audit (thread, position, entry) VALUES (?1, ?2, ?3)",
                    params![thread, *position as i64, entry],
                )?;
            }
            ThreadWrite::Delete { id } => {
                tx.execute("DELETE FROM audit WHERE thread = ?1", params![id])?;
                tx.execute("DELETE FROM threads WHERE id = ?1", params![id])?;
            }
        }
        Ok(())
    }
}
