//! Real browsers: headless Chromium (Debian's `chromium` and `chromium-driver`, installed here with apt-get
//! when missing; never skipped) driven over WebDriver by `fantoccini`, against a server with a key and one
//! listed origin. Pages are served by the test from other loopback ports, so they are other origins:
//!
//! - a page of the listed origin watches a stream with `EventSource` and a read token, through a proxy the
//!   test cuts mid-stream: the browser reconnects by itself with `Last-Event-ID` and gets every event exactly
//!   once; it closes at `stream_end`;
//! - the same page streams a chat completion with `fetch` and a key, and reads the stream-id and read-token
//!   headers;
//! - a page of an origin not listed can neither open the WebSocket nor start a run, with or without a
//!   preflight.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{Origins, Settings};
use agentmux::hub::HubConfig;
use common::browser::{browser, start_driver, until};
use common::http::create_with_key;
use common::server::TestServer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "sk-browser";

/// Serves one HTML page (`body`) at `/` on a loopback port of its own: another origin.
async fn page(body: String) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    let html = Arc::new(body);
    let task = tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let html = Arc::clone(&html);
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let _ = tcp.read(&mut head).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = tcp.write_all(reply.as_bytes()).await;
            });
        }
    });
    (origin, task)
}

/// A TCP proxy in front of the server that the test can cut: every connection through it so far is closed
/// at once. It notes each request head it forwards.
struct Proxy {
    addr: String,
    cut: Arc<tokio::sync::Notify>,
    heads: Arc<Mutex<Vec<String>>>,
    connections: Arc<AtomicUsize>,
}

async fn proxy(server: String) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (cut, heads, connections) =
        (Arc::new(tokio::sync::Notify::new()), Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicUsize::new(0)));
    let proxy = Proxy { addr, cut: Arc::clone(&cut), heads: Arc::clone(&heads), connections: Arc::clone(&connections) };
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let (server, cut, heads) = (server.clone(), Arc::clone(&cut), Arc::clone(&heads));
            tokio::spawn(async move {
                let Ok(mut upstream) = TcpStream::connect(&server).await else { return };
                let mut first = vec![0u8; 8192];
                let Ok(n) = client.read(&mut first).await else { return };
                heads.lock().expect("heads").push(String::from_utf8_lossy(&first[..n]).to_ascii_lowercase());
                if upstream.write_all(&first[..n]).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                    () = cut.notified() => {}
                }
            });
        }
    });
    proxy
}

