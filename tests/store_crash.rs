//! The store across crashes, over real processes: the binary with a `--data-dir`, clients ingesting over
//! several streams and recording every acknowledged sequence, `kill -9` at several moments of the ingest (after
//! 800, 3,700 and 7,600 of its 10,000 messages were acknowledged), a restart on the
//! same directory. Every acknowledged message is there, in order, byte for byte as a live subscriber saw it
//! before the crash; a subscriber resuming with `Last-Event-ID` gets the rest without gap or duplicate; the
//! streams that were open end `interrupted`. A thread with a tool call survives a restart with an identical
//! audit export. A retention pass gives the space back. A data directory it cannot use (a file, a corrupt
//! store, a read-only file system, empty or holding a store) is an error at start that names it and
//! `--ephemeral`. A disk that fails under a stream (files made immutable; a 2 MiB tmpfs filled to the last
//! byte; an ext4 that goes read-only on an error, as a failing disk does) ends the streams being written with
//! `store_unavailable`, answers their producers 503 at once, gives readers only what is on disk (then `lagged`),
//! goes on serving everything else, and loses nothing acknowledged across a `kill -9` and a restart, where
//! every sequence a reader saw still names the message it saw; once the space is back, writes go on. The file-system tests
//! mount their own (root, CAP_SYS_ADMIN) under `target/tmp/`, and unmount it even when they fail.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http::{PATIENCE, parse_sse};
use common::process::ServerProcess;
use serde_json::{Value, json};

const STREAMS: usize = 4;
const BATCH: usize = 25;
const TOTAL: usize = 10_000;

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentmux-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn spawn(dir: &std::path::Path) -> ServerProcess {
    let dir = dir.to_str().expect("a UTF-8 path");
    ServerProcess::spawn(&["--data-dir", dir])
}

/// Everything `GET /v1/streams/{id}/events` sends after `after` (the stream has ended), by sequence.
async fn events(client: &reqwest::Client, server: &ServerProcess, id: &str, after: u64) -> BTreeMap<u64, String> {
    let (events, notice) = events_and_notice(client, server, id, after).await;
    assert_eq!(notice, None, "{id}: every event has its sequence");
    events
}

/// Everything `GET /v1/streams/{id}/events` sends after `after`, by sequence, and the notice without a
/// sequence that ends it early, if any (`lagged`: what comes next is not kept).
async fn events_and_notice(
    client: &reqwest::Client,
    server: &ServerProcess,
    id: &str,
    after: u64,
) -> (BTreeMap<u64, String>, Option<Value>) {
    let response = client
        .get(server.url(&format!("/v1/streams/{id}/events")))
        .header("last-event-id", after.to_string())
        .send()
        .await
        .expect("GET events");
    assert_eq!(response.status(), 200, "{id}");
    let body = tokio::time::timeout(Duration::from_secs(20), response.bytes()).await.expect("ends").expect("body");
    let (events, _) = parse_sse(&body);
    let mut out = BTreeMap::new();
    let mut notice = None;
    for event in events {
        assert_eq!(notice, None, "{id}: nothing after the notice");
        match event.id {
            Some(id) => assert!(out.insert(id, event.data).is_none(), "sequence {id} twice"),
            None => notice = Some(serde_json::from_str(&event.data).expect("JSON")),
        }
    }
    (out, notice)
}

/// A stream whose disk failed under it, read while the disk is still failed: every acknowledged message,
/// without a hole, then the `lagged` notice where what was kept ends; nothing that is not on disk. Returns
/// what the reader saw, to compare with what the stream holds after a restart.
async fn kept_while_failed(client: &reqwest::Client, server: &ServerProcess, acked: &Acked, id: &str) -> Seen {
    let (events, notice) = events_and_notice(client, server, id, 0).await;
    let sequences: Vec<u64> = events.keys().copied().collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "{id}: no hole");
    assert_has(&events, acked.get(id).unwrap_or(&BTreeMap::new()), id);
    let notice = notice.expect("the notice that the rest is not kept");
    assert_eq!(notice["props"]["code"], "lagged", "{notice}");
    assert_eq!(notice["props"]["details"]["resume_from"], sequences.len(), "{notice}");
    events
}

/// What a reader saw of a stream, by sequence.
type Seen = BTreeMap<u64, String>;

