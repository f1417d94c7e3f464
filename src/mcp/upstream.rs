//! aaa as an MCP client of one upstream server: connects (a child process
//! or Streamable HTTP), lists its tools, and calls one tool per attempt.
//! A connection that broke is made again at the next call; what an
//! upstream's credentials are never reaches an error or a log line (the
//! errors of the transport quote neither headers nor environment).

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult, MetaObject, RequestMetaObject, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::Value;
use tokio::sync::Mutex;

use super::config::{Transport, Upstream};

type Client = RunningService<RoleClient, ()>;

/// One upstream and its connection, made when first needed.
pub struct Connection {
    pub upstream: Upstream,
    client: Mutex<Option<Arc<Client>>>,
}

/// Why a call did not get an answer from the upstream.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl Connection {
    pub fn new(upstream: Upstream) -> Connection {
        Connection {
            upstream,
            client: Mutex::new(None),
        }
    }

    /// The live client, connecting if there is none.
    async fn client(&self) -> Result<Arc<Client>, Unreachable> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        let client = Arc::new(connect(&self.upstream).await?);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Forgets a client whose transport failed: the next call connects again.
    async fn drop_client(&self, failed: &Arc<Client>) {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, failed)) {
            *slot = None;
        }
    }

    /// The upstream's tools (every page of `tools/list`).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, Unreachable> {
        let client = self.client().await?;
        match client.list_all_tools().await {
            Ok(tools) => Ok(tools),
            Err(e) => {
                self.drop_client(&client).await;
                Err(Unreachable(format!("tools/list failed: {e}")))
            }
        }
    }

    /// Calls `tool` once with exactly `arguments`. `meta` goes in the
    /// request's `_meta` (aaa's call id, the idempotency hint).
    pub async fn call(
        &self,
        tool: &str,
        arguments: &Value,
        meta: serde_json::Map<String, Value>,
    ) -> Result<CallToolResult, Unreachable> {
        let Value::Object(arguments) = arguments.clone() else {
            return Err(Unreachable("the arguments are not an object".into()));
        };
        let client = self.client().await?;
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        match client.peer().call_tool(params).await {
            Ok(result) => Ok(result),
            Err(e) => {
                self.drop_client(&client).await;
                Err(Unreachable(format!("tools/call failed: {e}")))
            }
        }
    }
}

/// Opens the transport and does the MCP handshake.
async fn connect(upstream: &Upstream) -> Result<Client, Unreachable> {
    let served = match &upstream.transport {
        Transport::Stdio { command, args, env } => {
            let mut child = tokio::process::Command::new(command);
            child.args(args);
            for (key, value) in env {
                child.env(key, value.expose());
            }
            // The child's stderr is its own log; it goes to aaa's stderr.
            let transport = TokioChildProcess::builder(child)
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .map(|(transport, _)| transport)
                .map_err(|e| Unreachable(format!("cannot start '{command}': {e}")))?;
            ().serve(transport).await
        }
        Transport::Http { url, headers } => {
            // reqwest (built without a provider of its own) takes the
            // process's rustls provider: ring, the one tonic and the
            // webhooks use. Installing it again is a no-op.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut custom = HashMap::new();
            for (name, value) in headers {
                let value = http::HeaderValue::from_str(value.expose())
                    .expect("checked when the file was read");
                custom.insert(name.clone(), value);
            }
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            ().serve(StreamableHttpClientTransport::from_config(config))
                .await
        }
    };
    served.map_err(|e| Unreachable(format!("MCP handshake failed: {e}")))
}
