//! `aaa runs`: start a run, list runs, show one, follow one live.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::render::{self, Output, Style};
use super::{label, Client, Connection, Error, Format, Page, EXIT_CODES};
use crate::domain::event::ScriptStep;
use crate::present;
use crate::proto::{
    model_spec, scripted_step, stream_events_response, Budget, CancelRunRequest, GetRunRequest,
    ListRunsRequest, ModelSpec, OpenAiModel, Run, RunStatus, ScriptedModel, ScriptedStep,
    ScriptedToolCall, ScriptedToolCalls, StartRunRequest, StreamEventsRequest, ToolRef,
};

#[derive(clap::Args)]
pub struct RunsArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    command: RunsCommand,
}

#[derive(clap::Subcommand)]
enum RunsCommand {
    /// Start a run; prints its id.
    ///
    /// Example: aaa runs start "Pay ACME $250" --tool wire_money --steps steps.json --label team=payments
    #[command(after_help = EXIT_CODES)]
    Start(StartArgs),
    /// List runs, newest first.
    ///
    /// Example: aaa runs ls --status waiting_for_approval --label team=payments
    #[command(after_help = EXIT_CODES)]
    Ls(ListArgs),
    /// Show one run: status, result or error, and the approvals it waits for.
    ///
    /// Example: aaa runs show "$RUN"
    #[command(after_help = EXIT_CODES)]
    Show(ShowArgs),
    /// Print a run's events, one line each, following it live until it ends.
    ///
    /// Exits 0 when the run completed, 4 when it failed or was cancelled.
    ///
    /// Example: aaa runs tail "$RUN"
    #[command(after_help = EXIT_CODES)]
    Tail(TailArgs),
    /// Write a run's events to a gzip-compressed JSON Lines file, the
    /// format --archive-dir archives expiring runs in (docs/retention.md);
    /// prints the file's path.
    ///
    /// Example: aaa runs export "$RUN" --out audits/
    #[command(after_help = EXIT_CODES)]
    Export(ExportArgs),
    /// Cancel a run: pending approvals expire, a running tool is told to stop.
    ///
    /// Example: aaa runs cancel "$RUN" --reason "duplicate payment"
    #[command(after_help = EXIT_CODES)]
    Cancel(CancelArgs),
}

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("driver").required(true).args(["model", "steps"]))]
struct StartArgs {
    /// The task: the conversation's first user message.
    task: String,
    /// A tool the run may call (repeatable); a worker must have registered it.
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// Like --tool, and every call of it needs approval in this run, even if
    /// its worker does not ask for it.
    #[arg(long = "gate", value_name = "NAME")]
    gated: Vec<String>,
    /// The model that drives the run: the name of a worker-served model, or
    /// openai:MODEL[@PROVIDER] for the server's built-in OpenAI-compatible
    /// model (a provider of its --models file; see docs/models.md), e.g.
    /// openai:gpt-4.1-mini. openai: alone takes the provider's default model.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// The run fails with BudgetExceeded once its model calls used this
    /// many tokens (built-in models report them).
    #[arg(long, value_name = "TOKENS")]
    max_tokens: Option<u64>,
    /// Drive the run with the built-in scripted model, whose replies are in
    /// this JSON file: an array of steps, each {"text": "..."},
    /// {"tool_calls": [{"name": "wire_money", "arguments": {"amount": 250}}]}
    /// or "echo" (reply with the last message), the shape aaa.run.started records.
    #[arg(long, value_name = "FILE")]
    steps: Option<PathBuf>,
    /// System instructions, given to the model first.
    #[arg(long)]
    system: Option<String>,
    /// The run fails with DeadlineExceeded this many seconds after it starts.
    #[arg(long, value_name = "SECONDS")]
    deadline_s: Option<f64>,
    /// A label for filtering runs and approvals (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
    /// Idempotency key: a retry with the same id returns the run the first
    /// call started instead of starting another.
    #[arg(long, value_name = "ID")]
    request_id: Option<String>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct ListArgs {
    /// Only runs in this status: running, waiting_for_approval, completed,
    /// failed or cancelled.
    #[arg(long, value_parser = present::parse_status)]
    status: Option<RunStatus>,
    /// Only runs carrying this label (repeatable; all must match).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
    #[command(flatten)]
    page: Page,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct ShowArgs {
    /// The run's id.
    run: String,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct TailArgs {
    /// The run's id.
    run: String,
    /// Start after this seq (to resume: the seq of the last event printed).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    after_seq: u64,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// The run's id.
    run: String,
    /// Where to write: a directory (the file is RUN_ID.jsonl.gz in it), a
    /// file name, or - for stdout.
    #[arg(long, value_name = "PATH", default_value = ".")]
    out: PathBuf,
}

#[derive(clap::Args)]
struct CancelArgs {
    /// The run's id.
    run: String,
    /// Why; recorded in aaa.run.cancelled.
    #[arg(long, default_value = "")]
    reason: String,
    #[command(flatten)]
    format: Format,
}

pub(super) async fn run(args: &RunsArgs) -> Result<(), Error> {
    let connection = &args.connection;
    match &args.command {
        RunsCommand::Start(args) => start(connection, args).await,
        RunsCommand::Ls(args) => list(connection, args).await,
        RunsCommand::Show(args) => show(connection, args).await,
        RunsCommand::Tail(args) => tail(connection, args).await,
        RunsCommand::Export(args) => export(connection, args).await,
        RunsCommand::Cancel(args) => cancel(connection, args).await,
    }
}

async fn export(connection: &Connection, args: &ExportArgs) -> Result<(), Error> {
    let client = connection.connect().await?;
    let request = StreamEventsRequest {
        run_id: args.run.clone(),
        ..Default::default()
    };
    let mut stream = client.runs().stream_events(request).await?.into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.message().await? {
        if let Some(stream_events_response::Item::Event(event)) = item.item {
            events.push(event_record(&event)?);
        }
    }
    if args.out == Path::new("-") {
        use std::io::Write as _;
        crate::archive::write_to(std::io::stdout().lock(), &events)?.flush()?;
        return Ok(());
    }
    let run = crate::store::RunId::parse(&args.run)
        .ok_or_else(|| Error::Failed(format!("'{}' is not a run id", args.run)))?;
    let written = if args.out.is_dir() {
        crate::archive::write(&args.out, run, &events)?
    } else {
        let file = std::fs::File::create(&args.out)
            .map_err(|e| Error::Failed(format!("{}: {e}", args.out.display())))?;
        crate::archive::write_to(file, &events)?.sync_all()?;
        args.out.clone()
    };
    println!("{}", written.display());
    Ok(())
}

/// An event as the server sent it, in the store's terms (for the archive).
fn event_record(event: &crate::proto::Event) -> Result<crate::store::EventRecord, Error> {
    let bad = |what: &str| Error::Failed(format!("the server sent an event with a bad {what}"));
    let run = crate::store::RunId::parse(&event.run_id).ok_or_else(|| bad("run id"))?;
    let id = uuid::Uuid::try_parse(&event.id).map_err(|_| bad("id"))?;
    let time_ms = event.time.as_ref().map_or(0, |t| {
        t.seconds.saturating_mul(1000) + i64::from(t.nanos / 1_000_000)
    });
    let actor = event.actor.clone().unwrap_or_default();
    Ok(crate::store::EventRecord {
        run_id: run.as_bytes().to_vec(),
        seq: event.seq,
        position: event.position,
        id: id.as_bytes().to_vec(),
        event_type: event.r#type.clone(),
        data_json: event.data_json.clone(),
        time_ms,
        actor_kind: actor.kind,
        actor_name: actor.name,
        actor_principal: actor.principal,
    })
}

async fn cancel(connection: &Connection, args: &CancelArgs) -> Result<(), Error> {
    let request = CancelRunRequest {
        run_id: args.run.clone(),
        reason: args.reason.clone(),
    };
    let client = connection.connect().await?;
    let cancelled = client.runs().cancel_run(request).await?.into_inner();
    let out = Output::new(args.format.json);
    match (out.json, cancelled.seq) {
        (true, seq) => out.document(&json!({"run_id": args.run, "seq": seq})),
        (false, 0) => out.line(&format!("run {} was already cancelled", args.run)),
        (false, seq) => out.line(&format!("cancelled run {} (event {seq})", args.run)),
    }
}

async fn start(connection: &Connection, args: &StartArgs) -> Result<(), Error> {
    let kind = match (&args.model, &args.steps) {
        (Some(model), _) => match model.strip_prefix("openai:") {
            Some(rest) => model_spec::Kind::Openai(openai_model(rest)),
            None => model_spec::Kind::Worker(model.clone()),
        },
        (None, Some(path)) => model_spec::Kind::Scripted(ScriptedModel {
            steps: read_steps(path)?,
        }),
        // clap requires one of them.
        (None, None) => return Err(Error::Usage("give --model or --steps".into())),
    };
    let tool = |name: &String, requires_approval| ToolRef {
        name: name.clone(),
        requires_approval,
        approval_timeout_s: 0.0,
        approvals_required: 0,
    };
    let tools = args.tools.iter().map(|name| tool(name, false));
    let gated = args.gated.iter().map(|name| tool(name, true));
    let request = StartRunRequest {
        task: args.task.clone(),
        model: Some(ModelSpec { kind: Some(kind) }),
        tools: tools.chain(gated).collect(),
        budget: (args.deadline_s.is_some() || args.max_tokens.is_some()).then(|| Budget {
            deadline_s: args.deadline_s.unwrap_or(0.0),
            max_model_calls: 0,
            max_tokens: args.max_tokens.unwrap_or(0),
        }),
        labels: args.labels.iter().cloned().collect(),
        request_id: args.request_id.clone().unwrap_or_default(),
        system: args.system.clone().unwrap_or_default(),
    };
    let client = connection.connect().await?;
    let started = client.runs().start_run(request).await?.into_inner();
    let out = Output::new(args.format.json);
    match out.json {
        true => out.document(&json!({"run_id": started.run_id, "created": started.created})),
        // Just the id, so that RUN=$(aaa runs start ...) works.
        false => out.line(&started.run_id),
    }
}

/// `MODEL[@PROVIDER]` of `--model openai:...`; either part may be empty
/// (the provider's default model, the server's default provider).
fn openai_model(text: &str) -> OpenAiModel {
    let (model, provider) = text.rsplit_once('@').unwrap_or((text, ""));
    OpenAiModel {
        model: model.to_string(),
        provider: provider.to_string(),
        ..Default::default()
    }
}

/// Reads a --steps file: the scripted model's steps in the shape the log
/// records them in aaa.run.started, so the engine's type reads them.
fn read_steps(path: &Path) -> Result<Vec<ScriptedStep>, Error> {
    let bad = |e: &dyn std::fmt::Display| Error::Usage(format!("--steps {}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(&e))?;
    let steps: Vec<ScriptStep> = serde_json::from_str(&text).map_err(|e| bad(&e))?;
    let step = |step| {
        let reply = match step {
            ScriptStep::Text(text) => scripted_step::Reply::Text(text),
            ScriptStep::Echo => scripted_step::Reply::Echo(()),
            ScriptStep::ToolCalls(calls) => {
                let calls = calls.into_iter().map(|call| ScriptedToolCall {
                    name: call.name,
                    // arbitrary_precision: the numbers are written as they were read.
                    arguments_json: call.arguments.to_string(),
                });
                scripted_step::Reply::ToolCalls(ScriptedToolCalls {
                    calls: calls.collect(),
                })
            }
        };
        ScriptedStep { reply: Some(reply) }
    };
    Ok(steps.into_iter().map(step).collect())
}

async fn list(connection: &Connection, args: &ListArgs) -> Result<(), Error> {
    let request = ListRunsRequest {
        status: args.status.map_or(0, |s| s as i32),
        labels: args.labels.iter().cloned().collect(),
        page_size: args.page.limit.unwrap_or(0),
        page_token: args.page.page_token.clone().unwrap_or_default(),
    };
    let client = connection.connect().await?;
    let page = client.runs().list_runs(request).await?.into_inner();
    let out = Output::new(args.format.json);
    if out.json {
        let runs: Vec<_> = page.runs.iter().map(render::run_json).collect();
        return out.document(&json!({"runs": runs, "next_page_token": page.next_page_token}));
    }
    if page.runs.is_empty() {
        return out.line("no runs");
    }
    let rows = page.runs.iter().map(|run| {
        vec![
            run.run_id.clone(),
            present::status_word(run.status),
            present::short_time(&run.created_at),
            run.task.clone(),
        ]
    });
    out.table(&["RUN", "STATUS", "CREATED", "TASK"], rows)?;
    if !page.next_page_token.is_empty() {
        out.line(&format!("more: --page-token {}", page.next_page_token))?;
    }
    Ok(())
}

pub(super) async fn get_run(client: &Client, run_id: &str) -> Result<Run, Error> {
    let request = GetRunRequest {
        run_id: run_id.into(),
    };
    let response = client.runs().get_run(request).await?.into_inner();
    response
        .run
        .ok_or_else(|| Error::Failed("GetRun answered without a run".into()))
}

async fn show(connection: &Connection, args: &ShowArgs) -> Result<(), Error> {
    let run = get_run(&connection.connect().await?, &args.run).await?;
    let out = Output::new(args.format.json);
    if out.json {
        return out.document(&render::run_json(&run));
    }
    let mut rows = vec![
        ("run", run.run_id.clone()),
        ("status", present::status_word(run.status)),
        ("task", run.task.clone()),
        ("model", run.model.clone()),
        ("tools", run.tools.join(", ")),
        ("labels", render::labels(&run.labels)),
        ("created", render::time(&run.created_at)),
        ("updated", render::time(&run.updated_at)),
        ("deadline", render::time(&run.deadline_at)),
        ("last seq", run.last_seq.to_string()),
        ("result", run.result_json.clone()),
    ];
    if let Some(error) = &run.error {
        rows.push(("error", format!("{}: {}", error.r#type, error.message)));
    }
    if let Some(usage) = run.usage.filter(|u| u.total_tokens > 0) {
        let tokens = format!(
            "{} ({} prompt, {} completion)",
            usage.total_tokens, usage.prompt_tokens, usage.completion_tokens
        );
        rows.push(("tokens", tokens));
    }
    for (name, value) in rows.into_iter().filter(|(_, v)| !v.is_empty()) {
        out.line(&format!("{name:<9} {value}"))?;
    }
    for approval in &run.pending_approvals {
        let what = format!(
            "{} {} {}",
            approval.call_id, approval.tool, approval.arguments_json
        );
        out.line(&format!(
            "{:<9} {}",
            "waits for",
            out.paint(Style::Yellow, &what)
        ))?;
    }
    Ok(())
}

async fn tail(connection: &Connection, args: &TailArgs) -> Result<(), Error> {
    let client = connection.connect().await?;
    let request = StreamEventsRequest {
        run_id: args.run.clone(),
        after_seq: args.after_seq,
        follow: true,
        type_prefix: String::new(),
        stop_at_end: true,
    };
    let mut stream = client.runs().stream_events(request).await?.into_inner();
    let out = Output::new(args.format.json);
    while let Some(item) = stream.message().await? {
        // The caught_up marker only says that live events follow; not shown.
        if let Some(stream_events_response::Item::Event(event)) = item.item {
            match out.json {
                true => out.json_line(&render::event_json(&event))?,
                false => out.line(&render::event_line(&out, &event))?,
            }
        }
    }
    // The stream ended after the terminal event (perhaps before the cursor,
    // when resuming): the run's status says how it ended.
    let run = get_run(&client, &args.run).await?;
    match RunStatus::try_from(run.status) {
        Ok(RunStatus::Completed) => Ok(()),
        Ok(RunStatus::Failed | RunStatus::Cancelled) => Err(Error::RunNotCompleted),
        _ => Err(Error::Failed(format!(
            "the server ended the stream of run {} before the run ended",
            args.run
        ))),
    }
}
