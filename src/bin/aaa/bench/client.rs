//! The bench's side of the protocol: the requests it sends (tools, scripted
//! runs), and the helpers every scenario shares: wait for an event, a tool
//! worker, and an approver that grants what it sees.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::server::{Pool, RunClient};
use super::stages::{Stamps, Step};
use super::stats::{Problems, OP_TIMEOUT};
use aaa::proto::{
    complete_task_request, model_spec, scripted_step, stream_events_response,
    watch_approvals_response, CompleteTaskRequest, Event, ModelSpec, PollTaskRequest,
    RegisterWorkerRequest, ScriptedModel, ScriptedStep, ScriptedToolCall, ScriptedToolCalls,
    SignalRequest, StartRunRequest, StreamEventsRequest, ToolDefinition, ToolRef,
    WatchApprovalsRequest,
};

/// The reference tool: gated, served by a worker.
pub const WIRE_MONEY: &str = "wire_money";
/// A gated tool runs use to park at approval.
pub const HOLD: &str = "bench_hold";
pub const WIRE_ARGS: &str = r#"{"amount":250,"to":"ACME"}"#;
/// What the bench's worker answers (a JSON string), and so the run's text.
pub const WIRE_OUTPUT: &str = r#""sent $250 to ACME""#;
pub const WIRE_TEXT: &str = "sent $250 to ACME";
/// The label key every run of a bench session carries.
pub const LABEL: &str = "aaa-bench";

/// Registers both bench tools as gated.
pub async fn register_tools(pool: &Pool) -> anyhow::Result<()> {
    let tool = |name: &str| ToolDefinition {
        name: name.into(),
        description: "aaa bench tool".into(),
        parameters_json: r#"{"type":"object"}"#.into(),
        requires_approval: true,
        ..Default::default()
    };
    pool.workers()
        .register_worker(RegisterWorkerRequest {
            identity: "aaa-bench".into(),
            tools: vec![tool(WIRE_MONEY), tool(HOLD)],
            models: vec![],
        })
        .await?;
    Ok(())
}

/// A scripted run: call `tool` with the reference arguments, then echo its
/// output. With a gated tool it parks at approval until granted.
pub fn scripted_run(tool: &str, session: &str) -> StartRunRequest {
    let step = |reply| ScriptedStep { reply: Some(reply) };
    let call = ScriptedToolCall {
        name: tool.into(),
        arguments_json: WIRE_ARGS.into(),
    };
    StartRunRequest {
        task: "Pay ACME $250".into(),
        model: Some(ModelSpec {
            kind: Some(model_spec::Kind::Scripted(ScriptedModel {
                steps: vec![
                    step(scripted_step::Reply::ToolCalls(ScriptedToolCalls {
                        calls: vec![call],
                    })),
                    step(scripted_step::Reply::Echo(())),
                ],
            })),
        }),
        tools: vec![ToolRef {
            name: tool.into(),
            ..Default::default()
        }],
        labels: [(LABEL.to_string(), session.to_string())].into(),
        ..Default::default()
    }
}

pub async fn start_run(runs: &mut RunClient, tool: &str, session: &str) -> Result<String, String> {
    let response = runs
        .start_run(scripted_run(tool, session))
        .await
        .map_err(|s| format!("StartRun: {s}"))?;
    Ok(response.into_inner().run_id)
}

/// Signal; returns the seq appended.
pub async fn signal(
    runs: &mut RunClient,
    run_id: &str,
    event_type: &str,
    data_json: String,
) -> Result<u64, String> {
    let request = SignalRequest {
        run_id: run_id.into(),
        r#type: event_type.into(),
        data_json,
        request_id: String::new(),
    };
    let response = runs
        .signal(request)
        .await
        .map_err(|s| format!("Signal {event_type}: {s}"))?;
    Ok(response.into_inner().seq)
}

pub async fn grant(runs: &mut RunClient, run_id: &str, call_id: &str) -> Result<(), String> {
    let data = serde_json::json!({ "call_id": call_id }).to_string();
    signal(runs, run_id, "aaa.approval.granted", data)
        .await
        .map(|_| ())
}

