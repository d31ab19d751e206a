//! Budgets that count what a client holds (issue 42, items 2 and 3), against the binary over real sockets.
//!
//! A client is its API key or, without keys, its address: the tests reach the service on 127.0.0.1 from
//! several loopback addresses (127.0.0.1, .2, .3, ...), each another client. With `--max-streams 20` a
//! client's share is 2 streams held, open or ended until evicted: one that creates and ends streams keeps
//! going by giving up its own oldest ended ones, and never fills the hub for the others; one whose streams
//! are all open is refused `429 too_many_streams` with a `Retry-After`. Threads likewise: `--max-threads 20`
//! gives each client 2, and a third is `429 too_many_threads` with a `Retry-After` (its threads are not
//! evicted), while other clients still create theirs; a full service says which limit it hit, by its number.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::http::assert_envelope;
use common::process::ServerProcess;
use serde_json::{Value, json};

/// A client that reaches the service from `127.0.0.<host>`.
fn from_host(host: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)))
        .build()
        .expect("a client bound to a loopback address")
}

/// `POST url` with `body` (and `key` as a bearer, if any): the status, `Retry-After` and the JSON answer.
async fn post(client: &reqwest::Client, url: &str, key: Option<&str>, body: &Value) -> (u16, Option<u64>, Value) {
    let mut request = client.post(url).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
    let answer = response.json().await.unwrap_or(Value::Null);
    (status, retry_after, answer)
}

/// Creates a stream as `client` (with `key`): the answer's status, `Retry-After` and body.
async fn create(server: &ServerProcess, client: &reqwest::Client, key: Option<&str>) -> (u16, Option<u64>, Value) {
    post(client, &server.url("/v1/streams"), key, &json!({})).await
}

/// Creates a stream as `client` (with `key`) and ends it; its id.
async fn create_and_end(server: &ServerProcess, client: &reqwest::Client, key: Option<&str>) -> String {
    let (status, _, created) = create(server, client, key).await;
    assert_eq!(status, 201, "create: {created}");
    let id = created["id"].as_str().expect("an id").to_owned();
    let (status, _, ended) =
        post(client, &server.url(&format!("/v1/streams/{id}/end")), key, &json!({"status": "completed"})).await;
    assert_eq!(status, 200, "end: {ended}");
    id
}

