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
//! One shortcut: a producer about to wait for its acknowledgement commits what is waiting itself, on its own
//! thread, when nobody is committing at that moment ([`Writer::hasten`]; whoever holds the connection is the
//! only one taking commands, so the order stays the order of sending). The two hand-offs it skips (the
//! writer's thread woken, then the waiting task woken from outside the runtime) cost more than the commit on
//! two busy cores. Measured side by side (`docs/benchmarks-history.md`, session 11, six alternating pairs): one message per
//! durable POST to 100 subscribers 172–196k → 251–319k deliveries/s; batched fan-out unchanged within its
//! noise; to 1,000 subscribers one message per POST 0.89× (median of three pairs), where the commit now holds
//! a runtime thread that has deliveries to make. A producer that appends only to wait for the commit at once
//! (a durable POST: [`Writer::queue`], then [`Writer::hasten`]) does not wake the writer's thread at all,
//! which would then race it for the connection (and won about half the time, under load: the hand-offs
//! again, and a futex wake per POST); `hasten` wakes the thread only when it cannot commit itself. Measured
//! side by side (`docs/benchmarks-history.md`, session 12, twelve alternating rounds): a 128-message durable POST to 100
//! subscribers 0.865× → 0.930× the throughput in memory, and its p99 publish-to-receive 1.16× → 1.05×
//! memory's. A commit is a write to the WAL with no fsync (`mod.rs`), a
//! few hundred microseconds at most; a write that fails there is left to the writer's thread, and so is
//! copying the log back into the file once it is long (SQLite's automatic checkpoint, which would run in the
//! committing thread and sync, is replaced by the writer's own; see `Writer::start`). So is starting the log
//! over once it was copied back whole, which syncs its new header: the writer's thread does it when it has
//! nothing to commit, not in the next commit (`checkpoint.rs`, "Starting over costs a sync").
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
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::hooks::Wal;
use rusqlite::{Connection, params};

use super::checkpoint;
use super::chunk::Stored;
use super::thread_write::ThreadWrite;
use crate::hub::Committed;
use crate::hub::Entry;
use crate::sync::lock;

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
    /// Any statement, for threads and the audit log (see `thread_storage.rs`).
    Thread(ThreadWrite),
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
                Entry::Message { message, bytes, json } => {
                    let Some(metadata) = message.metadata.as_ref() else { continue };
                    let Some(sequence) = metadata.sequence else { continue };
                    out.last_ms = metadata.timestamp.unwrap_or(out.last_ms);
                    if out.lines.is_empty() {
                        out.first = sequence;
                        out.lines.reserve((*bytes as usize + 1) * entries.len());
                    } else {
                        out.lines.push(b'\n');
                    }
                    out.last = sequence;
                    // Compact JSON never holds a raw line break: a line is a message, as it was logged.
                    match json {
                        Some(json) => out.lines.extend_from_slice(json),
                        None => crate::hub::write_json(&mut out.lines, message),
                    }
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
    state: Arc<WriterState>,
}

/// The state the writer's thread and a caller in a hurry ([`Writer::hasten`]) share.
struct WriterState {
    /// Held by whoever commits: only its holder takes commands from the channel, so they are written in
    /// the order they were sent.
    desk: Mutex<Desk>,
    /// Commands were sent since the writer's thread last looked.
    sent: Mutex<bool>,
    wake: Condvar,
    failures: AtomicU64,
    /// The last write failed (and nothing was written since).
    failing: AtomicBool,
    /// Pages in the write-ahead log after the last commit (SQLite's WAL hook says).
    wal_pages: Arc<AtomicU64>,
    /// The log was copied back whole since the writer's thread last looked: it starts the log over once it
    /// has nothing to commit (`checkpoint.rs`, "Starting over costs a sync").
    copied_back: AtomicBool,
}

impl std::fmt::Debug for WriterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterState").field("failures", &self.failures).field("failing", &self.failing).finish()
    }
}

