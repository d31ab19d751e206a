//! [`Node`]: one agentmux service, assembled in order from a [`NodeConfig`], with its maintenance running.
//!
//! What a node is made of depends on each other in one order, stated here and nowhere else:
//!
//! 1. the **engine**: the embedded store is opened (or Redis connected), and becomes the hub's storage;
//! 2. the **hub**, over that storage;
//! 3. what the engine kept is **restored**: streams into the hub (ended streams readable again, streams
//!    that were open ended `interrupted`), then threads into the thread registry, once the app (5) holds
//!    it ([`Store::restore_threads`]);
//! 4. the **agents**, with the upstreams (the unnamed one and the named ones) and the aliases of the catalogue,
//!    if any are configured (every upstream's models listed once now, all at once, then each every five
//!    minutes on its own);
//! 5. the **app** every handler shares (credentials signed with the engine's secret, so tokens outlive a
//!    restart or work on every node);
//! 6. the **maintenance**: the sweeps that end idle streams, evict expired streams and threads, and give
//!    memory back when nobody calls. It runs from [`Node::open`] until the node is dropped, whether the node
//!    serves its own listener ([`Node::serve`]) or is mounted in another axum server ([`Node::router`]).
//!
//! ```no_run
//! use agentmux::node::{Engine, Node, NodeConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let node = Node::open(NodeConfig::new(Engine::Store("agentmux-data".into()))).await?;
//! let listener = agentmux::node::listen("127.0.0.1:8080").await?;
//! node.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```

mod config;
#[cfg(feature = "upstream")]
mod config_file;
mod listen;
mod maintenance;

use std::future::Future;
use std::sync::Arc;

pub use config::{Engine, NodeConfig};
#[cfg(feature = "upstream")]
pub use config_file::{ConfigFile, key_variable};
pub use listen::listen;

#[cfg(feature = "upstream")]
use crate::agent::UpstreamAgent;
#[cfg(feature = "redis")]
use crate::cluster::Cluster;
use crate::http::App;
use crate::hub::Hub;
#[cfg(feature = "store")]
use crate::store::{Restart, Store, StoreError};
use maintenance::Maintenance;

/// Why a node could not open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The embedded store could not be opened or read back.
    #[cfg(feature = "store")]
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Redis could not be reached (the URL is given without its credentials).
    #[cfg(feature = "redis")]
    #[error("connecting to Redis at {at}: {error}")]
    Redis {
        /// Where, without user or password.
        at: String,
        /// What the client said.
        error: String,
    },
    /// The upstream model server's settings are unusable (a malformed URL, say).
    #[cfg(feature = "upstream")]
    #[error("the upstream: {0}")]
    Upstream(String),
}

/// A running agentmux service: the hub, the agents, the threads and the app over them, with its maintenance.
/// Dropping it stops the maintenance (and, once served, [`Node::serve`] has already shut down in phases).
#[derive(Debug)]
pub struct Node {
    app: App,
    /// What the store gave back at start.
    #[cfg(feature = "store")]
    restart: Restart,
    /// The embedded store, if the node keeps one: flushed once serving is over, so what the shutdown wrote
    /// (the ends of the streams it ended) is on disk before the process goes.
    #[cfg(feature = "store")]
    store: Option<Arc<Store>>,
    /// The cluster, if the node is one of several through Redis: its writer is flushed once serving is over,
    /// as the store is, so the ends the shutdown wrote reach the other nodes.
    #[cfg(feature = "redis")]
    cluster: Option<Cluster>,
    _maintenance: Maintenance,
}

