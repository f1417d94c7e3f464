//! `aaa approvals` (ls, watch, review): the inbox of tool calls waiting for
//! a human, and the interactive review that decides them (the decisions
//! themselves are in `decisions`).

use std::io::IsTerminal;

use serde_json::{json, Value};

use super::decisions::{self, deny_data, edit_data, grant_data, signal, DENIED, EDITED, GRANTED};
use super::render::{self, Output, Style};
use super::{label, Connection, Error, Format, Page, EXIT_CODES};
use crate::present;
use crate::proto::{
    watch_approvals_response, Approval, ListApprovalsRequest, WatchApprovalsRequest,
};

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
    /// run, tool, arguments and the grants it has, and you answer approve,
    /// deny (then a reason), edit (new arguments, a reason; your grant goes
    /// with it), skip or quit. Answers are read from stdin line by line, so
    /// they can be piped. A decision is bound to exactly the arguments shown
    /// (arguments_sha256). With --wait it then stays on call for new
    /// requests. With --batch, the pending calls are listed, numbered, and
    /// you pick several (`1,3-5` or `all`) to approve or deny at once.
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
    /// Only calls you may decide (of your approver groups, or of none).
    #[arg(long)]
    mine: bool,
}

impl Filter {
    fn watch_request(
        &self,
        after_position: Option<u64>,
        resume_token: Option<String>,
    ) -> WatchApprovalsRequest {
        WatchApprovalsRequest {
            tool: self.tool.clone().unwrap_or_default(),
            run_id: self.run.clone().unwrap_or_default(),
            labels: self.labels.iter().cloned().collect(),
            after_position,
            resume_token,
            heartbeat_s: 0.0,
            decidable: self.mine,
        }
    }

