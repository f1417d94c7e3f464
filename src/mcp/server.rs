//! aaa as an MCP server: Streamable HTTP at `/mcp` on the server's port
//! (rmcp's transport), behind the same authentication as gRPC and the
//! other HTTP routes: a bearer token or a client certificate naming a
//! principal with the role `runner` (or admin). `tools/list` shows the
//! exposed tools; `tools/call` is a call in the session's run (see
//! [`super::session`]).

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ErrorData as McpError;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http::StatusCode;

use super::session::{Caller, Progress, Session};
use super::Gateway;
use crate::auth::{AuthConfig, Principal, Refusal};
use crate::web::hosts::AllowedHosts;

/// The path MCP clients connect to.
pub const PATH: &str = "/mcp";

/// How long a session lives without a message from or to its client
/// (rmcp's default is 5 minutes). A call that waits for a person without a
/// progress token exchanges no message meanwhile: it must outlast a slow
/// approval. An abandoned session's run is held this long, then completed.
const SESSION_IDLE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What the route needs.
pub struct Settings {
    pub gateway: Arc<Gateway>,
    /// `None`: auth is off, and only loopback host names are answered.
    pub auth: Option<Arc<AuthConfig>>,
    /// The host names the server answers to (against DNS rebinding).
    pub hosts: AllowedHosts,
    /// Cancelled when the server stops: open sessions end.
    pub stopping: CancellationToken,
}

/// The `/mcp` route.
pub fn router(settings: Settings) -> Router {
    let gateway = settings.gateway.clone();
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(settings.stopping.child_token())
        // Host names are checked below with the rest of the server's.
        .disable_allowed_hosts();
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE);
    let service = StreamableHttpService::new(
        move || Ok(Handler::new(gateway.clone())),
        Arc::new(sessions),
        config,
    );
    let guard = Arc::new(Guard {
        auth: settings.auth,
        hosts: settings.hosts,
    });
    Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn(move |request, next| {
            let guard = guard.clone();
            async move { guard.check(request, next).await }
        }))
}

/// Who may reach the MCP server.
struct Guard {
    auth: Option<Arc<AuthConfig>>,
    hosts: AllowedHosts,
}

impl Guard {
    /// Checks the host and the caller; the caller's principal goes in the
    /// request's extensions for the session to read.
    async fn check(&self, mut request: Request, next: Next) -> Response {
        let authority = request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| request.uri().authority().map(|a| a.to_string()));
        if !authority.as_deref().is_some_and(|a| self.hosts.allows(a)) {
            return crate::http::plain(
                StatusCode::FORBIDDEN,
                format!(
                    "this server does not answer to the host {:?} (see --allow-host)\n",
                    authority.unwrap_or_default()
                ),
            );
        }
        if let Some(auth) = &self.auth {
            let checked = crate::auth::credentials(auth, request.headers(), request.extensions())
                .and_then(|principal| {
                    crate::auth::authorize("/aaa.v1.RunService/StartRun", &principal)
                        .map(|()| principal)
                });
            match checked {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(Refusal::MissingRole { principal, .. }) => {
                    return crate::http::plain(
                        StatusCode::FORBIDDEN,
                        format!("{principal} may not call tools through aaa: it needs the role runner (or admin)\n"),
                    )
                }
                Err(refusal) => {
                    return crate::http::plain(StatusCode::UNAUTHORIZED, format!("{refusal}\n"))
                }
            }
        }
        next.run(request).await
    }
}

/// One MCP session (with the 2026-07-28 revision, which has no sessions,
/// one request).
pub struct Handler {
    gateway: Arc<Gateway>,
    session: Session,
}

impl Handler {
    fn new(gateway: Arc<Gateway>) -> Handler {
        Handler {
            session: Session::new(gateway.clone()),
            gateway,
        }
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("aaa", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Every call goes through aaa: gated tools wait for a human approval \
                 (the call stays open with progress notifications), and every call \
                 is recorded in a run.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = self.gateway.tools().map(|t| t.tool.clone()).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if self.gateway.tool(&request.name).is_none() {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool '{}'",
                    crate::domain::clip::clip(&request.name)
                ),
                None,
            ));
        }
        let principal = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>())
            .map_or_else(String::new, |p| p.name.clone());
        let client = context
            .client_info()
            .map_or_else(String::new, |info| info.name);
        let progress = context.meta.get_progress_token().map(|token| Progress {
            peer: context.peer.clone(),
            token,
        });
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let caller = Caller { principal, client };
        let result = tokio::select! {
            result = self.session.call(&caller, &request.name, arguments, progress) => result,
            // The client gave up: the call stays in the run, whose next
            // call of this session waits for it.
            _ = context.ct.cancelled() => {
                return Err(McpError::internal_error("the request was cancelled", None))
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}
