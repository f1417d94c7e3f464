//! What reviewers need (issue 19): an edit replaces a call with the
//! reviewer's arguments and needs a grant of its own; N-of-M approvals
//! count distinct approvers and any denial vetoes; a batch decides many
//! calls, each bound to its digest, atomically with all_or_nothing. Races:
//! two approvers at once, an edit against a grant, a batch against a
//! single decision.

use aaa::proto::{
    watch_approvals_response::Item, ApprovalOutcome, BatchDecision, DecideApprovalsRequest,
    DecisionItem, DecisionStatus, ToolDefinition, ToolRef,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::Code;

use crate::auth::{auth_toml, start_with_auth, token};
use crate::support::*;

const EDITED_ARGS: &str = r#"{"amount":200,"to":"ACME"}"#;

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// wire_money needing `n` grants.
fn wire_money_needing(n: u32) -> ToolDefinition {
    ToolDefinition {
        approvals_required: n,
        ..wire_money()
    }
}

fn edit(call_id: &str, arguments: &str, reason: &str, grant: bool) -> serde_json::Value {
    json!({
        "call_id": call_id,
        "arguments": serde_json::from_str::<serde_json::Value>(arguments).unwrap(),
        "arguments_sha256": sha256_hex(REFERENCE_ARGS),
        "reason": reason,
        "grant": grant,
    })
}

fn vote(call_id: &str, approver: &str) -> serde_json::Value {
    json!({ "call_id": call_id, "approver": approver })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_call_runs_only_with_a_grant_of_its_own_arguments() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    // Edits that cannot stand are refused and record nothing.
    let before = get_run(&mut runs, &run_id).await.last_seq;
    for (arguments, why) in [
        (r#"{"amount":"lots","to":"ACME"}"#, "schema"),
        (REFERENCE_ARGS, "the arguments requested"),
    ] {
        let refused = signal(
            &mut runs,
            &run_id,
            "aaa.approval.edited",
            edit(&call_id, arguments, "", false),
        )
        .await
        .expect_err(why);
        let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
        assert_eq!(info.metadata["field"], "data_json.arguments", "{why}");
    }
    let mut stale = edit(&call_id, EDITED_ARGS, "", false);
    stale["arguments_sha256"] = json!(sha256_hex(r#"{"amount":1,"to":"ACME"}"#));
    let refused = signal(&mut runs, &run_id, "aaa.approval.edited", stale)
        .await
        .expect_err("an edit bound to other arguments");
    assert_error(&refused, Code::FailedPrecondition, "ARGUMENTS_MISMATCH");
    // A vote is the engine's record of a grant: clients cannot forge one.
    let forged =
        json!({"call_id": call_id, "approver": "alice", "votes": 2, "approvals_required": 1});
    let refused = signal(&mut runs, &run_id, "aaa.approval.voted", forged)
        .await
        .expect_err("a forged vote");
    assert_error(&refused, Code::InvalidArgument, "RESERVED_EVENT_TYPE");
    assert_eq!(get_run(&mut runs, &run_id).await.last_seq, before);

    let answer = signal(
        &mut runs,
        &run_id,
        "aaa.approval.edited",
        edit(&call_id, EDITED_ARGS, "over the cap", false),
    )
    .await
    .expect("edit");
    assert_eq!(answer.decision, "aaa.approval.edited");
    assert_eq!(answer.new_arguments_sha256, sha256_hex(EDITED_ARGS));
    let new_call = answer.new_call_id.clone();
    assert_ne!(new_call, call_id);

    // The log keeps both argument sets and who edited why; the new call
    // waits for a grant of its own (the edit's answer came once all of it
    // was durable).
    let events = history(&mut runs, &run_id).await;
    let edited = data(find(&events, "aaa.approval.edited"));
    assert_eq!(edited["call_id"], call_id.as_str());
    assert_eq!(edited["arguments_sha256"], sha256_hex(REFERENCE_ARGS));
    assert_eq!(edited["new_call_id"], new_call.as_str());
    assert_eq!(
        edited["new_arguments"],
        json!({"amount": 200, "to": "ACME"})
    );
    assert_eq!(edited["reason"], "over the cap");
    let requested: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "aaa.approval.requested")
        .map(data)
        .collect();
    assert_eq!(requested.len(), 2);
    assert_eq!(requested[1]["call_id"], new_call.as_str());
    assert_eq!(requested[1]["edited_from"], call_id.as_str());
    assert_eq!(requested[1]["arguments_sha256"], sha256_hex(EDITED_ARGS));
    let pending = get_run(&mut runs, &run_id).await.pending_approvals;
    assert_eq!(pending.len(), 1, "only the edited call waits");
    assert_eq!(pending[0].call_id, new_call);
    assert_eq!(pending[0].edited_from, call_id);
    assert_eq!(pending[0].arguments_json, EDITED_ARGS);
    assert_eq!(
        poll(&mut workers, "w", &["wire_money"], &[], 0.3).await,
        None,
        "nothing runs before the edited call's grant"
    );

    // The original is decided: a grant of it changes nothing. A grant of
    // the new call bound to the old arguments is refused.
    let late = grant(&mut runs, &run_id, &call_id).await;
    assert!(late.already_decided);
    assert_eq!(late.decision, "aaa.approval.edited");
    let wrong = json!({"call_id": new_call, "arguments_sha256": sha256_hex(REFERENCE_ARGS)});
    let refused = signal(&mut runs, &run_id, "aaa.approval.granted", wrong)
        .await
        .expect_err("a grant of the old arguments");
    assert_error(&refused, Code::FailedPrecondition, "ARGUMENTS_MISMATCH");

    let right = json!({"call_id": new_call, "arguments_sha256": sha256_hex(EDITED_ARGS)});
    signal(&mut runs, &run_id, "aaa.approval.granted", right)
        .await
        .expect("grant of the edited call");
    let task = poll_until_task(&mut workers, "w", &["wire_money"], &[]).await;
    assert_eq!(task.call_id, new_call);
    assert_eq!(tool_task(&task).arguments_json, EDITED_ARGS);
    complete_tool(&mut workers, &task.token, "\"sent $200 to ACME\"")
        .await
        .expect("CompleteTask");

    // The model reads the result as the answer to its own call, with what
    // the reviewer changed and why.
    let events = wait_for_end(&mut runs, &run_id).await;
    let text = completed_text(&events);
    assert!(text.ends_with("sent $200 to ACME"), "{text}");
    assert!(
        text.contains(EDITED_ARGS) && text.contains("over the cap"),
        "{text}"
    );
    assert_eq!(count(&events, "aaa.tool.started"), 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edit_with_a_grant_runs_the_edited_call_at_once_and_watchers_see_it() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    let mut approvals = server.approvals().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let mut watch = watch_approvals(&mut approvals, Default::default()).await;
    assert_eq!(read_snapshot(&mut watch).await.len(), 1);

    let answer = signal(
        &mut runs,
        &run_id,
        "aaa.approval.edited",
        edit(&call_id, EDITED_ARGS, "cap", true),
    )
    .await
    .expect("edit and grant");
    let task = poll_until_task(&mut workers, "w", &["wire_money"], &[]).await;
    assert_eq!(task.call_id, answer.new_call_id);
    assert_eq!(tool_task(&task).arguments_json, EDITED_ARGS);
    let events = history(&mut runs, &run_id).await;
    let granted = find(&events, "aaa.approval.granted");
    assert_eq!(data(granted)["call_id"], answer.new_call_id.as_str());
    assert_eq!(
        granted.actor.as_ref().unwrap().name,
        find(&events, "aaa.approval.edited")
            .actor
            .as_ref()
            .unwrap()
            .name,
        "the editor's grant"
    );

    // The watcher: the original resolved as edited (naming its
    // replacement), the new request, its grant.
    let Item::Resolved(resolved) = next_watch_item(&mut watch).await else {
        panic!("expected the edit's resolution")
    };
    assert_eq!(resolved.outcome, ApprovalOutcome::Edited as i32);
    assert_eq!(resolved.replaced_by, answer.new_call_id);
    let Item::Requested(requested) = next_watch_item(&mut watch).await else {
        panic!("expected the edited call's request")
    };
    assert_eq!(requested.edited_from, call_id);
    let Item::Resolved(resolved) = next_watch_item(&mut watch).await else {
        panic!("expected the grant")
    };
    assert_eq!(resolved.outcome, ApprovalOutcome::Granted as i32);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_of_three_needs_two_distinct_approvers_and_one_denial_vetoes() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    let mut approvals = server.approvals().await;
    register(&mut workers, vec![wire_money_needing(2)], &[]).await;

    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let first = signal(
        &mut runs,
        &run_id,
        "aaa.approval.granted",
        vote(&call_id, "alice"),
    )
    .await
    .expect("alice's vote");
    assert_eq!(first.decision, "aaa.approval.voted");
    assert_eq!((first.votes, first.approvals_required), (1, 2));
    let again = signal(
        &mut runs,
        &run_id,
        "aaa.approval.granted",
        vote(&call_id, "alice"),
    )
    .await
    .expect_err("alice votes twice");
    let info = assert_error(&again, Code::FailedPrecondition, "ALREADY_VOTED");
    assert_eq!(info.metadata["approver"], "alice");
    assert_eq!(
        poll(&mut workers, "w", &["wire_money"], &[], 0.3).await,
        None,
        "one grant of two runs nothing"
    );
    let listed = list_approvals(&mut approvals, Default::default()).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].approvals_required, 2);
    assert_eq!(listed[0].votes.len(), 1);
    assert_eq!(listed[0].votes[0].approver, "alice");

    let second = signal(
        &mut runs,
        &run_id,
        "aaa.approval.granted",
        vote(&call_id, "bob"),
    )
    .await
    .expect("bob's vote");
    assert_eq!(second.decision, "aaa.approval.granted");
    let task = poll_until_task(&mut workers, "w", &["wire_money"], &[]).await;
    assert_eq!(task.call_id, call_id);
    let events = history(&mut runs, &run_id).await;
    assert_eq!(
        data(find(&events, "aaa.approval.granted"))["approvers"],
        json!(["alice", "bob"])
    );
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    wait_for_end(&mut runs, &run_id).await;

    // A vote, then a denial: denied.
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    signal(
        &mut runs,
        &run_id,
        "aaa.approval.granted",
        vote(&call_id, "alice"),
    )
    .await
    .expect("alice's vote");
    let denied = json!({"call_id": call_id, "reason": "not this vendor", "approver": "carol"});
    signal(&mut runs, &run_id, "aaa.approval.denied", denied)
        .await
        .expect("carol's veto");
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(count(&events, "aaa.tool.started"), 0);
    let failed = data(find(&events, "aaa.tool.failed"));
    assert_eq!(failed["error"]["type"], "ApprovalDenied");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_may_raise_the_approvers_a_tool_needs_never_lower_them() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money_needing(2)], &[]).await;
    for (asked, needed) in [(3, 3), (1, 2)] {
        let mut request = scripted_reference_run();
        request.tools = vec![ToolRef {
            name: "wire_money".into(),
            approvals_required: asked,
            ..Default::default()
        }];
        let run_id = start_run(&mut runs, request).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        let answer = signal(
            &mut runs,
            &run_id,
            "aaa.approval.granted",
            vote(&call_id, "a"),
        )
        .await
        .expect("vote");
        assert_eq!(answer.approvals_required, needed, "asked for {asked}");
    }
    let mut request = scripted_reference_run();
    request.tools[0].approvals_required = 1000;
    let refused = runs.start_run(request).await.expect_err("1000 approvers");
    let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "tools[0].approvals_required");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_approvers_at_once_make_one_grant() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money_needing(2)], &[]).await;
    let mut runs = server.runs().await;
    for _ in 0..10 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        let (mut a, mut b) = (server.runs().await, server.runs().await);
        let (ra, rb) = tokio::join!(
            signal(
                &mut a,
                &run_id,
                "aaa.approval.granted",
                vote(&call_id, "alice")
            ),
            signal(
                &mut b,
                &run_id,
                "aaa.approval.granted",
                vote(&call_id, "bob")
            ),
        );
        let mut decisions = vec![ra.expect("alice").decision, rb.expect("bob").decision];
        decisions.sort();
        assert_eq!(decisions, ["aaa.approval.granted", "aaa.approval.voted"]);
        let events = history(&mut runs, &run_id).await;
        assert_eq!(count(&events, "aaa.approval.voted"), 1);
        assert_eq!(count(&events, "aaa.approval.granted"), 1);
        assert!(
            find(&events, "aaa.approval.voted").seq < find(&events, "aaa.approval.granted").seq
        );
        runs.cancel_run(aaa::proto::CancelRunRequest {
            run_id,
            reason: "done".into(),
        })
        .await
        .expect("cancel");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edit_racing_a_grant_leaves_one_decision() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    for _ in 0..10 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        let (mut a, mut b) = (server.runs().await, server.runs().await);
        let (granted, edited) = tokio::join!(
            grant(&mut a, &run_id, &call_id),
            signal(
                &mut b,
                &run_id,
                "aaa.approval.edited",
                edit(&call_id, EDITED_ARGS, "cap", false)
            ),
        );
        let edited = edited.expect("edit");
        // Exactly one of them decided the call; the other was told so.
        assert_ne!(granted.already_decided, edited.already_decided);
        let events = history(&mut runs, &run_id).await;
        let decisions =
            count(&events, "aaa.approval.granted") + count(&events, "aaa.approval.edited");
        assert_eq!(decisions, 1);
        runs.cancel_run(aaa::proto::CancelRunRequest {
            run_id,
            reason: "done".into(),
        })
        .await
        .expect("cancel");
    }
    server.shutdown().await;
}

