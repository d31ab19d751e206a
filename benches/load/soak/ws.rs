//! The soak's WebSocket subscribers: per-stream readers, multiplexing readers, idle connections and slow
//! readers.
//!
//! - `Stream`: `GET /v1/streams/{id}/ws` (CUI or OpenAI), reads every message until `done` and the
//!   server's close, then opens a new connection to another open stream;
//! - `Multi`: one `GET /v1/ws` connection for the whole soak, subscribed to two streams at a time (one CUI,
//!   one OpenAI): when one says `done` (or `lagged`), it subscribes to another;
//! - `Idle`: a `GET /v1/ws` connection that subscribes to nothing and sends nothing: nothing may come, and
//!   it must stay open;
//! - `Slow`: the per-stream endpoint on a raw socket with a small receive buffer, read as slowly as an SSE
//!   slow reader (`scan.rs`), until `done` or `lagged` and the server's close.
//!
//! The server's messages are told apart by what follows `{"stream":"<id>"`: `seq`, `chunk`, `event` or
//! `message` (a delivery), `error` (an OpenAI error frame, a delivery, or `lagged`), `done`, and
//! acknowledgements; a message starting `{"error"` is an op refused. Errors: a handshake answered other
//! than `101`, a connection that closes or fails before `done`, anything an idle connection receives, and
//! a refused op.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::client::{self, source_ip};

use super::scan::{SLOW_RECEIVE_BUFFER, Scan, read_body, read_slowly};
use super::shared::{Counters, Failure, Held, Shared, connect};

/// What a WebSocket subscriber does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WsKind {
    Stream { openai: bool },
    Multi,
    Idle,
    Slow { openai: bool },
}

/// Any 16 bytes in base64 will do: the server only hashes it into `Sec-WebSocket-Accept`.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Subscriptions a `Multi` connection holds.
const MULTI: usize = 2;

/// A message from the server.
#[derive(Debug, PartialEq, Eq)]
enum Said<'a> {
    /// A stream's message, chunk or OpenAI error frame.
    Delivery,
    /// The end of a subscription to this stream.
    Done(&'a str),
    Lagged(&'a str),
    /// `subscribed`, `unsubscribed`.
    Ack,
    /// An op refused: the stream it named, if any.
    Refused(Option<String>, String),
    Unknown,
}

fn said(text: &str) -> Said<'_> {
    const HEAD: &str = "{\"stream\":\"";
    let Some(rest) = text.strip_prefix(HEAD) else {
        if text.starts_with("{\"error\"") {
            let value: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
            let stream = value["stream"].as_str().map(str::to_owned);
            let code = value["error"]["code"].as_str().unwrap_or("?").to_owned();
            return Said::Refused(stream, code);
        }
        return Said::Unknown;
    };
    let Some((stream, rest)) = rest.split_once('"') else { return Said::Unknown };
    let Some(key) = rest.strip_prefix(",\"").and_then(|r| r.split_once('"')).map(|(key, _)| key) else {
        return Said::Unknown;
    };
    match key {
        "seq" | "chunk" | "event" | "message" => Said::Delivery,
        "error" if rest.contains("\"lagged\"") => Said::Lagged(stream),
        "error" => Said::Delivery,
        "done" => Said::Done(stream),
        "subscribed" | "unsubscribed" => Said::Ack,
        _ => Said::Unknown,
    }
}

/// One subscriber, until the soak stops.
pub(crate) async fn subscriber(shared: Arc<Shared>, index: usize, kind: WsKind) {
    let stop = shared.stop.clone();
    loop {
        let go_on = tokio::select! {
            () = stop.cancelled() => return,
            go_on = connection(&shared, index, kind) => go_on,
        };
        if !go_on && !shared.pause(Duration::from_secs(1)).await {
            return;
        }
    }
}

