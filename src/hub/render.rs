//! The reader side's other seam: how a subscriber wants a stream rendered, without the hub knowing any
//! wire format.
//!
//! A [`Render`] names a way to turn a stream's entries into bytes (an adapter and a transport's encoding,
//! see `crate::render`) and makes a fresh [`Renderer`] for a stream from its neutral facts
//! ([`StreamInfo`]). Renderers are deterministic, so every subscriber whose [`Render::key`] is equal reads
//! the same bytes, and a stream keeps one rendition per key (`rendition.rs`).

use bytes::Bytes;

use super::log::{Entry, Gone};

/// The facts about a stream every format may derive what it needs from (a completion id, a creation
/// time, a model name), fixed when the stream is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream id.
    pub id: String,
    /// This incarnation's epoch.
    pub epoch: String,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The model (agent) name it reports.
    pub model: String,
}

/// A way to render streams; see the module doc.
///
/// The built-in formats are [`crate::render::View`]s; a format of your own is a `Render` too:
///
/// ```
/// use std::sync::Arc;
///
/// use agentmux::hub::{Entry, Gone, Hub, Render, Renderer, StreamInfo};
/// use agentmux::output::{Outcome, OutputMessage};
/// use bytes::Bytes;
///
/// /// Each message's type on a line of its own.
/// #[derive(Debug)]
/// struct Types;
///
/// struct TypesRenderer;
///
/// impl Render for Types {
///     fn key(&self) -> &str {
///         "types"
///     }
///     fn renderer(&self, _stream: &StreamInfo) -> Box<dyn Renderer> {
///         Box::new(TypesRenderer)
///     }
/// }
///
/// impl Renderer for TypesRenderer {
///     fn render(&mut self, entry: &Entry, frames: &mut Vec<Bytes>) {
///         if let Entry::Message { message, .. } = entry {
///             frames.push(Bytes::from(format!("{}\n", message.kind)));
///         }
///     }
///     fn interrupt(&self, _gone: &Gone, frames: &mut Vec<Bytes>) {
///         frames.push(Bytes::from_static(b"gone\n"));
///     }
///     fn held_bytes(&self) -> u64 {
///         0
///     }
///     fn ended(&self) -> bool {
///         false
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let stream = Hub::default().create("demo").unwrap();
/// stream.append(OutputMessage::text("hello")).unwrap();
/// stream.end(Outcome::completed());
/// let mut subscription = stream.subscribe(Arc::new(Types) as Arc<dyn Render>, 0).unwrap();
/// let mut out = Vec::new();
/// while let Some(batch) = subscription.next().await {
///     out.extend_from_slice(&batch.to_bytes());
/// }
/// assert_eq!(out, b"event\ntext\nevent\n"); // stream_start, the text, stream_end
/// # });
/// ```
pub trait Render: Send + Sync + std::fmt::Debug {
    /// Equal keys render every stream to equal bytes.
    fn key(&self) -> &str;

    /// A fresh renderer for `stream`.
    fn renderer(&self, stream: &StreamInfo) -> Box<dyn Renderer>;
}

/// Renders one stream's entries, in order, each into zero or more encoded frames (one transport unit each:
/// an SSE event, a WebSocket message).
pub trait Renderer: Send {
    /// Renders the next entry.
    fn render(&mut self, entry: &Entry, frames: &mut Vec<Bytes>);

    /// True once it will render nothing more, whatever entries come: a subscriber that took every frame
    /// has its whole view, even before the stream ends.
    fn ended(&self) -> bool;

    /// The last frames of a subscriber whose next entry is [`Gone`]. Changes no state.
    fn interrupt(&self, gone: &Gone, frames: &mut Vec<Bytes>);

    /// Bytes its own state holds besides the frames (an adapter's reducer), for the hub's memory count.
    fn held_bytes(&self) -> u64;
}
