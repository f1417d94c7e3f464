//! WorkerService: register tools and models, poll for tasks, report results.

use std::time::Duration;

use tonic::{Request, Response, Status};

use super::{convert, peer_name, principal};
use crate::auth::{Principal, Refusal, Served};
use crate::engine::event::WorkerId;
use crate::engine::{Engine, Error, QueueKey, Report};
use crate::proto::{self, worker_service_server::WorkerService};
use crate::seconds;

pub struct WorkerApi {
    pub engine: Engine,
}

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    async fn register_worker(
        &self,
        request: Request<proto::RegisterWorkerRequest>,
    ) -> Result<Response<proto::RegisterWorkerResponse>, Status> {
        let worker = worker_id(&request, &request.get_ref().identity);
        let caller = principal(&request).cloned();
        let request = request.into_inner();
        let tools = request
            .tools
            .into_iter()
            .enumerate()
            .map(|(i, tool)| convert::tool_definition(i, tool))
            .collect::<Result<Vec<_>, Error>>()?;
        for (i, model) in request.models.iter().enumerate() {
            convert::name(&format!("models[{i}]"), model)?;
        }
        let tool_names = tools.iter().map(|t| t.name.as_str());
        let model_names = request.models.iter().map(String::as_str);
        check_serves(caller.as_ref(), tool_names, model_names)?;
        self.engine.claim_identity(&worker).await?;
        let stored = self.engine.register_tools(tools).await?;
        Ok(Response::new(proto::RegisterWorkerResponse {
            tools: stored.iter().map(convert::tool_definition_out).collect(),
        }))
    }

    async fn poll_task(
        &self,
        request: Request<proto::PollTaskRequest>,
    ) -> Result<Response<proto::PollTaskResponse>, Status> {
        let worker = worker_id(&request, &request.get_ref().identity);
        let caller = principal(&request).cloned();
        let request = request.into_inner();
        let mut keys = Vec::new();
        for (i, tool) in request.tools.iter().enumerate() {
            convert::name(&format!("tools[{i}]"), tool)?;
        }
        for (i, model) in request.models.iter().enumerate() {
            convert::name(&format!("models[{i}]"), model)?;
        }
        let tool_names = request.tools.iter().map(String::as_str);
        let model_names = request.models.iter().map(String::as_str);
        check_serves(caller.as_ref(), tool_names, model_names)?;
        keys.extend(request.tools.into_iter().map(QueueKey::Tool));
        keys.extend(request.models.into_iter().map(QueueKey::Model));
        if keys.is_empty() {
            return Err(Error::invalid("tools", "name at least one tool or model to serve").into());
        }
        // Any wait is cut to the server's cap.
        let wait = match convert::seconds("wait_s", request.wait_s, seconds::POLL_WAIT)? {
            0.0 => Duration::MAX,
            s => seconds::duration(s),
        };
        self.engine.claim_identity(&worker).await?;
        let task = self.engine.poll_task(&worker, &keys, wait).await?;
        Ok(Response::new(proto::PollTaskResponse {
            task: task.map(convert::task),
        }))
    }

    async fn heartbeat_task(
        &self,
        request: Request<proto::HeartbeatTaskRequest>,
    ) -> Result<Response<proto::HeartbeatTaskResponse>, Status> {
        let caller = principal_name(&request);
        let cancel_requested = self
            .engine
            .heartbeat(&request.get_ref().token, &caller)
            .await?;
        Ok(Response::new(proto::HeartbeatTaskResponse {
            cancel_requested,
        }))
    }

    async fn complete_task(
        &self,
        request: Request<proto::CompleteTaskRequest>,
    ) -> Result<Response<proto::CompleteTaskResponse>, Status> {
        use proto::complete_task_request::Result as Outcome;
        let caller = worker_id(&request, "");
        let request = request.into_inner();
        let report = match request.result {
            None => {
                return Err(
                    Error::invalid("result", "set output_json (tool) or reply (model)").into(),
                )
            }
            Some(Outcome::OutputJson(text)) => {
                Report::ToolOutput(convert::json_value("output_json", &text)?)
            }
            Some(Outcome::Reply(reply)) => convert::model_reply(reply)?,
        };
        let already_recorded = self.engine.report(&request.token, report, &caller).await?;
        Ok(Response::new(proto::CompleteTaskResponse {
            already_recorded,
        }))
    }

    async fn fail_task(
        &self,
        request: Request<proto::FailTaskRequest>,
    ) -> Result<Response<proto::FailTaskResponse>, Status> {
        let caller = worker_id(&request, "");
        let request = request.into_inner();
        let report = Report::Failure {
            error: convert::error_detail(request.error)?,
            retryable: !request.non_retryable,
        };
        let already_recorded = self.engine.report(&request.token, report, &caller).await?;
        Ok(Response::new(proto::FailTaskResponse { already_recorded }))
    }
}

/// The worker: the identity it names (by default its principal or address,
/// clipped to 256 characters) and the principal it authenticated as.
fn worker_id<T>(request: &Request<T>, identity: &str) -> WorkerId {
    let identity = if identity.is_empty() {
        peer_name(request)
    } else {
        identity.chars().take(256).collect()
    };
    WorkerId {
        identity,
        principal: principal_name(request),
    }
}

/// With auth on, refuses a tool or model the caller's principal may not
/// serve (RegisterWorker and PollTask ask the same).
fn check_serves<'a>(
    caller: Option<&Principal>,
    tools: impl Iterator<Item = &'a str>,
    models: impl Iterator<Item = &'a str>,
) -> Result<(), Refusal> {
    let Some(caller) = caller else {
        return Ok(());
    };
    let tools = tools.map(|t| (Served::Tool, t));
    let models = models.map(|m| (Served::Model, m));
    tools
        .chain(models)
        .try_for_each(|(kind, name)| caller.may_serve(kind, name))
}

/// The caller's principal; empty with auth off.
fn principal_name<T>(request: &Request<T>) -> String {
    principal(request).map_or_else(String::new, |p| p.name.clone())
}
