//! The fold's own tests: events in, state and actions out.

use super::*;
use crate::engine::guard::{Reviewer, Rules};

fn wire_money(gated: bool) -> ToolSpec {
    ToolSpec {
        name: "wire_money".into(),
        description: String::new(),
        parameters: json!({}),
        requires_approval: gated,
        retry: RetrySpec {
            max_attempts: 2,
            initial_backoff_s: 1.0,
            backoff_coefficient: 2.0,
            max_backoff_s: 60.0,
        },
        heartbeat_timeout_s: 0.0,
        approval_timeout_s: 0.0,
        approvals_required: 1,
        approvers: Vec::new(),
        nudging: Default::default(),
        gate_changed: None,
    }
}

fn reviewer(name: &str) -> Reviewer {
    Reviewer {
        actor: Actor::Client(name.into()),
        principal: String::new(),
        groups: None,
    }
}

fn record(seq: u64, event: &NewEvent) -> EventRecord {
    EventRecord {
        run_id: vec![1; 16],
        seq,
        position: seq,
        id: vec![],
        event_type: event.event_type.clone(),
        data_json: canonical_json(&event.data),
        time_ms: 1_000,
        actor_kind: event.actor.kind(),
        actor_name: event.actor.name().to_string(),
        actor_principal: event.actor.principal().to_string(),
    }
}

thread_local! {
    /// Every record this test's folds applied, the run's start included.
    static FOLDED: std::cell::RefCell<Vec<EventRecord>> = Default::default();
}

/// Folds `events` like the driver does (follow-ups included) and returns
/// the non-emit actions.
fn fold(state: &mut RunState, events: Vec<NewEvent>, log: &mut Vec<String>) -> Vec<Action> {
    let mut queue: std::collections::VecDeque<NewEvent> = events.into();
    let mut effects = Vec::new();
    while let Some(event) = queue.pop_front() {
        log.push(event.event_type.clone());
        let record = record(state.last_seq + 1, &event);
        FOLDED.with(|folded| folded.borrow_mut().push(record.clone()));
        let mut actions: std::collections::VecDeque<Action> = state.apply(&record).unwrap().into();
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Emit(next) => queue.push_back(next),
                // No policy: what the call's tool says.
                Action::Review { call_id } => actions.extend(state.review(
                    &call_id,
                    &Verdict::NoMatch,
                    "",
                    None,
                    record.time_ms,
                )),
                other => effects.push(other),
            }
        }
    }
    effects
}

/// A run of the scripted reference scenario, folded up to its approval request.
fn started(gated: bool) -> (RunState, Vec<String>, Vec<Action>) {
    started_with(wire_money(gated))
}

fn started_with(tool: ToolSpec) -> (RunState, Vec<String>, Vec<Action>) {
    let steps = vec![
        ScriptStep::ToolCalls(vec![ProposedCall {
            name: "wire_money".into(),
            arguments: serde_json::from_str(r#"{"amount":250,"to":"ACME"}"#).unwrap(),
        }]),
        ScriptStep::Echo,
    ];
    let start = NewEvent::engine(
        RUN_STARTED,
        RunStarted {
            task: "Pay ACME $250".into(),
            system: String::new(),
            model: ModelChoice::Scripted(steps),
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
    );
    let id = RunId::from_slice(&[1; 16]).unwrap();
    let first = record(1, &start);
    FOLDED.with(|folded| *folded.borrow_mut() = vec![first.clone()]);
    let (mut state, actions) = RunState::start(id, &first).unwrap();
    let mut log = vec![RUN_STARTED.to_string()];
    let follow_ups = actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Emit(e) => Some(e),
            _ => None,
        })
        .collect();
    let effects = fold(&mut state, follow_ups, &mut log);
    (state, log, effects)
}

/// A call that does not fit its tool's schema fails before anyone is
/// asked; the model is called again with the failure (the scripted one
/// echoes it and completes).
#[test]
fn a_call_that_does_not_fit_the_schema_fails_before_any_approval() {
    let mut tool = wire_money(true);
    tool.parameters = json!({"properties": {"amount": {"type": "string"}}});
    let (state, log, effects) = started_with(tool);
    assert_eq!(
        log[3..],
        [
            TOOL_REQUESTED,
            TOOL_FAILED,
            LLM_REQUESTED,
            LLM_COMPLETED,
            RUN_COMPLETED
        ],
        "{log:?}"
    );
    assert!(
        !effects
            .iter()
            .any(|a| matches!(a, Action::ApprovalPending { .. })),
        "{effects:?}"
    );
    assert_eq!(state.call("call-1").unwrap().phase, Phase::Done);
}

