//! One stream on its own: stamping, lifecycle events, all-or-nothing batches, limits, snapshots.

mod common;

use std::sync::Arc;

use agentmux::agent::Output;
use agentmux::hub::{AppendError, Entry, Hub, HubConfig, HubError, Limits, Status};
use agentmux::output::{DeltaAction, ErrorProps, Outcome, OutputMessage, Usage};
use common::doubles::deterministic_hub as hub;
use serde_json::json;

fn events(log: &[OutputMessage]) -> Vec<String> {
    log.iter()
        .map(|m| match m.kind.as_str() {
            "event" => m.prop_str("event").unwrap_or_default().to_owned(),
            other => other.to_owned(),
        })
        .collect()
}

#[test]
fn stamps_sequences_ids_and_times() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    let own = OutputMessage::text("a").with_message_id("mine");
    assert_eq!(stream.append(own).expect("append"), 2);
    assert_eq!(stream.append(OutputMessage::text("b")).expect("append"), 3);
    let log = stream.history();
    let sequences: Vec<u64> = log.iter().map(|m| m.sequence().expect("stamped")).collect();
    assert_eq!(sequences, [1, 2, 3]);
    assert_eq!(log[1].message_id.as_deref(), Some("mine"), "a producer's id is kept");
    assert!(log[2].message_id.is_some(), "an id is stamped where none was given");
    let times: Vec<u64> = log.iter().map(|m| m.metadata.as_ref().and_then(|x| x.timestamp).expect("time")).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(stream.epoch(), "e2");
    assert_eq!(log[0].props["data"], json!({"stream_id": "s1", "epoch": "e2", "model": "m"}));
}

#[test]
fn lifecycle_events_wrap_deltas_blocks_and_the_stream() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    let output = Output::new(Arc::clone(&stream));
    let step = output.begin_block().thread("researcher");
    let mut text = step.stream_text();
    text.append("Hel").expect("append");
    text.append("lo").expect("append");
    step.tool_call("c1", "search", "{}").expect("tool call");
    let mut open = output.stream_thinking();
    open.append("never ended").expect("append");
    step.end_block().expect("end block");
    stream.end(Outcome::completed().with_usage(Usage::new(3, 4)));
    let log = stream.history();
    assert_eq!(
        events(&log),
        [
            "stream_start",
            "block_start",
            "message_start",
            "text",
            "text",
            "tool_call",
            "message_start",
            "thinking",
            "message_end",
            "block_end",
            "message_end",
            "stream_end"
        ]
    );
    // Deltas inherit the block and thread of the message they continue.
    assert!(log[3..6].iter().all(|m| m.block_id == log[1].block_id && m.thread_id.as_deref() == Some("researcher")));
    let text_end = &log[8].props["data"];
    assert_eq!(text_end["chunk_count"], json!(2));
    assert_eq!(text_end["message_id"], json!(text.message_id()));
    assert_eq!(log[9].props["data"]["message_count"], json!(2));
    let end = &log[11].props["data"];
    assert_eq!(end["status"], json!("completed"));
    assert_eq!(end["usage"], json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}));
    assert!(end["duration_ms"].as_u64().is_some());
    assert_eq!(stream.status(), Status::Completed);
    assert_eq!(stream.append(OutputMessage::text("late")), Err(AppendError::Ended));
    assert!(!stream.end(Outcome::completed()), "ending twice is refused");
}

#[test]
fn a_batch_is_all_or_nothing() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    stream.append(OutputMessage::text("a").with_message_id("t")).expect("append");
    let before = stream.snapshot();
    let batch = vec![
        OutputMessage::text("b").with_message_id("t").as_delta(DeltaAction::Append, None),
        OutputMessage::text("new").with_message_id("n").as_delta(DeltaAction::Append, None),
        OutputMessage::text("c").with_message_id("t").as_delta(DeltaAction::Merge, None),
    ];
    let error = stream.append_batch(batch).expect_err("the merge conflicts");
    assert_eq!(error.index, 2);
    assert!(matches!(error.error, AppendError::Delta(ref e) if e.field() == "props.content"), "{error}");
    let after = stream.snapshot();
    assert_eq!(after.last_sequence, before.last_sequence);
    assert_eq!(serde_json::to_value(&after.messages).ok(), serde_json::to_value(&before.messages).ok());
    let invalid = vec![OutputMessage::text("fine"), OutputMessage::image("ftp://nope")];
    let error = stream.append_batch(invalid).expect_err("bad url");
    assert_eq!(error.index, 1);
    assert!(matches!(error.error, AppendError::Invalid(ref e) if e.field() == Some("props.url")));
    assert_eq!(stream.last_sequence(), before.last_sequence);
    // And a good batch goes in whole, message_start included.
    let sequences = stream
        .append_batch(vec![
            OutputMessage::text("b").with_message_id("t").as_delta(DeltaAction::Append, None),
            OutputMessage::text("x").with_message_id("n2").as_delta(DeltaAction::Append, None),
        ])
        .expect("batch");
    assert_eq!(sequences, [3, 5], "message_start for n2 takes sequence 4");
    let snapshot = stream.snapshot();
    assert_eq!(
        snapshot.messages.iter().find(|m| m.message_id.as_deref() == Some("t")).map(|m| m.props["content"].clone()),
        Some(json!("ab"))
    );
}

