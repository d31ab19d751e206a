//! The `ws-idle` scenario: subscribers that never read their socket, over SSE and over WebSocket.
//!
//! Each set runs on a fresh server holding one open stream of `messages` text messages of `message_bytes`
//! each (about 20 MB): `connections` subscribers from the start of the log, each of which reads its response
//! head (SSE: the `200`, WebSocket: the `101` of a plain HTTP/1.1 upgrade) and then nothing, so whatever the
//! server holds for them beyond what the kernel's socket buffers take stays in its memory. The server's RSS
//! is read before a set opens and `settle` seconds after: what the set added, in all and per connection.
//! Before that, one subscriber of the set's own transport from the end of the log (`?from=` the last
//! sequence) makes the server render the stream's frames for that transport, which a stream with
//! subscribers has anyway: neither set is charged for them.
//! The SSE set runs on the scenario's server and the WebSocket set on a second one started here, filled
//! alike, so neither set reuses memory the other freed.
//!
//! This module owns the fill, the handshakes and the figures; the table's notes in `main.rs` print them.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::client::{self, Conn, source_ip};
use crate::procfs::{self, Server, Target};
use crate::scenarios::{FILLER, RunResult, Settings, create_stream};

/// Any 16 bytes in base64 will do: the server only hashes it into `Sec-WebSocket-Accept`.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// Messages per POST while filling (each POST about 1 MB at 10 KB a message).
const FILL_BATCH: usize = 100;

#[derive(Debug, Clone, Copy)]
enum Set {
    Sse,
    WebSocket,
}

impl Set {
    fn name(self) -> &'static str {
        match self {
            Set::Sse => "sse",
            Set::WebSocket => "ws",
        }
    }
}

/// Creates a stream and appends `messages` whole text messages of about `message_bytes` each; its id and
/// last sequence.
async fn fill(server: SocketAddr, messages: usize, message_bytes: usize) -> io::Result<(String, u64)> {
    let mut conn = Conn::open(server, source_ip(0)).await?;
    let id = create_stream(&mut conn).await?;
    let text: String = FILLER.chars().cycle().take(message_bytes).collect();
    let line = format!("{{\"type\":\"text\",\"props\":{{\"content\":\"{text}\"}}}}\n");
    let path = format!("/v1/streams/{id}/messages");
    let (mut filled, mut last) = (0, 0);
    while filled < messages {
        let n = FILL_BATCH.min(messages - filled);
        let (status, reply) =
            conn.request("POST", &path, Some("application/x-ndjson"), line.repeat(n).as_bytes()).await?;
        let sequences: serde_json::Value = serde_json::from_slice(&reply).unwrap_or_default();
        match (status, sequences["sequences"].as_array().and_then(|s| s.last()).and_then(|s| s.as_u64())) {
            (200, Some(sequence)) => last = sequence,
            _ => return Err(io::Error::other(format!("append: {status} {}", String::from_utf8_lossy(&reply)))),
        }
        filled += n;
    }
    Ok((id, last))
}

/// Subscribes to stream `id` (SSE: with `query`) and reads the response head only.
async fn open(server: SocketAddr, i: usize, id: &str, set: Set, query: &str) -> io::Result<TcpStream> {
    let mut stream = client::connect(server, source_ip(i)).await?;
    let (path, request, expected) = match set {
        Set::Sse => {
            let path = format!("/v1/streams/{id}/events{query}");
            let request = client::request_head("GET", &path, None, 0, false);
            (path, request, 200)
        }
        Set::WebSocket => {
            let path = format!("/v1/streams/{id}/ws");
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                 Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {WS_KEY}\r\n\r\n"
            );
            (path, request.into_bytes(), 101)
        }
    };
    stream.write_all(&request).await?;
    let mut head = Vec::with_capacity(4096);
    let (status, _, _) = client::read_head(&mut stream, &mut head).await?;
    if status != expected {
        return Err(io::Error::other(format!("GET {path}: status {status}, not {expected}")));
    }
    Ok(stream)
}

/// Fills a stream on `server`, opens `connections` subscribers of `set` that never read, and records the
/// RSS they added after `settle` seconds.
async fn measure(server: &Server, set: Set, kind: &WsIdle, result: &mut RunResult) -> io::Result<()> {
    let (id, last) = fill(server.addr, kind.messages, kind.message_bytes).await?;
    let rendered = open(server.addr, 0, &id, set, &format!("?from={last}")).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_kib();
    let (server_cpu, client_cpu) = (server.cpu_seconds(), procfs::cpu_seconds("self"));
    let mut open_streams = Vec::with_capacity(kind.connections);
    for i in 0..kind.connections {
        match open(server.addr, i, &id, set, "").await {
            Ok(stream) => open_streams.push(stream),
            Err(e) => {
                result.errors += 1;
                result.note(format!("{} subscribe: {e}", set.name()));
            }
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(kind.settle)).await;
    let after = server.rss_kib();
    result.server_cpu_s += server.cpu_seconds().since(server_cpu).total();
    result.client_cpu_s += procfs::cpu_seconds("self").since(client_cpu).total();
    result.server_peak_rss_mib = result.server_peak_rss_mib.max(server.peak_rss_kib() as f64 / 1024.0);
    let added = after.saturating_sub(before) as f64;
    let name = set.name();
    result.extra.insert(format!("{name}_idle_open"), open_streams.len() as f64);
    result.extra.insert(format!("{name}_idle_rss_before_mib"), before as f64 / 1024.0);
    result.extra.insert(format!("{name}_idle_added_mib"), added / 1024.0);
    result.extra.insert(format!("{name}_idle_kib_per_conn"), added / open_streams.len().max(1) as f64);
    drop((open_streams, rendered));
    Ok(())
}

/// The scenario's sizes.
#[derive(Debug, Clone)]
pub(crate) struct WsIdle {
    /// Subscribers in each set.
    pub(crate) connections: usize,
    /// Messages in the stream, and the bytes of text in each.
    pub(crate) messages: usize,
    pub(crate) message_bytes: usize,
    /// Seconds between opening a set and reading the RSS.
    pub(crate) settle: f64,
}

/// One run: the SSE set on `server`, the WebSocket set on a fresh server (its log named after `label`).
pub(crate) async fn ws_idle(
    server: &Server,
    settings: &Settings,
    label: &str,
    kind: &WsIdle,
    result: &mut RunResult,
) -> io::Result<()> {
    result.messages = kind.messages as u64;
    measure(server, Set::Sse, kind, result).await?;
    let second = Server::start(Target::Agentmux, &settings.agentmux, &format!("{label}-ws")).await?;
    measure(&second, Set::WebSocket, kind, result).await
}
