//! One group's dispatcher: a task that owns the group's state and is fed by
//! commands (join, leave, ack, nack, replay, commit done), by the durable
//! position moving, and by its earliest ack deadline.
//!
//! State: `entries` holds every matching event read from the log and not yet
//! acked or dead-lettered (queued or leased to a member), plus replayed dead
//! letters. The cursor is the position just below the first such log entry
//! (or the last position read, when there is none); it and the dead-letter
//! changes are committed together, one commit at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{pattern_matches, Error};
use crate::clock::now_ms;
use crate::store::{
    Cursor, DeadLetterRecord, EventRecord, GroupRecord, RunId, SharedStore, WriteBatch,
};

/// Matching events a group keeps in memory; reading the log waits below it.
const MAX_BUFFERED: usize = 1024;
const LOG_CHUNK: usize = 512;
/// Commands handled per turn before deliveries and commits are looked at.
const COMMANDS_PER_TURN: usize = 256;
/// How long a cursor that moved waits before it is committed on its own
/// (dead letters and replays are committed at once). Without it, every
/// append would cost each group a commit round of its own; a cursor that
/// lags only means more redeliveries after a crash.
const CURSOR_INTERVAL: Duration = Duration::from_millis(100);

/// What the group sends a member.
#[derive(Debug)]
pub enum Outbound {
    Delivery {
        delivery_id: String,
        event: EventRecord,
        attempt: u32,
        ack_deadline_ms: i64,
        replayed: bool,
    },
    AckResult {
        delivery_id: String,
        stale: bool,
        reason: String,
    },
}

/// Room for every delivery a member may hold, the ones that timed out while
/// it was not reading, and its ack results. A member that fills it is not
/// reading its stream, and is dropped.
pub fn outbound_capacity(max_in_flight: u32) -> usize {
    max_in_flight as usize * 2 + 64
}

pub enum Command {
    Join {
        max_in_flight: usize,
        outbound: mpsc::Sender<Outbound>,
        /// (member id, durable cursor)
        reply: oneshot::Sender<(u64, u64)>,
    },
    Leave {
        member: u64,
    },
    /// An ack (`nack` None) or a nack with its reason.
    Answer {
        member: u64,
        delivery_id: String,
        nack: Option<String>,
    },
    Replay {
        positions: Vec<u64>,
        reply: oneshot::Sender<Result<u32, Error>>,
    },
    /// Answered once everything decided so far (dead letters included) is durable.
    Sync {
        reply: oneshot::Sender<Result<u32, Error>>,
    },
    /// The commit in flight finished.
    Committed {
        ok: bool,
    },
}

struct Member {
    outbound: mpsc::Sender<Outbound>,
    max_in_flight: usize,
    in_flight: usize,
    /// The serial of its latest delivery: among equally loaded members
    /// the one served longest ago goes first, so a trickle of events that
    /// are acked at once still spreads over every member.
    last_served: u64,
}

/// An event the group has not finished with, as read from the log.
struct Entry {
    event: EventRecord,
    /// Deliveries made so far (since this server started, or the replay).
    attempts: u32,
    /// A dead letter put back by a replay: below the cursor.
    replay: bool,
    lease: Option<Lease>,
}

struct Lease {
    member: u64,
    /// Numbers the group's deliveries; the delivery id carries it, so an
    /// answer to any earlier delivery of the same event is told apart.
    serial: u64,
    deadline: Instant,
}

/// What a group shows the metrics: its durable cursor (its lag is read
/// from it at a scrape) and its dead letters.
pub struct Meters {
    pub cursor: Arc<std::sync::Mutex<Cursor>>,
    pub dead_letters: Counter,
}

pub struct Group {
    store: SharedStore,
    /// Where its cursor commits run, so that closing the registry waits
    /// for them (see `Subscriptions::closed`).
    tasks: tokio_util::task::TaskTracker,
    meters: Meters,
    /// The definition, and the cursor of the latest commit.
    record: GroupRecord,
    ack_timeout: Duration,
    commands: mpsc::Sender<Command>,
    members: BTreeMap<u64, Member>,
    next_member: u64,
    next_serial: u64,
    entries: BTreeMap<u64, Entry>,
    /// Entries waiting for a member, lowest position first.
    ready: BTreeSet<u64>,
    /// Where the reading of the log has got to.
    read_to: Cursor,
    /// Dead-letter changes for the next commit.
    batch: WriteBatch,
    /// Replays answered by the next commit, with their counts.
    replies: Vec<(oneshot::Sender<Result<u32, Error>>, u32)>,
    /// The cursor of the commit in flight.
    committing: Option<Cursor>,
    /// The cursor last made durable.
    committed: Cursor,
    /// When the moved cursor is to be committed, if it moved.
    cursor_due: Option<Instant>,
}