/// A refused batch takes back what it opened and counted: the message it continued ends with the chunks
/// accepted, and the message and block it would have opened are not open.
#[test]
fn a_refused_batch_leaves_what_is_open_as_it_was() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    let delta =
        |text: &str, id: &str| OutputMessage::text(text).with_message_id(id).as_delta(DeltaAction::Append, None);
    stream.append_batch(vec![delta("a", "t"), delta("b", "t")]).expect("two chunks");
    let refused = vec![
        delta("c", "t"),
        delta("d", "t"),
        delta("new", "n").with_block_id("b1"),
        OutputMessage::text("e").with_message_id("t").as_delta(DeltaAction::Merge, None),
    ];
    assert_eq!(stream.append_batch(refused).expect_err("the merge conflicts").index, 3);
    stream.append(delta("f", "t")).expect("a third chunk");
    stream.end(Outcome::completed());
    let log = stream.history();
    assert_eq!(
        events(&log),
        ["stream_start", "message_start", "text", "text", "text", "message_end", "stream_end"],
        "nothing the refused batch opened is closed"
    );
    assert_eq!(log[5].props["data"]["chunk_count"], json!(3));
}

#[test]
fn limits_are_typed_errors() {
    let hub = hub(Limits { message_bytes: 200, messages_per_stream: 4, streams: 2, ..Limits::default() });
    let stream = hub.create("m").expect("create");
    let big = OutputMessage::text("x".repeat(300));
    assert!(matches!(stream.append(big), Err(AppendError::MessageTooLarge { limit: 200, .. })));
    stream.append(OutputMessage::text("1")).expect("2");
    stream.append(OutputMessage::text("2")).expect("3");
    // The fourth place is stream_end's, kept from the start.
    assert_eq!(stream.append(OutputMessage::text("3")), Err(AppendError::TooManyMessages { limit: 4 }));
    assert!(stream.end(Outcome::completed()), "the end always fits");
    assert_eq!(stream.last_sequence(), 4, "and within the limit");
    hub.create("m").expect("second stream");
    // One of the two has ended: it is evicted early to make room for a third.
    hub.create("m").expect("third stream, in the place of the ended one");
    assert!(hub.get(stream.id()).is_none(), "the ended stream was evicted for it");
    // Both open: room comes when one reaches its idle timeout.
    assert!(
        matches!(hub.create("m").err(), Some(HubError::TooManyStreams { limit: 2, retry_after: Some(_) })),
        "the fourth stream is refused, with when to retry"
    );

    let small = self::hub(Limits { hub_bytes: 3_000, ..Limits::default() });
    let stream = small.create("m").expect("create");
    let mut refused = None;
    for i in 0..100 {
        if let Err(e) = stream.append(OutputMessage::text(format!("message {i} ").repeat(5))) {
            refused = Some(e);
            break;
        }
    }
    assert_eq!(refused, Some(AppendError::HubFull { limit: 3_000 }));
    assert!(small.bytes() <= 3_000, "the room for the end is kept within the limit: {}", small.bytes());
    assert!(stream.end(Outcome::completed()));
    assert!(small.bytes() <= 3_000, "the stream's own events do not pass the limit: {}", small.bytes());
}

#[test]
fn the_end_records_errors_and_cancels() {
    let hub = hub(Limits::default());
    let failed = hub.create("m").expect("create");
    failed.end(Outcome::failed(ErrorProps { message: "boom".into(), code: Some("x".into()), details: None }));
    assert_eq!(failed.status(), Status::Error);
    let end = failed.history().pop().expect("stream_end");
    assert_eq!(end.props["data"]["error"], json!({"message": "boom", "code": "x"}));
    let cancelled = hub.create("m").expect("create");
    assert!(cancelled.cancel());
    assert!(cancelled.cancellation().is_cancelled());
    assert_eq!(cancelled.status(), Status::Cancelled);
    assert!(!cancelled.cancel(), "cancelling an ended stream does nothing");
    let snapshot = serde_json::to_value(cancelled.snapshot()).expect("json");
    assert_eq!(snapshot["status"], json!("cancelled"));
    assert_eq!(snapshot["last_sequence"], json!(2));
    assert!(snapshot["messages"].as_array().is_some_and(|m| m.len() == 2));
}

