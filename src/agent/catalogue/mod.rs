//! [`Catalogue`]: the upstreams and aliases behind the names no registered agent has, and what
//! `GET /v1/models` lists of them.
//!
//! [`super::Agents`] looks a name up among its registered agents (`demo`, `echo`, `replay/*`, an
//! application's own) first, then here, in this order:
//!
//! 1. an **alias** (`fast`, or `smart` = `["anthropic/claude", "openai/gpt-4o"]`) goes to its targets in
//!    order, the later ones as fallbacks (`route.rs`);
//! 2. **`NAME/model`**, where `NAME` is a named upstream, goes to that upstream with `model` as the model
//!    name it knows (looked up once more before a 404 when its list lacks it: `provider.rs`);
//! 3. anything else goes to the **unnamed upstream** (`--upstream-url`) as it is, if there is one: today's
//!    behaviour, unchanged.
//!
//! Every check a name needs happens when an upstream or alias is added, so a route built for a request
//! never meets a name it cannot place: upstream names are words without `/` that no registered agent's
//! prefix (`replay`) takes, aliases do not shadow a registered agent, and each alias target names a
//! registered agent, a named upstream's model, or (with an unnamed upstream) a bare model; an alias does not
//! name another alias. The catalogue is what bounds the `model` label of the run metrics too: only names it
//! knows ([`Catalogue::knows`]) become a label.

mod cooldown;
mod provider;
mod route;

use std::collections::BTreeMap;
use std::sync::Arc;

use self::cooldown::Cooldowns;
use self::provider::Provider;
use self::route::{Answerer, Route, Target};
use super::UpstreamAgent;
use super::run::DynAgent;

/// The upstreams (one unnamed, any number named) and the aliases.
#[derive(Clone, Default)]
pub(crate) struct Catalogue {
    unnamed: Option<(Provider, Arc<dyn DynAgent>)>,
    named: BTreeMap<String, Provider>,
    aliases: BTreeMap<String, Vec<String>>,
    cooldowns: Arc<Cooldowns>,
}

/// The registered agents, as the catalogue sees them when it resolves a name.
pub(crate) type Registered = BTreeMap<String, Arc<dyn DynAgent>>;

impl Catalogue {
    /// Sends every name nothing else has to `upstream`.
    pub(crate) fn set_unnamed(&mut self, upstream: UpstreamAgent) {
        let agent: Arc<dyn DynAgent> = Arc::new(upstream.clone());
        self.unnamed = Some((Provider::new(None, upstream), agent));
    }

    /// The unnamed upstream.
    pub(crate) fn unnamed(&self) -> Option<&UpstreamAgent> {
        self.unnamed.as_ref().map(|(provider, _)| provider.agent())
    }

    /// Adds the upstream `name` (its models are `name/model`); a name that is taken or not a word is an error.
    pub(crate) fn add_upstream(
        &mut self,
        name: &str,
        upstream: UpstreamAgent,
        registered: &Registered,
    ) -> Result<(), String> {
        check_word("upstream", name)?;
        if self.named.contains_key(name) {
            return Err(format!("the upstream {name:?} is defined twice"));
        }
        if registered.keys().any(|agent| agent.split_once('/').is_some_and(|(prefix, _)| prefix == name)) {
            return Err(format!("the upstream name {name:?} is the prefix of built-in agents ({name}/...)"));
        }
        if self.aliases.contains_key(name) {
            return Err(format!("{name:?} is both an upstream and an alias"));
        }
        self.named.insert(name.to_owned(), Provider::new(Some(name.to_owned()), upstream));
        Ok(())
    }

