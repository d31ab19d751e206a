//! A connection whose first request is a GET of a stream's events, served without hyper, over raw sockets:
//! a head that arrives a few bytes at a time, the response's framing (chunked, `connection: close`, the
//! connection closed at the stream's end), a subscriber let go when its client leaves while it waits, and
//! everything else on a first request (HEAD, a pipelined request, a head too long to read here, too many
//! headers) still served by hyper from the connection's first byte.

mod common;

use std::time::Duration;

use common::http::{PATIENCE, create_stream, end_stream, parse_sse, post_json};
use common::server::TestServer;
use common::wait::eventually;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Everything the server sends until it closes the connection.
async fn read_to_close(tcp: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut bytes)).await.expect("the server closes").expect("read");
    bytes
}

/// The head (status line and headers, lower-cased) and the rest.
fn split_head(bytes: &[u8]) -> (String, Vec<u8>) {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole head") + 4;
    (String::from_utf8_lossy(&bytes[..end]).to_lowercase(), bytes[end..].to_vec())
}

/// A chunked body, decoded; panics unless it ends with the last chunk.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = body.windows(2).position(|w| w == b"\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line]).expect("ASCII"), 16).expect("hex");
        body = &body[line + 2..];
        if size == 0 {
            assert_eq!(body, b"\r\n", "the last chunk ends the body");
            return out;
        }
        out.extend_from_slice(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}

