//! The transport: how events leave the service, below the endpoints that decide what they are. Nothing here
//! knows a route; `api/` makes the responses and the connections these files carry, and `server.rs` hands
//! them the sockets it accepts.
//!
//! Imports run one way, from the top of this list down (each file uses only files below it):
//!
//! - `ws.rs`: the loop of a WebSocket connection, which writes its subscriptions' frames to its socket
//!   itself (parking a one-stream connection on its stream's feed while it waits) and hands the client's
//!   messages to the endpoint;
//! - `event_connection.rs`: a connection whose first request is a GET of an event stream or a WebSocket
//!   upgrade, served without hyper (so a waiting subscriber holds none of hyper's buffers); every other
//!   connection goes to hyper;
//! - `feed.rs`: the writers that send a stream's new batches to its waiting event connections and
//!   one-stream WebSocket connections;
//! - `ws_relay.rs`: a one-stream WebSocket connection's subscription, and the writes of a batch's whole
//!   frames to its socket;
//! - `sse.rs`: an SSE response from a subscription: its relay, its pings, its gathering;
//! - `chunked.rs`: the chunked framing, and the writes of a relayed response to its socket;
//! - `upgrade.rs`: the socket a WebSocket connection owns once upgraded (without hyper, or taken back from
//!   hyper's upgrade), and how a `101` carries what serves it;
//! - `ws_reader.rs`: the reader of a WebSocket client's frames, and the close codes for what it refuses;
//! - `socket.rs`: an accepted connection's socket: its options, its place under the connection cap and in
//!   its client's share, the bytes read ahead put back for hyper;
//! - `watched.rs`: a future watched by another, polled only when its own waker was woken;
//! - `repoll.rs`: a hyper connection that wakes itself is polled again at once;
//! - `lifetime.rs`: where the service is in its shutdown, which every connection watches;
//! - `streamed_json.rs`: a JSON answer with one long array written out as the client takes it, from items
//!   shared with what the service keeps (a thread's transcript and audit log).

pub(crate) mod chunked;
pub(crate) mod event_connection;
pub(crate) mod feed;
pub(crate) mod lifetime;
pub(crate) mod repoll;
pub(crate) mod socket;
pub(crate) mod sse;
pub(crate) mod streamed_json;
pub(crate) mod upgrade;
pub(crate) mod watched;
pub(crate) mod ws;
pub(crate) mod ws_reader;
pub(crate) mod ws_relay;
