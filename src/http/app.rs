//! [`App`], what every handler shares, and [`Settings`], what the service is told: a leaf of their own, which
//! the three wings (`transport/`, `api/`, `edge/`) and the router read, and which reads none of them but for
//! the types of its fields.
//!
//! The fields the rest of `crate::http` needs and an embedding application must not touch (the store, the
//! cluster, where the shutdown is, the feeds) are visible to `crate::http` only.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::edge::{Credentials, HttpError, KeySpec, Metrics, Origins};
use super::transport::feed;
use super::transport::lifetime::Lifetime;
use crate::agent::Agents;
use crate::hub::Hub;
#[cfg(feature = "store")]
use crate::store::Store;
use crate::thread::{MemoryThreadStorage, ThreadConfig, ThreadStorage, Threads};

/// Transport settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A `: ping` after this long without an event (15 s).
    pub keep_alive: Duration,
    /// The largest request body (8 MiB); a declared `Content-Length` over it is refused at once.
    pub body_limit: usize,
    /// How long a request body may take to arrive (30 s).
    pub body_timeout: Duration,
    /// The most connections served at once (4,096 here; the binary sizes it from its open-file limit). One
    /// past it is answered 503 `capacity` and closed, while the others keep being served.
    pub max_connections: usize,
    /// The most connections one client address (an IPv6 /64) holds at once; `None`: its share of
    /// `max_connections` ([`Settings::client_connections`]). One past it is answered 429
    /// `client_connections` and closed, while other addresses keep being served.
    pub connections_per_client: Option<usize>,
    /// How long a connection gets to send a request's head, from when it opens or its previous response
    /// ended (10 s): a slow head and an idle keep-alive connection are closed after it.
    pub head_timeout: Duration,
    /// A WebSocket connection is pinged after this long without a ping (20 s; zero: never, and no idle
    /// timeout either).
    pub ws_ping_interval: Duration,
    /// A WebSocket connection from which nothing (no pong, no frame) arrived for this long is closed with
    /// 1008 (60 s; more than `ws_ping_interval`).
    pub ws_idle_timeout: Duration,
    /// The largest WebSocket message or frame from a client (1 MiB).
    pub ws_max_message: usize,
    /// On shutdown, how long open streams get to finish before they are ended with an error (10 s).
    pub shutdown_grace: Duration,
    /// On shutdown, after the grace, how long connections get to send what they still owe before they are
    /// dropped (5 s).
    pub shutdown_drain: Duration,
    /// The model a chat request without one gets (`demo`).
    pub default_model: String,
    /// The limits of server-side threads.
    pub threads: ThreadConfig,
    /// The API keys (none: no credential is needed; see `edge/auth.rs`).
    pub api_keys: Vec<KeySpec>,
    /// The origins whose pages may use the service from a browser (see `edge/browser.rs`).
    pub cors_origins: Origins,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            keep_alive: Duration::from_secs(15),
            body_limit: 8 << 20,
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            connections_per_client: None,
            head_timeout: Duration::from_secs(10),
            ws_ping_interval: Duration::from_secs(20),
            ws_idle_timeout: Duration::from_secs(60),
            ws_max_message: 1 << 20,
            shutdown_grace: Duration::from_secs(10),
            shutdown_drain: Duration::from_secs(5),
            default_model: "demo".into(),
            threads: ThreadConfig::default(),
            api_keys: Vec::new(),
            cors_origins: Origins::default(),
        }
    }
}

impl Settings {
    /// The most connections one client address holds at once: `connections_per_client`, or by default a
    /// tenth of `max_connections` but at least 64 (and never more than the cap).
    pub fn client_connections(&self) -> usize {
        let share = (self.max_connections / 10).max(CLIENT_CONNECTIONS_FLOOR).min(self.max_connections);
        self.connections_per_client.unwrap_or(share)
    }
}

/// The fewest connections one client address may hold by default, however small the cap: a browser's six
/// per host for every tab of a few, a server's pool.
const CLIENT_CONNECTIONS_FLOOR: usize = 64;

