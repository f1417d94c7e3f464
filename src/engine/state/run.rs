//! The run's end: completed, failed or cancelled, and the durable timers
//! (deadline, approval timeouts, reminders, escalation, retries) decided.

use super::*;

impl RunState {
    /// The run ended: completed, failed or cancelled.
    pub(super) fn run_ended(&mut self, status: Status, actions: &mut Vec<Action>) {
        self.status = status;
        self.model_call = None;
        if let Some(due_ms) = self.spec.deadline_at_ms {
            actions.push(Action::CancelTimer {
                due_ms,
                name: DEADLINE_TIMER.to_string(),
            });
        }
        for call in &mut self.calls {
            call.cancel_wait_timers(actions);
            if let Phase::Backoff { until_ms } = call.phase {
                actions.push(Action::CancelTimer {
                    due_ms: until_ms,
                    name: format!("{RETRY_TIMER}{}", call.call_id),
                });
            }
            if call.phase == Phase::AwaitingApproval {
                actions.push(Action::ApprovalResolved {
                    call_id: call.call_id.clone(),
                });
            }
            if call.phase != Phase::Done {
                call.phase = Phase::Done;
            }
        }
    }

    /// CancelRun. Cancelling a cancelled run changes nothing.
    pub fn decide_cancel(&self, reason: &str, actor: Actor) -> Result<Vec<NewEvent>, Error> {
        if let Status::Cancelled(_) = self.status {
            return Ok(Vec::new());
        }
        self.ensure_running()?;
        let mut events = self.expire_approvals("run_cancelled");
        events.push(
            NewEvent::engine(
                RUN_CANCELLED,
                RunCancelled {
                    reason: reason.to_string(),
                },
            )
            .by(actor),
        );
        Ok(events)
    }

    /// A durable timer fired.
    pub fn decide_timer(&self, name: &str, now_ms: i64) -> Vec<NewEvent> {
        if self.is_finished() {
            return Vec::new();
        }
        if name == DEADLINE_TIMER {
            let mut events = self.expire_approvals("deadline");
            events.push(NewEvent::engine(
                RUN_FAILED,
                RunFailed {
                    error: ErrorData::new(
                        "DeadlineExceeded",
                        format!(
                            "the run's deadline of {} s passed",
                            self.spec.budget.deadline_s
                        ),
                    ),
                },
            ));
            return events;
        }
        if let Some(call_id) = name.strip_prefix(APPROVAL_TIMER) {
            if let Some(call) = self.call(call_id) {
                if call.phase == Phase::AwaitingApproval && call.decision.is_none() {
                    return vec![NewEvent::engine(
                        APPROVAL_DENIED,
                        ApprovalDenied {
                            call_id: call_id.to_string(),
                            name: call.name.clone(),
                            reason: "timeout".to_string(),
                            arguments_sha256: None,
                            approver: None,
                            policy: None,
                        },
                    )];
                }
            }
        }
        let waiting =
            |call: &Call| call.phase == Phase::AwaitingApproval && call.decision.is_none();
        let waiting_s = |call: &Call| (now_ms - call.requested_ms).max(0) as f64 / 1000.0;
        if let Some(call_id) = name.strip_prefix(REMIND_TIMER) {
            if let Some(call) = self.call(call_id).filter(|c| waiting(c)) {
                return vec![NewEvent::engine(
                    APPROVAL_REMINDED,
                    ApprovalReminded {
                        call_id: call_id.to_string(),
                        name: call.name.clone(),
                        reminder: call.nudges.reminded + 1,
                        reminders: call.nudges.reminders,
                        waiting_s: waiting_s(call),
                    },
                )];
            }
        }
        if let Some(call_id) = name.strip_prefix(ESCALATE_TIMER) {
            if let Some(call) = self.call(call_id).filter(|c| waiting(c)) {
                // Widen: add escalate_to to the groups. A call any approver
                // may decide stays so (adding groups would narrow it).
                let mut approvers = call.approvers.clone();
                if !approvers.is_empty() {
                    approvers.extend(call.nudges.escalate_to.iter().cloned());
                    approvers.sort();
                    approvers.dedup();
                }
                return vec![NewEvent::engine(
                    APPROVAL_ESCALATED,
                    ApprovalEscalated {
                        call_id: call_id.to_string(),
                        name: call.name.clone(),
                        approvers,
                        waiting_s: waiting_s(call),
                    },
                )];
            }
        }
        // Retry timers need no event: a call in backoff becomes dispatchable
        // by itself once `until_ms` passes (see `dispatchable`).
        Vec::new()
    }
}
