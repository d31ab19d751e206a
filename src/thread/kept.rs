//! Responses that are kept (`POST /v1/responses` with `store`, the default): a response is a thread of its
//! own, named by the response's id (`resp_…`), holding the conversation the run saw and, once it ends, what
//! it said, in the same entries, storage and replication as every thread (`docs/design.md`, "Responses
//! that are kept"). So a kept response lasts as long as a thread (`--thread-ttl`), survives a restart with
//! the store and is found on every node with Redis, with no store of its own.
//!
//! The run starts first (the response's id is its stream's), then [`Threads::keep`] makes the thread with
//! the run going on it, as a replay does, and the recorder records its result at its end. Entries with no
//! stream are the response's input (those copied from a previous response say so in `audit.continued_from`);
//! entries of the run's stream are its output; its `run_end` entry says how it ended.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::audit::{AuditEntry, Decision, history_of, model_audit};
use super::error::{ThreadError, check_id};
use super::recorder::spawn_record;
use super::registry::{Threads, unix_ms};
use super::run::begin;
use crate::conversation::{ChatMessage, Role};
use crate::hub::Stream;
use crate::output::Outcome;

/// A kept response as its thread holds it.
#[derive(Debug)]
pub(crate) struct KeptResponse {
    /// When it was created, in Unix seconds.
    pub(crate) created_at: u64,
    /// The model that answered.
    pub(crate) model: String,
    /// Its own input (not what it continued from), oldest first, with each entry's id.
    pub(crate) input: Vec<(String, Arc<ChatMessage>)>,
    /// The whole conversation: what it continued, its input and its output; what a response continuing
    /// from it starts with.
    pub(crate) conversation: Vec<Arc<ChatMessage>>,
    /// What the run said, once recorded.
    pub(crate) output: Vec<Arc<ChatMessage>>,
    /// The run, while it goes on.
    pub(crate) running: Option<Arc<Stream>>,
    /// How it ended, once recorded.
    pub(crate) outcome: Option<Outcome>,
}

impl Threads {
    /// Keeps the run on `stream` as response `id` of `owner` (counted against `client`'s threads):
    /// `continued` the conversation of the response it continues, `input` its own; its result is recorded
    /// when it ends.
    pub(crate) async fn keep(
        &self,
        (client, owner): (Option<&str>, Option<&str>),
        id: &str,
        (continued, input): (Vec<Arc<ChatMessage>>, Vec<Arc<ChatMessage>>),
        (model, stream): (&str, &Arc<Stream>),
    ) -> Result<(), ThreadError> {
        let entry = |message: Arc<ChatMessage>, mut audit: Map<String, Value>| {
            let decision = match message.role {
                Role::Assistant if !message.calls().is_empty() => Decision::ToolCall,
                Role::Assistant => Decision::Answer,
                Role::Tool => Decision::ToolResult,
                _ => Decision::for_input(&message),
            };
            audit.extend(model_audit(model));
            AuditEntry::new(None, Some(message), decision, audit)
        };
        let from = Map::from_iter([("continued_from".to_owned(), Value::from("previous_response_id"))]);
        let entries: Vec<AuditEntry> = continued
            .into_iter()
            .map(|m| entry(m, from.clone()))
            .chain(input.into_iter().map(|m| entry(m, Map::new())))
            .collect();
        let thread = self.insert(id, entries, true, owner, client).await?;
        let turn_lock = Arc::clone(&thread.turn).lock_owned().await;
        let commit = {
            let mut state = thread.lock();
            begin(&mut state, model, stream, self.now_ms());
            self.changes(&thread, &mut state)
        };
        let kept = self.commit(&thread, commit).await;
        drop(turn_lock);
        match kept {
            Ok(true) => {
                spawn_record(self, &thread, Arc::clone(stream));
                Ok(())
            }
            failed => {
                let _ = self.delete(id, owner).await;
                Err(failed.err().unwrap_or_else(|| ThreadError::Unavailable("the response changed at once".into())))
            }
        }
    }

    /// Response `id` as kept, once a run that has ended is recorded; `None` when there is none (for `owner`).
    /// An id no thread could have (a client's, unchecked) is none.
    pub(crate) async fn kept(&self, id: &str, owner: Option<&str>) -> Result<Option<KeptResponse>, ThreadError> {
        if check_id(id).is_err() {
            return Ok(None);
        }
        let Some(thread) = self.settled(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        let history = history_of(&state.entries);
        let is_output = |entry: &AuditEntry| entry.stream_id.is_some();
        let input = history
            .iter()
            .filter(|entry| !is_output(entry) && !entry.audit.contains_key("continued_from"))
            .filter_map(|entry| Some((entry.id.clone(), Arc::clone(entry.history()?))))
            .collect();
        let conversation = history.iter().filter_map(|entry| entry.history().cloned()).collect();
        let output = history.iter().filter(|entry| is_output(entry)).filter_map(|e| e.history().cloned()).collect();
        let end = state.entries.iter().rev().find(|entry| entry.decision == Decision::RunEnd);
        let outcome = end.and_then(|entry| serde_json::from_value(Value::Object(entry.audit.clone())).ok());
        let model = state.entries.first().and_then(|e| e.audit.get("model")).and_then(Value::as_str).unwrap_or("");
        let running = state.run.as_ref().map(|run| Arc::clone(&run.stream)).filter(|s| s.outcome().is_none());
        Ok(Some(KeptResponse {
            created_at: unix_ms(thread.created) / 1000,
            model: model.to_owned(),
            input,
            conversation,
            output,
            running,
            outcome,
        }))
    }
}
