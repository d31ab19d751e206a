//! The embedded store: streams, threads and the audit log in one SQLite file (`--data-dir`, WAL mode), so a
//! crash or a deploy loses nothing acknowledged and clients resume across a restart.
//!
//! - [`Store`] (this file): opening the file (creating the directory, running the versioned migrations),
//!   the hub's [`Storage`] (a [`StoreLog`] per stream), and what comes back at start: ended streams readable
//!   and resumable as before, streams open at the crash ended with `interrupted`, streams past their retention
//!   deleted; and the threads, given back to the thread registry by [`Store::restore_threads`].
//! - `writer.rs`: the one thread that writes, in batches (group commit), off every producer's path.
//! - `log.rs`: [`StoreLog`], a stream's log: its hot part in memory, readable once committed, the rest read
//!   back from the file; `read.rs`: reading entries back, on read-only connections of their own.
//! - `checkpoint.rs`: copying the write-ahead log back into the file, beside the writer; `chunk.rs`: how
//!   a commit's entries of a stream are kept in a row (compressed when long).
//! - `schema.rs`: the migrations; `thread_storage.rs`: the threads' storage
//!   ([`crate::thread`]'s journal), threads and audit rows; `thread_write.rs`: one change to those rows, as the
//!   writer applies it.
//!
//! # One history per (epoch, sequence)
//!
//! A client must never see two different messages under one epoch and sequence, across any crash. Two ways
//! were open: deliver only committed entries, or deliver at once and give every stream that was open at a
//! crash a new epoch at restart (so a client holding the old one starts over). agentmux delivers only
//! committed entries. Then every sequence a client has seen is on disk, a restart resumes every history
//! exactly where its readers are, epochs never change, and `Last-Event-ID` (which carries no epoch) stays
//! enough to resume. The cost is the commit in the publish-to-receive path: the writer commits in groups, so
//! the cost is one commit shared by everything that arrived meanwhile, and with `synchronous = NORMAL` in WAL
//! mode a commit is a write to the WAL without an fsync (durable across a process crash; an OS crash may lose
//! the last commits before the next checkpoint). Delivering at once would cost nothing on that path, but every
//! client of a stream open at a crash would lose its place.
//!
//! Measured side by side (`docs/benchmarks-history.md`, session 6: this build against the same build patched to hand
//! readers every entry at once and to wait for the commit only in acknowledgements; two pairs of quick runs):
//! at a steady 100 messages/s to 500 subscribers, publish-to-receive p50 2.5–2.7 ms against 2.3–2.4 ms, p99
//! 3.8–4.4 ms against 4.3–4.7 ms (within the noise); a burst to 100 subscribers p99 4.9–5.3 ms against
//! 3.2–3.4 ms at the same throughput; a burst to 1,000, p99 37–52 ms against 42–48 ms. The commit costs about
//! 0.2 ms at a steady rate and up to 2 ms of tail in a burst. Where it costs more is CPU on the token path:
//! 200 concurrent chat runs give 230–270k chunks/s against 375–435k/s (more, and larger, allocations while
//! readers wait for a commit; the performance issue takes this up). Neither changes what a client sees, and
//! only this one keeps every client's place across a crash.
//!
//! A disk that fails is the one case where the writer cannot commit: readers then stop at what is on disk
//! (see `log.rs`), so that guarantee holds there too.

mod checkpoint;
mod chunk;
mod log;
mod read;
mod schema;
mod thread_storage;
mod thread_write;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use checkpoint::Checkpointer;
pub(crate) use log::StoreLog;
use read::Reader;
use writer::{Command, Writer};

use crate::hub::{Entry, Hub, Restored, Storage, StreamInfo};
use crate::output::{ErrorProps, Outcome, OutputMessage};
use crate::thread::RestoredThread;

/// Why the store could not open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The directory could not be made or used.
    #[error("the data directory {path}: {error}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// SQLite refused: a file that is not a database, a disk that is full or read-only.
    #[error("the store {path}: {error}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// Why.
        error: rusqlite::Error,
    },
}

/// The embedded store; see the module doc.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    writer: Writer,
    reader: Arc<Reader>,
    _checkpointer: Checkpointer,
    /// The threads kept from before this start, until [`Store::restore_threads`] hands them back.
    threads: Mutex<Vec<RestoredThread>>,
    /// The key stream tokens are signed with, made on the store's first start.
    secret: [u8; 32],
}

