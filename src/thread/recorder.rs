//! The recorder: a task per run that waits for the run's end and records its result in the thread (its
//! messages, the calls it handed over, and a `run_end` entry with its status, usage, duration and, for a run the
//! catalogue routed, the upstream and model that answered).
//!
//! With a shared record, the result is recorded in the thread as the record holds it when the run ends,
//! by whichever node that knows of the run commits first; this node reads the thread again through
//! [`Threads::fetch`], which hands any run the record has that this node did not know of to a recorder of
//! its own, so every run a node learns of is recorded even when the node that started it dies.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::json;

use super::audit::{AuditEntry, Decision, model_audit};
use super::error::ThreadError;
use super::record::run_result;
use super::registry::{Run, Thread, Threads};
use super::replica::{Fetched, read};
use crate::conversation::{ChatMessage, Role};
use crate::hub::Stream;
use crate::output::{EndStatus, Outcome, Reducer};

impl Threads {
    /// Thread `id` as its storage holds it now ([`read`]); a run the record has going on that this node did
    /// not know of is handed to a recorder.
    pub(super) async fn fetch(&self, id: &str) -> Result<Fetched, ThreadError> {
        let fetched = read(self, id).await?;
        if let Fetched::Copy { thread, follow: Some(stream), .. } = &fetched {
            spawn_record(self, thread, Arc::clone(stream));
        }
        Ok(fetched)
    }
}

/// Records the result of the run on `stream` in `thread` once it ends (a plain function: `record` reads the
/// thread, which may spawn the recording of another run).
pub(super) fn spawn_record(threads: &Threads, thread: &Arc<Thread>, stream: Arc<Stream>) {
    tokio::spawn(record(threads.clone(), Arc::clone(thread), stream));
}

/// Waits for the run on `stream` to end, then records its result in `thread`: on this node, or, with a shared
/// record, in the thread as the record holds it then, unless another node recorded it first.
async fn record(threads: Threads, thread: Arc<Thread>, stream: Arc<Stream>) {
    let outcome = threads.run_ended(&thread.id, &stream).await;
    // A reduction of its own, dropped after: the stream's snapshot view would stay with the stream.
    let mut reducer = Reducer::default();
    for message in stream.history() {
        // The log holds only what the producer's reducer accepted.
        let _ = reducer.apply(&message);
    }
    let result = run_result(reducer.messages(), &outcome);
    let mut thread = thread;
    let mut failures = 0;
    loop {
        let mut _turn = None;
        match threads.fetch(&thread.id).await {
            Ok(Fetched::Local) => {}
            Ok(Fetched::Copy { thread: current, turn, .. }) => (thread, _turn) = (current, Some(turn)),
            Ok(Fetched::Missing) => break,
            Err(error) if failures < RECORD_TRIES => {
                failures += 1;
                tracing::warn!(thread = thread.id, stream = stream.id(), %error, "recording a run's result");
                tokio::time::sleep(RECORD_RETRY).await;
                continue;
            }
            Err(error) => {
                // Left to the next node that reads the thread: the record still has the run going on.
                tracing::error!(thread = thread.id, stream = stream.id(), %error, "a run's result not recorded");
                thread.lock().stale = true;
                break;
            }
        }
        let commit = {
            let mut state = thread.lock();
            if state.run.as_ref().is_none_or(|run| run.stream.id() != stream.id()) {
                break;
            }
            let Some(run) = state.run.take() else { break };
            if !state.gone {
                let entries = entries(&run, stream.id(), result.messages.clone(), &outcome, result.pending.len());
                let bytes: u64 = entries.iter().map(AuditEntry::size).sum();
                threads.hold(bytes);
                state.bytes += bytes;
                state.entries.extend(entries.into_iter().map(Arc::new));
                state.pending = result.pending.clone();
                state.updated = SystemTime::now();
            }
            state.used = threads.now_ms();
            threads.changes(&thread, &mut state)
        };
        match threads.commit(&thread, commit).await {
            Ok(true) => break,
            // Read again: another node may have recorded it.
            Ok(false) => continue,
            Err(error) => {
                failures += 1;
                tracing::warn!(thread = thread.id, stream = stream.id(), %error, "recording a run's result");
                tokio::time::sleep(RECORD_RETRY).await;
            }
        }
    }
    thread.recorded.notify_waiters();
}

/// How often, and how far apart, a node tries to record a run's result in a shared record while it fails.
const RECORD_TRIES: u32 = 30;
const RECORD_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl Threads {
    /// The run on `stream` once it has ended; meanwhile, with a storage that expires threads, thread `id` is
    /// kept alive.
    async fn run_ended(&self, id: &str, stream: &Stream) -> Outcome {
        let storage = &self.inner.storage;
        let period = storage.renew_every();
        if period.is_zero() {
            return stream.ended().await;
        }
        let ended = stream.ended();
        tokio::pin!(ended);
        loop {
            tokio::select! {
                outcome = &mut ended => return outcome,
                () = tokio::time::sleep(period) => {
                    if let Err(error) = storage.renew(id).await {
                        tracing::warn!(thread = id, %error, "keeping a thread with a run going on");
                    }
                }
            }
        }
    }
}

/// The entries of a run's result: one per message, and the run's end.
fn entries(run: &Run, stream: &str, messages: Vec<ChatMessage>, outcome: &Outcome, pending: usize) -> Vec<AuditEntry> {
    let last_text = messages.iter().rposition(|m| m.role == Role::Assistant && m.calls().is_empty());
    let calls_after = |i: usize| messages[i..].iter().any(|m| !m.calls().is_empty());
    let decisions: Vec<Decision> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| match m.role {
            Role::Tool => Decision::ToolResult,
            _ if !m.calls().is_empty() => Decision::ToolCall,
            _ if Some(i) == last_text && !calls_after(i) => Decision::Answer,
            _ => Decision::Planning,
        })
        .collect();
    let count = messages.len();
    let mut entries: Vec<AuditEntry> = messages
        .into_iter()
        .zip(decisions)
        .map(|(message, decision)| {
            let mut audit = model_audit(&run.model);
            if let Some(name) = message.name.as_deref() {
                audit.insert("tool".into(), name.into());
            }
            let calls: Vec<&str> = message.calls().iter().map(|c| c.name()).collect();
            if !calls.is_empty() {
                audit.insert("tools".into(), calls.into());
            }
            let mut entry = AuditEntry::new(Some(stream), Some(Arc::new(message)), decision, audit);
            entry.audit.insert("bytes".into(), entry.size().into());
            entry
        })
        .collect();
    let mut audit = model_audit(&run.model);
    audit.insert("status".into(), json!(outcome.status));
    if outcome.status == EndStatus::Completed {
        audit.insert("finish_reason".into(), json!(outcome.finish_reason.unwrap_or_default()));
    }
    if let Some(usage) = &outcome.usage {
        audit.insert("usage".into(), json!(usage));
    }
    if let Some(error) = &outcome.error {
        audit.insert("error".into(), json!(error));
    }
    if let Some(served_by) = &outcome.served_by {
        audit.insert("served_by".into(), json!(served_by));
    }
    audit.insert("duration_ms".into(), (run.started.elapsed().as_millis() as u64).into());
    audit.insert("messages".into(), count.into());
    if pending > 0 {
        audit.insert("handed_over_tool_calls".into(), pending.into());
    }
    entries.push(AuditEntry::new(Some(stream), None, Decision::RunEnd, audit));
    entries
}
