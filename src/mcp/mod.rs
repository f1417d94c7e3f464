//! aaa as an approval gateway in front of MCP servers (see docs/mcp.md).
//!
//! An MCP client calls tools at `/mcp`; each call becomes one tool call in
//! a run, gated, recorded and executed as any other. The parts:
//!
//! - [`config`]: the `--mcp` file (upstreams, exposed tools, their gates);
//! - [`upstream`]: aaa as a client of one upstream MCP server;
//! - [`worker`]: the in-process worker of the exposed tools: it takes their
//!   tasks from the engine and calls the upstream once per attempt;
//! - [`session`]: the model of the MCP sessions' runs, driven by the
//!   gateway itself: each `tools/call` is the model's next turn, proposing
//!   exactly that call;
//! - [`server`]: the MCP server at `/mcp` (Streamable HTTP, rmcp), behind
//!   the same authentication as every other caller;
//! - [`stdio`]: `aaa mcp --server ADDR`, the same over stdio for clients
//!   that only launch processes (a relay to `/mcp`).
//!
//! The gateway lives as long as the server; the engine it works with may
//! change (a cluster's shards move), so it is looked up at each call.

pub mod config;
pub mod server;
pub mod session;
pub mod stdio;
pub mod upstream;
pub mod worker;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::domain::event::ToolSpec;
use crate::engine::Engine;

pub use config::McpConfig;
use upstream::Connection;

/// The model name of the MCP sessions' runs (served by the gateway only:
/// workers may not register or poll it).
pub const MODEL: &str = crate::domain::check::MCP_MODEL;
/// The worker identity the gateway's tool and model tasks are handed to.
pub const IDENTITY: &str = crate::domain::check::MCP_WORKER;

/// The exposed tools, their upstreams, and the engine of the moment.
pub struct Gateway {
    tools: BTreeMap<String, Exposed>,
    engine: RwLock<Option<Engine>>,
    sessions: session::Routes,
}

/// One exposed tool.
pub struct Exposed {
    pub connection: Arc<Connection>,
    /// The tool's name at its upstream.
    pub upstream_name: String,
    /// As registered with the engine: the exposed name, the gate, and the
    /// upstream's input schema.
    pub spec: ToolSpec,
    /// As `tools/list` shows it to aaa's clients.
    pub tool: rmcp::model::Tool,
}