/// The secret called `name`, made and kept the first time it is asked for.
fn secret(connection: &Connection, name: &str) -> rusqlite::Result<[u8; 32]> {
    let kept: Option<Vec<u8>> = connection
        .query_row("SELECT value FROM secrets WHERE name = ?1", [name], |r| r.get(0))
        .map(Some)
        .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })?;
    if let Some(secret) = kept.and_then(|v| <[u8; 32]>::try_from(v).ok()) {
        return Ok(secret);
    }
    let secret = crate::hub::random_secret();
    connection.execute(
        "INSERT OR REPLACE INTO secrets (name, value) VALUES (?1, ?2)",
        rusqlite::params![name, &secret[..]],
    )?;
    Ok(secret)
}

/// What the store found at start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    /// Ended streams, readable again.
    pub streams: usize,
    /// Streams that were open, now ended with `interrupted`.
    pub interrupted: usize,
    /// Streams past their retention, deleted.
    pub expired: usize,
    /// Threads read back, which [`Store::restore_threads`] gives to the thread registry.
    pub threads: usize,
}

/// A stream's row.
struct StreamRow {
    id: String,
    epoch: String,
    model: String,
    created_ms: u64,
    outcome: Option<String>,
    ended_ms: Option<u64>,
    /// The client it was made for: it counts against that client's budget again.
    client: Option<String>,
}

/// The file in the data directory.
const FILE: &str = "agentmux.sqlite3";

fn open_connection(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    let connection = Connection::open_with_flags(path, flags)?;
    connection.busy_timeout(Duration::from_secs(5))?;
    // Only a new file takes it, and only before its first write (the switch to WAL is one): pages that
    // deletions free can then be given back to the file system.
    connection.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(connection)
}

/// Whether `dir` takes a new file, as SQLite needs (its WAL and shared memory are files beside the database).
fn writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(".agentmux-probe");
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

impl Store {
    /// Opens (or creates) the store in `dir`, running the migrations it lacks.
    pub fn open(dir: &Path) -> Result<Arc<Store>, StoreError> {
        std::fs::create_dir_all(dir).map_err(|error| StoreError::Directory { path: dir.to_owned(), error })?;
        let path = dir.join(FILE);
        // Of a directory it cannot write (a read-only file system), SQLite says only "unable to open database
        // file" or "attempt to write a readonly database": then the system's reason is the error.
        let sqlite = |error| match writable(dir) {
            Err(error) => StoreError::Directory { path: dir.to_owned(), error },
            Ok(()) => StoreError::Sqlite { path: path.clone(), error },
        };
        let connection = open_connection(&path, OpenFlags::default()).map_err(sqlite)?;
        // Checkpoints run beside the writer (`checkpoint.rs`); the writer's thread bounds the log's length.
        schema::migrate(&connection).map_err(sqlite)?;
        let threads = thread_storage::load(&connection).map_err(sqlite)?;
        let secret = secret(&connection, "tokens").map_err(sqlite)?;
        let writer =
            Writer::start(connection).map_err(|error| StoreError::Directory { path: dir.to_owned(), error })?;
        let reader = Reader::new(&path);
        let checkpointer = Checkpointer::start(&path, writer.log_pages(), writer.on_copied_back())
            .map_err(|error| StoreError::Directory { path: dir.to_owned(), error })?;
        Ok(Arc::new(Store { path, writer, reader, _checkpointer: checkpointer, threads: Mutex::new(threads), secret }))
    }

