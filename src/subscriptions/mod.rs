//! Consumer groups over the global log (DESIGN.md §3, SubscriptionService).
//!
//! Each group has one dispatcher task (see [`group`]) that reads the durable
//! global log after the group's cursor, hands each matching event to one
//! member at a time, and redelivers on nack, ack timeout or a member leaving,
//! until max deliveries move the event to the dead-letter list. The cursor it
//! commits never passes an event that is not acked or dead-lettered, so a
//! restart resumes delivery without skipping anything (at least once).
//!
//! This registry creates, loads and finds those tasks; it lives as long as
//! the server and starts a group's task on first use after a restart.

mod group;
mod webhook;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::engine;
use crate::metrics::{GroupLabel, Metrics};
use crate::store::{
    Cursor, DeadLetterRecord, EventRecord, GroupRecord, RunId, SharedStore, StoreError, WriteBatch,
};

pub use group::Outbound;
pub use webhook::{signature, WebhookConfig};

/// Ack timeout of a new group that does not set one.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30);
pub const MAX_ACK_TIMEOUT: Duration = Duration::from_secs(3600);
/// Deliveries of a new group's events before they are dead-lettered.
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
pub const MAX_MAX_DELIVERIES: u32 = 1000;
/// Unacked deliveries a member holds when it does not say.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 16;
/// The server's bound on a member's unacked deliveries.
pub const MAX_IN_FLIGHT: u32 = 1000;

/// Why a subscription request is refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("group '{0}' not found")]
    GroupNotFound(String),
    #[error("{field}: group '{group}' was created with {existing}; a group's definition is fixed when it is created, so use another group name to change it")]
    GroupMismatch {
        group: String,
        field: String,
        existing: String,
    },
    #[error("the member read none of its deliveries while they piled up; its stream is ended and its deliveries go to other members")]
    MemberTooSlow,
    #[error(transparent)]
    Engine(#[from] engine::Error),
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Engine(e.into())
    }
}

/// Checks an event type pattern: an exact type, a prefix ending in ".*",
/// or "*". The field names it in the error.
pub fn check_pattern(field: &str, pattern: &str) -> Result<(), engine::Error> {
    let stem = match pattern {
        "*" => return Ok(()),
        p => p.strip_suffix(".*").unwrap_or(p),
    };
    let bad = |why: &str| {
        engine::Error::invalid(
            field,
            format!("'{pattern}' {why}; use an exact type (\"aaa.approval.requested\"), a prefix ending in \".*\" (\"aaa.approval.*\") or \"*\""),
        )
    };
    if stem.is_empty() {
        return Err(bad("is empty"));
    }
    if stem.len() > 256 {
        return Err(bad("is longer than 256 bytes"));
    }
    if stem.contains('*') {
        return Err(bad("has '*' somewhere other than after the last '.'"));
    }
    if let Some(c) = stem
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:/".contains(*c)))
    {
        return Err(bad(&format!("contains '{c}'")));
    }
    Ok(())
}

/// Whether `event_type` matches a checked pattern.
fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

/// What a subscriber asks a group to be. `None` settings take the group's
/// values (or the defaults, for a new group).
pub struct Definition {
    pub group: String,
    /// Checked with [`check_pattern`].
    pub event_types: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub ack_timeout: Option<Duration>,
    pub max_deliveries: Option<u32>,
}

/// Where a new group's cursor starts.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    Beginning,
    Now,
    After(u64),
}

/// A member's place in its group. Dropping it leaves the group: its unacked
/// deliveries go to other members.
pub struct Membership {
    pub group: GroupRecord,
    pub created: bool,
    pub member_id: u64,
    /// The group's durable cursor when the member joined.
    pub cursor: u64,
    pub max_in_flight: u32,
    outbound: mpsc::Receiver<Outbound>,
    commands: mpsc::Sender<group::Command>,
}

impl Membership {
    /// The next delivery or ack result; an error when the group dropped the
    /// member (too slow) or stopped (shutdown).
    pub async fn next(&mut self) -> Result<Outbound, Error> {
        match self.outbound.recv().await {
            Some(out) => Ok(out),
            // The group closes its commands before it drops its members.
            None if self.commands.is_closed() => Err(engine::Error::ShuttingDown.into()),
            None => Err(Error::MemberTooSlow),
        }
    }

    /// Acks (`nack` None) or nacks a delivery; the answer comes as an
    /// [`Outbound::AckResult`].
    pub async fn answer(&self, delivery_id: String, nack: Option<String>) -> Result<(), Error> {
        let command = group::Command::Answer {
            member: self.member_id,
            delivery_id,
            nack,
        };
        self.commands
            .send(command)
            .await
            .map_err(|_| engine::Error::ShuttingDown.into())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        let commands = self.commands.clone();
        let member = self.member_id;
        tokio::spawn(async move {
            let _ = commands.send(group::Command::Leave { member }).await;
        });
    }
}