async fn subscribers(client: &reqwest::Client, server: &TestServer) -> u64 {
    let text = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    text.lines()
        .filter(|l| l.starts_with("agentmux_subscribers{") && l.contains("transport=\"sse\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_first_request_for_events_gets_a_chunked_answer_and_the_connection_closes_with_the_stream() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    // The head arrives a few bytes at a time.
    let request = format!(
        "GET /v1/streams/{id}/events?format=cui HTTP/1.1\r\nHost: agentmux\r\nAccept: text/event-stream\r\n\r\n"
    );
    for piece in request.as_bytes().chunks(7) {
        tcp.write_all(piece).await.expect("write");
        // A slow client's pace, so the head comes in pieces: the scenario, not synchronisation.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (status, _) = post_json(
        &client,
        &server.url(&format!("/v1/streams/{id}/messages")),
        &json!([{"type": "text", "props": {"content": "Hello"}}, {"type": "text", "props": {"content": "again"}}]),
    )
    .await;
    assert_eq!(status, 200);
    let last = end_stream(&client, &server, &id).await;
    let (head, body) = split_head(&read_to_close(&mut tcp).await);
    assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
    for line in ["content-type: text/event-stream", "transfer-encoding: chunked", "connection: close", "date: "] {
        assert!(head.contains(line), "{line} in {head}");
    }
    assert!(head.contains(&format!("x-agentmux-stream-id: {id}")), "{head}");
    let (events, _) = parse_sse(&dechunk(&body));
    let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every message once, in order, then the end");
    assert!(events.iter().any(|e| e.data.contains("\"Hello\"")) && events.iter().any(|e| e.data.contains("\"again\"")));
    assert!(events.last().is_some_and(|e| e.data.contains("stream_end")), "ends with stream_end");

    // An error is a whole answer, with its length, and the connection closes after it.
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(b"GET /v1/streams/nope/events HTTP/1.1\r\nHost: agentmux\r\n\r\n").await.expect("write");
    let (head, body) = split_head(&read_to_close(&mut tcp).await);
    assert!(head.starts_with("http/1.1 404 not found\r\n") && head.contains("connection: close"), "{head}");
    assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
    let error: serde_json::Value = serde_json::from_slice(&body).expect("the envelope");
    assert_eq!(error["error"]["code"], "stream_not_found");
}

#[tokio::test]
async fn a_subscriber_whose_client_leaves_while_it_waits_is_let_go() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(format!("GET /v1/streams/{id}/events HTTP/1.1\r\nHost: agentmux\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut first = [0u8; 64];
    let read = tokio::time::timeout(PATIENCE, tcp.read(&mut first)).await.expect("the head").expect("read");
    assert!(first[..read].starts_with(b"HTTP/1.1 200 OK"));
    eventually("the subscriber to be counted", PATIENCE, async || subscribers(&client, &server).await == 1).await;
    drop(tcp);
    let let_go = async || subscribers(&client, &server).await == 0;
    eventually("the subscriber to be let go once its client has left", PATIENCE, let_go).await;
}

#[tokio::test]
async fn every_other_first_request_is_served_by_hyper_from_its_first_byte() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    end_stream(&client, &server, &id).await;
    let events = format!("/v1/streams/{id}/events");

    // HEAD: the headers of the event stream, and no body.
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(format!("HEAD {events} HTTP/1.1\r\nHost: agentmux\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let (head, body) = split_head(&read_to_close(&mut tcp).await);
    assert!(head.starts_with("http/1.1 200 ok\r\n") && head.contains("text/event-stream"), "{head}");
    assert!(body.is_empty());

    // Two requests in one write (pipelined): hyper answers both, in order, on the one connection.
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(
        format!(
            "GET {events} HTTP/1.1\r\nHost: agentmux\r\n\r\nGET /healthz HTTP/1.1\r\nHost: agentmux\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let answers = String::from_utf8_lossy(&read_to_close(&mut tcp).await).to_string();
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
    let (sse, health) = answers.split_at(answers.rfind("HTTP/1.1 200 OK").expect("the second answer"));
    assert!(sse.contains("stream_end") && !sse.to_lowercase().contains("connection: close"), "{sse}");
    assert!(health.contains("\r\n\r\n"), "{health}");

    // A head longer than is read here: hyper reads it from the start, and the stream is served.
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    let padding = "p".repeat(12 * 1024);
    tcp.write_all(
        format!("GET {events} HTTP/1.1\r\nHost: agentmux\r\nX-Padding: {padding}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let (head, body) = split_head(&read_to_close(&mut tcp).await);
    assert!(head.starts_with("http/1.1 200 ok\r\n") && head.contains("transfer-encoding: chunked"), "{head}");
    assert!(String::from_utf8_lossy(&dechunk(&body)).contains("stream_end"));

    // More headers than are read here: hyper takes them, and the service's own limit answers as before.
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    let many: String = (0..70).map(|i| format!("X-H{i}: v\r\n")).collect();
    tcp.write_all(format!("GET {events} HTTP/1.1\r\nHost: agentmux\r\n{many}Connection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let (head, body) = split_head(&read_to_close(&mut tcp).await);
    assert!(head.starts_with("http/1.1 431"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("headers_too_large"), "the envelope");
}

/// A raw subscriber to `id`'s CUI events, reading from a socket whose receive buffer is `receive_buffer`
/// bytes when given (a small one fills after a few writes).
async fn subscribe_raw(server: &TestServer, id: &str, receive_buffer: Option<u32>) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    if let Some(size) = receive_buffer {
        socket.set_recv_buffer_size(size).expect("a receive buffer");
    }
    let mut tcp = socket.connect(server.addr).await.expect("connect");
    tcp.write_all(format!("GET /v1/streams/{id}/events HTTP/1.1\r\nHost: agentmux\r\n\r\n").as_bytes())
        .await
        .expect("write");
    tcp
}

/// Subscribers that keep up are written to by their stream's feed while their own tasks wait (`transport/feed.rs`):
/// with messages posted one per POST, every subscriber gets each one once, in order; in a silence each gets
/// its pings; and one that stops reading while a megabyte comes (its socket takes a few kilobytes, so a
/// write stops partway and its connection takes over from the feed) gets every byte once it reads again.
#[tokio::test]
async fn subscribers_that_keep_up_get_every_message_and_their_pings_from_the_feed() {
    let settings = agentmux::http::Settings { keep_alive: Duration::from_millis(40), ..Default::default() };
    let server =
        TestServer::with(agentmux::hub::HubConfig::default(), settings, agentmux::agent::Agents::builtin()).await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let mut readers = Vec::new();
    for _ in 0..12 {
        readers.push(subscribe_raw(&server, &id, None).await);
    }
    let mut stalled = subscribe_raw(&server, &id, Some(4096)).await;
    eventually("every subscriber to be counted", PATIENCE, async || subscribers(&client, &server).await == 13).await;
    // Everyone reads (and drains) but the stalled one.
    let readers: Vec<_> =
        readers.into_iter().map(|mut tcp| tokio::spawn(async move { read_to_close(&mut tcp).await })).collect();
    let messages = format!("/v1/streams/{id}/messages");
    for n in 0..40 {
        let (status, _) = post_json(
            &client,
            &server.url(&messages),
            &json!([{"type": "text", "props": {"content": format!("one {n}")}}]),
        )
        .await;
        assert_eq!(status, 200);
    }
    // A silence long enough for everyone's pings: the scenario, not synchronisation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let long = "x".repeat(10_000);
    for _ in 0..10 {
        let batch: Vec<_> = (0..10).map(|_| json!({"type": "text", "props": {"content": long}})).collect();
        let (status, _) = post_json(&client, &server.url(&messages), &json!(batch)).await;
        assert_eq!(status, 200);
    }
    let last = end_stream(&client, &server, &id).await;
    let stalled = read_to_close(&mut stalled).await;
    for body in readers.into_iter().map(|reader| async { reader.await.expect("read") }) {
        let (head, body) = split_head(&body.await);
        assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
        let body = dechunk(&body);
        let (events, _) = parse_sse(&body);
        let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
        assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every message once, in order");
        assert!(body.windows(8).any(|w| w == b": ping\n\n"), "pings in the silence");
    }
    let (_, body) = split_head(&stalled);
    let (events, _) = parse_sse(&dechunk(&body));
    let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "the stalled reader gets every message too");
    assert_eq!(events.iter().filter(|e| e.data.contains(&long)).count(), 100);
}

/// Reads from `tcp` into `seen` until it holds `needle`.
async fn read_until(tcp: &mut TcpStream, seen: &mut Vec<u8>, needle: &str) {
    let mut buffer = [0u8; 4096];
    while !seen.windows(needle.len()).any(|w| w == needle.as_bytes()) {
        let read = tokio::time::timeout(PATIENCE, tcp.read(&mut buffer)).await.expect("more events").expect("read");
        assert!(read > 0, "the connection closed before {needle:?}");
        seen.extend_from_slice(&buffer[..read]);
    }
}

/// The median of `delays`, in ms.
fn median_ms(mut delays: Vec<Duration>) -> f64 {
    delays.sort();
    delays[delays.len() / 2].as_secs_f64() * 1e3
}

/// A stream's lone subscriber gets each message as soon as it is appended, however soon after the last
/// (the relay's case: one chat completion read by its own client), on both paths a subscriber is written by:
/// its stream's feed (the first request of a connection) and its own relay (a request hyper serves, after
/// another on the same connection). Holding writes back to gather messages pays only where several readers
/// share them (`transport/sse.rs`, `shares_writes`): before, a message appended less than 2.5 ms after the
/// last write was held until 1.5 ms after it, so each of these came 1.5 to 2.5 ms late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_subscriber_gets_each_message_at_once() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    // On the feed: the connection's first request.
    let fed = create_stream(&client, &server).await;
    let mut fed_tcp = subscribe_raw(&server, &fed, None).await;
    // On hyper: a first request it serves, then the events on the same connection.
    let relayed = create_stream(&client, &server).await;
    let mut relayed_tcp = TcpStream::connect(server.addr).await.expect("connect");
    let requests = format!(
        "GET /healthz HTTP/1.1\r\nHost: agentmux\r\n\r\nGET /v1/streams/{relayed}/events HTTP/1.1\r\nHost: agentmux\r\n\r\n"
    );
    relayed_tcp.write_all(requests.as_bytes()).await.expect("write");
    for (id, tcp) in [(&fed, &mut fed_tcp), (&relayed, &mut relayed_tcp)] {
        let stream = server.hub.get(id).expect("the stream");
        let mut seen = Vec::new();
        read_until(tcp, &mut seen, "stream_start").await;
        let mut delays = Vec::new();
        for n in 0..30 {
            // Appended as soon as the last one arrived: well within 2.5 ms of its write.
            let token = format!("token{n}-");
            let appended = std::time::Instant::now();
            stream.append(agentmux::output::OutputMessage::text(token.clone())).expect("append");
            read_until(tcp, &mut seen, &token).await;
            delays.push(appended.elapsed());
        }
        let median = median_ms(delays);
        assert!(
            median < 1.0,
            "stream {id}: each message reached its lone reader {median:.2} ms (median) after its append"
        );
    }
}

/// Readers that share a stream still gather: messages appended every 300 µs reach each of them in writes at
/// least 1.5 ms apart, several messages a write, not one write per message (and every message once, in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_that_share_a_stream_still_gather_fast_messages() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let mut readers = Vec::new();
    for _ in 0..3 {
        readers.push(subscribe_raw(&server, &id, None).await);
    }
    eventually("every subscriber to be counted", PATIENCE, async || subscribers(&client, &server).await == 3).await;
    let stream = server.hub.get(&id).expect("the stream");
    let readers: Vec<_> =
        readers.into_iter().map(|mut tcp| tokio::spawn(async move { read_to_close(&mut tcp).await })).collect();
    let appends = 60;
    let appending = tokio::task::spawn_blocking(move || {
        for n in 0..appends {
            stream.append(agentmux::output::OutputMessage::text(format!("t{n} "))).expect("append");
            // The pace of a fast model: the scenario, not synchronisation (a timer would round it up to 1 ms).
            let next = std::time::Instant::now() + Duration::from_micros(300);
            while std::time::Instant::now() < next {
                std::hint::spin_loop();
            }
        }
    });
    appending.await.expect("the appends");
    let last = end_stream(&client, &server, &id).await;
    for reader in readers {
        let (_, body) = split_head(&reader.await.expect("read"));
        let chunks = chunk_count(&body);
        let (events, _) = parse_sse(&dechunk(&body));
        let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
        assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every message once, in order");
        assert!(chunks <= appends / 2, "{chunks} writes for {appends} messages 300 µs apart: they were not gathered");
    }
}

/// How many chunks a chunked body has, the last one left out.
fn chunk_count(mut body: &[u8]) -> usize {
    let mut count = 0;
    loop {
        let line = body.windows(2).position(|w| w == b"\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..line]).expect("ASCII"), 16).expect("hex");
        if size == 0 {
            return count;
        }
        count += 1;
        body = &body[line + 2 + size + 2..];
    }
}

/// A producer is paced by the pass over the readers that keep up (`transport/feed.rs`, `Feeds::paced`): a
/// burst appended while its stream's feed is still writing the last one to its readers is answered only
/// once that pass has ended, so a producer that posts its next burst as soon as the last is answered does
/// not run ahead of its readers. On one thread, the pass over 1,000 readers lets other tasks run every 128
/// deliveries; the second burst comes in at such a turn, and when its answer arrives every reader has been
/// written the whole first burst. (Before the pacing, the second burst's answer came while the pass was
/// still on its way to the later readers.)
#[tokio::test]
async fn a_burst_is_answered_once_the_pass_over_the_readers_that_keep_up_has_ended() {
    const READERS: usize = 1000;
    const BURST: usize = 300;
    // All from one address: room for them.
    let settings = agentmux::http::Settings { connections_per_client: Some(2 * READERS), ..Default::default() };
    let server =
        TestServer::with(agentmux::hub::HubConfig::default(), settings, agentmux::agent::Agents::builtin()).await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        readers.push(subscribe_raw(&server, &id, None).await);
    }
    eventually("every subscriber to be counted", PATIENCE, async || {
        subscribers(&client, &server).await == READERS as u64
    })
    .await;
    // Every reader parked on the feed, and no pass for a while: the first burst's pass is not held back.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let burst = |name: &str| -> String {
        (0..BURST)
            .map(|n| format!("{}\n", json!({"type": "text", "props": {"content": format!("{name}{n}.")}})))
            .collect()
    };
    let post = async |body: String| {
        let response = client
            .post(server.url(&format!("/v1/streams/{id}/messages")))
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .expect("append");
        assert_eq!(response.status(), 200);
    };
    post(burst("first")).await;
    post(burst("second")).await;
    // Nothing else runs on this thread until the sockets are read: they hold what the server wrote before it
    // answered (the pause lets the kernel hand over anything still on its way).
    std::thread::sleep(Duration::from_millis(20));
    let last = format!("first{}.", BURST - 1);
    let mut without = 0;
    for tcp in &readers {
        let mut seen = Vec::new();
        let mut buffer = vec![0u8; 64 << 10];
        loop {
            match tcp.try_read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(error) => panic!("read: {error}"),
            }
        }
        if !String::from_utf8_lossy(&seen).contains(&last) {
            without += 1;
        }
    }
    assert_eq!(
        without, 0,
        "{without} of {READERS} readers had not been written the first burst when the second was answered"
    );
}
