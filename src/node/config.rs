//! [`NodeConfig`]: everything a node is made of, as data, before anything is opened.
//!
//! The binary turns its flags into one of these; an application embedding agentmux builds one in code. It is
//! plain data on purpose: nothing here opens a file, dials Redis or spawns a task, so a config can be built,
//! inspected and changed freely, and [`super::Node::open`] is the one place that acts on it, in order.

#[cfg(feature = "upstream")]
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "upstream")]
use crate::agent::UpstreamConfig;
use crate::agent::{Agents, Tools};
#[cfg(feature = "redis")]
use crate::cluster::ClusterConfig;
use crate::http::Settings;
use crate::hub::HubConfig;

/// Where a node keeps its streams and threads.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Engine {
    /// Memory only: a restart loses everything.
    Memory,
    /// The embedded SQLite store in this directory (created on first open): streams, threads and the audit
    /// log survive a restart.
    #[cfg(feature = "store")]
    Store(PathBuf),
    /// Redis, shared by every node of a cluster: any node serves any stream and any thread.
    #[cfg(feature = "redis")]
    Redis(ClusterConfig),
}

impl Engine {
    /// How long an ended stream stays readable unless the config says otherwise: a day when it is kept
    /// somewhere that outlives the process, ten minutes in memory.
    pub fn default_retention(&self) -> Duration {
        match self {
            Engine::Memory => Duration::from_secs(600),
            #[cfg(feature = "store")]
            Engine::Store(_) => Duration::from_secs(24 * 3600),
            #[cfg(feature = "redis")]
            Engine::Redis(_) => Duration::from_secs(24 * 3600),
        }
    }
}

/// Everything [`super::Node::open`] assembles.
///
/// ```
/// use agentmux::node::{Engine, NodeConfig};
///
/// let mut config = NodeConfig::new(Engine::Memory);
/// config.settings.default_model = "echo".into();
/// assert_eq!(config.hub.retention.as_secs(), 600);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeConfig {
    /// Where streams and threads are kept.
    pub engine: Engine,
    /// The hub's limits, retention, idle timeout, clock and ids. Its `storage` is the engine's: whatever it
    /// holds here is replaced when the node opens.
    pub hub: HubConfig,
    /// The service's settings: transport, limits of requests, keys, browsers, threads.
    pub settings: Settings,
    /// The agents, by model name ([`Agents::builtin`] by default).
    pub agents: Agents,
    /// The unnamed upstream: a model server for every model no agent of `agents`, named upstream or alias
    /// has, if any (`--upstream-url`).
    #[cfg(feature = "upstream")]
    pub upstream: Option<UpstreamConfig>,
    /// The named upstreams: a request for `NAME/model` goes to the upstream `NAME` (`--upstream NAME=URL`,
    /// the config file's `[upstreams.NAME]`).
    #[cfg(feature = "upstream")]
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    /// The aliases: a name for one model, or for several tried in order (the fallbacks).
    #[cfg(feature = "upstream")]
    pub aliases: BTreeMap<String, Vec<String>>,
    /// The tools the upstream agent runs itself.
    pub tools: Tools,
}

impl NodeConfig {
    /// The embedded defaults over `engine`: the built-in agents, default limits and settings, and the
    /// engine's retention ([`Engine::default_retention`]).
    pub fn new(engine: Engine) -> NodeConfig {
        let hub = HubConfig { retention: engine.default_retention(), ..HubConfig::default() };
        NodeConfig {
            engine,
            hub,
            settings: Settings::default(),
            agents: Agents::builtin(),
            #[cfg(feature = "upstream")]
            upstream: None,
            #[cfg(feature = "upstream")]
            upstreams: BTreeMap::new(),
            #[cfg(feature = "upstream")]
            aliases: BTreeMap::new(),
            tools: Tools::new(),
        }
    }
}
