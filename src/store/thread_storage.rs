//! The store as the threads' storage ([`ThreadStorage`]): a journal of the threads this process holds,
//! written through the writer as the thread registry hands it each change, and read back at start
//! ([`Store::restore_threads`], an explicit step like [`Store::restore`] for streams).
//!
//! A thread is a row (its id, when it was created and last used, the calls it waits on, the key it belongs
//! to); its audit log is one row per entry, by position, as the JSON the audit export shows. The history is
//! the audit log's history entries, as in memory, so storing the entries stores both.

use rusqlite::{Connection, params};

use super::Store;
use super::thread_write::ThreadWrite;
use super::writer::Command;
use crate::thread::{Change, Commit, RestoredThread, ThreadStorage, Threads};

/// Every thread the store keeps, with its audit entries in order (an entry that does not read back is left
/// out).
pub(super) fn load(connection: &Connection) -> rusqlite::Result<Vec<RestoredThread>> {
    let mut threads = Vec::new();
    let mut rows = connection.prepare("SELECT id, created_ms, used_ms, pending, owner FROM threads")?;
    let mut entries = connection.prepare("SELECT entry FROM audit WHERE thread = ?1 ORDER BY position")?;
    let listed = rows.query_map([], |row| {
        let owner: Option<String> = row.get(4)?;
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?, row.get::<_, String>(3)?, owner))
    })?;
    for thread in listed {
        let (id, created_ms, used_ms, pending, owner) = thread?;
        let kept = entries
            .query_map(params![id], |row| row.get::<_, String>(0))?
            .filter_map(|e| e.ok().and_then(|text| serde_json::from_str(&text).ok()))
            .collect();
        threads.push(RestoredThread {
            id,
            created_ms: created_ms.max(0) as u64,
            used_ms: used_ms.max(0) as u64,
            pending: serde_json::from_str(&pending).unwrap_or_default(),
            entries: kept,
            owner,
        });
    }
    Ok(threads)
}

impl Store {
    /// Gives `threads` back the threads kept from before a restart (once: later calls give none); how many.
    /// `threads` should keep its threads in this store (see [`crate::http::App::with_store`]).
    pub fn restore_threads(&self, threads: &Threads) -> usize {
        let kept = std::mem::take(&mut *crate::sync::lock(&self.threads));
        let count = kept.len();
        for thread in kept {
            threads.restore(thread);
        }
        count
    }

    fn write_thread(&self, write: ThreadWrite) {
        self.writer.send(Command::Thread(write));
    }
}

impl ThreadStorage for Store {
    fn changed(&self, change: &Change<'_>) -> Option<Commit> {
        for (offset, entry) in change.new_entries().iter().enumerate() {
            let entry = serde_json::to_string(entry).unwrap_or_default();
            let (thread, position) = (change.id.to_owned(), (change.kept + offset) as u64);
            self.write_thread(ThreadWrite::Entry { thread, position, entry });
        }
        self.write_thread(ThreadWrite::Thread {
            id: change.id.to_owned(),
            created_ms: change.created_ms,
            used_ms: change.used_ms,
            pending: serde_json::to_string(change.pending).unwrap_or_else(|_| "[]".into()),
            owner: change.owner.map(str::to_owned),
        });
        None
    }

    fn forget(&self, id: &str) {
        self.write_thread(ThreadWrite::Delete { id: id.to_owned() });
    }
}