impl Node {
    /// Opens, restores and assembles everything `config` names, in the order the module doc gives, and starts
    /// the maintenance. Must be called inside a tokio runtime.
    pub async fn open(config: NodeConfig) -> Result<Node, NodeError> {
        #[cfg(feature = "upstream")]
        let NodeConfig { engine, mut hub, settings, agents, upstream, upstreams, aliases, tools } = config;
        #[cfg(not(feature = "upstream"))]
        let NodeConfig { engine, mut hub, settings, agents, tools: _ } = config;
        let engine = Kept::open(engine, &mut hub).await?;
        let hub = Hub::new(hub);
        #[cfg(feature = "store")]
        let restart = engine.restore_streams(&hub)?;
        let mut maintenance = Maintenance::default();
        #[cfg(feature = "upstream")]
        let agents = with_upstreams(agents, upstream, upstreams, aliases, tools, &mut maintenance).await?;
        let app = engine.app(hub, agents, settings);
        maintenance.sweep(app.hub.clone(), app.threads.clone());
        Ok(Node {
            app,
            #[cfg(feature = "store")]
            restart,
            #[cfg(feature = "store")]
            store: engine.store(),
            #[cfg(feature = "redis")]
            cluster: engine.cluster(),
            _maintenance: maintenance,
        })
    }

    /// The app every handler shares: the hub, the agents, the threads, the settings.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// The streams.
    pub fn hub(&self) -> &crate::hub::Hub {
        &self.app.hub
    }

    /// What the engine gave back when the node opened (all zero without a store).
    #[cfg(feature = "store")]
    pub fn restart(&self) -> Restart {
        self.restart
    }

    /// Every route, to mount in an axum server of your own. The maintenance runs for as long as this node
    /// lives, so keep it (an event stream served this way goes through hyper, not the node's own transport,
    /// and a shutdown is yours to run).
    pub fn router(&self) -> axum::Router {
        crate::http::router(self.app.clone())
    }

    /// Serves on `listener` until `shutdown` completes, then shuts down in phases (no new work; open streams
    /// get the grace to end; connections get the drain to send what they owe), and returns once what the
    /// shutdown wrote is kept: a stream it ended reads `shutdown` after a restart, not `interrupted`.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let served = crate::http::serve(listener, self.app.clone(), shutdown).await;
        #[cfg(feature = "store")]
        if let Some(store) = self.store.clone() {
            // The writer's flush waits on its thread: off the runtime's workers.
            tokio::task::spawn_blocking(move || store.flush()).await.map_err(std::io::Error::other)?;
        }
        #[cfg(feature = "redis")]
        if let Some(cluster) = &self.cluster {
            // Bounded: a Redis that is away would hold the exit for ever; what it did not take, the other nodes
            // end `interrupted` once this node's lease lapses.
            if !cluster.flush(self.app.settings.shutdown_drain.max(std::time::Duration::from_secs(1))).await {
                tracing::error!("Redis did not take what the shutdown wrote before the drain ran out");
            }
        }
        served
    }
}

/// The engine once opened: where the hub's storage and the threads' come from.
enum Kept {
    Memory,
    #[cfg(feature = "store")]
    Store(Arc<Store>),
    #[cfg(feature = "redis")]
    Redis(Cluster),
}

impl Kept {
    /// Opens `engine` and makes it the storage of the hub `hub` configures.
    async fn open(
        engine: Engine,
        #[cfg_attr(not(any(feature = "store", feature = "redis")), expect(unused_variables))]
        hub: &mut crate::hub::HubConfig,
    ) -> Result<Kept, NodeError> {
        Ok(match engine {
            Engine::Memory => Kept::Memory,
            #[cfg(feature = "store")]
            Engine::Store(dir) => {
                let store = Store::open(&dir)?;
                hub.storage = Arc::clone(&store) as Arc<dyn crate::hub::Storage>;
                Kept::Store(store)
            }
            #[cfg(feature = "redis")]
            Engine::Redis(mut cluster) => {
                // A stream's keys in Redis live as long as the hub keeps the stream.
                (cluster.idle_timeout, cluster.retention) = (hub.idle_timeout, hub.retention);
                let at = without_credentials(&cluster.redis_url);
                tracing::info!(redis = %at, "connecting to Redis");
                let cluster =
                    Cluster::connect(cluster).await.map_err(|e| NodeError::Redis { at, error: e.to_string() })?;
                hub.storage = cluster.storage();
                Kept::Redis(cluster)
            }
        })
    }