/// What every handler shares; cheap to clone: axum hands each request a clone of it, so every field is a
/// shared pointer or a handle over one (the settings and the shutdown's tokens too), and a clone copies no
/// string or list.
#[derive(Debug, Clone)]
pub struct App {
    /// The streams.
    pub hub: Hub,
    /// The agents, by model name.
    pub agents: Arc<Agents>,
    /// The server-side threads.
    pub threads: Threads,
    /// Transport settings, shared: read them through the `Arc` (`app.settings.keep_alive`); they are fixed
    /// when the app is made ([`App::new`] takes them by value).
    pub settings: Arc<Settings>,
    /// The keys and the secret stream tokens are signed with.
    pub credentials: Arc<Credentials>,
    /// What `GET /metrics` shows.
    pub metrics: Metrics,
    /// The store, if streams and threads are kept in one.
    #[cfg(feature = "store")]
    pub(super) store: Option<Arc<Store>>,
    /// The other nodes, through Redis (`--engine redis`): streams this hub does not hold are followed.
    #[cfg(feature = "redis")]
    pub(super) cluster: Option<crate::cluster::Cluster>,
    /// Where the service is in its shutdown.
    pub(super) lifetime: Arc<Lifetime>,
    /// The writers of waiting event connections (`transport/feed.rs`).
    pub(super) feeds: feed::Feeds,
    /// The copy of the app that long-lived connections share (see [`App::shared`]).
    shared: Arc<Mutex<Weak<App>>>,
}

impl App {
    /// An app over `hub` and `agents`, with `settings`, keeping threads in memory only; its stream tokens
    /// last as long as the process (their secret is made now).
    pub fn new(hub: Hub, agents: Arc<Agents>, settings: Settings) -> Self {
        App::over(hub, agents, settings, crate::hub::random_secret(), Arc::new(MemoryThreadStorage))
    }

    /// An app whose threads `store` keeps (the hub should keep its streams there too: see
    /// [`crate::store::Store`]), and whose tokens outlive a restart (signed with the store's secret). The
    /// threads it kept from before a restart come back with [`Store::restore_threads`], as its streams do
    /// with [`Store::restore`].
    #[cfg(feature = "store")]
    pub fn with_store(hub: Hub, agents: Arc<Agents>, settings: Settings, store: Option<Arc<Store>>) -> Self {
        let Some(store) = store else { return App::new(hub, agents, settings) };
        let storage = Arc::clone(&store) as Arc<dyn ThreadStorage>;
        let mut app = App::over(hub, agents, settings, store.secret(), storage);
        app.store = Some(store);
        app
    }

    /// The app: its credentials signed with `secret`, its threads kept by `storage`.
    fn over(
        hub: Hub,
        agents: Arc<Agents>,
        settings: Settings,
        secret: [u8; 32],
        storage: Arc<dyn ThreadStorage>,
    ) -> Self {
        let credentials = Arc::new(Credentials::new(&settings.api_keys, secret, Arc::clone(&hub.config().clock)));
        let threads = Threads::with_storage(hub.clone(), Arc::clone(&agents), settings.threads.clone(), storage);
        App {
            hub,
            agents,
            threads,
            settings: Arc::new(settings),
            credentials,
            metrics: Metrics::new(),
            #[cfg(feature = "store")]
            store: None,
            #[cfg(feature = "redis")]
            cluster: None,
            lifetime: Arc::default(),
            feeds: feed::Feeds::default(),
            shared: Arc::default(),
        }
    }

    /// One copy of the app for what holds it for as long as a connection is open (a WebSocket, for its
    /// ops): made when the first asks and kept while any holds it, so that each does not hold an app of its
    /// own (half a kilobyte, and its settings' strings, per idle WebSocket).
    pub(crate) fn shared(&self) -> Arc<App> {
        let mut shared = crate::sync::lock(&self.shared);
        if let Some(app) = shared.upgrade() {
            return app;
        }
        let app = Arc::new(self.clone());
        *shared = Arc::downgrade(&app);
        app
    }

    /// The same app, serving the streams of the other nodes of `cluster` too (`--engine redis`).
    #[cfg(feature = "redis")]
    pub fn with_cluster(mut self, cluster: crate::cluster::Cluster) -> Self {
        // A token one node gave is good on every node.
        let clock = Arc::clone(&self.hub.config().clock);
        self.credentials = Arc::new(Credentials::new(&self.settings.api_keys, cluster.secret(), clock));
        // A conversation goes on whichever node its next turn reaches.
        let storage = Arc::new(cluster.threads(self.settings.threads.ttl));
        self.threads =
            Threads::with_storage(self.hub.clone(), Arc::clone(&self.agents), self.settings.threads.clone(), storage);
        self.cluster = Some(cluster);
        self
    }

    /// 503 `shutting_down` once the service is stopping: for what would start new work.
    pub(crate) fn refuse_new_work(&self) -> Result<(), HttpError> {
        if self.lifetime.draining.is_cancelled() { Err(HttpError::shutting_down()) } else { Ok(()) }
    }
}
