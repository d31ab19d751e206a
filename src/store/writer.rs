//! The store's writer: one thread that owns the SQLite connection and commits what producers hand it, in
//! batches (group commit).
//!
//! Producers never wait for the disk: a stream's log hands its entries over a channel and goes on. The
//! writer takes everything waiting (up to a bound), writes it in one transaction, commits, and only then
//! moves each stream's committed watermark, which is what readers and acknowledgements wait for. Under load,
//! batches grow by themselves, so the cost of a commit is shared by everything that arrived during the last
//! one. Messages come serialised (`Serialised`, made by the appender on its own thread), so the one writer thread
//! only writes; and each stream's watermark moves once per commit, so its readers wake once per commit.
//!
//! A write that fails (a full disk, a file gone read-only) is logged, and the batch is tried again once; if
//! it fails again, the streams it touched are marked as not kept and their watermarks stay where the disk is
//! (`log.rs` says what readers then get; `Store::failures` counts it). The service then refuses the acknowledgement and ends those
//! streams with an error (`http/streams.rs`), and goes on serving everything else. The failed batch is kept
//! and written first with the next one (or at the next idle tick), so once the disk is back the rows have no
//! gap: a restart never finds a stream with a hole in its sequences.
//!
//! After deletions (evicted streams, deleted threads) the writer gives the freed pages back to the file system
//! (incremental vacuum, then a checkpoint that truncates the WAL), at most every two seconds, so the file does
//! not grow without bound as streams come and go.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

use super::log::Committed;
use super::threads::ThreadWrite;
use crate::hub::Entry;

/// The most commands in one transaction.
const BATCH: usize = 8192;

/// How often, at most, the space that deletions freed is given back (and, at the latest, this long after).
const COMPACT_EVERY: Duration = Duration::from_secs(2);

/// What the writer does.
pub(crate) enum Command {
    /// A new stream.
    Stream { id: String, epoch: String, model: String, created_ms: u64, client: Option<String> },
    /// Entries of a stream, in order (the end last, if it ended), serialised by the appender.
    Append { stream: String, entries: Serialised, committed: Arc<Committed> },
    /// A stream was evicted: its rows go.
    Evict { stream: String },
    /// Any statement, for threads and the audit log (see `threads.rs`).
    Thread(super::threads::ThreadWrite),
    /// Answers once everything sent before it is committed.
    Flush(Sender<()>),
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// A stream's entries as the writer writes them: one compact JSON message per line, serialised by whoever
/// appends them, on the producer's thread, so the one writer thread only writes.
#[derive(Debug, Default)]
pub(crate) struct Serialised {
    /// Sequences of the first and last line (0 and 0: none).
    first: u64,
    last: u64,
    lines: Vec<u8>,
    /// The last message's timestamp: when the stream ended, if it did here.
    last_ms: u64,
    /// The outcome as JSON, when these entries end the stream.
    outcome: Option<String>,
}

impl Serialised {
    pub(crate) fn of(entries: &[Entry]) -> Serialised {
        let mut out = Serialised::default();
        for entry in entries {
            match entry {
                Entry::Message { message, bytes } => {
                    let Some(metadata) = message.metadata.as_ref() else { continue };
                    let Some(sequence) = metadata.sequence else { continue };
                    out.last_ms = metadata.timestamp.unwrap_or(out.last_ms);
                    if out.lines.is_empty() {
                        out.first = sequence;
                        out.lines.reserve(*bytes as usize * entries.len());
                    } else {
                        out.lines.push(b'\n');
                    }
                    out.last = sequence;
                    // Compact JSON never holds a raw line break: a line is a message. Writing to a Vec cannot
                    // fail, and a message always serialises.
                    let _ = serde_json::to_writer(&mut out.lines, &**message);
                }
                Entry::End(outcome) => out.outcome = Some(serde_json::to_string(&**outcome).unwrap_or_default()),
            }
        }
        out
    }
}

/// A handle to send the writer commands; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    tx: Sender<Command>,
    failures: Arc<AtomicU64>,
    /// The last write failed (and nothing was written since).
    failing: Arc<std::sync::atomic::AtomicBool>,
}

impl Writer {
    /// Starts the writer thread on `connection`.
    pub(crate) fn start(connection: Connection) -> std::io::Result<Writer> {
        let (tx, rx) = channel();
        let failures = Arc::new(AtomicU64::new(0));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counted, state) = (Arc::clone(&failures), Arc::clone(&failing));
        std::thread::Builder::new()
            .name("agentmux-store".into())
            .spawn(move || run(connection, rx, &counted, &state))?;
        Ok(Writer { tx, failures, failing })
    }

    pub(crate) fn send(&self, command: Command) {
        // The writer lives as long as any handle: a send fails only if it panicked, which it does not.
        let _ = self.tx.send(command);
    }

    /// Waits until everything sent so far is committed.
    pub(crate) fn flush(&self) {
        let (tx, rx) = channel();
        self.send(Command::Flush(tx));
        let _ = rx.recv();
    }

    /// Batches that could not be written.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// True while the writer cannot write: its last batch failed.
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

