//! Several agentmux processes serving the same streams through a real `redis-server` (`--engine redis`),
//! all on loopback ports.

mod common;

use common::http::{Sse, get_json, parse_sse, post_empty, read_body, read_events};
use common::process::ServerProcess;
use common::redis::RedisServer;
use common::wait::eventually;
use serde_json::{Value, json};

fn node(redis: &RedisServer) -> ServerProcess {
    ServerProcess::spawn(&["--engine", "redis", "--redis-url", &redis.url()])
}

/// `count` text deltas of one message as NDJSON, numbered from `from`.
fn deltas(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|i| {
            json!({ "type": "text", "message_id": "m1", "delta": true, "props": { "content": format!("t{i} ") } })
                .to_string()
                + "\n"
        })
        .collect()
}

/// A new stream, created on `node`: its id.
async fn create(client: &reqwest::Client, node: &ServerProcess) -> String {
    let (status, created) = post_empty(client, &node.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().expect("an id").to_owned()
}

async fn append(client: &reqwest::Client, node: &ServerProcess, id: &str, body: String) -> Value {
    let response = client
        .post(node.url(&format!("/v1/streams/{id}/messages")))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .expect("append");
    let status = response.status().as_u16();
    let reply: Value = response.json().await.expect("the append's answer is JSON");
    assert_eq!(status, 200, "{reply}");
    reply
}

async fn events(client: &reqwest::Client, node: &ServerProcess, id: &str, query: &str) -> reqwest::Response {
    let response = client.get(node.url(&format!("/v1/streams/{id}/events{query}"))).send().await.expect("subscribe");
    assert_eq!(response.status(), 200, "subscribe on {} with {query:?}", node.base);
    response
}

fn data(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.data.as_str()).collect()
}

