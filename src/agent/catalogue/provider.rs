//! [`Provider`]: one upstream of the catalogue: its agent, its name (none for the unnamed upstream), its host
//! for log lines, and the on-demand lookup of its model list.
//!
//! The maintenance lists every provider's models on its own schedule. Between two listings a provider may
//! have gained a model: a request for `NAME/x` where `x` is not in the last list looks the list up once more
//! before the client is told 404, but no more often than [`LOOKUP_EVERY`] per provider, so a client asking
//! for made-up names cannot turn each request into a call to the upstream. Requests that arrive while a
//! lookup runs wait for it rather than start their own. A provider whose list is empty (its `GET /models`
//! failed, or it has none) is asked for any model: the upstream itself then says whether it has it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::UpstreamAgent;

/// The least time between two on-demand lookups of one provider's model list.
pub(crate) const LOOKUP_EVERY: Duration = Duration::from_secs(10);

/// One upstream in the catalogue.
#[derive(Clone, Debug)]
pub(crate) struct Provider {
    name: Option<String>,
    agent: UpstreamAgent,
    host: String,
    looked_up: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

impl Provider {
    /// The upstream `agent`, by `name` (`None`: the unnamed one).
    pub(crate) fn new(name: Option<String>, agent: UpstreamAgent) -> Provider {
        let host = url::Url::parse(agent.base_url())
            .ok()
            .and_then(|url| {
                url.host_str().map(|host| format!("{host}{}", url.port().map_or(String::new(), |p| format!(":{p}"))))
            })
            .unwrap_or_else(|| "?".to_owned());
        Provider { name, agent, host, looked_up: Arc::default() }
    }

    /// Its name; `None` for the unnamed upstream.
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Its agent.
    pub(crate) fn agent(&self) -> &UpstreamAgent {
        &self.agent
    }

    /// Its host and port, what a log line names (never the URL's path or query, never the key).
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// True when `model` is in its last list.
    pub(crate) fn lists(&self, model: &str) -> bool {
        self.agent.models().iter().any(|m| m == model)
    }

    /// True when a request for `model` should go to it: `model` is in its list, once more looked up if it was
    /// not (at most every [`LOOKUP_EVERY`]), or its list is empty (the upstream decides).
    pub(crate) async fn serves(&self, model: &str) -> bool {
        if self.lists(model) {
            return true;
        }
        {
            let mut looked_up = self.looked_up.lock().await;
            if looked_up.is_none_or(|at| at.elapsed() >= LOOKUP_EVERY) {
                *looked_up = Some(Instant::now());
                if let Err(error) = self.agent.refresh_models().await {
                    tracing::warn!(
                        upstream = self.name.as_deref().unwrap_or(""),
                        host = self.host,
                        "could not list the upstream's models: {error}"
                    );
                }
            }
        }
        let models = self.agent.models();
        models.is_empty() || models.iter().any(|m| m == model)
    }
}
