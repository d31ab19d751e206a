//! A shared rendition keeps a window, not the whole log: frames every subscriber has passed are dropped
//! (beyond the last 1,024), so a long open stream watched live holds about as much as a short one; a
//! subscriber that joins or resumes from before the window renders the log again for itself and gets the same
//! bytes, then goes on in the shared rendition; a subscriber that stops reading keeps what it still needs.

mod common;

use std::sync::Arc;

use agentmux::hub::{Limits, Stream, Subscription};
use agentmux::output::{Outcome, OutputMessage};
use agentmux::render::Format;
use common::doubles::deterministic_hub;

/// Every byte a subscription gives until the stream's end (or nothing more comes now, when `open`).
async fn drain(subscription: &mut Subscription) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Some(batch) = subscription.next().await {
        bytes.extend_from_slice(&batch.to_bytes());
    }
    bytes
}

/// Every byte available now, without waiting for more.
fn available(subscription: &mut Subscription) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Some(Some(batch)) = subscription.try_next() {
        bytes.extend_from_slice(&batch.to_bytes());
    }
    bytes
}

fn deltas(stream: &Arc<Stream>, from: usize, to: usize) {
    for n in from..to {
        let mut delta = OutputMessage::text(format!("word {n} "));
        delta.message_id = Some("answer".into());
        delta.delta = true;
        stream.append(delta).expect("append");
    }
}

#[tokio::test]
async fn a_long_stream_watched_live_holds_a_window_and_late_readers_get_the_same_bytes() {
    let limits = Limits { messages_per_stream: 100_000, ..Limits::default() };
    let hub = deterministic_hub(limits);
    for format in [Format::Cui, Format::OPENAI] {
        let watched = hub.create("watched").expect("create");
        let unwatched = hub.create("unwatched").expect("create");
        let mut live = watched.subscribe(format, 0).expect("subscribe");
        // A reader that stops after the first frames: what it still needs stays until it reads on.
        let mut stalled = watched.subscribe(format, 0).expect("subscribe");
        let mut seen = Vec::new();
        let mut stalled_seen = Vec::new();
        deltas(&watched, 0, 100);
        deltas(&unwatched, 0, 100);
        seen.extend(available(&mut live));
        stalled_seen.extend(available(&mut stalled));
        // The stalled reader reads nothing until step 5, keeping everything after its place; from then on it
        // keeps up, and the window moves on.
        let mut held = Vec::new();
        for step in 1..=20 {
            deltas(&watched, step * 1_000, (step + 1) * 1_000);
            deltas(&unwatched, step * 1_000, (step + 1) * 1_000);
            seen.extend(available(&mut live));
            if step >= 5 {
                stalled_seen.extend(available(&mut stalled));
            }
            held.push(watched.held_bytes() - unwatched.held_bytes());
        }
        assert!(held[3] > held[8], "{format:?}: the stalled reader kept what it needed: {held:?}");
        // What the live reader's rendition holds does not grow with the stream.
        let (early, late) = (held[8], held[19]);
        assert!(late <= early + early / 4, "{format:?}: the rendition grew from {early} to {late} bytes");
        assert!(late < 1 << 20, "{format:?}: {late} bytes for a rendition of 20,000 deltas");
        assert!(watched.end(Outcome::completed()));
        seen.extend(drain(&mut live).await);
        stalled_seen.extend(drain(&mut stalled).await);
        assert_eq!(stalled_seen, seen, "{format:?}: a reader that stalled and read on gets the same bytes");
        // Late readers, from the start and from the middle: rendered again for themselves, the same bytes.
        let late = drain(&mut watched.subscribe(format, 0).expect("subscribe")).await;
        assert_eq!(late, seen, "{format:?}: a late reader from the start");
        let middle = drain(&mut watched.subscribe(format, 10_000).expect("subscribe")).await;
        assert!(seen.ends_with(&middle) && middle.len() < seen.len() * 3 / 4, "{format:?}: a resume from the middle");
    }
}

#[tokio::test]
async fn a_reader_joining_an_open_stream_before_the_window_catches_up_and_follows_live() {
    let limits = Limits { messages_per_stream: 100_000, ..Limits::default() };
    let hub = deterministic_hub(limits);
    let stream = hub.create("open").expect("create");
    let mut live = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let mut seen = Vec::new();
    for step in 0..10 {
        deltas(&stream, step * 1_000, (step + 1) * 1_000);
        seen.extend(available(&mut live));
    }
    // Joins from the start while the stream is open: its own rendition up to the window, then the shared.
    let mut late = stream.subscribe(Format::OPENAI, 0).expect("subscribe");
    let mut late_seen = available(&mut late);
    assert_eq!(late_seen, seen, "caught up to the live reader");
    deltas(&stream, 10_000, 12_000);
    seen.extend(available(&mut live));
    late_seen.extend(available(&mut late));
    assert_eq!(late_seen, seen, "and follows live");
    assert!(stream.end(Outcome::completed()));
    seen.extend(drain(&mut live).await);
    late_seen.extend(drain(&mut late).await);
    assert_eq!(late_seen, seen);
}