impl Group {
    /// Loads the group's replays in progress; returns its command sender
    /// and the task to spawn.
    pub async fn load(
        store: SharedStore,
        record: GroupRecord,
        shutdown: CancellationToken,
        meters: Meters,
        tasks: tokio_util::task::TaskTracker,
    ) -> Result<(mpsc::Sender<Command>, impl Future<Output = ()>), Error> {
        let (commands, receiver) = mpsc::channel(1024);
        let mut group = Group {
            tasks,
            meters,
            ack_timeout: Duration::from_millis(record.ack_timeout_ms),
            read_to: record.log_cursor(),
            committed: record.log_cursor(),
            store,
            record,
            commands: commands.clone(),
            members: BTreeMap::new(),
            next_member: 1,
            next_serial: 1,
            entries: BTreeMap::new(),
            ready: BTreeSet::new(),
            batch: WriteBatch::default(),
            replies: Vec::new(),
            committing: None,
            cursor_due: None,
        };
        let mut after = 0;
        loop {
            let letters = group
                .store
                .dead_letters(&group.record.name, after, 1000)
                .await?;
            let Some(last) = letters.last() else { break };
            after = last.position;
            for letter in letters.into_iter().filter(|l| l.replaying) {
                group.enqueue_replay(&letter).await?;
            }
        }
        Ok((commands, group.run(receiver, shutdown)))
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>, shutdown: CancellationToken) {
        let name = self.record.name.clone();
        let mut durable = self.store.watch_durable();
        loop {
            durable.borrow_and_update();
            if let Err(e) = self.fill().await {
                tracing::error!("group {name}: reading the log failed: {e}");
                break;
            }
            self.expire(Instant::now());
            self.dispatch();
            self.commit();
            let deadline = self.next_deadline();
            let room = self.entries.len() < MAX_BUFFERED;
            let command = tokio::select! {
                command = commands.recv() => command,
                changed = durable.changed(), if room => match changed {
                    Ok(()) => continue,
                    Err(_) => break,
                },
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => continue,
                _ = shutdown.cancelled() => {
                    // Save what is acked, so a restart redelivers less.
                    self.cursor_due = Some(Instant::now());
                    self.commit();
                    break;
                }
            };
            let Some(command) = command else { break };
            let mut stop = !self.handle(command).await;
            for _ in 1..COMMANDS_PER_TURN {
                match commands.try_recv() {
                    Ok(command) if !stop => stop = !self.handle(command).await,
                    _ => break,
                }
            }
            if stop {
                break;
            }
        }
        // Refuse commands first, then end the members' streams: a member
        // that sees its stream end can tell a stopped group by that.
        drop(commands);
        drop(self);
    }

    /// Handles a command; false when the group must stop (its store failed).
    async fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Join {
                max_in_flight,
                outbound,
                reply,
            } => {
                let id = self.next_member;
                self.next_member += 1;
                let member = Member {
                    outbound,
                    max_in_flight,
                    in_flight: 0,
                    last_served: 0,
                };
                self.members.insert(id, member);
                let _ = reply.send((id, self.committed.least()));
            }
            Command::Leave { member } => self.remove_member(member, "member left"),
            Command::Answer {
                member,
                delivery_id,
                nack,
            } => self.answer(member, delivery_id, nack),
            Command::Replay { positions, reply } => match self.replay(&positions).await {
                Ok(count) => self.replies.push((reply, count)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            // Nothing decided waits for a commit: it is durable already.
            Command::Sync { reply } if self.batch.is_empty() && self.committing.is_none() => {
                let _ = reply.send(Ok(0));
            }
            Command::Sync { reply } => self.replies.push((reply, 0)),
            Command::Committed { ok } => {
                let cursor = self.committing.take().expect("a commit in flight");
                if !ok {
                    return false;
                }
                *self.meters.cursor.lock().expect("poisoned") = cursor.clone();
                self.committed = cursor;
            }
        }
        true
    }

    /// Reads matching events from the durable log into `entries`.
    async fn fill(&mut self) -> Result<(), Error> {
        while self.entries.len() < MAX_BUFFERED {
            let chunk = self.store.log_after(&self.read_to, LOG_CHUNK).await?;
            let full = chunk.len() == LOG_CHUNK;
            for event in chunk {
                let position = event.position;
                self.store.read_past(&mut self.read_to, &event);
                let Some(run) = RunId::from_slice(&event.run_id) else {
                    continue;
                };
                if !self.wants(run, &event.event_type).await? {
                    continue;
                }
                let entry = Entry {
                    event,
                    attempts: 0,
                    replay: false,
                    lease: None,
                };
                self.entries.insert(position, entry);
                self.ready.insert(position);
            }
            if !full {
                break;
            }
        }
        Ok(())
    }

