//! `aaa mcp --server ADDR`: aaa's MCP server over stdio, for clients that
//! only launch processes. A relay: it serves MCP on its stdin and stdout and
//! forwards `tools/list` and `tools/call` to the server's `/mcp` (Streamable
//! HTTP, with the caller's token), and the server's progress notifications
//! of a waiting call back to the client. One relay process is one session,
//! so one run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::handler::client::ClientHandler;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, ClientRequest, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig, ServerResult,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RoleClient, RoleServer,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ErrorData as McpError, ServiceExt};

/// Where the relay's progress notifications go: the token aaa sees, to the
/// client's own token and peer.
type Routes = Arc<Mutex<HashMap<ProgressToken, (ProgressToken, Peer<RoleServer>)>>>;

/// aaa's side of the relay: forwards progress to the client that waits.
#[derive(Clone, Default)]
struct Upward {
    routes: Routes,
}

impl ClientHandler for Upward {
    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let route = self
            .routes
            .lock()
            .expect("poisoned")
            .get(&params.progress_token)
            .cloned();
        if let Some((token, peer)) = route {
            params.progress_token = token;
            let _ = peer.notify_progress(params).await;
        }
    }
}

/// The client's side: its requests go on to aaa.
struct Relay {
    aaa: Peer<RoleClient>,
    routes: Routes,
}

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("aaa", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.aaa
            .list_tools(request)
            .await
            .map_err(|e| McpError::internal_error(format!("aaa: {e}"), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(request));
        let handle = self
            .aaa
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(|e| McpError::internal_error(format!("aaa: {e}"), None))?;
        let theirs = handle.progress_token.clone();
        if let Some(token) = context.meta.get_progress_token() {
            let route = (token, context.peer.clone());
            self.routes
                .lock()
                .expect("poisoned")
                .insert(theirs.clone(), route);
        }
        let answer = handle.await_response().await;
        self.routes.lock().expect("poisoned").remove(&theirs);
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(CallToolResponse::Complete(result)),
            Ok(_) => Err(McpError::internal_error(
                "aaa answered tools/call with something else",
                None,
            )),
            Err(rmcp::ServiceError::McpError(error)) => Err(error),
            Err(e) => Err(McpError::internal_error(format!("aaa: {e}"), None)),
        }
    }
}

/// Relays stdin/stdout to `server`'s `/mcp` until the client closes stdin.
/// `server` is `host:port` or a URL; `token` goes as `Bearer`.
pub async fn relay(server: &str, token: Option<String>) -> Result<(), String> {
    let base = match server.contains("://") {
        true => server.trim_end_matches('/').to_string(),
        false => format!("http://{server}"),
    };
    let url = format!("{base}{}", super::server::PATH);
    // reqwest takes the process's rustls provider (see `upstream`).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    let upward = Upward::default();
    let routes = upward.routes.clone();
    let aaa = upward
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let relay = Relay {
        aaa: aaa.peer().clone(),
        routes,
    };
    let served = relay
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|e| format!("stdio: {e}"))?;
    let _ = served.waiting().await;
    let _ = aaa.cancel().await;
    Ok(())
}
