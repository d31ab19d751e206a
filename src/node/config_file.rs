//! [`ConfigFile`]: `--config agentmux.toml`, the upstreams and aliases: what flags express badly.
//!
//! ```toml
//! [upstreams.openai]
//! url = "https://api.openai.com/v1"
//! key_env = "OPENAI_API_KEY"
//!
//! [upstreams.local]
//! url = "http://127.0.0.1:8080/v1"
//! models = ["qwen2.5-7b"]
//! text_mode = ["qwen2.5-7b"]
//! first_byte_timeout = "5m"
//!
//! [aliases]
//! fast = "local/qwen2.5-7b"
//! smart = ["openai/gpt-4o", "local/qwen2.5-7b"]
//! ```
//!
//! Per upstream: `kind` (`openai`, the default, or `anthropic`), `url`, `key_env` (the variable holding its
//! key; without it, `AGENTMUX_UPSTREAM_<NAME>_KEY` if set), `ca_file` (relative to the file), the three
//! timeouts, `headers`, fixed `models`, `text_mode`. What a file leaves out comes from the flags
//! (`--upstream-connect-timeout`, `--upstream-ca-file`, ...). The file is read strictly: an unknown key, a
//! value of the wrong type, a `key_env` naming an unset variable, a header that is not one, a CA file that
//! cannot be read are each an error naming the file, the line and what is wrong, and the service does not
//! start. Parsing is the `toml` crate's, through serde (`deny_unknown_fields`); nothing here opens a socket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::agent::{UpstreamConfig, UpstreamKind};

/// The upstreams and aliases a config file defines.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ConfigFile {
    /// The named upstreams: `NAME/model` goes to `NAME`.
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    /// The aliases: each a model, or several tried in order.
    pub aliases: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    upstreams: BTreeMap<String, toml::Spanned<Entry>>,
    #[serde(default)]
    aliases: BTreeMap<String, Targets>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(default)]
    kind: Kind,
    url: String,
    key_env: Option<String>,
    ca_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "duration")]
    connect_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    first_byte_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    idle_timeout: Option<Duration>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    models: Option<Vec<String>>,
    #[serde(default)]
    text_mode: Vec<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Kind {
    #[default]
    OpenAi,
    Anthropic,
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a model name, or a list of model names tried in order")]
enum Targets {
    One(String),
    Many(Vec<String>),
}

/// A duration as people write it (`10s`, `2m`, `1h 30m`).
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration (10s, 2m, 1h): {e}")))
}

/// The variable an upstream's key is read from unless its `key_env` says otherwise:
/// `AGENTMUX_UPSTREAM_<NAME>_KEY`, `NAME` upper-cased with anything not a letter or digit as `_`.
///
/// ```
/// assert_eq!(agentmux::node::key_variable("open-router"), "AGENTMUX_UPSTREAM_OPEN_ROUTER_KEY");
/// ```
pub fn key_variable(name: &str) -> String {
    let name: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("AGENTMUX_UPSTREAM_{name}_KEY")
}

impl ConfigFile {
    /// Reads the file at `path`; every upstream starts from `defaults` (the flags' timeouts, CA, tool rounds)
    /// and takes its key from the process's environment.
    pub fn read(path: &Path, defaults: &UpstreamConfig) -> Result<ConfigFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ConfigFile::parse(&text, path, defaults, &|name| std::env::var(name).ok())
    }

    /// Parses `text`, the file at `path` (which errors name, and relative CA paths start from), with `env`
    /// as the environment.
    pub fn parse(
        text: &str,
        path: &Path,
        defaults: &UpstreamConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ConfigFile, String> {
        let file: File =
            toml::from_str(text).map_err(|e| format!("{}: {}", path.display(), e.to_string().trim_end()))?;
        let mut config = ConfigFile::default();
        for (name, entry) in file.upstreams {
            let line = text[..entry.span().start.min(text.len())].matches('\n').count() + 1;
            let at = |what: String| format!("{}, line {line}: upstreams.{name}: {what}", path.display());
            let upstream = entry.into_inner().upstream(&name, path, defaults, env).map_err(at)?;
            config.upstreams.insert(name, upstream);
        }
        for (name, targets) in file.aliases {
            let targets = match targets {
                Targets::One(target) => vec![target],
                Targets::Many(targets) => targets,
            };
            config.aliases.insert(name, targets);
        }
        Ok(config)
    }
}

