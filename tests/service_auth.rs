//! Keys and stream tokens over real sockets (`src/http/edge/auth.rs`): with keys configured, every rule of who may do
//! what, each refusal in the OpenAI envelope (Anthropic's shape on `/v1/messages`); without keys, tokens issued and
//! accepted and nothing asked for. The binary itself refuses to serve a non-loopback address without keys unless told
//! `--insecure-no-auth`.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{KeySpec, Settings, budgets};
use agentmux::hub::HubConfig;
use common::doubles::SteppingClock;
use common::http::{PATIENCE, assert_envelope, create_with_key, header, read_events};
use common::process::ServerProcess;
use common::server::TestServer;
use common::wait::{eventually, eventually_blocking};
use serde_json::{Value, json};

const KEY: &str = "sk-test-key";

/// A server with `keys` (keys-file lines); streams still open at its stop end at once.
async fn server(keys: &[&str]) -> TestServer {
    server_with(keys, HubConfig::default()).await
}

/// [`server`] on a hub of this config (a clock of the test's own, say).
async fn server_with(keys: &[&str], mut config: HubConfig) -> TestServer {
    let keys: Vec<KeySpec> = keys.iter().map(|line| line.parse().expect("a keys-file line")).collect();
    config.limits.client_budgets = budgets(&keys, config.limits.streams_per_client, 0);
    let settings = Settings { api_keys: keys, shutdown_grace: Duration::ZERO, ..Settings::default() };
    TestServer::with(config, settings, Agents::builtin()).await
}

async fn keyed() -> TestServer {
    server(&[KEY, "sk-second"]).await
}

/// Sends `request` with `credential` as a bearer (none: no `Authorization`); status, JSON body, and the
/// `www-authenticate` header.
async fn send(request: reqwest::RequestBuilder, credential: Option<&str>) -> (u16, Value, Option<String>) {
    let request = match credential {
        Some(credential) => request.bearer_auth(credential),
        None => request,
    };
    let response = request.send().await.expect("a response");
    let status = response.status().as_u16();
    let challenge = response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, challenge)
}

/// Creates a stream with the key (and a token lifetime, if given): its id and tokens.
async fn create(client: &reqwest::Client, server: &TestServer, body: Value) -> (String, String, String) {
    let (status, created, _) = send(client.post(server.url("/v1/streams")).json(&body), Some(KEY)).await;
    assert_eq!(status, 201, "{created}");
    let field = |name: &str| created[name].as_str().unwrap_or_else(|| panic!("{name}: {created}")).to_owned();
    (field("id"), field("read_token"), field("write_token"))
}

fn append(client: &reqwest::Client, server: &TestServer, id: &str) -> reqwest::RequestBuilder {
    client
        .post(server.url(&format!("/v1/streams/{id}/messages")))
        .json(&json!({"type": "text", "props": {"content": "hi"}}))
}

