//! [`Reader`]: reading a stream's entries back from the store, for readers behind what its log keeps in
//! memory (an ended stream's whole history, the old part of a long one), and each stream's figures at start.
//!
//! Reads go through read-only connections of their own, never the writer's: in WAL mode a reader sees the
//! last commit and neither waits for the writer nor holds it up. Connections are pooled (one per reader
//! reading at the same moment, kept for the next), so a read costs no open and its statements stay prepared.
//! A read copies out at most the entries it was asked for: a chunk row (decompressed whole first when it is
//! kept compressed, see `chunk.rs`) is parsed line by line and the parse stops at the last entry wanted.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};

use super::chunk;
use crate::hub::Entry;
use crate::output::OutputMessage;

/// Read-only connections to the store's file; see the module doc.
#[derive(Debug)]
pub(crate) struct Reader {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

/// Connections kept idle at most; more may be open at once while that many readers read.
const IDLE: usize = 8;

impl Reader {
    pub(crate) fn new(path: &Path) -> Arc<Self> {
        Arc::new(Reader { path: path.to_owned(), idle: Mutex::new(Vec::new()) })
    }

    fn with<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        let pooled = self.idle.lock().map(|mut idle| idle.pop()).unwrap_or(None);
        let connection = match pooled {
            Some(connection) => connection,
            None => {
                let connection = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                connection.busy_timeout(Duration::from_secs(5))?;
                connection
            }
        };
        let result = read(&connection);
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < IDLE
        {
            idle.push(connection);
        }
        result
    }

    /// Appends to `into` the entries of `stream` with sequences after `after` and up to `upto`, at most
    /// `max` of them, in order; returns how many. Fewer than asked means the store has no more of them.
    pub(crate) fn read(
        &self,
        stream: &str,
        after: u64,
        upto: u64,
        max: usize,
        into: &mut Vec<Entry>,
    ) -> rusqlite::Result<usize> {
        let want = (upto.saturating_sub(after)).min(max as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        self.with(|connection| {
            // From the row holding `after + 1` (the last row starting at or before it) on.
            let mut rows = connection.prepare_cached(
                "SELECT first, messages, bytes FROM chunks WHERE stream = ?1 AND first >= \
                 (SELECT COALESCE(MAX(first), 0) FROM chunks WHERE stream = ?1 AND first <= ?2) \
                 AND first <= ?3 ORDER BY first",
            )?;
            let mut rows = rows.query(params![stream, (after + 1) as i64, upto as i64])?;
            let mut read = 0;
            while read < want
                && let Some(row) = rows.next()?
            {
                let first = row.get::<_, i64>(0)?.max(0) as u64;
                let text = chunk::lines(row.get_ref(1)?, row.get(2)?)
                    .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Blob, e.into()))?;
                for (sequence, line) in (first..).zip(text.split('\n')) {
                    if sequence <= after {
                        continue;
                    }
                    if sequence > upto || read == want {
                        break;
                    }
                    let message: OutputMessage = serde_json::from_str(line).map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, e.into())
                    })?;
                    into.push(Entry::kept(message, line));
                    read += 1;
                }
            }
            Ok(read)
        })
    }

    /// The last sequence the store holds of `stream` (0: none), and the bytes of its entries.
    pub(crate) fn extent(&self, stream: &str) -> rusqlite::Result<(u64, u64)> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT COALESCE(MAX(last), 0), COALESCE(SUM(COALESCE(bytes, length(CAST(messages AS BLOB)))), 0) \
                 FROM chunks WHERE stream = ?1",
            )?;
            statement.query_row(params![stream], |row| {
                Ok((row.get::<_, i64>(0)?.max(0) as u64, row.get::<_, i64>(1)?.max(0) as u64))
            })
        })
    }
}
