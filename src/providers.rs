//! The `--models` file: named providers of OpenAI-compatible Chat
//! Completions APIs, checked once at start. API keys are read here (from an
//! environment variable or a file) and kept in a [`Secret`] that never
//! prints.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::seconds;

/// Providers by name, and which one a run gets when it names none.
#[derive(Debug, Clone)]
pub struct ModelsConfig {
    pub providers: Vec<Provider>,
    /// The provider of runs that name none: `default_provider`, or the only one.
    pub default_provider: Option<String>,
}

/// One OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct Provider {
    pub name: String,
    /// Up to the API's root, e.g. `https://api.openai.com/v1`; requests go
    /// to `{base_url}/chat/completions`.
    pub base_url: String,
    pub api_key: Option<Secret>,
    /// The header the key goes in: `Authorization: Bearer KEY` by default,
    /// or the key alone in this header (Azure's `api-key`).
    pub api_key_header: Option<http::HeaderName>,
    /// The model of runs that name none; may be empty.
    pub default_model: String,
    /// Longest wait for a whole answer (connect, send, read).
    pub timeout: Duration,
    pub retry: RetryPolicy,
    /// Requests in flight to this provider at once; more wait their turn.
    pub max_concurrent: usize,
    /// Sent with every request (an organization, a project, a gateway's routing).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// How rate limits (429), server errors (5xx), timeouts and cut connections
/// are retried: each retry is a new durable attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per model call, the first included.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The wait after attempt `attempt` failed: the provider's Retry-After
    /// when it sent one (up to [`MAX_RETRY_AFTER`]), else doubling backoff.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(MAX_RETRY_AFTER);
        }
        let doubled = self
            .initial_backoff
            .saturating_mul(1 << attempt.saturating_sub(1).min(20));
        doubled.min(self.max_backoff)
    }
}