    async fn wants(&self, run: RunId, event_type: &str) -> Result<bool, Error> {
        let record = &self.record;
        if !record
            .event_types
            .iter()
            .any(|pattern| pattern_matches(pattern, event_type))
        {
            return Ok(false);
        }
        if record.labels.is_empty() {
            return Ok(true);
        }
        let labels = self
            .store
            .run(run)
            .await?
            .map(|r| r.labels)
            .unwrap_or_default();
        Ok(record.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }

    /// Takes back deliveries whose ack deadline has passed.
    fn expire(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.lease.as_ref().is_some_and(|l| l.deadline <= now))
            .map(|(p, _)| *p)
            .collect();
        for position in expired {
            self.release(position);
            self.retry(position, "ack timeout");
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.lease.as_ref().map(|l| l.deadline))
            .chain(self.cursor_due)
            .min()
    }

    /// Hands ready entries to the members with the most room, taking
    /// turns among those with equal room.
    fn dispatch(&mut self) {
        while let Some(&position) = self.ready.first() {
            let Some((&member_id, _)) = self
                .members
                .iter()
                .filter(|(_, m)| m.in_flight < m.max_in_flight)
                .min_by_key(|(_, m)| (m.in_flight, m.last_served))
            else {
                return;
            };
            self.ready.pop_first();
            let entry = self.entries.get_mut(&position).expect("ready entry");
            let event = entry.event.clone();
            entry.attempts += 1;
            let attempt = entry.attempts;
            let serial = self.next_serial;
            let delivery = Outbound::Delivery {
                delivery_id: format!("{position}-{serial}"),
                event,
                attempt,
                ack_deadline_ms: now_ms() + self.ack_timeout.as_millis() as i64,
                replayed: entry.replay,
            };
            let member = self.members.get_mut(&member_id).expect("member");
            if member.outbound.try_send(delivery).is_err() {
                // Not reading its stream (or gone): this attempt never reached it.
                entry.attempts -= 1;
                self.ready.insert(position);
                self.remove_member(member_id, "member too slow");
                continue;
            }
            member.in_flight += 1;
            member.last_served = serial;
            self.next_serial += 1;
            entry.lease = Some(Lease {
                member: member_id,
                serial,
                deadline: Instant::now() + self.ack_timeout,
            });
        }
    }

    fn answer(&mut self, member: u64, delivery_id: String, nack: Option<String>) {
        let stale = match self.current(member, &delivery_id) {
            Err(reason) => Some(reason),
            Ok(position) => {
                self.release(position);
                match nack {
                    Some(reason) => {
                        let reason = if reason.is_empty() {
                            "nacked".into()
                        } else {
                            reason
                        };
                        self.retry(position, &reason);
                    }
                    None => {
                        let entry = self.entries.remove(&position).expect("leased entry");
                        self.ready.remove(&position);
                        if entry.replay {
                            self.batch.delete_dead_letter(&self.record.name, position);
                        }
                    }
                }
                None
            }
        };
        let result = Outbound::AckResult {
            delivery_id,
            stale: stale.is_some(),
            reason: stale.unwrap_or_default(),
        };
        if let Some(m) = self.members.get(&member) {
            if m.outbound.try_send(result).is_err() {
                self.remove_member(member, "member too slow");
            }
        }
    }

    /// The position of a delivery that is the member's current lease, or
    /// why an answer to it is stale.
    fn current(&self, member: u64, delivery_id: &str) -> Result<u64, String> {
        let parsed = delivery_id
            .split_once('-')
            .and_then(|(p, s)| Some((p.parse::<u64>().ok()?, s.parse::<u64>().ok()?)));
        let Some((position, serial)) = parsed.filter(|(_, s)| *s < self.next_serial) else {
            return Err("not a delivery id of this group".into());
        };
        let Some(entry) = self.entries.get(&position) else {
            return Err("the event was already acked or dead-lettered".into());
        };
        match &entry.lease {
            Some(l) if l.serial == serial && l.member == member => Ok(position),
            _ => Err(format!(
                "superseded: that delivery timed out, was answered or went to another member; the event is at attempt {}",
                entry.attempts
            )),
        }
    }

    /// Ends an entry's lease, freeing its member's slot.
    fn release(&mut self, position: u64) {
        let Some(lease) = self.entries.get_mut(&position).and_then(|e| e.lease.take()) else {
            return;
        };
        if let Some(member) = self.members.get_mut(&lease.member) {
            member.in_flight -= 1;
        }
    }

