//! The `--mcp` file: the upstream MCP servers aaa stands in front of, by
//! child process or Streamable HTTP URL, which of their tools it exposes
//! under which name, and each tool's gate as a worker's `ToolDefinition`
//! (checked like one by [`super::load`]). Header and environment values
//! (an upstream's credentials) are kept in a [`Secret`] that never prints.
//! This file reads the TOML only: [`crate::config`] holds what it reads,
//! so it imports nothing above the ground floor.

use std::collections::BTreeMap;
use std::path::Path;

use crate::proto;

/// The upstreams, in the file's order.
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub upstreams: Vec<Upstream>,
}

/// One upstream MCP server.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub name: String,
    pub transport: Transport,
    pub tools: Vec<ExposedTool>,
}

/// How aaa reaches an upstream.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A child process speaking MCP over its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Set for the child on top of aaa's environment; values may be
        /// credentials, so they never print.
        env: Vec<(String, Secret)>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        url: String,
        /// Sent with every request (credentials among them): never printed.
        headers: Vec<(http::HeaderName, Secret)>,
    },
}

/// An upstream tool as aaa's clients see it.
#[derive(Debug, Clone)]
pub struct ExposedTool {
    /// The tool's name at the upstream.
    pub upstream_name: String,
    /// Its gate and its name as exposed (`definition.name`), as a worker
    /// declares a tool; `parameters_json` is the upstream's `inputSchema`,
    /// filled in when aaa connects.
    pub definition: proto::ToolDefinition,
    /// A description to show instead of the upstream's.
    pub description: Option<String>,
}

