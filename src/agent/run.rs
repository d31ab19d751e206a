//! Running an agent on a stream: the task that owns the run and ends the stream.
//!
//! The agent runs in its own Tokio task, so nothing a subscriber does (reading slowly, going away) reaches
//! it. When the agent returns, the stream ends with its outcome; an error ends it with status `error`; a panic
//! is caught and ends it with `agent_panicked`. A cancel ends the stream at once (status `cancelled`, so
//! watchers learn of it without waiting for the agent) and fires the token the agent watches; an agent
//! that does not return within the grace period is dropped.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::Instrument;

use super::{Agent, AgentError, Output, Refusal};
use crate::conversation::Conversation;
use crate::hub::{Hub, HubError, Limits, Stream};
use crate::output::{ErrorProps, Outcome};

/// How long a cancelled agent has to return before its task drops it.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// An [`Agent`] behind a pointer: what the registry keeps.
pub(crate) trait DynAgent: Send + Sync {
    fn run_boxed(&self, conversation: Conversation, output: Output) -> BoxFuture<'_, Result<Outcome, AgentError>>;
    fn check_dyn(&self, conversation: &Conversation, limits: &Limits) -> Result<(), Refusal>;
}

impl<A: Agent> DynAgent for A {
    fn run_boxed(&self, conversation: Conversation, output: Output) -> BoxFuture<'_, Result<Outcome, AgentError>> {
        Box::pin(self.run(conversation, output))
    }

    fn check_dyn(&self, conversation: &Conversation, limits: &Limits) -> Result<(), Refusal> {
        self.check(conversation, limits)
    }
}

/// Starts `agent` on a new stream of `hub` for `conversation`, and returns the stream at once. Must be called
/// within a Tokio runtime.
///
/// ```
/// use std::sync::Arc;
/// use agentmux::agent::{self, EchoAgent};
/// use agentmux::conversation::Conversation;
/// use agentmux::hub::Hub;
/// use agentmux::render::Format;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let hub = Hub::default();
/// let stream = agent::run(&hub, Arc::new(EchoAgent), Conversation::user("echo", "hi there")).unwrap();
/// let mut subscriber = stream.subscribe(Format::OPENAI, 0).unwrap();
/// let mut body = Vec::new();
/// while let Some(batch) = subscriber.next().await {
///     body.extend_from_slice(&batch.to_bytes());
/// }
/// assert!(String::from_utf8(body).unwrap().ends_with("data: [DONE]\n\n"));
/// # });
/// ```
pub fn run<A: Agent>(hub: &Hub, agent: Arc<A>, conversation: Conversation) -> Result<Arc<Stream>, HubError> {
    start(hub, None, agent, conversation)
}

pub(crate) fn start(
    hub: &Hub,
    client: Option<&str>,
    agent: Arc<dyn DynAgent>,
    conversation: Conversation,
) -> Result<Arc<Stream>, HubError> {
    let stream = hub.create_for(client, conversation.model())?;
    let span = tracing::info_span!("agent", stream = stream.id(), model = conversation.model());
    let task_stream = Arc::clone(&stream);
    tokio::spawn(
        async move {
            let outcome = drive(agent, conversation, &task_stream).await;
            if let Some(outcome) = outcome {
                tracing::debug!(status = ?outcome.status, "agent finished");
                task_stream.end(outcome);
            }
        }
        .instrument(span),
    );
    Ok(stream)
}

/// Runs the agent to its outcome; `None` when it was cancelled and did not return within the grace period.
async fn drive(agent: Arc<dyn DynAgent>, conversation: Conversation, stream: &Arc<Stream>) -> Option<Outcome> {
    let cancelled = stream.cancellation();
    let run = AssertUnwindSafe(agent.run_boxed(conversation, Output::new(Arc::clone(stream)))).catch_unwind();
    tokio::pin!(run);
    let result = tokio::select! {
        result = &mut run => result,
        () = cancelled.cancelled() => match tokio::time::timeout(CANCEL_GRACE, &mut run).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!("the agent did not stop within {CANCEL_GRACE:?} of the cancel; dropped");
                return None;
            }
        },
    };
    Some(match result {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => Outcome::failed(error.into_props()),
        Err(_) => {
            tracing::error!("the agent panicked");
            Outcome::failed(ErrorProps {
                message: "the agent panicked".into(),
                code: Some("agent_panicked".into()),
                details: None,
            })
        }
    })
}
