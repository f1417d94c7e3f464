//! Group commit: one thread takes every batch that is waiting, writes them
//! to the log as one record and fdatasyncs it (see [`super::log`]), applies
//! the index writes to sled and the spans to the recent ones (see
//! [`super::spans`]), and only then answers the writers and moves the
//! durable position. When the log has grown [`CHECKPOINT_BYTES`] since the
//! last checkpoint, it checkpoints (see [`super::committer`]); between
//! rounds it takes the compaction steps asked for (see [`super::compact`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use prost::Message as _;
use tokio::sync::mpsc;

use super::committer::Committer;
use super::record::{self, Round};
use super::{keys, retention, Result, RunId, StoreError, WriteBatch};
use crate::store::queue::{self, Message, Request};
use crate::store::Op;

/// Most batches folded into one round.
const MAX_ROUND: usize = 4096;
/// Log growth that triggers a checkpoint. It bounds the replay at startup.
const CHECKPOINT_BYTES: u64 = 16 * 1024 * 1024;
/// While the log cannot be written, how often the committer tries on its
/// own: from this, doubling, up to [`PROBE_MAX`].
const PROBE_FIRST: std::time::Duration = std::time::Duration::from_millis(50);
const PROBE_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// The committer's loop, on a thread of its own: it blocks on the disk, so
/// it stays off the async runtime, and needs no hand-off per round.
pub(super) fn run(mut committer: Committer, mut messages: mpsc::Receiver<Message>) {
    let mut round = Vec::new();
    let mut compactions = Vec::new();
    let mut closed = None;
    let mut backoff = PROBE_FIRST;
    while closed.is_none() {
        let message = if committer.probing() {
            // Writes are failing: look for the cause to be gone on our own,
            // so health says SERVING again even if no client writes (a load
            // balancer that follows health sends none).
            match messages.try_recv() {
                Ok(message) => Some(message),
                Err(mpsc::error::TryRecvError::Empty) => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(PROBE_MAX);
                    committer.probe();
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            }
        } else {
            backoff = PROBE_FIRST;
            messages.blocking_recv()
        };
        let Some(message) = message else { break };
        closed = queue::gather(
            message,
            &mut messages,
            &mut round,
            &mut compactions,
            MAX_ROUND,
        );
        if !round.is_empty() {
            committer.commit_round(&mut round);
        }
        for reply in compactions.drain(..) {
            let _ = reply.send(committer.compact());
        }
    }
    // Refuse what comes after: its senders get StoreError::Closed.
    messages.close();
    if committer.index_failed.is_some() {
        // sled cannot write; the log holds everything for the next start.
    } else if let Err(e) = committer.checkpoint() {
        tracing::error!("final checkpoint failed (the log keeps the writes): {e}");
    }
    // Release our handle on the database before saying we are done, so the
    // directory can be opened again as soon as the other handles are gone.
    drop(committer);
    if let Some(done) = closed {
        let _ = done.send(());
    }
}

/// Answers every request of the round: nothing of it was written.
fn refuse(round: &mut Vec<Request>, cause: &str) {
    for request in round.drain(..) {
        let _ = request
            .reply
            .send(Err(StoreError::Unavailable(cause.to_string())));
    }
}

impl Committer {
    /// Commits and answers every request of the round.
    ///
    /// A round the log could not take (disk full, an I/O error) is refused
    /// whole, its positions are given out again, and the next round tries
    /// again: once space is back, writes succeed with no restart. A round
    /// the log took is durable and acknowledged even if sled then fails; but
    /// sled keeps such an error for good, so every later round is refused
    /// until a restart rebuilds sled from the log.
    fn commit_round(&mut self, round: &mut Vec<Request>) {
        if let Some(cause) = &self.index_failed {
            let cause = format!("the index store failed ({cause}); restart the server");
            refuse(round, &cause);
            return;
        }
        if !self.has_reserve() {
            let cause = format!("the log cannot be written: {}", self.space.full());
            refuse(round, &cause);
            return;
        }
        let started = std::time::Instant::now();
        let first_position = self.next_position;
        let mut writes = Round::new(first_position);
        let mut answers = Vec::with_capacity(round.len());
        let mut heads = HashMap::new();
        let mut answered = HashSet::new();
        for request in round.iter_mut() {
            let staged = self
                .check_requests(&request.batch, &answered)
                .and_then(|keys| {
                    self.check_heads(&request.batch, &mut heads)?;
                    let (mark, position) = (writes.mark(), self.next_position);
                    let positions =
                        self.stage(&mut request.batch, &mut writes)
                            .inspect_err(|_| {
                                // Nothing of a refused batch goes to the log.
                                writes.rollback(mark);
                                self.next_position = position;
                            })?;
                    answered.extend(keys);
                    Ok(positions)
                });
            answers.push(staged);
        }
        let last_position = self.next_position - 1;
        if let Some(hold) = &self.hold {
            hold.wait();
        }
        let at = match self.log.append(&writes) {
            Ok(at) => at,
            Err(e) => {
                self.next_position = first_position;
                let cause = format!("the log cannot be written: {e}");
                if self.writable.send_replace(false) {
                    tracing::error!("{cause}; writes are refused until one succeeds");
                }
                refuse(round, &cause);
                return;
            }
        };
        if !self.writable.send_replace(true) {
            tracing::info!("the log takes writes again");
        }
        let families = self.metrics.families();
        families
            .store_commit_seconds
            .observe(started.elapsed().as_secs_f64());
        families
            .store_commit_batch_size
            .observe((self.next_position - first_position) as f64);
        families.store_fsyncs.inc();
        let indexed = (|| -> Result<()> {
            record::apply(&writes, at, &self.tree, &self.applied())?;
            if self.log.end() - self.checkpointed > CHECKPOINT_BYTES {
                self.checkpoint()?;
            }
            Ok(())
        })();
        if last_position >= first_position {
            self.durable_position
                .store(last_position, Ordering::Release);
            self.durable.send_replace(last_position);
        }
        for (request, answer) in round.drain(..).zip(answers) {
            let _ = request.reply.send(answer);
        }
        if let Err(e) = indexed {
            tracing::error!(
                "sled failed after the log took a round (which is durable): {e}; \
                 writes are refused until a restart"
            );
            self.writable.send_replace(false);
            self.index_failed = Some(e.to_string());
        }
    }

