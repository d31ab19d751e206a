//! The relay benchmark's fast upstream: a minimal OpenAI-compatible server (hyper, no agentmux code) that
//! answers every streamed chat request at once and stamps each content chunk with the wall-clock time it was
//! written, so a client behind any proxy can tell how long each chunk took to reach it.
//!
//! It runs as a child process of the load generator (`load --relay-upstream --addr 127.0.0.1:0`), like the
//! ceiling server: its timers and its writes are then never queued behind the client's own work, its CPU can
//! be read from `/proc` apart from the client's, and it is started and killed with the other servers of a
//! run. It prints `relay upstream listening address=ADDR` on stderr once it listens. With a TLS directory
//! (`--relay-tls-dir`) it also serves the same answers over HTTPS on a second port, with a certificate a CA
//! made at start signed (`tls.rs`; the CA in `DIR/ca.pem`), and the line adds `tls_address=ADDR`.
//!
//! `POST /v1/chat/completions` with `"stream": true` answers, as `data:` events: a role chunk, `chunks`
//! content chunks (the first at once, the next ones `interval` apart on a fixed schedule), a finish
//! chunk, a usage chunk, `[DONE]`. A content chunk's `content` is `@@` and the nanoseconds since the Unix
//! epoch at which it was made, just before hyper writes it (content is what every proxy passes through).
//! The first content chunk also carries, after its stamp, `^^` and when the request had been received whole
//! (its body read): the client takes the upstream's own time to first token (first chunk made less request
//! received) out of its own, request by request, and what is left is what the path between them added.
//! Without `stream` it answers one `chat.completion`. `GET /v1/models` lists the one model the relay uses
//! (any model name is answered, and echoed in the chunks).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::wall_ns;

/// The model the upstream lists.
pub(crate) const MODEL: &str = "fast";

/// How an answer streams.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    /// Content chunks per answer.
    pub(crate) chunks: usize,
    /// Between two content chunks.
    pub(crate) interval: Duration,
}

type Body = BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static(content_type));
    response
}

/// One `chat.completion.chunk` event.
fn event(model: &str, delta: Value, finish_reason: Option<&str>, usage: Option<Value>) -> Bytes {
    let choices =
        if usage.is_some() { json!([]) } else { json!([{"index": 0, "delta": delta, "finish_reason": finish_reason}]) };
    let mut chunk = json!({
        "id": "chatcmpl-relay",
        "object": "chat.completion.chunk",
        "created": wall_ns() / 1_000_000_000,
        "model": model,
        "choices": choices,
    });
    if let Some(usage) = usage {
        chunk["usage"] = usage;
    }
    Bytes::from(format!("data: {chunk}\n\n"))
}

/// Where an answer is.
struct Answer {
    model: String,
    pace: Pace,
    /// 0: the role chunk; 1..=chunks: content; then finish, usage, `[DONE]`.
    step: usize,
    /// When the first content chunk went: the `n`-th is due `n - 1` intervals later.
    first_content: Option<tokio::time::Instant>,
    /// When the request had been read whole, in nanoseconds since the Unix epoch (on the first content chunk).
    received: u64,
}