    /// The key stream tokens are signed with: the same at every start of this store.
    pub fn secret(&self) -> [u8; 32] {
        self.secret
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until everything handed to the writer so far is committed.
    pub fn flush(&self) {
        self.writer.flush();
    }

    /// Batches the writer could not write (a full or read-only disk).
    pub fn failures(&self) -> u64 {
        self.writer.failures()
    }

    /// True while the store cannot write: its last batch failed, and nothing was written since.
    pub fn failing(&self) -> bool {
        self.writer.failing()
    }

    /// Gives `hub` back the streams kept from before a restart (the hub must use this store as its
    /// storage): ended streams as they were; streams that were open end now, with the error `interrupted`;
    /// streams whose retention passed are deleted.
    pub fn restore(&self, hub: &Hub) -> Result<Restart, StoreError> {
        let sqlite = |error| StoreError::Sqlite { path: self.path.clone(), error };
        let connection = open_connection(&self.path, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(sqlite)?;
        let config = hub.config();
        let now_ms = config.clock.now_ms();
        let retention = config.retention.as_millis() as u64;
        let threads = crate::sync::lock(&self.threads).len();
        let mut report = Restart { threads, ..Restart::default() };
        let mut rows = connection
            .prepare("SELECT id, epoch, model, created_ms, outcome, ended_ms, client FROM streams ORDER BY created_ms")
            .map_err(sqlite)?;
        let streams: Vec<StreamRow> = rows
            .query_map([], |r| {
                Ok(StreamRow {
                    id: r.get(0)?,
                    epoch: r.get(1)?,
                    model: r.get(2)?,
                    created_ms: r.get::<_, i64>(3)?.max(0) as u64,
                    outcome: r.get(4)?,
                    ended_ms: r.get::<_, Option<i64>>(5)?.map(|ms| ms.max(0) as u64),
                    client: r.get(6)?,
                })
            })
            .map_err(sqlite)?
            .collect::<Result<_, _>>()
            .map_err(sqlite)?;
        for row in streams {
            if let Some(ended_ms) = row.ended_ms.filter(|_| row.outcome.is_some())
                && now_ms.saturating_sub(ended_ms) >= retention
            {
                self.writer.send(Command::Evict { stream: row.id });
                report.expired += 1;
                continue;
            }
            let (last, bytes) = self.reader.extent(&row.id).map_err(sqlite)?;
            if self.restore_stream(hub, row, last, bytes, now_ms) {
                report.interrupted += 1;
            }
            report.streams += 1;
        }
        self.writer.flush();
        Ok(report)
    }

    /// Gives `hub` one stream from its row, its last sequence and its entries' bytes (the entries stay on
    /// disk until a reader asks for them); true when it was open and ends now.
    fn restore_stream(&self, hub: &Hub, row: StreamRow, last: u64, mut bytes: u64, now_ms: u64) -> bool {
        let info = StreamInfo { id: row.id.clone(), epoch: row.epoch, created_ms: row.created_ms, model: row.model };
        let kept = row.outcome.and_then(|o| serde_json::from_str::<Outcome>(&o).ok());
        let interrupted = kept.is_none();
        let (outcome, last, ended_ms) = match kept {
            Some(outcome) => (outcome, last, row.ended_ms.unwrap_or(now_ms)),
            None => {
                // Open when the service stopped: it ends now, and the end is kept like any other (committed
                // before the hub serves anything: `restore` flushes the writer).
                let outcome = Outcome::failed(ErrorProps {
                    message: "the service stopped while the stream was open".into(),
                    code: Some("interrupted".into()),
                    details: None,
                });
                // What it left open is closed first, as a live end would: read from its entries on disk.
                let mut kept = Vec::new();
                if let Err(error) = self.reader.read(&row.id, 0, last, usize::MAX, &mut kept) {
                    tracing::error!(stream = row.id, "reading an interrupted stream's entries: {error}");
                }
                let kept: Vec<Arc<OutputMessage>> = kept
                    .into_iter()
                    .filter_map(|entry| if let Entry::Message { message, .. } = entry { Some(message) } else { None })
                    .collect();
                let ending = crate::hub::ending(&info, &kept, last, &outcome, now_ms);
                let ended = last + ending.len() as u64;
                let mut entries: Vec<Entry> = ending
                    .into_iter()
                    .map(|event| {
                        let entry = Entry::message(event);
                        bytes += entry.bytes();
                        entry
                    })
                    .collect();
                entries.push(Entry::End(Arc::new(outcome.clone())));
                let committed = crate::hub::Committed::new(last, false, crate::hub::MemoryLog::after(last));
                let entries = writer::Serialised::of(&entries);
                self.writer.send(Command::Append { stream: row.id.clone(), entries, committed });
                (outcome, ended, now_ms)
            }
        };
        let log = Box::new(StoreLog::restored(&row.id, last, outcome, self.writer.clone(), Arc::clone(&self.reader)));
        hub.restore(Restored { info, log, bytes, ended_ms, client: row.client });
        interrupted
    }
}

impl Storage for Store {
    /// The stream's row is queued without waking the writer's thread: the stream's first entry
    /// (`stream_start`), appended next, wakes it for both, one hand-off rather than two.
    fn log(&self, info: &StreamInfo, client: Option<&str>) -> Box<dyn crate::hub::Log> {
        self.writer.queue(Command::Stream {
            id: info.id.clone(),
            epoch: info.epoch.clone(),
            model: info.model.clone(),
            created_ms: info.created_ms,
            client: client.map(str::to_owned),
        });
        Box::new(StoreLog::new(&info.id, self.writer.clone(), Arc::clone(&self.reader)))
    }

    fn evict(&self, id: &str) {
        self.writer.send(Command::Evict { stream: id.to_owned() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::HubConfig;
    use crate::output::OutputMessage;
    use crate::render::Format;

    /// Every frame a new subscriber from `after` gets, until the stream's end.
    async fn frames(stream: &Arc<crate::hub::Stream>, format: Format, after: u64) -> Vec<u8> {
        let mut subscription = stream.subscribe(format, after).expect("subscribe");
        let mut bytes = Vec::new();
        while let Some(batch) = subscription.next().await {
            bytes.extend_from_slice(&batch.to_bytes());
        }
        bytes
    }

    #[tokio::test]
    async fn readers_behind_the_hot_part_read_it_back_from_the_store_and_get_the_same_frames() {
        let dir = std::env::temp_dir().join(format!("agentmux-hot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("open");
        let hub = Hub::new(HubConfig { storage: Arc::clone(&store) as Arc<dyn Storage>, ..HubConfig::default() });
        let stream = hub.create("long").expect("create");
        // A reader from the start, keeping up, sees every frame as it comes.
        let live = {
            let stream = Arc::clone(&stream);
            tokio::spawn(async move { frames(&stream, Format::Cui, 0).await })
        };
        let count = 5 * log::HOT;
        for n in 0..count {
            stream.append(OutputMessage::text(format!("word {n} "))).expect("append");
            // The appender trims memory down to what is committed: a writer that fell behind (a busy
            // machine) would leave more in memory than the bound this test checks, until the next trim.
            if n % log::HOT == 0 {
                store.flush();
            }
        }
        store.flush();
        let last = stream.last_sequence();
        assert_eq!(last, count + 1, "stream_start and the messages");
        let hot = stream.log().memory_bytes();
        // Readers far behind (from the start, from the middle) read the old part from the store.
        let mut behind = Vec::new();
        for after in [0, last / 2] {
            let mut entries = Vec::new();
            stream.log().read(after, usize::MAX, &mut entries).expect("kept");
            let sequences: Vec<u64> = entries
                .iter()
                .filter_map(|e| match e {
                    crate::hub::Entry::Message { message, .. } => message.metadata.as_ref()?.sequence,
                    crate::hub::Entry::End(_) => None,
                })
                .collect();
            assert_eq!(sequences, (after + 1..=last).collect::<Vec<_>>(), "in order, without a gap, from {after}");
            behind.push(entries);
        }
        let whole: u64 = behind[0].iter().map(crate::hub::Entry::bytes).sum();
        // At most twice the hot part: 2,048 of the 5,121 entries.
        assert!(hot * 5 / 2 <= whole, "memory holds the hot part only: {hot} of {whole} bytes");
        assert!(stream.end(crate::output::Outcome::completed()));
        store.flush();
        let live = live.await.expect("the live reader");
        // The live reader read its last entries from memory; once it is done, they go.
        assert_eq!(stream.log().memory_bytes(), 0, "an ended stream keeps nothing but its outcome in memory");
        assert_eq!(frames(&stream, Format::Cui, 0).await, live, "a late reader's frames, byte for byte");
        let tail = frames(&stream, Format::Cui, last / 2).await;
        assert!(live.ends_with(&tail) && tail.len() < live.len() / 2 + 4096, "a resume from the middle");
        let openai = String::from_utf8(frames(&stream, Format::OPENAI, 0).await).expect("UTF-8");
        assert_eq!(openai.matches("word ").count() as u64, count, "every delta, rendered again from the store");
        drop(hub);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The write-ahead log's header: its checkpoint sequence and salts change each time the log starts over.
    fn log_header(store: &Store) -> Vec<u8> {
        let mut wal = store.path.clone().into_os_string();
        wal.push("-wal");
        let bytes = std::fs::read(&wal).unwrap_or_default();
        bytes[..bytes.len().min(32)].to_vec()
    }

    /// `n` letters that do not compress much, different at each call.
    fn letters(seed: &mut u64, n: usize) -> String {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                char::from(b'a' + ((*seed >> 33) % 26) as u8)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_log_copied_back_whole_starts_over_in_a_pause_not_in_the_commit_after_it() {
        let dir = std::env::temp_dir().join(format!("agentmux-start-over-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("open");
        let hub = Hub::new(HubConfig { storage: Arc::clone(&store) as Arc<dyn Storage>, ..HubConfig::default() });
        let stream = hub.create("long").expect("create");
        let pages = store.writer.log_pages();
        let long = || pages.load(std::sync::atomic::Ordering::Relaxed) >= checkpoint::CHECKPOINTER_PAGES;
        // A log long enough for the checkpointing thread to copy it back.
        let mut seed = 7;
        for _ in 0..2_000 {
            if long() {
                break;
            }
            stream.append(OutputMessage::text(letters(&mut seed, 32 << 10))).expect("append");
            store.flush();
        }
        assert!(long(), "the log grew to {} pages", checkpoint::CHECKPOINTER_PAGES);
        // A pause: the log is copied back whole (within a tenth of a second), then started over by the writer.
        let pause = std::time::Instant::now();
        while pages.load(std::sync::atomic::Ordering::Relaxed) > 1 && pause.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let header = log_header(&store);
        // The next commit, as a relayed request's first after a pause: it writes on the log as it is.
        stream.append(OutputMessage::text("after the pause")).expect("append");
        store.flush();
        assert_eq!(
            log_header(&store),
            header,
            "the commit after the pause did not start the log over (nor sync its header): the pause did"
        );
        drop(hub);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_first_message_is_seen_once_appended_and_committed_by_its_producer() {
        let dir = std::env::temp_dir().join(format!("agentmux-first-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("open");
        let hub = Hub::new(HubConfig { storage: Arc::clone(&store) as Arc<dyn Storage>, ..HubConfig::default() });

        // Nothing commits while the writer's desk is held: the front door's wait still ends at the first
        // message, before its commit (its response and subscription are made meanwhile), and the
        // subscription reads it once committed.
        let stream = hub.create("held").expect("create");
        store.flush();
        let desk = store.writer.hold();
        stream.append(OutputMessage::text("first")).expect("append");
        let first = tokio::time::timeout(Duration::from_secs(2), stream.first_message()).await;
        assert_eq!(first, Ok(None), "the first message seen before its commit");
        assert_eq!(stream.log().last_sequence(), 1, "not committed: readers do not see it yet");
        let mut subscription = stream.subscribe(Format::Cui, 0).expect("subscribe");
        drop(desk);
        let read = tokio::time::timeout(Duration::from_secs(2), async {
            let mut bytes = Vec::new();
            while !String::from_utf8_lossy(&bytes).contains("first") {
                let Some(batch) = subscription.next().await else { break };
                bytes.extend_from_slice(&batch.to_bytes());
            }
            bytes
        })
        .await
        .expect("the subscription reads the first message once committed");
        assert!(String::from_utf8_lossy(&read).contains("first"));

        // Nobody else committing: the first message is committed on its producer's thread, before its append
        // returns. (The writer's thread answers a flush before it lets go of the desk: it may still hold it
        // for a moment, and then the producer leaves the commit to it; so over a few streams.)
        let by_producer = (0..50).any(|_| {
            let stream = hub.create("first").expect("create");
            store.flush();
            std::thread::sleep(Duration::from_millis(10));
            stream.append(OutputMessage::text("first")).expect("append");
            let here = stream.log().last_sequence() >= 2;
            store.flush();
            here
        });
        assert!(by_producer, "the first message committed by its producer");
        drop(hub);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
