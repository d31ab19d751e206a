//! A real agentmux server on `127.0.0.1:0` for the tests that go over sockets.

use std::net::SocketAddr;

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::{Hub, HubConfig};
use agentmux::node::{Engine, Node, NodeConfig};
use agentmux::thread::Threads;
use tokio::sync::oneshot;

/// A running server; shut down when dropped.
pub(crate) struct TestServer {
    /// `http://127.0.0.1:<port>`
    pub(crate) base: String,
    /// The address it listens on.
    pub(crate) addr: SocketAddr,
    /// Its hub, for looking inside.
    pub(crate) hub: Hub,
    /// Its threads, for looking inside (and sweeping by hand after moving the hub's clock).
    #[allow(dead_code)]
    pub(crate) threads: Threads,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// A server with the built-in agents and default settings.
    pub(crate) async fn start() -> TestServer {
        TestServer::with(HubConfig::default(), Settings::default(), Agents::builtin()).await
    }

    /// A server with the given hub config, settings and agents: a whole node in memory, as
    /// `agentmux --ephemeral` runs one.
    pub(crate) async fn with(config: HubConfig, settings: Settings, agents: Agents) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let mut node = NodeConfig::new(Engine::Memory);
        (node.hub, node.settings, node.agents) = (config, settings, agents);
        let node = Node::open(node).await.expect("a node in memory opens");
        let hub = node.hub().clone();
        let threads = node.app().threads.clone();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(node.serve(listener, async move {
            let _ = rx.await;
        }));
        TestServer { base: format!("http://{addr}"), addr, hub, threads, shutdown: Some(tx), task: Some(task) }
    }

    /// `base` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Signals shutdown and waits for the server to stop.
    pub(crate) async fn stop(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or_else(|e| Err(std::io::Error::other(e))),
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
