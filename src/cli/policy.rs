//! `aaa policy`: try a policy file on a call without a server (`test`),
//! and see or reload the policy a server runs with (`show`, `reload`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::render::Output;
use super::{label, Connection, Error, Format, EXIT_CODES};
use crate::policy::{CallFacts, Decide, Policy, Verdict};
use crate::proto::{GetPolicyRequest, GetPolicyResponse, ReloadPolicyRequest};

#[derive(clap::Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(clap::Subcommand)]
enum PolicyCommand {
    /// Check a policy file and say which rule would decide a call, and how
    /// (no server needed). Exit 1 when the file does not check.
    ///
    /// Example: aaa policy test policy.toml --tool wire_money --arguments '{"amount":50,"to":"ACME"}'
    #[command(after_help = EXIT_CODES)]
    Test(TestArgs),
    /// The policy the server runs with: its file, sha256 and rules.
    #[command(after_help = EXIT_CODES)]
    Show(ShowArgs),
    /// Make the server read its policy file again (role admin). A file
    /// that does not check is refused and the policy in force stays.
    #[command(after_help = EXIT_CODES)]
    Reload(ShowArgs),
}

#[derive(clap::Args)]
struct TestArgs {
    /// The policy file (TOML; see docs/policy.md).
    file: PathBuf,
    /// The tool called.
    #[arg(long, value_name = "NAME")]
    tool: String,
    /// Its arguments, a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    arguments: String,
    /// A label of the run (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
    /// The run's task.
    #[arg(long, value_name = "TEXT", default_value = "")]
    task: String,
    /// The principal that started the run.
    #[arg(long, value_name = "NAME", default_value = "")]
    started_by: String,
    /// The time of the call, RFC 3339 (default: now).
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct ShowArgs {
    #[command(flatten)]
    format: Format,
}

pub(super) async fn run(args: &PolicyArgs) -> Result<(), Error> {
    match &args.command {
        PolicyCommand::Test(test) => dry_run(test),
        PolicyCommand::Show(show) => {
            let client = args.connection.connect().await?;
            let policy = client.policy().get_policy(GetPolicyRequest {}).await?;
            describe(&policy.into_inner(), &show.format)
        }
        PolicyCommand::Reload(show) => {
            let client = args.connection.connect().await?;
            let answer = client
                .policy()
                .reload_policy(ReloadPolicyRequest {})
                .await?;
            describe(
                &answer.into_inner().policy.unwrap_or_default(),
                &show.format,
            )
        }
    }
}

fn dry_run(args: &TestArgs) -> Result<(), Error> {
    let policy = Policy::load(&args.file).map_err(Error::Failed)?;
    let arguments: Value = serde_json::from_str(&args.arguments)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| Error::Usage("--arguments: not a JSON object".into()))?;
    let now_ms = match &args.at {
        None => crate::clock::now_ms(),
        Some(at) => {
            super::grants::rfc3339_ms(at).map_err(|e| Error::Usage(format!("--at: {e}")))?
        }
    };
    let labels: BTreeMap<String, String> = args.labels.iter().cloned().collect();
    let facts = CallFacts {
        tool: &args.tool,
        arguments: &arguments,
        labels: &labels,
        task: &args.task,
        started_by: &args.started_by,
        now_ms,
    };
    let verdict = policy.evaluate(&facts, &crate::policy::Budget::new());
    let out = Output::new(args.format.json);
    if out.json {
        let mut answer = verdict_json(&verdict);
        answer["sha256"] = json!(policy.sha256);
        return out.document(&answer);
    }
    out.line(&verdict_line(&verdict))
}

fn verdict_json(verdict: &Verdict) -> Value {
    match verdict {
        Verdict::NoMatch => json!({"decide": "none", "rule": null}),
        Verdict::Failed { rule, error } => {
            json!({"decide": "failed", "rule": rule, "error": error})
        }
        Verdict::Decided { rule, decide } => match decide {
            Decide::Allow => json!({"decide": "allow", "rule": rule}),
            Decide::Deny { reason } => json!({"decide": "deny", "rule": rule, "reason": reason}),
            Decide::Require(needs) => json!({
                "decide": "require",
                "rule": rule,
                "approvals_required": needs.approvals_required,
                "approvers": needs.approvers,
                "approval_timeout_s": needs.approval_timeout_s,
            }),
        },
    }
}

fn verdict_line(verdict: &Verdict) -> String {
    match verdict {
        Verdict::NoMatch => "no rule matches: the tool's own settings apply".into(),
        Verdict::Failed { rule, error } => format!(
            "rule {rule} could not be evaluated ({error}): the call would wait for a person, with the tool's settings"
        ),
        Verdict::Decided { rule, decide } => match decide {
            Decide::Allow => format!("rule {rule} allows it: granted by the policy, nobody is asked"),
            Decide::Deny { reason } => format!("rule {rule} denies it: {reason}"),
            Decide::Require(needs) => {
                let count = match needs.approvals_required {
                    None => "a person's decision".to_string(),
                    Some(1) => "1 approval".to_string(),
                    Some(n) => format!("{n} approvals"),
                };
                let from = needs
                    .approvers
                    .as_ref()
                    .map_or(String::new(), |groups| format!(" from {}", groups.join(" or ")));
                let within = needs
                    .approval_timeout_s
                    .map_or(String::new(), |s| format!(" within {s} s"));
                format!("rule {rule} requires {count}{from}{within}")
            }
        },
    }
}

fn describe(policy: &GetPolicyResponse, format: &Format) -> Result<(), Error> {
    let out = Output::new(format.json);
    if out.json {
        return out.document(&json!({
            "loaded": policy.loaded,
            "file": policy.file,
            "sha256": policy.sha256,
            "rules": policy.rules,
        }));
    }
    if !policy.loaded {
        return out.line("no policy: every call follows its tool's settings");
    }
    out.line(&format!("{} (sha256 {})", policy.file, policy.sha256))?;
    for (i, rule) in policy.rules.iter().enumerate() {
        out.line(&format!("{:>3}. {rule}", i + 1))?;
    }
    Ok(())
}
