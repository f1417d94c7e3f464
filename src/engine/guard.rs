//! Who may decide a call, and when its gate is satisfied: the one place
//! every road to a decision asks. A person's decision (Signal, DecideApprovals,
//! the web inbox through them, an edit that grants its own arguments) is
//! checked by [`Rules::may_decide`] and counted by [`count_vote`]; a standing
//! grant stands in for a person only where [`Rules::grant_may_decide`] says
//! so. The policy and the timers decide as the engine, not as a person: their
//! verdicts are recorded by the fold (`state::approval`, `state::run`).
//!
//! The rules, in one place:
//! - with separation of duties on, the run's starter decides none of its
//!   calls, and no grant the starter made decides them either;
//! - with auth on, a call with approver groups is decided only by a member
//!   of one of them (with auth off groups are not enforced);
//! - a call that needs N approvals runs after N votes of N distinct
//!   approvers; a standing grant stands in for one person only, so it never
//!   decides a call that needs more than one.
//!
//! Everything here is pure: no store, no clock.

use crate::auth::Refusal;
use crate::domain::event::Actor;
use crate::domain::{may_decide, GrantRecord, RunId};

use super::error::Error;

/// The deployment's rules for deciders (from the engine's settings).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// The run's starter may not decide its calls.
    pub separation_of_duties: bool,
}

/// Who decides, as the API authenticated them.
#[derive(Debug, Clone)]
pub struct Reviewer {
    pub actor: Actor,
    /// The authenticated principal; empty with auth off.
    pub principal: String,
    /// With auth on, the principal's approver groups; None with auth off
    /// (groups are then not enforced).
    pub groups: Option<Vec<String>>,
}

/// A pending call as the guard sees it.
#[derive(Debug, Clone, Copy)]
pub struct Pending<'a> {
    pub run: RunId,
    pub call_id: &'a str,
    /// The principal who started the run; empty when unknown (auth off).
    pub started_by: &'a str,
    /// The approver groups the request names; empty: anyone who approves.
    pub approvers: &'a [String],
    pub approvals_required: u32,
}

/// A vote counted: how many there are with it, and whether they satisfy
/// the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub votes: u32,
    pub satisfied: bool,
}

impl Rules {
    /// May `reviewer` decide calls of the run `run`, started by
    /// `started_by`? Asked before the call is looked up, so the starter
    /// learns nothing of its run's calls.
    pub fn may_decide_in(
        &self,
        reviewer: &Reviewer,
        run: RunId,
        started_by: &str,
    ) -> Result<(), Refusal> {
        if self.separation_of_duties
            && !reviewer.principal.is_empty()
            && started_by == reviewer.principal
        {
            return Err(Refusal::SeparationOfDuties {
                principal: reviewer.principal.clone(),
                run: run.to_string(),
            });
        }
        Ok(())
    }

    /// May `reviewer` decide `call` (grant, vote, deny or edit it)?
    pub fn may_decide(&self, reviewer: &Reviewer, call: &Pending) -> Result<(), Refusal> {
        self.may_decide_in(reviewer, call.run, call.started_by)?;
        if !may_decide(reviewer.groups.as_deref(), call.approvers) {
            return Err(Refusal::NotAnApproverForCall {
                principal: reviewer.principal.clone(),
                call: call.call_id.to_string(),
                groups: call.approvers.to_vec(),
            });
        }
        Ok(())
    }

    /// May the standing grant `grant` stand in for a person on `call`?
    /// Only where its creator could have decided it alone: one approval,
    /// the creator's groups (when they were enforced at its creation), and
    /// never the starter's own grant under separation of duties.
    pub fn grant_may_decide(&self, grant: &GrantRecord, call: &Pending) -> bool {
        call.approvals_required <= 1
            && !(self.separation_of_duties
                && grant.groups_enforced
                && !call.started_by.is_empty()
                && grant.created_by == call.started_by)
            && may_decide(
                grant
                    .groups_enforced
                    .then_some(grant.creator_groups.as_slice()),
                call.approvers,
            )
    }
}

