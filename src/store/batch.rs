//! A write: the events a batch appends and the typed index changes
//! ([`Op`]) that commit atomically with them, and what a backend asks of a
//! batch before it commits (the seqs it expects, the runs and shards it
//! touches, the idempotency records and grant uses it writes).

use super::{
    ApprovalRecord, DeadLetterRecord, EventRecord, GrantRecord, GrantUse, GroupRecord, RunId,
    RunRecord, Timer,
};

/// One typed change that commits with a batch's events.
#[derive(Debug, Clone)]
pub enum Op {
    PutRun(RunRecord),
    /// A pending approval. When the batch holds the run's event whose seq is
    /// the record's `seq`, the record's `position` is set to that event's at
    /// commit; otherwise it is kept as given (a copy, by `aaa migrate`).
    PutApproval(ApprovalRecord),
    DeleteApproval {
        run: RunId,
        call_id: String,
    },
    /// Marks a run as having work to recover at startup, or clears it.
    SetActive {
        run: RunId,
        active: bool,
    },
    PutTimer(Timer),
    DeleteTimer(Timer),
    PutTool {
        name: String,
        definition: Vec<u8>,
    },
    /// The answer to an idempotent request, written once (see
    /// [`StoreError::RequestRecorded`]) and kept for the life of its run.
    PutRequest {
        scope: Vec<u8>,
        request_id: String,
        answer: Vec<u8>,
        /// The run it is deleted with; `None`: the batch's one run, if it
        /// has one (see [`WriteBatch::request_run`]).
        run: Option<RunId>,
    },
    PutGroup(GroupRecord),
    PutDeadLetter {
        group: String,
        letter: DeadLetterRecord,
    },
    DeleteDeadLetter {
        group: String,
        position: u64,
    },
    /// Replaces the task-token key (`aaa migrate` copies it, so tokens
    /// handed out before a migration stay valid after it). A running
    /// server keeps the key it read at open until it restarts.
    PutTokenKey([u8; 32]),
    /// Creates a standing grant, or replaces it (a revocation).
    PutGrant(GrantRecord),
    /// Records one use of a grant; the same use twice is one.
    UseGrant(GrantUse),
    /// Deletes a finished run whole (retention): its events, summary,
    /// pending approvals, timers, active mark, idempotency records and
    /// index entries, atomically, and leaves a tombstone saying it
    /// expired at `expired_ms`, kept until `until_ms`. A run that is not
    /// finished (or not there) is left as it is. Grant uses are kept: a
    /// grant's uses are its count.
    ExpireRun {
        run: RunId,
        expired_ms: i64,
        until_ms: i64,
    },
}

/// One atomic write: events (of one run, normally; of several for a batch
/// decision) and the index changes they imply. Positions are assigned at
/// commit, in the batch's order.
#[derive(Debug, Default)]
pub struct WriteBatch {
    pub(crate) events: Vec<EventRecord>,
    pub(crate) ops: Vec<Op>,
}