/// The stream's own ids never collide with a producer's: a producer using `m1`, `m2` ... (as the fixtures
/// do) neither continues the stream's events nor is overwritten by them.
#[test]
fn producer_ids_never_meet_the_streams_own() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    for n in 1..=5 {
        let id = format!("m{n}");
        let first = OutputMessage::text("a").with_message_id(&id).as_delta(DeltaAction::Append, None);
        stream.append(first).expect("a new message");
        stream
            .append(OutputMessage::text("b").with_message_id(&id).as_delta(DeltaAction::Append, None))
            .expect("delta");
    }
    assert!(stream.end(Outcome::completed()));
    let snapshot = stream.snapshot();
    let texts: Vec<_> =
        snapshot.messages.iter().filter(|m| m.kind == "text").map(|m| m.props["content"].clone()).collect();
    assert_eq!(texts, vec![json!("ab"); 5]);
    let events = snapshot.messages.iter().filter(|m| m.kind == "event").count();
    assert_eq!(events, 1 + 5 + 5 + 1, "stream_start, five message_start, five message_end, stream_end");
}

/// One burst the producer makes in one go (here the `message_end` events that close 2,000 open messages at
/// the end) reaches a subscriber that kept up with everything before it whole, without a lagged notice.
#[tokio::test]
async fn a_burst_at_the_end_does_not_lag_a_subscriber_that_kept_up() {
    use agentmux::render::Format;

    let hub = Hub::new(HubConfig { batch_bytes: 16 * 1024, ..HubConfig::default() });
    let stream = hub.create("m").expect("create");
    let mut subscriber = stream.subscribe(Format::Cui, 0).expect("subscribe");
    let mut frames = 0;
    for i in 0..2_000 {
        let delta = OutputMessage::text("x").with_message_id(format!("d{i}")).as_delta(DeltaAction::Append, None);
        stream.append(delta).expect("append");
        while let Some(Some(batch)) = subscriber.try_next() {
            assert!(!batch.lagged, "lagged while keeping up");
            frames += batch.frames().len();
        }
    }
    assert!(stream.end(Outcome::completed()));
    let mut last = None;
    while let Some(batch) = subscriber.next().await {
        assert!(!batch.lagged, "lagged by the end's burst");
        frames += batch.frames().len();
        last = batch.frames().last().cloned();
    }
    assert_eq!(frames as u64, stream.last_sequence());
    assert!(String::from_utf8_lossy(&last.expect("frames")).contains("stream_end"));
}

/// A custom type started with `Output::start` streams text into `content` like a built-in one.
#[test]
fn a_custom_message_streams_into_content() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    let output = Output::new(Arc::clone(&stream));
    let mut card = output.start(OutputMessage::new("card", Default::default()).with_prop("title", "T")).expect("start");
    card.append("Hel").expect("append");
    card.append("lo").expect("append");
    card.set("meta.done", true).expect("set");
    card.end().expect("end");
    let snapshot = stream.snapshot();
    let card = snapshot.messages.iter().find(|m| m.kind == "card").expect("the card");
    assert_eq!(
        serde_json::Value::Object(card.props.clone()),
        json!({"title": "T", "content": "Hello", "meta": {"done": true}})
    );
}

/// A batch's messages are logged with their JSON (one block for the batch, a slice each), interleaved with
/// the lifecycle events they open, each entry's bytes exactly its own message's compact JSON.
#[test]
fn a_batch_logs_each_message_with_its_own_json() {
    let hub = hub(Limits::default());
    let stream = hub.create("m").expect("create");
    let delta = |text: &str| OutputMessage::text(text).with_message_id("t").as_delta(DeltaAction::Append, None);
    let batch = vec![
        OutputMessage::text("quote \" and \n newline").with_block_id("b1"),
        delta("é"),
        OutputMessage::new("custom", serde_json::Map::new()).with_prop("n", 1.5),
        delta("more"),
        OutputMessage::tool_call("c1", "search", "{}").with_block_id("b2"),
    ];
    stream.append_batch(batch).expect("appended");
    stream.append_batch(vec![delta("!")]).expect("appended");
    let mut entries = Vec::new();
    stream.log().read(0, usize::MAX, &mut entries).expect("read");
    let mut messages = 0;
    for entry in &entries {
        let Entry::Message { message, bytes, json } = entry else { continue };
        let expected = serde_json::to_vec(&**message).expect("serialises");
        assert_eq!(json.as_deref(), Some(&expected[..]), "{message:?}");
        assert_eq!(*bytes, expected.len() as u64);
        messages += 1;
    }
    let events = entries.iter().filter(|e| matches!(e, Entry::Message { message, .. } if message.kind == "event"));
    let events = events.count();
    assert!(events >= 3, "stream_start and the blocks' and messages' starts are among them: {events}");
    assert_eq!(messages, 6 + events, "every message the producer sent, and the events");
}
