//! [`ThreadBudgets`]: how many threads each client keeps, against its share of the registry.
//!
//! A client is the name the service gives a request (its API key as `key:<name>`, or without keys its
//! peer's address: the same name its streams count against), so one client cannot take every thread
//! ([`ThreadConfig::max_threads`]) and leave the others none. Unlike an ended stream, a thread is a user's
//! conversation: a client at its share is refused, and none of its threads is evicted early to make room;
//! room comes back as its idle threads expire (the thread TTL) or when it deletes one.
//!
//! The count sits beside the registry's map, not in it, because with a record every node shares the map is
//! only this node's cache of copies: those are not counted (see "Budgets" in `docs/decisions.md`).

use std::collections::HashMap;
use std::sync::Mutex;

use super::config::ThreadConfig;

/// Threads kept, by client; see the module doc.
#[derive(Debug, Default)]
pub(super) struct ThreadBudgets {
    kept: Mutex<HashMap<String, usize>>,
    /// When room is next expected, by client (`""`: the whole registry), in ms by the hub's clock: what a
    /// refusal found by looking through every thread, kept until then so that a client refused again and
    /// again does not have the registry looked through each time.
    room_at: Mutex<HashMap<String, u64>>,
}

impl ThreadBudgets {
    /// Counts one more thread for `client` if its share holds it; `Err` with the share when it does not.
    pub(super) fn admit(&self, config: &ThreadConfig, client: &str) -> Result<(), usize> {
        let share = config.client_budgets.get(client).copied().unwrap_or(config.threads_per_client);
        let mut kept = crate::sync::lock(&self.kept);
        let count = kept.entry(client.to_owned()).or_default();
        if *count >= share {
            if *count == 0 {
                kept.remove(client);
            }
            return Err(share);
        }
        *count += 1;
        Ok(())
    }

    /// Counts a thread for `client` whatever its share: one kept from before a restart.
    pub(super) fn hold(&self, client: &str) {
        *crate::sync::lock(&self.kept).entry(client.to_owned()).or_default() += 1;
    }

    /// When room for `client` (none: for anyone) was found to be expected, if that is still ahead of
    /// `now_ms`.
    pub(super) fn room_at(&self, client: Option<&str>, now_ms: u64) -> Option<u64> {
        let mut room_at = crate::sync::lock(&self.room_at);
        room_at.retain(|_, at| *at > now_ms);
        room_at.get(client.unwrap_or_default()).copied()
    }

    /// Keeps `at_ms` as when room for `client` (none: for anyone) is expected.
    pub(super) fn expect_room(&self, client: Option<&str>, at_ms: u64) {
        crate::sync::lock(&self.room_at).insert(client.unwrap_or_default().to_owned(), at_ms);
    }

    /// One thread of `client`'s less (deleted, expired, or not made after all).
    pub(super) fn release(&self, client: &str) {
        let mut kept = crate::sync::lock(&self.kept);
        if let Some(count) = kept.get_mut(client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                kept.remove(client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_keeps_its_share_and_no_more_and_a_key_its_own() {
        let mut config = ThreadConfig { threads_per_client: 2, ..ThreadConfig::default() };
        config.client_budgets.insert("key:big".into(), 3);
        let budgets = ThreadBudgets::default();
        assert_eq!(budgets.admit(&config, "10.0.0.1"), Ok(()));
        assert_eq!(budgets.admit(&config, "10.0.0.1"), Ok(()));
        assert_eq!(budgets.admit(&config, "10.0.0.1"), Err(2));
        assert_eq!(budgets.admit(&config, "10.0.0.2"), Ok(()), "another client is not affected");
        budgets.release("10.0.0.1");
        assert_eq!(budgets.admit(&config, "10.0.0.1"), Ok(()));
        for _ in 0..3 {
            assert_eq!(budgets.admit(&config, "key:big"), Ok(()));
        }
        assert_eq!(budgets.admit(&config, "key:big"), Err(3));
    }
}
