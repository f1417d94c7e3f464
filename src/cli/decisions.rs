//! `aaa approve`, `aaa deny` and `aaa edit`: decisions on pending calls.
//! One call is decided with RunService.Signal; `--from` decides every call
//! of an `aaa approvals ls --json` listing with one DecideApprovals, each
//! bound to the digest of the arguments the listing showed.

use std::io::Read;

use serde_json::{json, Value};

use super::render::Output;
use super::{Client, Connection, Error, Format};
use crate::present;
use crate::proto::{
    BatchDecision, DecideApprovalsRequest, DecideApprovalsResponse, DecisionItem, DecisionStatus,
    SignalRequest, SignalResponse,
};

pub const GRANTED: &str = "aaa.approval.granted";
pub const DENIED: &str = "aaa.approval.denied";
pub const EDITED: &str = "aaa.approval.edited";
const VOTED: &str = "aaa.approval.voted";

/// Which calls a decision is about: one named call, or a listing.
#[derive(clap::Args)]
pub struct Target {
    /// The run's id.
    #[arg(required_unless_present = "from")]
    run: Option<String>,
    /// The call's id (`call_id` in `aaa approvals ls`).
    #[arg(required_unless_present = "from")]
    call: Option<String>,
    /// Decide every call of this file (`-`: stdin), the output of
    /// `aaa approvals ls --json`: each is bound to the arguments_sha256
    /// it lists, so only what was shown is decided.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["run", "call"])]
    from: Option<String>,
    /// With --from: decide nothing unless every call can be decided.
    #[arg(long, requires = "from")]
    all_or_nothing: bool,
    /// With auth off: the name your vote counts under when a call needs
    /// several approvers (unverified; with auth on it is your principal).
    #[arg(long, value_name = "NAME")]
    approver: Option<String>,
}

#[derive(clap::Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(flatten)]
    target: Target,
    /// A note recorded with the grant.
    #[arg(long, value_name = "TEXT")]
    comment: Option<String>,
    /// Approve only if the call's arguments have this SHA-256 (hex, as
    /// `arguments_sha256` in `aaa approvals ls --json`).
    #[arg(long, value_name = "HEX", conflicts_with = "from")]
    sha256: Option<String>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
pub struct DenyArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(flatten)]
    target: Target,
    /// Why: the model reads it as the tool's result.
    #[arg(long, value_name = "TEXT")]
    reason: String,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
pub struct EditArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The run's id.
    run: String,
    /// The call's id (`call_id` in `aaa approvals ls`).
    call: String,
    /// The arguments the tool should get instead, as a JSON object.
    #[arg(long, value_name = "JSON")]
    arguments: String,
    /// Why: recorded, and the model reads it with the tool's result.
    #[arg(long, value_name = "TEXT", default_value = "")]
    reason: String,
    /// Also grant the edited call (your vote, when it needs several).
    #[arg(long)]
    grant: bool,
    /// With auth off: the name your grant counts under (see `aaa approve`).
    #[arg(long, value_name = "NAME", requires = "grant")]
    approver: Option<String>,
    /// Edit only if the call's arguments have this SHA-256.
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    #[command(flatten)]
    format: Format,
}

/// The data of a grant: the call, and optionally a comment and the hash of
/// the arguments it approves.
pub fn grant_data(call: &str, comment: Option<&str>, sha256: Option<&str>) -> Value {
    let mut data = json!({ "call_id": call });
    if let Some(comment) = comment {
        data["comment"] = json!(comment);
    }
    if let Some(sha256) = sha256 {
        data["arguments_sha256"] = json!(sha256);
    }
    data
}

/// Adds the approver's name to a decision's data, when one is given.
fn name_approver(data: &mut Value, approver: Option<&str>) {
    if let Some(approver) = approver {
        data["approver"] = json!(approver);
    }
}

pub fn deny_data(call: &str, reason: &str) -> Value {
    json!({ "call_id": call, "reason": reason })
}

