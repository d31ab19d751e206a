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
//!   ([`UpgradedSocket::from_hyper`]), with the bytes hyper read past the request put in front.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::socket::{AdmittedSocket, Kept, Rewind};
use crate::sync::lock;

/// An upgraded connection's socket, owned by its WebSocket connection.
pub(crate) struct UpgradedSocket {
    pub(crate) tcp: Arc<TcpStream>,
    /// Its place under the cap and in its client's share, for as long as it is open.
    pub(crate) kept: Kept,
    /// Bytes the client sent after the upgrade request that were already read: its first frames.
    pub(crate) read: Vec<u8>,
}

impl UpgradedSocket {
    /// The socket of a connection whose upgrade was read and answered without hyper.
    pub(crate) fn direct(socket: AdmittedSocket) -> Self {
        let (tcp, kept) = socket.share();
        UpgradedSocket { tcp, kept, read: Vec::new() }
    }

    /// The socket hyper served, out of its `Upgraded` IO; `None` if that IO is not the one `server.rs` gives
    /// hyper.
    pub(crate) fn from_hyper(upgraded: hyper::upgrade::Upgraded) -> Option<Self> {
        let parts = upgraded.downcast::<TokioIo<Rewind>>().ok()?;
        let (socket, prefix) = parts.io.into_inner().into_parts();
        let mut read = prefix.map(|prefix| prefix.to_vec()).unwrap_or_default();
        read.extend_from_slice(&parts.read_buf);
        let (tcp, kept) = socket.share();
        Some(UpgradedSocket { tcp, kept, read })
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
