//! `aaa approvals` (ls, watch, review) and `aaa approve` / `aaa deny`: the
//! inbox of tool calls waiting for a human, and the decisions, which are
//! RunService.Signal calls with aaa.approval.granted / aaa.approval.denied.

use std::io::IsTerminal;

use serde_json::{json, Value};

use super::render::{self, Output, Style};
use super::{label, Client, Connection, Error, Format, Page, EXIT_CODES};
use crate::proto::{
    watch_approvals_response, Approval, ListApprovalsRequest, SignalRequest, SignalResponse,
    WatchApprovalsRequest,
};

const GRANTED: &str = "aaa.approval.granted";
const DENIED: &str = "aaa.approval.denied";

#[derive(clap::Args)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    command: ApprovalsCommand,
}

#[derive(clap::Subcommand)]
enum ApprovalsCommand {
    /// List the pending approvals, oldest run first.
    ///
    /// Example: aaa approvals ls --tool wire_money
    #[command(after_help = EXIT_CODES)]
    Ls(ListArgs),
    /// Watch the inbox live: what is pending, then each new request and each
    /// decision, until interrupted.
    ///
    /// Example: aaa approvals watch --label team=payments
    #[command(after_help = EXIT_CODES)]
    Watch(WatchArgs),
    /// Go through the pending approvals one by one: each is shown with its
    /// run, tool and arguments, and you answer approve, deny (then a reason),
    /// skip or quit. Answers are read from stdin line by line, so they can be
    /// piped. A grant approves exactly the arguments shown (arguments_sha256).
    /// With --wait it then stays on call for new requests.
    ///
    /// Example: aaa approvals review --tool wire_money --wait
    #[command(after_help = EXIT_CODES)]
    Review(ReviewArgs),
}

/// The filters ListApprovals and WatchApprovals take.
#[derive(clap::Args)]
struct Filter {
    /// Only calls of this tool.
    #[arg(long, value_name = "NAME")]
    tool: Option<String>,
    /// Only calls of this run.
    #[arg(long, value_name = "RUN")]
    run: Option<String>,
    /// Only calls of runs carrying this label (repeatable; all must match).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
}

impl Filter {
    fn watch_request(&self, after_position: Option<u64>) -> WatchApprovalsRequest {
        WatchApprovalsRequest {
            tool: self.tool.clone().unwrap_or_default(),
            run_id: self.run.clone().unwrap_or_default(),
            labels: self.labels.iter().cloned().collect(),
            after_position,
            heartbeat_s: 0.0,
        }
    }

