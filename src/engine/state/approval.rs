//! Approval requests: raised (with timeouts, reminders, escalation),
//! voted, edited, granted, denied or expired, and the review of a new call
//! against the policy and standing grants.

use super::*;
use crate::engine::guard::{count_vote, editor_vote_counts, Pending, Reviewer, Rules, Tally};

impl RunState {
    pub(super) fn approval_requested(
        &mut self,
        e: ApprovalRequested,
        event: &EventRecord,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let now = event.time_ms;
        let (run, started_by) = (self.id, self.started_by.clone());
        let call = self.call_mut(&e.call_id)?;
        call.approval_seq = event.seq;
        call.approval_position = event.position;
        // What the request needs is the event's (a policy rule may
        // have set it); a call the tool does not gate waits too.
        call.phase = Phase::AwaitingApproval;
        call.approvals_required = e.approvals_required.max(1);
        call.approvers = e.approvers.clone();
        let timeout = e
            .approval_timeout_s
            .unwrap_or_else(|| call.spec.as_ref().map_or(0.0, |s| s.approval_timeout_s));
        if timeout > 0.0 {
            let due_ms = seconds::after_ms(now, timeout);
            call.approval_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{APPROVAL_TIMER}{}", e.call_id),
            });
        }
        let nudging = &e.nudging;
        call.nudges = Nudges {
            remind_after_s: nudging.remind_after_s,
            reminders: nudging.reminders,
            escalate_after_s: nudging.escalate_after_s,
            escalate_to: nudging.escalate_to.clone(),
            ..Nudges::default()
        };
        if nudging.remind_after_s > 0.0 && nudging.reminders > 0 {
            let due_ms = seconds::after_ms(now, nudging.remind_after_s);
            call.nudges.remind_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{REMIND_TIMER}{}", e.call_id),
            });
        }
        if nudging.escalate_after_s > 0.0 {
            let due_ms = seconds::after_ms(now, nudging.escalate_after_s);
            call.nudges.escalate_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{ESCALATE_TIMER}{}", e.call_id),
            });
        }
        actions.push(Action::ApprovalPending {
            call_id: e.call_id.clone(),
        });
        // An edit granted in the same step: the editor's vote for
        // the arguments they wrote, if the call's groups allow it.
        if let Some(grant) = call.editor_grant.take() {
            let pending = pending(run, &started_by, call);
            if editor_vote_counts(grant.groups.as_deref(), &pending) {
                let tally = count_vote(
                    &pending,
                    call.votes.iter().map(|v| v.approver.as_str()),
                    &grant.approver,
                )?;
                let digest = e.arguments_sha256.clone();
                let vote = vote_event(call, tally, grant.approver, Some(digest), None);
                actions.push(Action::Emit(vote.by(grant.actor)));
            }
        }
        Ok(())
    }

    pub(super) fn approval_reminded(
        &mut self,
        e: ApprovalReminded,
        event: &EventRecord,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let now = event.time_ms;
        let call = self.call_mut(&e.call_id)?;
        let nudges = &mut call.nudges;
        nudges.reminded = e.reminder;
        // The timer that fired was deleted with this event; the
        // next reminder, if any, is armed.
        nudges.remind_timer_ms = None;
        if nudges.reminded < nudges.reminders {
            let due_ms = seconds::after_ms(now, nudges.remind_after_s);
            nudges.remind_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{REMIND_TIMER}{}", e.call_id),
            });
        }
        Ok(())
    }

    pub(super) fn approval_escalated(
        &mut self,
        e: ApprovalEscalated,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.nudges.escalate_timer_ms = None;
        call.approvers = e.approvers;
        // The index row shows who may decide now.
        actions.push(Action::ApprovalPending { call_id: e.call_id });
        Ok(())
    }

    pub(super) fn approval_voted(
        &mut self,
        e: ApprovalVoted,
        now: i64,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.votes.push(Vote {
            approver: e.approver,
            time_ms: now,
            comment: e.comment.unwrap_or_default(),
        });
        // The index row shows the votes so far.
        actions.push(Action::ApprovalPending { call_id: e.call_id });
        Ok(())
    }

    pub(super) fn approval_edited(
        &mut self,
        e: ApprovalEdited,
        event: &EventRecord,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let editor = self.actor_of(event);
        let call = self.call_mut(&e.call_id)?;
        call.decision = Some(Decision::Edited);
        call.phase = Phase::Done;
        call.cancel_wait_timers(actions);
        actions.push(Action::ApprovalResolved {
            call_id: e.call_id.clone(),
        });
        let note = edit_note(&e.new_arguments, &e.reason);
        self.pending_edit = Some(PendingEdit {
            new_call_id: e.new_call_id.clone(),
            answers: call.answers.clone(),
            note,
            grant: e.grant.then(|| EditorGrant {
                actor: editor,
                approver: e.approver.clone(),
                groups: e.approver_groups.clone(),
            }),
        });
        actions.push(Action::Emit(NewEvent::engine(
            TOOL_REQUESTED,
            ToolRequested {
                call_id: e.new_call_id,
                name: e.name,
                arguments: e.new_arguments,
                requires_approval: true,
                edited_from: e.call_id,
            },
        )));
        Ok(())
    }

    /// A request's decision: granted, denied, or expired unanswered.
    pub(super) fn approval_resolved(
        &mut self,
        call_id: String,
        decision: Decision,
        reason: String,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&call_id)?;
        call.decision = Some(decision);
        call.cancel_wait_timers(actions);
        actions.push(Action::ApprovalResolved {
            call_id: call_id.clone(),
        });
        match decision {
            Decision::Granted => {
                call.phase = Phase::Ready;
                actions.push(Action::DispatchTool {
                    call_id,
                    tool: call.name.clone(),
                });
            }
            Decision::Denied => {
                let message = if reason.is_empty() {
                    "denied by a human".to_string()
                } else {
                    reason
                };
                actions.push(Action::Emit(NewEvent::engine(
                    TOOL_FAILED,
                    ToolFailed {
                        call_id,
                        attempt: 0,
                        error: ErrorData::new("ApprovalDenied", message),
                    },
                )));
            }
            // The run ends right after (deadline or cancel).
            Decision::Expired => call.phase = Phase::Done,
            Decision::Edited => unreachable!("aaa.approval.edited is folded above"),
        }
        Ok(())
    }

    /// What a standing grant would stand in for, given the policy's
    /// verdict: a call that waits for a person (gated and unmatched, or
    /// under a `require` rule), with the approvals and approver groups it
    /// needs. None when the policy decided (allow, deny), when a rule
    /// failed (a person must look), or when nobody needs to approve.
    pub fn grant_ask(&self, call_id: &str, verdict: &Verdict) -> Option<GrantAsk<'_>> {
        let call = self.call(call_id)?;
        let needs = match verdict {
            Verdict::NoMatch if call.phase == Phase::AwaitingApproval => Requirements::default(),
            Verdict::Decided {
                decide: Decide::Require(needs),
                ..
            } => needs.clone(),
            _ => return None,
        };
        Some(GrantAsk {
            tool: &call.name,
            arguments: &call.arguments,
            approvals_required: needs.approvals_required.unwrap_or(call.approvals_required),
            approvers: needs.approvers.unwrap_or_else(|| call.approvers.clone()),
        })
    }

    /// What follows a valid call's request, given the approval policy's
    /// verdict (`NoMatch` without a policy) and the standing grant the
    /// engine found for it: a request for a human decision, a grant or
    /// denial by the policy's rule, a grant by the standing grant, or the
    /// dispatch of a call nobody needs to approve. `sha256` is the policy
    /// file's. The grant comes in as data (found by the engine, which
    /// counts its uses), so the fold stays pure: a replay reads the
    /// recorded event and never looks at grants.
    pub fn review(
        &self,
        call_id: &str,
        verdict: &Verdict,
        sha256: &str,
        granted: Option<&GrantStamp>,
        now: i64,
    ) -> Vec<Action> {
        let Some(call) = self.call(call_id) else {
            return Vec::new();
        };
        if let Some(grant) = granted.filter(|_| self.grant_ask(call_id, verdict).is_some()) {
            let policy = match verdict {
                Verdict::Decided { rule, .. } => Some(PolicyStamp {
                    rule: rule.clone(),
                    sha256: sha256.to_string(),
                    error: String::new(),
                }),
                _ => None,
            };
            let event = NewEvent::engine(
                APPROVAL_GRANTED,
                ApprovalGranted {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments_sha256: Some(sha256_hex(&call.arguments)),
                    comment: None,
                    approver: None,
                    approvers: Vec::new(),
                    policy,
                    grant: Some(grant.clone()),
                },
            )
            .by(Actor::Grant(grant.id.clone()));
            return vec![Action::Emit(event)];
        }
        let gated = call.phase == Phase::AwaitingApproval;
        let stamp = |rule: &str, error: &str| PolicyStamp {
            rule: rule.to_string(),
            sha256: sha256.to_string(),
            error: error.to_string(),
        };
        let dispatch = || Action::DispatchTool {
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
        };
        let event = match verdict {
            Verdict::NoMatch if !gated => return vec![dispatch()],
            Verdict::NoMatch => self.approval_request(call, &Requirements::default(), None, now),
            Verdict::Decided {
                decide: Decide::Allow,
                ..
            } if !gated => return vec![dispatch()],
            Verdict::Decided {
                rule,
                decide: Decide::Allow,
            } => NewEvent::engine(
                APPROVAL_GRANTED,
                ApprovalGranted {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments_sha256: Some(sha256_hex(&call.arguments)),
                    comment: None,
                    approver: None,
                    approvers: Vec::new(),
                    policy: Some(stamp(rule, "")),
                    grant: None,
                },
            )
            .by(Actor::Policy(rule.clone())),
            Verdict::Decided {
                rule,
                decide: Decide::Deny { reason },
            } => NewEvent::engine(
                APPROVAL_DENIED,
                ApprovalDenied {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    reason: reason.clone(),
                    arguments_sha256: Some(sha256_hex(&call.arguments)),
                    approver: None,
                    policy: Some(stamp(rule, "")),
                },
            )
            .by(Actor::Policy(rule.clone())),
            Verdict::Decided {
                rule,
                decide: Decide::Require(needs),
            } => self.approval_request(call, needs, Some(stamp(rule, "")), now),
            // Fail safe: a person decides, with the tool's requirements.
            Verdict::Failed { rule, error } => self.approval_request(
                call,
                &Requirements::default(),
                Some(stamp(rule, error)),
                now,
            ),
        };
        vec![Action::Emit(event)]
    }

    /// The `aaa.approval.requested` of a call: the tool's requirements,
    /// with what a policy rule set in their place.
    pub(super) fn approval_request(
        &self,
        call: &Call,
        needs: &Requirements,
        policy: Option<PolicyStamp>,
        now: i64,
    ) -> NewEvent {
        let spec = call.spec.as_ref();
        let timeout = needs
            .approval_timeout_s
            .unwrap_or_else(|| spec.map_or(0.0, |s| s.approval_timeout_s));
        let timeout_due = (timeout > 0.0).then(|| seconds::after_ms(now, timeout));
        let expires_at_ms = match (timeout_due, self.spec.deadline_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        NewEvent::engine(
            APPROVAL_REQUESTED,
            ApprovalRequested {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments_sha256: sha256_hex(&call.arguments),
                arguments: call.arguments.clone(),
                expires_at_ms,
                approvals_required: needs.approvals_required.unwrap_or(call.approvals_required),
                edited_from: call.edited_from.clone(),
                approvers: needs
                    .approvers
                    .clone()
                    .unwrap_or_else(|| call.approvers.clone()),
                approval_timeout_s: needs.approval_timeout_s,
                nudging: needs.nudging(spec.map(|s| &s.nudging)),
                policy,
            },
        )
    }

    /// An approval decision from a client: a grant (or a vote towards
    /// one), a denial or an edit. Each may be bound to the digest of the
    /// arguments the reviewer saw.
    pub fn decide_approval(
        &self,
        event_type: &str,
        data: &Value,
        reviewer: &Reviewer,
        rules: &Rules,
    ) -> Result<DecisionOutcome, Error> {
        rules.may_decide_in(reviewer, self.id, &self.started_by)?;
        let call_id = data
            .get("call_id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                Error::invalid(
                    "data_json.call_id",
                    "a decision needs the call_id it decides",
                )
            })?;
        let call = self
            .call(call_id)
            .filter(|c| c.approval_seq > 0)
            .ok_or_else(|| Error::CallNotFound {
                run: self.id.to_string(),
                call: call_id.to_string(),
            })?;
        if let Some(decision) = call.decision {
            return Ok(DecisionOutcome::AlreadyDecided(decision));
        }
        let pending = pending(self.id, &self.started_by, call);
        rules.may_decide(reviewer, &pending)?;
        let parse = |what: &str| {
            let what = what.to_string();
            move |e: serde_json::Error| {
                Error::invalid("data_json", format!("not a valid {what}: {e}"))
            }
        };
        let decided = match event_type {
            APPROVAL_GRANTED => {
                let grant: ApprovalGranted =
                    serde_json::from_value(data.clone()).map_err(parse("grant"))?;
                check_digest(call, grant.arguments_sha256.as_deref())?;
                let approver = reviewer.approver(grant.approver.as_deref())?;
                let voters = call.votes.iter().map(|v| v.approver.as_str());
                let tally = count_vote(&pending, voters, &approver)?;
                let event =
                    vote_event(call, tally, approver, grant.arguments_sha256, grant.comment);
                Decided {
                    recorded: if tally.satisfied {
                        APPROVAL_GRANTED
                    } else {
                        APPROVAL_VOTED
                    },
                    events: vec![event.by(reviewer.actor.clone())],
                    votes: tally.votes,
                    approvals_required: call.approvals_required,
                    ..Decided::default()
                }
            }
            APPROVAL_DENIED => {
                let mut denied: ApprovalDenied =
                    serde_json::from_value(data.clone()).map_err(parse("denial"))?;
                check_digest(call, denied.arguments_sha256.as_deref())?;
                if call.approvals_required > 1 {
                    denied.approver = Some(reviewer.approver(denied.approver.as_deref())?);
                }
                denied.name = call.name.clone();
                Decided {
                    events: vec![
                        NewEvent::engine(APPROVAL_DENIED, denied).by(reviewer.actor.clone())
                    ],
                    recorded: APPROVAL_DENIED,
                    ..Decided::default()
                }
            }
            APPROVAL_EDITED => self.decide_edit(call, data, reviewer)?,
            other => {
                return Err(Error::Internal(format!(
                    "decide_approval called with {other}"
                )))
            }
        };
        Ok(DecisionOutcome::Append(decided))
    }

    /// An edit: the call is resolved as edited and a new call with the
    /// reviewer's arguments takes its place (checked against the schema
    /// here, so a reviewer's typo is refused rather than recorded).
    pub(super) fn decide_edit(
        &self,
        call: &Call,
        data: &Value,
        reviewer: &Reviewer,
    ) -> Result<Decided, Error> {
        let edit: EditRequest = serde_json::from_value(data.clone())
            .map_err(|e| Error::invalid("data_json", format!("not a valid edit: {e}")))?;
        check_digest(call, edit.arguments_sha256.as_deref())?;
        if !edit.arguments.is_object() {
            return Err(Error::invalid(
                "data_json.arguments",
                "the edited arguments must be a JSON object",
            ));
        }
        if edit.arguments == call.arguments {
            return Err(Error::invalid(
                "data_json.arguments",
                "these are the arguments requested; grant the call instead of editing it",
            ));
        }
        if let Some(spec) = &call.spec {
            let violations = crate::engine::schema::violations(&spec.parameters, &edit.arguments);
            if !violations.is_empty() {
                return Err(Error::invalid(
                    "data_json.arguments",
                    format!(
                        "the edited arguments do not match {}'s parameters schema: {}",
                        call.name,
                        violations.join("; ")
                    ),
                ));
            }
        }
        let approver = if edit.grant {
            reviewer.approver(edit.approver.as_deref())?
        } else {
            String::new()
        };
        let new_call_id = format!("call-{}", self.calls.len() + 1);
        let new_arguments_sha256 = sha256_hex(&edit.arguments);
        let event = NewEvent::engine(
            APPROVAL_EDITED,
            ApprovalEdited {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments_sha256: sha256_hex(&call.arguments),
                new_call_id: new_call_id.clone(),
                new_arguments: edit.arguments,
                new_arguments_sha256: new_arguments_sha256.clone(),
                reason: edit.reason,
                grant: edit.grant,
                approver,
                approver_groups: reviewer.groups.clone(),
            },
        );
        Ok(Decided {
            events: vec![event.by(reviewer.actor.clone())],
            recorded: APPROVAL_EDITED,
            votes: u32::from(edit.grant),
            approvals_required: call.approvals_required,
            new_call_id,
            new_arguments_sha256,
        })
    }

    /// Expires pending approvals, for a run about to end.
    pub(super) fn expire_approvals(&self, reason: &str) -> Vec<NewEvent> {
        self.calls
            .iter()
            .filter(|c| c.phase == Phase::AwaitingApproval)
            .map(|c| {
                NewEvent::engine(
                    APPROVAL_EXPIRED,
                    ApprovalExpired {
                        call_id: c.call_id.clone(),
                        name: c.name.clone(),
                        reason: reason.to_string(),
                    },
                )
            })
            .collect()
    }
}

