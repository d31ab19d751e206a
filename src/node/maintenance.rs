//! [`Maintenance`]: the node's background work, which lasts exactly as long as the node.
//!
//! Nothing a client does triggers it: an idle stream must end though nobody calls, an expired stream or
//! thread must go and give its memory back, and every upstream's model list must follow its upstream. Each job
//! is a task of the node's; dropping the [`Maintenance`] aborts them all, so a node dropped (or a test's
//! server stopped) leaves nothing running behind it.

use std::time::Duration;

use tokio::task::JoinHandle;

#[cfg(feature = "upstream")]
use crate::agent::UpstreamAgent;
use crate::hub::Hub;
use crate::thread::Threads;

/// How often the hub and the threads are swept, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How often an upstream's model list is read again.
#[cfg(feature = "upstream")]
const LIST_MODELS_EVERY: Duration = Duration::from_secs(300);

/// The node's background tasks; aborted when dropped.
#[derive(Debug, Default)]
pub(super) struct Maintenance {
    tasks: Vec<JoinHandle<()>>,
}

impl Maintenance {
    /// Sweeps `hub` and `threads` about once a second (more often when the hub's idle timeout or retention
    /// is shorter than four seconds, so they hold to within a quarter of themselves), so idle streams end,
    /// expired streams and threads go, and memory comes back when nobody calls.
    pub(super) fn sweep(&mut self, hub: Hub, threads: Threads) {
        let config = hub.config();
        let shortest = [config.idle_timeout, config.retention].into_iter().filter(|d| !d.is_zero()).min();
        let every = shortest.map_or(SWEEP_EVERY, |d| (d / 4).clamp(Duration::from_millis(10), SWEEP_EVERY));
        self.tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                hub.sweep();
                threads.sweep();
            }
        }));
    }

    /// Lists the models of every upstream of `upstreams` (by name; `None` for the unnamed one) now, all at
    /// once (a failure is logged, and retried with the next listing), then each every five minutes on a job of
    /// its own, so `GET /v1/models` follows each upstream and a slow one holds up none of the others.
    #[cfg(feature = "upstream")]
    pub(super) async fn list_models(&mut self, upstreams: Vec<(Option<String>, UpstreamAgent)>) {
        let first = upstreams.iter().map(|(name, upstream)| async move {
            let (name, url) = (name.as_deref().unwrap_or(""), upstream.base_url());
            match upstream.refresh_models().await {
                Ok(count) => tracing::info!(upstream = url, name, models = count, "upstream ready"),
                Err(e) => {
                    tracing::warn!(upstream = url, name, "could not list the upstream's models (will retry): {e}")
                }
            }
        });
        futures::future::join_all(first).await;
        for (name, upstream) in upstreams {
            self.tasks.push(tokio::spawn(async move {
                let (name, url) = (name.unwrap_or_default(), upstream.base_url().to_owned());
                let mut ticks = tokio::time::interval(LIST_MODELS_EVERY);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    if let Err(e) = upstream.refresh_models().await {
                        tracing::warn!(upstream = url, name, "could not list the upstream's models: {e}");
                    }
                }
            }));
        }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}
