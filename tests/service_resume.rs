//! Resuming SSE subscriptions over HTTP as a browser's `EventSource` does (issue 9, defect 3): it keeps the
//! URL it was opened with (`…/events?from=0`) and adds `Last-Event-ID: <last id seen>` on every reconnect.
//! The header wins over `from`, so reconnects while the producer appends read every event exactly once; a
//! reconnect after the end answers 204 (in every format), which stops `EventSource`; `from` alone still
//! resumes; an empty header counts as absent; a header that is not a sequence is 400 with the OpenAI error
//! envelope, and one beyond the stream is 400 `sequence_ahead`. Every answer to a subscription names the
//! stream's epoch (`x-agentmux-epoch`), so a resumed reader of any format can tell it is the same history.

mod common;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use common::http::{
    PATIENCE, Sse, assert_envelope, assert_sse_headers, assert_whole_cui, create_stream, end_stream, header, post_json,
    read_events, sequences,
};
use common::server::TestServer;

/// What an `EventSource` keeps of an event: its id and its data.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    id: u64,
    data: String,
}

/// `GET url` with `Last-Event-ID: last` when there is one, as `EventSource` reconnects.
async fn connect(client: &reqwest::Client, url: &str, last: Option<u64>) -> reqwest::Response {
    let mut request = client.get(url);
    if let Some(last) = last {
        request = request.header("last-event-id", last.to_string());
    }
    request.send().await.unwrap_or_else(|e| panic!("GET {url} (Last-Event-ID {last:?}): {e}"))
}

/// Reads up to `count` events from an SSE response (all of them when `None`), then drops the connection.
async fn read_some(response: reqwest::Response, count: Option<usize>) -> Vec<Seen> {
    assert_sse_headers(&response);
    let mut events = response.bytes_stream().eventsource();
    let mut seen = Vec::new();
    while count.is_none_or(|count| seen.len() < count) {
        let Some(event) = tokio::time::timeout(PATIENCE, events.next()).await.expect("an event in time") else {
            break;
        };
        let event = event.expect("a valid SSE event");
        assert_eq!(event.event, "message", "no event names: {event:?}");
        let id = event.id.parse().unwrap_or_else(|_| panic!("every CUI event has a sequence as id: {event:?}"));
        seen.push(Seen { id, data: event.data });
    }
    seen
}