/// The content of the text messages among `events`, in order.
fn texts(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .map(Sse::json)
        .filter(|m| m["type"] == "text")
        .filter_map(|m| m["props"]["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_written_on_one_node_is_read_on_the_others_in_their_own_formats() {
    let redis = RedisServer::start();
    let (a, b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;

    // Subscribed on B (the typed messages) and C (OpenAI chunks) before anything is written.
    let on_b = events(&client, &b, &id, "").await;
    let on_c = events(&client, &c, &id, "?format=openai").await;
    let reading_b = tokio::spawn(read_events(on_b));
    let reading_c = tokio::spawn(read_body(on_c));
    for batch in 0..10 {
        append(&client, &a, &id, deltas(batch * 5, 5)).await;
    }
    let (status, ended) = post_empty(&client, &a.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");
    let on_b = reading_b.await.expect("B's reader");
    let on_c = reading_c.await.expect("C's reader");

    // What A itself serves, read whole after the end, is what B and C served live.
    let whole_cui = read_events(events(&client, &a, &id, "").await).await;
    let whole_openai = read_body(events(&client, &a, &id, "?format=openai").await).await;
    assert_eq!(data(&on_b), data(&whole_cui), "B's typed messages are A's");
    assert_eq!(on_b.iter().map(|e| e.id).collect::<Vec<_>>(), whole_cui.iter().map(|e| e.id).collect::<Vec<_>>());
    assert_eq!(String::from_utf8_lossy(&on_c), String::from_utf8_lossy(&whole_openai), "C's chunks are A's");
    let text: String = parse_sse(&on_c)
        .0
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| e.json()["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, (0..50).map(|i| format!("t{i} ")).collect::<String>());
    assert!(on_c.ends_with(b"data: [DONE]\n\n"));

    // A late joiner on C, and a reader resuming on B from the middle, get the same history.
    let late = read_events(events(&client, &c, &id, "").await).await;
    assert_eq!(data(&late), data(&whole_cui));
    let middle = whole_cui[20].id.expect("an id");
    let resumed = client
        .get(b.url(&format!("/v1/streams/{id}/events")))
        .header("last-event-id", middle.to_string())
        .send()
        .await
        .expect("resume");
    let resumed = read_events(resumed).await;
    assert_eq!(data(&resumed), data(&whole_cui[21..]), "resumed after {middle}");

    // Every node answers the snapshot alike.
    let mut snapshots = Vec::new();
    for node in [&a, &b, &c] {
        let response = client.get(node.url(&format!("/v1/streams/{id}"))).send().await.expect("snapshot");
        assert_eq!(response.status(), 200);
        snapshots.push(response.json::<Value>().await.expect("JSON"));
    }
    assert_eq!(snapshots[0]["status"], "completed", "{}", snapshots[0]);
    assert_eq!(snapshots[1], snapshots[0]);
    assert_eq!(snapshots[2], snapshots[0]);

    // A stream no node made is unknown everywhere.
    let unknown = client.get(b.url("/v1/streams/s_nothing/events")).send().await.expect("unknown");
    assert_eq!(unknown.status(), 404);
}

/// `count` whole text messages of producer `who`, numbered from `from`, as NDJSON.
fn messages(who: &str, from: usize, count: usize) -> String {
    (from..from + count)
        .map(|i| {
            json!({ "type": "text", "message_id": format!("{who}-{i}"), "props": { "content": format!("{who} {i}") } })
                .to_string()
                + "\n"
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_on_two_nodes_write_one_order_that_every_node_serves() {
    let redis = RedisServer::start();
    let (a, b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    let mut readers = Vec::new();
    for node in [&a, &b, &c] {
        readers.push(tokio::spawn(read_events(events(&client, node, &id, "").await)));
    }

    // One producer writes through A (the writer), the other through B (which sends its writes on to A).
    let produce = |node: &ServerProcess, who: &'static str| {
        let (client, node_url, id) = (client.clone(), node.base.clone(), id.clone());
        async move {
            let mut sequences = Vec::new();
            for batch in 0..20 {
                let response = client
                    .post(format!("{node_url}/v1/streams/{id}/messages"))
                    .header("content-type", "application/x-ndjson")
                    .body(messages(who, batch * 3, 3))
                    .send()
                    .await
                    .expect("append");
                assert_eq!(response.status(), 200, "{who}'s append through {node_url}");
                let reply: Value = response.json().await.expect("JSON");
                sequences.extend(reply["sequences"].as_array().expect("sequences").iter().filter_map(Value::as_u64));
            }
            sequences
        }
    };
    let (first, second) = tokio::join!(produce(&a, "p1"), produce(&b, "p2"));
    // Ended through C, which also sends it on to A.
    let (status, ended) = post_empty(&client, &c.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");
    let last = ended["last_sequence"].as_u64().expect("last_sequence");

    let mut all: Vec<u64> = first.iter().chain(&second).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), first.len() + second.len(), "no sequence given twice");
    let mut served = Vec::new();
    for reader in readers {
        served.push(reader.await.expect("a reader"));
    }
    for events in &served {
        let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
        assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every sequence once, in order, without a gap");
        assert_eq!(data(events), data(&served[0]), "every node serves the same log");
    }
    // Each producer's messages are there once each, in the order it sent them.
    for (who, sequences) in [("p1", &first), ("p2", &second)] {
        let texts: Vec<String> = served[0]
            .iter()
            .map(Sse::json)
            .filter(|m| m["type"] == "text" && m["message_id"].as_str().is_some_and(|id| id.starts_with(who)))
            .filter_map(|m| m["props"]["content"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(texts, (0..60).map(|i| format!("{who} {i}")).collect::<Vec<_>>());
        assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{who}'s sequences rise");
    }
}

/// Reads `response` (an SSE body) until `until` says an event is the last one wanted, or the body ends or
/// breaks; the events read.
async fn read_until(response: reqwest::Response, until: impl Fn(&Sse) -> bool) -> Vec<Sse> {
    use futures::StreamExt;
    let mut body = response.bytes_stream();
    let mut bytes = Vec::new();
    loop {
        let next = tokio::time::timeout(common::http::PATIENCE, body.next()).await.expect("an event in time");
        match next {
            Some(Ok(chunk)) => bytes.extend_from_slice(&chunk),
            Some(Err(_)) | None => return parse_sse(&bytes).0,
        }
        let (events, _) = parse_sse(&bytes);
        if events.iter().any(&until) {
            return events;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_a_node_killed_mid_stream_resume_on_another_without_gap_or_duplicate() {
    let redis = RedisServer::start();
    let (a, mut b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    for batch in 0..5 {
        append(&client, &a, &id, messages("p", batch * 4, 4)).await;
    }
    // Two readers on B, part-way through: one resumes by `Last-Event-ID`, the other by `from`.
    let first = events(&client, &b, &id, "").await;
    let first_part = read_until(first, |e| e.id == Some(20)).await;
    let second = events(&client, &b, &id, "").await;
    let second_part = read_until(second, |e| e.data.contains("p 9")).await;

    b.kill();
    // The producer goes on through A meanwhile.
    for batch in 5..10 {
        append(&client, &a, &id, messages("p", batch * 4, 4)).await;
    }
    let first_seen = first_part.iter().filter_map(|e| e.id).max().expect("ids");
    let resumed = client
        .get(c.url(&format!("/v1/streams/{id}/events")))
        .header("last-event-id", first_seen.to_string())
        .send()
        .await
        .expect("resume on C");
    assert_eq!(resumed.status(), 200);
    let reading_first = tokio::spawn(read_events(resumed));
    let second_seen = second_part.iter().filter_map(|e| e.id).max().expect("ids");
    let reading_second = tokio::spawn(read_events(events(&client, &c, &id, &format!("?from={second_seen}")).await));
    let (status, ended) = post_empty(&client, &c.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");

    let whole = read_events(events(&client, &a, &id, "").await).await;
    for (part, reading) in [(first_part, reading_first), (second_part, reading_second)] {
        let rest = reading.await.expect("a resumed reader");
        let ids: Vec<u64> = part.iter().chain(&rest).filter_map(|e| e.id).collect();
        assert_eq!(ids, whole.iter().filter_map(|e| e.id).collect::<Vec<_>>(), "no gap, no duplicate");
        let joined: Vec<&str> = data(&part).into_iter().chain(data(&rest)).collect();
        assert_eq!(joined, data(&whole));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_loses_nothing_acknowledged() {
    let mut redis = RedisServer::start();
    let a = node(&redis);
    // Pings every two seconds keep B's reader's body moving through the outage.
    let b = ServerProcess::spawn(&["--engine", "redis", "--redis-url", &redis.url(), "--keep-alive", "2s"]);
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    let mut acknowledged = Vec::new();
    for batch in 0..5 {
        acknowledged.extend(common::http::sequences(&append(&client, &a, &id, messages("p", batch * 4, 4)).await));
    }
    // Redis is killed and started again from its append-only file while the producer keeps writing: the
    // appends meanwhile wait for it, and are acknowledged once it has them.
    redis.stop();
    let writing = {
        let (client, a_url, id) = (client.clone(), a.base.clone(), id.clone());
        tokio::spawn(async move {
            let mut sequences = Vec::new();
            for batch in 5..10 {
                let response = client
                    .post(format!("{a_url}/v1/streams/{id}/messages"))
                    .header("content-type", "application/x-ndjson")
                    .body(messages("p", batch * 4, 4))
                    .send()
                    .await
                    .expect("append");
                assert_eq!(response.status(), 200, "an append while Redis restarts");
                let reply: Value = response.json().await.expect("JSON");
                sequences.extend(common::http::sequences(&reply));
            }
            sequences
        })
    };
    // Redis stays away a moment while the producer writes: the scenario, not synchronisation.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    redis.restart();
    acknowledged.extend(writing.await.expect("the producer"));
    let (status, ended) = post_empty(&client, &a.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");

    // B, which never held the stream, reads it from the restarted Redis: every acknowledged message is there.
    let read = read_events(events(&client, &b, &id, "").await).await;
    let ids: Vec<u64> = read.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ended["last_sequence"].as_u64().expect("last")).collect::<Vec<_>>());
    for sequence in &acknowledged {
        assert!(ids.contains(sequence), "acknowledged {sequence} is kept");
    }
    assert_eq!(texts(&read), (0..40).map(|i| format!("p {i}")).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_idle_through_a_redis_restart_answers_the_first_request_after_it() {
    let mut redis = RedisServer::start();
    let (a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    append(&client, &a, &id, messages("p", 0, 4)).await;
    let (status, ended) = post_empty(&client, &a.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");
    redis.stop();
    // Longer than a lease renewal: B's connection found Redis away, and makes a new one only when next used.
    // How long Redis is away is the scenario: a sleep.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    redis.start_again();
    // B's first request after Redis came back is served, not refused with a 503.
    let read = read_events(events(&client, &b, &id, "").await).await;
    assert_eq!(texts(&read), (0..4).map(|i| format!("p {i}")).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_writer_dies_ends_interrupted_on_every_other_node() {
    let redis = RedisServer::start();
    let (mut a, b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    append(&client, &a, &id, messages("p", 0, 4)).await;
    // A message in deltas left open: the end closes it.
    append(&client, &a, &id, deltas(0, 2)).await;
    let reading = tokio::spawn(read_events(events(&client, &b, &id, "").await));
    // B follows the stream (from its reader's request on).
    until_held(&client, &b, "open", 1).await;

    let killed = std::time::Instant::now();
    a.kill();
    // B learns it from A's lease, which lapses within seconds, and ends the stream after what Redis holds.
    let read = reading.await.expect("B's reader");
    let took = killed.elapsed();
    let last = read.last().expect("events").json();
    assert_eq!(last["props"]["event"], "stream_end", "{last}");
    assert_eq!(last["props"]["data"]["status"], "error", "{last}");
    assert_eq!(last["props"]["data"]["error"]["code"], "interrupted", "{last}");
    assert!(took < std::time::Duration::from_secs(9), "ended {took:?} after the writer died");
    let ids: Vec<u64> = read.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "no gap");
    assert!(read.iter().filter(|e| e.data.contains("\"p 3\"")).count() == 1, "everything acknowledged is there");
    let closing = read[read.len() - 2].json();
    assert_eq!(closing["props"]["event"], "message_end", "{closing}");
    assert_eq!(closing["props"]["data"]["message_id"], "m1", "{closing}");
    assert_eq!(closing["props"]["data"]["chunk_count"], 2, "{closing}");

    // C agrees, and a write through C is refused: the stream has ended.
    let response = client.get(c.url(&format!("/v1/streams/{id}"))).send().await.expect("snapshot");
    let snapshot: Value = response.json().await.expect("JSON");
    assert_eq!(snapshot["status"], "error", "{snapshot}");
    let refused = client
        .post(c.url(&format!("/v1/streams/{id}/messages")))
        .header("content-type", "application/x-ndjson")
        .body(messages("p", 4, 1))
        .send()
        .await
        .expect("append");
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "stream_ended", "{body}");
}

/// The streams of this status `node` holds, from its `/metrics`.
async fn streams_held(client: &reqwest::Client, node: &ServerProcess, status: &str) -> u64 {
    let text = client.get(node.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let prefix = format!("agentmux_streams{{status=\"{status}\"}} ");
    let line = text.lines().find(|l| l.starts_with(&prefix)).expect("the streams of a status");
    line[prefix.len()..].parse().expect("a count")
}

/// Waits until `node` holds `count` streams of this status.
async fn until_held(client: &reqwest::Client, node: &ServerProcess, status: &str, count: u64) {
    let what = format!("{} to hold {count} {status}", node.base);
    let held = async || streams_held(client, node, status).await == count;
    eventually(&what, std::time::Duration::from_secs(20), held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lets_go_of_a_stream_its_clients_no_longer_use_and_follows_it_again_when_asked() {
    let redis = RedisServer::start();
    let a = node(&redis);
    let b = ServerProcess::spawn(&["--engine", "redis", "--redis-url", &redis.url(), "--drop-followed-after", "1s"]);
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    append(&client, &a, &id, messages("p", 0, 3)).await;

    // A snapshot on B follows the stream; with no client left, B lets it go after a second.
    let snapshot: Value =
        client.get(b.url(&format!("/v1/streams/{id}"))).send().await.expect("get").json().await.expect("JSON");
    assert_eq!(snapshot["status"], "open", "{snapshot}");
    assert_eq!(streams_held(&client, &b, "open").await, 1);
    until_held(&client, &b, "open", 0).await;

    // Asked again, B follows it again: the whole history, then what A appends.
    let reading = events(&client, &b, &id, "").await;
    until_held(&client, &b, "open", 1).await;
    // A subscriber holds it past the grace (nothing must happen for this long: a sleep).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(streams_held(&client, &b, "open").await, 1, "a stream a subscriber reads is kept");
    append(&client, &a, &id, messages("p", 3, 2)).await;
    let (status, _) = post_empty(&client, &a.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200);
    let read = read_events(reading).await;
    let ids: Vec<u64> = read.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "no gap, no duplicate");
    for i in 0..5 {
        assert_eq!(read.iter().filter(|e| e.data.contains(&format!("\"p {i}\""))).count(), 1, "p {i} once");
    }
    assert_eq!(read.last().expect("events").json()["props"]["event"], "stream_end");
    // Ended and unused, it is let go too.
    assert_eq!(streams_held(&client, &b, "open").await, 0);
    until_held(&client, &b, "completed", 0).await;
}

/// A WebSocket on `node`'s `/v1/ws` with `key`.
async fn ws_with_key(
    node: &ServerProcess,
    key: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{}/v1/ws", node.addr).into_client_request().expect("a request");
    request.headers_mut().insert("authorization", format!("Bearer {key}").parse().expect("a header"));
    tokio_tungstenite::connect_async(request).await.expect("WebSocket").0
}

/// The next JSON text frame (pings skipped).
async fn ws_reply(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) -> Value {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next()).await.expect("a frame in time");
        match frame.expect("open").expect("a frame") {
            Message::Text(text) => return serde_json::from_str(text.as_str()).expect("JSON"),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_publish_and_cancel_on_another_node_reach_the_streams_writer() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let redis = RedisServer::start();
    let keyed = ["--engine", "redis", "--redis-url", &redis.url(), "--api-key", "sk-ws"];
    let (a, b) = (ServerProcess::spawn(&keyed), ServerProcess::spawn(&keyed));
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", "Bearer sk-ws".parse().expect("a header"));
    let client = reqwest::Client::builder().default_headers(headers).build().expect("a client");
    let id = create(&client, &a).await;
    append(&client, &a, &id, messages("p", 0, 1)).await;

    let mut ws = ws_with_key(&b, "sk-ws").await;
    let op = |value: Value| Message::text(value.to_string());
    ws.send(op(
        json!({ "op": "publish", "stream": id, "message": { "type": "text", "props": { "content": "from B" } } }),
    ))
    .await
    .expect("send");
    let published = ws_reply(&mut ws).await;
    assert_eq!(published["stream"], id.as_str(), "{published}");
    let sequence = published["published"].as_u64().expect("a sequence");
    // A message of the wrong shape is refused here, naming the field, as on the writer.
    ws.send(op(json!({ "op": "publish", "stream": id, "message": { "type": "text", "props": { "content": 7 } } })))
        .await
        .expect("send");
    let refused = ws_reply(&mut ws).await;
    assert!(refused["error"]["param"].as_str().is_some_and(|p| p.starts_with("message")), "{refused}");

    // The writer has the message at that sequence.
    let snapshot: Value =
        client.get(a.url(&format!("/v1/streams/{id}"))).send().await.expect("get").json().await.expect("JSON");
    let texts: Vec<&str> = snapshot["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["props"]["content"].as_str())
        .collect();
    assert!(texts.contains(&"from B"), "{snapshot}");
    assert!(snapshot["last_sequence"].as_u64().is_none_or(|last| last >= sequence), "{snapshot}");

    ws.send(op(json!({ "op": "cancel", "stream": id }))).await.expect("send");
    let cancelled = ws_reply(&mut ws).await;
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    // Accepted (202 on HTTP): the end is the writer's to write, and comes at once.
    let cancelled = async || {
        let snapshot: Value =
            client.get(a.url(&format!("/v1/streams/{id}"))).send().await.expect("get").json().await.expect("JSON");
        snapshot["status"] == "cancelled"
    };
    eventually("the writer to end the stream cancelled", std::time::Duration::from_secs(10), cancelled).await;
    // Once ended, a publish through B is refused as the writer refuses it.
    let late = json!({ "op": "publish", "stream": id, "message": { "type": "text", "props": { "content": "late" } } });
    let refused = async || {
        ws.send(op(late.clone())).await.expect("send");
        ws_reply(&mut ws).await["error"]["code"] == "stream_ended"
    };
    eventually("a late publish to be refused", std::time::Duration::from_secs(10), refused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_longer_than_a_lease_ends_no_live_stream() {
    let mut redis = RedisServer::start();
    let a = node(&redis);
    // Pings every two seconds keep B's reader's body moving through the outage.
    let b = ServerProcess::spawn(&["--engine", "redis", "--redis-url", &redis.url(), "--keep-alive", "2s"]);
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    append(&client, &a, &id, messages("p", 0, 2)).await;
    let reading = {
        let (client, b, id) = (client.clone(), b.base.clone(), id.clone());
        tokio::spawn(async move { read_resuming(&client, &b, &id, std::time::Duration::from_secs(60)).await })
    };
    // B follows the stream (from its reader's request on).
    until_held(&client, &b, "open", 1).await;

    // Every lease lapses while Redis is away for eight seconds.
    redis.stop();
    let stopped = std::time::Instant::now();
    let unready =
        async || Some(client.get(a.url("/readyz")).send().await.expect("readyz")).filter(|r| r.status() == 503);
    let ready =
        eventually("a node that cannot reach Redis to say it is not ready", std::time::Duration::from_secs(6), unready)
            .await;
    let body: Value = ready.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "cluster_unavailable", "{body}");
    // Redis away for eight seconds is the scenario: a sleep.
    tokio::time::sleep(std::time::Duration::from_secs(8).saturating_sub(stopped.elapsed())).await;
    // Redis comes back while A is paused for three seconds (as a busy machine may pause a process): B
    // reaches Redis before A renews its lease.
    a.signal("-STOP");
    redis.start_again();
    // The pause is the scenario: a sleep.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    a.signal("-CONT");

    // Long enough for B to have judged A's lease had it not waited for A to renew it (nothing must happen for
    // this long: a sleep).
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let ready = client.get(a.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200, "ready again once Redis is back");
    append(&client, &a, &id, messages("p", 2, 1)).await;
    let (status, ended) = post_empty(&client, &a.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");
    // B's reader was told `lagged` while B could not reach Redis, and resumed where it was once it could.
    let (read, lagged) = reading.await.expect("B's reader");
    assert!(lagged > 0, "B's reader was told it lagged");
    let last = read.last().expect("events").json();
    assert_eq!(last["props"]["event"], "stream_end", "{last}");
    assert_eq!(last["props"]["data"]["status"], "completed", "the writer lived: {last}");
    let ids: Vec<u64> = read.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "no gap, no duplicate");
    assert_eq!(read.iter().filter(|e| e.data.contains("\"p 2\"")).count(), 1);
}

/// True for a `lagged` notice.
fn is_lagged(event: &Sse) -> bool {
    event.id.is_none() && event.data.contains("\"lagged\"")
}

fn is_end(event: &Sse) -> bool {
    event.data.contains("\"stream_end\"")
}

/// Reads stream `id` on the node at `base` from its start to its `stream_end`, as a client that resumes
/// does: once a body ends (after a `lagged` notice, which ends it) or breaks, or after a 503, it asks again a
/// moment later, with `Last-Event-ID`.
/// The events (without the notices) and how many `lagged` notices came; fails past `within`.
async fn read_resuming(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    within: std::time::Duration,
) -> (Vec<Sse>, usize) {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + within;
    let (mut events, mut lagged) = (Vec::<Sse>::new(), 0);
    loop {
        let read = data(&events).join("\n");
        assert!(tokio::time::Instant::now() < deadline, "{base}: no end within {within:?} ({lagged} lagged): {read}");
        let mut request = client.get(format!("{base}/v1/streams/{id}/events"));
        if let Some(last) = events.iter().filter_map(|e| e.id).next_back() {
            request = request.header("last-event-id", last.to_string());
        }
        let response = match request.send().await {
            Ok(response) if response.status() == 200 => response,
            Ok(response) => {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                assert_eq!(status, 503, "{base}: {body}");
                // The client's pause before it asks again.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => continue,
        };
        let (mut body, mut bytes, mut used) = (response.bytes_stream(), Vec::new(), 0);
        while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, body.next()).await {
            bytes.extend_from_slice(&chunk);
            let (part, at) = parse_sse(&bytes[used..]);
            used += at;
            for event in part {
                if is_lagged(&event) {
                    lagged += 1;
                } else {
                    events.push(event);
                }
            }
            if events.last().is_some_and(is_end) {
                return (events, lagged);
            }
        }
        // The client's pause before it asks again.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// With `--redis-lease 1s` and `--redis-write-timeout 2s`, Redis away for three seconds is a long outage:
/// both the writer's append timeout and every lease pass. The writer ends the stream `store_unavailable`
/// and writes that end behind what Redis had not taken once it is back; the follower tells its readers
/// `lagged` rather than leave them waiting; afterwards every reader on both nodes reaches the same end,
/// through the same log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_past_the_lease_and_the_write_timeout_ends_every_nodes_readers_on_one_log() {
    let mut redis = RedisServer::start();
    let flags = |redis: &RedisServer| {
        let url = redis.url();
        let args = ["--engine", "redis", "--redis-url", &url, "--redis-lease", "1s", "--redis-write-timeout", "2s"];
        ServerProcess::spawn(&[&args[..], &["--keep-alive", "1s"]].concat())
    };
    let (a, b) = (flags(&redis), flags(&redis));
    let client = reqwest::Client::new();
    let id = create(&client, &a).await;
    append(&client, &a, &id, messages("p", 0, 2)).await;
    let reader = |node: &ServerProcess| {
        let (client, base, id) = (client.clone(), node.base.clone(), id.clone());
        tokio::spawn(async move { read_resuming(&client, &base, &id, std::time::Duration::from_secs(40)).await })
    };
    let (on_a, on_b) = (reader(&a), reader(&b));
    until_held(&client, &b, "open", 1).await;

    redis.stop();
    let stopped = std::time::Instant::now();
    // An append while Redis is away is refused once the write timeout passes: not acknowledged.
    let refused = client
        .post(a.url(&format!("/v1/streams/{id}/messages")))
        .header("content-type", "application/x-ndjson")
        .body(messages("p", 2, 1))
        .send()
        .await
        .expect("append");
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    // B, which cannot reach Redis for a lease, no longer holds the stream; a new reader there is told so.
    until_held(&client, &b, "open", 0).await;
    let late = client.get(b.url(&format!("/v1/streams/{id}/events"))).send().await.expect("a late reader");
    assert_eq!(late.status(), 503);
    let body: Value = late.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "cluster_unavailable", "{body}");
    // Redis away for three seconds is the scenario: a sleep.
    tokio::time::sleep(std::time::Duration::from_secs(3).saturating_sub(stopped.elapsed())).await;
    redis.start_again();
    let restarted = std::time::Instant::now();

    let (read_a, _) = on_a.await.expect("A's reader");
    let at_a = restarted.elapsed();
    let (read_b, lagged_b) = on_b.await.expect("B's reader");
    let at_b = restarted.elapsed();
    assert!(lagged_b > 0, "B's reader was told it lagged rather than left waiting");
    for (node, elapsed) in [("A", at_a), ("B", at_b)] {
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "{node}'s reader ended {elapsed:?} after Redis came back"
        );
    }
    // One log on both nodes, each event once: the batch Redis refused, then the end the writer decided.
    assert_eq!(data(&read_a), data(&read_b));
    let ids: Vec<u64> = read_b.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "no gap, no duplicate");
    assert_eq!(texts(&read_b), ["p 0", "p 1", "p 2"]);
    let end = read_b.last().expect("events").json();
    assert_eq!(end["props"]["data"]["status"], "error", "{end}");
    assert_eq!(end["props"]["data"]["error"]["code"], "store_unavailable", "{end}");
    // New readers on either node read the same.
    for node in [&a, &b] {
        let whole = read_events(events(&client, node, &id, "").await).await;
        assert_eq!(data(&whole), data(&read_b), "a new reader on {}", node.base);
    }
}

/// Asking again and again for a stream that does not exist costs Redis one lookup a second, not one per
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stream_asked_for_again_and_again_is_looked_up_once() {
    let redis = RedisServer::start();
    let b = node(&redis);
    let client = reqwest::Client::new();
    let before = redis.stat("total_commands_processed");
    let started = std::time::Instant::now();
    for _ in 0..200 {
        let response = client.get(b.url("/v1/streams/made-up-id/events")).send().await.expect("subscribe");
        assert_eq!(response.status(), 404);
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "stream_not_found", "{body}");
    }
    let seconds = started.elapsed().as_secs() + 1;
    // The lookups, plus the node's lease renewals and this INFO.
    let commands = redis.stat("total_commands_processed") - before;
    assert!(commands <= 3 * seconds + 2, "{commands} Redis commands in {seconds} s for 200 lookups of one id");
}

/// A run's stream id is given out once Redis has the stream: another node finds it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_stream_is_found_on_another_node_as_soon_as_its_id_is_given_out() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    for _ in 0..5 {
        let request = json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": true});
        let response = client.post(a.url("/v1/chat/completions")).json(&request).send().await.expect("chat");
        assert_eq!(response.status(), 200);
        let id = response.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
        let found = client.get(b.url(&format!("/v1/streams/{id}"))).send().await.expect("snapshot");
        assert_eq!(found.status(), 200, "the run's stream on another node at once");
        drop(response);
    }
}

/// A `demo` run started on `node`: its stream id (the response, read to its end in the background).
async fn start_run(client: &reqwest::Client, node: &ServerProcess) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
    let request = json!({"model": "demo", "messages": [{"role": "user", "content": "show me"}], "stream": true});
    let response = client.post(node.url("/v1/chat/completions")).json(&request).send().await.expect("chat");
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
    (id, tokio::spawn(read_body(response)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_run_on_one_node_is_watched_on_the_others_and_cancelled_from_any() {
    let redis = RedisServer::start();
    let (a, b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();

    // Watched from its start on B (typed messages) and C (OpenAI chunks) while the agent runs on A.
    let (id, on_a) = start_run(&client, &a).await;
    let on_b = tokio::spawn(read_events(events(&client, &b, &id, "?from=0").await));
    let on_c = tokio::spawn(read_body(events(&client, &c, &id, "?format=openai&from=0").await));
    let on_b = on_b.await.expect("B's reader");
    let on_c = on_c.await.expect("C's reader");
    on_a.await.expect("A's answer");
    let whole = read_events(events(&client, &a, &id, "?from=0").await).await;
    assert_eq!(data(&on_b), data(&whole), "B read the run as A holds it");
    assert!(on_b.last().is_some_and(|e| e.data.contains("stream_end")), "to its end");
    let openai = read_body(events(&client, &a, &id, "?format=openai&from=0").await).await;
    assert_eq!(String::from_utf8_lossy(&on_c), String::from_utf8_lossy(&openai), "C's chunks are A's");
    assert!(on_c.ends_with(b"data: [DONE]\n\n"));

    // A cancel sent to C reaches the agent on A: the run ends `cancelled` for readers on every node.
    let (id, on_a) = start_run(&client, &a).await;
    let on_b = tokio::spawn(read_events(events(&client, &b, &id, "?from=0").await));
    let (status, cancelled) = post_empty(&client, &c.url(&format!("/v1/streams/{id}/cancel"))).await;
    assert_eq!((status, cancelled["status"].as_str()), (202, Some("cancelled")), "{cancelled}");
    let on_b = on_b.await.expect("B's reader");
    on_a.await.expect("A's answer");
    let end = on_b.last().expect("events").json();
    assert_eq!(end["props"]["data"]["status"], "cancelled", "{end}");
    let (status, snapshot) = get_json(&client, &c.url(&format!("/v1/streams/{id}"))).await;
    assert_eq!((status, snapshot["status"].as_str()), (200, Some("cancelled")), "{snapshot}");
}