/// Follows the run from its start (only events of `type_prefix`, ending
/// after the run's terminal event) and returns the first event `wanted`
/// accepts.
pub async fn first_event(
    runs: &mut RunClient,
    run_id: &str,
    type_prefix: &str,
    wanted: impl Fn(&Event) -> bool,
) -> Result<Event, String> {
    let request = StreamEventsRequest {
        run_id: run_id.into(),
        after_seq: 0,
        follow: true,
        type_prefix: type_prefix.into(),
        stop_at_end: true,
    };
    let read = async {
        let mut stream = runs.stream_events(request).await?.into_inner();
        while let Some(item) = stream.message().await? {
            if let Some(stream_events_response::Item::Event(event)) = item.item {
                if wanted(&event) {
                    return Ok(Some(event));
                }
            }
        }
        Ok::<_, tonic::Status>(None)
    };
    match tokio::time::timeout(OP_TIMEOUT, read).await {
        Ok(Ok(Some(event))) => Ok(event),
        Ok(Ok(None)) => Err(format!("run {run_id} ended with no {type_prefix} event")),
        Ok(Err(status)) => Err(format!("StreamEvents {run_id}: {status}")),
        Err(_) => Err(format!(
            "no {type_prefix} event of {run_id} in {OP_TIMEOUT:?}"
        )),
    }
}

/// Waits for the run's terminal event and checks it is the reference
/// completion.
pub async fn wait_completed(runs: &mut RunClient, run_id: &str) -> Result<(), String> {
    let terminal = |e: &Event| {
        matches!(
            e.r#type.as_str(),
            "aaa.run.completed" | "aaa.run.failed" | "aaa.run.cancelled"
        )
    };
    let event = first_event(runs, run_id, "aaa.run.", terminal).await?;
    if event.r#type != "aaa.run.completed" || !event.data_json.contains(WIRE_TEXT) {
        return Err(format!(
            "run {run_id} ended with {} {}",
            event.r#type, event.data_json
        ));
    }
    Ok(())
}

/// Waits until the run parks at approval; returns the call_id.
pub async fn wait_parked(runs: &mut RunClient, run_id: &str) -> Result<String, String> {
    let event = first_event(runs, run_id, "aaa.approval.requested", |_| true).await?;
    let data: serde_json::Value =
        serde_json::from_str(&event.data_json).map_err(|e| format!("approval data: {e}"))?;
    data["call_id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("approval without call_id: {}", event.data_json))
}

type Joined = Result<Result<(), String>, tokio::task::JoinError>;

/// Keeps the error of a finished helper call.
pub fn settle(joined: Joined, problems: &mut Problems) {
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(message)) => problems.add(message),
        Err(e) => problems.add(format!("a helper call panicked: {e}")),
    }
}

/// Settles the helper calls that have finished.
fn reap(calls: &mut JoinSet<Result<(), String>>, problems: &mut Problems) {
    while let Some(joined) = calls.try_join_next() {
        settle(joined, problems);
    }
}

/// Waits (bounded) for the helper calls still running.
async fn drain(mut calls: JoinSet<Result<(), String>>, problems: &mut Problems) {
    let all = async {
        while let Some(joined) = calls.join_next().await {
            settle(joined, problems);
        }
    };
    if tokio::time::timeout(OP_TIMEOUT, all).await.is_err() {
        problems.add("helper calls still running after the scenario");
    }
}

