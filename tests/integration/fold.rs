//! Property tests of the run fold (`RunState::apply` and the decide
//! functions) fed random and malformed JSON: nothing panics, a refused event
//! leaves the state as it was, a refused decision is the expected error (the
//! decide functions take `&self`, so they cannot change the state), and
//! whatever the engine decides its own fold accepts.

use aaa::domain::event::{
    canonical_json, Actor, Budget, ModelChoice, NewEvent, ProposedCall, RetrySpec, RunStarted,
    ScriptStep, ToolSpec,
};
use aaa::engine::state::{Action, DecisionOutcome, RunState, ToolOutcome};
use aaa::engine::Error;
use aaa::engine::{Reviewer, Rules};
use aaa::store::{EventRecord, RunId};
use proptest::prelude::*;
use serde_json::Value;

const ENGINE_TYPES: [&str; 16] = [
    "aaa.run.started",
    "aaa.run.completed",
    "aaa.run.failed",
    "aaa.run.cancelled",
    "aaa.llm.requested",
    "aaa.llm.completed",
    "aaa.llm.failed",
    "aaa.tool.requested",
    "aaa.tool.started",
    "aaa.tool.completed",
    "aaa.tool.retrying",
    "aaa.tool.failed",
    "aaa.approval.requested",
    "aaa.approval.granted",
    "aaa.approval.denied",
    "aaa.approval.expired",
];

fn record(seq: u64, event_type: &str, data_json: String, actor: &Actor) -> EventRecord {
    EventRecord {
        run_id: vec![1; 16],
        seq,
        position: seq,
        id: vec![],
        event_type: event_type.to_string(),
        data_json,
        time_ms: 1_000,
        actor_kind: actor.kind(),
        actor_name: actor.name().to_string(),
        actor_principal: String::new(),
    }
}