/// `count` messages for round `round`: a text streamed in deltas (so the stream adds its `message_start`)
/// and plain texts.
fn batch(round: usize, count: usize) -> Value {
    let messages: Vec<Value> = (0..count)
        .map(|i| {
            if i % 2 == 0 {
                let (content, message_id) = (format!("r{round}.{i} "), format!("r{round}"));
                json!({ "type": "text", "props": { "content": content }, "message_id": message_id, "delta": true })
            } else {
                json!({ "type": "text", "props": { "content": format!("plain r{round}.{i}") } })
            }
        })
        .collect();
    json!(messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_reconnects_to_a_from_0_url_read_every_event_exactly_once() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let url = server.url(&format!("/v1/streams/{id}/events?from=0"));
    let messages_url = server.url(&format!("/v1/streams/{id}/messages"));

    // Each round reconnects to the same `?from=0` URL with the last id seen, has the producer append while
    // the connection is open, reads a few events (the rest of the backlog, then live ones) and goes away
    // with events still unread.
    let mut seen: Vec<Seen> = Vec::new();
    for round in 0..6 {
        let response = connect(&client, &url, seen.last().map(|s| s.id)).await;
        let (status, reply) = post_json(&client, &messages_url, &batch(round, 6)).await;
        assert_eq!(status, 200, "{reply}");
        let got = read_some(response, Some(5)).await;
        assert_eq!(got.len(), 5, "round {round}: the stream is open, five events come");
        let expected_first = seen.last().map_or(1, |s| s.id + 1);
        assert_eq!(got[0].id, expected_first, "round {round}: the header wins over from=0, no replay, no gap");
        seen.extend(got);
    }
    let last_read = seen.last().expect("events").id;
    let appended = server.hub.get(&id).expect("the stream").last_sequence();
    assert!(appended > last_read + 5, "the reconnects left a backlog: read {last_read} of {appended}");

    // The producer ends; the next reconnect reads the rest and the end.
    let last = end_stream(&client, &server, &id).await;
    let rest = read_some(connect(&client, &url, Some(last_read)).await, None).await;
    assert_eq!(rest.first().map(|s| s.id), Some(last_read + 1));
    seen.extend(rest);

    // Together: every event exactly once, as a single reader from the start reads them.
    let response = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("late joiner");
    assert_sse_headers(&response);
    let whole = read_events(response).await;
    assert_eq!(assert_whole_cui(&whole, "completed"), last);
    let expected: Vec<Seen> =
        whole.iter().map(|e| Seen { id: e.id.expect("CUI events have ids"), data: e.data.clone() }).collect();
    assert_eq!(seen, expected, "the reconnects together read the whole stream, each event once");

    // Reconnecting after the end, with the last id: 204 (EventSource stops), in every format, even though the
    // URL says from=0.
    for query in ["from=0", "from=0&format=openai", "format=openai&include_usage=true", ""] {
        let at_end = server.url(&format!("/v1/streams/{id}/events?{query}"));
        let response = connect(&client, &at_end, Some(last)).await;
        assert_eq!(response.status(), 204, "{query}: a reconnect after the end does not replay");
        let body = response.bytes().await.expect("an empty body");
        assert!(body.is_empty(), "{query}: 204 has no body");
    }

    // The header wins when it is behind `from` too.
    let response = connect(&client, &server.url(&format!("/v1/streams/{id}/events?from={last}")), Some(3)).await;
    let events = read_some(response, None).await;
    assert_eq!(events, expected[3..], "Last-Event-ID: 3 beats from={last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_alone_resumes_and_ends_with_204() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let messages_url = server.url(&format!("/v1/streams/{id}/messages"));
    let (status, reply) = post_json(&client, &messages_url, &batch(0, 8)).await;
    assert_eq!(status, 200, "{reply}");
    let events_url = server.url(&format!("/v1/streams/{id}/events"));

    // At the live edge of an open stream, resuming waits for the next event rather than answering 204.
    let at_edge = *sequences(&reply).last().expect("sequences");
    let waiting = connect(&client, &format!("{events_url}?from={at_edge}"), None).await;
    assert_sse_headers(&waiting);
    let (status, reply) =
        post_json(&client, &messages_url, &json!({ "type": "text", "props": { "content": "next" } })).await;
    assert_eq!(status, 200, "{reply}");
    let next = read_some(waiting, Some(1)).await;
    assert_eq!(next[0].id, at_edge + 1, "the first event after from={at_edge}");
    let last = end_stream(&client, &server, &id).await;

    let whole = read_events(client.get(&events_url).send().await.expect("from the start")).await;
    assert_eq!(assert_whole_cui(&whole, "completed"), last);
    for from in [0, 1, 4, last - 1] {
        let response = connect(&client, &format!("{events_url}?from={from}"), None).await;
        assert_sse_headers(&response);
        let tail: Vec<Sse> = read_events(response).await;
        assert_eq!(tail, whole[from as usize..], "from={from} alone gives the events after {from}");
    }

    // An empty Last-Event-ID counts as absent: `from` applies.
    let response = client.get(format!("{events_url}?from=4")).header("last-event-id", "").send().await.expect("GET");
    assert_sse_headers(&response);
    assert_eq!(read_events(response).await, whole[4..], "an empty Last-Event-ID leaves from=4 in charge");

    // from at the end of the ended stream: 204, in every format.
    for format in ["cui", "openai"] {
        let response = connect(&client, &format!("{events_url}?format={format}&from={last}"), None).await;
        assert_eq!(response.status(), 204, "{format}: from={last} after the end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_event_id_that_is_not_a_sequence_is_400_with_the_envelope() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let url = server.url(&format!("/v1/streams/{id}/events?from=0"));

    for bad in ["abc", "-1", "1.5", "3 4", "99999999999999999999999"] {
        let response = client.get(&url).header("last-event-id", bad).send().await.expect("GET");
        assert_eq!(response.status(), 400, "Last-Event-ID {bad:?}");
        assert_eq!(header(&response, "content-type"), "application/json", "{bad:?}: never SSE");
        assert_eq!(header(&response, "x-should-retry"), "false", "{bad:?}");
        let reply: Value = response.json().await.expect("JSON");
        assert_envelope(&reply, Some("Last-Event-ID"), "invalid_value");
        assert_eq!(reply["error"]["type"], "invalid_request_error", "{reply}");
    }

    // A sequence the stream has not reached: 400 sequence_ahead, by the header as by `from`, naming the one
    // that said it.
    let response = client.get(&url).header("last-event-id", "5").send().await.expect("GET");
    assert_eq!(response.status(), 400);
    assert_envelope(&response.json().await.expect("JSON"), Some("Last-Event-ID"), "sequence_ahead");
    let ahead = server.url(&format!("/v1/streams/{id}/events?from=5"));
    let response = client.get(&ahead).send().await.expect("GET");
    assert_eq!(response.status(), 400);
    assert_envelope(&response.json().await.expect("JSON"), Some("from"), "sequence_ahead");
}

/// Every answer to a subscription names the stream's epoch in `x-agentmux-epoch` (the only epoch a resumed
/// subscription in a format other than CUI learns): in every format, on a connection's first request
/// (served outside hyper, `connection: close`) and on a kept-alive one (hyper), the `204` after the end, and
/// the WebSocket upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscription_answer_names_the_streams_epoch() {
    let server = TestServer::start().await;
    let pooled = reqwest::Client::new();
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client");
    let id = create_stream(&pooled, &server).await;
    let (status, reply) = post_json(&pooled, &server.url(&format!("/v1/streams/{id}/messages")), &batch(0, 3)).await;
    assert_eq!(status, 200, "{reply}");
    let last = end_stream(&pooled, &server, &id).await;
    let snapshot_url = server.url(&format!("/v1/streams/{id}"));
    let snapshot: Value = pooled.get(&snapshot_url).send().await.expect("snapshot").json().await.expect("JSON");
    let epoch = snapshot["epoch"].as_str().expect("the snapshot's epoch").to_owned();
    assert_eq!(epoch.len(), 16, "{snapshot}");

    for format in ["cui", "openai", "ui-message", "ag-ui", "anthropic", "responses"] {
        let url = server.url(&format!("/v1/streams/{id}/events?format={format}&from=1"));
        let first = fresh.get(&url).send().await.expect("events on a new connection");
        assert_eq!(first.status(), 200, "{format}");
        assert_eq!(header(&first, "connection"), "close", "{format}: a first request, served outside hyper");
        assert_eq!(header(&first, "x-agentmux-epoch"), epoch, "{format}: first request");
        first.bytes().await.expect("the body");
        // Behind another request on the same connection: served by hyper.
        let kept = behind_another(&server, &format!("/v1/streams/{id}/events?format={format}&from=1")).await;
        assert!(kept.contains(&format!("\r\nx-agentmux-epoch: {epoch}\r\n")), "{format}: by hyper: {kept}");
        let done = fresh.get(server.url(&format!("/v1/streams/{id}/events?format={format}&from={last}"))).send();
        let done = done.await.expect("events after the end");
        assert_eq!(done.status(), 204, "{format}");
        assert_eq!(header(&done, "x-agentmux-epoch"), epoch, "{format}: the 204");
    }

    let ws = server.url(&format!("/v1/streams/{id}/ws")).replacen("http", "ws", 1);
    let (_socket, upgrade) = tokio_tungstenite::connect_async(ws.as_str()).await.expect("WebSocket");
    let named = upgrade.headers().get("x-agentmux-epoch").and_then(|v| v.to_str().ok());
    assert_eq!(named, Some(epoch.as_str()), "the WebSocket upgrade");
}

/// The answer to `GET path` sent on a new connection right behind a `GET /healthz` (so the service reads the
/// connection with hyper, not as an event stream's first request): the connection's bytes, as text.
async fn behind_another(server: &TestServer, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    let requests =
        format!("GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nGET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    socket.write_all(requests.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, socket.read_to_end(&mut answer)).await.expect("in time").expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}