impl Entry {
    /// The upstream this entry describes, over `defaults`.
    fn upstream(
        self,
        name: &str,
        path: &Path,
        defaults: &UpstreamConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<UpstreamConfig, String> {
        let url = url::Url::parse(&self.url).map_err(|e| format!("url {:?}: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("url {:?}: not http:// or https://", self.url));
        }
        let key = match &self.key_env {
            Some(variable) => Some(
                env(variable)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| format!("key_env: the variable {variable} is not set"))?,
            ),
            None => env(&key_variable(name)).filter(|k| !k.is_empty()),
        };
        for (header, value) in &self.headers {
            reqwest::header::HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| format!("headers: {header:?} is not a header name"))?;
            reqwest::header::HeaderValue::from_str(value)
                .map_err(|_| format!("headers.{header}: the value is not a header value"))?;
        }
        let ca_pem = match &self.ca_file {
            Some(file) => {
                let file = path.parent().map_or_else(|| file.clone(), |dir| dir.join(file));
                Some(std::fs::read(&file).map_err(|e| format!("ca_file {}: {e}", file.display()))?)
            }
            None => defaults.ca_pem.clone(),
        };
        Ok(UpstreamConfig {
            kind: match self.kind {
                Kind::OpenAi => UpstreamKind::OpenAiChat,
                Kind::Anthropic => UpstreamKind::Anthropic,
            },
            key,
            headers: self.headers.into_iter().collect(),
            models: self.models,
            text_mode: self.text_mode,
            ca_pem,
            connect_timeout: self.connect_timeout.unwrap_or(defaults.connect_timeout),
            first_byte_timeout: self.first_byte_timeout.unwrap_or(defaults.first_byte_timeout),
            idle_timeout: self.idle_timeout.unwrap_or(defaults.idle_timeout),
            ..UpstreamConfig { base_url: self.url, ..defaults.clone() }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, String> {
        let env =
            |name: &str| (name == "OPENAI_API_KEY" || name == "AGENTMUX_UPSTREAM_LOCAL_KEY").then(|| "sk-x".into());
        ConfigFile::parse(text, Path::new("agentmux.toml"), &UpstreamConfig::new(""), &env)
    }

    #[test]
    fn upstreams_and_aliases() {
        let config = parse(
            "[upstreams.openai]\nurl = \"https://api.openai.com/v1\"\nkey_env = \"OPENAI_API_KEY\"\n\
             headers = { \"OpenAI-Project\" = \"p\" }\n\n[upstreams.local]\nkind = \"openai\"\n\
             url = \"http://127.0.0.1:8080/v1\"\nmodels = [\"qwen\"]\nidle_timeout = \"5m\"\n\n\
             [aliases]\nfast = \"local/qwen\"\nsmart = [\"openai/gpt-4o\", \"local/qwen\"]\n",
        )
        .unwrap();
        let openai = &config.upstreams["openai"];
        assert_eq!((openai.key.as_deref(), openai.headers.len()), (Some("sk-x"), 1));
        let local = &config.upstreams["local"];
        assert_eq!((local.key.as_deref(), local.idle_timeout), (Some("sk-x"), Duration::from_secs(300)));
        assert_eq!(config.aliases["fast"], ["local/qwen"]);
        assert_eq!(config.aliases["smart"], ["openai/gpt-4o", "local/qwen"]);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        let unknown = parse("[upstreams.a]\nurl = \"http://h/v1\"\nmodel = [\"m\"]\n").unwrap_err();
        assert!(
            unknown.contains("agentmux.toml") && unknown.contains("line 3") && unknown.contains("model"),
            "{unknown}"
        );
        let unset = parse("\n[upstreams.a]\nurl = \"http://h/v1\"\nkey_env = \"NOPE\"\n").unwrap_err();
        assert!(unset.contains("line 2") && unset.contains("upstreams.a") && unset.contains("NOPE"), "{unset}");
        let timeout = parse("[upstreams.a]\nurl = \"http://h/v1\"\nidle_timeout = \"soon\"\n").unwrap_err();
        assert!(timeout.contains("soon"), "{timeout}");
        assert!(parse("[upstreams.a]\nurl = \"ftp://h\"\n").is_err());
        assert!(parse("[upstreams.a]\nurl = \"http://h\"\nheaders = { \"a b\" = \"c\" }\n").is_err());
        assert!(parse("[aliases]\nx = 3\n").unwrap_err().contains("model name"));
    }
}