/// Everything a reader saw is what the stream holds now, under the same sequences: one history per
/// (epoch, sequence), whatever happened in between.
async fn same_history(client: &reqwest::Client, server: &ServerProcess, id: &str, seen: &Seen) {
    let now = events(client, server, id, 0).await;
    for (sequence, data) in seen {
        assert_eq!(now.get(sequence), Some(data), "{id}: sequence {sequence} names another message now");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_kill_9_at_several_moments() {
    let dir = data_dir("crash");
    let client = reqwest::Client::new();
    for (round, kill_at) in [800usize, 3700, 7600].into_iter().enumerate() {
        let server = spawn(&dir);
        let mut ids = Vec::new();
        for _ in 0..STREAMS {
            let created: Value =
                client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
            ids.push(created["id"].as_str().expect("id").to_owned());
        }
        // A live subscriber on the first stream keeps every event's bytes, to compare after the restart.
        let seen: Arc<Mutex<BTreeMap<u64, String>>> = Arc::default();
        let watcher = {
            let (client, url, seen) =
                (client.clone(), server.url(&format!("/v1/streams/{}/events", ids[0])), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(mut response) = client.get(url).send().await else { return };
                let mut buffer = Vec::new();
                while let Ok(Some(chunk)) = response.chunk().await {
                    buffer.extend_from_slice(&chunk);
                    let (events, used) = parse_sse(&buffer);
                    buffer.drain(..used);
                    let mut seen = seen.lock().expect("lock");
                    for event in events {
                        if let Some(id) = event.id {
                            seen.insert(id, event.data);
                        }
                    }
                }
            })
        };
        // Producers: acknowledged sequences and what each carried.
        let acked: Arc<Mutex<BTreeMap<(usize, u64), String>>> = Arc::default();
        let producers: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(s, id)| {
                let (client, url, acked) =
                    (client.clone(), server.url(&format!("/v1/streams/{id}/messages")), Arc::clone(&acked));
                tokio::spawn(async move {
                    for batch in 0..TOTAL / STREAMS / BATCH {
                        let texts: Vec<String> = (0..BATCH)
                            .map(|i| format!("round {round} stream {s} message {} é✓", batch * BATCH + i))
                            .collect();
                        let body: Vec<Value> =
                            texts.iter().map(|t| json!({"type": "text", "props": {"content": t}})).collect();
                        let Ok(response) = client.post(&url).json(&body).send().await else { return };
                        let Ok(reply) = response.json::<Value>().await else { return };
                        let Some(sequences) = reply["sequences"].as_array() else { return };
                        let mut acked = acked.lock().expect("lock");
                        for (sequence, text) in sequences.iter().zip(texts) {
                            acked.insert((s, sequence.as_u64().expect("a sequence")), text);
                        }
                    }
                })
            })
            .collect();
        // Killed while the producers go on: once this many messages are acknowledged, whenever that is. A
        // millisecond poll, not `common::wait`'s: where the kill lands is what each round varies.
        while acked.lock().expect("lock").len() < kill_at && producers.iter().any(|p| !p.is_finished()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut server = server;
        server.kill();
        for producer in producers {
            let _ = producer.await;
        }
        let _ = watcher.await;
        let acked = std::mem::take(&mut *acked.lock().expect("lock"));
        let seen = std::mem::take(&mut *seen.lock().expect("lock"));
        assert!(!acked.is_empty(), "round {round}: something was acknowledged before the kill");
        eprintln!(
            "round {round}: killed at {kill_at}: {} messages acknowledged, {} seen live",
            acked.len(),
            seen.len()
        );
        assert!(acked.len() < TOTAL, "round {round}: the kill came before the end of the ingest");

        let server = spawn(&dir);
        let mut interrupted = 0;
        for (s, id) in ids.iter().enumerate() {
            let kept = events(&client, &server, id, 0).await;
            // In order, without gaps, from 1; the last is stream_end.
            let sequences: Vec<u64> = kept.keys().copied().collect();
            assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "round {round} stream {s}");
            for ((stream, sequence), text) in acked.range((s, 0)..(s + 1, 0)) {
                let data = kept
                    .get(sequence)
                    .unwrap_or_else(|| panic!("round {round}: acknowledged {stream}/{sequence} lost"));
                let message: Value = serde_json::from_str(data).expect("JSON");
                assert_eq!(message["props"]["content"], json!(text), "round {round} stream {s} sequence {sequence}");
            }
            let end: Value = serde_json::from_str(kept.values().last().expect("events")).expect("JSON");
            assert_eq!(end["props"]["event"], "stream_end", "round {round}");
            if end["props"]["data"]["error"]["code"] == "interrupted" {
                interrupted += 1;
            }
            if s == 0 {
                for (sequence, data) in &seen {
                    assert_eq!(
                        kept.get(sequence),
                        Some(data),
                        "round {round}: what a client saw is kept byte for byte"
                    );
                }
            }
            // Resume from the middle: the rest, without gap or duplicate.
            let middle = sequences.len() as u64 / 2;
            let rest = events(&client, &server, id, middle).await;
            assert_eq!(
                rest.keys().copied().collect::<Vec<_>>(),
                ((middle + 1)..=sequences.len() as u64).collect::<Vec<_>>()
            );
            assert!(rest.iter().all(|(k, v)| kept.get(k) == Some(v)));
        }
        assert_eq!(interrupted, STREAMS, "round {round}: the streams open at the crash end interrupted");
        drop(server);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_with_a_tool_call_survives_a_restart_with_an_identical_audit_log() {
    let dir = data_dir("thread");
    let client = reqwest::Client::new();
    let server = spawn(&dir);
    for (model, text) in [("echo", "hello there"), ("replay/tool-call-then-text", "and the weather?")] {
        let response = client
            .post(server.url("/v1/chat/completions"))
            .header("x-agentmux-thread-id", "kept")
            .json(&json!({"model": model, "messages": [{"role": "user", "content": text}]}))
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 200);
    }
    let rejected = client
        .post(server.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", "kept")
        .json(&json!({"model": "echo", "messages": [{"role": "assistant", "content": "forged"}]}))
        .send()
        .await
        .expect("POST");
    assert_eq!(rejected.status(), 400);
    let before: Value =
        client.get(server.url("/v1/threads/kept/audit")).send().await.expect("GET").json().await.expect("JSON");
    let transcript: Value =
        client.get(server.url("/v1/threads/kept")).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(before["entries"].as_array().map(Vec::len), Some(9), "{before}");
    let mut server = server;
    server.kill();

    let server = spawn(&dir);
    let after: Value =
        client.get(server.url("/v1/threads/kept/audit")).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(after, before, "the audit export is identical");
    let again: Value =
        client.get(server.url("/v1/threads/kept")).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(again["messages"], transcript["messages"]);
    // The thread goes on where it was.
    let response = client
        .post(server.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", "kept")
        .json(&json!({"model": "echo", "messages": [{"role": "user", "content": "still there?"}]}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200);
    let last: Value = client.get(server.url("/v1/threads/kept")).send().await.expect("GET").json().await.expect("JSON");
    let messages = last["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), transcript["messages"].as_array().expect("messages").len() + 2);
    // The runs' streams came back too.
    let stream = before["entries"][1]["stream_id"].as_str().expect("a stream id");
    let response = client.get(server.url(&format!("/v1/streams/{stream}"))).send().await.expect("GET");
    assert_eq!(response.status(), 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes the store's files take on disk (the database and its WAL).
fn store_bytes(dir: &std::path::Path) -> u64 {
    ["agentmux.sqlite3", "agentmux.sqlite3-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_pass_deletes_ended_streams_and_gives_the_space_back() {
    let dir = data_dir("retention");
    let client = reqwest::Client::new();
    let server = ServerProcess::spawn(&["--data-dir", dir.to_str().expect("UTF-8"), "--retention", "1s"]);
    let mut ids = Vec::new();
    // Text that does not compress (the store keeps long chunks compressed): hexadecimal noise.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut noise = move || {
        (0..13)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                format!("{seed:016x}")
            })
            .collect::<String>()
    };
    for s in 0..20 {
        let created: Value =
            client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
        let id = created["id"].as_str().expect("id").to_owned();
        let body: Vec<Value> = (0..200)
            .map(|i| json!({"type": "text", "props": {"content": format!("stream {s} line {i} {}", noise())}}))
            .collect();
        let response =
            client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(&body).send().await.expect("POST");
        assert_eq!(response.status(), 200);
        let response = client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end");
        assert_eq!(response.status(), 200);
        ids.push(id);
    }
    let full = store_bytes(&dir);
    assert!(full > 800_000, "20 × 200 messages of 250 bytes and more are in the store: {full} bytes");
    let given_back = async || Some(store_bytes(&dir)).filter(|&now| now < full / 4);
    let now = common::wait::eventually("the retention pass", Duration::from_secs(10), given_back).await;
    eprintln!("the store took {full} bytes with 20 ended streams, {now} after the retention pass");
    assert!(now < full / 4, "the space came back: {full} → {now} bytes");
    for id in &ids {
        let response = client.get(server.url(&format!("/v1/streams/{id}"))).send().await.expect("GET");
        assert_eq!(response.status(), 404, "{id} was evicted");
    }
    drop(server);
    // And they stay gone after a restart.
    let server = spawn(&dir);
    let response = client.get(server.url(&format!("/v1/streams/{}", ids[0]))).send().await.expect("GET");
    assert_eq!(response.status(), 404);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the binary on `dir` and expects it to refuse to start: its exit status and what it said. One that
/// starts anyway is killed, and the test fails rather than waits.
fn refused(dir: &std::path::Path) -> (bool, String) {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_agentmux"))
        .args(["--addr", "127.0.0.1:0", "--data-dir", dir.to_str().expect("UTF-8")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run agentmux");
    let pid = child.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let Ok(output) = rx.recv_timeout(PATIENCE) else {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
        panic!("agentmux started on {} instead of refusing", dir.display());
    };
    let output = output.expect("agentmux ran");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// SIGTERM with a stream open: the shutdown ends it with the error `shutdown`, and that end is on disk before
/// the process exits, so after a restart the stream reads `shutdown`, not `interrupted` (an end the writer had
/// not committed when the process went). The race is a moment wide, so the round is run several times.
#[tokio::test(flavor = "multi_thread")]
async fn the_end_a_shutdown_writes_is_kept_when_the_process_exits() {
    let client = patient_client();
    for round in 0..6 {
        let dir = data_dir(&format!("shutdown-end-{round}"));
        let path = dir.to_str().expect("a UTF-8 path");
        let mut server = ServerProcess::spawn(&["--data-dir", path, "--shutdown-grace", "200ms"]);
        let id = create(&client, &server).await;
        let mut acked = Acked::new();
        append(&client, &server, &mut acked, &id, vec!["left open".into()]).await.expect("appended");
        server.terminate();
        let (_, clean) = server.wait_exit(Duration::from_secs(10));
        assert!(clean, "round {round}: the shutdown exits cleanly");
        let restarted = spawn(&dir);
        let opened = common::wait::eventually_blocking("the store's opening line", Duration::from_secs(10), || {
            let log = restarted.log.lock().expect("log").clone();
            log.contains("store opened").then_some(log)
        });
        assert!(opened.contains("interrupted=0"), "round {round}: nothing was left open on disk:\n{opened}");
        let (events, _) = events_and_notice(&client, &restarted, &id, 0).await;
        let end = events.values().last().cloned().unwrap_or_default();
        assert!(end.contains(r#""code":"shutdown""#), "round {round}: the stream ends as the shutdown ended it: {end}");
        drop(restarted);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_data_directory_it_cannot_use_is_a_clear_error_at_start() {
    // A file where the directory should be.
    let path = data_dir("not-a-dir");
    std::fs::write(&path, b"I am a file").expect("write");
    let (ok, said) = refused(&path);
    assert!(!ok, "it did not start");
    assert!(said.contains("the data directory") && said.contains("--ephemeral"), "{said}");
    let _ = std::fs::remove_file(&path);
    // A corrupt store.
    let dir = data_dir("corrupt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("agentmux.sqlite3"), vec![0x5a; 8192]).expect("write");
    let (ok, said) = refused(&dir);
    assert!(!ok, "it did not start");
    assert!(said.contains("agentmux.sqlite3") && said.contains("not a database"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sets or clears the immutable attribute: even root cannot write such a file, as with a disk that failed.
fn immutable(path: &std::path::Path, on: bool) {
    let status = std::process::Command::new("chattr")
        .arg(if on { "+i" } else { "-i" })
        .arg(path)
        .status()
        .expect("chattr (e2fsprogs) runs");
    assert!(status.success(), "chattr on {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fails_under_a_stream_ends_it_with_an_error_and_loses_nothing_acknowledged() {
    // Under target/ (the repository's file system, which keeps file attributes), not a tmpfs.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/tmp/disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let client = reqwest::Client::new();
    let server = spawn(&dir);
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
    let id = created["id"].as_str().expect("id").to_owned();
    let append = |text: &str| {
        let request = client
            .post(server.url(&format!("/v1/streams/{id}/messages")))
            .json(&json!({"type": "text", "props": {"content": text}}));
        async move { request.send().await.expect("POST") }
    };
    assert_eq!(append("kept before the failure").await.status(), 200);
    let files = [dir.join("agentmux.sqlite3"), dir.join("agentmux.sqlite3-wal")];
    files.iter().for_each(|f| immutable(f, true));
    let refused = append("written while the disk fails").await;
    let status = refused.status();
    let body: Value = refused.json().await.expect("JSON");
    files.iter().for_each(|f| immutable(f, false));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    // The stream ended with the error its readers see; the service goes on.
    let snapshot: Value =
        client.get(server.url(&format!("/v1/streams/{id}"))).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(snapshot["status"], "error", "{snapshot}");
    assert_eq!(client.get(server.url("/healthz")).send().await.expect("GET").status(), 200);
    let other: Value = client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
    let other = other["id"].as_str().expect("id").to_owned();
    let response = client
        .post(server.url(&format!("/v1/streams/{other}/messages")))
        .json(&json!({"type": "text", "props": {"content": "the disk is back"}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200, "writes go on once the disk is back");
    let mut server = server;
    server.kill();
    // What was acknowledged is there after a restart.
    let server = spawn(&dir);
    let kept = events(&client, &server, &id, 0).await;
    assert!(kept.values().any(|data| data.contains("kept before the failure")), "{kept:?}");
    // The failed write was kept and written once the disk was back: no hole in the sequences, and the end
    // its readers saw.
    let sequences: Vec<u64> = kept.keys().copied().collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "{kept:?}");
    let end: Value = serde_json::from_str(kept.values().last().expect("events")).expect("JSON");
    assert_eq!(end["props"]["data"]["error"]["code"], "store_unavailable", "{end}");
    let kept = events(&client, &server, &other, 0).await;
    assert!(kept.values().any(|data| data.contains("the disk is back")), "{kept:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

// A real small file system under the store: full, read-only at start, gone read-only under a live stream. A
// read-only remount (`mount -o remount,ro`) is refused (EBUSY) while the store has its files open for writing:
// a file system goes read-only under a live process only by an error, which ext4 lets a test trigger.

/// Runs `program` with `args`, which must succeed.
fn run(program: &str, args: &[&str]) {
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{program} {args:?} does not run: {e}"));
    assert!(status.success(), "{program} {args:?}: {status} (these tests mount file systems: root, CAP_SYS_ADMIN)");
}

fn utf8(path: &std::path::Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A file system of its own under the repository's `target/tmp/`, unmounted and removed when dropped, whether
/// the test passed or not (declared before the servers that use it, so they are killed first).
struct Mounted {
    dir: PathBuf,
    /// The image an ext4 file system lives in (on a loop device).
    image: Option<PathBuf>,
}

impl Mounted {
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/tmp/{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    /// A tmpfs of `size` (`mount -o size=`).
    fn tmpfs(name: &str, size: &str) -> Mounted {
        let mounted = Mounted { dir: Mounted::scratch(name), image: None };
        run("mount", &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", utf8(&mounted.dir)]);
        mounted
    }

    /// An ext4 file system of `bytes` in an image, that goes read-only on an error (`errors=remount-ro`), as a
    /// disk does when it fails. Without a journal: nothing to abort or replay, it mounts again as it was.
    fn ext4(name: &str, bytes: u64) -> Mounted {
        let dir = Mounted::scratch(name);
        let image = dir.with_extension("img");
        std::fs::File::create(&image).and_then(|f| f.set_len(bytes)).expect("the image");
        let mounted = Mounted { dir, image: Some(image) };
        run("mkfs.ext4", &["-q", "-F", "-O", "^has_journal", utf8(mounted.image.as_ref().expect("an image"))]);
        mounted.mount_image();
        mounted
    }

    fn mount_image(&self) {
        let image = self.image.as_ref().expect("an image");
        run("mount", &["-o", "loop,errors=remount-ro", utf8(image), utf8(&self.dir)]);
    }

    /// `mount -o remount,{options}`.
    fn remount(&self, options: &str) {
        run("mount", &["-o", &format!("remount,{options}"), utf8(&self.dir)]);
    }

    /// An error in the ext4 file system, as a failing disk gives: the kernel makes it read-only at once, under
    /// whatever has files open there, until it is unmounted.
    fn fail(&self) {
        let output = std::process::Command::new("findmnt").args(["-no", "SOURCE", utf8(&self.dir)]).output();
        let source = String::from_utf8(output.expect("findmnt runs").stdout).expect("UTF-8");
        let device = source.trim().trim_start_matches("/dev/");
        std::fs::write(format!("/sys/fs/ext4/{device}/trigger_fs_error"), "a test of a failing disk")
            .expect("ext4's trigger_fs_error");
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let unmounted = std::process::Command::new("umount").arg(&self.dir).status().is_ok_and(|s| s.success());
        if !unmounted {
            // Something still has it open: it goes as soon as that is closed.
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

/// A client whose every request answers within `PATIENCE`, or fails the test: a hang is a failure, not a wait.
fn patient_client() -> reqwest::Client {
    reqwest::Client::builder().timeout(PATIENCE).build().expect("a client")
}

async fn create(client: &reqwest::Client, server: &ServerProcess) -> String {
    let response = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.expect("JSON");
    created["id"].as_str().expect("id").to_owned()
}

/// What the client holds: each stream's acknowledged sequences and what each carried.
type Acked = BTreeMap<String, BTreeMap<u64, String>>;

/// Posts `texts` to stream `id`: the acknowledged sequences, recorded in `acked`, or the refusal's status and
/// body.
async fn append(
    client: &reqwest::Client,
    server: &ServerProcess,
    acked: &mut Acked,
    id: &str,
    texts: Vec<String>,
) -> Result<(), (u16, Value)> {
    let body: Vec<Value> = texts.iter().map(|t| json!({"type": "text", "props": {"content": t}})).collect();
    let response =
        client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(&body).send().await.expect("POST answers");
    let status = response.status().as_u16();
    let reply: Value = response.json().await.expect("JSON");
    if status != 200 {
        return Err((status, reply));
    }
    let sequences = reply["sequences"].as_array().expect("sequences").iter().map(|s| s.as_u64().expect("a sequence"));
    acked.entry(id.to_owned()).or_default().extend(sequences.zip(texts));
    Ok(())
}

/// A batch of 25 messages of about 200 bytes.
fn batch(stream: &str, batch: usize) -> Vec<String> {
    (0..25).map(|i| format!("{stream} batch {batch} message {i} é✓ {}", "x".repeat(160))).collect()
}

async fn snapshot(client: &reqwest::Client, server: &ServerProcess, id: &str) -> Value {
    let response = client.get(server.url(&format!("/v1/streams/{id}"))).send().await.expect("GET");
    assert_eq!(response.status(), 200, "{id}");
    response.json().await.expect("JSON")
}

/// The events of a stream that may still be open, from the start up to sequence `last`.
async fn events_to(client: &reqwest::Client, server: &ServerProcess, id: &str, last: u64) -> BTreeMap<u64, String> {
    let mut response = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("GET events");
    assert_eq!(response.status(), 200, "{id}");
    let (mut buffer, mut out) = (Vec::new(), BTreeMap::new());
    while !out.contains_key(&last) {
        let chunk =
            response.chunk().await.expect("events come").unwrap_or_else(|| panic!("{id} stopped before {last}"));
        buffer.extend_from_slice(&chunk);
        let (events, used) = parse_sse(&buffer);
        buffer.drain(..used);
        out.extend(events.into_iter().filter_map(|e| Some((e.id?, e.data))));
    }
    out
}

/// Every message of `acked` is among `events`, with what it carried.
fn assert_has(events: &BTreeMap<u64, String>, acked: &BTreeMap<u64, String>, what: &str) {
    for (sequence, text) in acked {
        let data = events.get(sequence).unwrap_or_else(|| panic!("{what}: acknowledged {sequence} lost"));
        let message: Value = serde_json::from_str(data).expect("JSON");
        assert_eq!(message["props"]["content"], json!(text), "{what}: sequence {sequence}");
    }
}

/// Stream `id` has ended and kept every acknowledged message, in order, without a hole in its sequences:
/// what its end says (`props.data` of the `stream_end`).
async fn kept(client: &reqwest::Client, server: &ServerProcess, acked: &Acked, id: &str) -> Value {
    let events = events(client, server, id, 0).await;
    let sequences: Vec<u64> = events.keys().copied().collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "{id}: no hole");
    assert_has(&events, acked.get(id).unwrap_or(&BTreeMap::new()), id);
    let end: Value = serde_json::from_str(events.values().last().expect("events")).expect("JSON");
    assert_eq!(end["props"]["event"], "stream_end", "{id}");
    end["props"]["data"].clone()
}

/// Two streams with four acknowledged batches each, the first of them ended: its id, and the open one's.
async fn ended_and_open(client: &reqwest::Client, server: &ServerProcess, acked: &mut Acked) -> (String, String) {
    let (ended, open) = (create(client, server).await, create(client, server).await);
    for n in 0..4 {
        for id in [&ended, &open] {
            append(client, server, acked, id, batch(id, n)).await.expect("acknowledged");
        }
    }
    let response = client.post(server.url(&format!("/v1/streams/{ended}/end"))).send().await.expect("end");
    assert_eq!(response.status(), 200);
    (ended, open)
}

/// Fills the file system of `dir` with a file, but for `margin` bytes: the file and its size.
fn fill(dir: &std::path::Path, margin: u64) -> (PathBuf, u64) {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("the filler");
    let block = vec![0x5a_u8; 64 * 1024];
    let mut size = 0;
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(n) => size += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("writing the filler: {e}"),
        }
    }
    let size = size.saturating_sub(margin);
    file.set_len(size).expect("truncate the filler");
    (path, size)
}

/// How much the disk left for the store before it was full.
const MARGIN: u64 = 1024 * 1024;

/// Posts batches to `id` until one is refused: that refusal, and how many batches were acknowledged.
async fn until_refused(client: &reqwest::Client, server: &ServerProcess, id: &str) -> (Acked, (u16, Value), usize) {
    let mut acked = Acked::new();
    for n in 0..10_000 {
        if let Err(refusal) = append(client, server, &mut acked, id, batch(id, n)).await {
            return (acked, refusal, n);
        }
    }
    panic!("{id}: 10,000 batches and the disk is not full");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_503_store_unavailable_and_loses_nothing_acknowledged() {
    let disk = Mounted::tmpfs("full", "2m");
    let dir = disk.dir.join("store");
    let client = patient_client();
    let mut acked = Acked::new();
    let server = spawn(&dir);
    // Before the disk is full: a stream that ended, one left open and idle.
    let (ended, idle) = ended_and_open(&client, &server, &mut acked).await;
    let (first, second) = (create(&client, &server).await, create(&client, &server).await);
    // A file beside the store fills the disk but for a margin; two producers write until they are refused.
    let (filler, filled) = fill(&disk.dir, MARGIN);
    let started = std::time::Instant::now();
    let (one, two) = tokio::join!(until_refused(&client, &server, &first), until_refused(&client, &server, &second));
    let took = started.elapsed();
    let text: usize = [&one.0, &two.0].iter().flat_map(|a| a.values()).flat_map(|m| m.values()).map(String::len).sum();
    let size = |file: &str| std::fs::metadata(dir.join(file)).map_or(0, |m| m.len());
    eprintln!(
        "a 2 MiB tmpfs, a filler of {filled} bytes, {MARGIN} left: refused after {} and {} batches of 25 messages \
         ({text} bytes of text acknowledged) in {took:?}; the database then took {} bytes, its WAL {}",
        one.2,
        two.2,
        size("agentmux.sqlite3"),
        size("agentmux.sqlite3-wal"),
    );
    let mut seen = BTreeMap::new();
    for (producer, id) in [(one, &first), (two, &second)] {
        let (these, (status, body), _) = producer;
        acked.extend(these);
        assert_eq!(status, 503, "{id}: {body}");
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
        // The stream ended with that error; its readers get what is on disk, then the notice that the rest
        // is not kept.
        assert_eq!(snapshot(&client, &server, id).await["status"], "error");
        seen.insert(id.clone(), kept_while_failed(&client, &server, &acked, id).await);
    }
    // The service goes on: the ended stream and the idle one are read as before.
    assert_eq!(client.get(server.url("/healthz")).send().await.expect("GET").status(), 200);
    assert_eq!(kept(&client, &server, &acked, &ended).await["status"], "completed");
    let last = *acked[&idle].keys().last().expect("acknowledged");
    assert_has(&events_to(&client, &server, &idle, last).await, &acked[&idle], "idle");
    assert_eq!(snapshot(&client, &server, &idle).await["status"], "open");
    assert!(!server.log.lock().expect("log").contains("panicked"));

    // Space again: writes go on, on the idle stream and on a new one.
    std::fs::remove_file(&filler).expect("rm the filler");
    append(&client, &server, &mut acked, &idle, batch(&idle, 4)).await.expect("acknowledged once the disk is back");
    let after = create(&client, &server).await;
    append(&client, &server, &mut acked, &after, batch(&after, 0)).await.expect("acknowledged");
    // The refused batches were written with that, and the end: readers now read them, after what they saw.
    for id in [&first, &second] {
        assert_eq!(kept(&client, &server, &acked, id).await["error"]["code"], "store_unavailable");
        same_history(&client, &server, id, &seen[id]).await;
    }
    let mut server = server;
    server.kill();

    // Every acknowledged message, in order, without a hole, and the end, after a restart too.
    let server = spawn(&dir);
    for id in [&first, &second] {
        assert_eq!(kept(&client, &server, &acked, id).await["error"]["code"], "store_unavailable");
        same_history(&client, &server, id, &seen[id]).await;
    }
    assert_eq!(kept(&client, &server, &acked, &ended).await["status"], "completed");
    for id in [&idle, &after] {
        assert_eq!(kept(&client, &server, &acked, id).await["error"]["code"], "interrupted");
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_file_system_is_a_clear_error_at_start_and_loses_nothing() {
    let disk = Mounted::tmpfs("read-only", "2m");
    let dir = disk.dir.join("store");
    let client = patient_client();
    let mut acked = Acked::new();
    let refuses = |path: &std::path::Path| {
        let (ok, said) = refused(path);
        assert!(!ok, "it did not start");
        let clear = said.contains(&format!("the data directory {}", path.display()))
            && said.contains("Read-only file system")
            && said.contains("--ephemeral");
        assert!(clear, "{said}");
        said
    };
    // Nothing there yet: the directory to make, and the file system's root, where the store would be made.
    disk.remount("ro");
    refuses(&dir);
    eprintln!("{}", refuses(&disk.dir).trim());
    disk.remount("rw");
    // A store a crash left (its WAL beside it), then one stopped cleanly (checkpointed, one file).
    let server = spawn(&dir);
    let id = create(&client, &server).await;
    append(&client, &server, &mut acked, &id, batch(&id, 0)).await.expect("acknowledged");
    let mut server = server;
    server.kill();
    disk.remount("ro");
    refuses(&dir);
    disk.remount("rw");
    let mut server = spawn(&dir);
    assert_eq!(kept(&client, &server, &acked, &id).await["error"]["code"], "interrupted");
    let other = create(&client, &server).await;
    append(&client, &server, &mut acked, &other, batch(&other, 0)).await.expect("acknowledged");
    let response = client.post(server.url(&format!("/v1/streams/{other}/end"))).send().await.expect("end");
    assert_eq!(response.status(), 200);
    server.terminate();
    assert!(server.wait_exit(PATIENCE).1, "a clean stop");
    disk.remount("ro");
    refuses(&dir);
    disk.remount("rw");
    let server = spawn(&dir);
    assert_eq!(kept(&client, &server, &acked, &id).await["error"]["code"], "interrupted");
    assert_eq!(kept(&client, &server, &acked, &other).await["status"], "completed");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_system_that_goes_read_only_under_a_stream_ends_it_with_an_error_and_loses_nothing_acknowledged() {
    let disk = Mounted::ext4("gone-read-only", 8 << 20);
    let dir = disk.dir.join("store");
    let client = patient_client();
    let mut acked = Acked::new();
    let server = spawn(&dir);
    let (ended, written) = ended_and_open(&client, &server, &mut acked).await;
    // A commit is a write to the WAL, without an fsync (`synchronous = NORMAL`): what the kernel has not written
    // back when the file system goes read-only is lost with it, as in an OS crash. Written back first, so the test
    // shows what the service does.
    run("sync", &["-f", utf8(&dir)]);
    disk.fail();
    let probe = std::fs::write(disk.dir.join("probe"), b"");
    assert_eq!(probe.map_err(|e| e.kind()), Err(std::io::ErrorKind::ReadOnlyFilesystem));
    let started = std::time::Instant::now();
    let refusal = append(&client, &server, &mut acked, &written, batch(&written, 4)).await;
    let took = started.elapsed();
    let (status, body) = refusal.expect_err("refused");
    eprintln!("the file system went read-only: {status} in {took:?}");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    assert_eq!(snapshot(&client, &server, &written).await["status"], "error");
    let seen = kept_while_failed(&client, &server, &acked, &written).await;
    // The service goes on: the ended stream is read as before; a new stream is refused the same way, since
    // its start cannot be kept (nothing is acknowledged that is not kept).
    assert_eq!(client.get(server.url("/healthz")).send().await.expect("GET").status(), 200);
    assert_eq!(kept(&client, &server, &acked, &ended).await["status"], "completed");
    let refused = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    assert!(!server.log.lock().expect("log").contains("panicked"));
    let mut server = server;
    server.kill();

    // Read-write again (an ext4 that went read-only stays so until it is unmounted), restarted: everything
    // acknowledged, and writes go on.
    run("umount", &[utf8(&disk.dir)]);
    disk.mount_image();
    let server = spawn(&dir);
    // The refused batch and the end were never written (the disk did not come back before the process went),
    // and no reader saw them: the stream ends `interrupted` after what was kept, and what readers saw is
    // unchanged.
    assert_eq!(kept(&client, &server, &acked, &written).await["error"]["code"], "interrupted");
    same_history(&client, &server, &written, &seen).await;
    assert_eq!(kept(&client, &server, &acked, &ended).await["status"], "completed");
    let after = create(&client, &server).await;
    append(&client, &server, &mut acked, &after, batch(&after, 0)).await.expect("acknowledged");
    let mut server = server;
    server.kill();
    let server = spawn(&dir);
    for id in [&written, &after] {
        assert_eq!(kept(&client, &server, &acked, id).await["error"]["code"], "interrupted");
    }
    assert_eq!(kept(&client, &server, &acked, &ended).await["status"], "completed");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_that_does_not_wait_for_the_disk_is_kept_like_any_other() {
    let dir = data_dir("durable-false");
    let client = reqwest::Client::new();
    let server = spawn(&dir);
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
    let id = created["id"].as_str().expect("id").to_owned();
    let post = |query: &str, text: &str| {
        let request = client
            .post(server.url(&format!("/v1/streams/{id}/messages{query}")))
            .json(&json!({"type": "text", "props": {"content": text}}));
        async move { request.send().await.expect("POST") }
    };
    let refused = post("?durable=maybe", "refused").await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(
        (body["error"]["code"].clone(), body["error"]["param"].clone()),
        (json!("invalid_value"), json!("durable"))
    );
    assert_eq!(post("?durable=false", "not waited for").await.status(), 200);
    // One writer commits in order: once this one is acknowledged as kept, so is the one before.
    assert_eq!(post("", "waited for").await.status(), 200);
    let mut server = server;
    server.kill();
    let server = spawn(&dir);
    let kept = events(&client, &server, &id, 0).await;
    let texts: Vec<&String> = kept.values().collect();
    let position = |text: &str| texts.iter().position(|data| data.contains(&format!("\"content\":\"{text}\"")));
    let (first, second) = (position("not waited for"), position("waited for"));
    assert!(first.is_some() && first < second, "{kept:?}");
    assert!(position("refused").is_none());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream killed with a message in deltas open inside an open block ends, at the restart, as a live end
/// would: `message_end` (its chunks counted), `block_end`, then `stream_end` `interrupted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_stream_closes_what_it_left_open() {
    let dir = data_dir("open-at-crash");
    let client = reqwest::Client::new();
    let mut server = spawn(&dir);
    let id = create(&client, &server).await;
    let body = [
        json!({"type": "text", "message_id": "t1", "block_id": "b1", "delta": true, "props": {"content": "par"}}),
        json!({"type": "text", "message_id": "t1", "block_id": "b1", "delta": true, "props": {"content": "tial"}}),
    ];
    let response =
        client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(&body).send().await.expect("append");
    assert_eq!(response.status(), 200);
    server.kill();

    let server = spawn(&dir);
    let kept: Vec<Value> =
        events(&client, &server, &id, 0).await.values().map(|e| serde_json::from_str(e).expect("JSON")).collect();
    let events: Vec<&str> = kept.iter().filter_map(|e| e["props"]["event"].as_str()).collect();
    assert_eq!(
        events,
        ["stream_start", "block_start", "message_start", "message_end", "block_end", "stream_end"],
        "{kept:?}"
    );
    let n = kept.len();
    assert_eq!(kept[n - 3]["props"]["data"]["message_id"], "t1");
    assert_eq!(kept[n - 3]["props"]["data"]["chunk_count"], 2);
    assert_eq!(kept[n - 3]["block_id"], "b1");
    assert_eq!(kept[n - 2]["props"]["data"]["block_id"], "b1");
    assert_eq!(kept[n - 2]["props"]["data"]["message_count"], 1);
    assert_eq!(kept[n - 1]["props"]["data"]["error"]["code"], "interrupted");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
