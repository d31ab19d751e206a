//! The soak's SSE subscribers: readers that take everything, slow readers, and idle subscribers of the
//! quiet streams.
//!
//! A subscriber keeps its connection alive between subscriptions: when a body ends (the stream ended, or
//! a `lagged` notice), it sends the next `GET /v1/streams/{id}/events` on the same connection, to another
//! open stream picked from the board, from the start; one time in four it closes the connection and
//! opens a new one first, so TCP connections churn too.
//!
//! A slow reader's socket has a 4 KiB receive buffer and it reads slowly for a while (`scan.rs`), then
//! takes the rest at full speed; one in ten reads a bulk stream, whose megabytes the kernel's buffers
//! cannot all take: the server's cursor stays behind, and when that stream ends and is evicted meanwhile,
//! the reader gets `lagged`. It opens a new connection for each subscription: the server wrote the end of
//! its last body long before the reader got there (the kernel holds megabytes for a connection), and
//! closes a connection that sends no request head for 30 s after a response, as it should.
//!
//! An idle subscriber holds one quiet stream for the whole soak and reads its keep-alive pings.
//!
//! Errors: an answer other than `200`, a connection that closes or fails before its body ended, no
//! response head within 30 s, and a quiet stream that ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::client::{self, source_ip};

use super::scan::{SLOW_RECEIVE_BUFFER, Scan, read_body, read_slowly};
use super::shared::{Counters, Failure, Held, Shared, connect};

/// What an SSE subscriber does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SseKind {
    /// Reads everything, then subscribes to another stream.
    Reader { openai: bool },
    /// Reads a few bytes a second for a while, then the rest.
    Slow { openai: bool },
    /// Holds a quiet stream.
    Idle,
}

const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How a subscription ended.
enum Ended {
    /// Its body ended: the connection may carry the next one.
    Body { lagged: bool },
    /// Nothing to subscribe to yet.
    Waited,
    /// The connection is lost (the error is counted).
    Lost,
}

/// One subscriber, until the soak stops.
pub(crate) async fn subscriber(shared: Arc<Shared>, index: usize, kind: SseKind) {
    let mut conn: Option<Held<TcpStream>> = None;
    let stop = shared.stop.clone();
    loop {
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            ended = subscription(&shared, index, kind, &mut conn) => ended,
        };
        let counters = &shared.counters;
        match ended {
            Ended::Body { lagged } => {
                Counters::add(if lagged { &counters.lagged } else { &counters.completed }, 1);
                if let SseKind::Idle = kind {
                    shared.error(Failure::Other, "sse: a quiet stream ended");
                    if !shared.pause(Duration::from_secs(5)).await {
                        return;
                    }
                } else if matches!(kind, SseKind::Slow { .. }) || rand::random_range(0..4) == 0 {
                    conn = None;
                }
            }
            Ended::Waited => {}
            Ended::Lost => {
                conn = None;
                if !shared.pause(Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    }
}

async fn subscription(shared: &Arc<Shared>, index: usize, kind: SseKind, conn: &mut Option<Held<TcpStream>>) -> Ended {
    let (id, openai, receive_buffer) = match kind {
        SseKind::Reader { openai } => (shared.board.pick(&[]), openai, None),
        SseKind::Slow { openai } => (shared.board.pick_slow(), openai, Some(SLOW_RECEIVE_BUFFER)),
        SseKind::Idle => (shared.board.quiet(index), false, None),
    };
    let Some(id) = id else {
        shared.pause(Duration::from_millis(100)).await;
        return Ended::Waited;
    };
    let path = format!("/v1/streams/{id}/events{}", if openai { "?format=openai" } else { "" });
    let permit = shared.handshake().await;
    if conn.is_none() {
        match connect(shared.server, source_ip(index), receive_buffer).await {
            Ok(stream) => *conn = Some(Held::new(shared, stream)),
            Err(e) => {
                shared.error(Failure::Other, format!("sse connect: {e}"));
                return Ended::Lost;
            }
        }
    }
    let Some(Held { inner: stream, .. }) = conn.as_mut() else { return Ended::Lost };
    let mut head = Vec::with_capacity(4096);
    let answer = tokio::time::timeout(HEAD_TIMEOUT, async {
        stream.write_all(&client::request_head("GET", &path, None, 0, false)).await?;
        client::read_head(stream, &mut head).await
    })
    .await;
    drop(permit);
    let start = match answer {
        Ok(Ok((200, _, start))) => start,
        Ok(Ok((status, _, _))) => {
            shared.error(Failure::Http, format!("sse subscribe: {status}"));
            return Ended::Lost;
        }
        Ok(Err(e)) => {
            shared.error(Failure::Died, format!("sse subscribe: {e}"));
            return Ended::Lost;
        }
        Err(_) => {
            shared.error(Failure::Died, "sse subscribe: no response head in 30 s");
            return Ended::Lost;
        }
    };
    let counters = &shared.counters;
    Counters::add(&counters.subscriptions, 1);
    let mut scan = Scan::sse();
    let (events, pings) = scan.feed(&head[start..]);
    Counters::add(&counters.deliveries, events);
    Counters::add(&counters.pings, pings);
    let read = match kind {
        SseKind::Slow { .. } => read_slowly(stream, &mut scan, counters, Scan::over).await,
        _ => read_body(stream, &mut scan, counters, Scan::over).await,
    };
    match read {
        Ok(true) => Ended::Body { lagged: scan.lagged() },
        Ok(false) => {
            shared.error(Failure::Died, "sse: closed before the end of the body");
            Ended::Lost
        }
        Err(e) => {
            shared.error(Failure::Died, format!("sse read: {e}"));
            Ended::Lost
        }
    }
}