impl WriteBatch {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.ops.is_empty()
    }

    /// Adds an event; its `position` is filled in at commit. A run's events
    /// in one batch have consecutive seqs.
    pub fn push_event(&mut self, event: EventRecord) {
        self.events.push(event);
    }

    pub fn events(&self) -> &[EventRecord] {
        &self.events
    }

    /// Moves the events out (a committed batch's, to keep them elsewhere).
    pub fn take_events(&mut self) -> Vec<EventRecord> {
        std::mem::take(&mut self.events)
    }

    /// Adds another batch's events and changes after this one's.
    pub fn extend(&mut self, other: WriteBatch) {
        self.events.extend(other.events);
        self.ops.extend(other.ops);
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The last seq each run appended to must have at commit: the seq
    /// before the batch's first event of that run.
    pub fn expected_seqs(&self) -> Vec<(RunId, u64)> {
        let mut out: Vec<(RunId, u64)> = Vec::new();
        for event in &self.events {
            let Some(run) = RunId::from_slice(&event.run_id) else {
                continue;
            };
            if !out.iter().any(|(r, _)| *r == run) {
                out.push((run, event.seq.saturating_sub(1)));
            }
        }
        out
    }

    /// Every run the batch touches: by its events or by its ops.
    pub fn runs(&self) -> Vec<RunId> {
        let by_events = self.events.iter().map(|e| e.run_id.as_slice());
        let by_ops = self.ops.iter().filter_map(|op| match op {
            Op::PutRun(run) => Some(run.run_id.as_slice()),
            Op::PutApproval(approval) => Some(approval.run_id.as_slice()),
            Op::DeleteApproval { run, .. } | Op::SetActive { run, .. } => {
                Some(run.as_bytes().as_slice())
            }
            Op::PutTimer(timer) | Op::DeleteTimer(timer) => Some(timer.run.as_bytes().as_slice()),
            Op::UseGrant(used) => Some(used.run.as_bytes().as_slice()),
            Op::ExpireRun { run, .. } => Some(run.as_bytes().as_slice()),
            _ => None,
        });
        let mut runs: Vec<RunId> = by_events
            .chain(by_ops)
            .filter_map(RunId::from_slice)
            .collect();
        runs.sort_unstable();
        runs.dedup();
        runs
    }

    /// The shards whose owner alone may commit the batch: its runs' and
    /// its consumer groups' (see [`crate::domain::group_shard`]). Tools,
    /// idempotency records and the token key belong to no shard.
    pub fn shards(&self) -> Vec<u8> {
        let groups = self.ops.iter().filter_map(|op| match op {
            Op::PutGroup(group) => Some(group.name.as_str()),
            Op::PutDeadLetter { group, .. } | Op::DeleteDeadLetter { group, .. } => {
                Some(group.as_str())
            }
            _ => None,
        });
        let mut shards: Vec<u8> = self
            .runs()
            .iter()
            .map(RunId::shard)
            .chain(groups.map(crate::domain::group_shard))
            .collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }

    pub fn put_run(&mut self, run: &RunRecord) {
        self.ops.push(Op::PutRun(run.clone()));
    }

    pub fn put_approval(&mut self, approval: &ApprovalRecord) {
        self.ops.push(Op::PutApproval(approval.clone()));
    }

    pub fn delete_approval(&mut self, run: RunId, call_id: &str) {
        self.ops.push(Op::DeleteApproval {
            run,
            call_id: call_id.to_string(),
        });
    }

    pub fn set_active(&mut self, run: RunId, active: bool) {
        self.ops.push(Op::SetActive { run, active });
    }

    pub fn put_timer(&mut self, due_ms: i64, run: RunId, name: &str) {
        self.ops.push(Op::PutTimer(Timer {
            due_ms,
            run,
            name: name.to_string(),
        }));
    }

    pub fn delete_timer(&mut self, due_ms: i64, run: RunId, name: &str) {
        self.ops.push(Op::DeleteTimer(Timer {
            due_ms,
            run,
            name: name.to_string(),
        }));
    }

    pub fn put_tool(&mut self, name: &str, definition: Vec<u8>) {
        self.ops.push(Op::PutTool {
            name: name.to_string(),
            definition,
        });
    }

    pub fn put_request(&mut self, scope: &[u8], request_id: &str, answer: Vec<u8>) {
        self.ops.push(Op::PutRequest {
            scope: scope.to_vec(),
            request_id: request_id.to_string(),
            answer,
            run: None,
        });
    }

    /// [`WriteBatch::put_request`] for a record deleted with `run`, in a
    /// batch that may append to other runs too (a batch decision).
    pub fn put_request_of(&mut self, run: RunId, scope: &[u8], request_id: &str, answer: Vec<u8>) {
        self.ops.push(Op::PutRequest {
            scope: scope.to_vec(),
            request_id: request_id.to_string(),
            answer,
            run: Some(run),
        });
    }

    /// The (scope, request_id) of each idempotency record the batch writes.
    pub fn request_keys(&self) -> impl Iterator<Item = (&[u8], &str)> {
        self.ops.iter().filter_map(|op| match op {
            Op::PutRequest {
                scope, request_id, ..
            } => Some((scope.as_slice(), request_id.as_str())),
            _ => None,
        })
    }

    pub fn put_group(&mut self, group: &GroupRecord) {
        self.ops.push(Op::PutGroup(group.clone()));
    }

    pub fn put_dead_letter(&mut self, group: &str, letter: &DeadLetterRecord) {
        self.ops.push(Op::PutDeadLetter {
            group: group.to_string(),
            letter: letter.clone(),
        });
    }

    pub fn put_token_key(&mut self, key: [u8; 32]) {
        self.ops.push(Op::PutTokenKey(key));
    }

    pub fn put_grant(&mut self, grant: &GrantRecord) {
        self.ops.push(Op::PutGrant(grant.clone()));
    }

    pub fn use_grant(&mut self, used: GrantUse) {
        self.ops.push(Op::UseGrant(used));
    }

    /// The grant uses the batch records.
    pub fn grant_uses(&self) -> Vec<GrantUse> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::UseGrant(used) => Some(used.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn expire_run(&mut self, run: RunId, expired_ms: i64, until_ms: i64) {
        self.ops.push(Op::ExpireRun {
            run,
            expired_ms,
            until_ms,
        });
    }

    /// The run an idempotency record of this batch belongs to: the one
    /// run whose events the batch appends (StartRun's first event,
    /// Signal's), deleted with it by retention. `None` for a batch of no
    /// events or of several runs (a record kept for the life of the store).
    pub fn request_run(&self) -> Option<RunId> {
        let first = self.events.first()?;
        if self.events.iter().any(|e| e.run_id != first.run_id) {
            return None;
        }
        RunId::from_slice(&first.run_id)
    }

    pub fn delete_dead_letter(&mut self, group: &str, position: u64) {
        self.ops.push(Op::DeleteDeadLetter {
            group: group.to_string(),
            position,
        });
    }
}
