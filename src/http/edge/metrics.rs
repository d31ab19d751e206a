//! [`Metrics`]: what `GET /metrics` shows, in the Prometheus text format (through `prometheus-client`).
//!
//! One registry per [`crate::http::App`], not a process-wide one, so two services in one process (tests, an
//! embedding application) count apart. Counters move where the thing happens (a request answered, a
//! message appended, a run ended); what the hub already knows (streams by status, connections held) is read
//! from it when scraped, so it is never out of step. Labels are bounded: routes by their template (never a
//! stream id), refusals by their error code, formats and transports by name, runs by the model that served
//! them (agents the service has, not what a client sent) and how they ended. No label ever holds a key or a
//! token.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::hub::{Batch, Hub, Status};

type Labels = Vec<(&'static str, String)>;

/// The service's metrics; cheap to clone (one shared pointer: a handler's state is cloned per request).
#[derive(Debug, Clone)]
pub struct Metrics(Arc<Families>);

#[derive(Debug)]
struct Families {
    registry: Registry,
    requests: Family<Labels, Counter>,
    refusals: Family<Labels, Counter>,
    streams: Family<Labels, Gauge>,
    streams_created: Counter,
    subscribers: Family<Labels, Gauge>,
    connections: Gauge<i64, AtomicI64>,
    messages_in: Counter,
    bytes_in: Counter,
    bytes_out: Family<Labels, Counter<u64, AtomicU64>>,
    append_seconds: Histogram,
    deliver_seconds: Histogram,
    runs: Family<Labels, Counter>,
    runs_ended: Family<Labels, Counter>,
    rendered: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, registered and at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("agentmux");
        let requests = Family::<Labels, Counter>::default();
        registry.register("http_requests", "Requests answered, by route template, method and status", requests.clone());
        let refusals = Family::<Labels, Counter>::default();
        registry.register("refusals", "Error answers, by status and error code", refusals.clone());
        let streams = Family::<Labels, Gauge>::default();
        registry.register("streams", "Streams held, open or ended, by status", streams.clone());
        let streams_created = Counter::default();
        registry.register("streams_created", "Streams created (runs and outside producers)", streams_created.clone());
        let subscribers = Family::<Labels, Gauge>::default();
        registry.register("subscribers", "Subscribers connected, by format and transport", subscribers.clone());
        let connections = Gauge::default();
        registry.register("connections", "HTTP connections open", connections.clone());
        let messages_in = Counter::default();
        registry.register("messages_in", "Messages producers appended over HTTP and WebSocket", messages_in.clone());
        let bytes_in = Counter::default();
        registry.register("bytes_in", "Bytes of append bodies", bytes_in.clone());
        let bytes_out = Family::<Labels, Counter<u64, AtomicU64>>::default();
        registry.register("bytes_out", "Bytes of events sent to subscribers, by transport", bytes_out.clone());
        let append_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "append_duration_seconds",
            "From an append request's arrival to its answer (its messages kept)",
            append_seconds.clone(),
        );
        // From 100 µs to about 26 s.
        let deliver_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 19));
        registry.register(
            "publish_to_deliver_seconds",
            "From a message's append to its subscriber's write, sampled (at most ten messages a second per \
             stream, each counted once by each subscriber that was there when it was published)",
            deliver_seconds.clone(),
        );
        let runs = Family::<Labels, Counter>::default();
        registry.register("runs", "Chat runs started, by model", runs.clone());
        let runs_ended = Family::<Labels, Counter>::default();
        registry.register("runs_ended", "Chat runs ended, by model and status", runs_ended.clone());
        let rendered = Family::<Labels, Counter>::default();
        registry.register(
            "messages_rendered",
            "Messages rendered, by rendering (format and transport encoding): once per message per rendering in \
             use on a stream, however many subscribers read it",
            rendered.clone(),
        );
        Metrics(Arc::new(Families {
            registry,
            requests,
            refusals,
            streams,
            streams_created,
            subscribers,
            connections,
            messages_in,
            bytes_in,
            bytes_out,
            append_seconds,
            deliver_seconds,
            runs,
            runs_ended,
            rendered,
        }))
    }

    /// A request answered.
    pub(crate) fn request(&self, route: &str, method: &str, status: u16, code: Option<&str>) {
        let labels = vec![("route", route.to_owned()), ("method", method.to_owned()), ("status", status.to_string())];
        self.0.requests.get_or_create(&labels).inc();
        if let Some(code) = code {
            self.0.refusals.get_or_create(&vec![("status", status.to_string()), ("code", code.to_owned())]).inc();
        }
    }

    /// A stream created through the service.
    pub(crate) fn stream_created(&self) {
        self.0.streams_created.inc();
    }

    /// An append: its messages, its body's bytes and how long it took.
    pub(crate) fn appended(&self, messages: usize, bytes: usize, seconds: f64) {
        self.0.messages_in.inc_by(messages as u64);
        self.0.bytes_in.inc_by(bytes as u64);
        self.0.append_seconds.observe(seconds);
    }

    /// A message a producer published over a WebSocket.
    pub(crate) fn published(&self) {
        self.0.messages_in.inc();
    }

    /// A subscriber connected; it counts as one until the guard is dropped.
    pub(crate) fn subscriber(&self, format: &str, transport: &'static str) -> SubscriberMeter {
        let gauge =
            self.0.subscribers.get_or_create(&vec![("format", format.to_owned()), ("transport", transport.to_owned())]);
        gauge.inc();
        let bytes = self.0.bytes_out.get_or_create(&vec![("transport", transport.to_owned())]).clone();
        SubscriberMeter { gauge: gauge.clone(), bytes, unflushed: 0, deliver_seconds: self.0.deliver_seconds.clone() }
    }

    /// A connection accepted; it counts as open until the guard is dropped.
    pub(crate) fn connection(&self) -> Open {
        self.0.connections.inc();
        Open(self.0.connections.clone())
    }

    /// A chat run started with `model` on `stream`; its end is counted (by how it ended) when the stream
    /// records it ([`crate::hub::Stream::when_ended`]), with no task per run.
    pub(crate) fn run(&self, model: &str, stream: &crate::hub::Stream) {
        self.0.runs.get_or_create(&vec![("model", model.to_owned())]).inc();
        let (ended, model) = (self.0.runs_ended.clone(), model.to_owned());
        stream.when_ended(move |outcome| {
            let status = Status::of(Some(outcome));
            ended.get_or_create(&vec![("model", model), ("status", status.as_str().to_owned())]).inc();
        });
    }

    /// The exposition, with what the hub holds read now.
    pub(crate) fn render(&self, hub: &Hub) -> String {
        self.0.streams.clear();
        for (status, count) in hub.count_by_status() {
            self.0.streams.get_or_create(&vec![("status", status.as_str().to_owned())]).set(count as i64);
        }
        for (render, count) in hub.rendered() {
            let counter = self.0.rendered.get_or_create(&vec![("render", render)]);
            counter.inc_by(count.saturating_sub(counter.get()));
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.0.registry);
        text
    }
}