    /// Adds the alias `name` for `targets`, in order (the later ones are fallbacks); each must name something.
    pub(crate) fn add_alias(
        &mut self,
        name: &str,
        targets: Vec<String>,
        registered: &Registered,
    ) -> Result<(), String> {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("the alias {name:?} is not a name (empty, or with spaces)"));
        }
        if self.aliases.contains_key(name) {
            return Err(format!("the alias {name:?} is defined twice"));
        }
        if registered.contains_key(name) {
            return Err(format!("the alias {name:?} would hide the built-in agent of that name"));
        }
        if self.named.contains_key(name) || self.split(name).is_some() {
            return Err(format!("the alias {name:?} takes an upstream's name"));
        }
        if targets.is_empty() {
            return Err(format!("the alias {name:?} has no target"));
        }
        if let Some((other, _)) = self.aliases.iter().find(|(_, targets)| targets.iter().any(|t| t == name)) {
            return Err(format!("the alias {other:?} names the alias {name:?}: aliases name models only"));
        }
        for target in &targets {
            if self.aliases.contains_key(target) || *target == name {
                return Err(format!("the alias {name:?} names the alias {target:?}: aliases name models only"));
            }
            let known = registered.contains_key(target) || self.split(target).is_some() || self.unnamed.is_some();
            if !known {
                return Err(format!(
                    "the alias {name:?} names {target:?}, which is no built-in agent and no NAME/model of a \
                     configured upstream"
                ));
            }
        }
        self.aliases.insert(name.to_owned(), targets);
        Ok(())
    }

    /// `NAME/model` as the named upstream and the model, when `NAME` is one.
    fn split<'a>(&self, name: &'a str) -> Option<(&Provider, &'a str)> {
        let (upstream, model) = name.split_once('/')?;
        Some((self.named.get(upstream)?, model)).filter(|_| !model.is_empty())
    }

    /// The agent for `model`, which no registered agent has: an alias's route, a named upstream's, or the
    /// unnamed upstream.
    pub(crate) fn agent(&self, model: &str, registered: &Registered) -> Option<Arc<dyn DynAgent>> {
        if let Some(targets) = self.aliases.get(model) {
            let targets = targets.iter().filter_map(|target| self.target(target, registered)).collect();
            return Some(Arc::new(Route::new(Some(model.to_owned()), targets, Arc::clone(&self.cooldowns))));
        }
        if let Some((provider, name)) = self.split(model) {
            let target = Target { answerer: Answerer::Provider(provider.clone()), model: name.to_owned() };
            return Some(Arc::new(Route::new(None, vec![target], Arc::clone(&self.cooldowns))));
        }
        self.unnamed.as_ref().map(|(_, agent)| Arc::clone(agent))
    }

    /// Where an alias's `target` goes.
    fn target(&self, target: &str, registered: &Registered) -> Option<Target> {
        if let Some(agent) = registered.get(target) {
            return Some(Target { answerer: Answerer::Agent(Arc::clone(agent)), model: target.to_owned() });
        }
        if let Some((provider, model)) = self.split(target) {
            return Some(Target { answerer: Answerer::Provider(provider.clone()), model: model.to_owned() });
        }
        let (provider, _) = self.unnamed.as_ref()?;
        Some(Target { answerer: Answerer::Provider(provider.clone()), model: target.to_owned() })
    }

    /// The names it lists: the unnamed upstream's models, every named upstream's as `NAME/model`, the aliases.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.unnamed().map(UpstreamAgent::models).unwrap_or_default();
        for (name, provider) in &self.named {
            names.extend(provider.agent().models().into_iter().map(|model| format!("{name}/{model}")));
        }
        names.extend(self.aliases.keys().cloned());
        names
    }

    /// True when `model` is a name it lists (what a metric label may be).
    pub(crate) fn knows(&self, model: &str) -> bool {
        self.aliases.contains_key(model)
            || self.split(model).is_some_and(|(provider, name)| provider.lists(name))
            || self.unnamed.as_ref().is_some_and(|(provider, _)| provider.lists(model))
    }
}

/// An upstream's name: letters, digits, `-`, `_` and `.`, at most 64.
fn check_word(what: &str, name: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 64 || !name.chars().all(word) {
        return Err(format!("the {what} name {name:?} is not a word (letters, digits, - _ .; at most 64)"));
    }
    Ok(())
}
