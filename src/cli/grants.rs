//! `aaa grants`: create, list and revoke standing grants (GrantService).

use serde_json::{json, Value};

use super::render::{self, Output};
use super::{label, Connection, Error, Format, EXIT_CODES};
use crate::present;
use crate::proto::{CreateGrantRequest, Grant, GrantScope, ListGrantsRequest, RevokeGrantRequest};

#[derive(clap::Args)]
pub struct GrantsArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    command: GrantsCommand,
}

#[derive(clap::Subcommand)]
enum GrantsCommand {
    /// Grant a tool's calls in advance (role approver): the calls that
    /// match run without asking anyone, recorded with actor GRANT. Prints
    /// the grant's id.
    ///
    /// Example: aaa grants create --tool wire_money --label team=payroll --condition 'args.amount < 500' --expires-in 8h --max-uses 20 --reason "payroll day"
    #[command(after_help = EXIT_CODES)]
    Create(CreateArgs),
    /// The grants in force, with their uses (--all: revoked, expired and
    /// used-up ones too).
    #[command(after_help = EXIT_CODES)]
    Ls(LsArgs),
    /// Revoke a grant: from now on it grants nothing (role approver).
    ///
    /// Example: aaa grants revoke 0193c5a0-... --reason "payroll is done"
    #[command(after_help = EXIT_CODES)]
    Revoke(RevokeArgs),
}

#[derive(clap::Args)]
struct CreateArgs {
    /// The tool whose calls it grants.
    #[arg(long, value_name = "NAME")]
    tool: String,
    /// Only this run's calls.
    #[arg(long, value_name = "RUN")]
    run: Option<String>,
    /// Only runs with this label (repeatable: every one).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
    /// Only runs this principal started.
    #[arg(long, value_name = "PRINCIPAL")]
    started_by: Option<String>,
    /// Only calls for which this CEL expression is true (the variables of
    /// policy rules: tool, args, labels, task, started_by, now).
    #[arg(long, value_name = "CEL")]
    condition: Option<String>,
    /// Only calls with exactly these arguments: the arguments_sha256 of
    /// their approval request.
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    /// It expires this long from now: 90s, 30m, 8h, 7d.
    #[arg(long, value_name = "DURATION", value_parser = duration_ms, conflicts_with = "expires_at")]
    expires_in: Option<i64>,
    /// It expires at this time, RFC 3339.
    #[arg(long, value_name = "TIME", value_parser = rfc3339_ms)]
    expires_at: Option<i64>,
    /// How many calls it may grant (default: any number).
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_uses: u64,
    /// Why, for the audit trail.
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Idempotency key: a retry with the same id answers the grant the
    /// first call created instead of creating another.
    #[arg(long, value_name = "ID")]
    request_id: Option<String>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct LsArgs {
    /// Also revoked, expired and used-up grants.
    #[arg(long)]
    all: bool,
    /// Only this tool's.
    #[arg(long, value_name = "NAME")]
    tool: Option<String>,
    #[command(flatten)]
    format: Format,
}

#[derive(clap::Args)]
struct RevokeArgs {
    /// The grant's id.
    id: String,
    /// Why, for the audit trail.
    #[arg(long, value_name = "TEXT")]
    reason: String,
    #[command(flatten)]
    format: Format,
}

pub(super) async fn run(args: &GrantsArgs) -> Result<(), Error> {
    let client = args.connection.connect().await?;
    let mut grants = client.grants();
    match &args.command {
        GrantsCommand::Create(create) => {
            let expires_ms = match (create.expires_in, create.expires_at) {
                (Some(after), _) => Some(crate::clock::now_ms().saturating_add(after)),
                (None, at) => at,
            };
            let request = CreateGrantRequest {
                tool: create.tool.clone(),
                scope: Some(GrantScope {
                    run_id: create.run.clone().unwrap_or_default(),
                    labels: create.labels.iter().cloned().collect(),
                    started_by: create.started_by.clone().unwrap_or_default(),
                }),
                condition: create.condition.clone().unwrap_or_default(),
                arguments_sha256: create.sha256.clone().unwrap_or_default(),
                expires_at: expires_ms.and_then(crate::api::convert::timestamp),
                max_uses: create.max_uses,
                reason: create.reason.clone(),
                request_id: create.request_id.clone().unwrap_or_default(),
            };
            let grant = grants.create_grant(request).await?.into_inner().grant;
            let grant = grant.unwrap_or_default();
            let out = Output::new(create.format.json);
            match out.json {
                true => out.document(&grant_json(&grant)),
                false => out.line(&grant.id),
            }
        }
        GrantsCommand::Ls(ls) => {
            let listed = grants
                .list_grants(ListGrantsRequest {
                    include_revoked: ls.all,
                    tool: ls.tool.clone().unwrap_or_default(),
                })
                .await?
                .into_inner()
                .grants;
            let out = Output::new(ls.format.json);
            if out.json {
                let all: Vec<Value> = listed.iter().map(grant_json).collect();
                return out.document(&json!({ "grants": all }));
            }
            if listed.is_empty() {
                return out.line("no grants");
            }
            out.table(
                &[
                    "ID", "TOOL", "SCOPE", "USES", "EXPIRES", "STATE", "BY", "REASON",
                ],
                listed.iter().map(|g| {
                    vec![
                        g.id.clone(),
                        g.tool.clone(),
                        scope_text(g),
                        match g.uses_left {
                            Some(left) => format!("{}/{}", g.uses, g.uses + left),
                            None => g.uses.to_string(),
                        },
                        present::short_time(&g.expires_at),
                        state(g).to_string(),
                        g.created_by.clone(),
                        g.reason.clone(),
                    ]
                }),
            )
        }
        GrantsCommand::Revoke(revoke) => {
            let grant = grants
                .revoke_grant(RevokeGrantRequest {
                    id: revoke.id.clone(),
                    reason: revoke.reason.clone(),
                })
                .await?
                .into_inner()
                .grant
                .unwrap_or_default();
            let out = Output::new(revoke.format.json);
            match out.json {
                true => out.document(&grant_json(&grant)),
                false => out.line(&format!(
                    "revoked {} (uses: {}): {}",
                    grant.id, grant.uses, grant.revoke_reason
                )),
            }
        }
    }
}

fn state(grant: &Grant) -> &'static str {
    match () {
        _ if grant.active => "active",
        _ if grant.revoked_at.is_some() => "revoked",
        _ if grant.uses_left == Some(0) => "used up",
        _ => "expired",
    }
}