    fn list_request(&self, page_size: u32, page_token: String) -> ListApprovalsRequest {
        ListApprovalsRequest {
            tool: self.tool.clone().unwrap_or_default(),
            run_id: self.run.clone().unwrap_or_default(),
            labels: self.labels.iter().cloned().collect(),
            page_size,
            page_token,
        }
    }
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    filter: Filter,
    #[command(flatten)]
    page: Page,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct WatchArgs {
    #[command(flatten)]
    filter: Filter,
    /// Resume: skip the snapshot and show the changes after this position
    /// (the `position` of the last item seen, with --json).
    #[arg(long, value_name = "POSITION")]
    after_position: Option<u64>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct ReviewArgs {
    #[command(flatten)]
    filter: Filter,
    /// After the pending calls, wait for new requests and ask about each
    /// as it comes, until `q` or the end of input.
    #[arg(long)]
    wait: bool,
}

#[derive(clap::Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The run's id.
    run: String,
    /// The call's id (`call_id` in `aaa approvals ls`).
    call: String,
    /// A note recorded with the grant.
    #[arg(long, value_name = "TEXT")]
    comment: Option<String>,
    /// Approve only if the call's arguments have this SHA-256 (hex, as
    /// `arguments_sha256` in `aaa approvals ls --json`).
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
pub struct DenyArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The run's id.
    run: String,
    /// The call's id (`call_id` in `aaa approvals ls`).
    call: String,
    /// Why: the model reads it as the tool's result.
    #[arg(long, value_name = "TEXT")]
    reason: String,
    #[command(flatten)]
    format: Format,
}

pub(super) async fn run(args: &ApprovalsArgs) -> Result<(), Error> {
    let connection = &args.connection;
    match &args.command {
        ApprovalsCommand::Ls(args) => list(connection, args).await,
        ApprovalsCommand::Watch(args) => watch(connection, args).await,
        ApprovalsCommand::Review(args) => review(connection, args).await,
    }
}

async fn list(connection: &Connection, args: &ListArgs) -> Result<(), Error> {
    let request = args.filter.list_request(
        args.page.limit.unwrap_or(0),
        args.page.page_token.clone().unwrap_or_default(),
    );
    let client = connection.connect().await?;
    let page = client
        .approvals()
        .list_approvals(request)
        .await?
        .into_inner();
    let out = Output::new(args.format.json);
    if out.json {
        let approvals: Vec<_> = page.approvals.iter().map(render::approval_json).collect();
        return out.document(&json!({
            "approvals": approvals,
            "next_page_token": page.next_page_token,
        }));
    }
    if page.approvals.is_empty() {
        return out.line("no pending approvals");
    }
    let rows = page.approvals.iter().map(|a| {
        vec![
            a.run_id.clone(),
            a.call_id.clone(),
            a.tool.clone(),
            render::short_time(&a.requested_at),
            a.arguments_json.clone(),
        ]
    });
    out.table(&["RUN", "CALL", "TOOL", "REQUESTED", "ARGUMENTS"], rows)?;
    if !page.next_page_token.is_empty() {
        out.line(&format!("more: --page-token {}", page.next_page_token))?;
    }
    Ok(())
}

async fn watch(connection: &Connection, args: &WatchArgs) -> Result<(), Error> {
    let request = args.filter.watch_request(args.after_position);
    let client = connection.connect().await?;
    let mut stream = client
        .approvals()
        .watch_approvals(request)
        .await?
        .into_inner();
    let out = Output::new(args.format.json);
    while let Some(response) = stream.message().await? {
        if out.json {
            // Heartbeats too: their position is a resume point.
            out.json_line(&render::watch_json(&response))?;
        } else if let Some(line) = render::watch_line(&out, &response) {
            out.line(&line)?;
        }
    }
    Ok(())
}

/// The data of a grant: the call, and optionally a comment and the hash of
/// the arguments it approves.
fn grant_data(call: &str, comment: Option<&str>, sha256: Option<&str>) -> Value {
    let mut data = json!({ "call_id": call });
    if let Some(comment) = comment {
        data["comment"] = json!(comment);
    }
    if let Some(sha256) = sha256 {
        data["arguments_sha256"] = json!(sha256);
    }
    data
}

fn deny_data(call: &str, reason: &str) -> Value {
    json!({ "call_id": call, "reason": reason })
}

pub(super) async fn approve(args: &ApproveArgs) -> Result<(), Error> {
    let data = grant_data(&args.call, args.comment.as_deref(), args.sha256.as_deref());
    let client = args.connection.connect().await?;
    let answer = signal(&client, &args.run, GRANTED, data).await?;
    report(&args.run, &args.call, GRANTED, &answer, &args.format)
}

pub(super) async fn deny(args: &DenyArgs) -> Result<(), Error> {
    let data = deny_data(&args.call, &args.reason);
    let client = args.connection.connect().await?;
    let answer = signal(&client, &args.run, DENIED, data).await?;
    report(&args.run, &args.call, DENIED, &answer, &args.format)
}

async fn signal(
    client: &Client,
    run_id: &str,
    event_type: &str,
    data: Value,
) -> Result<SignalResponse, Error> {
    let request = SignalRequest {
        run_id: run_id.into(),
        r#type: event_type.into(),
        data_json: data.to_string(),
        request_id: String::new(),
    };
    Ok(client.runs().signal(request).await?.into_inner())
}

/// Prints what a decision did. The first decision on a call wins and Signal
/// answers OK either way, so a decision that lost to another one is turned
/// into exit 1 here: a script that approved must not think the tool runs.
fn report(
    run_id: &str,
    call_id: &str,
    wanted: &str,
    answer: &SignalResponse,
    format: &Format,
) -> Result<(), Error> {
    let out = Output::new(format.json);
    if out.json {
        out.document(&json!({
            "run_id": run_id,
            "call_id": call_id,
            "seq": answer.seq,
            "already_decided": answer.already_decided,
            "decision": answer.decision,
        }))?;
    }
    let line = decision_line(run_id, call_id, wanted, answer);
    if answer.decision != wanted {
        return Err(Error::Failed(line));
    }
    match out.json {
        true => Ok(()),
        false => out.line(&line),
    }
}

/// "granted call-1 of run R", or what stands when it was already decided.
fn decision_line(run_id: &str, call_id: &str, wanted: &str, answer: &SignalResponse) -> String {
    let stands = answer.decision.trim_start_matches("aaa.approval.");
    match (answer.already_decided, answer.decision == wanted) {
        (false, _) => format!("{stands} {call_id} of run {run_id}"),
        (true, true) => format!("{call_id} of run {run_id} was already {stands}"),
        (true, false) => {
            format!("{call_id} of run {run_id} was already {stands}; this decision changed nothing")
        }
    }
}

/// What the reviewer answered about one call.
enum Answer {
    Approve,
    Deny(String),
    Skip,
    Quit,
}

async fn review(connection: &Connection, args: &ReviewArgs) -> Result<(), Error> {
    let client = connection.connect().await?;
    let out = Output::new(false);
    let (mut approved, mut denied, mut skipped) = (0, 0, 0);
    // The inbox's snapshot, then (with --wait) each new request as it comes.
    let mut stream = client
        .approvals()
        .watch_approvals(args.filter.watch_request(None))
        .await?
        .into_inner();
    while let Some(response) = stream.message().await? {
        let approval = match response.item {
            Some(watch_approvals_response::Item::Requested(approval)) => approval,
            Some(watch_approvals_response::Item::SnapshotComplete(_)) if args.wait => {
                out.line("waiting for new requests (q to stop)")?;
                continue;
            }
            Some(watch_approvals_response::Item::SnapshotComplete(_)) => break,
            _ => continue,
        };
        present(&out, &approval)?;
        let (event_type, data) = match ask(&out).await? {
            Answer::Approve => {
                approved += 1;
                // Grant exactly the arguments shown.
                let sha256 = Some(approval.arguments_sha256.as_str());
                (GRANTED, grant_data(&approval.call_id, None, sha256))
            }
            Answer::Deny(reason) => {
                denied += 1;
                (DENIED, deny_data(&approval.call_id, &reason))
            }
            Answer::Skip => {
                skipped += 1;
                continue;
            }
            Answer::Quit => break,
        };
        // Someone may have decided meanwhile: the answer says what stands.
        let answer = signal(&client, &approval.run_id, event_type, data).await?;
        let line = decision_line(&approval.run_id, &approval.call_id, event_type, &answer);
        let style = match answer.decision.as_str() {
            GRANTED => Style::Green,
            _ => Style::Red,
        };
        out.line(&out.paint(style, &line))?;
    }
    match approved + denied + skipped {
        0 => out.line("no pending approvals reviewed"),
        _ => out.line(&format!(
            "{approved} approved, {denied} denied, {skipped} skipped"
        )),
    }
}

/// Shows one pending call: the run (with its task), the tool, the arguments.
fn present(out: &Output, approval: &Approval) -> Result<(), Error> {
    let arguments = serde_json::to_string_pretty(&render::embed(&approval.arguments_json))
        .expect("a Value serializes");
    out.line("")?;
    out.line(&format!(
        "run        {}  {}",
        approval.run_id, approval.task
    ))?;
    if !approval.labels.is_empty() {
        out.line(&format!("labels     {}", render::labels(&approval.labels)))?;
    }
    let expires = render::time(&approval.expires_at);
    let expires = match expires.is_empty() {
        true => String::new(),
        false => format!(", expires {expires}"),
    };
    out.line(&format!(
        "call       {} (requested {}{expires})",
        approval.call_id,
        render::time(&approval.requested_at)
    ))?;
    out.line(&format!(
        "tool       {}",
        out.paint(Style::Yellow, &approval.tool)
    ))?;
    out.line(&format!(
        "arguments  {}",
        arguments.replace('\n', "\n           ")
    ))
}

/// Asks until the answer is one of approve / deny (then a reason) / skip /
/// quit. The end of stdin quits.
async fn ask(out: &Output) -> Result<Answer, Error> {
    loop {
        out.prompt("approve, deny, skip or quit? [a/d/s/q] ")?;
        let Some(answer) = read_answer(out).await? else {
            return Ok(Answer::Quit);
        };
        match answer.to_lowercase().as_str() {
            "a" | "approve" => return Ok(Answer::Approve),
            "s" | "skip" => return Ok(Answer::Skip),
            "q" | "quit" => return Ok(Answer::Quit),
            "d" | "deny" => loop {
                out.prompt("reason (the model reads it): ")?;
                match read_answer(out).await? {
                    None => return Ok(Answer::Quit),
                    Some(reason) if reason.is_empty() => out.line("a denial needs a reason")?,
                    Some(reason) => return Ok(Answer::Deny(reason)),
                }
            },
            _ => out.line("answer a (approve), d (deny), s (skip) or q (quit)")?,
        }
    }
}

/// One line of stdin, trimmed; None at its end. Read on a blocking thread
/// (std's stdin keeps what it buffered for the next call).
async fn read_answer(out: &Output) -> Result<Option<String>, Error> {
    let read = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map(|n| (n > 0).then_some(line))
    });
    let line = read
        .await
        .map_err(|e| Error::Failed(format!("reading stdin: {e}")))?
        .map_err(|e| Error::Failed(format!("reading stdin: {e}")))?;
    let answer = line.map(|l| l.trim().to_string());
    // A terminal echoes what is typed; piped answers are echoed here, so the
    // transcript reads as a dialogue. At the end, end the prompt's line.
    match &answer {
        Some(text) if !std::io::stdin().is_terminal() => out.line(text)?,
        None => out.line("")?,
        Some(_) => {}
    }
    Ok(answer)
}