/// A log written before schemas were checked (a request, then its
/// approval request, for arguments the schema refuses) replays as it
/// was: the call still waits for its decision.
#[test]
fn an_older_log_replays_as_it_was_written() {
    started(true);
    let strict = {
        let mut tool = wire_money(true);
        tool.parameters = json!({"properties": {"amount": {"type": "string"}}});
        tool
    };
    // The same history, with the strict schema in its snapshot.
    let id = RunId::from_slice(&[1; 16]).unwrap();
    let mut events = FOLDED.with(|folded| folded.borrow().clone());
    let mut started: RunStarted = serde_json::from_str(&events[0].data_json).unwrap();
    started.tools = vec![strict];
    events[0].data_json = canonical_json(&serde_json::to_value(&started).unwrap());
    let replayed = RunState::replay(id, &events).unwrap();
    assert_eq!(
        replayed.call("call-1").unwrap().phase,
        Phase::AwaitingApproval
    );
    assert_eq!(replayed.status_code(), 2, "waiting for approval");
}

/// A snapshot an older version accepted (no upper bound then) arms its
/// timer far ahead, instead of wrapping it into the past.
#[test]
fn a_huge_stored_approval_timeout_saturates_instead_of_wrapping() {
    let mut tool = wire_money(true);
    tool.approval_timeout_s = 1e300;
    let (_, log, effects) = started_with(tool);
    assert_eq!(log.last().map(String::as_str), Some(APPROVAL_REQUESTED));
    let due = effects
        .iter()
        .find_map(|a| match a {
            Action::ArmTimer { due_ms, .. } => Some(*due_ms),
            _ => None,
        })
        .expect("an approval timer");
    assert!(due > 1_000 + 3_000_000_000_000, "due at {due}");
}

#[test]
fn a_gated_call_waits_for_a_grant_and_then_runs_with_its_arguments() {
    let (mut state, mut log, effects) = started(true);
    assert_eq!(
        log,
        [
            RUN_STARTED,
            LLM_REQUESTED,
            LLM_COMPLETED,
            TOOL_REQUESTED,
            APPROVAL_REQUESTED
        ]
    );
    assert_eq!(
        effects,
        [Action::ApprovalPending {
            call_id: "call-1".into()
        }]
    );
    assert_eq!(state.status_code(), 2, "waiting for approval");
    assert!(
        state.decide_tool_start("call-1", &"w".into(), 0).is_none(),
        "no attempt before the grant"
    );

    let grant = json!({"call_id": "call-1"});
    let DecisionOutcome::Append(decided) = state
        .decide_approval(APPROVAL_GRANTED, &grant, &reviewer("c"), &Rules::default())
        .unwrap()
    else {
        panic!("first decision must append")
    };
    let effects = fold(&mut state, decided.events, &mut log);
    assert!(effects.contains(&Action::DispatchTool {
        call_id: "call-1".into(),
        tool: "wire_money".into()
    }));
    assert!(matches!(
        state.decide_approval(APPROVAL_DENIED, &grant, &reviewer("c"), &Rules::default()),
        Ok(DecisionOutcome::AlreadyDecided(Decision::Granted))
    ));

    let start = state
        .decide_tool_start("call-1", &"w".into(), 0)
        .expect("granted call starts");
    fold(&mut state, vec![start], &mut log);
    let done = state
        .decide_tool_outcome(
            "call-1",
            1,
            ToolOutcome::Output(json!("sent $250 to ACME")),
            Actor::Engine,
        )
        .unwrap();
    fold(&mut state, vec![done], &mut log);
    assert_eq!(
        &log[5..],
        [
            APPROVAL_GRANTED,
            TOOL_STARTED,
            TOOL_COMPLETED,
            LLM_REQUESTED,
            LLM_COMPLETED,
            RUN_COMPLETED
        ]
    );
    assert_eq!(
        state.status,
        Status::Completed(json!({"text": "sent $250 to ACME"}))
    );
}