/// One connection's life; false when it failed (the error is counted) or had nothing to subscribe to.
async fn connection(shared: &Arc<Shared>, index: usize, kind: WsKind) -> bool {
    match kind {
        WsKind::Stream { openai } => {
            let Some(id) = shared.board.pick(&[]) else { return false };
            let Some(ws) = open(shared, index, &format!("/v1/streams/{id}/ws{}", query(openai))).await else {
                return false;
            };
            Counters::add(&shared.counters.subscriptions, 1);
            per_stream(shared, ws).await
        }
        WsKind::Multi => match open(shared, index, "/v1/ws").await {
            Some(ws) => multi(shared, ws).await,
            None => false,
        },
        WsKind::Idle => match open(shared, index, "/v1/ws").await {
            Some(mut ws) => {
                let what = match ws.inner.next().await {
                    Some(Ok(message)) => format!("ws idle: received {} bytes", message.len()),
                    Some(Err(e)) => format!("ws idle: {e}"),
                    None => "ws idle: closed".into(),
                };
                shared.error(Failure::Died, what);
                false
            }
            None => false,
        },
        WsKind::Slow { openai } => slow(shared, index, openai).await,
    }
}

fn query(openai: bool) -> &'static str {
    if openai { "?format=openai" } else { "" }
}

/// Connects and upgrades.
async fn open(shared: &Arc<Shared>, index: usize, path: &str) -> Option<Held<WebSocketStream<TcpStream>>> {
    let _permit = shared.handshake().await;
    let tcp = match connect(shared.server, source_ip(index), None).await {
        Ok(tcp) => tcp,
        Err(e) => {
            shared.error(Failure::Other, format!("ws connect: {e}"));
            return None;
        }
    };
    // Small buffers: thousands of these live in the load generator.
    let config = WebSocketConfig::default().read_buffer_size(16 << 10).write_buffer_size(0);
    let url = format!("ws://{}{path}", shared.server);
    let upgrade = tokio_tungstenite::client_async_with_config(url, tcp, Some(config));
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrade).await {
        Ok(Ok((ws, _))) => Some(Held::new(shared, ws)),
        Ok(Err(WsError::Http(response))) => {
            shared.error(Failure::Http, format!("ws upgrade: {}", response.status().as_u16()));
            None
        }
        Ok(Err(e)) => {
            shared.error(Failure::Died, format!("ws upgrade: {e}"));
            None
        }
        Err(_) => {
            shared.error(Failure::Died, "ws upgrade: no answer in 30 s");
            None
        }
    }
}

/// Reads a per-stream connection until the server closes it.
async fn per_stream(shared: &Arc<Shared>, mut ws: Held<WebSocketStream<TcpStream>>) -> bool {
    let counters = &shared.counters;
    let mut ended: Option<bool> = None;
    while let Some(message) = ws.inner.next().await {
        let text = match message {
            Ok(Message::Text(text)) => text,
            Ok(_) => continue,
            Err(e) => {
                if ended.is_none() {
                    shared.error(Failure::Died, format!("ws read: {e}"));
                    return false;
                }
                break;
            }
        };
        Counters::add(&counters.received_bytes, text.len() as u64);
        match said(&text) {
            Said::Delivery => Counters::add(&counters.deliveries, 1),
            Said::Done(_) => ended = Some(false),
            Said::Lagged(_) => ended = Some(true),
            Said::Ack => {}
            Said::Refused(_, code) => shared.error(Failure::Other, format!("ws refused: {code}")),
            Said::Unknown => shared.error(Failure::Other, "ws: a message not understood"),
        }
    }
    match ended {
        Some(lagged) => {
            Counters::add(if lagged { &counters.lagged } else { &counters.completed }, 1);
            true
        }
        None => {
            shared.error(Failure::Died, "ws: closed before done");
            false
        }
    }
}

/// Subscribes `ws` to another open stream than those in `held`, alternating formats.
async fn subscribe(
    shared: &Shared,
    ws: &mut WebSocketStream<TcpStream>,
    held: &mut Vec<Arc<str>>,
    n: &mut u64,
) -> bool {
    let Some(id) = shared.board.pick(held) else { return true };
    *n += 1;
    let format = if n.is_multiple_of(2) { "cui" } else { "openai" };
    let op = format!("{{\"op\":\"subscribe\",\"stream\":\"{id}\",\"format\":\"{format}\"}}");
    match ws.send(Message::text(op)).await {
        Ok(()) => {
            held.push(id);
            Counters::add(&shared.counters.subscriptions, 1);
            true
        }
        Err(e) => {
            shared.error(Failure::Died, format!("ws send: {e}"));
            false
        }
    }
}