/// A tool worker: `pollers` long polls for `tool`; a poller completes each
/// task it gets with [`WIRE_OUTPUT`] before it polls again, so the result
/// goes out first (the other pollers keep the worker reachable meanwhile).
/// Marks its steps in `stamps`, if given. Runs until `stop`; returns what
/// went wrong.
pub async fn serve_tool(
    pool: Pool,
    tool: &'static str,
    pollers: usize,
    stamps: Option<Arc<Stamps>>,
    stop: CancellationToken,
) -> Problems {
    let mut loops = JoinSet::new();
    for i in 0..pollers {
        let (pool, stop, stamps) = (pool.clone(), stop.clone(), stamps.clone());
        loops.spawn(async move {
            let mut problems = Problems::default();
            let request = PollTaskRequest {
                identity: format!("aaa-bench-{i}"),
                tools: vec![tool.to_string()],
                models: vec![],
                wait_s: 5.0,
            };
            let mut workers = pool.workers();
            loop {
                let answer = tokio::select! {
                    _ = stop.cancelled() => break,
                    answer = workers.poll_task(request.clone()) => answer,
                };
                let task = match answer {
                    Ok(answer) => answer.into_inner().task,
                    Err(status) => {
                        problems.add(format!("PollTask: {status}"));
                        // A failing server answers at once: do not spin.
                        if problems.count > 100 {
                            break;
                        }
                        continue;
                    }
                };
                let Some(task) = task else { continue };
                let mark = |step| {
                    if let Some(stamps) = &stamps {
                        stamps.mark(&task.run_id, step);
                    }
                };
                mark(Step::Polled);
                let mut owner = pool.workers_of(&task.run_id);
                let complete = CompleteTaskRequest {
                    token: task.token,
                    result: Some(complete_task_request::Result::OutputJson(
                        WIRE_OUTPUT.into(),
                    )),
                };
                match owner.complete_task(complete).await {
                    Ok(_) => mark(Step::Reported),
                    Err(status) => problems.add(format!("CompleteTask: {status}")),
                }
            }
            problems
        });
    }
    let mut problems = Problems::default();
    while let Some(joined) = loops.join_next().await {
        problems.merge(joined.unwrap_or_else(|e| Problems::one(format!("a worker panicked: {e}"))));
    }
    problems
}

/// The approver: watches approval requests for `tool` and grants each one of
/// this session's runs, each grant in its own task. Marks its steps in
/// `stamps`, if given. Runs until `stop`.
pub async fn grant_all(
    pool: Pool,
    tool: &'static str,
    session: String,
    stamps: Option<Arc<Stamps>>,
    stop: CancellationToken,
) -> Problems {
    use watch_approvals_response::Item;
    let mut problems = Problems::default();
    let request = WatchApprovalsRequest {
        tool: tool.into(),
        heartbeat_s: 1.0,
        ..Default::default()
    };
    let mut stream = match pool.approvals().watch_approvals(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            problems.add(format!("WatchApprovals: {status}"));
            return problems;
        }
    };
    let mut grants = JoinSet::new();
    loop {
        let item = tokio::select! {
            _ = stop.cancelled() => break,
            item = stream.message() => item,
        };
        reap(&mut grants, &mut problems);
        let approval = match item {
            Ok(Some(response)) => match response.item {
                Some(Item::Requested(approval)) => approval,
                _ => continue,
            },
            Ok(None) => {
                problems.add("WatchApprovals ended");
                break;
            }
            Err(status) => {
                problems.add(format!("WatchApprovals: {status}"));
                break;
            }
        };
        if approval.labels.get(LABEL) != Some(&session) {
            continue;
        }
        if let Some(stamps) = &stamps {
            stamps.mark(&approval.run_id, Step::Requested);
        }
        let mut runs = pool.runs_of(&approval.run_id);
        let stamps = stamps.clone();
        grants.spawn(async move {
            grant(&mut runs, &approval.run_id, &approval.call_id).await?;
            if let Some(stamps) = stamps {
                stamps.mark(&approval.run_id, Step::Granted);
            }
            Ok(())
        });
    }
    drain(grants, &mut problems).await;
    problems
}

/// Cancels runs (best effort, bounded), so a shared server is left quiet.
pub async fn cancel_all(pool: &Pool, run_ids: &[String]) -> Problems {
    let mut problems = Problems::default();
    let mut calls = JoinSet::new();
    for run_id in run_ids {
        let (mut runs, run_id) = (pool.runs(), run_id.clone());
        calls.spawn(async move {
            let request = aaa::proto::CancelRunRequest {
                run_id,
                reason: "aaa bench done".into(),
            };
            runs.cancel_run(request)
                .await
                .map(|_| ())
                .map_err(|s| format!("CancelRun: {s}"))
        });
    }
    drain(calls, &mut problems).await;
    problems
}

/// Bounded wait for a spawned helper's verdict.
pub async fn join_helper(task: tokio::task::JoinHandle<Problems>) -> Problems {
    let abort = task.abort_handle();
    match tokio::time::timeout(OP_TIMEOUT + Duration::from_secs(5), task).await {
        Ok(Ok(problems)) => problems,
        Ok(Err(e)) => Problems::one(format!("a helper panicked: {e}")),
        Err(_) => {
            abort.abort();
            Problems::one("a helper did not stop")
        }
    }
}
