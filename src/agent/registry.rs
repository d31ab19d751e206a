//! [`Agents`]: model names to agents, what `GET /v1/models` lists and a chat request's `model` selects.
//!
//! A name is looked up among the registered agents first, then in the catalogue of upstreams and aliases
//! (`catalogue/`), which routes `NAME/model`, aliases with their fallbacks, and the unnamed upstream.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Agent;
#[cfg(feature = "upstream")]
use super::UpstreamAgent;
use super::builtin::{DemoAgent, EchoAgent, ReplayAgent};
use super::run::{DynAgent, start};
use crate::conversation::Conversation;
use crate::hub::{Hub, HubError, Stream};

/// Why a request could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No agent has that name.
    #[error("the model {0:?} does not exist")]
    UnknownModel(String),
    /// The hub refused a new stream.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The agent will not take the request (see [`super::Agent::check`]).
    #[error(transparent)]
    Refused(#[from] super::Refusal),
}

/// The agents a service offers, by model name.
///
/// ```
/// use agentmux::agent::{Agent, AgentError, Agents, Output};
/// use agentmux::conversation::Conversation;
/// use agentmux::output::Outcome;
///
/// struct Hello;
/// impl Agent for Hello {
///     async fn run(&self, _: Conversation, output: Output) -> Result<Outcome, AgentError> {
///         output.text("hello")?;
///         Ok(Outcome::completed())
///     }
/// }
///
/// let mut agents = Agents::builtin();
/// agents.register("hello", Hello);
/// assert!(agents.contains("hello") && agents.contains("demo") && agents.contains("replay/plain-text"));
/// ```
#[derive(Clone, Default)]
pub struct Agents {
    agents: BTreeMap<String, Arc<dyn DynAgent>>,
    /// The upstreams and aliases: every model no agent above has.
    #[cfg(feature = "upstream")]
    catalogue: super::catalogue::Catalogue,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

impl Agents {
    /// No agents.
    pub fn new() -> Self {
        Agents::default()
    }

    /// `demo`, `echo`, and `replay/<name>` for every fixture built in.
    pub fn builtin() -> Self {
        let mut agents = Agents::new();
        agents.register("demo", DemoAgent::default());
        agents.register("echo", EchoAgent);
        for replay in ReplayAgent::builtin() {
            agents.register(format!("replay/{}", replay.name()), replay);
        }
        agents
    }

    /// Adds (or replaces) the agent for `model`.
    pub fn register(&mut self, model: impl Into<String>, agent: impl Agent) -> &mut Self {
        self.agents.insert(model.into(), Arc::new(agent));
        self
    }

    /// Sends every model no registered agent, named upstream or alias has to `upstream`, as it is named (the
    /// unnamed upstream).
    #[cfg(feature = "upstream")]
    pub fn set_upstream(&mut self, upstream: UpstreamAgent) -> &mut Self {
        self.catalogue.set_unnamed(upstream);
        self
    }

    /// The unnamed upstream, when there is one.
    #[cfg(feature = "upstream")]
    pub fn upstream(&self) -> Option<&UpstreamAgent> {
        self.catalogue.unnamed()
    }

    /// Adds the upstream `name`: a request for `name/model` goes to it, asking for `model`. A name that is
    /// taken (by another upstream, an alias, or the prefix of registered agents such as `replay`) or that is
    /// not a word (letters, digits, `-`, `_`, `.`) is an error.
    ///
    /// ```
    /// use agentmux::agent::{Agents, UpstreamAgent, UpstreamConfig};
    ///
    /// let mut config = UpstreamConfig::new("http://127.0.0.1:8081/v1");
    /// config.models = Some(vec!["qwen".into()]);
    /// let mut agents = Agents::builtin();
    /// agents.add_upstream("local", UpstreamAgent::new(config, Default::default()).unwrap()).unwrap();
    /// agents.add_alias("fast", vec!["local/qwen".into(), "echo".into()]).unwrap();
    /// assert!(agents.names().contains(&"local/qwen".to_owned()) && agents.contains("fast"));
    /// assert!(agents.add_alias("slow", vec!["nowhere/qwen".into()]).is_err());
    /// ```
    #[cfg(feature = "upstream")]
    pub fn add_upstream(&mut self, name: &str, upstream: UpstreamAgent) -> Result<&mut Self, String> {
        self.catalogue.add_upstream(name, upstream, &self.agents)?;
        Ok(self)
    }

    /// Adds the alias `name` for `targets`, tried in order: a target that refuses before answering (a dial
    /// failure, a 429, a 5xx) hands the request to the next. Each target is a registered agent, a named
    /// upstream's `NAME/model`, or (with an unnamed upstream) a model of it; add the upstreams first.
    #[cfg(feature = "upstream")]
    pub fn add_alias(&mut self, name: &str, targets: Vec<String>) -> Result<&mut Self, String> {
        self.catalogue.add_alias(name, targets, &self.agents)?;
        Ok(self)
    }

    /// True when a request for `model` would start an agent: a registered one, or one the catalogue routes.
    pub fn contains(&self, model: &str) -> bool {
        self.agent(model).is_some()
    }

    fn agent(&self, model: &str) -> Option<Arc<dyn DynAgent>> {
        if let Some(agent) = self.agents.get(model) {
            return Some(Arc::clone(agent));
        }
        #[cfg(feature = "upstream")]
        return self.catalogue.agent(model, &self.agents);
        #[cfg(not(feature = "upstream"))]
        None
    }

    /// `model` as a metric label: itself when it is a name [`Agents::names`] lists, else `other`, so that
    /// made-up names (which an upstream may still answer) add no series.
    pub(crate) fn label<'a>(&self, model: &'a str) -> &'a str {
        #[cfg(feature = "upstream")]
        let listed = self.agents.contains_key(model) || self.catalogue.knows(model);
        #[cfg(not(feature = "upstream"))]
        let listed = self.agents.contains_key(model);
        if listed { model } else { "other" }
    }

    /// The model names: the registered agents', then the unnamed upstream's as last known, every named
    /// upstream's as `NAME/model`, and the aliases; sorted, each once.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.agents.keys().cloned().collect();
        #[cfg(feature = "upstream")]
        names.extend(self.catalogue.names());
        names.sort();
        names.dedup();
        names
    }

    /// Starts the agent `conversation.model()` names on a new stream of `hub`, counted against `client`'s budget
    /// when there is one (see [`Hub::create_for`]); see [`super::run`].
    pub fn start(
        &self,
        hub: &Hub,
        client: Option<&str>,
        conversation: Conversation,
    ) -> Result<Arc<Stream>, StartError> {
        let model = conversation.model();
        let agent = self.agent(model).ok_or_else(|| StartError::UnknownModel(model.to_owned()))?;
        agent.check_dyn(&conversation, &hub.config().limits)?;
        Ok(start(hub, client, agent, conversation)?)
    }
}
