//! A tool's gate (the parts of its definition that say whether its calls
//! wait for people, for how many and which, and for how long) and the rule
//! that a registration only tightens it unless an admin registers it. The
//! first declaration of a tool sets its gate; `Engine::register_tools`
//! checks the later ones against the stored one.
//!
//! Each field is compared on its own, because a policy rule may set some
//! of a request's needs and take the rest from the tool (`policy::Requirements`).
//! At least as tight, field by field:
//! - `requires_approval`: may turn on, never off.
//! - `approvals_required`: may rise, never fall.
//! - `approvers`: empty means any approver may decide (`domain::may_decide`),
//!   so an empty list may become any list; a list may drop groups, never
//!   add one or become empty.
//! - `approval_timeout_s`: an unanswered request is denied when it passes,
//!   so it may come (from 0, none) or shorten; never lengthen or go, which
//!   would leave a request open to a grant for longer.
//! - reminders (`remind_after_s`, 0 none; `reminders`): may come, come
//!   sooner or more often; never go, come later or fewer.
//! - escalation adds `escalate_to` to the approver groups of a request
//!   nobody answered for `escalate_after_s` (0: never), so it widens who may
//!   decide: `escalate_after_s` may grow or go, never shrink or come;
//!   `escalate_to` may drop groups, never add one.

use crate::domain::event::{Nudging, ToolSpec};

/// The gate fields of a tool's definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate<'a> {
    pub requires_approval: bool,
    pub approvals_required: u32,
    pub approvers: &'a [String],
    pub approval_timeout_s: f64,
    pub nudging: &'a Nudging,
}

/// No reminders, no escalation.
static NO_NUDGING: Nudging = Nudging {
    remind_after_s: 0.0,
    reminders: 0,
    escalate_after_s: 0.0,
    escalate_to: Vec::new(),
};

/// A field in which a new gate is looser than the one it would replace.
#[derive(Debug, Clone, PartialEq)]
pub struct Loosening {
    /// The field as RegisterWorker names it in a ToolDefinition.
    pub field: &'static str,
    /// What the change would loosen, said with both values.
    pub detail: String,
}

impl ToolSpec {
    pub fn gate(&self) -> Gate<'_> {
        Gate {
            requires_approval: self.requires_approval,
            approvals_required: self.approvals_required,
            approvers: &self.approvers,
            approval_timeout_s: self.approval_timeout_s,
            nudging: &self.nudging,
        }
    }
}

impl<'a> Gate<'a> {
    /// The gate of a tool nobody declared yet: calls run unapproved.
    pub fn open() -> Gate<'a> {
        Gate {
            requires_approval: false,
            approvals_required: 1,
            approvers: &[],
            approval_timeout_s: 0.0,
            nudging: &NO_NUDGING,
        }
    }
}

impl Gate<'_> {
    /// The first field (in the order of the module's list) in which this
    /// gate is looser than `old`; None when it is at least as tight.
    pub fn loosening_from(&self, old: &Gate) -> Option<Loosening> {
        let loose = |field, detail: String| Some(Loosening { field, detail });
        let (new_nudging, old_nudging) = (self.nudging, old.nudging);
        if old.requires_approval && !self.requires_approval {
            return loose(
                "requires_approval",
                "false would let its calls run unapproved".into(),
            );
        }
        if self.approvals_required < old.approvals_required {
            return loose(
                "approvals_required",
                format!(
                    "{} is fewer than the {} grants its calls need",
                    self.approvals_required, old.approvals_required
                ),
            );
        }
        if let Some(detail) = widened_groups(self.approvers, old.approvers) {
            return loose("approvers", detail);
        }
        if later(self.approval_timeout_s, old.approval_timeout_s) {
            return loose(
                "approval_timeout_s",
                format!(
                    "{} would leave a request open longer than its {} s",
                    seconds(self.approval_timeout_s),
                    old.approval_timeout_s
                ),
            );
        }
        if later(new_nudging.remind_after_s, old_nudging.remind_after_s) {
            return loose(
                "remind_after_s",
                format!(
                    "{} would remind later than its {} s",
                    seconds(new_nudging.remind_after_s),
                    old_nudging.remind_after_s
                ),
            );
        }
        let reminds = old_nudging.remind_after_s > 0.0;
        if reminds && new_nudging.reminders < old_nudging.reminders {
            return loose(
                "reminders",
                format!(
                    "{} is fewer than its {} reminders",
                    new_nudging.reminders, old_nudging.reminders
                ),
            );
        }
        // Sooner here is the looser way round: escalating widens who decides.
        if later(old_nudging.escalate_after_s, new_nudging.escalate_after_s) {
            return loose(
                "escalate_after_s",
                format!(
                    "{} s would widen who may decide a request sooner than {}",
                    new_nudging.escalate_after_s,
                    match old_nudging.escalate_after_s {
                        0.0 => "never".to_string(),
                        s => format!("after {s} s"),
                    }
                ),
            );
        }
        if let Some(group) = added(&new_nudging.escalate_to, &old_nudging.escalate_to) {
            return loose(
                "escalate_to",
                format!("escalating to '{group}' would let it decide requests it may not"),
            );
        }
        None
    }
}

