//! `aaa cluster status`: the servers of the deployment, who owns the runs,
//! and how fresh each lease is.

use serde_json::json;

use super::render::Output;
use super::{Connection, Error, Format, EXIT_CODES};
use crate::proto::{ClusterMember, GetClusterRequest, GetClusterResponse};

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Show the members: which one owns the runs, which stand by, which
    /// are gone, with shard counts, epochs and lease times.
    ///
    /// Example: aaa cluster status --server 127.0.0.1:50052
    #[command(after_help = EXIT_CODES)]
    Status(StatusArgs),
}

#[derive(clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    format: Format,
}

pub(super) async fn run(args: &ClusterArgs) -> Result<(), Error> {
    let ClusterCommand::Status(status) = &args.command;
    let client = args.connection.connect().await?;
    let cluster = client
        .cluster()
        .get_cluster(GetClusterRequest {})
        .await?
        .into_inner();
    let out = Output::new(status.format.json);
    if out.json {
        let members: Vec<_> = cluster.members.iter().map(member_json).collect();
        return out.document(&json!({
            "this_server": cluster.this_server,
            "store": cluster.store,
            "shards": cluster.shards,
            "unowned_shards": cluster.unowned_shards,
            "members": members,
        }));
    }
    out.line(&format!(
        "store {}{}, {} shards, {} without a live owner; answered by {}",
        cluster.store,
        way(&cluster),
        cluster.shards,
        cluster.unowned_shards,
        cluster.this_server
    ))?;
    let rows = cluster.members.iter().map(|member| {
        vec![
            member.server.clone(),
            member.address.clone(),
            role(member).to_string(),
            member.shards.to_string(),
            match member.shards {
                0 => "-".to_string(),
                _ => member.epoch.to_string(),
            },
            match member.shards {
                0 => "-".to_string(),
                _ => seconds(member.lease_left_ms),
            },
            match member.alive {
                true => seconds(member.up_ms),
                false => format!("gone {}", seconds(member.gone_for_ms)),
            },
        ]
    });
    out.table(
        &[
            "SERVER",
            "ADDRESS",
            "ROLE",
            "SHARDS",
            "EPOCH",
            "LEASE LEFT",
            "UP",
        ],
        rows,
    )
}

/// How the servers of a database share the shards: spread (the default)
/// or one owner's cluster; nothing for the embedded store.
fn way(cluster: &GetClusterResponse) -> &'static str {
    let spreads = cluster.members.iter().any(|m| m.alive && m.spreads);
    match (cluster.store.as_str(), spreads) {
        ("embedded", _) => "",
        (_, true) => " (shards spread)",
        (_, false) => " (one owner)",
    }
}

/// What a member does now.
fn role(member: &ClusterMember) -> &'static str {
    match (member.alive, member.shards) {
        (false, _) => "gone",
        (true, 0) => "standby",
        (true, _) => "owner",
    }
}

fn member_json(member: &ClusterMember) -> serde_json::Value {
    json!({
        "server": member.server,
        "address": member.address,
        "role": role(member),
        "alive": member.alive,
        "shards": member.shards,
        "epoch": member.epoch,
        "lease_left_ms": member.lease_left_ms,
        "gone_for_ms": member.gone_for_ms,
        "up_ms": member.up_ms,
        "spreads": member.spreads,
    })
}

/// Milliseconds as seconds with one decimal.
fn seconds(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_says_how_a_database_shares_its_shards() {
        let member = |alive, spreads| ClusterMember {
            alive,
            spreads,
            ..Default::default()
        };
        let cluster = |store: &str, members| GetClusterResponse {
            store: store.into(),
            members,
            ..Default::default()
        };
        let spread = cluster("postgres", vec![member(true, true), member(true, true)]);
        assert_eq!(way(&spread), " (shards spread)");
        let one = cluster("postgres", vec![member(true, false), member(false, true)]);
        assert_eq!(way(&one), " (one owner)", "a gone member does not count");
        assert_eq!(way(&cluster("embedded", vec![member(true, false)])), "");
    }
}
