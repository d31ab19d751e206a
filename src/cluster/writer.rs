//! [`Writer`]: the task that writes the streams this node owns to Redis, and [`OwnedLog`], such a stream's
//! log.
//!
//! An owned stream's entries are kept in memory (its readers on this node read them from there) and handed
//! to the writer, which runs the append script for them and then moves the stream's committed watermark
//! (`crate::hub::Committed`): readers here, like readers on other nodes, see only what Redis holds, and a
//! producer's acknowledgement waits for it. Whatever the writer finds handed over when it wakes goes in one
//! round: a stream's appends become one script call, and the calls for different streams go out together on
//! the one multiplexed connection.
//!
//! A call Redis does not take stays in the writer's [`Backlog`] and is tried again, ahead of whatever its
//! stream appends meanwhile, until Redis takes it: nothing handed to the writer is dropped while the
//! stream's later appends go on, so the log in Redis never has a hole and the end a stream gets during an
//! outage reaches Redis after everything before it. Past the write timeout (`--redis-write-timeout`) the
//! stream is told its appends are not kept (`Committed::fail`): the acknowledgement is refused and the
//! stream ends with the error `store_unavailable`, as with the embedded store's disk; that end is written
//! behind the rest once Redis is back, so every node reads it. A call Redis refuses for good (`FENCED`:
//! another node owns the stream and ended it; `GAP`: Redis lost what it had taken) is given up at once. A
//! retry of a call that did reach Redis writes nothing twice: the script skips the sequences it already has.
//!
//! [`Writer::flush`] waits until Redis has everything handed over before it, so a shutdown's ends reach
//! the other nodes before the process goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connection::RedisConnection;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::backlog::{Backlog, Command, Failure, Pending};
use super::script::{self, Append};
use crate::hub::{Committed, Entry, Gone, Log, MemoryLog, StreamInfo};
use crate::output::Outcome;

/// The most requests the writer takes in one round.
const ROUND: usize = 1024;

/// What the writer is handed.
#[derive(Debug)]
enum Request {
    Append(Command),
    /// Answered once Redis has everything handed over before it.
    Flush(oneshot::Sender<()>),
}

/// What the writer needs to know besides the appends.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    /// This node's id, the owner named in Redis.
    pub(crate) node: Arc<str>,
    /// Where other nodes reach this one.
    pub(crate) url: Arc<str>,
    /// How long an open stream's keys live past its last append (its idle timeout and retention).
    pub(crate) open_ttl: Duration,
    /// How long an ended stream's keys live (its retention).
    pub(crate) ended_ttl: Duration,
}

/// A handle to the writer task; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    requests: mpsc::UnboundedSender<Request>,
}

impl Writer {
    /// Starts the writer task on the current runtime; a stream whose appends Redis has not taken for
    /// `write_timeout` is told they are not kept.
    pub(crate) fn start(connection: RedisConnection, owner: Owner, write_timeout: Duration) -> Writer {
        let (requests, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(receiver, connection, owner, write_timeout));
        Writer { requests }
    }

    /// Waits until Redis has everything handed to the writer before the call (see the module doc); for as
    /// long as Redis is away, so the caller bounds it.
    pub(crate) async fn flush(&self) {
        let (done, answered) = oneshot::channel();
        if self.requests.send(Request::Flush(done)).is_ok() {
            let _ = answered.await;
        }
    }
}

async fn run(
    mut requests: mpsc::UnboundedReceiver<Request>,
    connection: RedisConnection,
    owner: Owner,
    write_timeout: Duration,
) {
    let script = script::append_script();
    let mut backlog = Backlog::default();
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    let mut received = Vec::new();
    let mut open = true;
    loop {
        open = receive(&mut requests, &mut received, open, backlog.next_try()).await;
        let now = Instant::now();
        for request in received.drain(..) {
            match request {
                Request::Append(command) => backlog.push(command, now),
                Request::Flush(done) => flushes.push(done),
            }
        }
        let writes = backlog.take_due(now).into_iter().map(|pending| {
            let (mut connection, script, owner) = (connection.clone(), &script, &owner);
            async move {
                let command = &pending.command;
                let ttl = if command.ends { owner.ended_ttl } else { owner.open_ttl };
                let ttl_ms = ttl.as_millis().min(u128::from(u64::MAX)) as u64;
                let append = &command.append;
                let result =
                    script::append(&mut connection, script, &owner.node, &owner.url, &command.stream, ttl_ms, append);
                (result.await, pending)
            }
        });
        for (result, pending) in futures::future::join_all(writes).await {
            settle(&mut backlog, result, pending, write_timeout);
        }
        if backlog.is_empty() {
            for done in flushes.drain(..) {
                let _ = done.send(());
            }
            if !open {
                return;
            }
        }
    }
}

