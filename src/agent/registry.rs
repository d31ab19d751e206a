//! [`Agents`]: model names to agents, what `GET /v1/models` lists and a chat request's `model` selects.

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
    /// Answers every model no agent above has.
    #[cfg(feature = "upstream")]
    upstream: Option<(UpstreamAgent, Arc<dyn DynAgent>)>,
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

    /// Sends every model no registered agent has to `upstream`.
    #[cfg(feature = "upstream")]
    pub fn set_upstream(&mut self, upstream: UpstreamAgent) -> &mut Self {
        let agent: Arc<dyn DynAgent> = Arc::new(upstream.clone());
        self.upstream = Some((upstream, agent));
        self
    }

    /// The upstream, when there is one.
    #[cfg(feature = "upstream")]
    pub fn upstream(&self) -> Option<&UpstreamAgent> {
        self.upstream.as_ref().map(|(upstream, _)| upstream)
    }

    /// True when a request for `model` would start an agent: a registered one, or the upstream.
    pub fn contains(&self, model: &str) -> bool {
        self.agent(model).is_some()
    }

    fn agent(&self, model: &str) -> Option<&Arc<dyn DynAgent>> {
        #[cfg(feature = "upstream")]
        if let Some((_, upstream)) = &self.upstream {
            return Some(self.agents.get(model).unwrap_or(upstream));
        }
        self.agents.get(model)
    }

    /// The model names: the registered agents', then the upstream's as last known; sorted, each once.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.agents.keys().cloned().collect();
        #[cfg(feature = "upstream")]
        if let Some((upstream, _)) = &self.upstream {
            names.extend(upstream.models());
        }
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
        Ok(start(hub, client, Arc::clone(agent), conversation)?)
    }
}
