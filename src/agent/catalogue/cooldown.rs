//! [`Cooldowns`]: the targets of aliases that refused with a `retry-after`, skipped by later requests until
//! then.
//!
//! An upstream that answered 429 (or 503) with `retry-after: 30` has said when to come back; asking it again
//! sooner costs the client the time of a refusal before the fallback answers. So the refusal is kept, by
//! target (an upstream's name and a model), until its time is up: a route skips a target that is cooling down,
//! and when every target of a route is, the client gets the refusal that ends first, with the time left as
//! its `retry-after`. The map holds at most one entry per target an alias names (the catalogue's
//! configuration bounds it), and an entry whose time is up is dropped when next looked at.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::agent::AgentError;
use crate::sync::lock;

/// Refusals with a `retry-after`, by target, until their time is up.
#[derive(Debug, Default)]
pub(crate) struct Cooldowns {
    until: Mutex<HashMap<String, (Instant, AgentError)>>,
}

impl Cooldowns {
    /// Keeps `refusal` for `target` for its `retry_after`, if it has one.
    pub(crate) fn refused(&self, target: &str, refusal: &AgentError) {
        let Some(after) = refusal.retry_after.filter(|after| !after.is_zero()) else { return };
        lock(&self.until).insert(target.to_owned(), (Instant::now() + after, refusal.clone()));
    }

    /// The refusal `target` is cooling down from, with the time left as its `retry_after`; `None` once its
    /// time is up (the entry is then dropped).
    pub(crate) fn cooling(&self, target: &str) -> Option<AgentError> {
        let mut until = lock(&self.until);
        let (end, refusal) = until.get(target)?;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            until.remove(target);
            return None;
        }
        let mut refusal = refusal.clone();
        // Whole seconds, rounded up: a client that waits that long finds the target ready.
        refusal.retry_after = Some(Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0)));
        Some(refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_cools_its_target_for_its_retry_after() {
        let cooldowns = Cooldowns::default();
        let mut refusal = AgentError::new("slow down").with_status(429);
        cooldowns.refused("a/m", &refusal);
        assert!(cooldowns.cooling("a/m").is_none(), "no retry-after, no cooldown");
        refusal.retry_after = Some(Duration::from_secs(30));
        cooldowns.refused("a/m", &refusal);
        let cooling = cooldowns.cooling("a/m").map(|r| (r.status, r.retry_after));
        assert_eq!(cooling, Some((Some(429), Some(Duration::from_secs(30)))));
        assert!(cooldowns.cooling("b/m").is_none());
    }
}
