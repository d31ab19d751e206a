//! WebSocket connections close with the code that fits the cause, and a reason meant for a client: 1003
//! for a binary frame, 1009 for a message over the limit, 1007 for a text frame that is not UTF-8. Op
//! errors name the op's field.

mod common;

use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use common::server::TestServer;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(server: &TestServer) -> Ws {
    let url = format!("ws://{}/v1/ws", server.addr);
    tokio_tungstenite::connect_async(url.as_str()).await.expect("connect").0
}

/// The close frame the server sends next (skipping anything else).
async fn close_of(ws: &mut Ws) -> CloseFrame {
    let read = async {
        while let Some(message) = ws.next().await {
            match message {
                Ok(Message::Close(Some(frame))) => return frame,
                Ok(Message::Close(None)) => panic!("a close without a code"),
                Ok(_) => {}
                Err(error) => panic!("the socket failed before its close frame: {error}"),
            }
        }
        panic!("no close frame")
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.expect("closed in time")
}

async fn server() -> TestServer {
    let settings = Settings { ws_max_message: 1024, ..Settings::default() };
    TestServer::with(HubConfig::default(), settings, Agents::builtin()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_frame_closes_with_1003() {
    let server = server().await;
    let mut ws = connect(&server).await;
    ws.send(Message::Binary(vec![1u8, 2, 3].into())).await.expect("send");
    let close = close_of(&mut ws).await;
    assert_eq!(u16::from(close.code), 1003);
    assert!(close.reason.contains("binary frames are not supported"), "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_closes_with_1009() {
    let server = server().await;
    let mut ws = connect(&server).await;
    let big = json!({ "op": "subscribe", "stream": "x".repeat(4096) }).to_string();
    ws.send(Message::Text(big.into())).await.expect("send");
    let close = close_of(&mut ws).await;
    assert_eq!(u16::from(close.code), 1009);
    assert!(close.reason.contains("1024"), "names the limit: {close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_utf8_closes_with_1007() {
    let server = server().await;
    let mut ws = connect(&server).await;
    let frame = Frame::message(vec![0xff, 0xfe, 0x7b], OpCode::Data(Data::Text), true);
    ws.send(Message::Frame(frame)).await.expect("send");
    let close = close_of(&mut ws).await;
    assert_eq!(u16::from(close.code), 1007);
    assert!(!close.reason.contains("Error"), "a reason for a client, not internal text: {close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stream_in_an_op_names_the_field() {
    let server = server().await;
    let mut ws = connect(&server).await;
    let subscribe = json!({ "op": "subscribe", "stream": "nope" }).to_string();
    ws.send(Message::Text(subscribe.into())).await.expect("send");
    let reply = ws.next().await.expect("reply").expect("frame");
    let reply: Value = serde_json::from_str(reply.to_text().expect("text")).expect("json");
    assert_eq!(reply["error"]["code"], "stream_not_found", "{reply}");
    assert_eq!(reply["error"]["param"], "stream", "{reply}");
    ws.send(Message::Text("{}".into())).await.expect("send");
    let reply = ws.next().await.expect("reply").expect("frame");
    assert!(reply.to_text().expect("text").contains("invalid_op"), "the connection stays open after a bad op");
}