async fn append(client: &reqwest::Client, server: &TestServer, id: &str, texts: &[&str]) {
    let messages: Vec<Value> = texts.iter().map(|t| json!({"type": "text", "props": {"content": t}})).collect();
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    let response = client.post(url).bearer_auth(KEY).json(&messages).send().await.expect("append");
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_watches_resumes_fetches_and_is_kept_out_where_it_should_be() {
    let driver = start_driver().await;
    // The page of the listed origin is served before the server starts: its origin goes in --cors-origin.
    let watcher = r#"<!doctype html><script>
      window.got = []; window.opens = 0;
      window.watch = (url) => {
        const events = new EventSource(url);
        events.onopen = () => { window.opens += 1; };
        events.onmessage = (e) => {
          window.got.push(Number(e.lastEventId));
          const m = JSON.parse(e.data);
          if (m.type === "event" && m.props.event === "stream_end") { events.close(); window.done = true; }
        };
      };
      window.chat = async (base, key) => {
        const r = await fetch(base + "/v1/chat/completions", { method: "POST",
          headers: { "content-type": "application/json", authorization: "Bearer " + key },
          body: JSON.stringify({ model: "echo", stream: true, messages: [{ role: "user", content: "hello browser" }] }) });
        window.chatResult = { status: r.status, id: r.headers.get("x-agentmux-stream-id"),
          token: r.headers.get("x-agentmux-read-token"), text: await r.text() };
      };
    </script>"#;
    let (allowed, _page) = page(watcher.to_owned()).await;
    let settings = Settings {
        api_keys: vec![KEY.into()],
        cors_origins: Origins::new(std::slice::from_ref(&allowed)).expect("origin"),
        shutdown_grace: Duration::ZERO,
        ..Settings::default()
    };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let created = create_with_key(&client, &server.base, KEY).await;
    let (id, read) =
        (created["id"].as_str().expect("id").to_owned(), created["read_token"].as_str().expect("token").to_owned());
    append(&client, &server, &id, &["one", "two", "three"]).await;

    let browser = browser(&driver).await;
    browser.goto(&allowed).await.expect("the page");
    // Through the proxy, so the test can cut the connection under the page.
    let through = proxy(server.addr.to_string()).await;
    let token: String = url::form_urlencoded::byte_serialize(read.as_bytes()).collect();
    let events_url = format!("http://{}/v1/streams/{id}/events?token={token}", through.addr);
    browser.execute("window.watch(arguments[0]);", vec![json!(events_url)]).await.expect("watch");
    until(&browser, "window.got.length >= 4", Duration::from_secs(20)).await;
    through.cut.notify_waiters();
    append(&client, &server, &id, &["four", "five"]).await;
    let ended = client.post(server.url(&format!("/v1/streams/{id}/end"))).bearer_auth(KEY).send().await.expect("end");
    assert_eq!(ended.status(), 200);
    until(&browser, "window.done", Duration::from_secs(20)).await;
    let got: Vec<u64> =
        serde_json::from_value(browser.execute("return window.got;", vec![]).await.expect("got")).expect("ids");
    let expected: Vec<u64> = (1..=got.len() as u64).collect();
    assert_eq!(got, expected, "every event exactly once, in order, across the cut");
    assert_eq!(got.len(), 7, "stream_start, five texts, stream_end: {got:?}");
    assert_eq!(browser.execute("return window.opens;", vec![]).await.expect("opens"), json!(2), "one reconnect");
    let heads = through.heads.lock().expect("heads").clone();
    assert_eq!(through.connections.load(Ordering::SeqCst), 2, "{heads:?}");
    assert!(heads[1].contains("last-event-id: "), "the reconnect resumes: {}", heads[1]);
    assert!(heads[0].contains(&format!("origin: {allowed}")), "{}", heads[0]);

    // fetch with a key: the run's id and read token are readable across origins.
    let base = format!("http://{}", server.addr);
    browser.execute("window.chat(arguments[0], arguments[1]);", vec![json!(base), json!(KEY)]).await.expect("chat");
    let result = until(&browser, "window.chatResult", Duration::from_secs(20)).await;
    assert_eq!(result["status"], 200, "{result}");
    assert!(result["id"].as_str().is_some_and(|id| id.len() == 32), "{result}");
    assert!(result["token"].as_str().is_some_and(|t| t.starts_with("amr.")), "{result}");
    let text = result["text"].as_str().expect("text");
    assert!(text.contains("hello") && text.contains("data: [DONE]"), "{text}");

    // A page of an origin not listed.
    let intruder = r#"<!doctype html><script>
      window.tryAll = (http, ws) => {
        const socket = new WebSocket(ws);
        socket.onopen = () => { window.ws = "open"; };
        socket.onerror = () => { window.ws = window.ws || "refused"; };
        socket.onclose = () => { window.ws = window.ws || "refused"; };
        const body = JSON.stringify({ model: "echo", messages: [{ role: "user", content: "x" }] });
        fetch(http, { method: "POST", mode: "no-cors", headers: { "content-type": "text/plain" }, body })
          .then(() => { window.simple = "sent"; }, () => { window.simple = "failed"; });
        fetch(http, { method: "POST", headers: { "content-type": "application/json" }, body })
          .then((r) => { window.preflighted = "status " + r.status; }, () => { window.preflighted = "blocked"; });
      };
    </script>"#;
    let (other, _page2) = page(intruder.to_owned()).await;
    let streams_before = server.hub.len();
    browser.goto(&other).await.expect("the other page");
    let ws = format!("ws://{}/v1/ws?token={token}", server.addr);
    let chat = format!("{base}/v1/chat/completions");
    browser.execute("window.tryAll(arguments[0], arguments[1]);", vec![json!(chat), json!(ws)]).await.expect("try");
    assert_eq!(until(&browser, "window.ws", Duration::from_secs(10)).await, json!("refused"));
    until(&browser, "window.simple", Duration::from_secs(10)).await;
    assert_eq!(until(&browser, "window.preflighted", Duration::from_secs(10)).await, json!("blocked"));
    assert_eq!(server.hub.len(), streams_before, "no run started from a page not allowed");
    let _ = browser.close().await;
    server.stop().await.expect("stops");
}
