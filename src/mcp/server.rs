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
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, DetailedTask,
    GetTaskParams, GetTaskResult, Implementation, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Task, TaskPayload, TaskStatus,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ErrorData as McpError;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http::StatusCode;

use super::session::{self, Answer, Caller, Progress, Session, TaskId, TaskState};
use super::Gateway;
use crate::auth::{AuthConfig, Principal, Refusal, Throttle};
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
    /// Wrong credentials per address, shared with the server's other doors.
    pub throttle: Arc<Throttle>,
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
        throttle: settings.throttle,
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
    throttle: Arc<Throttle>,
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
            let checked = crate::auth::credentials(
                auth,
                &self.throttle,
                request.headers(),
                request.extensions(),
            )
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
                Err(refusal) => return crate::http::refused(&refusal),
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
        // The tasks extension: a client that declares it gets a call that
        // waits for a person as a task, and polls it with tasks/get.
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
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
        let principal = caller_of(&context).map_or_else(String::new, |p| p.name.clone());
        let as_task = context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        let client = context
            .client_info()
            .map_or_else(String::new, |info| info.name);
        let progress = context.meta.get_progress_token().map(|token| Progress {
            peer: context.peer.clone(),
            token,
        });
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let caller = Caller { principal, client };
        let call = self
            .session
            .call(&caller, &request.name, arguments, progress, as_task);
        let answer = tokio::select! {
            answer = call => answer,
            // The client gave up: the call stays in the run, whose next
            // call of this session waits for it.
            _ = context.ct.cancelled() => {
                return Err(McpError::internal_error("the request was cancelled", None))
            }
        };
        Ok(match answer {
            Answer::Result(result) => CallToolResponse::Complete(result),
            Answer::Task(task, requested_ms) => {
                let message = format!(
                    "call {} of run {} waits for approval (aaa approvals)",
                    task.call, task.run
                );
                let state = Task::new(
                    task.to_string(),
                    TaskStatus::Working,
                    iso8601(requested_ms),
                    iso8601(crate::clock::now_ms()),
                )
                .with_status_message(message)
                .with_poll_interval_ms(POLL_INTERVAL_MS);
                CallToolResponse::Task(CreateTaskResult::new(state))
            }
        })
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        // The same answer for a task that does not exist and one of a run
        // the caller may not read: a task id says nothing to others.
        let unknown = || {
            McpError::invalid_params(
                format!("no task '{}'", crate::domain::clip::clip(&request.task_id)),
                None,
            )
        };
        let task = TaskId::parse(&request.task_id).ok_or_else(unknown)?;
        let Some(engine) = self.gateway.engine() else {
            return Err(McpError::internal_error(
                "aaa does not serve runs on this server now; try again shortly",
                None,
            ));
        };
        let run = engine
            .store()
            .run(task.run)
            .await
            .map_err(|e| McpError::internal_error(format!("aaa cannot read the run: {e}"), None))?
            .ok_or_else(unknown)?;
        // Runners read the runs they started; readers and admins all.
        if let Some(caller) = caller_of(&context) {
            if run.started_by != caller.name && !caller.sees_every_run(true) {
                return Err(unknown());
            }
        }
        let (state, requested_ms) = session::task_state(&engine, &task)
            .await
            .map_err(|e| McpError::internal_error(format!("aaa cannot read the run: {e}"), None))?
            .ok_or_else(unknown)?;
        let id = task.to_string();
        let detailed = match state {
            TaskState::Working {
                message,
                updated_ms,
            } => {
                let state = Task::new(
                    id,
                    TaskStatus::Working,
                    iso8601(requested_ms),
                    iso8601(updated_ms.max(requested_ms)),
                )
                .with_status_message(message)
                .with_poll_interval_ms(POLL_INTERVAL_MS);
                DetailedTask::new(state, TaskPayload::Working)
            }
            TaskState::Done { result, updated_ms } => {
                let serde_json::Value::Object(result) =
                    serde_json::to_value(&result).expect("a result serializes")
                else {
                    unreachable!("a result is an object")
                };
                let state = Task::new(
                    id,
                    TaskStatus::Completed,
                    iso8601(requested_ms),
                    iso8601(updated_ms),
                );
                DetailedTask::new(state, TaskPayload::Completed { result })
            }
        };
        Ok(GetTaskResult::new(detailed))
    }

    async fn cancel_task(
        &self,
        _request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Err(McpError::invalid_request(
            "a call waiting in aaa is not cancelled by its client: an approver denies it \
             (aaa deny RUN CALL), or the run is cancelled (aaa runs cancel RUN)",
            None,
        ))
    }
}

/// The caller's principal (auth on).
fn caller_of(context: &RequestContext<RoleServer>) -> Option<&Principal> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
}

/// How often a client should poll a task (a person decides in seconds at
/// best).
const POLL_INTERVAL_MS: u64 = 1_000;

/// Milliseconds since the epoch as ISO 8601 (UTC), as tasks carry times.
fn iso8601(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
