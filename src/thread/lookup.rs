//! Finding, making and deleting a thread, wherever its record is: in the registry's map, when the storage
//! is a journal (the journal is handed each change), or in a record every node shares, read again into this
//! node's copy at each use ([`Threads::fetch`]). Reading a thread, its transcript and its audit log waits,
//! a moment at most, for the result of a run that has just ended to be recorded.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Map;

use super::audit::{AuditEntry, Decision};
use super::error::{ThreadError, check_id};
use super::registry::{RECORD_WAIT, State, Thread, Threads, Transcript, unix_ms};
use super::replica::Fetched;
use super::storage::Made;
use crate::conversation::{ChatMessage, validate_user_input};
use crate::hub::Stream;

impl Threads {
    /// Creates a thread, under `id` or a new one, with `messages` (user, system and developer messages
    /// only: the client cannot write what the model said), for `owner` (the key that creates it, when the
    /// service has keys: no other key will find it), counted against `client`'s budget
    /// ([`ThreadConfig::threads_per_client`](super::ThreadConfig::threads_per_client)).
    pub async fn create(
        &self,
        client: Option<&str>,
        id: Option<&str>,
        messages: Vec<ChatMessage>,
        owner: Option<&str>,
    ) -> Result<Transcript, ThreadError> {
        if !messages.is_empty() {
            validate_user_input(&messages)?;
        }
        let id = match id {
            Some(id) => {
                check_id(id)?;
                id.to_owned()
            }
            None => format!("thread_{}", uuid::Uuid::new_v4().simple()),
        };
        let entries: Vec<AuditEntry> = messages
            .into_iter()
            .map(|message| {
                let decision = Decision::for_input(&message);
                AuditEntry::new(None, Some(Arc::new(message)), decision, Map::new())
            })
            .collect();
        let thread = self.insert(&id, entries, true, owner, client).await?;
        let state = thread.lock();
        Ok(self.transcript(&thread, &state))
    }

    /// Adds a thread with `entries` for `owner`, counted against `client`'s budget; an existing one is an
    /// error when `exclusive`, and is returned otherwise (not found when another key owns it).
    pub(super) async fn insert(
        &self,
        id: &str,
        mut entries: Vec<AuditEntry>,
        exclusive: bool,
        owner: Option<&str>,
        client: Option<&str>,
    ) -> Result<Arc<Thread>, ThreadError> {
        let config = &self.inner.config;
        let mut bytes = 0;
        for entry in &mut entries {
            // A replay's copy shares its message with the source, whose entry says its size already.
            let size = entry.recorded_size().unwrap_or_else(|| entry.size());
            entry.audit.insert("bytes".into(), size.into());
            bytes += size;
        }
        if bytes > config.thread_bytes {
            return Err(ThreadError::TooLarge { size: bytes, limit: config.thread_bytes });
        }
        if self.inner.storage.is_record() {
            return self.insert_recorded(id, &entries, exclusive, owner).await;
        }
        let mut map = self.map();
        if let Some(thread) = map.get(id) {
            return match (exclusive, thread.owned_by(owner)) {
                (true, _) => Err(ThreadError::Exists(id.to_owned())),
                (false, true) => Ok(Arc::clone(thread)),
                (false, false) => Err(ThreadError::NotFound(id.to_owned())),
            };
        }
        if map.len() >= config.max_threads {
            return Err(ThreadError::Full { limit: config.max_threads, retry_after: self.room_in(&map, None) });
        }
        if let Some(client) = client
            && let Err(limit) = self.inner.budgets.admit(config, client)
        {
            return Err(ThreadError::ClientThreads { limit, retry_after: self.room_in(&map, Some(client)) });
        }
        if let Err(error) = self.reserve(bytes) {
            if let Some(client) = client {
                self.inner.budgets.release(client);
            }
            return Err(error);
        }
        let state = State::new(entries, bytes, self.now_ms());
        let thread = Thread::new(id, String::new(), owner.map(str::to_owned), SystemTime::now(), state);
        let thread = Arc::new(thread.counted_for(client));
        map.insert(id.to_owned(), Arc::clone(&thread));
        drop(map);
        self.changes(&thread, &mut thread.lock());
        Ok(thread)
    }