impl Answer {
    async fn next(&mut self) -> Option<Bytes> {
        let chunks = self.pace.chunks;
        let step = self.step;
        self.step += 1;
        Some(match step {
            0 => event(&self.model, json!({"role": "assistant", "content": ""}), None, None),
            n if n <= chunks => {
                // On a fixed schedule from the first: Tokio's timer wakes on millisecond ticks, so a sleep
                // for an interval from the last chunk would drift by up to a millisecond each time.
                let content = match self.first_content {
                    Some(first) => {
                        tokio::time::sleep_until(first + self.pace.interval * (n as u32 - 1)).await;
                        format!("@@{}", wall_ns())
                    }
                    None => {
                        self.first_content = Some(tokio::time::Instant::now());
                        format!("@@{}^^{}", wall_ns(), self.received)
                    }
                };
                event(&self.model, json!({"content": content}), None, None)
            }
            n if n == chunks + 1 => event(&self.model, json!({}), Some("stop"), None),
            n if n == chunks + 2 => {
                let usage = json!({"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks});
                event(&self.model, Value::Null, None, Some(usage))
            }
            n if n == chunks + 3 => Bytes::from_static(b"data: [DONE]\n\n"),
            _ => return None,
        })
    }
}

async fn handle(pace: Pace, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = match (&method, path.trim_end_matches('/')) {
        (&Method::GET, "/healthz") => full(StatusCode::OK, "text/plain", "ok"),
        (&Method::GET, "/v1/models") => {
            let list = json!({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "relay"}]});
            full(StatusCode::OK, "application/json", list.to_string())
        }
        (&Method::POST, "/v1/chat/completions") => {
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => {
                    return Ok(full(
                        StatusCode::BAD_REQUEST,
                        "application/json",
                        r#"{"error":{"message":"bad body"}}"#,
                    ));
                }
            };
            let received = wall_ns();
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let model = request["model"].as_str().unwrap_or(MODEL).to_owned();
            if request["stream"].as_bool() == Some(true) {
                stream(Answer { model, pace, step: 0, first_content: None, received })
            } else {
                let completion = json!({
                    "id": "chatcmpl-relay", "object": "chat.completion", "created": wall_ns() / 1_000_000_000,
                    "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("@@{}", wall_ns())},
                        "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
                });
                full(StatusCode::OK, "application/json", completion.to_string())
            }
        }
        _ => full(StatusCode::NOT_FOUND, "application/json", r#"{"error":{"message":"not found"}}"#),
    };
    Ok(response)
}

fn stream(answer: Answer) -> Response<Body> {
    let body = futures::stream::unfold(answer, |mut answer| async move {
        let chunk = answer.next().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), answer))
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(body)));
    let headers = response.headers_mut();
    headers.insert("content-type", hyper::header::HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", hyper::header::HeaderValue::from_static("no-cache"));
    response
}

/// `load --relay-upstream --addr A [--relay-tls-dir DIR]`: serves until killed.
pub(crate) fn main(addr: &str, pace: Pace, tls_dir: Option<&Path>) -> ExitCode {
    let addr: SocketAddr = match addr.parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("relay upstream: bad --addr {addr}: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread: it serves one request at a time, and a second thread would only add wake-ups.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("relay upstream: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        let listen = |addr| async move {
            tokio::net::TcpListener::bind(addr).await.map_err(|e| eprintln!("relay upstream: listening on {addr}: {e}"))
        };
        let Ok(listener) = listen(addr).await else { return ExitCode::from(2) };
        let local = listener.local_addr().map_or(addr.to_string(), |a| a.to_string());
        let mut line = format!("relay upstream listening address={local}");
        if let Some(dir) = tls_dir {
            let acceptor = match super::tls::acceptor(dir) {
                Ok((acceptor, _)) => acceptor,
                Err(why) => {
                    eprintln!("{why}");
                    return ExitCode::from(2);
                }
            };
            let Ok(tls) = listen(SocketAddr::new(addr.ip(), 0)).await else { return ExitCode::from(2) };
            let tls_local = tls.local_addr().map_or("?".to_owned(), |a| a.to_string());
            line.push_str(&format!(" tls_address={tls_local}"));
            tokio::spawn(serve(tls, pace, Some(acceptor)));
        }
        eprintln!("{line} chunks={} interval={:?}", pace.chunks, pace.interval);
        serve(listener, pace, None).await;
        ExitCode::SUCCESS
    })
}

/// Accepts on `listener` for good, each connection served on a task of its own (through `tls` when given).
async fn serve(listener: tokio::net::TcpListener, pace: Pace, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                eprintln!("relay upstream: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(pace, request));
            match tls {
                None => {
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
                }
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
                }
            }
        });
    }
}