/// A grant by `approver`: the call's `aaa.approval.granted` when it is the
/// last one the call needs, else an `aaa.approval.voted`.
/// The guard's pending call of `call`.
fn pending<'a>(run: RunId, started_by: &'a str, call: &'a Call) -> Pending<'a> {
    Pending {
        run,
        call_id: &call.call_id,
        started_by,
        approvers: &call.approvers,
        approvals_required: call.approvals_required,
    }
}

/// The event of a vote the guard counted: the grant when it satisfies the
/// gate, else a vote towards it.
pub(super) fn vote_event(
    call: &Call,
    tally: Tally,
    approver: String,
    arguments_sha256: Option<String>,
    comment: Option<String>,
) -> NewEvent {
    let votes = tally.votes;
    if !tally.satisfied {
        return NewEvent::engine(
            APPROVAL_VOTED,
            ApprovalVoted {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments_sha256: sha256_hex(&call.arguments),
                approver,
                comment,
                votes,
                approvals_required: call.approvals_required,
            },
        );
    }
    let approvers = if call.approvals_required > 1 {
        call.votes
            .iter()
            .map(|v| v.approver.clone())
            .chain([approver.clone()])
            .collect()
    } else {
        Vec::new()
    };
    NewEvent::engine(
        APPROVAL_GRANTED,
        ApprovalGranted {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments_sha256,
            comment,
            approver: (call.approvals_required > 1).then_some(approver),
            approvers,
            policy: None,
            grant: None,
        },
    )
}

/// Refuses a decision bound to other arguments than the call's.
pub(super) fn check_digest(call: &Call, expected: Option<&str>) -> Result<(), Error> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let actual = sha256_hex(&call.arguments);
    if !expected.eq_ignore_ascii_case(&actual) {
        return Err(Error::ArgumentsMismatch {
            call: call.call_id.clone(),
            expected: expected.to_string(),
            actual,
        });
    }
    Ok(())
}

/// What the model reads before an edited call's result.
pub(super) fn edit_note(arguments: &Value, reason: &str) -> String {
    let why = if reason.is_empty() {
        String::new()
    } else {
        format!(" (reason: {reason})")
    };
    format!(
        "[a reviewer changed the arguments to {}{why} before the call ran] ",
        canonical_json(arguments)
    )
}