impl Reviewer {
    /// The name a vote counts under: the principal with auth on; with auth
    /// off the name the decision gives, else the caller's IP address (not
    /// its port: a process that reconnects is not another approver).
    pub fn approver(&self, named: Option<&str>) -> Result<String, Error> {
        match (self.principal.as_str(), named) {
            ("", Some(name)) if !name.is_empty() => Ok(name.to_string()),
            ("", _) => {
                let caller = self.actor.name();
                Ok(caller
                    .parse::<std::net::SocketAddr>()
                    .map_or_else(|_| caller.to_string(), |addr| addr.ip().to_string()))
            }
            (principal, Some(name)) if !name.is_empty() && name != principal => Err(Error::invalid(
                "data_json.approver",
                format!("with auth on the approver is the authenticated principal ({principal}), not '{name}'"),
            )),
            (principal, _) => Ok(principal.to_string()),
        }
    }
}

/// Does an edit's own grant count as its editor's vote for the new call?
/// The editor was checked when editing ([`Rules::may_decide`]); the new
/// call's request may name other groups (a policy rule), so they are
/// checked again.
pub fn editor_vote_counts(groups: Option<&[String]>, call: &Pending) -> bool {
    may_decide(groups, call.approvers)
}

/// Counts `approver`'s vote on `call`, whose votes so far are `voters`:
/// refused if they voted already; satisfied once the distinct votes reach
/// the approvals the call needs.
pub fn count_vote<'a>(
    call: &Pending,
    voters: impl IntoIterator<Item = &'a str>,
    approver: &str,
) -> Result<Tally, Error> {
    let mut votes = 1;
    for voter in voters {
        if voter == approver {
            return Err(Error::AlreadyVoted {
                call: call.call_id.to_string(),
                approver: approver.to_string(),
            });
        }
        votes += 1;
    }
    Ok(Tally {
        votes,
        satisfied: votes >= call.approvals_required.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(approvers: &'a [String], approvals_required: u32) -> Pending<'a> {
        Pending {
            run: RunId::new(),
            call_id: "call-1",
            started_by: "starter",
            approvers,
            approvals_required,
        }
    }

    fn grant(created_by: &str, groups: Option<&[&str]>) -> GrantRecord {
        GrantRecord {
            created_by: created_by.into(),
            groups_enforced: groups.is_some(),
            creator_groups: groups
                .unwrap_or_default()
                .iter()
                .map(|g| g.to_string())
                .collect(),
            ..Default::default()
        }
    }

    /// A standing grant stands in for its creator deciding alone: never
    /// for a call that needs several approvals, never outside the
    /// creator's groups, never the starter's own under separation.
    #[test]
    fn a_grant_decides_only_what_its_creator_could_decide_alone() {
        let finance = vec!["finance".to_string()];
        let separated = Rules {
            separation_of_duties: true,
        };
        let alice = grant("alice", Some(&["finance"]));
        assert!(separated.grant_may_decide(&alice, &call(&finance, 1)));
        assert!(!separated.grant_may_decide(&alice, &call(&finance, 2)));
        assert!(!separated.grant_may_decide(&grant("bob", Some(&["ops"])), &call(&finance, 1)));
        let starters = grant("starter", Some(&["finance"]));
        assert!(!separated.grant_may_decide(&starters, &call(&finance, 1)));
        assert!(Rules::default().grant_may_decide(&starters, &call(&finance, 1)));
        // Made with auth off: groups were not known, so not enforced.
        assert!(separated.grant_may_decide(&grant("", None), &call(&finance, 1)));
    }

    #[test]
    fn votes_count_once_per_approver_until_the_gate_is_satisfied() {
        let anyone = Vec::new();
        let two = call(&anyone, 2);
        assert_eq!(
            count_vote(&two, [], "alice").unwrap(),
            Tally {
                votes: 1,
                satisfied: false
            }
        );
        assert!(count_vote(&two, ["bob"], "alice").unwrap().satisfied);
        assert!(matches!(
            count_vote(&two, ["alice"], "alice"),
            Err(Error::AlreadyVoted { .. })
        ));
    }
}
