//! [`Route`]: the agent for a name the catalogue resolved to targets: `NAME/model` (one target) or an alias
//! (its targets in order, the fallbacks).
//!
//! Each target is asked in turn. A target that refuses before anything reached the stream (a dial failure,
//! a 429, a 5xx, a timeout: [`is_refusal`]) hands the run to the next; one that has emitted anything, or
//! that failed for a reason another target would share (the client's request, agentmux's credentials), ends
//! the run with its error. Nothing is retried once a byte has reached a client: the stream's log is the
//! witness, since every emit goes through it. A refusal with a `retry-after` cools its target down
//! ([`super::cooldown`]) for the routes of aliases. When every target refused, the client gets the last
//! refusal, with its status and `retry-after`. The target that answered is named in the outcome
//! ([`ServedBy`]), so the stream's end and a thread's audit log say which upstream and model it was; for a
//! run that failed, the target whose failure ended it (so a route ends with an outcome, not an error: the
//! same outcome the run's task would make of the error, with `served_by`).

use std::sync::Arc;

use super::cooldown::Cooldowns;
use super::provider::Provider;
use crate::agent::run::DynAgent;
use crate::agent::{Agent, AgentError, Output, Refusal};
use crate::conversation::Conversation;
use crate::hub::Limits;
use crate::output::{Outcome, ServedBy};

/// Where a target's request goes.
#[derive(Clone)]
pub(crate) enum Answerer {
    /// A registered agent (an alias may name one).
    Agent(Arc<dyn DynAgent>),
    /// An upstream.
    Provider(Provider),
}

/// One place a route may send the request: who answers, and the model name it knows.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) answerer: Answerer,
    pub(crate) model: String,
}

impl Target {
    /// The upstream's name, if the target is a named upstream.
    fn upstream(&self) -> Option<&str> {
        match &self.answerer {
            Answerer::Provider(provider) => provider.name(),
            Answerer::Agent(_) => None,
        }
    }

    /// How logs and the cooldowns name it: `NAME/model`, or the model.
    fn key(&self) -> String {
        match self.upstream() {
            Some(upstream) => format!("{upstream}/{}", self.model),
            None => self.model.clone(),
        }
    }

    /// It, as an outcome names it.
    fn served_by(&self) -> ServedBy {
        ServedBy { upstream: self.upstream().map(str::to_owned), model: self.model.clone() }
    }

    fn host(&self) -> &str {
        match &self.answerer {
            Answerer::Provider(provider) => provider.host(),
            Answerer::Agent(_) => "",
        }
    }

    fn check(&self, conversation: &Conversation, limits: &Limits) -> Result<(), Refusal> {
        let conversation = conversation.clone().for_model(&self.model);
        match &self.answerer {
            Answerer::Agent(agent) => agent.check_dyn(&conversation, limits),
            Answerer::Provider(provider) => provider.agent().check(&conversation, limits),
        }
    }

    /// Runs it on `output`. A model its upstream does not list (looked up once more first) is a 404, which a
    /// route may fall back from.
    async fn run(&self, conversation: &Conversation, output: &Output) -> Result<Outcome, Attempt> {
        let conversation = conversation.clone().for_model(&self.model);
        let result = match &self.answerer {
            Answerer::Agent(agent) => agent.run_boxed(conversation, output.clone()).await,
            Answerer::Provider(provider) => {
                if !provider.serves(&self.model).await {
                    let message = format!("the model {:?} does not exist", self.key());
                    let error = AgentError::new(message).with_code("model_not_found").with_status(404);
                    return Err(Attempt { error, refused: true });
                }
                provider.agent().run(conversation, output.clone()).await
            }
        };
        result.map_err(|error| Attempt { refused: is_refusal(&error), error })
    }
}

/// A target's failure, and whether it was a refusal another target may not share.
struct Attempt {
    error: AgentError,
    refused: bool,
}

/// True for the failures a fallback is for, as the upstream agent reports them (`upstream/error.rs`): a
/// 429, a timeout (504), or a 502 for a dial failure, a 5xx or an error the upstream sent before anything
/// else; not a 502 for agentmux's credentials (`upstream_auth`, every target of the same upstream would
/// refuse them too, and another upstream is no cure for a wrong key) nor for an answer that is not the
/// protocol (`upstream_protocol`), and no 4xx but 429 (the request itself is at fault).
pub(crate) fn is_refusal(error: &AgentError) -> bool {
    match error.status {
        Some(429) => true,
        Some(500..=599) => !matches!(error.code.as_deref(), Some("upstream_auth" | "upstream_protocol")),
        _ => false,
    }
}

