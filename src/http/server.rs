//! [`serve`]: the accept loop, the connection cap, and the shutdown in phases; [`runtime`], what it runs on.
//!
//! This file puts the service together: the router (`router.rs`) over the endpoints (`api/`), and the
//! transport (`transport/`) for the connections it accepts. The phases of the shutdown are told to every
//! connection through the app's `Lifetime` (`transport/lifetime.rs`).
//!
//! # Connections
//!
//! A connection's first request head is read by `transport/event_connection.rs`: a GET of an event stream
//! is served there, without hyper; anything else goes to hyper, which reads the connection from its first
//! byte.
//!
//! Every connection holds a place under the cap ([`crate::http::Settings::max_connections`]) and one of its
//! client address's share ([`crate::http::Settings::client_connections`]) for as long as its socket lives
//! (`edge/admission.rs`): the places travel inside the socket ([`AdmittedSocket`]), so a connection upgraded
//! to a WebSocket keeps counting after hyper has handed it over. Past either a new connection is read for its
//! request head (a few seconds at most) and answered with the envelope (503 `capacity` past the cap, 429
//! `client_connections` past the client's share, both with `retry-after`), then closed; the others keep
//! being served. Only a few such answers are given at once: past those, a connection is closed unanswered,
//! so a flood of connections cannot use up the file descriptors the cap protects. Each request knows its peer
//! (`ConnectInfo<SocketAddr>`), which names the client whose stream budget it spends.
//!
//! A connection gets [`crate::http::Settings::head_timeout`] to send a request's head, counted from when it
//! opens (for its first request) or from when its previous response ended (hyper's header timeout starts
//! again as the connection goes idle): a slow head and an idle keep-alive connection are closed after it, so
//! neither holds its place for long.
//!
//! # Shutdown
//!
//! When the `shutdown` future completes:
//! 1. *Draining*: no new work: creating a stream or starting a run answers 503 `shutting_down` (a retry
//!    may reach another instance). Everything else is served as before, on open connections and new ones, so
//!    a producer can still append to and end its streams (its client's pool may well open a new connection
//!    to do it), and subscribers keep receiving.
//! 2. After [`crate::http::Settings::shutdown_grace`], or as soon as no stream is open, what is still open is
//!    cancelled and ended with the error `shutdown`.
//! 3. *Closing*: the listener closes; every connection finishes the response in flight and closes (an SSE
//!    response ends with its stream); a WebSocket sends what its streams still owe, `done` included, then a
//!    close frame (1001).
//! 4. After [`crate::http::Settings::shutdown_drain`], whatever is left (a client that stopped reading, a body that
//!    never arrives) is dropped, and `serve` returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::middleware::AddExtension;
use axum::response::IntoResponse;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Layer;

use super::app::App;
use super::edge::admission::{Admission, Refused};
use super::router::router;
use super::transport::event_connection::{self, First};
use super::transport::feed::Feeds;
use super::transport::lifetime::Lifetime;
use super::transport::repoll::Repolled;
use super::transport::socket::{self, AdmittedSocket};
use crate::hub::Hub;
use crate::output::{ErrorProps, Outcome};

/// Connections past the cap answered at once; past these, one is closed unanswered.
const OVERFLOW_ANSWERS: usize = 64;

/// How long a connection past the cap gets to send its request head.
const OVERFLOW_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// The runtime the service runs on: tokio's multi-threaded one, with its I/O driver polled every 16 task polls
/// rather than 61. A worker busy with a round of deliveries then notices a producer's next request after a
/// sixth of the round, so a producer streaming tokens one per POST is answered sooner and readers take more
/// of them per write (`docs/benchmarks-history.md`, session 7).
///
/// ```no_run
/// let runtime = agentmux::http::runtime().expect("a runtime");
/// runtime.block_on(async { /* agentmux::http::serve(...) */ });
/// ```
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().event_interval(16).build()
}

/// Serves `app` on `listener` until `shutdown` completes, then shuts down as the module doc says. The
/// maintenance (sweeps) is not this function's: it belongs to the [`crate::node::Node`] that made the app.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hub = app.hub.clone();
    let settings = app.settings.clone();
    let lifetime = app.lifetime.clone();
    let metrics = app.metrics.clone();
    let feeds = app.feeds.clone();
    let router = router(app);
    let http = connection_builder(settings.head_timeout);
    let connections = TaskTracker::new();
    let admission = Admission::new(settings.max_connections, settings.client_connections());
    let overflow = Arc::new(Semaphore::new(OVERFLOW_ANSWERS));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut grace = None;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    wait_after_accept_error(error).await;
                    continue;
                }
            },
            () = &mut shutdown, if grace.is_none() => {
                lifetime.draining.cancel();
                tracing::info!(open = hub.open_streams().len(), "shutting down: no new streams");
                let (hub, lifetime, wait) = (hub.clone(), lifetime.clone(), settings.shutdown_grace);
                grace = Some(tokio::spawn(async move {
                    end_open_streams(&hub, wait).await;
                    lifetime.closing.cancel();
                }));
                continue;
            }
            () = lifetime.closing.cancelled() => break,
        };
        socket::tune(&tcp);
        let admitted = match admission.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                if let Ok(answer) = Arc::clone(&overflow).try_acquire_owned() {
                    connections.spawn(refuse(tcp, answer, refused, lifetime.gone.clone()));
                }
                continue;
            }
        };
        let service = axum::Extension(ConnectInfo(peer)).layer(router.clone());
        let socket = AdmittedSocket::new(tcp, admitted, metrics.connection());
        let (http, lifetime, feeds) = (http.clone(), lifetime.clone(), feeds.clone());
        connections.spawn(connection(socket, service, http, lifetime, feeds, settings.head_timeout));
    }
    drop(listener);
    tracing::info!("shutting down: every stream has ended; closing connections");
    connections.close();
    lifetime.sockets.close();
    let drained = async {
        connections.wait().await;
        lifetime.sockets.wait().await;
    };
    if tokio::time::timeout(settings.shutdown_drain, drained).await.is_err() {
        tracing::warn!("connections still open after the drain; dropped");
        lifetime.gone.cancel();
        connections.wait().await;
        lifetime.sockets.wait().await;
    }
    Ok(())
}

