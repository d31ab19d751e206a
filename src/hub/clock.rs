//! Where a stream gets its time and its random names from, injectable so tests are deterministic.
//!
//! A stream stamps every message with a timestamp and has a random id and epoch. Production uses the
//! system clock and the thread-local CSPRNG ([`SystemClock`], [`RandomIds`]); tests and golden files plug
//! in their own (a clock that ticks, ids that count), which is why both are traits.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngCore;

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
}

/// Names for streams and their incarnations.
pub trait Ids: Send + Sync + std::fmt::Debug {
    /// A new stream id: URL-safe, and unguessable in production.
    fn stream_id(&self) -> String;
    /// A new epoch: differs for every incarnation of a stream.
    fn epoch(&self) -> String;
}

/// 128 random bits as 32 hex digits for ids, 64 for epochs.
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomIds;

/// 32 random bytes from the same generator: the key stream tokens are signed with, for a service without a
/// store to keep one across restarts (its tokens end with the process) and the first node of a cluster.
pub fn random_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    secret
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl Ids for RandomIds {
    fn stream_id(&self) -> String {
        random_hex(16)
    }

    fn epoch(&self) -> String {
        random_hex(8)
    }
}
