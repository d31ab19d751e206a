//! What readers cost the producer and the hub: nothing that makes an append wait, and nothing that escapes
//! the hub's byte count.
//!
//! - A first subscriber rendering a long log renders outside the producer's lock: appends, snapshots and
//!   subscribers of other formats go on while it is in the middle of a render (a renderer that blocks until
//!   the test releases it stands for a long render, so the test does not depend on timing).
//! - Renditions and the snapshot's reduction count against the hub's byte limit, so a hub whose streams are
//!   watched in several formats takes fewer messages before it is full, and never holds much past its limit;
//!   a stream's own first event counts too, so creating streams stops at the limit.

mod common;

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmux::hub::{Entry, Gone, HubError, Limits, Render, Renderer, StreamInfo};
use agentmux::output::{Outcome, OutputMessage};
use agentmux::render::Format;
use bytes::Bytes;
use common::doubles::deterministic_hub as hub;

/// How long a step that must not wait is given before the test calls it stuck.
const STUCK: Duration = Duration::from_secs(10);

/// A format whose renderer, on its first entry, says it has started and then waits to be released.
#[derive(Debug)]
struct Blocking {
    started: Sender<()>,
    release: Mutex<Option<Receiver<()>>>,
}

struct BlockingRenderer {
    started: Option<Sender<()>>,
    release: Option<Receiver<()>>,
}

impl Render for Blocking {
    fn key(&self) -> &str {
        "blocking"
    }

    fn renderer(&self, _stream: &StreamInfo) -> Box<dyn Renderer> {
        let release = self.release.lock().expect("the test's lock").take();
        Box::new(BlockingRenderer { started: Some(self.started.clone()), release })
    }
}

impl Renderer for BlockingRenderer {
    fn render(&mut self, entry: &Entry, frames: &mut Vec<Bytes>) {
        if let Some(started) = self.started.take() {
            let _ = started.send(());
            if let Some(release) = self.release.take() {
                let _ = release.recv();
            }
        }
        if let Entry::Message { message, .. } = entry {
            frames.push(Bytes::from(format!("{}\n", message.sequence().unwrap_or(0))));
        }
    }

    fn interrupt(&self, _gone: &Gone, _frames: &mut Vec<Bytes>) {}

    fn held_bytes(&self) -> u64 {
        0
    }

    fn ended(&self) -> bool {
        false
    }
}