/// The registry of groups. Cheap to clone.
#[derive(Clone)]
pub struct Subscriptions {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    shutdown: CancellationToken,
    /// Running group tasks by name. A tokio mutex: creating a group awaits
    /// its durable record, and two creators of one name must not race.
    groups: Mutex<HashMap<String, GroupHandle>>,
    metrics: Metrics,
    /// Each running group's durable cursor, for its lag at a scrape.
    cursors: std::sync::Mutex<HashMap<String, Arc<std::sync::Mutex<Cursor>>>>,
    /// The groups' tasks and their cursor commits.
    tasks: tokio_util::task::TaskTracker,
}

#[derive(Clone)]
struct GroupHandle {
    /// The definition (its cursor is not kept up to date here).
    record: GroupRecord,
    commands: mpsc::Sender<group::Command>,
}

impl Subscriptions {
    /// Waits, once the shutdown token has fired, until every group task
    /// and cursor commit has ended: another registry may then take the
    /// groups over in this process without two tasks moving one cursor.
    pub async fn closed(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    pub fn new(store: SharedStore, shutdown: CancellationToken, metrics: Metrics) -> Self {
        let inner = Arc::new(Inner {
            store,
            shutdown,
            groups: Mutex::new(HashMap::new()),
            metrics: metrics.clone(),
            cursors: std::sync::Mutex::new(HashMap::new()),
            tasks: tokio_util::task::TaskTracker::new(),
        });
        metrics.refresh_from(Arc::downgrade(&inner), |inner, metrics| {
            let families = metrics.families();
            families.group_lag_events.clear();
            let head = inner.store.durable();
            for (name, cursor) in inner.cursors.lock().expect("poisoned").iter() {
                // Positions behind, summed over the shards (events, where
                // positions have no gaps).
                let lag = cursor.lock().expect("poisoned").behind(&head);
                let label = GroupLabel {
                    group: families.groups.label(name),
                };
                families
                    .group_lag_events
                    .get_or_create(&label)
                    .inc_by(lag as i64);
            }
            std::future::ready(())
        });
        Subscriptions { inner }
    }

    /// Joins the group, creating it (durably, at `start`) if it does not exist.
    pub async fn join(
        &self,
        mut definition: Definition,
        start: Start,
        max_in_flight: u32,
    ) -> Result<Membership, Error> {
        // A group's event types are a set: kept sorted, without repeats.
        definition.event_types.sort();
        definition.event_types.dedup();
        let mut groups = self.inner.groups.lock().await;
        let (handle, created) = match self.running(&mut groups, &definition.group).await? {
            Some(handle) => (handle, false),
            None => (self.create(&mut groups, &definition, start).await?, true),
        };
        drop(groups);
        if !created {
            check_definition(&handle.record, &definition)?;
        }
        let (outbound_tx, outbound) = mpsc::channel(group::outbound_capacity(max_in_flight));
        let (reply, joined) = oneshot::channel();
        let join = group::Command::Join {
            max_in_flight: max_in_flight as usize,
            outbound: outbound_tx,
            reply,
        };
        let shutting_down = || Error::Engine(engine::Error::ShuttingDown);
        handle
            .commands
            .send(join)
            .await
            .map_err(|_| shutting_down())?;
        let (member_id, cursor) = joined.await.map_err(|_| shutting_down())?;
        Ok(Membership {
            group: handle.record,
            created,
            member_id,
            cursor,
            max_in_flight,
            outbound,
            commands: handle.commands,
        })
    }

    /// A group's dead letters after `after` (a position), at most `limit`,
    /// with their events.
    pub async fn dead_letters(
        &self,
        group: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(DeadLetterRecord, EventRecord)>, Error> {
        // Let the group make what it has decided durable first, so a dead
        // letter is listed as soon as the nack or timeout that made it.
        self.ask(group, |reply| group::Command::Sync { reply })
            .await?;
        let store = &self.inner.store;
        let mut out = Vec::new();
        for letter in store.dead_letters(group, after, limit).await? {
            let Some(run) = RunId::from_slice(&letter.run_id) else {
                continue;
            };
            if let Some(event) = store.event(run, letter.seq).await? {
                out.push((letter, event));
            }
        }
        Ok(out)
    }

    /// Puts dead letters (all when `positions` is empty) back into delivery;
    /// answers once that is durable, with how many.
    pub async fn replay(&self, group: &str, positions: Vec<u64>) -> Result<u32, Error> {
        self.ask(group, |reply| group::Command::Replay { positions, reply })
            .await
    }

    /// Sends the group's task a command and waits for its answer.
    async fn ask(
        &self,
        group: &str,
        command: impl FnOnce(oneshot::Sender<Result<u32, Error>>) -> group::Command,
    ) -> Result<u32, Error> {
        let mut groups = self.inner.groups.lock().await;
        let handle = self
            .running(&mut groups, group)
            .await?
            .ok_or_else(|| Error::GroupNotFound(group.to_string()))?;
        drop(groups);
        let (reply, answer) = oneshot::channel();
        let shutting_down = || Error::Engine(engine::Error::ShuttingDown);
        handle
            .commands
            .send(command(reply))
            .await
            .map_err(|_| shutting_down())?;
        answer.await.map_err(|_| shutting_down())?
    }

    /// The group's task, started from its stored record if it is not running;
    /// `None` when the group does not exist.
    async fn running(
        &self,
        groups: &mut HashMap<String, GroupHandle>,
        name: &str,
    ) -> Result<Option<GroupHandle>, Error> {
        if let Some(handle) = groups.get(name).filter(|h| !h.commands.is_closed()) {
            return Ok(Some(handle.clone()));
        }
        let Some(record) = self.inner.store.group(name).await? else {
            return Ok(None);
        };
        Ok(Some(self.spawn(groups, record).await?))
    }

    async fn create(
        &self,
        groups: &mut HashMap<String, GroupHandle>,
        definition: &Definition,
        start: Start,
    ) -> Result<GroupHandle, Error> {
        let store = &self.inner.store;
        let head = store.durable();
        let cursor = match start {
            Start::Beginning => Cursor::start(),
            Start::Now => head,
            Start::After(position) if position > head.most() => {
                return Err(engine::Error::invalid(
                    "open.start_after_position",
                    format!(
                        "{position} is past the end of the log (position {})",
                        head.most()
                    ),
                )
                .into())
            }
            // A position from before the log was partitioned, or from an
            // event of a log with one committer: everything at or below it.
            Start::After(position) => Cursor::at(position),
        };
        let mut record = GroupRecord {
            name: definition.group.clone(),
            event_types: definition.event_types.clone(),
            labels: definition.labels.clone(),
            ack_timeout_ms: definition
                .ack_timeout
                .unwrap_or(DEFAULT_ACK_TIMEOUT)
                .as_millis() as u64,
            max_deliveries: definition.max_deliveries.unwrap_or(DEFAULT_MAX_DELIVERIES),
            created_ms: now_ms(),
            ..Default::default()
        };
        record.set_log_cursor(&cursor);
        let mut batch = WriteBatch::default();
        batch.put_group(&record);
        store.commit(batch).await?;
        self.spawn(groups, record).await
    }

    async fn spawn(
        &self,
        groups: &mut HashMap<String, GroupHandle>,
        record: GroupRecord,
    ) -> Result<GroupHandle, Error> {
        let families = self.inner.metrics.families();
        let label = GroupLabel {
            group: families.groups.label(&record.name),
        };
        let meters = group::Meters {
            cursor: Arc::new(std::sync::Mutex::new(record.log_cursor())),
            dead_letters: families.group_dead_letters.get_or_create(&label).clone(),
        };
        (self.inner.cursors.lock().expect("poisoned"))
            .insert(record.name.clone(), meters.cursor.clone());
        let (commands, task) = group::Group::load(
            self.inner.store.clone(),
            record.clone(),
            self.inner.shutdown.clone(),
            meters,
            self.inner.tasks.clone(),
        )
        .await?;
        self.inner.tasks.spawn(task);
        let handle = GroupHandle { record, commands };
        groups.insert(handle.record.name.clone(), handle.clone());
        Ok(handle)
    }
}

/// Refuses a subscriber whose definition differs from the group's.
fn check_definition(record: &GroupRecord, definition: &Definition) -> Result<(), Error> {
    let mismatch = |field: &str, existing: String| Error::GroupMismatch {
        group: record.name.clone(),
        field: field.to_string(),
        existing,
    };
    if definition.event_types != record.event_types {
        return Err(mismatch(
            "open.event_types",
            format!("event_types {:?}", record.event_types),
        ));
    }
    if definition.labels != record.labels {
        return Err(mismatch(
            "open.labels",
            format!("labels {:?}", record.labels),
        ));
    }
    if let Some(timeout) = definition.ack_timeout {
        if timeout.as_millis() as u64 != record.ack_timeout_ms {
            let existing = format!("ack_timeout_s {}", record.ack_timeout_ms as f64 / 1000.0);
            return Err(mismatch("open.ack_timeout_s", existing));
        }
    }
    if let Some(max) = definition.max_deliveries {
        if max != record.max_deliveries {
            let existing = format!("max_deliveries {}", record.max_deliveries);
            return Err(mismatch("open.max_deliveries", existing));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_exact_types_prefixes_or_everything() {
        for good in [
            "aaa.approval.requested",
            "aaa.approval.*",
            "app.*",
            "*",
            "x",
        ] {
            assert!(check_pattern("f", good).is_ok(), "{good}");
        }
        for bad in ["", ".*", "app*", "app.*.x", "a b", "**", "app.**"] {
            assert!(check_pattern("f", bad).is_err(), "{bad}");
        }
        assert!(pattern_matches("aaa.approval.*", "aaa.approval.requested"));
        assert!(!pattern_matches("aaa.approval.*", "aaa.approvals"));
        assert!(!pattern_matches("aaa.approval.*", "aaa.approval"));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("app.x", "app.x"));
        assert!(!pattern_matches("app.x", "app.xy"));
    }
}
