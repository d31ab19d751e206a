//! [`listen`]: a listener with room for a burst of clients.

/// Listens on `addr` with a backlog of 4,096 connections, not the default 128: a burst of clients connecting
/// at once (200 chat requests, a reconnect storm) must not have its SYNs dropped and retried a second later.
/// Every address `addr` resolves to is tried in turn; the first that binds is kept.
pub async fn listen(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = std::io::Error::other("the address resolves to nothing");
    for address in tokio::net::lookup_host(addr).await? {
        let socket =
            if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        match socket.bind(address).and_then(|()| socket.listen(4096)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = e,
        }
    }
    Err(last)
}