/// The data of an edit.
pub fn edit_data(
    call: &str,
    arguments: Value,
    reason: &str,
    grant: bool,
    sha256: Option<&str>,
) -> Value {
    let mut data =
        json!({ "call_id": call, "arguments": arguments, "reason": reason, "grant": grant });
    if let Some(sha256) = sha256 {
        data["arguments_sha256"] = json!(sha256);
    }
    data
}

pub(super) async fn approve(args: &ApproveArgs) -> Result<(), Error> {
    let client = args.connection.connect().await?;
    let (Some(run), Some(call)) = (&args.target.run, &args.target.call) else {
        let comment = args.comment.clone().unwrap_or_default();
        return batch(
            &client,
            &args.target,
            BatchDecision::Grant,
            comment,
            &args.format,
        )
        .await;
    };
    let mut data = grant_data(call, args.comment.as_deref(), args.sha256.as_deref());
    name_approver(&mut data, args.target.approver.as_deref());
    let answer = signal(&client, run, GRANTED, data).await?;
    report(run, call, GRANTED, &answer, &args.format)
}

pub(super) async fn deny(args: &DenyArgs) -> Result<(), Error> {
    let client = args.connection.connect().await?;
    let (Some(run), Some(call)) = (&args.target.run, &args.target.call) else {
        let reason = args.reason.clone();
        return batch(
            &client,
            &args.target,
            BatchDecision::Deny,
            reason,
            &args.format,
        )
        .await;
    };
    let mut data = deny_data(call, &args.reason);
    name_approver(&mut data, args.target.approver.as_deref());
    let answer = signal(&client, run, DENIED, data).await?;
    report(run, call, DENIED, &answer, &args.format)
}

pub(super) async fn edit(args: &EditArgs) -> Result<(), Error> {
    let arguments: Value = serde_json::from_str(&args.arguments)
        .map_err(|e| Error::Usage(format!("--arguments is not JSON: {e}")))?;
    let mut data = edit_data(
        &args.call,
        arguments,
        &args.reason,
        args.grant,
        args.sha256.as_deref(),
    );
    name_approver(&mut data, args.approver.as_deref());
    let client = args.connection.connect().await?;
    let answer = signal(&client, &args.run, EDITED, data).await?;
    report(&args.run, &args.call, EDITED, &answer, &args.format)
}

pub async fn signal(
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
            "votes": answer.votes,
            "approvals_required": answer.approvals_required,
            "new_call_id": answer.new_call_id,
            "new_arguments_sha256": answer.new_arguments_sha256,
        }))?;
    }
    let line = decision_line(run_id, call_id, wanted, answer);
    if !stands(wanted, answer) {
        return Err(Error::Failed(line));
    }
    match out.json {
        true => Ok(()),
        false => out.line(&line),
    }
}

/// Whether the decision that stands is the one asked for (a grant that
/// was counted as a vote is).
fn stands(wanted: &str, answer: &SignalResponse) -> bool {
    answer.decision == wanted || (wanted == GRANTED && answer.decision == VOTED)
}

/// "granted call-1 of run R", or what stands when it was already decided.
pub fn decision_line(run_id: &str, call_id: &str, wanted: &str, answer: &SignalResponse) -> String {
    let word = answer.decision.trim_start_matches("aaa.approval.");
    match (answer.already_decided, stands(wanted, answer)) {
        (false, _) if answer.decision == VOTED => format!(
            "voted for {call_id} of run {run_id}: {} of {} grants, it waits for more",
            answer.votes, answer.approvals_required
        ),
        (false, _) if answer.decision == EDITED => format!(
            "edited {call_id} of run {run_id}: {} takes its place{}",
            answer.new_call_id,
            if answer.votes > 0 {
                " with your grant"
            } else {
                " and waits for a grant"
            }
        ),
        (false, _) => format!("{word} {call_id} of run {run_id}"),
        (true, true) => format!("{call_id} of run {run_id} was already {word}"),
        (true, false) => {
            format!("{call_id} of run {run_id} was already {word}; this decision changed nothing")
        }
    }
}