fn run(
    mut connection: Connection,
    rx: Receiver<Command>,
    failures: &AtomicU64,
    failing: &std::sync::atomic::AtomicBool,
) {
    // What a failed write held, written again, first, with the next batch: a stream's rows never have a gap.
    let mut carried: Vec<Command> = Vec::new();
    // Space freed by deletions is given back at most every `COMPACT_EVERY`, and once the writer is idle.
    let mut freed = false;
    let mut compacted = Instant::now();
    loop {
        let first = match rx.recv_timeout(COMPACT_EVERY) {
            Ok(command) => Some(command),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if first.is_none() && carried.is_empty() {
            if freed {
                compact(&connection);
                (freed, compacted) = (false, Instant::now());
            }
            continue;
        }
        let mut batch = std::mem::take(&mut carried);
        batch.extend(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        let mut written = write(&mut connection, &batch);
        if let Err(error) = &written {
            tracing::error!("the store could not write a batch ({error}); trying again");
            std::thread::sleep(Duration::from_millis(100));
            written = write(&mut connection, &batch);
        }
        let failed = written.is_err();
        failing.store(failed, Ordering::Relaxed);
        if let Err(error) = written {
            failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                "the store could not write a batch of {} commands: {error}; it is kept to try again",
                batch.len()
            );
        }
        freed |= batch.iter().any(|c| matches!(c, Command::Evict { .. } | Command::Thread(ThreadWrite::Delete { .. })));
        if freed && compacted.elapsed() >= COMPACT_EVERY {
            compact(&connection);
            (freed, compacted) = (false, Instant::now());
        }
        // Each stream's watermark moves once per commit, to the last it wrote: its readers wake once.
        let mut moved: HashMap<*const Committed, (&Arc<Committed>, u64, bool)> = HashMap::new();
        for command in &batch {
            match command {
                Command::Append { entries, committed, .. } => {
                    let (last, ended) = (entries.last, entries.outcome.is_some());
                    let at = moved.entry(Arc::as_ptr(committed)).or_insert((committed, 0, false));
                    (at.1, at.2) = (at.1.max(last), at.2 || ended);
                }
                Command::Flush(_) => {}
                _ => {}
            }
        }
        for (committed, last, ended) in moved.into_values() {
            if failed {
                committed.fail();
            } else {
                committed.advance(last, ended);
            }
        }
        for command in &batch {
            if let Command::Flush(done) = command {
                let _ = done.send(());
            }
        }
        if failed {
            batch.retain(|c| !matches!(c, Command::Flush(_)));
            carried = batch;
        }
    }
}

/// Gives the pages that deletions freed back to the file system: the database's free pages, then the WAL.
fn compact(connection: &Connection) {
    // The pages must be in the database file to be freed from it, and the file shrinks at a checkpoint.
    let checkpoint = || connection.query_row("PRAGMA wal_checkpoint(TRUNCATE);", [], |_| Ok(()));
    // Each step of the pragma frees a page: step it to the end.
    let vacuum = || -> rusqlite::Result<()> {
        let mut statement = connection.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = statement.query([])?;
        while rows.next()?.is_some() {}
        Ok(())
    };
    let done = checkpoint().and_then(|()| vacuum()).and_then(|()| checkpoint());
    if let Err(error) = done {
        tracing::warn!("the store could not give back freed space: {error}");
    }
}

/// Consecutive entries of one stream, as one row: `first..=last`, one JSON message per line.
#[derive(Default)]
struct Chunk {
    first: u64,
    last: u64,
    lines: Vec<u8>,
}

fn write(connection: &mut Connection, batch: &[Command]) -> rusqlite::Result<()> {
    let tx = connection.transaction()?;
    {
        let mut insert =
            tx.prepare_cached("INSERT OR REPLACE INTO chunks (stream, first, last, messages) VALUES (?1, ?2, ?3, ?4)")?;
        let mut flush = |stream: &str, chunk: Chunk| -> rusqlite::Result<()> {
            if chunk.lines.is_empty() {
                return Ok(());
            }
            // Bound as text (the column is read back as such): serde_json writes UTF-8.
            let lines = std::str::from_utf8(&chunk.lines).unwrap_or_default();
            insert.execute(params![stream, chunk.first as i64, chunk.last as i64, lines]).map(drop)
        };
        // A stream's entries in this batch become one row: a commit writes a row per stream, not per message.
        let mut open: HashMap<&str, Chunk> = HashMap::new();
        for command in batch {
            match command {
                Command::Stream { id, epoch, model, created_ms, client } => {
                    tx.execute(
                        "INSERT OR REPLACE INTO streams (id, epoch, model, created_ms, client) VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![id, epoch, model, *created_ms as i64, client],
                    )?;
                }
                Command::Append { stream, entries, .. } => {
                    if !entries.lines.is_empty() {
                        let chunk = open.entry(stream.as_str()).or_default();
                        if chunk.lines.is_empty() {
                            chunk.first = entries.first;
                        } else {
                            chunk.lines.push(b'\n');
                        }
                        chunk.last = entries.last;
                        chunk.lines.extend_from_slice(&entries.lines);
                    }
                    if let Some(outcome) = &entries.outcome {
                        if let Some(chunk) = open.remove(stream.as_str()) {
                            flush(stream, chunk)?;
                        }
                        tx.execute(
                            "UPDATE streams SET outcome = ?2, ended_ms = ?3 WHERE id = ?1",
                            params![stream, outcome, entries.last_ms as i64],
                        )?;
                    }
                }
                Command::Evict { stream } => {
                    open.remove(stream.as_str());
                    tx.execute("DELETE FROM chunks WHERE stream = ?1", params![stream])?;
                    tx.execute("DELETE FROM streams WHERE id = ?1", params![stream])?;
                }
                Command::Thread(write) => write.apply(&tx)?,
                Command::Flush(_) => {}
            }
        }
        for (stream, chunk) in open {
            flush(stream, chunk)?;
        }
    }
    tx.commit()
}
