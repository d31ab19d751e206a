//! What browsers may do, over real sockets (`src/http/edge/browser.rs`), sending the headers a browser sends: a
//! page from an origin not listed cannot change anything or open a WebSocket; a body that is not JSON is 415
//! (a page could send it without a preflight); listed origins get CORS, preflights included; `*` lets any
//! page read but not write; the reconnection hint goes on CUI event streams only.

mod common;

use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{Origins, Settings};
use agentmux::hub::HubConfig;
use common::http::{assert_envelope, read_body};
use common::server::TestServer;
use serde_json::{Value, json};

const APP: &str = "https://app.example.com";
const EVIL: &str = "https://evil.example.net";

async fn server(origins: &[&str]) -> TestServer {
    let origins: Vec<String> = origins.iter().map(|o| o.to_string()).collect();
    let settings = Settings {
        cors_origins: Origins::new(&origins).expect("valid origins"),
        shutdown_grace: Duration::ZERO,
        ..Settings::default()
    };
    TestServer::with(HubConfig::default(), settings, Agents::builtin()).await
}

fn chat_body() -> Value {
    json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
}

async fn status_and_json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_page_from_another_origin_cannot_start_runs_or_write() {
    let server = server(&[]).await;
    let client = reqwest::Client::new();
    // What a page can send without a preflight: a text/plain body.
    let text_plain = |origin: Option<&str>| {
        let request = client.post(server.url("/v1/chat/completions")).header("content-type", "text/plain");
        let request = match origin {
            Some(origin) => request.header("origin", origin),
            None => request,
        };
        request.body(chat_body().to_string()).send()
    };
    let (status, body) = status_and_json(text_plain(Some(EVIL)).await.expect("send")).await;
    assert_eq!(status, 403, "{body}");
    assert_envelope(&body, None, "origin_not_allowed");
    assert!(server.hub.is_empty(), "no run started");
    // The same body without an Origin (not a browser) still needs to say it is JSON.
    let (status, body) = status_and_json(text_plain(None).await.expect("send")).await;
    assert_eq!(status, 415, "{body}");
    assert_envelope(&body, None, "unsupported_media_type");
    for form in ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let response =
            client.post(server.url("/v1/streams")).header("content-type", form).body("{}").send().await.expect("send");
        assert_eq!(response.status(), 415, "{form}");
    }
    // JSON, NDJSON where the endpoint takes it, and an empty body are fine.
    let response = client.post(server.url("/v1/chat/completions")).json(&chat_body()).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let (status, created) = status_and_json(client.post(server.url("/v1/streams")).send().await.expect("send")).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id");
    let ndjson = client
        .post(server.url(&format!("/v1/streams/{id}/messages")))
        .header("content-type", "application/x-ndjson; charset=utf-8")
        .body("{\"type\":\"text\",\"props\":{\"content\":\"a\"}}\n")
        .send()
        .await
        .expect("send");
    assert_eq!(ndjson.status(), 200);
    // Ending a stream from another origin, even without a body, is refused; reading is not.
    let end = server.url(&format!("/v1/streams/{id}/end"));
    let response = client.post(&end).header("origin", EVIL).send().await.expect("send");
    assert_eq!(response.status(), 403);
    let response = client.get(server.url(&format!("/v1/streams/{id}"))).header("origin", EVIL).send().await;
    assert_eq!(response.expect("send").status(), 200, "reads are not refused (CORS decides who sees them)");
    // A page the service serves itself is same-origin.
    let own = format!("http://{}", server.addr);
    let response = client.post(&end).header("origin", &own).send().await.expect("send");
    assert_eq!(response.status(), 200);
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn a_websocket_from_an_origin_not_allowed_is_refused() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let server = server(&[APP, "*"]).await;
    for (origin, allowed) in [(EVIL, false), (APP, true)] {
        let mut request = format!("ws://{}/v1/ws", server.addr).into_client_request().expect("request");
        request.headers_mut().insert("origin", origin.parse().expect("header"));
        match tokio_tungstenite::connect_async(request).await {
            Ok(_) => assert!(allowed, "{origin} may not open a WebSocket, `*` notwithstanding"),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert!(!allowed, "{origin}: {}", response.status());
                assert_eq!(response.status(), 403);
            }
            Err(other) => panic!("{origin}: {other}"),
        }
    }
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn listed_origins_get_cors_and_a_star_reads_only() {
    let server = server(&[APP, "*"]).await;
    let client = reqwest::Client::new();
    // The preflight of a chat a page sends with a key.
    let preflight = client
        .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
        .header("origin", APP)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type, x-stainless-os")
        .send()
        .await
        .expect("preflight");
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let header = |r: &reqwest::Response, name: &str| {
        r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase()
    };
    assert_eq!(header(&preflight, "access-control-allow-origin"), APP);
    assert!(header(&preflight, "access-control-allow-methods").contains("post"));
    assert!(header(&preflight, "access-control-allow-headers").contains("authorization"));
    // The chat itself: its stream id and read token are readable by the page.
    let response = client
        .post(server.url("/v1/chat/completions"))
        .header("origin", APP)
        .json(&json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .expect("chat");
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "access-control-allow-origin"), APP);
    let exposed = header(&response, "access-control-expose-headers");
    assert!(exposed.contains("x-agentmux-stream-id") && exposed.contains("x-agentmux-read-token"), "{exposed}");
    let id = header(&response, "x-agentmux-stream-id");
    let chat = read_body(response).await;
    assert!(!chat.starts_with(b"retry:"), "an OpenAI stream carries only what OpenAI sends");

    // `*`: any page reads, with the reconnection hint on CUI events only.
    let events = client.get(server.url(&format!("/v1/streams/{id}/events"))).header("origin", EVIL).send().await;
    let events = events.expect("events");
    assert_eq!(header(&events, "access-control-allow-origin"), EVIL);
    // The epoch a resuming page compares is readable by it.
    assert_eq!(header(&events, "x-agentmux-epoch").len(), 16);
    assert!(header(&events, "access-control-expose-headers").contains("x-agentmux-epoch"));
    assert!(read_body(events).await.starts_with(b"retry: 2000\n\n"));
    let openai = client.get(server.url(&format!("/v1/streams/{id}/events?format=openai"))).send().await;
    assert!(!read_body(openai.expect("events")).await.starts_with(b"retry:"));
    // ... but its preflight for a write gets no CORS, and the write itself is refused.
    let preflight = client
        .request(reqwest::Method::OPTIONS, server.url("/v1/streams"))
        .header("origin", EVIL)
        .header("access-control-request-method", "POST")
        .send()
        .await
        .expect("preflight");
    assert_eq!(header(&preflight, "access-control-allow-origin"), "");
    let write = client.post(server.url("/v1/streams")).header("origin", EVIL).send().await.expect("write");
    assert_eq!(write.status(), 403);
    server.stop().await.expect("stops");
}

