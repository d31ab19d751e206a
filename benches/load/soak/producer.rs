//! The soak's producers: streams that start, take appends and end the whole time, and the quiet streams
//! idle subscribers hold.
//!
//! Each of `slots` producers (one keep-alive connection each, spread over the source addresses) creates a
//! stream, puts it on the board, appends a batch of 1 to 8 text deltas every 250–750 ms for a lifetime of
//! `lifetime` seconds, takes it off the board and ends it: mostly `completed`, one in ten with an `error`
//! outcome and one in ten through `cancel`, so every way a subscription ends is seen. `bulk_slots` more
//! do the same with deltas of `bulk_bytes` each (megabytes a stream), for slow readers only. A slot's first
//! lifetime is drawn from zero so the endings are spread from the start. Quiet streams take one message a
//! minute: their subscribers see mostly keep-alive pings, and no idle-stream timeout under ten minutes
//! ends them.
//!
//! A call that fails counts an error: a status other than the one expected (`http`), a connection that
//! broke or a call that took over 30 s (`died`; the connection is opened again).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{Conn, source_ip};
use crate::scenarios::FILLER;

use super::shared::{Counters, Failure, Shared};

/// How the streams come and go.
#[derive(Debug, Clone)]
pub(crate) struct Production {
    /// Streams open at once, one producer each.
    pub(crate) slots: usize,
    /// Bulk streams open at once (on top), whose deltas carry `bulk_bytes` of text each: only slow readers
    /// read them.
    pub(crate) bulk_slots: usize,
    pub(crate) bulk_bytes: usize,
    /// A stream's life, in seconds.
    pub(crate) lifetime: Range<f64>,
    /// Between two appends to a stream, in milliseconds.
    pub(crate) interval_ms: Range<u64>,
    /// Streams the idle subscribers hold; they never end during the soak.
    pub(crate) quiet: usize,
    /// Between two appends to a quiet stream.
    pub(crate) quiet_every: Duration,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Deltas to a message before the next message starts.
const DELTAS_PER_MESSAGE: u64 = 24;

/// A producer's connection: opened again after a failure.
struct Producer {
    shared: Arc<Shared>,
    source: usize,
    conn: Option<Conn>,
}

impl Producer {
    fn new(shared: &Arc<Shared>, source: usize) -> Producer {
        Producer { shared: Arc::clone(shared), source, conn: None }
    }

    /// One call; the body when the status is `expected`, after counting the error otherwise. `what` names
    /// the call in error notes.
    async fn call(&mut self, what: &str, path: &str, body: &[u8], ndjson: bool, expected: u16) -> Option<Vec<u8>> {
        let conn = match self.conn.as_mut() {
            Some(conn) => conn,
            None => match Conn::open(self.shared.server, source_ip(self.source)).await {
                Ok(conn) => self.conn.insert(conn),
                Err(e) => {
                    self.shared.error(Failure::Other, format!("producer connect: {e}"));
                    return None;
                }
            },
        };
        let content_type = match (body.is_empty(), ndjson) {
            (true, _) => None,
            (false, true) => Some("application/x-ndjson"),
            (false, false) => Some("application/json"),
        };
        match tokio::time::timeout(CALL_TIMEOUT, conn.request("POST", path, content_type, body)).await {
            Ok(Ok((status, reply))) if status == expected => Some(reply),
            Ok(Ok((status, reply))) => {
                let code = serde_json::from_slice::<serde_json::Value>(&reply)
                    .ok()
                    .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                self.shared.error(Failure::Http, format!("{what}: {status} {code}"));
                None
            }
            Ok(Err(e)) => {
                self.conn = None;
                self.shared.error(Failure::Died, format!("{what}: {e}"));
                None
            }
            Err(_) => {
                self.conn = None;
                self.shared.error(Failure::Died, format!("{what}: no answer in {}s", CALL_TIMEOUT.as_secs()));
                None
            }
        }
    }