    fn list_request(&self, page_size: u32, page_token: String) -> ListApprovalsRequest {
        ListApprovalsRequest {
            tool: self.tool.clone().unwrap_or_default(),
            run_id: self.run.clone().unwrap_or_default(),
            labels: self.labels.iter().cloned().collect(),
            page_size,
            page_token,
            decidable: self.mine,
            newest_first: false,
        }
    }
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    filter: Filter,
    /// Newest run first instead of oldest.
    #[arg(long)]
    newest_first: bool,
    /// Add each call's page in the web inbox (a LINK column; `link` with
    /// --json), for a chat or email message.
    #[arg(long)]
    links: bool,
    /// The web inbox's base URL for --links, as `aaa serve --public-url`
    /// (default: the --server URL, where the server serves its pages).
    #[arg(long, env = "AAA_PUBLIC_URL", value_name = "URL", requires = "links")]
    public_url: Option<String>,
    #[command(flatten)]
    page: Page,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct WatchArgs {
    #[command(flatten)]
    filter: Filter,
    /// Resume: skip the snapshot and show the changes after this token
    /// (the `resume_token` of the last item seen, with --json).
    #[arg(long, value_name = "TOKEN", conflicts_with = "after_position")]
    resume: Option<String>,
    /// Resume after a position, the older form: exact for positions from
    /// before the log was partitioned, or of a log with one committer.
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
    #[arg(long, conflicts_with = "batch")]
    wait: bool,
    /// List the pending calls and decide a selection of them at once.
    #[arg(long)]
    batch: bool,
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
    let mut request = args.filter.list_request(
        args.page.limit.unwrap_or(0),
        args.page.page_token.clone().unwrap_or_default(),
    );
    request.newest_first = args.newest_first;
    let base = args.public_url.as_deref().unwrap_or(&connection.server);
    let link = |a: &Approval| crate::present::call_url(base, &a.run_id, &a.call_id);
    let client = connection.connect().await?;
    let page = client
        .approvals()
        .list_approvals(request)
        .await?
        .into_inner();
    let out = Output::new(args.format.json);
    if out.json {
        let approvals: Vec<_> = page
            .approvals
            .iter()
            .map(|a| {
                let mut json = render::approval_json(a);
                if let (true, Some(object)) = (args.links, json.as_object_mut()) {
                    object.insert("link".into(), Value::String(link(a)));
                }
                json
            })
            .collect();
        return out.document(&json!({
            "approvals": approvals,
            "next_page_token": page.next_page_token,
        }));
    }
    if page.approvals.is_empty() {
        return out.line("no pending approvals");
    }
    // A GRANTS column ("1/2") only when some call needs several approvers.
    let votes = page.approvals.iter().any(|a| a.approvals_required > 1);
    let rows = page.approvals.iter().map(|a| {
        let mut row = vec![
            a.run_id.clone(),
            a.call_id.clone(),
            a.tool.clone(),
            present::short_time(&a.requested_at),
        ];
        if votes {
            row.push(format!("{}/{}", a.votes.len(), a.approvals_required.max(1)));
        }
        if args.links {
            row.push(link(a));
        }
        row.push(a.arguments_json.clone());
        row
    });
    let mut header = vec!["RUN", "CALL", "TOOL", "REQUESTED"];
    if votes {
        header.push("GRANTS");
    }
    if args.links {
        header.push("LINK");
    }
    header.push("ARGUMENTS");
    out.table(&header, rows)?;
    if !page.next_page_token.is_empty() {
        out.line(&format!("more: --page-token {}", page.next_page_token))?;
    }
    Ok(())
}

async fn watch(connection: &Connection, args: &WatchArgs) -> Result<(), Error> {
    let request = args
        .filter
        .watch_request(args.after_position, args.resume.clone());
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

/// What the reviewer answered about one call.
enum Answer {
    Approve,
    Deny(String),
    Edit { arguments: Value, reason: String },
    Skip,
    Quit,
}

async fn review(connection: &Connection, args: &ReviewArgs) -> Result<(), Error> {
    let client = connection.connect().await?;
    let out = Output::new(false);
    if args.batch {
        return review_batch(&client, &out, &args.filter).await;
    }
    let (mut approved, mut denied, mut edited, mut skipped) = (0, 0, 0, 0);
    // The inbox's snapshot, then (with --wait) each new request as it comes.
    let mut stream = client
        .approvals()
        .watch_approvals(args.filter.watch_request(None, None))
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
            Answer::Edit { arguments, reason } => {
                edited += 1;
                let sha256 = Some(approval.arguments_sha256.as_str());
                (
                    EDITED,
                    edit_data(&approval.call_id, arguments, &reason, true, sha256),
                )
            }
            Answer::Skip => {
                skipped += 1;
                continue;
            }
            Answer::Quit => break,
        };
        // Someone may have decided meanwhile: the answer says what stands.
        let answer = signal(&client, &approval.run_id, event_type, data).await?;
        let line =
            decisions::decision_line(&approval.run_id, &approval.call_id, event_type, &answer);
        let style = match answer.decision.as_str() {
            GRANTED | EDITED => Style::Green,
            DENIED => Style::Red,
            _ => Style::Yellow,
        };
        out.line(&out.paint(style, &line))?;
    }
    match approved + denied + edited + skipped {
        0 => out.line("no pending approvals reviewed"),
        _ => out.line(&format!(
            "{approved} approved, {denied} denied, {edited} edited, {skipped} skipped"
        )),
    }
}