/// The connection and what goes with it.
struct Desk {
    connection: Connection,
    rx: Receiver<Command>,
    /// What a failed write held, written again, first, with the next batch: a stream's rows never have a gap.
    carried: Vec<Command>,
    /// Something was committed since the log last started over: a log copied back whole is started over
    /// again only then (the write that starts it over is one more page for the next checkpoint).
    wrote: bool,
    /// Space was freed by deletions since the last compaction.
    freed: bool,
    compacted: Instant,
}

/// What a commit found.
#[derive(PartialEq, Eq)]
enum Drained {
    /// It wrote what there was (or tried to).
    Wrote,
    /// There was nothing to write.
    Nothing,
    /// Nothing, and nobody can send more: the store is gone.
    Closed,
}

impl Writer {
    /// Starts the writer thread on `connection`.
    ///
    /// The connection's automatic checkpoint is replaced by a count of the log's pages: past
    /// [`checkpoint::WRITER_PAGES`] the writer's thread copies the log back itself, so that no commit made on
    /// a producer's thread ([`Writer::hasten`]) ever runs a checkpoint there.
    pub(crate) fn start(mut connection: Connection) -> std::io::Result<Writer> {
        let wal_pages = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&wal_pages);
        connection
            .wal_hook(Some(move |_: &mut Wal, pages: c_int| {
                counted.store(u64::try_from(pages).unwrap_or_default(), Ordering::Relaxed);
                Ok(())
            }))
            .map_err(std::io::Error::other)?;
        let (tx, rx) = channel();
        let desk = Desk { connection, rx, carried: Vec::new(), wrote: false, freed: false, compacted: Instant::now() };
        let state = Arc::new(WriterState {
            desk: Mutex::new(desk),
            sent: Mutex::new(false),
            wake: Condvar::new(),
            failures: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            wal_pages,
            copied_back: AtomicBool::new(false),
        });
        let thread = Arc::clone(&state);
        std::thread::Builder::new().name("agentmux-store".into()).spawn(move || run(&thread))?;
        Ok(Writer { tx, state })
    }

    pub(crate) fn send(&self, command: Command) {
        self.queue(command);
        self.state.wake();
    }

    /// Sends without waking the writer's thread: for a caller that calls [`Writer::hasten`] next, which
    /// commits it or wakes that thread.
    pub(crate) fn queue(&self, command: Command) {
        // The writer lives as long as any handle: a send fails only if it panicked, which it does not.
        let _ = self.tx.send(command);
    }

    /// Commits what was sent, here and now, when nobody else is committing (otherwise whoever is, or the
    /// writer's thread next, does): for a caller about to wait for a commit, which then skips the hand-offs to
    /// the writer's thread and back. Under load those cost more than the commit itself: on two busy cores,
    /// about 0.25 ms for the writer's thread to run once woken, and as much for the waiting task to be polled
    /// once woken from outside the runtime (`docs/benchmarks-history.md`, session 10), against about 0.1 ms to write and
    /// commit a 128-message POST. A write that fails here is left to the writer's thread, which tries again.
    /// Not when the log is due to be copied back: that is the writer thread's. When it does not commit here,
    /// it wakes the writer's thread, which may not have been woken for what was [queued](Writer::queue).
    pub(crate) fn hasten(&self) {
        let desk = if self.state.log_is_long() { None } else { self.state.desk.try_lock().ok() };
        match desk {
            Some(mut desk) => {
                commit(&mut desk, &self.state, false);
            }
            None => self.state.wake(),
        }
    }

    /// Waits until everything sent so far is committed.
    pub(crate) fn flush(&self) {
        let (tx, rx) = channel();
        self.send(Command::Flush(tx));
        let _ = rx.recv();
    }

    /// The log's length in pages after the last commit, for the checkpointing thread (`checkpoint.rs`).
    pub(crate) fn log_pages(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.state.wal_pages)
    }

    /// What the checkpointing thread calls when it copied the log back whole: the writer's thread starts the
    /// log over as soon as it has nothing to commit, so that no commit pays for it (`checkpoint.rs`).
    pub(crate) fn on_copied_back(&self) -> impl Fn() + Send + 'static {
        let state = Arc::clone(&self.state);
        move || {
            state.copied_back.store(true, Ordering::Release);
            state.wake();
        }
    }

    /// Holds the connection, so that nothing commits until the result is dropped.
    #[cfg(test)]
    pub(crate) fn hold(&self) -> impl Sized + '_ {
        lock(&self.state.desk)
    }

    /// Batches that could not be written.
    pub(crate) fn failures(&self) -> u64 {
        self.state.failures.load(Ordering::Relaxed)
    }

    /// True while the writer cannot write: its last batch failed.
    pub(crate) fn failing(&self) -> bool {
        self.state.failing.load(Ordering::Relaxed)
    }
}