/// A value that may be a credential. Debug prints `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl McpConfig {
    /// Reads and checks an MCP file (TOML); see docs/mcp.md.
    pub fn load(path: &Path) -> Result<McpConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text, |name| std::env::var(name).ok())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks the TOML text of an MCP file; `env` looks up the variables
    /// that `env_from` and `headers_from_env` name.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<McpConfig, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            #[serde(default)]
            upstream: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            name: String,
            command: Option<String>,
            #[serde(default)]
            args: Vec<String>,
            #[serde(default)]
            env: BTreeMap<String, String>,
            #[serde(default)]
            env_from: BTreeMap<String, String>,
            url: Option<String>,
            #[serde(default)]
            headers: BTreeMap<String, String>,
            #[serde(default)]
            headers_from_env: BTreeMap<String, String>,
            #[serde(default)]
            tool: Vec<ToolEntry>,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct ToolEntry {
            name: String,
            expose_as: Option<String>,
            description: Option<String>,
            #[serde(default)]
            requires_approval: bool,
            #[serde(default)]
            approvers: Vec<String>,
            #[serde(default)]
            approvals_required: u32,
            #[serde(default)]
            approval_timeout_s: f64,
            #[serde(default)]
            remind_after_s: f64,
            #[serde(default)]
            reminders: u32,
            #[serde(default)]
            escalate_after_s: f64,
            #[serde(default)]
            escalate_to: Vec<String>,
            #[serde(default)]
            heartbeat_timeout_s: f64,
            #[serde(default)]
            max_attempts: u32,
        }
        let file: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
        if file.upstream.is_empty() {
            return Err("no [[upstream]]: declare at least one".into());
        }
        let mut upstreams: Vec<Upstream> = Vec::new();
        let mut exposed: Vec<String> = Vec::new();
        for entry in file.upstream {
            let at = format!("upstream '{}'", crate::domain::clip::clip(&entry.name));
            crate::domain::check::name("name", &entry.name).map_err(|e| format!("{at}: {e}"))?;
            if upstreams.iter().any(|u| u.name == entry.name) {
                return Err(format!("{at}: name: another upstream has this name"));
            }
            let transport = match (entry.command, entry.url) {
                (Some(command), None) => {
                    if command.trim().is_empty() {
                        return Err(format!("{at}: command: is empty"));
                    }
                    if !entry.headers.is_empty() || !entry.headers_from_env.is_empty() {
                        return Err(format!(
                            "{at}: headers: only an upstream with a url sends headers"
                        ));
                    }
                    let mut vars: Vec<(String, Secret)> = entry
                        .env
                        .into_iter()
                        .map(|(k, v)| (k, Secret::new(v)))
                        .collect();
                    for (key, from) in entry.env_from {
                        let value = env(&from).ok_or_else(|| {
                            format!(
                                "{at}: env_from.{key}: the environment variable {from} is not set"
                            )
                        })?;
                        vars.push((key, Secret::new(value)));
                    }
                    Transport::Stdio {
                        command,
                        args: entry.args,
                        env: vars,
                    }
                }
                (None, Some(url)) => {
                    if !entry.args.is_empty() || !entry.env.is_empty() || !entry.env_from.is_empty()
                    {
                        return Err(format!(
                            "{at}: args, env: only an upstream with a command has them"
                        ));
                    }
                    let uri: http::Uri = url.parse().map_err(|e| format!("{at}: url: {e}"))?;
                    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                        return Err(format!("{at}: url: needs http:// or https:// and a host"));
                    }
                    let mut headers = Vec::new();
                    let literal = entry.headers.into_iter().map(|(k, v)| (k, Ok(v)));
                    let from_env = entry.headers_from_env.into_iter().map(|(k, from)| {
                        let value = env(&from).ok_or_else(|| {
                            format!("{at}: headers_from_env.{k}: the environment variable {from} is not set")
                        });
                        (k, value)
                    });
                    for (key, value) in literal.chain(from_env) {
                        let value = value?;
                        let header = http::HeaderName::from_bytes(key.as_bytes())
                            .map_err(|_| format!("{at}: headers: '{key}' is not a header name"))?;
                        // Checked here, so that sending it never fails; the
                        // value itself is never quoted.
                        http::HeaderValue::from_str(&value).map_err(|_| {
                            format!("{at}: headers.{key}: the value is not a valid header value")
                        })?;
                        headers.push((header, Secret::new(value)));
                    }
                    Transport::Http { url, headers }
                }
                _ => {
                    return Err(format!(
                        "{at}: give either command (a child process) or url (Streamable HTTP)"
                    ))
                }
            };
            if entry.tool.is_empty() {
                return Err(format!(
                    "{at}: no [[upstream.tool]]: name the tools to expose"
                ));
            }
            let mut tools = Vec::new();
            for (i, tool) in entry.tool.into_iter().enumerate() {
                let name = tool.expose_as.clone().unwrap_or_else(|| tool.name.clone());
                let definition = proto::ToolDefinition {
                    name: name.clone(),
                    description: tool.description.clone().unwrap_or_default(),
                    // The upstream's schema replaces it once aaa connects.
                    parameters_json: "{}".into(),
                    requires_approval: tool.requires_approval,
                    retry: Some(proto::RetryPolicy {
                        max_attempts: tool.max_attempts,
                        ..Default::default()
                    }),
                    heartbeat_timeout_s: tool.heartbeat_timeout_s,
                    approval_timeout_s: tool.approval_timeout_s,
                    approvals_required: tool.approvals_required,
                    approvers: tool.approvers,
                    remind_after_s: tool.remind_after_s,
                    reminders: tool.reminders,
                    escalate_after_s: tool.escalate_after_s,
                    escalate_to: tool.escalate_to,
                };
                if exposed.contains(&name) {
                    return Err(format!(
                        "{at}: tool[{i}].expose_as: another tool is exposed as '{name}'"
                    ));
                }
                crate::domain::check::name("tool.name", &tool.name)
                    .map_err(|e| format!("{at}: tool[{i}].{e}"))?;
                exposed.push(name);
                tools.push(ExposedTool {
                    upstream_name: tool.name,
                    definition,
                    description: tool.description,
                });
            }
            upstreams.push(Upstream {
                name: entry.name,
                transport,
                tools,
            });
        }
        Ok(McpConfig { upstreams })
    }

    /// Every exposed tool with its upstream.
    pub fn tools(&self) -> impl Iterator<Item = (&Upstream, &ExposedTool)> {
        self.upstreams
            .iter()
            .flat_map(|u| u.tools.iter().map(move |t| (u, t)))
    }
}