/// `review --batch`: the pending calls, numbered; a selection of them is
/// approved or denied with one DecideApprovals, each bound to its digest.
async fn review_batch(client: &super::Client, out: &Output, filter: &Filter) -> Result<(), Error> {
    let mut pending = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .approvals()
            .list_approvals(filter.list_request(1000, page_token))
            .await?
            .into_inner();
        pending.extend(page.approvals);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if pending.is_empty() {
        return out.line("no pending approvals");
    }
    for (i, approval) in pending.iter().enumerate() {
        out.line(&format!("[{}]", i + 1))?;
        present(out, approval)?;
    }
    let chosen = loop {
        out.prompt("which calls? (e.g. 1,3-5 or all; empty to quit) ")?;
        match read_answer(out).await? {
            None => return Ok(()),
            Some(text) if text.is_empty() => return Ok(()),
            Some(text) => match selection(&text, pending.len()) {
                Ok(chosen) => break chosen,
                Err(why) => out.line(&why)?,
            },
        }
    };
    let grant = loop {
        out.prompt("approve or deny them? [a/d] ")?;
        match read_answer(out).await?.as_deref() {
            None => return Ok(()),
            Some("a" | "approve") => break true,
            Some("d" | "deny") => break false,
            Some(_) => out.line("answer a (approve) or d (deny)")?,
        }
    };
    let mut text = String::new();
    while !grant && text.is_empty() {
        out.prompt("reason (the model reads it): ")?;
        match read_answer(out).await? {
            None => return Ok(()),
            Some(reason) if reason.is_empty() => out.line("a denial needs a reason")?,
            Some(reason) => text = reason,
        }
    }
    let items = chosen
        .iter()
        .map(|&i| &pending[i])
        .map(|a| crate::proto::DecisionItem {
            run_id: a.run_id.clone(),
            call_id: a.call_id.clone(),
            arguments_sha256: a.arguments_sha256.clone(),
        });
    decisions::decide(
        client,
        items.collect(),
        grant,
        text,
        false,
        String::new(),
        out,
    )
    .await
}

/// Parses "1,3-5" or "all" into 0-based indexes below `count`.
fn selection(text: &str, count: usize) -> Result<Vec<usize>, String> {
    if text.eq_ignore_ascii_case("all") {
        return Ok((0..count).collect());
    }
    let number = |n: &str| -> Result<usize, String> {
        match n.trim().parse::<usize>() {
            Ok(n) if (1..=count).contains(&n) => Ok(n - 1),
            _ => Err(format!("'{}' is not a number from 1 to {count}", n.trim())),
        }
    };
    let mut chosen = Vec::new();
    for part in text.split(',') {
        let range = match part.split_once('-') {
            Some((a, b)) => number(a)?..=number(b)?,
            None => {
                let n = number(part)?;
                n..=n
            }
        };
        for i in range {
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
    }
    Ok(chosen)
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
    if !approval.edited_from.is_empty() {
        out.line(&format!("edited     from {}", approval.edited_from))?;
    }
    let votes = render::votes_text(approval);
    if !votes.is_empty() {
        out.line(&format!("grants     {votes}"))?;
    }
    out.line(&format!(
        "arguments  {}",
        arguments.replace('\n', "\n           ")
    ))
}

/// Asks until the answer is one of approve / deny (then a reason) / skip /
/// quit. The end of stdin quits.
async fn ask(out: &Output) -> Result<Answer, Error> {
    loop {
        out.prompt("approve, deny, edit, skip or quit? [a/d/e/s/q] ")?;
        let Some(answer) = read_answer(out).await? else {
            return Ok(Answer::Quit);
        };
        match answer.to_lowercase().as_str() {
            "a" | "approve" => return Ok(Answer::Approve),
            "s" | "skip" => return Ok(Answer::Skip),
            "e" | "edit" => {
                out.prompt("new arguments (a JSON object): ")?;
                let Some(text) = read_answer(out).await? else {
                    return Ok(Answer::Quit);
                };
                let arguments: Value = match serde_json::from_str(&text) {
                    Ok(value @ Value::Object(_)) => value,
                    _ => {
                        out.line("not a JSON object; nothing was edited")?;
                        continue;
                    }
                };
                out.prompt("reason (the model reads it): ")?;
                let Some(reason) = read_answer(out).await? else {
                    return Ok(Answer::Quit);
                };
                return Ok(Answer::Edit { arguments, reason });
            }
            "q" | "quit" => return Ok(Answer::Quit),
            "d" | "deny" => loop {
                out.prompt("reason (the model reads it): ")?;
                match read_answer(out).await? {
                    None => return Ok(Answer::Quit),
                    Some(reason) if reason.is_empty() => out.line("a denial needs a reason")?,
                    Some(reason) => return Ok(Answer::Deny(reason)),
                }
            },
            _ => out.line("answer a (approve), d (deny), e (edit), s (skip) or q (quit)")?,
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