/// Runs `step` on a thread of its own and waits for it, failing when it does not finish in time.
fn finishes<T: Send + 'static>(what: &str, step: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, finished) = channel();
    std::thread::spawn(move || {
        let _ = done.send(step());
    });
    match finished.recv_timeout(STUCK) {
        Ok(value) => value,
        Err(RecvTimeoutError::Timeout) => panic!("{what} waited for a subscriber's render"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

#[test]
fn a_first_subscriber_rendering_a_long_log_holds_up_no_append() {
    let hub = hub(Limits::default());
    let stream = hub.create("long").expect("create");
    for n in 0..5_000 {
        stream.append(OutputMessage::text(format!("word{n} "))).expect("append");
    }
    let (started, has_started) = channel();
    let (release, released) = channel();
    let render: Arc<dyn Render> = Arc::new(Blocking { started, release: Mutex::new(Some(released)) });
    let mut subscription = stream.subscribe(render, 0).expect("subscribe");
    let reader = std::thread::spawn(move || {
        let mut frames = 0;
        while let Some(batch) = subscription.try_next().flatten() {
            frames += batch.frames().len();
        }
        frames
    });
    has_started.recv_timeout(STUCK).expect("the subscriber started rendering");

    // The subscriber is in the middle of its render now, and stays there until released.
    let appending = Arc::clone(&stream);
    let sequence = finishes("an append", move || appending.append(OutputMessage::text("more")).expect("append"));
    assert_eq!(sequence, 5_002, "stream_start, 5,000 words, then this");
    let snapshotting = Arc::clone(&stream);
    let snapshot = finishes("a snapshot", move || snapshotting.snapshot());
    assert_eq!(snapshot.last_sequence, 5_002);
    let other = Arc::clone(&stream);
    let frames = finishes("a subscriber in another format", move || {
        let mut subscription = other.subscribe(Format::Cui, 0).expect("subscribe");
        subscription.try_next().flatten().map_or(0, |batch| batch.frames().len())
    });
    assert!(frames > 0, "the other format's subscriber read while the first one rendered");
    let ending = Arc::clone(&stream);
    assert!(finishes("the end", move || ending.end(Outcome::completed())));

    release.send(()).expect("release the render");
    let read = reader.join().expect("the reader");
    assert_eq!(read, 5_003, "the blocked subscriber then read every message, up to stream_end");
}

/// Appends 1 KB texts to a fresh stream until the hub refuses one, letting `readers` read along; returns
/// the bytes of the accepted log and the hub's count at the end.
fn fill(formats: &[Format], snapshot: bool) -> (u64, u64) {
    let limits = Limits { hub_bytes: 400_000, ..Limits::default() };
    let hub = hub(limits.clone());
    let stream = hub.create("filled").expect("create");
    let mut readers: Vec<_> = formats.iter().map(|f| stream.subscribe(*f, 0).expect("subscribe")).collect();
    if snapshot {
        stream.snapshot();
    }
    let read_along = |readers: &mut Vec<agentmux::hub::Subscription>| {
        for reader in readers.iter_mut() {
            while reader.try_next().flatten().is_some() {}
        }
    };
    for n in 0.. {
        if stream.append(OutputMessage::text(format!("{n:04} {}", "x".repeat(1_000)))).is_err() {
            break;
        }
        read_along(&mut readers);
    }
    read_along(&mut readers);
    let log: u64 = stream.history().iter().map(|m| serde_json::to_vec(m).map_or(0, |v| v.len() as u64)).sum();
    let held = hub.bytes();
    assert!(held <= limits.hub_bytes + 8_000, "the hub holds {held} bytes, far past its limit of {}", limits.hub_bytes);
    assert_eq!(held, stream.held_bytes(), "the hub's count is the one stream's");
    (log, held)
}

#[test]
fn renditions_and_the_snapshot_count_against_the_hub_limit() {
    let (alone, _) = fill(&[], false);
    let (with_cui, _) = fill(&[Format::Cui], false);
    let (with_three, held) = fill(&[Format::Cui, Format::OPENAI], true);
    eprintln!("log bytes at the limit: alone {alone}, one CUI reader {with_cui}, CUI + OpenAI + snapshot {with_three}");
    // The log and the producer's own reduction of it: two copies.
    assert!(alone > 190_000, "with no reader the log fills half the hub: {alone} bytes");
    assert!(
        (alone * 2 / 3 - 10_000..alone * 2 / 3 + 10_000).contains(&with_cui),
        "one rendition makes three copies: {with_cui} of {alone}"
    );
    // The log, the producer's reduction, two renditions, the OpenAI adapter's own reduction and the
    // snapshot's: six copies.
    assert!(
        (alone / 3 - 10_000..alone / 3 + 10_000).contains(&with_three),
        "three readers leave a third of what two copies left: {with_three} of {alone}, hub at {held}"
    );
}

#[test]
fn a_stream_s_first_event_and_the_room_for_its_last_count_so_creating_streams_stops_at_the_limit() {
    let hub = hub(Limits { hub_bytes: 12_000, ..Limits::default() });
    let mut created = 0;
    let refused = loop {
        match hub.create("m") {
            Ok(_) => created += 1,
            Err(error) => break error,
        }
        assert!(created < 1_000, "the hub never filled");
    };
    // Every stream is open and the idle timeout is ten minutes away: room is expected then.
    assert!(matches!(refused, HubError::HubFull { limit: 12_000, retry_after: Some(_) }), "{refused:?}");
    assert!(created >= 5, "several streams fit: {created}");
    assert!(
        hub.bytes() <= 12_000,
        "the streams' first events and the room for their last are within the limit: {}",
        hub.bytes()
    );
}
