//! A turn on a thread, and a replay of one.
//!
//! A turn checks the input against what a client may add ([`validate_thread_input`]: no assistant message,
//! tool messages only for the calls the last run handed over), prepends the stored history, starts the agent,
//! and records the input at once and the run's result when its stream ends (a task per run waits for the
//! end: `recorder.rs`). Refused input is recorded as `rejected` and appended nowhere. A replay copies a thread's history up
//! to an entry into a new thread and starts a run there, on the model asked for.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::{Map, Value, json};

use super::audit::{AuditEntry, Decision, history_of, model_audit as model};
use super::error::{ThreadError, check_id};
use super::recorder::spawn_record;
use super::registry::{RECORD_WAIT, Run, State, Thread, Threads};
use super::replica::Fetched;
use super::storage::Commit;
use crate::agent::StartError;
use crate::conversation::{ChatMessage, Conversation, ConversationError, Role, ToolCall, validate_thread_input};
use crate::hub::Stream;

/// A turn: what a client adds to a thread, and the model to answer with.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// The thread; created on first use when the service does not know it.
    pub thread: String,
    /// The agent to run.
    pub model: String,
    /// The new messages: user, system or developer messages, and results for calls the last run handed over.
    pub input: Vec<ChatMessage>,
    /// The request's other fields, passed to the agent.
    pub options: Map<String, Value>,
    /// The API key (by name) the turn comes with, when the service has keys: a thread another key created
    /// is not found, and a new one belongs to this key.
    pub owner: Option<String>,
    /// What the client holds of the conversation before `input`, when it sends its whole history with every
    /// turn (an AG-UI frontend, a `useChat` page; see [`Turn::resent`]); `None` when it sends only what is new.
    /// It starts a thread that has no history yet (so a page whose thread expired keeps its context), and
    /// where it holds fewer user messages than the thread, the thread rewinds to that point (a regenerate, or
    /// an edit of an earlier message) with a [`Decision::Rewind`] entry. Otherwise the thread's own history
    /// is what the run sees.
    pub history: Option<Vec<ChatMessage>>,
}

impl Turn {
    /// A turn of a client that sends its whole history every time: what follows its last assistant message
    /// (its new messages, or its results for calls the last run handed over) is the input, what comes before
    /// is [`Turn::history`].
    pub fn resent(thread: String, model: String, mut messages: Vec<ChatMessage>, owner: Option<String>) -> Turn {
        let split = messages.iter().rposition(|m| m.role == Role::Assistant).map_or(0, |last| last + 1);
        let input = messages.split_off(split);
        Turn { thread, model, input, options: Map::new(), owner, history: Some(messages) }
    }
}

/// Where a turn's input goes: after `history`, once `prelude` is recorded, answering `pending`.
struct Base {
    /// Entries recorded before the input: the client's history starting a thread, or a rewind.
    prelude: Vec<AuditEntry>,
    /// Shared with the thread's entries: the run holds the thread's messages, not a copy of them.
    history: Vec<Arc<ChatMessage>>,
    pending: Vec<ToolCall>,
}

/// What a replay started.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The new thread.
    pub thread: String,
    /// Its run.
    pub stream: Arc<Stream>,
    /// The entry the history was copied up to.
    pub upto: String,
}

enum Attempt {
    Started(Arc<Stream>),
    /// A run ended and its result is being recorded.
    Wait,
    /// The thread went away under us: find or make it again.
    Gone,
}