    /// Assigns positions to the batch's events and adds its writes to the
    /// round. On an error the caller takes back what it added.
    fn stage(&mut self, batch: &mut WriteBatch, out: &mut Round) -> Result<Vec<u64>> {
        let request_run = batch.request_run();
        let mut positions = Vec::with_capacity(batch.events.len());
        for event in &mut batch.events {
            event.position = self.next_position;
            self.next_position += 1;
            positions.push(event.position);
        }
        // Spans of one run with consecutive seqs (a batch is normally one).
        let mut rest = &batch.events[..];
        while let Some(first) = rest.first() {
            let len = 1 + rest
                .windows(2)
                .take_while(|w| w[1].run_id == w[0].run_id && w[1].seq == w[0].seq + 1)
                .count();
            let run = RunId::from_slice(&first.run_id).expect("event with a bad run id");
            out.events(run, &rest[..len]);
            rest = &rest[len..];
        }
        for op in batch.ops.drain(..) {
            match op {
                Op::PutRun(run) => {
                    let id = RunId::from_slice(&run.run_id).expect("run record with a bad id");
                    out.put(&keys::run_scoped(keys::RUN, id), &run.encode_to_vec());
                    if let Some(key) = retention::expiry_keys(id, &run) {
                        out.put(&key, &[]);
                    }
                }
                Op::PutApproval(mut approval) => {
                    let id = RunId::from_slice(&approval.run_id).expect("approval with a bad id");
                    approval.position = batch
                        .events
                        .iter()
                        .find(|e| e.seq == approval.seq && e.run_id == approval.run_id)
                        .map_or(approval.position, |e| e.position);
                    let key = keys::approval(id, &approval.call_id);
                    out.put(&key, &approval.encode_to_vec());
                }
                Op::DeleteApproval { run, call_id } => out.delete(&keys::approval(run, &call_id)),
                Op::SetActive { run, active: true } => {
                    out.put(&keys::run_scoped(keys::ACTIVE, run), &[])
                }
                Op::SetActive { run, active: false } => {
                    out.delete(&keys::run_scoped(keys::ACTIVE, run))
                }
                Op::PutTimer(t) => out.put(&keys::timer(t.due_ms, t.run, &t.name), &[]),
                Op::DeleteTimer(t) => out.delete(&keys::timer(t.due_ms, t.run, &t.name)),
                Op::PutTool { name, definition } => out.put(&keys::tool(&name), &definition),
                Op::PutRequest {
                    scope,
                    request_id,
                    answer,
                    run,
                } => {
                    let key = keys::request(&scope, &request_id);
                    if let Some(run) = run.or(request_run) {
                        out.put(&keys::run_request(run, &key), &[]);
                    }
                    out.put(&key, &answer)
                }
                Op::PutGroup(group) => out.put(&keys::group(&group.name), &group.encode_to_vec()),
                Op::PutDeadLetter { group, letter } => out.put(
                    &keys::dead_letter(&group, letter.position),
                    &letter.encode_to_vec(),
                ),
                Op::DeleteDeadLetter { group, position } => {
                    out.delete(&keys::dead_letter(&group, position))
                }
                Op::PutTokenKey(key) => out.put(&keys::meta("token-key"), &key),
                Op::PutGrant(grant) => out.put(&keys::grant(&grant.id), &grant.encode_to_vec()),
                Op::UseGrant(used) => {
                    out.put(&keys::grant_use(&used.grant, used.run, &used.call_id), &[])
                }
                Op::ExpireRun {
                    run,
                    expired_ms,
                    until_ms,
                } => self.stage_expire(run, expired_ms, until_ms, out)?,
            }
        }
        Ok(positions)
    }

    /// Refuses a batch that records an answer to a request answered
    /// already: in sled, or by an earlier batch of the round (`answered`).
    /// Returns the keys of the records it writes.
    fn check_requests(
        &self,
        batch: &WriteBatch,
        answered: &HashSet<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>> {
        let mut keys = Vec::new();
        for (scope, request_id) in batch.request_keys() {
            let key = keys::request(scope, request_id);
            if answered.contains(&key) || self.tree.contains_key(&key)? {
                return Err(StoreError::RequestRecorded {
                    request_id: request_id.to_string(),
                });
            }
            keys.push(key);
        }
        Ok(keys)
    }

    /// Refuses a batch whose runs moved past the seqs it expects (another
    /// writer appended first), before any of it is staged. `heads` holds the
    /// last seqs the round's earlier batches staged.
    fn check_heads(&self, batch: &WriteBatch, heads: &mut HashMap<RunId, u64>) -> Result<()> {
        let expected = batch.expected_seqs();
        for &(run, expected) in &expected {
            let actual = match heads.get(&run) {
                Some(&seq) => seq,
                None => {
                    super::newest_span(&self.tree, &self.recent, run)?.map_or(0, |s| s.last_seq)
                }
            };
            if actual != expected {
                return Err(StoreError::Conflict {
                    run,
                    expected,
                    actual,
                });
            }
        }
        for event in &batch.events {
            if let Some(run) = RunId::from_slice(&event.run_id) {
                heads.insert(run, event.seq);
            }
        }
        Ok(())
    }
}