/// The calls of an `aaa approvals ls --json` listing (or of any JSON with
/// an "approvals" array, or an array, of objects with run_id, call_id and
/// arguments_sha256).
fn listed_items(text: &str, source: &str) -> Result<Vec<DecisionItem>, Error> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::Usage(format!("{source} is not JSON: {e}")))?;
    let list = match &value {
        Value::Array(list) => list,
        other => other
            .get("approvals")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{source} has no \"approvals\" list (the output of `aaa approvals ls --json`)"
                ))
            })?,
    };
    list.iter()
        .enumerate()
        .map(|(i, approval)| {
            let field = |name: &str| {
                approval
                    .get(name)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| Error::Usage(format!("{source}: approvals[{i}] has no {name}")))
            };
            Ok(DecisionItem {
                run_id: field("run_id")?,
                call_id: field("call_id")?,
                arguments_sha256: field("arguments_sha256")?,
            })
        })
        .collect()
}

/// Decides every call of `--from` with one DecideApprovals; exit 1 unless
/// each was decided.
async fn batch(
    client: &Client,
    target: &Target,
    decision: BatchDecision,
    text: String,
    format: &Format,
) -> Result<(), Error> {
    let source = target.from.as_deref().unwrap_or("-");
    let contents = if source == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Error::Failed(format!("reading stdin: {e}")))?;
        text
    } else {
        std::fs::read_to_string(source)
            .map_err(|e| Error::Usage(format!("reading {source}: {e}")))?
    };
    let items = listed_items(&contents, source)?;
    let out = Output::new(format.json);
    if items.is_empty() {
        return out.line("nothing to decide: the listing is empty");
    }
    let grant = decision == BatchDecision::Grant;
    let approver = target.approver.clone().unwrap_or_default();
    decide(
        client,
        items,
        grant,
        text,
        target.all_or_nothing,
        approver,
        &out,
    )
    .await
}

/// One DecideApprovals for `items`; prints each item's outcome, and exits 1
/// unless every item was decided.
pub async fn decide(
    client: &Client,
    items: Vec<DecisionItem>,
    grant: bool,
    text: String,
    all_or_nothing: bool,
    approver: String,
    out: &Output,
) -> Result<(), Error> {
    let (decision, reason, comment) = match grant {
        true => (BatchDecision::Grant, String::new(), text),
        false => (BatchDecision::Deny, text, String::new()),
    };
    let request = DecideApprovalsRequest {
        items,
        decision: decision as i32,
        reason,
        comment,
        all_or_nothing,
        approver,
        request_id: String::new(),
    };
    let answer = client
        .approvals()
        .decide_approvals(request)
        .await?
        .into_inner();
    report_batch(&answer, out)
}

fn report_batch(answer: &DecideApprovalsResponse, out: &Output) -> Result<(), Error> {
    let status_word = |status: i32| {
        DecisionStatus::try_from(status).map_or_else(
            |_| status.to_string(),
            |s| present::word(s.as_str_name(), "DECISION_STATUS_"),
        )
    };
    let decided = answer
        .results
        .iter()
        .filter(|r| r.status == DecisionStatus::Decided as i32)
        .count();
    if out.json {
        let results: Vec<Value> = answer
            .results
            .iter()
            .map(|r| {
                json!({
                    "run_id": r.run_id,
                    "call_id": r.call_id,
                    "status": status_word(r.status),
                    "decision": r.decision,
                    "seq": r.seq,
                    "error_reason": r.error_reason,
                    "error_message": r.error_message,
                })
            })
            .collect();
        out.document(&json!({ "results": results }))?;
    } else {
        let rows = answer.results.iter().map(|r| {
            let what = match r.error_message.as_str() {
                "" => r.decision.trim_start_matches("aaa.approval.").to_string(),
                message => message.to_string(),
            };
            vec![
                r.run_id.clone(),
                r.call_id.clone(),
                status_word(r.status),
                what,
            ]
        });
        out.table(&["RUN", "CALL", "OUTCOME", "DETAIL"], rows)?;
    }
    if decided < answer.results.len() {
        return Err(Error::Failed(format!(
            "{decided} of {} calls decided",
            answer.results.len()
        )));
    }
    match out.json {
        true => Ok(()),
        false => out.line(&format!("{decided} calls decided")),
    }
}