impl Threads {
    /// Runs a turn on a thread and returns the run's stream.
    pub async fn run(&self, client: Option<&str>, turn: Turn) -> Result<Arc<Stream>, ThreadError> {
        check_id(&turn.thread)?;
        let deadline = tokio::time::Instant::now() + RECORD_WAIT;
        loop {
            let (thread, turn_lock) = self.open(&turn.thread, turn.owner.as_deref(), client).await?;
            self.caught_up(&thread).await?;
            let recorded = thread.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            let (attempt, commit) = self.attempt(&thread, client, &turn);
            let kept = self.commit(&thread, commit).await;
            drop(turn_lock);
            let attempt = match (attempt, kept) {
                (attempt, Ok(true)) => attempt?,
                // Another node changed the thread first: a run started here was never handed out.
                (attempt, kept) => {
                    if let Ok(Attempt::Started(stream)) = attempt {
                        stream.cancel();
                    }
                    kept?;
                    continue;
                }
            };
            match attempt {
                Attempt::Started(stream) => {
                    spawn_record(self, &thread, Arc::clone(&stream));
                    return Ok(stream);
                }
                Attempt::Gone => continue,
                Attempt::Wait => {
                    if tokio::time::timeout_at(deadline, recorded).await.is_err() {
                        tracing::warn!(thread = turn.thread, "a run's result took over {RECORD_WAIT:?} to record");
                        return Err(ThreadError::Busy { thread: turn.thread, stream: String::new() });
                    }
                }
            }
        }
    }

    /// Thread `id` (made for `owner`, counted against `client`, when there is none), with its turn lock held.
    async fn open(
        &self,
        id: &str,
        owner: Option<&str>,
        client: Option<&str>,
    ) -> Result<(Arc<Thread>, tokio::sync::OwnedMutexGuard<()>), ThreadError> {
        if let Fetched::Copy { thread, turn, .. } = self.fetch(id).await? {
            return if thread.owned_by(owner) { Ok((thread, turn)) } else { Err(ThreadError::NotFound(id.to_owned())) };
        }
        let thread = self.insert(id, Vec::new(), false, owner, client).await?;
        let turn = Arc::clone(&thread.turn).lock_owned().await;
        Ok((thread, turn))
    }

    /// A turn's attempt on `thread`, and what it changed for the storage.
    fn attempt(
        &self,
        thread: &Arc<Thread>,
        client: Option<&str>,
        turn: &Turn,
    ) -> (Result<Attempt, ThreadError>, Option<Commit>) {
        let mut state = thread.lock();
        let attempt = self.try_start(thread, &mut state, client, turn);
        let commit = self.changes(thread, &mut state);
        (attempt, commit)
    }

    fn try_start(
        &self,
        thread: &Arc<Thread>,
        state: &mut State,
        client: Option<&str>,
        turn: &Turn,
    ) -> Result<Attempt, ThreadError> {
        if state.gone {
            return Ok(Attempt::Gone);
        }
        if let Some(run) = &state.run {
            if run.stream.outcome().is_some() {
                return Ok(Attempt::Wait);
            }
            return Err(ThreadError::Busy { thread: thread.id.clone(), stream: run.stream.id().to_owned() });
        }
        let refuse = |state: &mut State, error: ThreadError| {
            reject(state, &turn.model, &turn.input, &error);
            Err(error)
        };
        let base = base(state, turn);
        if let Err(error) = validate_thread_input(&turn.input, &base.pending) {
            return refuse(state, error.into());
        }
        let input: Vec<AuditEntry> = turn
            .input
            .iter()
            .map(|m| AuditEntry::new(None, Some(Arc::new(m.clone())), Decision::for_input(m), model(&turn.model)))
            .collect();
        let bytes: u64 = base.prelude.iter().chain(&input).map(AuditEntry::size).sum();
        let limit = self.inner.config.thread_bytes;
        let size = state.bytes + bytes;
        if size > limit {
            return refuse(state, ThreadError::TooLarge { size, limit });
        }
        let before = base.history.len();
        let history: Vec<Arc<ChatMessage>> =
            base.history.into_iter().chain(input.iter().filter_map(|entry| entry.message.clone())).collect();
        let conversation = match Conversation::new(&turn.model, history) {
            Ok(conversation) => conversation.with_options(turn.options.clone()).with_thread(&thread.id),
            Err(error) => {
                // Named by its place in the input, as the client sent it.
                let index = error.index.and_then(|i| i.checked_sub(before));
                return refuse(state, error.renumbered(index).into());
            }
        };
        self.reserve(bytes)?;
        let stream = match self.inner.agents.start(&self.inner.hub, client, conversation) {
            Ok(stream) => stream,
            Err(error) => {
                self.release(bytes);
                return match error {
                    // Not the input's fault: nothing to record.
                    StartError::Hub(_) => Err(error.into()),
                    _ => refuse(state, error.into()),
                };
            }
        };
        state.entries.extend(base.prelude.into_iter().map(Arc::new));
        for mut entry in input {
            entry.stream_id = Some(stream.id().to_owned());
            entry.audit.insert("bytes".into(), entry.size().into());
            state.entries.push(Arc::new(entry));
        }
        state.bytes += bytes;
        begin(state, &turn.model, &stream, self.now_ms());
        Ok(Attempt::Started(stream))
    }