#[test]
fn origins_that_are_not_origins_are_refused() {
    for bad in ["app.example.com", "https://app.example.com/path", "javascript:alert(1)"] {
        assert!(Origins::new(&[bad.to_owned()]).is_err(), "{bad}");
    }
}

/// DNS rebinding: a page whose own name resolves to 127.0.0.1 is, to its browser, the service's own origin.
/// Without keys the service answers a browser's requests for loopback names only, so that page's requests
/// (its `Host` is its name; a same-origin `GET` carries `Sec-Fetch-Site` rather than `Origin`) are refused
/// 421 before anything happens, reads included; a client that is no browser is served whatever its `Host`;
/// with a key, any name is served to the key.
#[tokio::test]
async fn a_rebound_name_reaches_nothing_without_keys() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let port = server.addr.port();
    let rebound = format!("rebind.attacker.example:{port}");
    let origin = format!("http://{rebound}");
    let writes = client.post(server.url("/v1/streams")).header("origin", &origin);
    let reads = client.get(server.url("/v1/streams")).header("sec-fetch-site", "same-origin");
    for (what, request) in [("a POST with Origin", writes), ("a same-origin GET", reads)] {
        let answer = request.header("host", &rebound).send().await.expect("an answer");
        assert_eq!(answer.status(), 421, "{what}");
        let body: serde_json::Value = answer.json().await.expect("the envelope");
        assert_eq!(body["error"]["code"], "misdirected_host", "{body}");
    }
    assert!(server.hub.open_streams().is_empty(), "nothing was created");
    // The same page on a loopback name is the service's own, and may write.
    let own = client
        .post(server.url("/v1/streams"))
        .header("host", format!("localhost:{port}"))
        .header("origin", format!("http://localhost:{port}"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(own.status(), 201);
    // A client that is no browser (a proxy on this machine, an SDK) names whatever host it likes.
    let proxied = client.get(server.url("/v1/streams")).header("host", "agentmux.internal").send().await;
    assert_eq!(proxied.expect("an answer").status(), 200);

    let keyed = Settings { api_keys: vec![agentmux::http::KeySpec::from("sk-browser")], ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), keyed, Agents::builtin()).await;
    let answer = client
        .post(server.url("/v1/streams"))
        .header("host", format!("agentmux.example.com:{}", server.addr.port()))
        .bearer_auth("sk-browser")
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 201, "with keys, a key is what counts, not the name");

    // A name the operator gave the keyless service (`--public-host`, a local reverse proxy's) is its own.
    let origins = agentmux::http::Origins::default().with_public_hosts(&["agents.internal".into()]).expect("a name");
    let named = Settings { cors_origins: origins, ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), named, Agents::builtin()).await;
    let host = format!("agents.internal:{}", server.addr.port());
    let page = |host: &str| {
        let request = client.post(server.url("/v1/streams")).header("host", host);
        request.header("origin", format!("http://{host}")).send()
    };
    assert_eq!(page(&host).await.expect("an answer").status(), 201, "a page on the public name may write");
    let rebound = format!("rebind.attacker.example:{}", server.addr.port());
    assert_eq!(page(&rebound).await.expect("an answer").status(), 421, "other names are still refused");
}
