//! WorkerService: register tools and models, poll for tasks, report results.

use std::time::Duration;

use tonic::{Request, Response, Status};

use super::{convert, peer_name, principal};
use crate::auth::{Principal, Refusal, Served};
use crate::domain::check;
use crate::domain::event::WorkerId;
use crate::engine::{Engine, Error, QueueKey, Report};
use crate::proto::{self, worker_service_server::WorkerService};
use crate::seconds;

pub struct WorkerApi {
    pub engine: Engine,
    /// The cluster, when the store is shared: a poll is offered the tasks
    /// of the shards other servers own too.
    pub cluster: Option<std::sync::Arc<crate::cluster::Cluster>>,
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
            check::served_model(&format!("models[{i}]"), model)?;
        }
        let tool_names = tools.iter().map(|t| t.name.as_str());
        let model_names = request.models.iter().map(String::as_str);
        check_serves(caller.as_ref(), tool_names, model_names)?;
        self.engine.claim_identity(&worker).await?;
        // Only an admin may loosen a tool's gate. With auth off nobody is
        // known, so nobody may: a gate a worker declared stays (guarantee
        // 1), as it did before admins could change it.
        let may_loosen = caller.as_ref().is_some_and(Principal::is_admin);
        let by = match worker.principal.is_empty() {
            true => &worker.identity,
            false => &worker.principal,
        };
        let stored = self.engine.register_tools(tools, by, may_loosen).await?;
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
        let signer = crate::cluster::forward::caller(request.extensions());
        let poll = request.into_inner();
        let (keys, wait) = poll_of(&poll, caller.as_ref())?;
        self.engine.claim_identity(&worker).await?;
        let task = match &self.cluster {
            // Other servers own some shards: their tasks are offered too.
            Some(cluster) if !self.engine.shards().is_all() => {
                let asked = crate::cluster::peers::Poll {
                    worker: &worker,
                    keys: &keys,
                    wait,
                    request: poll,
                    signer,
                };
                crate::cluster::peers::poll(&self.engine, cluster, asked).await?
            }
            _ => self
                .engine
                .poll_task(&worker, &keys, wait)
                .await?
                .map(convert::task),
        };
        Ok(Response::new(proto::PollTaskResponse { task }))
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

/// A poll's queues and wait, checked: the names, what the caller may
/// serve, the wait (0 means the server's cap).
pub(crate) fn poll_of(
    poll: &proto::PollTaskRequest,
    caller: Option<&Principal>,
) -> Result<(Vec<QueueKey>, Duration), Status> {
    for (i, tool) in poll.tools.iter().enumerate() {
        check::name(&format!("tools[{i}]"), tool)?;
    }
    for (i, model) in poll.models.iter().enumerate() {
        check::served_model(&format!("models[{i}]"), model)?;
    }
    let tool_names = poll.tools.iter().map(String::as_str);
    let model_names = poll.models.iter().map(String::as_str);
    check_serves(caller, tool_names, model_names)?;
    let mut keys = Vec::new();
    keys.extend(poll.tools.iter().cloned().map(QueueKey::Tool));
    keys.extend(poll.models.iter().cloned().map(QueueKey::Model));
    if keys.is_empty() {
        return Err(Error::invalid("tools", "name at least one tool or model to serve").into());
    }
    // Any wait is cut to the server's cap.
    let wait = match convert::seconds("wait_s", poll.wait_s, seconds::POLL_WAIT)? {
        0.0 => Duration::MAX,
        s => seconds::duration(s),
    };
    Ok((keys, wait))
}

/// The worker: the identity it names (by default its principal or address,
/// clipped to 256 characters) and the principal it authenticated as.
pub(crate) fn worker_id<T>(request: &Request<T>, identity: &str) -> WorkerId {
    let worker = WorkerId {
        identity: peer_name(request),
        principal: principal_name(request),
    };
    named(worker, identity)
}

/// The worker under the identity it names, if it names one.
pub(crate) fn named(worker: WorkerId, identity: &str) -> WorkerId {
    match identity.is_empty() {
        true => worker,
        false => WorkerId {
            identity: identity.chars().take(256).collect(),
            ..worker
        },
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