    /// Copies the history of thread `id` up to the entry `upto` (by default, up to its last user input, so
    /// that the last turn is asked again) into a new thread, and runs it on `model`.
    pub async fn replay(
        &self,
        client: Option<&str>,
        owner: Option<&str>,
        id: &str,
        model: &str,
        upto: Option<&str>,
    ) -> Result<Replay, ThreadError> {
        if !self.inner.agents.contains(model) {
            return Err(StartError::UnknownModel(model.to_owned()).into());
        }
        let source = self.settled(id, owner).await?.ok_or_else(|| ThreadError::NotFound(id.to_owned()))?;
        let copied = {
            let state = source.lock();
            let cut = match upto {
                Some(upto) => state
                    .entries
                    .iter()
                    .position(|e| e.id == upto)
                    .ok_or_else(|| ThreadError::Upto(format!("the thread {id:?} has no entry {upto:?}")))?,
                None => {
                    let last = history_of(&state.entries).into_iter().rev().find(|e| e.decision == Decision::UserInput);
                    let no_input = || ThreadError::Upto(format!("the thread {id:?} has no user input to replay"));
                    let last = last.ok_or_else(no_input)?.id.clone();
                    state.entries.iter().position(|e| e.id == last).ok_or_else(no_input)?
                }
            };
            let upto = state.entries[cut].id.clone();
            // The history as it was at that entry: new entries, sharing the source's messages.
            let copied: Vec<AuditEntry> = history_of(&state.entries[..=cut])
                .into_iter()
                .map(|entry| {
                    let mut audit = entry.audit.clone();
                    audit.insert("replayed_from".into(), json!({"thread_id": id, "entry_id": entry.id}));
                    AuditEntry::new(entry.stream_id.as_deref(), entry.message.clone(), entry.decision, audit)
                })
                .collect();
            if copied.is_empty() {
                return Err(ThreadError::Upto(format!("nothing in the thread {id:?} comes before {upto:?}")));
            }
            (copied, upto)
        };
        let (entries, upto) = copied;
        let new_id = format!("thread_{}", uuid::Uuid::new_v4().simple());
        let thread = self.insert(&new_id, entries, true, owner, client).await?;
        let turn_lock = Arc::clone(&thread.turn).lock_owned().await;
        let started = {
            let mut state = thread.lock();
            let history: Vec<Arc<ChatMessage>> = state.history().cloned().collect();
            Conversation::new(model, history)
                .map_err(ThreadError::from)
                .map(|c| c.with_thread(&new_id))
                .and_then(|c| Ok(self.inner.agents.start(&self.inner.hub, client, c)?))
                .map(|stream| {
                    begin(&mut state, model, &stream, self.now_ms());
                    (stream, self.changes(&thread, &mut state))
                })
        };
        let kept = match started {
            Ok((stream, commit)) => self.commit(&thread, commit).await.map(|kept| (stream, kept)),
            Err(error) => Err(error),
        };
        drop(turn_lock);
        match kept {
            Ok((stream, true)) => {
                spawn_record(self, &thread, Arc::clone(&stream));
                Ok(Replay { thread: new_id, stream, upto })
            }
            failed => {
                if let Ok((stream, false)) = &failed {
                    stream.cancel();
                }
                let _ = self.delete(&new_id, owner).await;
                Err(failed.err().unwrap_or_else(|| ThreadError::Unavailable("the new thread changed at once".into())))
            }
        }
    }
}