    /// Thread `id` for `owner`, made (with `entries`) when the shared record has none; an existing one is an
    /// error when `exclusive`.
    async fn insert_recorded(
        &self,
        id: &str,
        entries: &[AuditEntry],
        exclusive: bool,
        owner: Option<&str>,
    ) -> Result<Arc<Thread>, ThreadError> {
        let not_found = || ThreadError::NotFound(id.to_owned());
        if !exclusive && let Fetched::Copy { thread, .. } = self.fetch(id).await? {
            return if thread.owned_by(owner) { Ok(thread) } else { Err(not_found()) };
        }
        let epoch = uuid::Uuid::new_v4().simple().to_string();
        let created_ms = unix_ms(SystemTime::now());
        let made = Made { id, epoch: &epoch, owner, created_ms, entries };
        let existed = self.inner.storage.create(made).await?;
        if existed && exclusive {
            return Err(ThreadError::Exists(id.to_owned()));
        }
        let Fetched::Copy { thread, turn: _turn, .. } = self.fetch(id).await? else { return Err(not_found()) };
        if thread.owned_by(owner) { Ok(thread) } else { Err(not_found()) }
    }

    /// Deletes thread `id` (for `owner`) from the shared record and this node; false when there is none.
    async fn delete_recorded(&self, id: &str, owner: Option<&str>) -> Result<bool, ThreadError> {
        let Fetched::Copy { thread, turn: _turn, .. } = self.fetch(id).await? else { return Ok(false) };
        if !thread.owned_by(owner) {
            return Ok(false);
        }
        self.inner.storage.delete(id, &thread.epoch).await?;
        let mut map = self.map();
        if map.get(id).is_some_and(|t| Arc::ptr_eq(t, &thread)) {
            map.remove(id);
        }
        drop(map);
        self.forget(&thread);
        Ok(true)
    }

    /// The thread `id`, if `owner` may see it: as its storage has it now.
    pub(super) async fn find(&self, id: &str, owner: Option<&str>) -> Result<Option<Arc<Thread>>, ThreadError> {
        let thread = match self.fetch(id).await? {
            Fetched::Local => self.map().get(id).cloned(),
            Fetched::Missing => None,
            Fetched::Copy { thread, .. } => Some(thread),
        };
        Ok(thread.filter(|thread| thread.owned_by(owner)))
    }

    /// The run going on in thread `id`, if `owner` may see the thread and one is.
    pub async fn running(&self, id: &str, owner: Option<&str>) -> Result<Option<Arc<Stream>>, ThreadError> {
        let Some(thread) = self.find(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        Ok(state.run.as_ref().map(|run| Arc::clone(&run.stream)).filter(|stream| stream.outcome().is_none()))
    }

    /// The thread, once the result of a run that has ended is recorded: a client that read a run's end and
    /// reads the thread at once sees the run in it.
    pub(super) async fn settled(&self, id: &str, owner: Option<&str>) -> Result<Option<Arc<Thread>>, ThreadError> {
        let Some(thread) = self.find(id, owner).await? else { return Ok(None) };
        self.caught_up(&thread).await?;
        let deadline = tokio::time::Instant::now() + RECORD_WAIT;
        loop {
            let recorded = thread.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            let recording = thread.lock().run.as_ref().is_some_and(|run| run.stream.outcome().is_some());
            if !recording || tokio::time::timeout_at(deadline, recorded).await.is_err() {
                break;
            }
        }
        Ok(Some(thread))
    }

    /// The thread's conversation, or `None` when there is no such thread (for `owner`).
    pub async fn get(&self, id: &str, owner: Option<&str>) -> Result<Option<Transcript>, ThreadError> {
        let Some(thread) = self.settled(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        Ok(Some(self.transcript(&thread, &state)))
    }

    /// The thread's audit log, in order, or `None` when there is no such thread (for `owner`): the entries the
    /// thread holds, shared, not copies.
    pub async fn audit(&self, id: &str, owner: Option<&str>) -> Result<Option<Vec<Arc<AuditEntry>>>, ThreadError> {
        let Some(thread) = self.settled(id, owner).await? else { return Ok(None) };
        let state = thread.lock();
        Ok(Some(state.entries.clone()))
    }

    /// Removes a thread; a run still going on it goes on, and its result is not recorded. False when there
    /// was no such thread (for `owner`).
    pub async fn delete(&self, id: &str, owner: Option<&str>) -> Result<bool, ThreadError> {
        if self.inner.storage.is_record() {
            return self.delete_recorded(id, owner).await;
        }
        let mut map = self.map();
        if !map.get(id).is_some_and(|thread| thread.owned_by(owner)) {
            return Ok(false);
        }
        let Some(thread) = map.remove(id) else { return Ok(false) };
        drop(map);
        self.forget(&thread);
        self.inner.storage.forget(&thread.id);
        Ok(true)
    }
}