/// One subscriber's share of the metrics (it counts in the gauge of subscribers, its bytes, how long its
/// messages took to reach it) while it is connected: dropped when it leaves.
///
/// Its bytes are added up here and handed to the shared counter a [`FLUSH_BYTES`] at a time (and when it
/// leaves): in fan-out every subscriber's every batch passes here, and one shared atomic written from every
/// core per batch would be contention on the hot path.
#[derive(Debug)]
pub(crate) struct SubscriberMeter {
    gauge: Gauge,
    bytes: Counter<u64, AtomicU64>,
    unflushed: u64,
    deliver_seconds: Histogram,
}

/// Bytes a subscriber sends before they are added to `agentmux_bytes_out_total`.
const FLUSH_BYTES: u64 = 64 << 10;

impl SubscriberMeter {
    /// A batch sent to it: its bytes, and how long its probed message took, when it has one.
    pub(crate) fn delivered(&mut self, batch: &Batch) {
        self.sent(batch.len());
        if let Some(published) = batch.published {
            self.deliver_seconds.observe(published.elapsed().as_secs_f64());
        }
    }

    /// Bytes sent to it.
    pub(crate) fn sent(&mut self, bytes: usize) {
        self.unflushed += bytes as u64;
        if self.unflushed >= FLUSH_BYTES {
            self.bytes.inc_by(std::mem::take(&mut self.unflushed));
        }
    }
}

impl Drop for SubscriberMeter {
    fn drop(&mut self) {
        self.bytes.inc_by(self.unflushed);
        self.gauge.dec();
    }
}

/// An open connection being counted.
#[derive(Debug)]
pub(crate) struct Open(Gauge<i64, AtomicI64>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}