    /// Queues an unfinished entry again, or dead-letters it after max deliveries.
    fn retry(&mut self, position: u64, reason: &str) {
        let Some(entry) = self.entries.get(&position) else {
            return;
        };
        if entry.attempts < self.record.max_deliveries {
            self.ready.insert(position);
            return;
        }
        let entry = self.entries.remove(&position).expect("entry");
        self.ready.remove(&position);
        let letter = DeadLetterRecord {
            run_id: entry.event.run_id,
            seq: entry.event.seq,
            position,
            deliveries: entry.attempts,
            last_error: reason.to_string(),
            dead_ms: now_ms(),
            replaying: false,
        };
        self.batch.put_dead_letter(&self.record.name, &letter);
        self.meters.dead_letters.inc();
    }

    fn remove_member(&mut self, member: u64, reason: &str) {
        if self.members.remove(&member).is_none() {
            return;
        }
        let leased: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.lease.as_ref().is_some_and(|l| l.member == member))
            .map(|(p, _)| *p)
            .collect();
        for position in leased {
            self.entries.get_mut(&position).expect("entry").lease = None;
            self.retry(position, reason);
        }
    }

    /// Marks dead letters as replaying and queues them; returns how many.
    async fn replay(&mut self, positions: &[u64]) -> Result<u32, Error> {
        let wanted: BTreeSet<u64> = positions.iter().copied().collect();
        let mut count = 0;
        let mut after = 0;
        loop {
            let letters = self
                .store
                .dead_letters(&self.record.name, after, 1000)
                .await?;
            let Some(last) = letters.last() else { break };
            after = last.position;
            for mut letter in letters {
                if (!wanted.is_empty() && !wanted.contains(&letter.position))
                    || self.entries.contains_key(&letter.position)
                {
                    continue;
                }
                letter.replaying = true;
                self.batch.put_dead_letter(&self.record.name, &letter);
                self.enqueue_replay(&letter).await?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Queues a replayed dead letter again, with its event read back from
    /// the log (it is below the read cursor).
    async fn enqueue_replay(&mut self, letter: &DeadLetterRecord) -> Result<(), Error> {
        let Some(run) = RunId::from_slice(&letter.run_id) else {
            return Ok(());
        };
        let Some(event) = self.store.event(run, letter.seq).await? else {
            tracing::error!(
                "group {}: no event at position {}",
                self.record.name,
                letter.position
            );
            return Ok(());
        };
        let entry = Entry {
            event,
            attempts: 0,
            replay: true,
            lease: None,
        };
        self.entries.insert(letter.position, entry);
        self.ready.insert(letter.position);
        Ok(())
    }

    /// In each shard, below the first unfinished log entry there (replays
    /// are below it already), or where the reading has got to.
    fn cursor(&self) -> Cursor {
        let mut cursor = self.read_to.clone();
        for (position, entry) in self.entries.iter().filter(|(_, e)| !e.replay) {
            if let Some(run) = RunId::from_slice(&entry.event.run_id) {
                cursor.lower(run.shard(), position - 1);
            }
        }
        cursor
    }

    /// Starts committing the cursor and dead-letter changes, unless a commit
    /// is in flight, there is nothing new, or only the cursor moved and its
    /// interval has not passed. Commits run one at a time, so they land in
    /// order.
    fn commit(&mut self) {
        if self.committing.is_some() {
            return;
        }
        let cursor = self.cursor();
        if self.batch.is_empty() && self.replies.is_empty() {
            if cursor == self.committed {
                self.cursor_due = None;
                return;
            }
            let due = *self
                .cursor_due
                .get_or_insert_with(|| Instant::now() + CURSOR_INTERVAL);
            if Instant::now() < due {
                return;
            }
        }
        self.cursor_due = None;
        self.record.set_log_cursor(&cursor);
        self.committing = Some(cursor);
        let mut batch = std::mem::take(&mut self.batch);
        batch.put_group(&self.record);
        let replies = std::mem::take(&mut self.replies);
        let store = self.store.clone();
        let commands = self.commands.clone();
        self.tasks.spawn(async move {
            let result = store.commit(batch).await;
            if let Err(e) = &result {
                tracing::error!("group cursor commit failed: {e}");
            }
            for (reply, count) in replies {
                let answer = match &result {
                    Ok(_) => Ok(count),
                    Err(_) => Err(Error::Engine(crate::engine::Error::ShuttingDown)),
                };
                let _ = reply.send(answer);
            }
            let ok = result.is_ok();
            let _ = commands.send(Command::Committed { ok }).await;
        });
    }
}