/// Waits for requests (into `into`, up to a round of them) while the channel is `open`, or until `until`
/// when the backlog has a call due then; false once every handle is gone (then only `until` is waited for).
async fn receive(
    requests: &mut mpsc::UnboundedReceiver<Request>,
    into: &mut Vec<Request>,
    open: bool,
    until: Option<Instant>,
) -> bool {
    match (open, until) {
        (true, None) => requests.recv_many(into, ROUND).await > 0,
        // A round's worth came, or the channel closed (`0`), or the time is up with the channel still open.
        (true, Some(until)) => !matches!(tokio::time::timeout_at(until, requests.recv_many(into, ROUND)).await, Ok(0)),
        (false, Some(until)) => {
            tokio::time::sleep_until(until).await;
            false
        }
        (false, None) => false,
    }
}

/// What a call's try means for its stream: committed, given up, or kept in `backlog` to be tried again.
fn settle(backlog: &mut Backlog, result: redis::RedisResult<u64>, mut pending: Pending, write_timeout: Duration) {
    let command = &pending.command;
    let error = match result {
        Ok(_) => {
            command.committed.advance(command.last, command.ends);
            return;
        }
        Err(error) => error,
    };
    let text = error.to_string();
    if text.contains("FENCED") || text.contains("GAP") {
        tracing::error!(stream = %command.stream, %error, "Redis refused the stream's appends for good: they are not kept");
        command.committed.fail();
        return;
    }
    if command.orphaned() {
        tracing::warn!(stream = %command.stream, %error, "Redis is still away and the stream is no longer held here: its appends are given up");
        return;
    }
    let stream = Arc::clone(&pending.command.stream);
    match pending.failed(Instant::now(), write_timeout) {
        Failure::First => tracing::warn!(%stream, %error, "appending to Redis failed; trying again"),
        Failure::Again => tracing::debug!(%stream, %error, "appending to Redis failed again"),
        Failure::TimedOut => {
            tracing::error!(
                %stream, %error,
                "Redis has not taken the stream's appends for {write_timeout:?}: it ends `store_unavailable`, and \
                 what it has is written once Redis is back"
            );
            pending.command.committed.fail();
        }
    }
    backlog.put_back(pending);
}

/// The log of a stream this node owns; see the module doc.
#[derive(Debug)]
pub(crate) struct OwnedLog {
    stream: Arc<str>,
    committed: Arc<Committed>,
    writer: Writer,
    /// The stream's facts, until its first append registers them.
    register: Mutex<Option<(String, u64, String)>>,
    forgotten: AtomicBool,
}

impl OwnedLog {
    pub(crate) fn new(info: &StreamInfo, writer: Writer) -> OwnedLog {
        OwnedLog {
            stream: Arc::from(info.id.as_str()),
            committed: Committed::new(0, false, MemoryLog::default()),
            writer,
            register: Mutex::new(Some((info.epoch.clone(), info.created_ms, info.model.clone()))),
            forgotten: AtomicBool::new(false),
        }
    }
}

impl Log for OwnedLog {
    fn append(&self, entries: Vec<Entry>) {
        let memory = self.committed.memory();
        let mut append = Append::default();
        let mut last = memory.last_sequence();
        let mut last_ms = 0;
        let mut ends = false;
        for entry in &entries {
            match entry {
                Entry::Message { message, json, .. } => {
                    let Some(sequence) = message.metadata.as_ref().and_then(|m| m.sequence) else { continue };
                    last_ms = message.metadata.as_ref().and_then(|m| m.timestamp).unwrap_or(last_ms);
                    if append.messages.is_empty() {
                        append.first = sequence;
                    }
                    append.messages.push(json.clone().unwrap_or_else(|| crate::hub::json_of(message)));
                    last = sequence;
                }
                Entry::End(outcome) => {
                    append.outcome = Some((serde_json::to_string(&**outcome).unwrap_or_default(), last_ms));
                    ends = true;
                }
            }
        }
        append.register = crate::sync::lock(&self.register).take();
        memory.append(entries);
        let command =
            Command { stream: Arc::clone(&self.stream), append, last, ends, committed: Arc::clone(&self.committed) };
        // The writer lives as long as the runtime; a send after it stopped has nobody left to tell.
        let _ = self.writer.requests.send(Request::Append(command));
    }

    fn read(&self, after: u64, max: usize, into: &mut Vec<Entry>) -> Result<(), Gone> {
        if self.forgotten.load(Ordering::Acquire) {
            return Err(Gone { asked: after, kept_after: self.committed.memory().last_sequence() });
        }
        // Everything stays in memory while the stream is held here.
        self.committed.read(after, max, into, |_, _, _, _| 0)
    }

    fn last_sequence(&self) -> u64 {
        self.committed.sequence()
    }

    fn is_ended(&self) -> bool {
        self.committed.is_ended()
    }

    fn keeps(&self) -> bool {
        self.committed.keeps()
    }

    fn outcome(&self) -> Option<Arc<Outcome>> {
        self.committed.outcome()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.committed.changes()
    }

    fn appended(&self) -> watch::Receiver<u64> {
        self.committed.appended()
    }

    fn acknowledgements(&self) -> watch::Receiver<u64> {
        self.committed.acknowledgements()
    }

    fn forget(&self) {
        self.forgotten.store(true, Ordering::Release);
        self.committed.forget();
    }

    fn memory_bytes(&self) -> u64 {
        self.committed.memory().memory_bytes()
    }
}
