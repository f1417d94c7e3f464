//! The guard's promise, tested by properties: whatever sequence of grants,
//! votes, denials and edits any principals send, under any policy verdict,
//! a gated call is dispatched only once its current gate is satisfied by
//! distinct permitted deciders (or the policy decided it), and at most
//! once. The oracle reads the folded log and its own table of principals,
//! never the guard's code.

use super::*;
use crate::policy::{Decide, Requirements};

/// A small deterministic generator (SplitMix64): a seed replays a case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The principals of the deployment and their approver groups.
const PEOPLE: [(&str, &[&str]); 5] = [
    ("starter", &["finance"]),
    ("alice", &["finance"]),
    ("bob", &["ops"]),
    ("carol", &[]),
    ("dave", &["finance", "ops"]),
];

fn groups_of(name: &str) -> Vec<String> {
    PEOPLE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, g)| g.iter().map(|g| g.to_string()).collect())
        .unwrap_or_default()
}

struct Case {
    auth: bool,
    rules: Rules,
    state: RunState,
    /// Every record folded, in order, with the actions it implied.
    log: Vec<EventRecord>,
    dispatched: Vec<String>,
}

impl Case {
    fn new(rng: &mut Rng) -> Case {
        let mut tool = wire_money(rng.chance(85));
        tool.approvals_required = 1 + rng.below(3) as u32;
        tool.approvers = match rng.below(4) {
            0 => vec!["finance".into()],
            1 => vec!["ops".into()],
            2 => vec!["finance".into(), "ops".into()],
            _ => Vec::new(),
        };
        let calls = (0..1 + rng.below(3))
            .map(|i| ProposedCall {
                name: "wire_money".into(),
                arguments: json!({"amount": 100 * (i + 1)}),
            })
            .collect();
        let start = NewEvent::engine(
            RUN_STARTED,
            RunStarted {
                task: "pay".into(),
                system: String::new(),
                model: ModelChoice::Scripted(vec![ScriptStep::ToolCalls(calls), ScriptStep::Echo]),
                tools: vec![tool],
                budget: Budget {
                    deadline_s: 0.0,
                    max_model_calls: 5,
                    max_tokens: 0,
                },
                labels: Default::default(),
                deadline_at_ms: None,
                traceparent: None,
            },
        )
        .by(Actor::Client("starter".into()));
        let first = record(1, &start);
        let id = RunId::from_slice(&[1; 16]).unwrap();
        let (state, actions) = RunState::start(id, &first).unwrap();
        let mut case = Case {
            auth: rng.chance(60),
            rules: Rules {
                separation_of_duties: rng.chance(50),
            },
            state,
            log: vec![first],
            dispatched: Vec::new(),
        };
        let emitted = actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Emit(e) => Some(e),
                _ => None,
            })
            .collect();
        case.fold(emitted, rng);
        case
    }

    /// Folds `events` like the driver, reviewing new calls under a random
    /// policy verdict.
    fn fold(&mut self, events: Vec<NewEvent>, rng: &mut Rng) {
        let mut queue: std::collections::VecDeque<NewEvent> = events.into();
        while let Some(event) = queue.pop_front() {
            let record = record(self.state.last_seq + 1, &event);
            let mut actions: std::collections::VecDeque<Action> =
                self.state.apply(&record).unwrap().into();
            self.log.push(record);
            while let Some(action) = actions.pop_front() {
                match action {
                    Action::Emit(next) => queue.push_back(next),
                    Action::Review { call_id } => {
                        let verdict = verdict(rng);
                        actions.extend(self.state.review(&call_id, &verdict, "", None, 1_000))
                    }
                    Action::DispatchTool { call_id, .. } => self.dispatched.push(call_id),
                    _ => {}
                }
            }
        }
    }

    /// Someone decides something about some call.
    fn step(&mut self, rng: &mut Rng) {
        let ids: Vec<String> = self.state.calls.iter().map(|c| c.call_id.clone()).collect();
        let Some(call_id) = (!ids.is_empty()).then(|| rng.pick(&ids).clone()) else {
            return;
        };
        let call = self.state.call(&call_id).unwrap();
        let name = PEOPLE[rng.below(PEOPLE.len())].0;
        let reviewer = match self.auth {
            true => Reviewer {
                actor: Actor::Client(name.into()),
                principal: name.into(),
                groups: Some(groups_of(name)),
            },
            false => Reviewer {
                actor: Actor::Client(format!("10.0.0.{}:5{}", rng.below(3), rng.below(9))),
                principal: String::new(),
                groups: None,
            },
        };
        let digest = match rng.below(3) {
            0 => Some(sha256_hex(&call.arguments)),
            1 => Some("0".repeat(64)),
            _ => None,
        };
        let mut data = json!({"call_id": call_id, "arguments_sha256": digest});
        if !self.auth && rng.chance(50) {
            data["approver"] = json!(rng.pick(&["ann", "ben", "cy"]));
        }
        let event_type = match rng.below(10) {
            0 => APPROVAL_DENIED,
            1 | 2 => {
                data["arguments"] = json!({"amount": rng.below(1_000)});
                data["grant"] = json!(rng.chance(60));
                APPROVAL_EDITED
            }
            _ => APPROVAL_GRANTED,
        };
        if let Ok(DecisionOutcome::Append(decided)) =
            self.state
                .decide_approval(event_type, &data, &reviewer, &self.rules)
        {
            self.fold(decided.events, rng);
        }
    }

    /// The promise, checked against the log.
    fn check(&self, seed: u64) {
        let mut seen = std::collections::BTreeSet::new();
        for call_id in &self.dispatched {
            assert!(
                seen.insert(call_id),
                "seed {seed}: {call_id} dispatched twice"
            );
            let gated = self
                .records_of(call_id)
                .any(|r| r.event_type == APPROVAL_REQUESTED)
                || self.requested(call_id).is_some_and(|r| r.requires_approval);
            if !gated {
                continue;
            }
            let granted = self
                .records_of(call_id)
                .find(|r| r.event_type == APPROVAL_GRANTED)
                .unwrap_or_else(|| panic!("seed {seed}: gated {call_id} ran without a grant"));
            if granted.actor_kind == Actor::Policy(String::new()).kind() {
                continue;
            }
            let request: ApprovalRequested = self
                .records_of(call_id)
                .filter(|r| r.event_type == APPROVAL_REQUESTED)
                .last()
                .map(|r| serde_json::from_str(&r.data_json).unwrap())
                .unwrap_or_else(|| panic!("seed {seed}: {call_id} granted without a request"));
            let grant: ApprovalGranted = serde_json::from_str(&granted.data_json).unwrap();
            let mut voters: Vec<String> = self
                .records_of(call_id)
                .filter(|r| r.event_type == APPROVAL_VOTED)
                .map(|r| {
                    serde_json::from_str::<ApprovalVoted>(&r.data_json)
                        .unwrap()
                        .approver
                })
                .collect();
            match (grant.approvers.is_empty(), grant.approver) {
                (false, _) => voters = grant.approvers.clone(),
                (true, Some(approver)) => voters.push(approver),
                (true, None) => voters.push(granted.actor_name.clone()),
            }
            let distinct: std::collections::BTreeSet<&String> = voters.iter().collect();
            assert_eq!(
                distinct.len(),
                voters.len(),
                "seed {seed}: {call_id} {voters:?}"
            );
            assert!(
                voters.len() as u32 >= request.approvals_required.max(1),
                "seed {seed}: {call_id} ran with {voters:?}, needing {}",
                request.approvals_required
            );
            if self.auth {
                for voter in &voters {
                    assert!(
                        !(self.rules.separation_of_duties && voter == "starter"),
                        "seed {seed}: the starter decided {call_id}"
                    );
                    let groups = groups_of(voter);
                    assert!(
                        request.approvers.is_empty()
                            || request.approvers.iter().any(|g| groups.contains(g)),
                        "seed {seed}: {voter} is not in {:?} for {call_id}",
                        request.approvers
                    );
                }
            }
        }
    }

    fn records_of<'a>(&'a self, call_id: &'a str) -> impl Iterator<Item = &'a EventRecord> {
        self.log.iter().filter(move |r| {
            serde_json::from_str::<Value>(&r.data_json)
                .ok()
                .and_then(|d| {
                    d.get("call_id")
                        .and_then(Value::as_str)
                        .map(|c| c == call_id)
                })
                .unwrap_or(false)
        })
    }

    fn requested(&self, call_id: &str) -> Option<ToolRequested> {
        self.records_of(call_id)
            .find(|r| r.event_type == TOOL_REQUESTED)
            .map(|r| serde_json::from_str(&r.data_json).unwrap())
    }
}