    /// The streams the store kept, back in `hub` (ended ones readable again, open ones ended `interrupted`).
    #[cfg(feature = "store")]
    fn restore_streams(&self, hub: &Hub) -> Result<Restart, NodeError> {
        let Kept::Store(store) = self else { return Ok(Restart::default()) };
        let restart = store.restore(hub)?;
        tracing::info!(
            store = %store.path().display(),
            streams = restart.streams,
            interrupted = restart.interrupted,
            expired = restart.expired,
            threads = restart.threads,
            "store opened"
        );
        Ok(restart)
    }

    /// The app over `hub` and `agents`: its threads kept where the engine keeps them (and the store's back in
    /// them), its tokens signed with the engine's secret.
    fn app(&self, hub: Hub, agents: crate::agent::Agents, settings: crate::http::Settings) -> App {
        let agents = Arc::new(agents);
        match self {
            Kept::Memory => App::new(hub, agents, settings),
            #[cfg(feature = "store")]
            Kept::Store(store) => {
                let app = App::with_store(hub, agents, settings, Some(Arc::clone(store)));
                store.restore_threads(&app.threads);
                app
            }
            #[cfg(feature = "redis")]
            Kept::Redis(cluster) => App::new(hub, agents, settings).with_cluster(cluster.clone()),
        }
    }

    /// The cluster, if the engine is Redis.
    #[cfg(feature = "redis")]
    fn cluster(&self) -> Option<Cluster> {
        match self {
            Kept::Redis(cluster) => Some(cluster.clone()),
            _ => None,
        }
    }

    /// The store, if the engine is one.
    #[cfg(feature = "store")]
    fn store(&self) -> Option<Arc<Store>> {
        match self {
            Kept::Store(store) => Some(Arc::clone(store)),
            _ => None,
        }
    }
}

/// `agents`, with the unnamed upstream, the named ones and the aliases (in that order, so an alias finds
/// the upstreams it names); every upstream's models listed now, concurrently, then by the maintenance.
#[cfg(feature = "upstream")]
async fn with_upstreams(
    mut agents: crate::agent::Agents,
    unnamed: Option<crate::agent::UpstreamConfig>,
    named: std::collections::BTreeMap<String, crate::agent::UpstreamConfig>,
    aliases: std::collections::BTreeMap<String, Vec<String>>,
    tools: crate::agent::Tools,
    maintenance: &mut Maintenance,
) -> Result<crate::agent::Agents, NodeError> {
    let mut listed = Vec::new();
    if let Some(config) = unnamed {
        let upstream = UpstreamAgent::new(config, tools.clone()).map_err(NodeError::Upstream)?;
        agents.set_upstream(upstream.clone());
        listed.push((None, upstream));
    }
    for (name, config) in named {
        let upstream =
            UpstreamAgent::new(config, tools.clone()).map_err(|e| NodeError::Upstream(format!("{name}: {e}")))?;
        agents.add_upstream(&name, upstream.clone()).map_err(NodeError::Upstream)?;
        listed.push((Some(name), upstream));
    }
    for (name, targets) in aliases {
        agents.add_alias(&name, targets).map_err(NodeError::Upstream)?;
    }
    maintenance.list_models(listed).await;
    Ok(agents)
}

/// A URL as it may be logged: without the user and password it may carry (`redis://:secret@host`), nor its
/// query.
pub(crate) fn without_credentials(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(before, _)| before);
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/').map_or(rest, |(authority, _)| authority).rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{host}{}", rest.find('/').map_or("", |at| &rest[at..])),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn a_logged_url_has_no_credentials() {
        assert_eq!(without_credentials("redis://:secret@redis.internal:6379/2"), "redis://redis.internal:6379/2");
        assert_eq!(without_credentials("rediss://user:p@ss@host"), "rediss://host");
        assert_eq!(without_credentials("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(without_credentials("redis://host/0?password=x@y"), "redis://host/0");
    }
}