/// Reads and checks an MCP file: the TOML ([`McpConfig::load`]), then each
/// exposed tool's gate as RegisterWorker checks a `ToolDefinition`. The
/// error names the upstream and the field (`aaa serve` exits 64 with it).
pub fn load(path: &std::path::Path) -> Result<McpConfig, String> {
    let config = McpConfig::load(path)?;
    for upstream in &config.upstreams {
        for (i, tool) in upstream.tools.iter().enumerate() {
            spec_of(upstream, i, tool).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(config)
}

/// The exposed tool `i` of `upstream` as the engine registers it.
fn spec_of(
    upstream: &config::Upstream,
    i: usize,
    tool: &config::ExposedTool,
) -> Result<ToolSpec, String> {
    crate::api::convert::tool_definition(i, tool.definition.clone()).map_err(|e| {
        // `tools[0].approvals_required` as the file spells it.
        let message = e.to_string();
        let message = match message.strip_prefix("tools[") {
            Some(rest) => format!("tool[{rest}"),
            None => message,
        };
        let message = message.replacen("].name:", "].expose_as (or name):", 1);
        format!("upstream '{}': {message}", upstream.name)
    })
}

/// `aaa mcp ls`: each upstream of the file, whether it answers now (it is
/// connected to and its tools listed, within 10 s), and each exposed tool
/// with its gate, one line each.
pub async fn ls(config: &McpConfig) -> String {
    let mut out = String::new();
    for upstream in &config.upstreams {
        let connection = Connection::new(upstream.clone());
        let listed =
            tokio::time::timeout(std::time::Duration::from_secs(10), connection.list_tools()).await;
        let (reachable, names): (String, Vec<String>) = match listed {
            Ok(Ok(tools)) => (
                "reachable".into(),
                tools.iter().map(|t| t.name.to_string()).collect(),
            ),
            Ok(Err(e)) => (format!("unreachable: {}", e.0), Vec::new()),
            Err(_) => ("unreachable: no answer within 10 s".into(), Vec::new()),
        };
        let how = match &upstream.transport {
            config::Transport::Stdio { command, .. } => format!("command {command}"),
            config::Transport::Http { url, .. } => format!("url {url}"),
        };
        out.push_str(&format!("{}  {how}  {reachable}\n", upstream.name));
        for tool in &upstream.tools {
            let d = &tool.definition;
            let gate = match d.requires_approval {
                false => "ungated".to_string(),
                true => {
                    let mut gate = format!("gated, {} approval(s)", d.approvals_required.max(1));
                    if !d.approvers.is_empty() {
                        gate.push_str(&format!(" from {}", d.approvers.join(", ")));
                    }
                    if d.approval_timeout_s > 0.0 {
                        gate.push_str(&format!(", expires after {} s", d.approval_timeout_s));
                    }
                    gate
                }
            };
            let missing = match names.is_empty() || names.contains(&tool.upstream_name) {
                true => "",
                false => "  (not among the upstream's tools)",
            };
            out.push_str(&format!(
                "  {} <- {}  {gate}{missing}\n",
                d.name, tool.upstream_name
            ));
        }
    }
    out
}

impl Gateway {
    /// Connects to every upstream and reads its tools; fails naming the
    /// upstream (and the tool) that cannot be served.
    pub async fn connect(config: &McpConfig) -> Result<Arc<Gateway>, String> {
        let mut tools = BTreeMap::new();
        for upstream in &config.upstreams {
            let at = format!("upstream '{}'", upstream.name);
            let connection = Arc::new(Connection::new(upstream.clone()));
            let listed = connection
                .list_tools()
                .await
                .map_err(|e| format!("{at}: {}", e.0))?;
            for (i, exposed) in upstream.tools.iter().enumerate() {
                let Some(found) = listed.iter().find(|t| t.name == exposed.upstream_name) else {
                    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
                    return Err(format!(
                        "{at}: tool '{}' is not among its tools ({})",
                        exposed.upstream_name,
                        names.join(", ")
                    ));
                };
                let schema = serde_json::Value::Object((*found.input_schema).clone());
                crate::engine::schema::check(&schema).map_err(|why| {
                    format!(
                        "{at}: tool '{}': its inputSchema is not a JSON Schema aaa can check calls against: {why}",
                        exposed.upstream_name
                    )
                })?;
                let mut spec = spec_of(upstream, i, exposed)?;
                spec.parameters = schema;
                if exposed.description.is_none() {
                    spec.description = found.description.as_deref().unwrap_or("").to_string();
                }
                let mut tool = found.clone();
                tool.name = spec.name.clone().into();
                tool.description = Some(spec.description.clone().into());
                tools.insert(
                    spec.name.clone(),
                    Exposed {
                        connection: connection.clone(),
                        upstream_name: exposed.upstream_name.clone(),
                        spec,
                        tool,
                    },
                );
            }
        }
        Ok(Arc::new(Gateway {
            tools,
            engine: RwLock::new(None),
            sessions: session::Routes::default(),
        }))
    }

    /// Registers the exposed tools with `engine` (a tool's gate only
    /// tightens, as for any worker) and starts taking their tasks and the
    /// sessions' model turns, until the engine stops.
    pub async fn start(self: &Arc<Self>, engine: Engine) -> Result<(), String> {
        let specs = self.tools.values().map(|t| t.spec.clone()).collect();
        engine
            .register_tools(specs, IDENTITY, false)
            .await
            .map_err(|e| format!("registering the MCP tools: {e}"))?;
        *self.engine.write().expect("poisoned") = Some(engine.clone());
        engine.spawn_background(worker::serve_tools(self.clone(), engine.clone()));
        engine.spawn_background(session::serve_turns(self.clone(), engine.clone()));
        Ok(())
    }

    /// The engine serving runs here now, if any.
    pub fn engine(&self) -> Option<Engine> {
        let engine = self.engine.read().expect("poisoned").clone();
        engine.filter(|e| !e.shutdown_token().is_cancelled())
    }

    pub fn tool(&self, name: &str) -> Option<&Exposed> {
        self.tools.get(name)
    }

    pub fn tools(&self) -> impl Iterator<Item = &Exposed> {
        self.tools.values()
    }
}
