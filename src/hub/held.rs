//! [`Held`]: the streams the hub holds by owner, and the ended ones in the order they will be evicted.
//!
//! A client's budget counts what it holds, not only what it has open: an ended stream is retained (and
//! takes a place of the hub's [`Limits::streams`](super::Limits::streams)) until it is evicted, so a client
//! that creates and ends streams would otherwise fill the hub with them. Both counts sit behind one lock so
//! that a stream's end, its eviction (by its retention, or early, to make room) and a new stream's admission
//! always agree on who holds what.
//!
//! The retained streams are kept in one map ordered by when they ended (the key is that time and a serial
//! number, so ends in the same millisecond keep their order), and each client keeps the keys of its own in
//! the same order: the hub's oldest and a client's oldest are each found, and taken out of both, in
//! logarithmic time, however many streams are held.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// Where a retained stream sits in the order of eviction: when it ended (ms by the hub's clock), then a
/// serial number.
type EndKey = (u64, u64);

/// What the hub holds, by owner; see the module doc.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Retained streams by when they ended, oldest first: id and owner.
    retained: BTreeMap<EndKey, (String, Option<String>)>,
    serial: u64,
    clients: HashMap<String, ClientHeld>,
}

/// One client's streams: open, retained (keys into [`Held::retained`], oldest first), and created in the
/// current minute.
#[derive(Debug, Default)]
pub(super) struct ClientHeld {
    pub(super) open: usize,
    retained: VecDeque<EndKey>,
    pub(super) minute_started_ms: u64,
    pub(super) created_this_minute: u32,
}

impl ClientHeld {
    /// Streams it holds: open and retained.
    pub(super) fn held(&self) -> usize {
        self.open + self.retained.len()
    }

    /// Whether it holds any stream retained.
    pub(super) fn retains(&self) -> bool {
        !self.retained.is_empty()
    }
}

impl Held {
    /// The client's counts, made empty on first use.
    pub(super) fn client(&mut self, client: &str) -> &mut ClientHeld {
        self.clients.entry(client.to_owned()).or_default()
    }

    /// Stream `id` of `client` (if any) ended at `at_ms`: retained from now until evicted; one fewer open.
    pub(super) fn ended(&mut self, id: &str, client: Option<&str>, at_ms: u64) {
        if let Some(usage) = client.and_then(|client| self.clients.get_mut(client)) {
            usage.open = usage.open.saturating_sub(1);
        }
        self.retain(id, client, at_ms);
    }

    /// Stream `id` of `client` (if any), which ended at `at_ms`, is retained until evicted: one the hub
    /// ended itself, or one a storage kept from before a restart (in its place by `at_ms`).
    pub(super) fn retain(&mut self, id: &str, client: Option<&str>, at_ms: u64) {
        let key = (at_ms, self.serial);
        self.serial += 1;
        self.retained.insert(key, (id.to_owned(), client.map(str::to_owned)));
        if let Some(client) = client {
            let mine = &mut self.client(client).retained;
            let at = mine.partition_point(|k| *k <= key);
            mine.insert(at, key);
        }
    }

    /// When the oldest retained stream ended (ms by the hub's clock).
    pub(super) fn oldest_end_ms(&self) -> Option<u64> {
        self.retained.first_key_value().map(|((at, _), _)| *at)
    }

    /// Takes out the retained streams that ended at or before `before_ms`, oldest first: their ids.
    pub(super) fn take_ended_before(&mut self, before_ms: u64) -> Vec<String> {
        let mut taken = Vec::new();
        while self.oldest_end_ms().is_some_and(|at| at <= before_ms) {
            taken.extend(self.take_oldest());
        }
        taken
    }

    /// Takes out the oldest retained stream, whoever holds it: its id.
    pub(super) fn take_oldest(&mut self) -> Option<String> {
        let (key, (id, client)) = self.retained.pop_first()?;
        if let Some(usage) = client.and_then(|client| self.clients.get_mut(&client)) {
            // Its own oldest, since the client's keys are in the same order.
            if usage.retained.front() == Some(&key) {
                usage.retained.pop_front();
            } else if let Some(at) = usage.retained.iter().position(|k| *k == key) {
                usage.retained.remove(at);
            }
        }
        Some(id)
    }

    /// Takes out `client`'s oldest retained stream: its id.
    pub(super) fn take_oldest_of(&mut self, client: &str) -> Option<String> {
        let key = self.clients.get_mut(client)?.retained.pop_front()?;
        self.retained.remove(&key).map(|(id, _)| id)
    }

    /// Gives back an open place of `client`'s, and a creation this minute, for a stream not made after all.
    pub(super) fn unadmit(&mut self, client: &str) {
        if let Some(usage) = self.clients.get_mut(client) {
            usage.open = usage.open.saturating_sub(1);
            usage.created_this_minute = usage.created_this_minute.saturating_sub(1);
        }
    }

    /// Forgets the clients that hold nothing and have no minute running (as of `now_ms`), so that clients
    /// come and go without the map growing.
    pub(super) fn forget_idle_clients(&mut self, now_ms: u64, minute_ms: u64) {
        self.clients.retain(|_, usage| usage.held() > 0 || now_ms.saturating_sub(usage.minute_started_ms) < minute_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_oldest_and_the_hubs_oldest_leave_both_orders() {
        let mut held = Held::default();
        held.client("a").open = 3;
        held.ended("a1", Some("a"), 10);
        held.ended("b1", None, 11);
        held.ended("a2", Some("a"), 12);
        held.retain("a0", Some("a"), 5);
        assert_eq!(held.client("a").held(), 4, "one open, three retained");
        assert_eq!(held.take_oldest_of("a").as_deref(), Some("a0"), "the restored one ended first");
        assert_eq!(held.take_oldest().as_deref(), Some("a1"));
        assert_eq!(held.take_ended_before(11), ["b1"]);
        assert_eq!(held.client("a").held(), 2);
        assert_eq!(held.take_oldest_of("a").as_deref(), Some("a2"));
        assert_eq!(held.oldest_end_ms(), None);
        held.client("a").open = 0;
        held.forget_idle_clients(200_000, 60_000);
        assert!(held.clients.is_empty());
    }
}