/// A policy verdict for a new call: mostly none, sometimes a rule that
/// sets the gate, allows or denies.
fn verdict(rng: &mut Rng) -> Verdict {
    let rule = "r".to_string();
    match rng.below(10) {
        0 => Verdict::Decided {
            rule,
            decide: Decide::Allow,
        },
        1 => Verdict::Decided {
            rule,
            decide: Decide::Deny {
                reason: "no".into(),
            },
        },
        2 | 3 => Verdict::Decided {
            rule,
            decide: Decide::Require(Requirements {
                approvals_required: Some(1 + rng.below(3) as u32),
                approvers: Some(vec![rng.pick(&["finance", "ops"]).to_string()]),
                ..Requirements::default()
            }),
        },
        4 => Verdict::Failed {
            rule,
            error: "missing".into(),
        },
        _ => Verdict::NoMatch,
    }
}

#[test]
fn a_gated_call_runs_once_and_only_when_its_current_gate_is_satisfied() {
    let mut dispatched = 0;
    for seed in 0..2_000 {
        let mut rng = Rng(seed);
        let mut case = Case::new(&mut rng);
        for _ in 0..rng.below(40) {
            case.step(&mut rng);
        }
        case.check(seed);
        dispatched += case.dispatched.len();
    }
    // The cases reach the gate's both sides, not only its refusals.
    assert!(dispatched > 500, "only {dispatched} calls ran");
}
