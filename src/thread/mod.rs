//! Server-side threads (`docs/design.md`, "Threads"): conversations the service keeps, with their audit log (there, "Audit and replay")
//! and replay against another model.
//!
//! - [`Threads`] (`registry.rs`): the registry of threads by id, their limits, and eviction after a TTL
//!   without use (by the hub's clock, so tests move time by hand).
//! - `storage.rs`: the seam to where threads are kept besides this process's memory, as
//!   [`crate::hub::Storage`] is for streams: the trait, and the memory storage (nowhere). The embedded store
//!   (`store/thread_storage.rs`) and Redis (`cluster/thread_storage.rs`) implement it beside their engines;
//!   `thread/` names no engine.
//! - `lookup.rs`: finding, making and deleting a thread, wherever its record is.
//! - `replica.rs`: this node's copy of a thread whose record is a storage every node shares: each use reads
//!   the thread again, each change is committed only onto what was read.
//! - `run.rs`: a turn on a thread (check the input, prepend the history, start the agent; for a client that
//!   resends its whole history, start from it or rewind to it) and a replay (fork the history up to an
//!   entry, run it on another model).
//! - `kept.rs`: a kept OpenAI response as a thread of its own: keeping a run started elsewhere, and reading
//!   back its input, output and end.
//! - `recorder.rs`: the task per run that waits for its end and records its result in the thread.
//! - [`AuditEntry`] and [`Decision`] (`audit.rs`): what a thread keeps. The history the next run sees is
//!   the messages of its history entries, so the two never disagree.
//! - `record.rs`: what a finished run adds: its text, tool calls and tool results as chat messages.
//! - `budget.rs`: how many threads each client keeps, against its share
//!   ([`ThreadConfig::threads_per_client`]): a client at its share is refused, none of its threads evicted.
//! - [`ThreadConfig`] (`config.rs`) and [`ThreadError`] (`error.rs`).
//!
//! Files depend on each other in one direction: `registry.rs` on `storage.rs`; `replica.rs` on the registry;
//! `recorder.rs` on the replica; `lookup.rs` and `run.rs` on those. Reading a shared thread may find a run
//! to record, and recording a run reads the thread again: both go through [`Threads`]' `fetch`
//! (`recorder.rs`), so the replica never calls back into the recorder.
//!
//! Two runs on one thread at once: the second is refused with [`ThreadError::Busy`] (HTTP 409
//! `thread_busy`), naming the running stream, since its answer would depend on a result nobody has seen yet.
//! A turn that arrives after the run ended but before its result is recorded (the client read `[DONE]` and
//! asked again at once) waits the moment it takes instead.

mod audit;
mod budget;
mod config;
mod error;
mod kept;
mod lookup;
mod record;
mod recorder;
mod registry;
mod replica;
mod run;
mod storage;

pub use audit::{AuditEntry, Decision};
pub use config::ThreadConfig;
pub use error::ThreadError;
pub(crate) use error::check_id;
pub(crate) use kept::KeptResponse;
pub use registry::{Threads, Transcript};
pub use run::{Replay, Turn};
pub(crate) use storage::{
    Change, Commit, Made, MemoryThreadStorage, RecordedRun, RecordedThread, RestoredThread, ThreadStorage,
};