/// A `/v1/ws` connection holding [`MULTI`] subscriptions for as long as it lives.
async fn multi(shared: &Arc<Shared>, mut ws: Held<WebSocketStream<TcpStream>>) -> bool {
    let counters = &shared.counters;
    let mut held: Vec<Arc<str>> = Vec::with_capacity(MULTI);
    let mut n = 0;
    let mut top_up = tokio::time::interval(Duration::from_secs(1));
    loop {
        let message = tokio::select! {
            _ = top_up.tick(), if held.len() < MULTI => {
                if !subscribe(shared, &mut ws.inner, &mut held, &mut n).await {
                    return false;
                }
                continue;
            }
            message = ws.inner.next() => message,
        };
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                shared.error(Failure::Died, format!("ws read: {e}"));
                return false;
            }
            None => {
                shared.error(Failure::Died, "ws: /v1/ws closed");
                return false;
            }
        };
        Counters::add(&counters.received_bytes, text.len() as u64);
        let over = match said(&text) {
            Said::Delivery => {
                Counters::add(&counters.deliveries, 1);
                None
            }
            Said::Done(stream) => {
                Counters::add(&counters.completed, 1);
                Some(stream.to_owned())
            }
            Said::Lagged(stream) => {
                Counters::add(&counters.lagged, 1);
                Some(stream.to_owned())
            }
            Said::Ack => None,
            Said::Refused(stream, code) => {
                shared.error(Failure::Other, format!("ws refused: {code}"));
                stream
            }
            Said::Unknown => {
                shared.error(Failure::Other, "ws: a message not understood");
                None
            }
        };
        if let Some(stream) = over {
            held.retain(|id| **id != *stream);
            if !subscribe(shared, &mut ws.inner, &mut held, &mut n).await {
                return false;
            }
        }
    }
}

/// The per-stream endpoint on a raw socket, read slowly.
async fn slow(shared: &Arc<Shared>, index: usize, openai: bool) -> bool {
    let Some(id) = shared.board.pick_slow() else { return false };
    let path = format!("/v1/streams/{id}/ws{}", query(openai));
    let permit = shared.handshake().await;
    let mut tcp = match connect(shared.server, source_ip(index), Some(SLOW_RECEIVE_BUFFER)).await {
        Ok(tcp) => Held::new(shared, tcp),
        Err(e) => {
            shared.error(Failure::Other, format!("ws connect: {e}"));
            return false;
        }
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {WS_KEY}\r\n\r\n"
    );
    let mut head = Vec::with_capacity(4096);
    let answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        tcp.inner.write_all(request.as_bytes()).await?;
        client::read_head(&mut tcp.inner, &mut head).await
    })
    .await;
    drop(permit);
    let start = match answer {
        Ok(Ok((101, _, start))) => start,
        Ok(Ok((status, _, _))) => {
            shared.error(Failure::Http, format!("ws upgrade: {status}"));
            return false;
        }
        Ok(Err(e)) => {
            shared.error(Failure::Died, format!("ws upgrade: {e}"));
            return false;
        }
        Err(_) => {
            shared.error(Failure::Died, "ws upgrade: no answer in 30 s");
            return false;
        }
    };
    let counters = &shared.counters;
    Counters::add(&counters.subscriptions, 1);
    let mut scan = Scan::websocket();
    scan.feed(&head[start..]);
    let over = |scan: &Scan| scan.holds(b",\"done\":true") || scan.lagged();
    match read_slowly(&tcp.inner, &mut scan, counters, over).await {
        Ok(true) => {
            Counters::add(if scan.lagged() { &counters.lagged } else { &counters.completed }, 1);
            // The server closes after its close frame; do not wait long for it.
            let closed = |_: &Scan| false;
            let _ =
                tokio::time::timeout(Duration::from_secs(5), read_body(&tcp.inner, &mut scan, counters, closed)).await;
            true
        }
        Ok(false) => {
            shared.error(Failure::Died, "ws slow: closed before done");
            false
        }
        Err(e) => {
            shared.error(Failure::Died, format!("ws slow read: {e}"));
            false
        }
    }
}
