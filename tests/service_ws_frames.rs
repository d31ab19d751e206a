//! A WebSocket at the level of its frames, over raw sockets: the service answers the upgrade itself (as a
//! connection's first request, and after other requests on a kept-alive connection, which hyper read), writes
//! its frames unmasked with the shortest header, and reads the client's frames with its own reader, which
//! must refuse what breaks the protocol with 1002 (an unmasked frame, a control frame over 125 bytes or in
//! fragments, a continuation of nothing), a message over the limit with 1009 even in fragments, and answer
//! what the protocol asks: a fragmented message read whole, a ping with a pong, a close with a close.

mod common;

use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use common::http::{create_stream, end_stream, post_json};
use common::server::TestServer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The key of RFC 6455's example handshake, and the answer it must get.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

const LIMIT: usize = 1024;

async fn server() -> TestServer {
    let settings = Settings { ws_max_message: LIMIT, ..Settings::default() };
    TestServer::with(HubConfig::default(), settings, Agents::builtin()).await
}

/// A client speaking the protocol byte by byte.
struct Raw {
    tcp: TcpStream,
    /// Read and not yet parsed.
    buf: Vec<u8>,
}

/// A client frame: FIN and the opcode in `first`, masked unless `masked` is false.
fn frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let bit = if masked { 0x80 } else { 0 };
    let mut out = vec![first];
    match payload.len() {
        len @ 0..=125 => out.push(bit | len as u8),
        len => {
            out.push(bit | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
    }
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    if masked {
        out.extend_from_slice(&mask);
        out.extend(payload.iter().zip(mask.iter().cycle()).map(|(byte, key)| byte ^ key));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

impl Raw {
    /// Upgrades `tcp` (a new connection, or one already used for other requests) to a WebSocket on `path`.
    async fn upgrade(mut tcp: TcpStream, path: &str) -> Raw {
        let head = format!(
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
             sec-websocket-version: 13\r\nsec-websocket-key: {KEY}\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.expect("the upgrade sent");
        let mut raw = Raw { tcp, buf: Vec::new() };
        let end = raw.fill_until(|buf| buf.windows(4).position(|w| w == b"\r\n\r\n")).await + 4;
        let head = String::from_utf8_lossy(&raw.buf[..end]).to_lowercase();
        raw.buf.drain(..end);
        assert!(head.starts_with("http/1.1 101"), "switching protocols: {head}");
        assert!(head.contains(&format!("sec-websocket-accept: {}", ACCEPT.to_lowercase())), "{head}");
        assert!(head.contains("upgrade: websocket"), "{head}");
        raw
    }

    async fn open(server: &TestServer, path: &str) -> Raw {
        Raw::upgrade(TcpStream::connect(server.addr).await.expect("connected"), path).await
    }

    /// Reads until `found` finds something in the buffer (within a few seconds, or the test fails).
    async fn fill_until(&mut self, found: impl Fn(&[u8]) -> Option<usize>) -> usize {
        let read = async {
            loop {
                if let Some(at) = found(&self.buf) {
                    return at;
                }
                let mut chunk = [0u8; 4096];
                let n = self.tcp.read(&mut chunk).await.expect("read");
                assert!(n > 0, "the server closed the connection before: {:?}", String::from_utf8_lossy(&self.buf));
                self.buf.extend_from_slice(&chunk[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read).await.expect("in time")
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.expect("sent");
    }

    /// The server's next frame: its first byte (FIN and opcode) and its payload. A server frame is never
    /// masked, and its length takes the fewest bytes it can.
    async fn next(&mut self) -> (u8, Vec<u8>) {
        let whole = |buf: &[u8]| {
            let second = *buf.get(1)?;
            assert_eq!(second & 0x80, 0, "a server frame is not masked");
            let (len, at) = match second & 0x7f {
                126 => (u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize, 4),
                127 => (u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?) as usize, 10),
                len => (len as usize, 2),
            };
            assert!(at == 2 || (at == 4 && len >= 126) || len > 65535, "the shortest length: {len} in {at}");
            (buf.len() >= at + len).then_some(at + len)
        };
        let end = self.fill_until(whole).await;
        let frame: Vec<u8> = self.buf.drain(..end).collect();
        let at = match frame[1] & 0x7f {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        (frame[0], frame[at..].to_vec())
    }

    /// The next text message, as JSON (skipping pings).
    async fn json(&mut self) -> Value {
        loop {
            match self.next().await {
                (0x89, _) => continue,
                (0x81, payload) => return serde_json::from_slice(&payload).expect("a text frame is JSON"),
                (first, payload) => panic!("a text frame, not {first:#x}: {:?}", String::from_utf8_lossy(&payload)),
            }
        }
    }

    /// The close frame the server sends next (skipping anything else): its code and reason; then the server
    /// closes the connection.
    async fn close(&mut self) -> (u16, String) {
        loop {
            let (first, payload) = self.next().await;
            if first == 0x88 {
                assert!(payload.len() >= 2, "a close frame with a code");
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                let mut rest = Vec::new();
                let closed = tokio::time::timeout(Duration::from_secs(5), self.tcp.read_to_end(&mut rest)).await;
                assert!(matches!(closed, Ok(Ok(_))), "the server closes after its close frame: {closed:?}");
                return (code, String::from_utf8_lossy(&payload[2..]).into_owned());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmasked_client_frame_closes_with_1002() {
    let server = server().await;
    let mut ws = Raw::open(&server, "/v1/ws").await;
    ws.send(&frame(0x81, b"{}", false)).await;
    let (code, reason) = ws.close().await;
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.contains("not masked"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_frame_over_125_bytes_or_in_fragments_closes_with_1002() {
    let server = server().await;
    let mut ws = Raw::open(&server, "/v1/ws").await;
    ws.send(&frame(0x89, &[b'p'; 126], true)).await;
    let (code, reason) = ws.close().await;
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.contains("125"), "{reason}");

    let mut ws = Raw::open(&server, "/v1/ws").await;
    ws.send(&frame(0x09, b"p", true)).await;
    assert_eq!(ws.close().await.0, 1002, "a ping without FIN");

    let mut ws = Raw::open(&server, "/v1/ws").await;
    ws.send(&frame(0x80, b"{}", true)).await;
    assert_eq!(ws.close().await.0, 1002, "a continuation with nothing to continue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_message_is_read_whole_and_a_ping_between_its_fragments_is_answered() {
    let server = server().await;
    let mut ws = Raw::open(&server, "/v1/ws").await;
    let mut bytes = frame(0x01, br#"{"op":"subscribe","#, true);
    bytes.extend(frame(0x89, b"are you there", true));
    bytes.extend(frame(0x00, br#""stream":"#, true));
    bytes.extend(frame(0x80, br#""nope"}"#, true));
    ws.send(&bytes).await;
    assert_eq!(ws.next().await, (0x8a, b"are you there".to_vec()), "the ping answered with its payload");
    let reply = ws.json().await;
    assert_eq!(reply["error"]["code"], "stream_not_found", "the three fragments are one op: {reply}");
    assert_eq!(reply["error"]["param"], "stream", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragments_over_the_limit_together_close_with_1009() {
    let server = server().await;
    let mut ws = Raw::open(&server, "/v1/ws").await;
    let half = vec![b' '; LIMIT / 2 + 1];
    let mut bytes = frame(0x01, &half, true);
    bytes.extend(frame(0x80, &half, true));
    ws.send(&bytes).await;
    let (code, reason) = ws.close().await;
    assert_eq!(code, 1009, "{reason}");
    assert!(reason.contains(&LIMIT.to_string()), "names the limit: {reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_utf8_across_fragments_closes_with_1007() {
    let server = server().await;
    let mut ws = Raw::open(&server, "/v1/ws").await;
    // A character cut between two fragments is fine; a byte that is never UTF-8 is not.
    let mut bytes = frame(0x01, &[b'"', 0xc3], true);
    bytes.extend(frame(0x80, &[0xa9, 0xff, b'"'], true));
    ws.send(&bytes).await;
    assert_eq!(ws.close().await.0, 1007);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_close_is_answered_with_its_code() {
    let server = server().await;
    let mut ws = Raw::open(&server, "/v1/ws").await;
    ws.send(&frame(0x88, &[0x0f, 0xa0, b'b', b'y', b'e'], true)).await;
    let (code, _) = ws.close().await;
    assert_eq!(code, 4000, "the client's code echoed");
}

/// A one-stream connection gets the stream's frames as whole text frames and, at the end, `done` and a
/// close with 1000; whether the upgrade is the connection's first request or comes after another one on a
/// kept-alive connection (hyper's, then taken back from it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reaches_a_websocket_upgraded_first_or_after_another_request() {
    let server = server().await;
    let client = reqwest::Client::new();
    for after_another in [false, true] {
        let id = create_stream(&client, &server).await;
        let path = format!("/v1/streams/{id}/ws");
        let mut ws = if after_another {
            let mut tcp = TcpStream::connect(server.addr).await.expect("connected");
            tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("sent");
            let mut raw = Raw { tcp, buf: Vec::new() };
            let head = raw.fill_until(|buf| buf.windows(4).position(|w| w == b"\r\n\r\n")).await + 4;
            let text = String::from_utf8_lossy(&raw.buf[..head]).to_lowercase();
            assert!(text.starts_with("http/1.1 200"), "{text}");
            let length: usize = text
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .and_then(|length| length.trim().parse().ok())
                .expect("a content-length");
            raw.fill_until(|buf| (buf.len() >= head + length).then_some(0)).await;
            raw.buf.drain(..head + length);
            assert!(raw.buf.is_empty());
            Raw::upgrade(raw.tcp, &path).await
        } else {
            Raw::open(&server, &path).await
        };
        let long = "x".repeat(300);
        let messages = json!([
            { "type": "text", "props": { "content": "hello" } },
            { "type": "text", "props": { "content": long } },
        ]);
        let (status, reply) = post_json(&client, &server.url(&format!("/v1/streams/{id}/messages")), &messages).await;
        assert_eq!(status, 200, "{reply}");
        let mut first = ws.json().await;
        if first["message"]["type"] == "event" {
            first = ws.json().await;
        }
        assert_eq!(first["message"]["props"]["content"], "hello", "{first}");
        assert_eq!(first["stream"], id.as_str());
        let second = ws.json().await;
        assert_eq!(second["message"]["props"]["content"], long.as_str(), "a frame with a 16-bit length");
        end_stream(&client, &server, &id).await;
        let end = ws.json().await;
        assert_eq!(end["message"]["props"]["event"], "stream_end", "{end}");
        let done = ws.json().await;
        assert_eq!(done["done"], true, "{done}");
        assert_eq!(ws.close().await, (1000, "stream ended".to_owned()), "after another request: {after_another}");
    }
}
