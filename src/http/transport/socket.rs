//! An accepted connection's socket: [`tune`], what it is set to, and why; [`AdmittedSocket`], the socket
//! with its place under the connection cap and in its client's share (`edge/admission.rs`); [`Rewind`], the socket with the bytes already read from it put
//! back in front, for hyper.
//!
//! - **No Nagle delay** (`TCP_NODELAY`): events are small and their latency matters more than the number of
//!   packets; an event must not wait behind an unacknowledged write.
//! - **Little unsent data in the kernel** (`TCP_NOTSENT_LOWAT`, [`UNSENT_BYTES`]; Linux): a write is
//!   accepted only while the socket holds less than this much that it has not sent yet, and the socket is
//!   writable again once it has sent down to it. Whatever a subscriber's connection cannot send yet stays in
//!   the stream's log, where one copy serves every subscriber, instead of being copied into its socket
//!   buffer, which the kernel otherwise grows to megabytes per connection. With thousands of subscribers
//!   those copies add up to the kernel's limit on TCP memory (`net.ipv4.tcp_mem`): past it the kernel
//!   prunes queues and drops packets, and every connection waits out a retransmission timeout. A fan-out
//!   of 6,000 messages to 5,000 subscribers on one machine held 1.9 GiB of TCP memory at its peak and did
//!   that in about half its runs, which then took a third longer; bounded, it peaked at 0.6–0.8 GiB
//!   (`docs/benchmarks-history.md`, session 21). A reader that keeps up never notices the bound: the socket sends as
//!   fast as the peer's window lets it, and each write still carries everything the subscriber is behind,
//!   up to the size of a gathered write.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::http::edge::admission::Admitted;
use crate::http::edge::metrics::Open;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The unsent data past which a connection's socket takes no more until it has sent down to it (see the
/// module doc). A write may overshoot it by one segment, so a connection keeps at most about twice this
/// unsent. 64 KiB keeps a full segment ready to send even over loopback; 16 KiB was slower there, at every
/// fan-out size measured.
#[cfg(any(target_os = "linux", target_os = "android"))]
const UNSENT_BYTES: u32 = 64 << 10;

/// Sets an accepted connection's socket up (see the module doc). An option the system refuses is logged
/// and the connection served without it.
pub(crate) fn tune(tcp: &TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY not set");
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(error) = socket2::SockRef::from(tcp).set_tcp_notsent_lowat(UNSENT_BYTES) {
        tracing::debug!(%error, "TCP_NOTSENT_LOWAT not set");
    }
}

/// An accepted connection's socket with its place under the cap and in its client's share (`server.rs`):
/// given back when the socket closes, whoever holds it then (hyper, or a WebSocket after the upgrade).
pub(crate) struct AdmittedSocket {
    pub(crate) tcp: TcpStream,
    _admitted: Admitted,
    /// Counted as open in the metrics.
    _open: Open,
}

impl AdmittedSocket {
    /// `tcp`, holding its place (`admitted`) and counted as `open` until it closes.
    pub(crate) fn new(tcp: TcpStream, admitted: Admitted, open: Open) -> Self {
        AdmittedSocket { tcp, _admitted: admitted, _open: open }
    }

    /// The socket, to share between tasks, and what must be kept for as long as it is open.
    pub(crate) fn share(self) -> (Arc<TcpStream>, Kept) {
        (Arc::new(self.tcp), Kept { _admitted: self._admitted, _open: self._open })
    }
}

/// What a shared socket ([`AdmittedSocket::share`]) keeps for as long as it is open: its place under the cap
/// and in its client's share, and its count in the metrics.
pub(crate) struct Kept {
    _admitted: Admitted,
    _open: Open,
}

impl AsyncRead for AdmittedSocket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for AdmittedSocket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// A connection with the bytes already read from it put back in front: what hyper reads first.
pub(crate) struct Rewind {
    prefix: Option<Bytes>,
    socket: AdmittedSocket,
}

impl Rewind {
    pub(crate) fn new(prefix: Vec<u8>, socket: AdmittedSocket) -> Self {
        Rewind { prefix: (!prefix.is_empty()).then(|| Bytes::from(prefix)), socket }
    }

    /// The socket, and what is still to be read in front of it.
    pub(crate) fn into_parts(self) -> (AdmittedSocket, Option<Bytes>) {
        (self.socket, self.prefix)
    }
}

impl AsyncRead for Rewind {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.as_mut() {
            let n = prefix.len().min(buf.remaining());
            buf.put_slice(&prefix.split_to(n));
            if prefix.is_empty() {
                this.prefix = None;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// An accepted socket comes out of `tune` without Nagle and with its unsent data bounded.
    #[tokio::test]
    async fn a_tuned_socket_has_no_nagle_and_bounded_unsent_data() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let addr = listener.local_addr().expect("address");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (_client, (server, _)) = (client.expect("connected"), accepted.expect("accepted"));
        tune(&server);
        assert!(server.nodelay().expect("TCP_NODELAY read"));
        #[cfg(any(target_os = "linux", target_os = "android"))]
        assert_eq!(socket2::SockRef::from(&server).tcp_notsent_lowat().expect("TCP_NOTSENT_LOWAT read"), UNSENT_BYTES);
    }
}
