//! A TCP proxy in front of a server that drops one connection mid-stream, as a network does: bytes pass
//! through both ways until those coming back hold `marker` (an SSE `id:` line, say) for the first time; that
//! connection is then closed right after the marker, in the middle of its event, and no other is cut.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; stops when dropped.
pub(crate) struct CuttingProxy {
    /// `http://127.0.0.1:<port>`
    pub(crate) base: String,
    cut: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CuttingProxy {
    pub(crate) async fn start(target: SocketAddr, marker: &'static [u8]) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let cut = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&cut);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(target).await else { continue };
                tokio::spawn(pass(client, upstream, marker, Arc::clone(&done)));
            }
        });
        CuttingProxy { base, cut, task }
    }

    /// Whether the one connection was cut.
    pub(crate) fn has_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

async fn pass(client: TcpStream, upstream: TcpStream, marker: &'static [u8], cut: Arc<AtomicBool>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
        let _ = upstream_write.shutdown().await;
    });
    let finder = memchr::memmem::Finder::new(marker);
    let mut tail: Vec<u8> = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match upstream_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let chunk = &buffer[..read];
        if !cut.load(Ordering::Acquire) {
            let seen = [tail.as_slice(), chunk].concat();
            if let Some(at) = finder.find(&seen)
                && cut.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                let keep = (at + marker.len()).saturating_sub(tail.len());
                let _ = client_write.write_all(&chunk[..keep]).await;
                // Both ends dropped here: the client sees its response stop mid-event.
                requests.abort();
                return;
            }
            tail = seen[seen.len().saturating_sub(marker.len())..].to_vec();
        }
        if client_write.write_all(chunk).await.is_err() {
            break;
        }
    }
    let _ = client_write.shutdown().await;
    requests.abort();
}