/// The outcome of a run that failed with `error`, naming the target whose failure it was (none when no
/// target was asked: every one was cooling down). The same outcome an agent's error gives, with `served_by`.
fn failed(error: AgentError, target: Option<&Target>) -> Outcome {
    Outcome { served_by: target.map(Target::served_by), ..Outcome::failed(error.into_props()) }
}

/// The agent for a routed name.
pub(crate) struct Route {
    /// The alias, when the name is one (its targets cool down after a `retry-after`).
    alias: Option<String>,
    targets: Vec<Target>,
    cooldowns: Arc<Cooldowns>,
}

impl Route {
    /// The route of `alias` (or of a `NAME/model`, `None`) through `targets`, in order.
    pub(crate) fn new(alias: Option<String>, targets: Vec<Target>, cooldowns: Arc<Cooldowns>) -> Route {
        Route { alias, targets, cooldowns }
    }

    /// The refusal `target` is cooling down from, when this route is an alias's.
    fn cooling(&self, target: &Target) -> Option<AgentError> {
        self.alias.as_ref().and_then(|_| self.cooldowns.cooling(&target.key()))
    }
}

impl Agent for Route {
    fn check(&self, conversation: &Conversation, limits: &Limits) -> Result<(), Refusal> {
        self.targets.iter().try_for_each(|target| target.check(conversation, limits))
    }

    async fn run(&self, conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let alias = self.alias.as_deref().unwrap_or("");
        let mut refused: Option<(AgentError, &Target)> = None;
        let mut cooling: Option<AgentError> = None;
        for (index, target) in self.targets.iter().enumerate() {
            if let Some(refusal) = self.cooling(target) {
                tracing::info!(alias, target = target.key(), "skipping a target that is cooling down");
                if cooling.as_ref().is_none_or(|c| c.retry_after > refusal.retry_after) {
                    cooling = Some(refusal);
                }
                continue;
            }
            if output.is_cancelled() {
                return Ok(Outcome::cancelled());
            }
            let before = output.stream().log().last_sequence();
            match target.run(&conversation, &output).await {
                Ok(outcome) => return Ok(Outcome { served_by: Some(target.served_by()), ..outcome }),
                Err(Attempt { error, refused: true }) if output.stream().log().last_sequence() == before => {
                    if self.alias.is_some() {
                        self.cooldowns.refused(&target.key(), &error);
                    }
                    let next = self.targets.get(index + 1).map(Target::key);
                    tracing::warn!(
                        alias,
                        target = target.key(),
                        host = target.host(),
                        status = error.status.unwrap_or_default(),
                        code = error.code.as_deref().unwrap_or(""),
                        next = next.as_deref().unwrap_or("none"),
                        "the target refused before answering: {}",
                        error.message
                    );
                    refused = Some((error, target));
                }
                Err(Attempt { error, .. }) => return Ok(failed(error, Some(target))),
            }
        }
        Ok(match (refused, cooling) {
            (Some((error, target)), _) => failed(error, Some(target)),
            (None, Some(error)) => failed(error, None),
            (None, None) => failed(AgentError::new("the route has no target").with_status(502), None),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_what_another_upstream_may_not_share() {
        let with = |status: u16, code: &str| AgentError::new("x").with_status(status).with_code(code);
        assert!(is_refusal(&with(429, "rate_limit_exceeded")));
        assert!(is_refusal(&with(502, "upstream_connect")));
        assert!(is_refusal(&with(502, "upstream_tls")));
        assert!(is_refusal(&with(502, "upstream_error")));
        assert!(is_refusal(&with(504, "upstream_timeout")));
        assert!(!is_refusal(&with(502, "upstream_auth")));
        assert!(!is_refusal(&with(400, "upstream_bad_request")));
        assert!(!is_refusal(&with(404, "model_not_found")));
        assert!(!is_refusal(&AgentError::new("after the first byte").with_code("upstream_error")));
    }
}