    async fn create(&mut self) -> Option<Arc<str>> {
        let reply = self.call("create", "/v1/streams", b"", false, 201).await?;
        let value: serde_json::Value = serde_json::from_slice(&reply).unwrap_or_default();
        match value["id"].as_str() {
            Some(id) => {
                Counters::add(&self.shared.counters.streams_created, 1);
                Some(id.into())
            }
            None => {
                self.shared.error(Failure::Other, "create: no id in the answer");
                None
            }
        }
    }
}

/// `count` text deltas of `text`, the first numbered `next`, as NDJSON.
fn deltas(next: u64, count: u64, text: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(count as usize * (text.len() + 70));
    for n in next..next + count {
        let message = n / DELTAS_PER_MESSAGE;
        body.extend_from_slice(
            format!(
                "{{\"type\":\"text\",\"props\":{{\"content\":\"{n} {text} \"}},\"message_id\":\"m{message}\",\
                 \"delta\":true}}\n"
            )
            .as_bytes(),
        );
    }
    body
}

/// One slot: streams one after another until the soak stops.
async fn slot(shared: Arc<Shared>, plan: Production, index: usize, bulk: bool) {
    let mut producer = Producer::new(&shared, index);
    let text: String = if bulk { FILLER.chars().cycle().take(plan.bulk_bytes).collect() } else { FILLER.into() };
    let mut first = true;
    while !shared.stop.is_cancelled() {
        let Some(id) = producer.create().await else {
            if !shared.pause(Duration::from_secs(1)).await {
                return;
            }
            continue;
        };
        shared.board.add(Arc::clone(&id), bulk);
        let lifetime = if first { 0.0..plan.lifetime.end } else { plan.lifetime.clone() };
        first = false;
        let until = tokio::time::Instant::now() + Duration::from_secs_f64(rand::random_range(lifetime));
        let path = format!("/v1/streams/{id}/messages");
        let mut next = 0;
        loop {
            let wait = Duration::from_millis(rand::random_range(plan.interval_ms.clone()));
            if !shared.pause(wait).await {
                return;
            }
            if tokio::time::Instant::now() >= until {
                break;
            }
            let count = rand::random_range(1..=8);
            if producer.call("append", &path, &deltas(next, count, &text), true, 200).await.is_some() {
                Counters::add(&shared.counters.appends, 1);
                Counters::add(&shared.counters.messages_appended, count);
            }
            next += count;
        }
        shared.board.remove(&id, bulk);
        let ended = match rand::random_range(0..10) {
            0 => producer.call("cancel", &format!("/v1/streams/{id}/cancel"), b"", false, 202).await,
            1 => {
                let outcome = br#"{"status":"error","error":{"message":"soak: a deliberate error","code":"soak"}}"#;
                producer.call("end", &format!("/v1/streams/{id}/end"), outcome, false, 200).await
            }
            _ => producer.call("end", &format!("/v1/streams/{id}/end"), b"", false, 200).await,
        };
        if ended.is_some() {
            Counters::add(&shared.counters.streams_ended, 1);
        }
    }
}

/// Creates the quiet streams and puts them on the board.
pub(crate) async fn quiet_streams(shared: &Arc<Shared>, count: usize) -> Option<Vec<Arc<str>>> {
    let mut producer = Producer::new(shared, 0);
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(producer.create().await?);
    }
    shared.board.set_quiet(ids.clone());
    Some(ids)
}

/// One message to each quiet stream every `every`, over a new connection each time: the server closes one
/// that sends no request for 30 s.
async fn keep_quiet_streams_alive(shared: Arc<Shared>, ids: Vec<Arc<str>>, every: Duration) {
    let mut producer = Producer::new(&shared, 1);
    let mut n = 0;
    while shared.pause(every).await {
        producer.conn = None;
        for id in &ids {
            let body = format!("{{\"type\":\"text\",\"props\":{{\"content\":\"quiet {n}\"}}}}");
            if producer
                .call("append", &format!("/v1/streams/{id}/messages"), body.as_bytes(), false, 200)
                .await
                .is_some()
            {
                Counters::add(&shared.counters.appends, 1);
                Counters::add(&shared.counters.messages_appended, 1);
            }
        }
        n += 1;
    }
}

/// Every producer, until the soak stops.
pub(crate) async fn run(shared: Arc<Shared>, plan: Production, quiet: Vec<Arc<str>>) {
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(keep_quiet_streams_alive(Arc::clone(&shared), quiet, plan.quiet_every));
    for index in 0..plan.slots + plan.bulk_slots {
        tasks.spawn(slot(Arc::clone(&shared), plan.clone(), index, index >= plan.slots));
    }
    while tasks.join_next().await.is_some() {}
}