/// Applies `event` and the follow-ups it emits, like the driver does.
fn fold(state: &mut RunState, event: NewEvent) -> Result<(), Error> {
    let mut queue = std::collections::VecDeque::from([event]);
    while let Some(event) = queue.pop_front() {
        let next = record(
            state.last_seq + 1,
            &event.event_type,
            canonical_json(&event.data),
            &event.actor,
        );
        let mut actions: std::collections::VecDeque<Action> = state.apply(&next)?.into();
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Emit(follow_up) => queue.push_back(follow_up),
                // No policy, no grants: what the call's tool says.
                Action::Review { call_id } => actions.extend(state.review(
                    &call_id,
                    &aaa::policy::Verdict::NoMatch,
                    "",
                    None,
                    next.time_ms,
                )),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The reference run (gated wire_money, scripted model), folded until it
/// waits for the approval of "call-1".
/// A client deciding with auth off.
fn bob() -> Reviewer {
    Reviewer {
        actor: Actor::Client("bob".into()),
        principal: String::new(),
        groups: None,
    }
}

fn waiting_run() -> RunState {
    let started = NewEvent::engine(
        "aaa.run.started",
        RunStarted {
            task: "Pay ACME $250".into(),
            system: String::new(),
            model: ModelChoice::Scripted(vec![
                ScriptStep::ToolCalls(vec![ProposedCall {
                    name: "wire_money".into(),
                    arguments: serde_json::from_str(r#"{"amount":250,"to":"ACME"}"#).unwrap(),
                }]),
                ScriptStep::Echo,
            ]),
            tools: vec![ToolSpec {
                name: "wire_money".into(),
                description: String::new(),
                parameters: serde_json::json!({}),
                requires_approval: true,
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
            }],
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
    let first = record(
        1,
        &started.event_type,
        canonical_json(&started.data),
        &Actor::Client("alice".into()),
    );
    let (mut state, actions) = RunState::start(id, &first).unwrap();
    for action in actions {
        if let Action::Emit(event) = action {
            fold(&mut state, event).unwrap();
        }
    }
    assert!(state.call("call-1").is_some_and(|c| c.approval_seq > 0));
    state
}

/// Any JSON value; numbers as written, big ones too.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "-?[1-9][0-9]{0,30}(\\.[0-9]{1,4})?".prop_map(|n| serde_json::from_str(&n).unwrap()),
        prop_oneof![Just("call-1".to_string()), ".{0,8}".prop_map(String::from)]
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 40, 5, |inner| {
        let key = prop_oneof![
            Just("call_id".to_string()),
            Just("comment".to_string()),
            Just("reason".to_string()),
            Just("arguments_sha256".to_string()),
            Just("attempt".to_string()),
            ".{0,6}".prop_map(String::from),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Event data as a client or a broken log could hold it: JSON or not.
fn data_text() -> impl Strategy<Value = String> {
    prop_oneof![json().prop_map(|v| v.to_string()), ".{0,40}"]
}

fn event_type() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(ENGINE_TYPES.to_vec()).prop_map(String::from),
        "app\\.[a-z]{1,6}",
        ".{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn apply_never_panics_on_any_event(ty in event_type(), data in data_text()) {
        let mut state = waiting_run();
        let seq = state.last_seq + 1;
        // Ok or a refusal: either way no panic. (On a refusal the driver
        // drops the state and folds the log again.)
        let _ = state.apply(&record(seq, &ty, data, &Actor::Client("x".into())));
    }

    #[test]
    fn application_events_are_recorded_and_change_nothing_else(
        ty in "app\\.[a-z]{1,6}",
        data in json(),
    ) {
        let before = waiting_run();
        let mut state = before.clone();
        let seq = state.last_seq + 1;
        let actions = state
            .apply(&record(seq, &ty, data.to_string(), &Actor::Client("x".into())))
            .unwrap();
        prop_assert!(actions.is_empty(), "{actions:?}");
        state.last_seq = before.last_seq;
        state.updated_ms = before.updated_ms;
        prop_assert_eq!(state, before);
    }

    #[test]
    fn decisions_with_random_data_are_refused_or_folded(
        kind in 0usize..3,
        data in json(),
    ) {
        let state = waiting_run();
        let ty = ["aaa.approval.granted", "aaa.approval.denied", "aaa.approval.edited"][kind];
        match state.decide_approval(ty, &data, &bob(), &Rules::default()) {
            Err(error) => {
                prop_assert!(
                    matches!(
                        error,
                        Error::InvalidField { .. }
                            | Error::CallNotFound { .. }
                            | Error::ArgumentsMismatch { .. }
                    ),
                    "{error:?}"
                );
            }
            Ok(DecisionOutcome::AlreadyDecided(_)) => prop_assert!(false, "nothing was decided"),
            Ok(DecisionOutcome::Append(decided)) => {
                prop_assert_eq!(data["call_id"].as_str(), Some("call-1"));
                let mut state = state;
                for event in decided.events {
                    prop_assert!(fold(&mut state, event).is_ok());
                }
                prop_assert!(state.call("call-1").unwrap().decision.is_some());
            }
        }
    }

    #[test]
    fn any_tool_output_or_failure_is_folded(
        output in json(),
        failed in any::<bool>(),
        error_type in ".{0,10}",
        attempt in 0u32..4,
    ) {
        let mut state = waiting_run();
        let grant = serde_json::json!({ "call_id": "call-1" });
        let Ok(DecisionOutcome::Append(decided)) =
            state.decide_approval("aaa.approval.granted", &grant, &bob(), &Rules::default())
        else {
            panic!("the grant was refused");
        };
        for event in decided.events {
            fold(&mut state, event).unwrap();
        }
        let started = state.decide_tool_start("call-1", &"w".into(), 1_000).expect("startable");
        fold(&mut state, started).unwrap();
        let outcome = if failed {
            ToolOutcome::Failure {
                error: aaa::domain::event::ErrorData::new(&error_type, "boom"),
                retryable: true,
            }
        } else {
            ToolOutcome::Output(output)
        };
        match state.decide_tool_outcome("call-1", attempt, outcome, Actor::Worker("w".into())) {
            // Only the running attempt (1) may report.
            Err(error) => {
                prop_assert_ne!(attempt, 1);
                prop_assert!(matches!(error, Error::StaleAttempt { .. }), "{error:?}");
            }
            Ok(event) => {
                prop_assert_eq!(attempt, 1);
                prop_assert!(fold(&mut state, event).is_ok());
            }
        }
    }
}