/// "run R, team=payroll, by P"; "any run" when unscoped.
fn scope_text(grant: &Grant) -> String {
    let Some(scope) = &grant.scope else {
        return "any run".into();
    };
    let mut parts = Vec::new();
    if !scope.run_id.is_empty() {
        parts.push(format!("run {}", scope.run_id));
    }
    if !scope.labels.is_empty() {
        parts.push(render::labels(&scope.labels));
    }
    if !scope.started_by.is_empty() {
        parts.push(format!("started by {}", scope.started_by));
    }
    match parts.is_empty() {
        true => "any run".into(),
        false => parts.join(", "),
    }
}

fn grant_json(grant: &Grant) -> Value {
    let scope = grant.scope.clone().unwrap_or_default();
    let time = |t: &Option<prost_types::Timestamp>| {
        t.map_or(Value::Null, |t| Value::String(t.to_string()))
    };
    json!({
        "id": grant.id,
        "tool": grant.tool,
        "scope": {
            "run_id": scope.run_id,
            "labels": scope.labels,
            "started_by": scope.started_by,
        },
        "condition": grant.condition,
        "arguments_sha256": grant.arguments_sha256,
        "expires_at": time(&grant.expires_at),
        "max_uses": grant.max_uses,
        "uses": grant.uses,
        "uses_left": grant.uses_left,
        "active": grant.active,
        "state": state(grant),
        "reason": grant.reason,
        "created_by": grant.created_by,
        "created_at": time(&grant.created_at),
        "creator_groups": grant.creator_groups,
        "revoked_at": time(&grant.revoked_at),
        "revoked_by": grant.revoked_by,
        "revoke_reason": grant.revoke_reason,
    })
}

/// "90s", "30m", "8h", "7d" in milliseconds.
fn duration_ms(text: &str) -> Result<i64, String> {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("'{text}' needs a unit: s, m, h or d"))?;
    let (number, unit) = text.split_at(unit_at);
    let number: i64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a number and a unit, like 8h"))?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("'{unit}' is not one of the units s, m, h, d")),
    };
    number
        .checked_mul(unit_ms)
        .filter(|ms| *ms > 0)
        .ok_or_else(|| format!("'{text}' is out of range"))
}

pub(super) fn rfc3339_ms(text: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("not an RFC 3339 time ({e})"))
}