#[tokio::test]
async fn with_keys_every_call_needs_a_key_or_the_right_token() {
    let server = keyed().await;
    let client = reqwest::Client::new();

    // No credential, or an unknown key: 401 with the envelope and a Bearer challenge, for every kind of call.
    for credential in [None, Some("sk-wrong")] {
        let code = if credential.is_none() { "missing_credentials" } else { "invalid_api_key" };
        for request in [
            client.post(server.url("/v1/streams")).json(&json!({})),
            client.get(server.url("/v1/models")),
            client
                .post(server.url("/v1/chat/completions"))
                .json(&json!({"model": "echo", "messages": [{"role": "user", "content": "x"}]})),
            client.post(server.url("/v1/threads")).json(&json!({})),
        ] {
            let (status, body, challenge) = send(request, credential).await;
            assert_eq!(status, 401, "{body}");
            assert_envelope(&body, None, code);
            assert_eq!(challenge.as_deref(), Some("Bearer"));
        }
    }
    let (status, _, _) = send(client.get(server.url("/healthz")), None).await;
    assert_eq!(status, 200, "/healthz is open");
    let (status, _, _) = send(client.get(server.url("/v1/models")), Some("sk-second")).await;
    assert_eq!(status, 200, "every configured key works");
    // `x-api-key`, as Anthropic's clients send a key.
    let status = |request: reqwest::RequestBuilder| async { request.send().await.expect("a response").status() };
    assert_eq!(status(client.get(server.url("/v1/models")).header("x-api-key", KEY)).await, 200);
    assert_eq!(status(client.get(server.url("/v1/models")).header("x-api-key", "sk-wrong")).await, 401);

    let (id, read, write) = create(&client, &server, json!({})).await;
    let (other, other_read, other_write) = create(&client, &server, json!({})).await;

    // Writing: the write token or a key; a read token is 403, another stream's token is 403.
    let (status, body, _) = send(append(&client, &server, &id), Some(&read)).await;
    assert_eq!(status, 403, "{body}");
    assert_envelope(&body, None, "permission_denied");
    let (status, body, _) = send(append(&client, &server, &id), Some(&other_write)).await;
    assert_eq!(status, 403, "{body}");
    assert_envelope(&body, None, "permission_denied");
    let (status, body, _) = send(append(&client, &server, &id), None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body, _) = send(append(&client, &server, &id), Some(&write)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = send(append(&client, &server, &id), Some(KEY)).await;
    assert_eq!(status, 200, "{body}");
    for action in ["end", "cancel"] {
        let url = server.url(&format!("/v1/streams/{other}/{action}"));
        let (status, body, _) = send(client.post(&url), Some(&other_read)).await;
        assert_eq!(status, 403, "{action} with a read token: {body}");
    }
    // A forged token: the right form, another signature.
    let forged = format!("{}{}", &write[..write.len() - 4], if write.ends_with("AAAA") { "BBBB" } else { "AAAA" });
    let (status, body, _) = send(append(&client, &server, &id), Some(&forged)).await;
    assert_eq!(status, 401, "{body}");
    assert_envelope(&body, None, "invalid_token");
    // A token is no key: it does not create streams.
    let (status, body, _) = send(client.post(server.url("/v1/streams")).json(&json!({})), Some(&write)).await;
    assert_eq!(status, 403, "{body}");

    // Reading: the read token as a bearer or as `?token=` (what EventSource can send), or a key.
    let (status, body, _) = send(client.get(server.url(&format!("/v1/streams/{id}"))), Some(&read)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = send(client.get(server.url(&format!("/v1/streams/{id}"))), Some(&other_read)).await;
    assert_eq!(status, 403, "{body}");
    let (status, body, _) = send(client.get(server.url(&format!("/v1/streams/{id}/events"))), None).await;
    assert_eq!(status, 401, "{body}");
    let (status, _, _) = send(client.post(server.url(&format!("/v1/streams/{id}/end"))), Some(&write)).await;
    assert_eq!(status, 200);
    let events_url = server.url(&format!("/v1/streams/{id}/events?token={}", urlencode(&read)));
    let response = client.get(&events_url).send().await.expect("events");
    assert_eq!(response.status(), 200);
    let events = read_events(response).await;
    assert_eq!(events.iter().filter(|e| e.json()["type"] == "text").count(), 2, "both appends");
    // `?token=` is for reads only.
    let url = server.url(&format!("/v1/streams/{other}/messages?token={}", urlencode(&other_write)));
    let (status, body, _) =
        send(client.post(&url).json(&json!({"type": "text", "props": {"content": "x"}})), None).await;
    assert_eq!(status, 401, "{body}");
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn a_token_with_a_lifetime_expires() {
    // Tokens expire by the hub's clock: this one is moved past the expiry rather than waited for.
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    let server = server_with(&[KEY, "sk-second"], HubConfig { clock: clock.clone(), ..HubConfig::default() }).await;
    let client = reqwest::Client::new();
    let (status, created, _) =
        send(client.post(server.url("/v1/streams")).json(&json!({"token_ttl": 1})), Some(KEY)).await;
    assert_eq!(status, 201, "{created}");
    assert!(created["token_expires_at"].as_u64().is_some(), "{created}");
    let (id, write) = (created["id"].as_str().expect("id"), created["write_token"].as_str().expect("token"));
    let (status, body, _) = send(append(&client, &server, id), Some(write)).await;
    assert_eq!(status, 200, "good before its expiry: {body}");
    clock.advance(2100);
    let (status, body, _) = send(append(&client, &server, id), Some(write)).await;
    assert_eq!(status, 401, "{body}");
    assert_envelope(&body, None, "token_expired");
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn a_chat_hands_out_a_read_token_and_never_the_stream_id_in_the_completion() {
    let server = keyed().await;
    let client = reqwest::Client::new();
    let request = json!({"model": "echo", "messages": [{"role": "user", "content": "hello"}], "stream": true});
    let response =
        client.post(server.url("/v1/chat/completions")).bearer_auth(KEY).json(&request).send().await.expect("chat");
    assert_eq!(response.status(), 200);
    let id = header(&response, "x-agentmux-stream-id").to_owned();
    let read = header(&response, "x-agentmux-read-token").to_owned();
    assert!(read.starts_with("amr."), "{read}");
    let chunks = read_events(response).await;
    let completion = chunks[0].json()["id"].as_str().expect("a completion id").to_owned();
    assert!(!completion.contains(&id), "the completion id {completion} hands out the stream id {id}");
    for chunk in &chunks {
        assert!(!chunk.data.contains(&id), "a chunk names the stream id: {}", chunk.data);
    }
    // The read token watches the run and nothing more.
    let (status, body, _) = send(client.get(server.url(&format!("/v1/streams/{id}"))), Some(&read)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = send(client.post(server.url(&format!("/v1/streams/{id}/cancel"))), Some(&read)).await;
    assert_eq!(status, 403, "{body}");
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn without_keys_tokens_are_issued_and_nothing_is_asked_for() {
    let server = server(&[]).await;
    let client = reqwest::Client::new();
    let (status, created, _) = send(client.post(server.url("/v1/streams")).json(&json!({})), None).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id");
    let write = created["write_token"].as_str().expect("a write token, issued anyway");
    let (status, body, _) = send(append(&client, &server, id), Some(write)).await;
    assert_eq!(status, 200, "a client written for keys runs unchanged: {body}");
    let (status, body, _) = send(append(&client, &server, id), None).await;
    assert_eq!(status, 200, "and the id alone still does: {body}");
    server.stop().await.expect("stops");
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends `op` and reads its reply (the stream's own frames, which carry `seq`, are skipped).
async fn op(ws: &mut Ws, op: Value) -> Value {
    use futures::{SinkExt, StreamExt};
    ws.send(tokio_tungstenite::tungstenite::Message::text(op.to_string())).await.expect("send");
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame in time");
        if let Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text))) = frame {
            let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
            if value.get("seq").is_none() {
                return value;
            }
        }
    }
}

/// A WebSocket takes `?token=` (browsers cannot set headers on it) and allows the ops its credential does:
/// a read token subscribes to its own stream only, and cannot publish or cancel over the socket.
#[tokio::test]
async fn a_websocket_does_what_its_token_grants() {
    let server = keyed().await;
    let client = reqwest::Client::new();
    let (id, read, _) = create(&client, &server, json!({})).await;
    let (other, _, _) = create(&client, &server, json!({})).await;
    for path in [format!("/v1/streams/{id}/ws"), "/v1/ws".to_owned()] {
        match tokio_tungstenite::connect_async(format!("ws://{}{path}", server.addr)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401),
            other => panic!("{path} without a credential is refused with 401: {:?}", other.map(|_| ())),
        }
    }
    let token = urlencode(&read);
    let url = format!("ws://{}/v1/streams/{id}/ws?token={token}", server.addr);
    let (mut one, _) = tokio_tungstenite::connect_async(url).await.expect("the read token opens it");
    let text = json!({"type": "text", "props": {"content": "x"}});
    let reply = op(&mut one, json!({"op": "publish", "stream": id, "message": text})).await;
    assert_eq!(reply["error"]["code"], "permission_denied", "{reply}");
    let reply = op(&mut one, json!({"op": "cancel", "stream": id})).await;
    assert_eq!(reply["error"]["code"], "permission_denied", "{reply}");

    let (mut many, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/v1/ws?token={token}", server.addr)).await.expect("open");
    let reply = op(&mut many, json!({"op": "subscribe", "stream": other})).await;
    assert_eq!(reply["error"]["code"], "permission_denied", "another stream: {reply}");
    let reply = op(&mut many, json!({"op": "subscribe", "stream": id})).await;
    assert_eq!(reply["subscribed"], true, "{reply}");
    server.stop().await.expect("stops");
}

/// Each key has its own budget: streams open and requests in flight, as its keys-file line says; past them,
/// 429 with `retry-after`, and another key is not affected.
#[tokio::test]
async fn limits_are_per_key() {
    let server = server(&["sk-small name=small streams=2 connections=3", KEY]).await;
    let client = reqwest::Client::new();
    let create = |key: &'static str| send(client.post(server.url("/v1/streams")).json(&json!({})), Some(key));
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, created, _) = create("sk-small").await;
        assert_eq!(status, 201, "{created}");
        ids.push(created["id"].as_str().expect("id").to_owned());
    }
    let (status, body, _) = create("sk-small").await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, None, "too_many_streams");
    let (status, body, _) = create(KEY).await;
    assert_eq!(status, 201, "another key has its own budget: {body}");

    // Requests in flight: two event streams held open, then a third request, is the limit of 3.
    let watch = |id: &str| client.get(server.url(&format!("/v1/streams/{id}/events"))).bearer_auth("sk-small").send();
    let first = watch(&ids[0]).await.expect("watch");
    let second = watch(&ids[1]).await.expect("watch");
    assert_eq!((first.status(), second.status()), (reqwest::StatusCode::OK, reqwest::StatusCode::OK));
    let third = watch(&ids[0]).await.expect("watch");
    assert_eq!(third.status(), 200, "the third of 3");
    let refused = client.get(server.url("/v1/models")).bearer_auth("sk-small").send().await.expect("models");
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: Value = refused.json().await.expect("json");
    assert_envelope(&body, None, "key_connections");
    let other = client.get(server.url("/v1/models")).bearer_auth(KEY).send().await.expect("models");
    assert_eq!(other.status(), 200, "the other key is not held up");
    drop(third);
    eventually("a slot to come back when a stream's reader leaves", Duration::from_secs(5), async || {
        let again = client.get(server.url("/v1/models")).bearer_auth("sk-small").send().await.expect("models");
        again.status() == 200
    })
    .await;
    drop((first, second));
    server.stop().await.expect("stops");
}

/// With keys, a thread belongs to the key that created it (ahead, or on first use by a turn): another key
/// gets 404 for every thread call, and its turns cannot reach the thread.
#[tokio::test]
async fn a_thread_belongs_to_the_key_that_made_it() {
    let server = server(&[KEY, "sk-other"]).await;
    let client = reqwest::Client::new();
    let made = client.post(server.url("/v1/threads")).bearer_auth(KEY).json(&json!({"id": "mine"})).send().await;
    assert_eq!(made.expect("create").status(), 201);
    let turn = |key: &'static str, thread: &'static str| {
        let body = json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}]});
        let request = client.post(server.url("/v1/chat/completions")).bearer_auth(key);
        request.header("x-agentmux-thread-id", thread).json(&body).send()
    };
    assert_eq!(turn(KEY, "mine").await.expect("turn").status(), 200);
    assert_eq!(turn(KEY, "made-by-a-turn").await.expect("turn").status(), 200, "created on first use");
    for thread in ["mine", "made-by-a-turn"] {
        for (method, path) in [
            (reqwest::Method::GET, format!("/v1/threads/{thread}")),
            (reqwest::Method::GET, format!("/v1/threads/{thread}/audit")),
            (reqwest::Method::DELETE, format!("/v1/threads/{thread}")),
        ] {
            let (status, body, _) = send(client.request(method.clone(), server.url(&path)), Some("sk-other")).await;
            assert_eq!(status, 404, "{method} {path} with another key: {body}");
            assert_envelope(&body, None, "thread_not_found");
        }
        let url = server.url(&format!("/v1/threads/{thread}/replay"));
        let (status, body, _) = send(client.post(url).json(&json!({"model": "echo"})), Some("sk-other")).await;
        assert_eq!(status, 404, "{body}");
        let (status, body, _) = send(client.get(server.url(&format!("/v1/threads/{thread}"))), Some(KEY)).await;
        assert_eq!(status, 200, "its own key still has it: {body}");
    }
    let response = turn("sk-other", "mine").await.expect("turn");
    assert_eq!(response.status(), 404, "another key's turn does not reach the thread");
    let audit: Value = client
        .get(server.url("/v1/threads/mine/audit"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("audit")
        .json()
        .await
        .expect("json");
    let decisions: Vec<&str> =
        audit["entries"].as_array().expect("entries").iter().filter_map(|e| e["decision"].as_str()).collect();
    assert_eq!(decisions, ["user_input", "answer", "run_end"], "its own turn only: {audit}");
    server.stop().await.expect("stops");
}

/// Runs the binary with `args` until it exits (it must, within 20 s): its status and stderr.
fn run_binary(args: &[&str]) -> (bool, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentmux"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start agentmux");
    eventually_blocking("agentmux to exit", Duration::from_secs(20), || child.try_wait().expect("wait").is_some());
    let output = child.wait_with_output().expect("output");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Without keys the service listens on loopback only: another address is refused at start, before anything
/// is bound (so this test binds nothing beyond loopback). Keys and `--insecure-no-auth` are taken.
#[test]
fn the_binary_refuses_to_serve_beyond_loopback_without_keys() {
    let (ok, stderr) = run_binary(&["serve", "--ephemeral", "--addr", "0.0.0.0:0"]);
    assert!(!ok, "refused: {stderr}");
    assert!(stderr.contains("--api-key") && stderr.contains("--insecure-no-auth"), "{stderr}");
    assert!(!stderr.contains("agentmux listening"), "{stderr}");
    let (ok, stderr) = run_binary(&["serve", "--ephemeral", "--api-key", "amr.looks-like-a-token"]);
    assert!(!ok && stderr.contains("stream tokens"), "{stderr}");

    let server = ServerProcess::spawn(&["--insecure-no-auth"]);
    assert!(!server.log.lock().expect("log").contains("--insecure-no-auth"), "on loopback, nothing to warn of");
    drop(server);
    let server = ServerProcess::spawn(&["--api-key", KEY]);
    let mut tcp = std::net::TcpStream::connect(&server.addr).expect("connect");
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nhost: agentmux\r\nconnection: close\r\n\r\n").expect("send");
    let mut reply = String::new();
    tcp.read_to_string(&mut reply).expect("read");
    assert!(reply.starts_with("HTTP/1.1 401"), "the key is asked for: {reply}");
}

/// Whether the store in `dir` has committed stream `id`'s end and thread `thread` with its owner (read from
/// its SQLite file beside the running server; not yet, when that cannot be read at this moment).
fn kept(dir: &std::path::Path, id: &str, thread: &str) -> bool {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let Ok(store) = rusqlite::Connection::open_with_flags(dir.join("agentmux.sqlite3"), flags) else { return false };
    let count = |sql: &str, id: &str| store.query_row(sql, [id], |row| row.get::<_, i64>(0)).unwrap_or(0);
    count("SELECT count(*) FROM streams WHERE id = ?1 AND outcome IS NOT NULL", id) == 1
        && count("SELECT count(*) FROM threads WHERE id = ?1 AND owner IS NOT NULL", thread) == 1
}

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The store keeps the secret tokens are signed with: a token issued before a restart still works after it;
/// and a thread's owner: another key still gets 404 for it.
#[tokio::test]
async fn tokens_outlive_a_restart_with_the_store() {
    let dir = std::env::temp_dir().join(format!("agentmux-auth-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data_dir = dir.to_str().expect("a UTF-8 path").to_owned();
    let args = ["--data-dir", data_dir.as_str(), "--api-key", KEY, "--api-key", "sk-other"];
    let client = reqwest::Client::new();
    let mut first = ServerProcess::spawn(&args);
    let created = create_with_key(&client, &first.base, KEY).await;
    let (id, read) = (created["id"].as_str().expect("id"), created["read_token"].as_str().expect("token"));
    let ended = client.post(first.url(&format!("/v1/streams/{id}/end"))).bearer_auth(KEY).send().await.expect("end");
    assert_eq!(ended.status(), 200);
    let thread = client.post(first.url("/v1/threads")).bearer_auth(KEY).json(&json!({"id": "kept"})).send().await;
    assert_eq!(thread.expect("thread").status(), 201);
    // Kept once the writer commits: ask the store's file until it has both (a flush is not reachable from
    // outside).
    eventually("the store to keep the ended stream and the thread", PATIENCE, async || kept(&dir, id, "kept")).await;
    first.kill();
    let second = ServerProcess::spawn(&args);
    let status = client.get(second.url(&format!("/v1/streams/{id}"))).bearer_auth(read).send().await.expect("get");
    assert_eq!(status.status(), 200, "the read token from before the restart");
    let mine = client.get(second.url("/v1/threads/kept")).bearer_auth(KEY).send().await.expect("thread");
    assert_eq!(mine.status(), 200, "the thread came back");
    let theirs = client.get(second.url("/v1/threads/kept")).bearer_auth("sk-other").send().await.expect("thread");
    assert_eq!(theirs.status(), 404, "and still belongs to its key");
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

/// On `/v1/messages` the auth guard's refusals, raised before any handler, come in Anthropic's shape (which
/// the Anthropic SDKs read) with the same statuses and headers; other routes keep the OpenAI envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_the_messages_endpoint_are_in_anthropic_s_shape() {
    let server = keyed().await;
    let client = reqwest::Client::new();
    let body = json!({"model": "echo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let (status, refused, challenge) = send(client.post(server.url("/v1/messages")).json(&body), None).await;
    assert_eq!((status, challenge.as_deref()), (401, Some("Bearer")), "{refused}");
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["type"], "authentication_error", "{refused}");
    assert_eq!(refused["error"]["details"]["error_code"], "missing_credentials", "{refused}");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{refused}");
    let (status, refused, _) = send(client.post(server.url("/v1/messages")).json(&body), Some("sk-unknown")).await;
    assert_eq!((status, &refused["error"]["type"]), (401, &json!("authentication_error")), "{refused}");
    // The same refusal elsewhere is OpenAI's.
    let (status, refused, _) = send(client.post(server.url("/v1/chat/completions")).json(&body), None).await;
    assert_eq!(status, 401);
    assert_eq!(refused["error"]["code"], "missing_credentials", "{refused}");
    assert!(refused.get("type").is_none(), "{refused}");
    server.stop().await.expect("stops");
}