/// Serves one admitted connection with `service`: its first request read here, and served here when it is
/// a GET of an event stream (`transport/event_connection.rs`), otherwise by hyper; closed as the shutdown's
/// phases say.
async fn connection(
    socket: AdmittedSocket,
    service: AddExtension<Router, ConnectInfo<SocketAddr>>,
    http: http1::Builder,
    lifetime: Arc<Lifetime>,
    feeds: Feeds,
    head_timeout: Duration,
) {
    // A GET of an event stream as the connection's first request is served without hyper (see
    // `transport/event_connection.rs`); the client gets as long to send that head as hyper gives it.
    let first = tokio::select! {
        first = tokio::time::timeout(head_timeout, event_connection::first_request(socket)) => first,
        () = lifetime.closing.cancelled() => return,
    };
    let io = match first {
        Ok(Ok(Some(First::Events(request, socket)))) => {
            let gone = lifetime.gone.clone();
            return event_connection::serve_events(socket, request, service, &feeds, gone).await;
        }
        Ok(Ok(Some(First::Other(io)))) => io,
        Ok(Ok(None)) | Err(_) => return,
        Ok(Err(error)) => {
            tracing::debug!(%error, "connection closed before its first request");
            return;
        }
    };
    // Boxed, so that the task of a connection served without hyper is not the size of hyper's.
    let mut connection = Repolled::new(Box::pin(
        http.serve_connection(TokioIo::new(io), TowerToHyperService::new(service)).with_upgrades(),
    ));
    let result = tokio::select! {
        result = &mut connection => result,
        () = lifetime.closing.cancelled() => {
            connection.inner_mut().as_mut().graceful_shutdown();
            tokio::select! {
                result = &mut connection => result,
                () = lifetime.gone.cancelled() => Ok(()),
            }
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection closed with an error");
    }
}

/// Answers a connection that was not admitted with why (`Refused::error`) and closes it.
async fn refuse(tcp: TcpStream, _answer: OwnedSemaphorePermit, refused: Refused, gone: CancellationToken) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(OVERFLOW_HEAD_TIMEOUT).keep_alive(false);
    let service = hyper::service::service_fn(move |_request| async move {
        Ok::<_, std::convert::Infallible>(refused.error().into_response())
    });
    let connection = http.serve_connection(TokioIo::new(tcp), service);
    tokio::select! {
        result = connection => if let Err(error) = result {
            tracing::debug!(%error, "refused connection closed with an error");
        },
        () = gone.cancelled() => {}
    }
}

/// How every connection is served: HTTP/1.1 only, with upgrades for WebSocket.
///
/// hyper's own HTTP/1 connection rather than hyper-util's `auto` one (which would also take HTTP/2 over
/// cleartext, which browsers and the OpenAI SDKs do not use): a waiting connection is then only hyper's
/// read and write buffers, its task and its response, about 4 KiB less per connection than `auto` kept.
/// (A connection that opens with a GET of an event stream does without even those:
/// `transport/event_connection.rs`.)
fn connection_builder(head_timeout: Duration) -> http1::Builder {
    let mut http = http1::Builder::new();
    // A client gets `head_timeout` to send a request's head, and an idle keep-alive connection as long to
    // send its next one (see the module doc). hyper's header count limit sits above the service's own
    // (`edge/limits.rs`), so that one answers with the envelope.
    http.timer(TokioTimer::new()).header_read_timeout(head_timeout);
    http
}

/// After a failed `accept`: a connection that died in the backlog is skipped; anything else (out of file
/// descriptors, say) would fail again at once, so wait a second rather than spin.
async fn wait_after_accept_error(error: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(error.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::error!(%error, "accept failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Waits up to `grace` for open streams to end, then cancels and ends the rest with the error `shutdown`.
async fn end_open_streams(hub: &Hub, grace: Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    while !hub.open_streams().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for stream in hub.open_streams() {
        let ended = stream.stop(Outcome::failed(ErrorProps {
            message: "the server is shutting down".into(),
            code: Some("shutdown".into()),
            details: None,
        }));
        if ended {
            tracing::warn!(stream = stream.id(), "ended by shutdown");
        }
    }
}