/// Is `new` later than `old`, seconds where 0 means never?
fn later(new: f64, old: f64) -> bool {
    old > 0.0 && (new == 0.0 || new > old)
}

/// "0 (none)" or "N s".
fn seconds(s: f64) -> String {
    match s {
        0.0 => "0 (none)".to_string(),
        s => format!("{s} s"),
    }
}

/// Whether approver groups `new` let someone decide whom `old` does not
/// (an empty list lets any approver decide), said as the reason.
fn widened_groups(new: &[String], old: &[String]) -> Option<String> {
    if old.is_empty() {
        return None;
    }
    let only = old.join(", ");
    if new.is_empty() {
        return Some(format!(
            "none would let any approver decide its calls, which only {only} may"
        ));
    }
    added(new, old)
        .map(|group| format!("'{group}' may not decide its calls, which only {only} may"))
}

/// A group of `new` that `old` lacks.
fn added<'a>(new: &'a [String], old: &[String]) -> Option<&'a str> {
    new.iter().find(|g| !old.contains(g)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::RetrySpec;

    fn groups(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// wire_money with every part of a gate set.
    fn guarded() -> ToolSpec {
        ToolSpec {
            name: "wire_money".into(),
            description: String::new(),
            parameters: serde_json::json!({}),
            requires_approval: true,
            retry: RetrySpec {
                max_attempts: 1,
                initial_backoff_s: 1.0,
                backoff_coefficient: 2.0,
                max_backoff_s: 60.0,
            },
            heartbeat_timeout_s: 30.0,
            approval_timeout_s: 3600.0,
            approvals_required: 2,
            approvers: groups(&["finance", "treasury"]),
            nudging: Nudging {
                remind_after_s: 600.0,
                reminders: 2,
                escalate_after_s: 1800.0,
                escalate_to: groups(&["finance-leads"]),
            },
            gate_changed: None,
        }
    }

    /// A change of the guarded tool's definition.
    type Change = fn(&mut ToolSpec);

    /// The field that `change` of the guarded tool loosens, if any.
    fn loosened(change: Change) -> Option<&'static str> {
        let mut new = guarded();
        change(&mut new);
        let loosening = new.gate().loosening_from(&guarded().gate());
        loosening.map(|l| l.field)
    }

    #[test]
    fn the_same_gate_and_tighter_ones_are_not_looser() {
        let tighter: [Change; 11] = [
            |_| {},
            |t| t.approvals_required = 3,
            |t| t.approvers = groups(&["finance"]),
            |t| t.approvers = groups(&["treasury", "finance"]),
            |t| t.approval_timeout_s = 60.0,
            |t| t.nudging.remind_after_s = 60.0,
            |t| t.nudging.reminders = 5,
            |t| t.nudging.escalate_after_s = 7200.0,
            |t| t.nudging.escalate_after_s = 0.0,
            |t| t.nudging.escalate_to = Vec::new(),
            // Not part of the gate.
            |t| {
                t.description = "Wire money".into();
                t.retry.max_attempts = 3;
                t.heartbeat_timeout_s = 5.0;
            },
        ];
        for (i, change) in tighter.into_iter().enumerate() {
            assert_eq!(loosened(change), None, "change {i}");
        }
    }

    #[test]
    fn each_looser_field_is_named() {
        let looser: [(Change, &str); 12] = [
            (|t| t.requires_approval = false, "requires_approval"),
            (|t| t.approvals_required = 1, "approvals_required"),
            (|t| t.approvers.clear(), "approvers"),
            (|t| t.approvers.push("interns".into()), "approvers"),
            (|t| t.approval_timeout_s = 0.0, "approval_timeout_s"),
            (|t| t.approval_timeout_s = 7200.0, "approval_timeout_s"),
            (|t| t.nudging.remind_after_s = 0.0, "remind_after_s"),
            (|t| t.nudging.remind_after_s = 1200.0, "remind_after_s"),
            (|t| t.nudging.reminders = 1, "reminders"),
            (|t| t.nudging.escalate_after_s = 60.0, "escalate_after_s"),
            (
                |t| t.nudging.escalate_to.push("interns".into()),
                "escalate_to",
            ),
            // The attack: both lowered at once; the first field is named.
            (
                |t| {
                    t.approvers.clear();
                    t.approvals_required = 1;
                },
                "approvals_required",
            ),
        ];
        for (change, field) in looser {
            assert_eq!(loosened(change), Some(field));
        }
    }

    #[test]
    fn an_escalation_where_there_was_none_widens_who_may_decide() {
        // A policy rule that names groups takes the tool's escalation, so
        // even a tool any approver may decide gains deciders by it.
        for old_approvers in [guarded().approvers, Vec::new()] {
            let old = ToolSpec {
                approvers: old_approvers,
                nudging: Nudging::default(),
                ..guarded()
            };
            let loosening = guarded().gate().loosening_from(&old.gate()).unwrap();
            assert_eq!(loosening.field, "escalate_after_s");
            assert!(loosening.detail.contains("never"), "{loosening:?}");
        }
        let looser = Gate::open().loosening_from(&guarded().gate());
        assert_eq!(looser.unwrap().field, "requires_approval");
    }
}
