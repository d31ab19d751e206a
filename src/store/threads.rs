//! Threads and their audit log in the store: what `crate::thread` writes through the writer, and reads back
//! at start.
//!
//! A thread is a row (its id, when it was created and last used, the calls it waits on, the key it belongs
//! to); its audit log is
//! one row per entry, by position, as the JSON the audit export shows. The history is the audit log's
//! history entries, as in memory, so storing the entries stores both.

use rusqlite::{Connection, Transaction, params};
use serde_json::Value;

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

/// A thread as the store kept it.
#[derive(Debug, Clone)]
pub(crate) struct StoredThread {
    pub(crate) id: String,
    pub(crate) created_ms: u64,
    pub(crate) used_ms: u64,
    pub(crate) pending: Value,
    pub(crate) entries: Vec<Value>,
    pub(crate) owner: Option<String>,
}

/// Every thread the store keeps, with its audit entries in order.
pub(crate) fn load(connection: &Connection) -> rusqlite::Result<Vec<StoredThread>> {
    let mut threads = Vec::new();
    let mut rows = connection.prepare("SELECT id, created_ms, used_ms, pending, owner FROM threads")?;
    let mut entries = connection.prepare("SELECT entry FROM audit WHERE thread = ?1 ORDER BY position")?;
    let listed = rows.query_map([], |row| {
        let owner: Option<String> = row.get(4)?;
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?, row.get::<_, String>(3)?, owner))
    })?;
    for thread in listed {
        let (id, created_ms, used_ms, pending, owner) = thread?;
        let kept: Vec<Value> = entries
            .query_map(params![id], |row| row.get::<_, String>(0))?
            .filter_map(|e| e.ok().and_then(|text| serde_json::from_str(&text).ok()))
            .collect();
        threads.push(StoredThread {
            id,
            created_ms: created_ms.max(0) as u64,
            used_ms: used_ms.max(0) as u64,
            pending: serde_json::from_str(&pending).unwrap_or(Value::Array(Vec::new())),
            entries: kept,
            owner,
        });
    }
    Ok(threads)
}