#[test]
fn a_denial_becomes_an_approval_denied_tool_failure_the_model_reads() {
    let (mut state, mut log, _) = started(true);
    let deny = json!({"call_id": "call-1", "reason": "not this vendor"});
    let DecisionOutcome::Append(decided) = state
        .decide_approval(APPROVAL_DENIED, &deny, &reviewer("c"), &Rules::default())
        .unwrap()
    else {
        panic!("first decision must append")
    };
    fold(&mut state, decided.events, &mut log);
    assert_eq!(&log[5..7], [APPROVAL_DENIED, TOOL_FAILED]);
    let tool_message = state
        .messages()
        .iter()
        .find(|m| matches!(m, Message::Tool { .. }))
        .unwrap();
    let Message::Tool { error, .. } = tool_message else {
        unreachable!()
    };
    assert_eq!(
        error.as_ref().unwrap(),
        &ErrorData::new("ApprovalDenied", "not this vendor")
    );
    // Echo step: the model's reply is the failure text.
    assert_eq!(
        state.status,
        Status::Completed(json!({"text": "ApprovalDenied: not this vendor"}))
    );
}

#[test]
fn results_of_superseded_attempts_are_refused_and_retries_follow_the_policy() {
    let (mut state, mut log, effects) = started(false);
    assert!(effects
        .iter()
        .any(|a| matches!(a, Action::DispatchTool { .. })));
    let start = state.decide_tool_start("call-1", &"w".into(), 0).unwrap();
    fold(&mut state, vec![start], &mut log);
    let lost = ToolOutcome::Failure {
        error: ErrorData::new("AttemptLost", "no heartbeat"),
        retryable: true,
    };
    let retry = state
        .decide_tool_outcome("call-1", 1, lost, Actor::Engine)
        .unwrap();
    assert_eq!(retry.event_type, TOOL_RETRYING);
    fold(&mut state, vec![retry], &mut log);
    assert!(
        state
            .decide_tool_start("call-1", &"w".into(), 1_000)
            .is_none(),
        "backoff not over"
    );
    let second = state
        .decide_tool_start("call-1", &"w".into(), 2_000)
        .unwrap();
    fold(&mut state, vec![second], &mut log);
    assert!(matches!(
        state.decide_tool_outcome("call-1", 1, ToolOutcome::Output(json!(1)), Actor::Engine),
        Err(Error::StaleAttempt { attempt: 1, .. })
    ));
    let last = ToolOutcome::Failure {
        error: ErrorData::new("Boom", "again"),
        retryable: true,
    };
    let failed = state
        .decide_tool_outcome("call-1", 2, last, Actor::Engine)
        .unwrap();
    assert_eq!(failed.event_type, TOOL_FAILED, "max_attempts 2 reached");
}

/// An edit granted in the same step, and a 2-of-2 vote, fold the same
/// live and from the log: the fold reads only events.
#[test]
fn edits_and_votes_replay_as_they_were_folded() {
    let mut tool = wire_money(true);
    tool.approvals_required = 2;
    let (mut state, mut log, _) = started_with(tool);
    let edit = json!({"call_id": "call-1", "arguments": {"amount": 200, "to": "ACME"},
                      "reason": "cap", "grant": true});
    let DecisionOutcome::Append(decided) = state
        .decide_approval(
            APPROVAL_EDITED,
            &edit,
            &reviewer("alice"),
            &Rules::default(),
        )
        .unwrap()
    else {
        panic!("an edit appends")
    };
    assert_eq!(decided.new_call_id, "call-2");
    fold(&mut state, decided.events, &mut log);
    assert_eq!(
        &log[5..],
        [
            APPROVAL_EDITED,
            TOOL_REQUESTED,
            APPROVAL_REQUESTED,
            APPROVAL_VOTED
        ]
    );
    let again = json!({"call_id": "call-2"});
    assert!(matches!(
        state.decide_approval(
            APPROVAL_GRANTED,
            &again,
            &reviewer("alice"),
            &Rules::default()
        ),
        Err(Error::AlreadyVoted { .. })
    ));
    let DecisionOutcome::Append(decided) = state
        .decide_approval(
            APPROVAL_GRANTED,
            &again,
            &reviewer("bob"),
            &Rules::default(),
        )
        .unwrap()
    else {
        panic!("bob's vote appends")
    };
    assert_eq!(decided.recorded, APPROVAL_GRANTED);
    fold(&mut state, decided.events, &mut log);
    let call = state.call("call-2").unwrap();
    assert_eq!(call.phase, Phase::Ready);
    assert_eq!(call.answers, "call-1");
    assert_eq!(call.arguments, json!({"amount": 200, "to": "ACME"}));
    assert_eq!(
        state.call("call-1").unwrap().decision,
        Some(Decision::Edited)
    );

    let records = FOLDED.with(|folded| folded.borrow().clone());
    let replayed = RunState::replay(state.id, &records).unwrap();
    assert_eq!(replayed.calls, state.calls);
    assert_eq!(replayed.status_code(), state.status_code());
}

mod properties;