/// Marks `stream` as the thread's run, started `now_ms` by the hub's clock.
pub(super) fn begin(state: &mut State, model: &str, stream: &Arc<Stream>, now_ms: u64) {
    state.pending.clear();
    state.used = now_ms;
    state.updated = SystemTime::now();
    state.run = Some(Run { stream: Arc::clone(stream), model: model.to_owned(), started: Instant::now() });
}

/// Where `turn`'s input goes in a thread in `state`: after the thread's history, or, for a client that sends
/// its whole history, after the history it holds where that starts the thread or goes back in it.
fn base(state: &State, turn: &Turn) -> Base {
    let history: Vec<Arc<ChatMessage>> = state.history().cloned().collect();
    let Some(held) = &turn.history else {
        return Base { prelude: Vec::new(), history, pending: state.pending.clone() };
    };
    if history.is_empty() {
        // A thread that starts with what the client holds (no model of ours said it): the calls its last
        // message made are open.
        let audit = Map::from_iter([("source".to_owned(), Value::from("client"))]);
        let held: Vec<Arc<ChatMessage>> = held.iter().cloned().map(Arc::new).collect();
        let prelude = held
            .iter()
            .map(|m| {
                let decision = match m.role {
                    Role::Assistant if !m.calls().is_empty() => Decision::ToolCall,
                    Role::Assistant => Decision::Answer,
                    _ => Decision::for_input(m),
                };
                let mut entry = AuditEntry::new(None, Some(Arc::clone(m)), decision, audit.clone());
                entry.audit.insert("bytes".into(), entry.size().into());
                entry
            })
            .collect();
        let pending = held.last().map(|m| m.calls().to_vec()).unwrap_or_default();
        return Base { prelude, history: held, pending };
    }
    // Where the client's history and the thread's part: after as many user messages as the client holds.
    let users = held.iter().filter(|m| m.role == Role::User).count();
    let mut user_positions = history.iter().enumerate().filter(|(_, m)| m.role == Role::User).map(|(i, _)| i);
    match user_positions.nth(users) {
        None => Base { prelude: Vec::new(), history, pending: state.pending.clone() },
        Some(kept) => {
            let mut audit = model(&turn.model);
            audit.insert(
                "reason".into(),
                format!("the client's history holds {users} user messages of the thread's later ones").into(),
            );
            let rewind = AuditEntry::rewind(kept, history.len() - kept, audit);
            let mut history = history;
            history.truncate(kept);
            Base { prelude: vec![rewind], history, pending: Vec::new() }
        }
    }
}

/// Records refused input: the message at fault (or the first), and why.
fn reject(state: &mut State, model_name: &str, input: &[ChatMessage], error: &ThreadError) {
    let index = match error {
        ThreadError::Invalid(ConversationError { index, .. }) => index.unwrap_or(0),
        _ => 0,
    };
    let mut audit = model(model_name);
    let (param, code) = match error {
        ThreadError::Invalid(e) => (Some(e.param.clone()), "invalid_value"),
        ThreadError::TooLarge { .. } => (Some("messages".to_owned()), "thread_too_large"),
        ThreadError::Start(StartError::UnknownModel(_)) => (Some("model".to_owned()), "model_not_found"),
        ThreadError::Start(StartError::Refused(refusal)) => (refusal.param.clone(), "invalid_value"),
        _ => (None, "refused"),
    };
    audit.insert("error".into(), json!({"message": error.to_string(), "param": param, "code": code}));
    audit.insert("messages".into(), input.len().into());
    let message = input.get(index).cloned().map(Arc::new);
    state.entries.push(Arc::new(AuditEntry::new(None, message, Decision::Rejected, audit)));
    state.updated = SystemTime::now();
}