fn item(run_id: &str, call_id: &str, arguments: &str) -> DecisionItem {
    DecisionItem {
        run_id: run_id.into(),
        call_id: call_id.into(),
        arguments_sha256: sha256_hex(arguments),
    }
}

fn batch(
    items: Vec<DecisionItem>,
    decision: BatchDecision,
    all_or_nothing: bool,
) -> DecideApprovalsRequest {
    DecideApprovalsRequest {
        items,
        decision: decision as i32,
        reason: "batch reason".into(),
        comment: "batch comment".into(),
        all_or_nothing,
        approver: String::new(),
        request_id: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_decides_each_item_against_its_own_digest() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    let mut approvals = server.approvals().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut pending = Vec::new();
    for _ in 0..4 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        pending.push((run_id, call_id));
    }
    let [a, b, c, d] = &pending[..] else {
        unreachable!()
    };
    let decided_before = grant(&mut runs, &d.0, &d.1).await;
    assert!(!decided_before.already_decided);
    let missing_run = "0190f5b2-0000-7000-8000-000000000000";

    // all_or_nothing with one stale digest: nothing is decided.
    let items = vec![
        item(&a.0, &a.1, REFERENCE_ARGS),
        item(&b.0, &b.1, EDITED_ARGS),
        item(&c.0, &c.1, REFERENCE_ARGS),
    ];
    let answer = approvals
        .decide_approvals(batch(items.clone(), BatchDecision::Grant, true))
        .await
        .expect("DecideApprovals")
        .into_inner();
    let statuses: Vec<i32> = answer.results.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            DecisionStatus::NotApplied as i32,
            DecisionStatus::Mismatch as i32,
            DecisionStatus::NotApplied as i32
        ]
    );
    assert_eq!(answer.results[1].error_reason, "ARGUMENTS_MISMATCH");
    assert_eq!(
        list_approvals(&mut approvals, Default::default())
            .await
            .len(),
        3
    );

    // Without it: each item on its own.
    let mut items = items;
    items.push(item(&d.0, &d.1, REFERENCE_ARGS));
    items.push(item(missing_run, "call-1", REFERENCE_ARGS));
    items.push(item(&a.0, "call-9", REFERENCE_ARGS));
    let answer = approvals
        .decide_approvals(batch(items, BatchDecision::Grant, false))
        .await
        .expect("DecideApprovals")
        .into_inner();
    let statuses: Vec<i32> = answer.results.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            DecisionStatus::Decided as i32,
            DecisionStatus::Mismatch as i32,
            DecisionStatus::Decided as i32,
            DecisionStatus::AlreadyDecided as i32,
            DecisionStatus::NotFound as i32,
            DecisionStatus::NotFound as i32,
        ]
    );
    assert_eq!(answer.results[3].decision, "aaa.approval.granted");
    for (result, (run_id, _)) in answer.results.iter().zip([a, b, c]) {
        let events = history(&mut runs, run_id).await;
        if result.status == DecisionStatus::Decided as i32 {
            let granted = find(&events, "aaa.approval.granted");
            assert_eq!(granted.seq, result.seq);
            assert_eq!(data(granted)["comment"], "batch comment");
        } else {
            assert_eq!(count(&events, "aaa.approval.granted"), 0);
        }
    }

    // A denial batch; a call named twice is refused as a whole.
    let twice = vec![
        item(&b.0, &b.1, REFERENCE_ARGS),
        item(&b.0, &b.1, REFERENCE_ARGS),
    ];
    let refused = approvals
        .decide_approvals(batch(twice, BatchDecision::Deny, false))
        .await
        .expect_err("a call twice");
    let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "items[1]");
    let answer = approvals
        .decide_approvals(batch(
            vec![item(&b.0, &b.1, REFERENCE_ARGS)],
            BatchDecision::Deny,
            false,
        ))
        .await
        .expect("deny batch")
        .into_inner();
    assert_eq!(answer.results[0].status, DecisionStatus::Decided as i32);
    let events = wait_for_end(&mut runs, &b.0).await;
    assert_eq!(
        data(find(&events, "aaa.tool.failed"))["error"]["message"],
        "batch reason"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_racing_single_decisions_decides_each_call_once() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    for _ in 0..5 {
        let mut pending = Vec::new();
        for _ in 0..6 {
            let run_id = start_run(&mut runs, scripted_reference_run()).await;
            let call_id = wait_for_approval(&mut runs, &run_id).await;
            pending.push((run_id, call_id));
        }
        let items: Vec<_> = pending
            .iter()
            .map(|(run, call)| item(run, call, REFERENCE_ARGS))
            .collect();
        let mut approvals = server.approvals().await;
        let mut single = server.runs().await;
        let (batched, denials) = tokio::join!(
            approvals.decide_approvals(batch(items, BatchDecision::Grant, false)),
            async {
                let mut answers = Vec::new();
                for (run_id, call_id) in pending.iter().step_by(2) {
                    answers.push(deny(&mut single, run_id, call_id, "no").await);
                }
                answers
            }
        );
        let batched = batched.expect("DecideApprovals").into_inner();
        for (run_id, _) in &pending {
            let events = history(&mut runs, run_id).await;
            let decisions =
                count(&events, "aaa.approval.granted") + count(&events, "aaa.approval.denied");
            assert_eq!(decisions, 1, "one decision per call");
        }
        let won_by_batch = batched
            .results
            .iter()
            .filter(|r| r.status == DecisionStatus::Decided as i32)
            .count();
        let won_by_denials = denials.iter().filter(|d| !d.already_decided).count();
        assert_eq!(won_by_batch + won_by_denials, 6);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_auth_votes_count_principals_and_the_starter_stays_out() {
    let server = start_with_auth(auth_toml(true)).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    register_as(&mut worker, vec![wire_money_needing(2)]).await;
    let mut duo = Clients::with_token(&server, &token("duo")).await;
    let mut approver = Clients::with_token(&server, &token("approver")).await;
    let mut admin = Clients::with_token(&server, &token("admin")).await;
    let run_id = duo
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = duo.wait_for_event(&run_id, "aaa.approval.requested").await;
    let call_id = call_id(events.last().unwrap());

    // The starter may not vote, alone or in a batch.
    let starter = duo
        .runs
        .signal(grant_request(&run_id, &call_id))
        .await
        .expect_err("the starter's vote");
    assert_error(&starter, Code::PermissionDenied, "SEPARATION_OF_DUTIES");
    let answer = duo
        .approvals
        .decide_approvals(batch(
            vec![item(&run_id, &call_id, REFERENCE_ARGS)],
            BatchDecision::Grant,
            false,
        ))
        .await
        .expect("DecideApprovals")
        .into_inner();
    assert_eq!(answer.results[0].status, DecisionStatus::Refused as i32);
    assert_eq!(answer.results[0].error_reason, "SEPARATION_OF_DUTIES");

    // A principal cannot vote under another name, nor twice.
    let posing = json!({"call_id": call_id, "approver": "admin"});
    let refused = approver
        .runs
        .signal(aaa::proto::SignalRequest {
            run_id: run_id.clone(),
            r#type: "aaa.approval.granted".into(),
            data_json: posing.to_string(),
            request_id: String::new(),
        })
        .await
        .expect_err("posing as another approver");
    assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    let first = approver
        .approvals
        .decide_approvals(batch(
            vec![item(&run_id, &call_id, REFERENCE_ARGS)],
            BatchDecision::Grant,
            false,
        ))
        .await
        .expect("DecideApprovals")
        .into_inner();
    assert_eq!(first.results[0].decision, "aaa.approval.voted");
    let twice = approver
        .runs
        .signal(grant_request(&run_id, &call_id))
        .await
        .expect_err("a second vote");
    assert_error(&twice, Code::FailedPrecondition, "ALREADY_VOTED");
    admin
        .runs
        .signal(grant_request(&run_id, &call_id))
        .await
        .expect("admin's vote");
    let events = duo.wait_for_event(&run_id, "aaa.approval.granted").await;
    assert_eq!(
        data(events.last().unwrap())["approvers"],
        json!(["approver", "admin"])
    );
    server.shutdown().await;
}

async fn register_as(clients: &mut Clients, tools: Vec<ToolDefinition>) {
    clients
        .workers
        .register_worker(aaa::proto::RegisterWorkerRequest {
            identity: "payments-1".into(),
            tools,
            models: vec![],
        })
        .await
        .expect("RegisterWorker");
}

/// Votes do not extend a request: its approval timeout runs from the
/// request, and a call with one vote of two is denied when it passes.
#[tokio::test(flavor = "multi_thread")]
async fn the_approval_timeout_applies_to_the_whole_request() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let tool = ToolDefinition {
        approval_timeout_s: 600.0,
        ..wire_money_needing(2)
    };
    register(&mut server.workers().await, vec![tool], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    server.clock().advance(std::time::Duration::from_secs(300));
    signal(
        &mut runs,
        &run_id,
        "aaa.approval.granted",
        vote(&call_id, "alice"),
    )
    .await
    .expect("alice's vote");
    server.clock().advance(std::time::Duration::from_secs(301));
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        data(find(&events, "aaa.approval.denied"))["reason"],
        "timeout"
    );
    assert_eq!(count(&events, "aaa.tool.started"), 0);
    server.shutdown().await;
}
