//! [`Writer`]: the task that writes the streams this node owns to Redis, and [`OwnedLog`], such a stream's
//! log.
//!
//! An owned stream's entries are kept in memory (its readers on this node read them from there) and handed
//! to the writer, which runs the append script for them and then moves the stream's committed watermark
//! (`crate::hub::Committed`): readers here, like readers on other nodes, see only what Redis holds, and a
//! producer's acknowledgement waits for it. Whatever the writer finds queued when it wakes goes in one round:
//! a stream's queued appends become one script call, and the calls for different streams go out together on
//! the one multiplexed connection.
//!
//! A call that fails is tried again (the connection manager reconnects) for [`RETRY_FOR`]; past that, or at
//! once when Redis says another node owns the stream, the stream's watermark fails: its readers are told the
//! rest is not kept, the acknowledgement is refused, and the stream ends with the error `store_unavailable`,
//! as with the embedded store's disk. A retry of a call that did reach Redis writes nothing twice: the
//! script skips the sequences it already has.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connection::RedisConnection;
use tokio::sync::{mpsc, watch};

use super::script::{self, Append};
use crate::hub::{Committed, Entry, Gone, Log, MemoryLog, StreamInfo};
use crate::output::Outcome;

/// How long a failing append is tried again before its stream is told it was not kept.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(10);

/// The most appends the writer takes in one round.
const ROUND: usize = 1024;

/// One stream's append, for the writer.
struct Command {
    stream: Arc<str>,
    append: Append,
    /// The last sequence once this is written (the stream's last so far when it adds no message).
    last: u64,
    ends: bool,
    committed: Arc<Committed>,
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
    commands: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command").field("stream", &self.stream).field("last", &self.last).finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer task on the current runtime.
    pub(crate) fn start(connection: RedisConnection, owner: Owner) -> Writer {
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(receiver, connection, owner));
        Writer { commands }
    }
}

async fn run(mut commands: mpsc::UnboundedReceiver<Command>, connection: RedisConnection, owner: Owner) {
    let script = script::append_script();
    let mut round = Vec::new();
    while commands.recv_many(&mut round, ROUND).await > 0 {
        let calls = merge(round.drain(..));
        let writes = calls.into_iter().map(|command| {
            let (mut connection, script, owner) = (connection.clone(), &script, &owner);
            async move { write(&mut connection, script, owner, command).await }
        });
        futures::future::join_all(writes).await;
    }
}

/// One command per stream: a stream's appends in a round are written by one call, in order.
fn merge(round: impl Iterator<Item = Command>) -> Vec<Command> {
    let mut calls: Vec<Command> = Vec::new();
    let mut index: HashMap<Arc<str>, usize> = HashMap::new();
    for command in round {
        let Some(&at) = index.get(&command.stream) else {
            index.insert(Arc::clone(&command.stream), calls.len());
            calls.push(command);
            continue;
        };
        let call = &mut calls[at];
        if call.append.messages.is_empty() {
            call.append.first = command.append.first;
        }
        call.append.messages.extend(command.append.messages);
        call.append.outcome = call.append.outcome.take().or(command.append.outcome);
        call.append.register = call.append.register.take().or(command.append.register);
        call.last = command.last;
        call.ends |= command.ends;
    }
    calls
}

async fn write(connection: &mut RedisConnection, script: &redis::Script, owner: &Owner, command: Command) {
    let ttl = if command.ends { owner.ended_ttl } else { owner.open_ttl };
    let ttl_ms = ttl.as_millis().min(u128::from(u64::MAX)) as u64;
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    let mut pause = Duration::from_millis(20);
    loop {
        let result =
            script::append(connection, script, &owner.node, &owner.url, &command.stream, ttl_ms, &command.append).await;
        match result {
            Ok(_) => {
                command.committed.advance(command.last, command.ends);
                return;
            }
            Err(error) => {
                let fenced = error.to_string().contains("FENCED");
                if fenced || tokio::time::Instant::now() + pause > deadline {
                    tracing::error!(stream = %command.stream, %error, "appending to Redis failed: the stream is not kept");
                    command.committed.fail();
                    return;
                }
                tracing::warn!(stream = %command.stream, %error, "appending to Redis failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
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
        append.register = self.register.lock().ok().and_then(|mut register| register.take());
        memory.append(entries);
        let command =
            Command { stream: Arc::clone(&self.stream), append, last, ends, committed: Arc::clone(&self.committed) };
        // The writer lives as long as the runtime; a send after it stopped has nobody left to tell.
        let _ = self.writer.commands.send(command);
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