impl WriterState {
    /// The write-ahead log is past the length at which it is copied back.
    fn log_is_long(&self) -> bool {
        self.wal_pages.load(Ordering::Relaxed) >= checkpoint::WRITER_PAGES
    }

    /// Wakes the writer's thread.
    fn wake(&self) {
        *lock(&self.sent) = true;
        self.wake.notify_one();
    }
}

/// The writer's thread: commits whatever was sent, as soon as it is woken, until nothing is left; gives
/// freed space back once idle, or after a while; starts a log copied back whole over while nothing waits.
fn run(state: &WriterState) {
    let mut idle = false;
    loop {
        let mut desk = lock(&state.desk);
        let drained = commit(&mut desk, state, true);
        if drained == Drained::Closed {
            break;
        }
        if state.log_is_long() {
            let whole = checkpoint::copy_back(&desk.connection);
            state.copied_back.fetch_or(whole, Ordering::AcqRel);
            // Until the next commit says how long the log is now.
            state.wal_pages.store(0, Ordering::Relaxed);
        }
        if desk.freed && (idle || desk.compacted.elapsed() >= COMPACT_EVERY) {
            compact(&desk.connection);
            (desk.freed, desk.compacted) = (false, Instant::now());
            state.wal_pages.store(0, Ordering::Relaxed);
            // Truncated: the next write starts it over.
            state.copied_back.store(true, Ordering::Release);
        }
        if drained == Drained::Nothing && state.copied_back.swap(false, Ordering::AcqRel) && desk.wrote {
            // Nothing to commit: the log's new header is written and synced now, not in the next commit.
            checkpoint::start_over(&desk.connection);
            desk.wrote = false;
        }
        drop(desk);
        if drained == Drained::Wrote {
            // More may have come meanwhile (or a batch's bound left some): look again at once.
            idle = false;
            continue;
        }
        let sent = lock(&state.sent);
        let (mut sent, waited) = state
            .wake
            .wait_timeout_while(sent, COMPACT_EVERY, |sent| !*sent)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        idle = waited.timed_out();
        *sent = false;
    }
}

