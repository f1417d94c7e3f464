//! The bench on PostgreSQL (`--store postgres://...`): a scratch schema of
//! that database for each server and store the bench starts (dropped at the
//! end), and the database's own commit floor, measured in the same run: one
//! one-row transaction at a time, and one-row transactions from 64
//! connections at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::stats::{closed_loop, Problems, Summary};
use aaa::store::postgres;

/// The database the bench was pointed at, and the scratch schemas it made
/// there.
pub struct Database {
    url: String,
    prefix: String,
    schemas: Mutex<Vec<String>>,
}

impl Database {
    pub fn new(url: &str, session: &str) -> Arc<Database> {
        Arc::new(Database {
            url: url.to_string(),
            prefix: format!("aaa_bench_{}", session.replace('-', "_")),
            schemas: Mutex::default(),
        })
    }

    /// The database's URL, as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A store URL of a new, empty schema, named after `tag`.
    pub fn scratch(&self, tag: &str) -> String {
        postgres::in_schema(&self.url, &self.scratch_schema(tag))
    }

    /// The name of a new scratch schema, dropped at the end.
    fn scratch_schema(&self, tag: &str) -> String {
        let schema = format!("{}_{tag}", self.prefix);
        self.schemas.lock().expect("poisoned").push(schema.clone());
        schema
    }

    /// The postmaster's process id, when the database runs on this
    /// machine and the bench may read its data directory (as PostgreSQL's
    /// superuser, like `.ci/postgres`'s): its CPU time, with its backends',
    /// is then the database's share of a measurement.
    pub async fn postmaster(&self) -> Option<u32> {
        let client = postgres::connect(&self.url).await.ok()?;
        let row = client.query_one("SHOW data_directory", &[]).await.ok()?;
        let dir: String = row.try_get(0).ok()?;
        // The first line of postmaster.pid is the postmaster's pid.
        let pid_file = std::fs::read_to_string(format!("{dir}/postmaster.pid")).ok()?;
        let pid: u32 = pid_file.lines().next()?.trim().parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        comm.trim().starts_with("postgres").then_some(pid)
    }

    /// Drops every scratch schema made.
    pub async fn clean_up(&self) -> anyhow::Result<()> {
        let schemas = std::mem::take(&mut *self.schemas.lock().expect("poisoned"));
        if schemas.is_empty() {
            return Ok(());
        }
        let client = postgres::connect(&self.url).await?;
        for schema in schemas {
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await
                .with_context(|| format!("dropping the scratch schema {schema}"))?;
        }
        Ok(())
    }
}

#[derive(Debug, Serialize)]
pub struct Floor {
    /// One-row transactions, one at a time: the least one commit costs.
    pub one_row_commit: Summary,
    pub writers: usize,
    /// One-row transactions per second from `writers` connections.
    pub rows_per_second: f64,
    pub problems: Problems,
}

/// Measures the commit floor in a scratch table of its own.
pub async fn floor(
    database: &Database,
    commits: usize,
    writers: usize,
    rows: usize,
    limit: Duration,
) -> anyhow::Result<Floor> {
    let schema = database.scratch_schema("floor");
    let url = postgres::in_schema(&database.url, &schema);
    let setup = postgres::connect(&url).await?;
    setup
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE {schema}.floor (id bigserial PRIMARY KEY, payload text NOT NULL)"
        ))
        .await
        .context("creating the floor table")?;
    let insert = format!("INSERT INTO {schema}.floor (payload) VALUES ($1)");

    let mut samples = Vec::with_capacity(commits);
    let deadline = Instant::now() + limit;
    for i in 0..commits {
        if Instant::now() > deadline {
            break;
        }
        let started = Instant::now();
        setup
            .execute(&insert, &[&format!("one {i}")])
            .await
            .context("a one-row commit")?;
        samples.push(started.elapsed());
    }

    let mut clients = Vec::with_capacity(writers);
    for _ in 0..writers {
        clients.push(Arc::new(postgres::connect(&url).await?));
    }
    let insert = Arc::new(insert);
    let outcome = closed_loop(writers, rows, limit, move |writer, round| {
        let (client, insert) = (clients[writer].clone(), insert.clone());
        async move {
            client
                .execute(insert.as_str(), &[&format!("{writer} {round}")])
                .await
                .map(|_| ())
                .map_err(|e| format!("insert: {e}"))
        }
    })
    .await;
    Ok(Floor {
        one_row_commit: Summary::of(&mut samples),
        writers,
        rows_per_second: outcome.per_second(),
        problems: outcome.problems,
    })
}