/// `GET /v1/streams/{id}` as `client`: the status.
async fn status_of(server: &ServerProcess, client: &reqwest::Client, key: Option<&str>, id: &str) -> u16 {
    let mut request = client.get(server.url(&format!("/v1/streams/{id}")));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("GET the stream").status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_churning_streams_keeps_to_its_share_and_other_clients_still_create() {
    let server = ServerProcess::spawn(&["--max-streams", "20"]);
    let churner = from_host(1);

    // Thirty times its share, created and ended over one keep-alive connection: each one is made, and
    // what it gives up is its own oldest ended stream.
    let mut made = Vec::new();
    for _ in 0..60 {
        made.push(create_and_end(&server, &churner, None).await);
    }
    assert_eq!(status_of(&server, &churner, None, &made[0]).await, 404, "its oldest ended stream was evicted");
    assert_eq!(status_of(&server, &churner, None, &made[57]).await, 404, "its third newest too");
    for id in &made[58..] {
        assert_eq!(status_of(&server, &churner, None, id).await, 200, "its share of 2 is still readable");
    }

    // Another address is not affected.
    let other = from_host(2);
    let (status, _, created) = create(&server, &other, None).await;
    assert_eq!(status, 201, "a second client creates while the first churns: {created}");

    // Its share open: the oldest ended goes for each, and a third open one is refused, saying when.
    for _ in 0..2 {
        let (status, _, created) = create(&server, &churner, None).await;
        assert_eq!(status, 201, "{created}");
    }
    let (status, retry_after, refused) = create(&server, &churner, None).await;
    assert_eq!(status, 429, "every held stream open: {refused}");
    assert_envelope(&refused, None, "too_many_streams");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("limit of 2 streams"), "the message names the limit: {message}");
    assert_eq!(retry_after, Some(600), "room comes by the idle timeout (10 minutes) at the latest");

    // Nine more addresses fill the hub with ended streams, 2 each: with the churner's 2 and the second
    // client's 1 that is one more than the limit of 20, and a twelfth address comes after them; each still
    // gets its place, taken from the oldest ended stream, whoever holds it.
    for host in 3..=11 {
        let client = from_host(host);
        for _ in 0..2 {
            create_and_end(&server, &client, None).await;
        }
    }
    let (status, _, created) = create(&server, &from_host(12), None).await;
    assert_eq!(status, 201, "a hub full of ended streams makes room: {created}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_churning_streams_does_not_fill_the_service_for_another_key() {
    let dir = std::env::temp_dir().join(format!("agentmux-budgets-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let keys = dir.join("keys");
    std::fs::write(&keys, "sk-budget-a name=a streams=3\nsk-budget-b name=b\n").expect("write the keys file");
    let server = ServerProcess::spawn(&["--max-streams", "20", "--api-keys-file", keys.to_str().expect("utf-8")]);
    let client = reqwest::Client::new();

    let mut made = Vec::new();
    for _ in 0..40 {
        made.push(create_and_end(&server, &client, Some("sk-budget-a")).await);
    }
    assert_eq!(status_of(&server, &client, Some("sk-budget-a"), &made[36]).await, 404, "its oldest evicted");
    assert_eq!(status_of(&server, &client, Some("sk-budget-a"), &made[37]).await, 200, "its own share is 3");

    let (status, _, created) = create(&server, &client, Some("sk-budget-b")).await;
    assert_eq!(status, 201, "the second key creates: {created}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_at_its_thread_share_waits_and_other_clients_still_create_threads() {
    let server = ServerProcess::spawn(&["--max-threads", "20"]);
    let first = from_host(1);
    let threads = server.url("/v1/threads");
    for _ in 0..2 {
        let (status, _, created) = post(&first, &threads, None, &json!({})).await;
        assert_eq!(status, 201, "{created}");
    }
    let (status, retry_after, refused) = post(&first, &threads, None, &json!({})).await;
    assert_eq!(status, 429, "a third thread over a share of 2: {refused}");
    assert_envelope(&refused, None, "too_many_threads");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("limit of 2 threads"), "the message names the limit: {message}");
    let retry_after = retry_after.expect("a Retry-After");
    assert!((3500..=3600).contains(&retry_after), "its first thread expires after the TTL (1 h): {retry_after}");

    // A turn on a new thread is refused the same way, before anything runs.
    let chat = json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}]});
    let response = first
        .post(server.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", "a-new-one")
        .json(&chat)
        .send()
        .await
        .expect("a turn");
    assert_eq!(response.status(), 429);
    assert!(response.headers().get("retry-after").is_some(), "with a Retry-After");

    // Another client is not affected, up to the service's own limit, which a refusal names with its number.
    let mut created = 0;
    for host in 2..=10 {
        let client = from_host(host);
        for _ in 0..2 {
            let (status, _, answer) = post(&client, &threads, None, &json!({})).await;
            assert_eq!(status, 201, "client {host}: {answer}");
            created += 1;
        }
    }
    assert_eq!(created, 18, "2 + 18: the service keeps its 20");
    let (status, retry_after, full) = post(&from_host(11), &threads, None, &json!({})).await;
    assert_eq!(status, 503, "{full}");
    assert_envelope(&full, None, "capacity");
    let message = full["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("limit of 20 threads"), "the message names the limit, by its number: {message}");
    assert!(retry_after.is_some_and(|s| s > 0), "a full service says when room is expected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_kept_across_a_restart_count_against_their_client_again() {
    let dir = std::env::temp_dir().join(format!("agentmux-budgets-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.to_str().expect("utf-8").to_owned();
    let args = ["--max-streams", "20", "--data-dir", data.as_str()];
    let client = from_host(1);
    let mut server = ServerProcess::spawn(&args);
    let made = [create_and_end(&server, &client, None).await, create_and_end(&server, &client, None).await];
    server.terminate();
    let (_, clean) = server.wait_exit(std::time::Duration::from_secs(30));
    assert!(clean, "a clean stop");

    // Its two ended streams come back, held by it: one more gives up the oldest of them.
    let server = ServerProcess::spawn(&args);
    let client = from_host(1);
    for id in &made {
        assert_eq!(status_of(&server, &client, None, id).await, 200, "kept across the restart");
    }
    let (status, _, created) = create(&server, &client, None).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(status_of(&server, &client, None, &made[0]).await, 404, "its oldest, evicted for the new one");
    assert_eq!(status_of(&server, &client, None, &made[1]).await, 200, "the other is still its");
    let (status, _, created) = create(&server, &from_host(2), None).await;
    assert_eq!(status, 201, "another client is not affected: {created}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
