//! `aaa migrate`: a copy serves exactly what the original did, and goes on
//! from there (runs finish, retries keep their answers, positions stay).

use std::process::Command;

use aaa::proto::{CreateGrantRequest, ListGrantsRequest, RunStatus, StartRunRequest};

use crate::support::*;

/// Runs `aaa migrate FROM TO`; returns (success, stdout, stderr).
fn migrate(from: &str, to: &str) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_aaa"))
        .args(["migrate", from, to])
        .output()
        .expect("run aaa migrate");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into(),
        String::from_utf8_lossy(&output.stderr).into(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_migrated_store_serves_what_the_original_did() {
    let mut original = TestServer::start().await;
    let mut runs = original.runs().await;
    let mut workers = original.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let with_id = StartRunRequest {
        request_id: "start-1".into(),
        ..scripted_reference_run()
    };
    // The first run's call is granted by a single-use standing grant.
    let mut grants = Clients::new(original.channel().await, None).grants;
    let grant = grants
        .create_grant(CreateGrantRequest {
            tool: "wire_money".into(),
            max_uses: 1,
            reason: "migrated".into(),
            ..Default::default()
        })
        .await
        .expect("CreateGrant")
        .into_inner()
        .grant
        .unwrap();
    let finished = start_run(&mut runs, with_id.clone()).await;
    let task = poll_until_task(&mut workers, "w", &["wire_money"], &[]).await;
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    wait_for_end(&mut runs, &finished).await;
    let waiting = start_run(&mut runs, scripted_reference_run()).await;
    let waiting_call = wait_for_approval(&mut runs, &waiting).await;
    let pending = list_approvals(&mut original.approvals().await, Default::default()).await;
    let history_before = history(&mut runs, &finished).await;
    original.stop().await;

    // Across the two kinds of store and back, when this run has a
    // PostgreSQL: embedded -> PostgreSQL -> embedded, or (with every server
    // on PostgreSQL) PostgreSQL -> embedded -> PostgreSQL.
    let (between, last) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir_of = |dir: &tempfile::TempDir| dir.path().display().to_string();
    let between = match on_postgres() {
        true => dir_of(&between),
        false => fresh_postgres_store().unwrap_or_else(|| dir_of(&between)),
    };
    let last_store = match on_postgres() {
        true => {
            let url = fresh_postgres_store().unwrap();
            std::fs::write(last.path().join("store-url"), &url).unwrap();
            url
        }
        false => dir_of(&last),
    };
    let from = original.store_location();
    for (from, to) in [(&from, &between), (&between, &last_store)] {
        let (ok, stdout, stderr) = migrate(from, to);
        assert!(ok, "aaa migrate failed: {stderr}");
        assert!(stdout.contains("copied and verified:"), "{stdout}");
        assert!(stdout.contains(" 2 runs, 1 pending approvals"), "{stdout}");
        assert!(stdout.contains(" 1 grants, 1 grant uses"), "{stdout}");
    }

    // Into a store that is not empty: refused, by name.
    let (ok, _, stderr) = migrate(&from, &between);
    assert!(!ok);
    assert!(stderr.contains("the destination is not empty"), "{stderr}");

    let server = TestServer::start_on(last, None).await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    assert_eq!(history(&mut runs, &finished).await, history_before);
    assert_eq!(
        list_approvals(&mut server.approvals().await, Default::default()).await,
        pending
    );
    // The grant, used up.
    let listed = Clients::new(server.channel().await, None)
        .grants
        .list_grants(ListGrantsRequest {
            include_revoked: true,
            tool: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .grants;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].uses, listed[0].uses_left),
        (grant.id.as_str(), 1, Some(0))
    );
    // A retried start gets the original run; the waiting run goes on.
    let retried = runs.start_run(with_id).await.unwrap().into_inner();
    assert_eq!(
        (retried.run_id.as_str(), retried.created),
        (finished.as_str(), false)
    );
    grant_and_finish(&mut runs, &mut workers, &waiting, &waiting_call).await;
    assert_eq!(
        get_run(&mut runs, &waiting).await.status,
        RunStatus::Completed as i32
    );
    server.shutdown().await;
}