/// Longest Retry-After honoured; a provider asking for more is waited this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// An API key. Debug and Display print `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl ModelsConfig {
    /// Reads and checks a models file (TOML); see docs/models.md.
    pub fn load(path: &Path) -> Result<ModelsConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base, |name| std::env::var(name).ok())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks the TOML text of a models file; `env` looks up `api_key_env`,
    /// and `api_key_file` paths are relative to `base`.
    pub fn parse(
        text: &str,
        base: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ModelsConfig, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            default_provider: Option<String>,
            #[serde(default)]
            provider: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            name: String,
            base_url: String,
            api_key_env: Option<String>,
            api_key_file: Option<std::path::PathBuf>,
            api_key_header: Option<String>,
            #[serde(default)]
            default_model: String,
            timeout_s: Option<f64>,
            max_attempts: Option<u32>,
            initial_backoff_s: Option<f64>,
            max_backoff_s: Option<f64>,
            max_concurrent: Option<u32>,
            #[serde(default)]
            headers: BTreeMap<String, String>,
        }
        let file: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
        if file.provider.is_empty() {
            return Err("no [[provider]]: declare at least one".into());
        }
        let mut providers: Vec<Provider> = Vec::new();
        for entry in file.provider {
            let at = format!("provider '{}'", entry.name);
            let valid_name = !entry.name.is_empty()
                && entry.name.len() <= 64
                && entry
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
            if !valid_name || providers.iter().any(|p| p.name == entry.name) {
                return Err(format!(
                    "{at}: names are unique, up to 64 letters, digits and _ - ."
                ));
            }
            let url: http::Uri = entry
                .base_url
                .parse()
                .map_err(|e| format!("{at}: base_url: {e}"))?;
            if !matches!(url.scheme_str(), Some("http" | "https"))
                || url.host().is_none()
                || url.query().is_some()
            {
                return Err(format!(
                    "{at}: base_url: an http:// or https:// URL with a host and no query"
                ));
            }
            let api_key = match (entry.api_key_env, entry.api_key_file) {
                (None, None) => None,
                (Some(var), None) => {
                    Some(env(&var).ok_or_else(|| format!("{at}: api_key_env: ${var} is not set"))?)
                }
                (None, Some(file)) => {
                    let path = base.join(file);
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("{at}: api_key_file: {}: {e}", path.display()))?;
                    Some(text.trim().to_string())
                }
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "{at}: give at most one of api_key_env and api_key_file"
                    ))
                }
            };
            if let Some(key) = &api_key {
                if key.is_empty() || http::HeaderValue::from_str(key).is_err() {
                    return Err(format!(
                        "{at}: the API key is empty or not valid in an HTTP header"
                    ));
                }
            }
            let api_key_header = entry
                .api_key_header
                .map(|h| {
                    http::HeaderName::try_from(h.as_str())
                        .map_err(|e| format!("{at}: api_key_header: {e}"))
                })
                .transpose()?;
            let mut headers = Vec::new();
            for (name, value) in entry.headers {
                let header = http::HeaderName::try_from(name.as_str())
                    .map_err(|e| format!("{at}: headers.{name}: {e}"))?;
                let value = http::HeaderValue::from_str(&value)
                    .map_err(|e| format!("{at}: headers.{name}: {e}"))?;
                headers.push((header, value));
            }
            let secs = |field: &str, value: Option<f64>, default: f64| {
                let value = value.unwrap_or(default);
                if !(value > 0.0 && value <= 86_400.0) {
                    return Err(format!(
                        "{at}: {field}: {value} is out of range: > 0 and <= 86400"
                    ));
                }
                Ok(seconds::duration(value))
            };
            let max_attempts = entry.max_attempts.unwrap_or(3);
            if !(1..=100).contains(&max_attempts) {
                return Err(format!("{at}: max_attempts: 1 to 100"));
            }
            let max_concurrent = entry.max_concurrent.unwrap_or(16);
            if !(1..=10_000).contains(&max_concurrent) {
                return Err(format!("{at}: max_concurrent: 1 to 10000"));
            }
            providers.push(Provider {
                name: entry.name,
                base_url: entry.base_url.trim_end_matches('/').to_string(),
                api_key: api_key.map(Secret),
                api_key_header,
                default_model: entry.default_model,
                timeout: secs("timeout_s", entry.timeout_s, 120.0)?,
                retry: RetryPolicy {
                    max_attempts,
                    initial_backoff: secs("initial_backoff_s", entry.initial_backoff_s, 1.0)?,
                    max_backoff: secs("max_backoff_s", entry.max_backoff_s, 30.0)?,
                },
                max_concurrent: max_concurrent as usize,
                headers,
            });
        }
        let default_provider = match file.default_provider {
            Some(name) if providers.iter().any(|p| p.name == name) => Some(name),
            Some(name) => return Err(format!("default_provider: no provider '{name}'")),
            None if providers.len() == 1 => Some(providers[0].name.clone()),
            None => None,
        };
        Ok(ModelsConfig {
            providers,
            default_provider,
        })
    }

    /// The provider a run names (empty: the default one).
    pub fn provider(&self, name: &str) -> Result<&Provider, String> {
        let name = match (name, &self.default_provider) {
            ("", Some(default)) => default.as_str(),
            ("", None) => {
                return Err(format!(
                    "required: this server has several providers and no default_provider ({})",
                    self.names()
                ))
            }
            (name, _) => name,
        };
        self.providers
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| format!("no provider '{name}'; this server has: {}", self.names()))
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.providers.iter().map(|p| p.name.as_str()).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ModelsConfig, String> {
        let env = |name: &str| (name == "KEY").then(|| "sk-test-123".to_string());
        ModelsConfig::parse(text, Path::new("."), env)
    }

    #[test]
    fn a_full_provider_reads_back_and_its_key_never_prints() {
        let config = parse(
            r#"
            [[provider]]
            name = "openai"
            base_url = "https://api.openai.com/v1/"
            api_key_env = "KEY"
            default_model = "gpt-4.1-mini"
            timeout_s = 60
            max_attempts = 5
            initial_backoff_s = 0.5
            max_backoff_s = 8
            headers = { "OpenAI-Organization" = "org-1" }
            "#,
        )
        .unwrap();
        let provider = config.provider("").unwrap();
        assert_eq!(provider.base_url, "https://api.openai.com/v1");
        assert_eq!(provider.api_key.as_ref().unwrap().expose(), "sk-test-123");
        assert_eq!(provider.retry.max_attempts, 5);
        assert_eq!(provider.timeout, Duration::from_secs(60));
        assert!(!format!("{config:?}").contains("sk-test-123"));
        assert_eq!(
            provider.retry.delay(1, None),
            Duration::from_millis(500),
            "the first retry waits the initial backoff"
        );
        assert_eq!(provider.retry.delay(9, None), Duration::from_secs(8));
        assert_eq!(
            provider.retry.delay(1, Some(Duration::from_secs(20))),
            Duration::from_secs(20),
            "Retry-After wins over the backoff"
        );
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        for (text, expected) in [
            ("", "no [[provider]]"),
            (
                "[[provider]]\nname = \"a\"\nbase_url = \"ftp://x\"",
                "provider 'a': base_url",
            ),
            (
                "[[provider]]\nname = \"a\"\nbase_url = \"http://x\"\napi_key_env = \"NOPE\"",
                "api_key_env: $NOPE is not set",
            ),
            (
                "[[provider]]\nname = \"a\"\nbase_url = \"http://x\"\ntimeout_s = -1",
                "timeout_s: -1 is out of range",
            ),
            (
                "[[provider]]\nname = \"a\"\nbase_url = \"http://x\"\nmax_attempts = 0",
                "max_attempts: 1 to 100",
            ),
            (
                "[[provider]]\nname = \"a\"\nbase_url = \"http://x\"\nkey = \"sk\"",
                "unknown field `key`",
            ),
            (
                "default_provider = \"b\"\n[[provider]]\nname = \"a\"\nbase_url = \"http://x\"",
                "default_provider: no provider 'b'",
            ),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn a_run_without_a_provider_needs_a_default() {
        let two = "[[provider]]\nname = \"a\"\nbase_url = \"http://x\"\n\
                   [[provider]]\nname = \"b\"\nbase_url = \"http://y\"";
        let config = parse(two).unwrap();
        assert!(config
            .provider("")
            .unwrap_err()
            .contains("no default_provider"));
        assert_eq!(config.provider("b").unwrap().name, "b");
        assert!(config
            .provider("c")
            .unwrap_err()
            .contains("this server has: a, b"));
    }
}
