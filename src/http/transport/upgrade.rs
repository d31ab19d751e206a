//! A WebSocket upgrade answered by the service itself: [`UpgradedSocket`], the socket a WebSocket connection
//! owns once its `101` went out, and [`DirectUpgrade`], how a `101` response carries what serves it to the
//! transport that owns the socket.
//!
//! A WebSocket connection writes its streams' frames itself, with one vectored write of a batch's shared
//! pieces, and reads its client's frames itself (`ws.rs`, `ws_reader.rs`): it needs the TCP socket, not a
//! wrapper with buffers of its own. The upgrade comes one of two ways:
//!
//! - As a connection's first request, read by `event_connection.rs` without hyper (every WebSocket client
//!   opens a connection for its WebSocket): the request is marked [`UpgradesDirectly`], the endpoint's `101`
//!   carries a [`DirectUpgrade`], and `event_connection.rs` writes the head and hands the socket over. No
//!   buffer of hyper's is ever held for such a connection.
//! - Through hyper (an upgrade after other requests on a kept-alive connection): hyper writes the `101` and
//!   hands over its `Upgraded` IO, which is taken apart back into the socket it serves
//!   ([`UpgradedSocket::from_hyper`]), with the bytes hyper read past the request put in front. That is
//!   `server.rs`'s socket or a plain `TcpStream`; behind another server's wrappers (an application that
//!   serves the router itself, `axum::serve`), the connection reads and writes through `Upgraded` instead
//!   ([`UpgradedIo::Other`]), without the direct writes and the feed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::socket::{AdmittedSocket, Kept, Rewind};
use crate::sync::lock;

/// What an upgraded connection reads and writes.
pub(crate) enum UpgradedIo {
    /// The TCP socket itself: what the service's own server accepted, or `axum::serve`'s.
    Tcp(Arc<TcpStream>),
    /// Another server's IO, behind its own wrappers (`axum::serve` wraps its sockets to tell HTTP/2 from
    /// HTTP/1): read and written through hyper's `Upgraded`.
    Other(Box<TokioIo<hyper::upgrade::Upgraded>>),
}

/// An upgraded connection's socket, owned by its WebSocket connection.
pub(crate) struct UpgradedSocket {
    pub(crate) io: UpgradedIo,
    /// Its place under the cap and in its client's share, for as long as it is open (none when another
    /// server accepted it).
    pub(crate) kept: Option<Kept>,
    /// Bytes the client sent after the upgrade request that were already read: its first frames.
    pub(crate) read: Vec<u8>,
}

impl UpgradedSocket {
    /// The socket of a connection whose upgrade was read and answered without hyper.
    pub(crate) fn direct(socket: AdmittedSocket) -> Self {
        let (tcp, kept) = socket.share();
        UpgradedSocket { io: UpgradedIo::Tcp(tcp), kept: Some(kept), read: Vec::new() }
    }

    /// The socket hyper served, out of its `Upgraded` IO when it is `server.rs`'s or a plain TCP stream; any
    /// other IO is kept as it is.
    pub(crate) fn from_hyper(upgraded: hyper::upgrade::Upgraded) -> Self {
        let upgraded = match upgraded.downcast::<TokioIo<Rewind>>() {
            Ok(parts) => {
                let (socket, prefix) = parts.io.into_inner().into_parts();
                let mut read = prefix.map(|prefix| prefix.to_vec()).unwrap_or_default();
                read.extend_from_slice(&parts.read_buf);
                let (tcp, kept) = socket.share();
                return UpgradedSocket { io: UpgradedIo::Tcp(tcp), kept: Some(kept), read };
            }
            Err(upgraded) => upgraded,
        };
        match upgraded.downcast::<TokioIo<TcpStream>>() {
            Ok(parts) => {
                let io = UpgradedIo::Tcp(Arc::new(parts.io.into_inner()));
                UpgradedSocket { io, kept: None, read: parts.read_buf.to_vec() }
            }
            Err(upgraded) => {
                UpgradedSocket { io: UpgradedIo::Other(Box::new(TokioIo::new(upgraded))), kept: None, read: Vec::new() }
            }
        }
    }
}

/// What serves an upgraded socket: the endpoint's connection.
pub(crate) type Serve = Box<dyn FnOnce(UpgradedSocket) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// In a `101` response's extensions: what serves the socket, for the transport that answered the upgrade
/// without hyper to take (once).
#[derive(Clone)]
pub(crate) struct DirectUpgrade(Arc<Mutex<Option<Serve>>>);

impl DirectUpgrade {
    pub(crate) fn new(serve: Serve) -> Self {
        DirectUpgrade(Arc::new(Mutex::new(Some(serve))))
    }

    /// What serves the socket, unless it was taken.
    pub(crate) fn take(&self) -> Option<Serve> {
        lock(&self.0).take()
    }
}

/// In a request's extensions: its connection's transport answers an upgrade itself (`event_connection.rs`),
/// so the endpoint's `101` is to carry a [`DirectUpgrade`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpgradesDirectly;

/// The `Sec-WebSocket-Accept` answer to a `Sec-WebSocket-Key` (RFC 6455 §4.2.2).
pub(crate) fn accept_key(key: &[u8]) -> String {
    tungstenite::handshake::derive_accept_key(key)
}
