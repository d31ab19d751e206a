//! [`Admission`]: whether a new connection is served. It needs a place under the cap
//! (`--max-connections`, every connection of every client) and one of its client's share
//! (`--connections-per-client`), and holds both for as long as its socket lives ([`Admitted`]).
//!
//! A client is its peer address, an IPv6 /64 taken as one ([`ClientAddress`]): what one host is usually
//! given, and what one attacker has at the least. The same address is the client whose stream budget a
//! request spends without keys (`extract.rs`). Every connection counts against its client's share while it
//! is open, whatever it does: a request head still arriving, a keep-alive connection between requests, an
//! event stream, a WebSocket. So one address holding its share with slow heads, idle WebSockets or SSE
//! readers leaves the rest of the cap to the others. The share defaults to a tenth of the cap, at least 64
//! (`Settings::client_connections`): a browser's six per host in many tabs, or a server's pool, fit in it.
//!
//! The counts are one map under one lock, touched twice in a connection's life (at accept and at close);
//! an address's entry is removed with its last connection, so the map holds only addresses with a
//! connection open.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::HttpError;
use crate::sync::lock;

/// How soon a refused client is told to retry: a connection closes often enough that a place may be free.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A client, by its peer address: an IPv4 address (an IPv4-mapped IPv6 one as IPv4), or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientAddress(IpAddr);

impl ClientAddress {
    /// The client `ip` belongs to.
    pub(crate) fn of(ip: IpAddr) -> ClientAddress {
        ClientAddress(match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
            },
        })
    }
}

impl std::fmt::Display for ClientAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => {
                let [a, b, c, d, ..] = v6.segments();
                write!(f, "{a:x}:{b:x}:{c:x}:{d:x}::/64")
            }
        }
    }
}

/// The connection cap and every client's share of it; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    cap: Arc<Semaphore>,
    max: usize,
    clients: Arc<Clients>,
}

/// The connections each client address holds, and how many it may.
#[derive(Debug)]
struct Clients {
    share: usize,
    open: Mutex<HashMap<ClientAddress, usize>>,
}

/// Why a connection is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The service serves its cap of connections.
    Full { max: usize },
    /// The connection's client holds its share.
    Client { share: usize },
}

/// An admitted connection's place under the cap and in its client's share, given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    _cap: OwnedSemaphorePermit,
    client: ClientAddress,
    clients: Arc<Clients>,
}

impl Admission {
    /// At most `max` connections at once, at most `share` of them from one client address.
    pub(crate) fn new(max: usize, share: usize) -> Admission {
        let clients = Clients { share, open: Mutex::new(HashMap::new()) };
        Admission { cap: Arc::new(Semaphore::new(max)), max, clients: Arc::new(clients) }
    }

    /// A place for a connection from `peer`, or why there is none. The cap is checked first: a full service
    /// says so to everyone, and a client is told of its share while there is room for others.
    pub(crate) fn admit(&self, peer: IpAddr) -> Result<Admitted, Refused> {
        let permit = Arc::clone(&self.cap).try_acquire_owned().map_err(|_| Refused::Full { max: self.max })?;
        let client = ClientAddress::of(peer);
        let mut open = lock(&self.clients.open);
        let held = open.get(&client).copied().unwrap_or(0);
        if held >= self.clients.share {
            return Err(Refused::Client { share: self.clients.share });
        }
        open.insert(client, held + 1);
        drop(open);
        Ok(Admitted { _cap: permit, client, clients: Arc::clone(&self.clients) })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = lock(&self.clients.open);
        if let Some(held) = open.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.client);
            }
        }
    }
}

impl Refused {
    /// The answer to a refused connection: 503 `capacity` when the service is full, 429
    /// `client_connections` when its client holds its share; both say when to retry.
    pub(crate) fn error(self) -> HttpError {
        let mut error = match self {
            Refused::Full { max } => HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!(
                    "the service is serving its limit of {max} connections (--max-connections); a retry may succeed \
                     once others close"
                ),
                None,
                "capacity",
            ),
            Refused::Client { share } => HttpError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "this address holds its limit of {share} connections (--connections-per-client); retry once one \
                     of them closes"
                ),
                None,
                "client_connections",
            ),
        };
        error.retry = true;
        error.retry_after = Some(RETRY_AFTER);
        error
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    /// An IPv6 /64 is one client, an IPv4-mapped address is its IPv4 one, and each prints as the budgets
    /// name it.
    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_network() {
        let a = ClientAddress::of(ip("2001:db8:1:2:aaaa::1"));
        assert_eq!(a, ClientAddress::of(ip("2001:db8:1:2:ffff:1:2:3")));
        assert_ne!(a, ClientAddress::of(ip("2001:db8:1:3::1")));
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped());
        assert_eq!(ClientAddress::of(mapped), ClientAddress::of(ip("10.0.0.7")));
        assert_eq!(ClientAddress::of(mapped).to_string(), "10.0.0.7");
        assert_eq!(ClientAddress::of(IpAddr::V6(Ipv6Addr::LOCALHOST)).to_string(), "0:0:0:0::/64");
    }

    /// A client at its share is refused while another is admitted; a place given back is taken again, and
    /// the map forgets an address without connections.
    #[test]
    fn a_client_holds_at_most_its_share_of_the_cap() {
        let admission = Admission::new(5, 2);
        let (one, two) = (ip("127.0.0.1"), ip("127.0.0.2"));
        let first = [admission.admit(one).expect("first"), admission.admit(one).expect("second")];
        assert_eq!(admission.admit(one).err(), Some(Refused::Client { share: 2 }));
        let others = [admission.admit(two).expect("other"), admission.admit(two).expect("other")];
        let last = admission.admit(ip("127.0.0.3")).expect("the fifth");
        assert_eq!(admission.admit(ip("127.0.0.4")).err(), Some(Refused::Full { max: 5 }));
        drop(last);
        let [a, _b] = first;
        drop(a);
        let again = admission.admit(one).expect("a place given back");
        drop((again, others));
        assert_eq!(lock(&admission.clients.open).get(&ClientAddress::of(two)), None);
    }
}