/// Writes everything waiting, what a failed write left first, in one transaction (up to [`BATCH`] commands),
/// then moves the watermarks. `patient`: the writer's thread, which tries a failed write again after a
/// pause and counts it; a caller in a hurry leaves it to that thread.
fn commit(desk: &mut Desk, state: &WriterState, patient: bool) -> Drained {
    let mut batch = std::mem::take(&mut desk.carried);
    let mut closed = false;
    while batch.len() < BATCH {
        match desk.rx.try_recv() {
            Ok(command) => batch.push(command),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                closed = true;
                break;
            }
        }
    }
    if batch.is_empty() {
        return if closed { Drained::Closed } else { Drained::Nothing };
    }
    if !patient && batch.len() == BATCH {
        // More may be waiting than one transaction takes: the writer's thread takes the rest.
        state.wake();
    }
    let mut written = write(&mut desk.connection, &batch);
    if !patient && written.is_err() {
        // Put back, first, for the writer's thread: it tries again, and says what failed.
        desk.carried = batch;
        state.wake();
        return Drained::Wrote;
    }
    if !patient && state.log_is_long() {
        // This commit took the log past its bound: the writer's thread copies it back.
        state.wake();
    }
    if let Err(error) = &written {
        tracing::error!("the store could not write a batch ({error}); trying again");
        std::thread::sleep(Duration::from_millis(100));
        written = write(&mut desk.connection, &batch);
    }
    let failed = written.is_err();
    state.failing.store(failed, Ordering::Relaxed);
    if !failed {
        // This commit started a log copied back whole over, if it was: nothing left to start over.
        desk.wrote = true;
        state.copied_back.store(false, Ordering::Release);
    }
    if let Err(error) = written {
        state.failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            "the store could not write a batch of {} commands: {error}; it is kept to try again",
            batch.len()
        );
    }
    desk.freed |=
        batch.iter().any(|c| matches!(c, Command::Evict { .. } | Command::Thread(ThreadWrite::Delete { .. })));
    // Each stream's watermark moves once per commit, to the last it wrote: its readers wake once.
    let mut moved: HashMap<*const Committed, (&Arc<Committed>, u64, bool)> = HashMap::new();
    for command in &batch {
        if let Command::Append { entries, committed, .. } = command {
            let (last, ended) = (entries.last, entries.outcome.is_some());
            let at = moved.entry(Arc::as_ptr(committed)).or_insert((committed, 0, false));
            (at.1, at.2) = (at.1.max(last), at.2 || ended);
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
        desk.carried = batch;
    }
    Drained::Wrote
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
        let mut insert = tx.prepare_cached(
            "INSERT OR REPLACE INTO chunks (stream, first, last, messages, bytes) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let mut flush = |stream: &str, chunk: Chunk| -> rusqlite::Result<()> {
            if chunk.lines.is_empty() {
                return Ok(());
            }
            let (first, last, bytes) = (chunk.first as i64, chunk.last as i64, chunk.lines.len() as i64);
            insert.execute(params![stream, first, last, Stored::of(&chunk.lines), bytes]).map(drop)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::MemoryLog;

    fn lines(first: u64, last: u64) -> Serialised {
        let text: Vec<String> =
            (first..=last).map(|n| format!(r#"{{"type":"text","props":{{"content":"{n}"}}}}"#)).collect();
        Serialised { first, last, lines: text.join("\n").into_bytes(), last_ms: 0, outcome: None }
    }

    #[test]
    fn a_queued_append_is_committed_by_its_hastening_caller_or_by_the_writer_it_wakes() {
        let dir = std::env::temp_dir().join(format!("agentmux-hasten-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let connection =
            super::super::open_connection(&dir.join("s.sqlite3"), rusqlite::OpenFlags::default()).expect("open");
        super::super::schema::migrate(&connection).expect("migrate");
        let writer = Writer::start(connection).expect("writer");
        writer.send(Command::Stream {
            id: "s".into(),
            epoch: "e".into(),
            model: "m".into(),
            created_ms: 0,
            client: None,
        });
        writer.flush();
        let committed = Committed::new(0, false, MemoryLog::default());
        let append = |first, last| Command::Append {
            stream: "s".into(),
            entries: lines(first, last),
            committed: Arc::clone(&committed),
        };

        let settled = |sequence| {
            while committed.sequence() < sequence {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // Nobody is committing: the caller commits what it queued, on its own thread, before `hasten` returns.
        // (The writer's thread answers a flush before it lets go of the connection: it may still hold it
        // for a moment, and then the caller leaves it the commit; so until the thread is idle, again.)
        let mut last = 0;
        let by_caller = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            last += 1;
            writer.queue(append(last, last));
            writer.hasten();
            let here = committed.sequence() == last;
            settled(last);
            here
        });
        assert!(by_caller, "committed by the caller");

        // Somebody is (the desk is held): the caller wakes the writer's thread, which commits once it may.
        let desk = lock(&writer.state.desk);
        writer.queue(append(last + 1, last + 2));
        writer.hasten();
        assert_eq!(committed.sequence(), last, "not committed while the desk is held");
        drop(desk);
        let woken = Instant::now();
        while committed.sequence() < last + 2 && woken.elapsed() < COMPACT_EVERY / 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Not woken, it would sleep until its idle tick (`COMPACT_EVERY`).
        assert_eq!(committed.sequence(), last + 2, "committed by the woken writer");
        drop(writer);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
