//! Hearing other servers' commits: a dedicated connection LISTENs on the
//! channel every commit NOTIFYs with its schema, the new heads of the
//! shards it moved and the runs whose heads moved
//! ("SCHEMA:SHARD=HEAD,...;RUN=SEQ,..." or "SCHEMA:SHARD=HEAD,...;*" when
//! they did not fit), moves those shards' durable positions when one of
//! its own schema arrives, and passes the runs on (see
//! [`crate::store::Store::heads_moved`]). The same connection reads the
//! head rows every [`POLL_EVERY`] as well, which bounds the delay when a
//! notification is lost (a reconnect) or never comes (a
//! transaction-pooling pgbouncer, which does not pass LISTEN on). While the
//! database is unreachable it tries to connect again at that pace.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

use super::connect::CONNECT_TIMEOUT;
use super::errors::describe;
use super::{heads_of, Durable, HEADS, NOTIFY_CHANNEL};
use crate::store::{HeadsMoved, RunId};

/// How often the head rows are read even if no notification comes.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// Follows the head until `stop`.
pub(super) async fn run(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    durable: Arc<Durable>,
    stop: CancellationToken,
) {
    loop {
        let listened = tokio::select! {
            () = stop.cancelled() => return,
            listened = listen(&config, tls.clone(), &durable) => listened,
        };
        if let Err(cause) = listened {
            // Quietly: the committer reports an outage itself.
            tracing::debug!("listening for commits of other servers failed: {cause}");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

/// One connection's life: LISTEN, then notifications and polls until it
/// fails.
async fn listen(
    config: &tokio_postgres::Config,
    tls: MakeRustlsConnect,
    durable: &Durable,
) -> Result<(), String> {
    let (client, mut connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls))
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| describe(&e))?;
    let (heard, mut notifications) = mpsc::unbounded_channel();
    // The connection is driven here; notifications come out of it.
    let driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if heard.send(n.payload().to_string()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    let _abort = AbortOnDrop(driver);
    let listen = format!("LISTEN {NOTIFY_CHANNEL}");
    bounded(client.batch_execute(&listen)).await?;
    // Notifications are per database; ours carry our schema's name.
    let row = bounded(client.query_one("SELECT current_schema()", &[])).await?;
    let schema: Option<String> = row.try_get(0).map_err(|e| describe(&e))?;
    let schema = schema.unwrap_or_default();
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            payload = notifications.recv() => match payload {
                Some(payload) => {
                    let ours = payload
                        .rsplit_once(':')
                        .filter(|(from, _)| *from == schema)
                        .and_then(|(_, text)| parse(text));
                    if let Some((shards, moved)) = ours {
                        durable.advance(shards);
                        let _ = durable.heads_moved.send(moved);
                    }
                }
                None => return Err("the connection closed".into()),
            },
            _ = tick.tick() => {
                let rows = bounded(client.query(HEADS, &[])).await?;
                let heads = heads_of(&rows)?;
                // A notification missed (a reconnect): which runs moved is
                // not known.
                if durable.advance(heads.shards()) {
                    let _ = durable.heads_moved.send(HeadsMoved::Unknown);
                }
            }
        }
    }
}

/// A notification's "SHARD=HEAD,...;RUN=SEQ,..." (or "SHARD=HEAD,...;*"):
/// the shards' new heads and the runs that moved.
fn parse(text: &str) -> Option<(Vec<(u8, u64)>, HeadsMoved)> {
    let (shards, runs) = text.split_once(';')?;
    let mut head = Vec::new();
    for pair in shards.split(',').filter(|pair| !pair.is_empty()) {
        let (shard, position) = pair.split_once('=')?;
        head.push((shard.parse().ok()?, position.parse().ok()?));
    }
    if runs == "*" {
        return Some((head, HeadsMoved::Unknown));
    }
    let mut moved = Vec::new();
    for pair in runs.split(',').filter(|pair| !pair.is_empty()) {
        let parsed = pair
            .split_once('=')
            .and_then(|(run, seq)| Some((RunId::parse(run)?, seq.parse().ok()?)));
        match parsed {
            Some(run_head) => moved.push(run_head),
            None => return Some((head, HeadsMoved::Unknown)),
        }
    }
    Some((head, HeadsMoved::Runs(moved.into())))
}

/// A query, bounded in time.
async fn bounded<T>(
    query: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, String> {
    tokio::time::timeout(CONNECT_TIMEOUT, query)
        .await
        .map_err(|_| "the database did not answer in time".to_string())?
        .map_err(|e| describe(&e))
}

/// Stops the connection's driver when the listener lets go of it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_names_the_heads_and_the_runs_that_moved() {
        let run = RunId::parse("01a23a1a-205d-72d5-bdf8-595f9c171f82").unwrap();
        let (heads, moved) = parse(&format!("130=42,7=40;{run}=7")).unwrap();
        assert_eq!(heads, [(130, 42), (7, 40)]);
        assert!(matches!(moved, HeadsMoved::Runs(runs) if runs[..] == [(run, 7)]));
        assert!(matches!(parse("1=42;*"), Some((_, HeadsMoved::Unknown))));
        assert!(matches!(
            parse("1=42;nonsense"),
            Some((_, HeadsMoved::Unknown))
        ));
        // An older server's "HEAD;..." is not ours to read: the poll is.
        assert!(parse("42;*").is_none());
        assert!(parse("42").is_none());
        assert!(parse("300=1;*").is_none());
    }
}
