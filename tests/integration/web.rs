//! The web inbox in a real headless Chromium against a real `aaa serve`:
//! sign-in, a run started over gRPC appearing live and approved from the
//! page (by keyboard) until the worker runs that exact call, a denial whose
//! reason the model reads, refused tokens and forms without the session's
//! CSRF token, two people's sessions as two actors, model values shown as
//! text, the pages on a 375 px phone, 10,000 pending calls a page at a
//! time, and SSE streams that end when the server stops. With
//! `AAA_WEB_SCREENSHOTS=1` the screenshots go to docs/ (see docs/web.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aaa::auth::{sha256_hex, AuthConfig};
use aaa::proto::{
    ListApprovalsRequest, PollTaskRequest, RegisterWorkerRequest, StartRunRequest, Task,
    ToolDefinition,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::browser::Driver;
use crate::support::*;

/// ops (admin: starts runs, serves the tool), alice and bob (approver and
/// reader), wanda (approver only). Each token is "token-NAME".
fn auth_toml() -> String {
    auth_toml_of(&[
        ("ops", "[\"admin\"]", "token-ops"),
        ("alice", "[\"approver\", \"reader\"]", "token-alice"),
        ("bob", "[\"approver\", \"reader\"]", "token-bob"),
        ("wanda", "[\"approver\"]", "token-wanda"),
    ])
}

/// An auth config of these principals: (name, roles as TOML, token).
fn auth_toml_of(principals: &[(&str, &str, &str)]) -> String {
    let mut text = String::new();
    for (name, roles, token) in principals {
        text.push_str(&format!(
            "[[principal]]\nname = \"{name}\"\nroles = {roles}\ntoken_sha256 = \"{}\"\n\n",
            sha256_hex(token.as_bytes())
        ));
    }
    text
}

async fn start_with_auth() -> TestServer {
    let auth = Arc::new(AuthConfig::parse(&auth_toml(), Path::new(".")).expect("auth config"));
    TestServer::start_with(move |config| config.auth = Some(auth.clone())).await
}

fn base(server: &TestServer) -> String {
    format!("http://{}", server.addr())
}

/// Where screenshots go: docs/ with `AAA_WEB_SCREENSHOTS` set, else a
/// temp dir (they are taken either way).
fn shots() -> (Option<tempfile::TempDir>, PathBuf) {
    if std::env::var_os("AAA_WEB_SCREENSHOTS").is_some() {
        return (None, Path::new(env!("CARGO_MANIFEST_DIR")).join("docs"));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_path_buf();
    (Some(dir), path)
}

/// The reference tool with a description, and a run of it.
async fn register_wire_money(clients: &mut Clients, approvals_required: u32) {
    clients
        .workers
        .register_worker(RegisterWorkerRequest {
            identity: "payments-1".into(),
            tools: vec![ToolDefinition {
                approvals_required,
                ..wire_money()
            }],
            models: vec![],
        })
        .await
        .expect("RegisterWorker");
}

/// Serves one task of wire_money as the worker "payments-1", completing it
/// with the reference output; returns the task.
async fn serve_one_call(clients: &mut Clients) -> Task {
    let give_up = tokio::time::Instant::now() + WAIT;
    loop {
        let request = PollTaskRequest {
            identity: "payments-1".into(),
            tools: vec!["wire_money".into()],
            models: vec![],
            wait_s: 1.0,
        };
        let task = clients
            .workers
            .poll_task(request)
            .await
            .expect("PollTask")
            .into_inner()
            .task;
        if let Some(task) = task {
            clients
                .workers
                .complete_task(aaa::proto::CompleteTaskRequest {
                    token: task.token.clone(),
                    result: Some(aaa::proto::complete_task_request::Result::OutputJson(
                        REFERENCE_OUTPUT.into(),
                    )),
                })
                .await
                .expect("CompleteTask");
            return task;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "no wire_money task within {WAIT:?}"
        );
    }
}

fn key(run_id: &str, call_id: &str) -> String {
    format!("{run_id}/{call_id}")
}

/// A CSS selector of the inbox row of a call.
fn row(run_id: &str, call_id: &str) -> String {
    format!("#inbox li[data-key=\"{}\"]", key(run_id, call_id))
}

fn actor_name(event: &aaa::proto::Event) -> String {
    event
        .actor
        .as_ref()
        .map(|a| a.name.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_run_started_over_grpc_appears_live_and_is_approved_from_the_page_by_keyboard() {
    let server = start_with_auth().await;
    let mut ops = Clients::with_token(&server, "token-ops").await;
    register_wire_money(&mut ops, 1).await;
    let driver = Driver::start();
    let alice = driver.browser().await;
    let base = base(&server);
    alice.sign_in(&base, Some("token-alice")).await;
    assert_eq!(alice.text(".who").await, "alice");
    alice
        .wait_until(
            "document.getElementById('empty').hidden === false",
            "an empty inbox",
        )
        .await;

    // Started over gRPC while the inbox is open: it appears, no reload.
    alice.eval("window.sameDocument = true; return 1;").await;
    let run_id = ops
        .runs
        .start_run(StartRunRequest {
            labels: [("team".to_string(), "payments".to_string())].into(),
            ..scripted_reference_run()
        })
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    alice
        .wait_until(
            &format!(
                "document.querySelector('{}') !== null",
                row(&run_id, "call-1")
            ),
            "the new request in the inbox",
        )
        .await;
    assert_eq!(
        alice.eval("return window.sameDocument === true;").await,
        Value::Bool(true)
    );
    alice
        .wait_until(
            "document.title.startsWith('(1) ')",
            "the count in the title",
        )
        .await;
    let shown = alice.text(&row(&run_id, "call-1")).await;
    assert!(
        shown.contains("wire_money") && shown.contains("Pay ACME $250"),
        "{shown}"
    );
    assert!(shown.contains("team=payments"), "{shown}");

    // Open it: the call's page shows what the model wants and why.
    alice
        .find(&format!("{} a.open", row(&run_id, "call-1")))
        .await
        .click()
        .await
        .expect("click");
    alice
        .wait_until(
            "document.getElementById('arguments') !== null",
            "the call's page",
        )
        .await;
    assert_eq!(alice.path().await, format!("/calls/{run_id}/call-1"));
    let arguments: Value = serde_json::from_str(&alice.text("#arguments").await).unwrap();
    assert_eq!(arguments.to_string(), REFERENCE_ARGS);
    assert!(alice.text("#arguments").await.contains("\"amount\": 250"));
    assert_eq!(alice.text("#task").await, "Pay ACME $250");
    assert!(alice.text("#starter").await.contains("ops"));
    let conversation = alice.text("#conversation").await;
    assert!(conversation.contains("Pay ACME $250"), "{conversation}");
    assert!(conversation.contains("wire_money"), "{conversation}");
    assert!(alice.text("main").await.contains("Wire money to a payee"));

    // Keyboard only: type a comment, Tab to Approve, Enter.
    let comment = alice.find("#comment").await;
    comment.send_keys("paid as agreed").await.expect("type");
    comment.send_keys("\u{E004}").await.expect("tab");
    let focused = alice.client.active_element().await.expect("focus");
    assert_eq!(
        focused.attr("id").await.expect("id").as_deref(),
        Some("approve")
    );
    focused.send_keys("\u{E007}").await.expect("enter");
    alice
        .wait_until(
            "(document.getElementById('notice') || {}).textContent === 'Your decision was recorded: granted.'",
            "the recorded grant",
        )
        .await;

    // The worker runs exactly the call shown, and the run completes.
    let task = serve_one_call(&mut ops).await;
    assert_eq!(task.run_id, run_id);
    let tool = tool_task(&task);
    assert_eq!(
        (task.call_id.as_str(), tool.arguments_json.as_str()),
        ("call-1", REFERENCE_ARGS)
    );
    let events = ops.wait_for_event(&run_id, "aaa.run.completed").await;
    assert_eq!(completed_text(&events), REFERENCE_TEXT);
    let granted = find(&events, "aaa.approval.granted");
    assert_eq!(actor_name(granted), "alice");
    assert_eq!(data(granted)["comment"], "paid as agreed");
    assert_eq!(
        data(granted)["arguments_sha256"].as_str(),
        Some(sha256_hex(REFERENCE_ARGS.as_bytes()).as_str())
    );

    // The run's timeline, reachable from the call, shows it completed.
    alice
        .find("a[href^='/runs/']")
        .await
        .click()
        .await
        .expect("click");
    alice
        .wait_until(
            "(document.getElementById('run-status') || {}).textContent === 'completed'",
            "the completed run",
        )
        .await;
    assert!(alice.text("#timeline").await.contains("aaa.run.completed"));
    alice.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_denial_from_the_page_carries_its_reason_to_the_model() {
    // Auth off: the page says so, and works on loopback.
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let driver = Driver::start();
    let browser = driver.browser().await;
    let base = base(&server);
    // A link from a notification: straight to the call, no sign-in step
    // with auth off on loopback (this test went through a sign-in page
    // with one Continue button until issue 44).
    browser
        .goto(&format!("{base}/calls/{run_id}/{call_id}"))
        .await;
    browser
        .wait_until(
            "document.getElementById('reason') !== null",
            "the call's page",
        )
        .await;
    assert!(browser.text(".warning").await.contains("Auth is off"));
    assert_eq!(browser.path().await, format!("/calls/{run_id}/{call_id}"));

    let reason = "over budget this month, ask finance";
    browser.type_into("#reason", reason).await;
    browser.find("#deny").await.click().await.expect("click");
    browser
        .wait_until(
            "(document.getElementById('notice') || {}).textContent === 'Your decision was recorded: denied.'",
            "the recorded denial",
        )
        .await;
    let events = wait_for_end(&mut runs, &run_id).await;
    let denied = find(&events, "aaa.approval.denied");
    assert_eq!(data(denied)["reason"], reason);
    // With auth off the actor is the browser's address.
    assert!(actor_name(denied).starts_with("127.0.0.1:"), "{denied:?}");
    let echoed = completed_text(&events);
    assert!(echoed.contains(reason), "the model's echo: {echoed}");
    assert!(browser.text("#status").await.contains("denied"));
    browser.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn with_auth_off_the_inbox_opens_at_once_and_decisions_carry_the_typed_name() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let driver = Driver::start();
    let browser = driver.browser().await;
    let base = base(&server);
    // The printed URL shows the inbox itself, no sign-in step.
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_until(
            "document.getElementById('inbox') !== null",
            "the inbox at once",
        )
        .await;
    assert_eq!(browser.path().await, "/");
    let hint = browser.text("form.approver .hint").await;
    assert!(hint.contains("under your address only"), "{hint}");

    // A name that cannot travel is refused, saying what a name may hold.
    browser.type_into("#approver", "Ann; DROP").await;
    browser
        .find("#save-approver")
        .await
        .click()
        .await
        .expect("click");
    browser
        .wait_until("document.getElementById('error') !== null", "the refusal")
        .await;
    assert!(browser.text("#error").await.contains("letters, digits"));

    // Typed once, from the call's page: kept, and back on that page.
    let page = format!("/calls/{run_id}/{call_id}");
    browser.goto(&format!("{base}{page}")).await;
    browser.type_into("#approver", "Ann Lee").await;
    browser
        .find("#save-approver")
        .await
        .click()
        .await
        .expect("click");
    browser
        .wait_until(
            "document.getElementById('who').textContent.startsWith('Ann Lee (unverified, 127.0.0.1)')",
            "the name kept",
        )
        .await;
    assert_eq!(browser.path().await, page);
    browser.goto(&format!("{base}/")).await;
    assert_eq!(
        browser
            .eval("return document.getElementById('approver').value;")
            .await,
        "Ann Lee"
    );

    browser.goto(&format!("{base}{page}")).await;
    browser.find("#approve").await.click().await.expect("click");
    browser
        .wait_until(
            "(document.getElementById('notice') || {}).textContent === 'Your decision was recorded: granted.'",
            "the recorded grant",
        )
        .await;
    // The confirmation reads as success (the stylesheet's --ok), not amber.
    let color = browser
        .eval("return getComputedStyle(document.getElementById('notice')).color;")
        .await;
    assert_eq!(color, "rgb(23, 114, 58)");

    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let events = wait_for_end(&mut runs, &run_id).await;
    worker.stop().await;
    let granted = find(&events, "aaa.approval.granted");
    // Who approved: the typed name, marked unverified, beside the address.
    assert_eq!(actor_name(granted), "Ann Lee (unverified, 127.0.0.1)");
    browser.goto(&format!("{base}{page}")).await;
    let status = browser.text("#status").await;
    assert!(
        status.contains("Ann Lee (unverified, 127.0.0.1)"),
        "{status}"
    );
    browser.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn an_edit_from_the_page_is_checked_against_the_schema_and_runs_as_edited() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let driver = Driver::start();
    let browser = driver.browser().await;
    let base = base(&server);
    browser.sign_in(&base, None).await;
    let page = format!("{base}/calls/{run_id}/{call_id}");
    browser.goto(&page).await;
    browser
        .wait_until("document.title.startsWith('(1) ')", "the count")
        .await;

    // A new request while reading this one moves nothing on the page.
    let top = "return document.getElementById('approve').getBoundingClientRect().top;";
    let before = browser.eval(top).await;
    let other = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &other).await;
    browser
        .wait_until("document.title.startsWith('(2) ')", "the new count")
        .await;
    assert_eq!(browser.eval(top).await, before, "the page moved");

    // Arguments that do not fit the tool's schema are refused, nothing recorded.
    browser
        .find("details.edit summary")
        .await
        .click()
        .await
        .expect("open");
    let edited = browser.find("#edited").await;
    edited.clear().await.expect("clear");
    edited
        .send_keys(r#"{"amount":"lots","to":"ACME"}"#)
        .await
        .expect("type");
    browser.find("#edit").await.click().await.expect("click");
    browser
        .wait_until("document.getElementById('error') !== null", "the refusal")
        .await;
    let error = browser.text("#error").await;
    assert!(error.contains("arguments"), "{error}");
    assert_eq!(wait_for_approval(&mut runs, &run_id).await, call_id);

    // A good edit, granted with it: the edited call runs with what was written.
    browser.goto(&page).await;
    browser
        .find("details.edit summary")
        .await
        .click()
        .await
        .expect("open");
    let edited = browser.find("#edited").await;
    edited.clear().await.expect("clear");
    edited
        .send_keys(r#"{"amount":200,"to":"ACME"}"#)
        .await
        .expect("type");
    browser.type_into("#edit-reason", "over the cap").await;
    browser.find("#edit").await.click().await.expect("click");
    browser
        .wait_until(
            "(document.getElementById('notice') || {}).textContent.startsWith('Your decision was recorded: edited and granted')",
            "the recorded edit",
        )
        .await;
    let moved_to = browser.path().await;
    assert!(
        moved_to.starts_with(&format!("/calls/{run_id}/")),
        "{moved_to}"
    );
    assert!(!moved_to.contains(&format!("/{call_id}?")), "{moved_to}");
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let events = wait_for_end(&mut runs, &run_id).await;
    let tasks = worker.stop().await;
    let edited = find(&events, "aaa.approval.edited");
    assert_eq!(data(edited)["reason"], "over the cap");
    let ran: Vec<_> = tasks.iter().filter(|t| t.run_id == run_id).collect();
    assert_eq!(ran.len(), 1);
    assert_eq!(
        tool_task(ran[0]).arguments_json,
        r#"{"amount":200,"to":"ACME"}"#
    );
    browser.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn tokens_csrf_and_two_people_each_recorded_as_themselves() {
    let server = start_with_auth().await;
    let mut ops = Clients::with_token(&server, "token-ops").await;
    register_wire_money(&mut ops, 2).await;
    let run_id = ops
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let call_id = ops.wait_for_event(&run_id, "aaa.approval.requested").await;
    let call_id = crate::support::call_id(call_id.last().unwrap());
    let base = base(&server);
    let call_page = format!("{base}/calls/{run_id}/{call_id}");
    let driver = Driver::start();

    // A wrong token is refused, and no session is made.
    let alice = driver.browser().await;
    alice.goto(&format!("{base}/signin")).await;
    alice.type_into("#token", "token-mallory").await;
    alice
        .find("form[action='/signin'] button")
        .await
        .click()
        .await
        .expect("click");
    alice
        .wait_until("document.getElementById('error') !== null", "the refusal")
        .await;
    assert!(alice.text("#error").await.contains("matches no principal"));
    alice.goto(&call_page).await;
    alice
        .wait_until("location.pathname === '/signin'", "sign-in again")
        .await;

    alice.sign_in(&base, Some("token-alice")).await;
    alice.goto(&call_page).await;
    alice
        .wait_until(
            "document.getElementById('approve') !== null",
            "the call's page",
        )
        .await;
    assert!(alice.text("#votes").await.contains("0 of 2"));
    let digest = sha256_hex(REFERENCE_ARGS.as_bytes());

    // A decision without the session's CSRF token (or with another's) is
    // refused and records nothing.
    let approve = format!("/calls/{run_id}/{call_id}/approve");
    let status = alice
        .post_from_page(&approve, &format!("sha256={digest}"))
        .await;
    assert_eq!(status, 403);
    let bob = driver.browser().await;
    bob.sign_in(&base, Some("token-bob")).await;
    let bobs_csrf = bob
        .eval("return document.querySelector('form.signout input[name=csrf]').value;")
        .await;
    let bobs_csrf = bobs_csrf.as_str().unwrap();
    let status = alice
        .post_from_page(&approve, &format!("sha256={digest}&csrf={bobs_csrf}"))
        .await;
    assert_eq!(status, 403);
    let pending = ops
        .approvals
        .list_approvals(ListApprovalsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(pending.len(), 1);
    assert!(pending[0].votes.is_empty(), "{pending:?}");

    // alice grants: one vote of two. bob's page shows it, and bob grants.
    alice.find("#approve").await.click().await.expect("click");
    alice
        .wait_until(
            "(document.getElementById('notice') || {}).textContent.indexOf('needs more') > 0",
            "alice's vote",
        )
        .await;
    bob.goto(&call_page).await;
    bob.wait_until(
        "document.getElementById('votes') !== null",
        "the call's page",
    )
    .await;
    let votes = bob.text("#votes").await;
    assert!(
        votes.contains("1 of 2") && votes.contains("alice"),
        "{votes}"
    );
    bob.find("#approve").await.click().await.expect("click");
    bob.wait_until(
        "(document.getElementById('notice') || {}).textContent === 'Your decision was recorded: granted.'",
        "bob's grant",
    )
    .await;
    serve_one_call(&mut ops).await;
    let events = ops.wait_for_event(&run_id, "aaa.run.completed").await;
    assert_eq!(actor_name(find(&events, "aaa.approval.voted")), "alice");
    assert_eq!(actor_name(find(&events, "aaa.approval.granted")), "bob");

    // Each sees the log with the actors as they were: bob his own grant.
    bob.goto(&format!("{base}/runs/{run_id}")).await;
    bob.wait_until(
        "document.getElementById('timeline') !== null",
        "the timeline",
    )
    .await;
    let granted = bob
        .eval("return [...document.querySelectorAll('#timeline li')].find(li => li.textContent.includes('aaa.approval.granted')).querySelector('.actor').textContent;")
        .await;
    assert_eq!(granted, "bob");

    // An approver without the reader role sees the call, not the
    // conversation (roles as over gRPC).
    let wanda = driver.browser().await;
    wanda.sign_in(&base, Some("token-wanda")).await;
    wanda.goto(&format!("{base}/runs/{run_id}")).await;
    wanda
        .wait_until("document.getElementById('error') !== null", "a refusal")
        .await;
    assert!(wanda.text("#error").await.contains("wanda may not call"));

    // Signing out ends the session.
    alice.goto(&base).await;
    alice
        .find("form.signout button")
        .await
        .click()
        .await
        .expect("click");
    alice
        .wait_until("location.pathname === '/signin'", "the sign-in page")
        .await;
    alice.goto(&base).await;
    alice
        .wait_until("location.pathname === '/signin'", "no session")
        .await;
    for browser in [alice, bob, wanda] {
        browser.close().await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn over_tls_the_pages_are_https_and_the_session_cookie_is_secure() {
    // The certificate names "localhost" only: the pages still reach the
    // server's own gRPC address (127.0.0.1) over TLS.
    let pki_dir = tempfile::tempdir().unwrap();
    crate::auth::make_pki(pki_dir.path());
    let text = format!(
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n\n{}",
        auth_toml()
    );
    std::fs::write(pki_dir.path().join("auth.toml"), &text).unwrap();
    let auth = Arc::new(AuthConfig::load(&pki_dir.path().join("auth.toml")).expect("auth config"));
    let server = TestServer::start_with(move |config| config.auth = Some(auth.clone())).await;
    let driver = Driver::start();
    let browser = driver.browser_accepting_test_certificates().await;
    let base = format!("https://localhost:{}", server.addr().port());
    browser.sign_in(&base, Some("token-alice")).await;
    browser
        .wait_until(
            "document.getElementById('empty').hidden === false",
            "the empty inbox",
        )
        .await;
    let cookie = browser
        .client
        .get_named_cookie("aaa_session")
        .await
        .expect("the session cookie");
    assert_eq!(cookie.secure(), Some(true), "{cookie:?}");
    assert_eq!(cookie.http_only(), Some(true), "{cookie:?}");
    let same_site = cookie.same_site().map(|s| s.to_string());
    assert_eq!(same_site.as_deref(), Some("Strict"), "{cookie:?}");
    browser.goto(&format!("{base}/runs")).await;
    browser
        .wait_until("document.getElementById('runs') !== null", "the runs")
        .await;
    browser.close().await;
    server.shutdown().await;
}

/// On one PostgreSQL (the test passes without doing anything otherwise):
/// a session made on one server is good on another (one browser, one host,
/// two ports, as behind a load balancer), and a decision made on the
/// standby is forwarded to the owner with the signed-in principal.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_from_one_server_of_a_cluster_decides_through_another() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (owner, standby) = owner_and_standby(&url).await;
    let mut ops = Clients::with_token(&owner, "token-ops").await;
    register_wire_money(&mut ops, 1).await;
    let run_id = ops
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    ops.wait_for_event(&run_id, "aaa.approval.requested").await;

    let driver = Driver::start();
    let alice = driver.browser().await;
    alice.sign_in(&base(&owner), Some("token-alice")).await;
    // Cookies belong to the host, not the port: the standby gets it.
    alice
        .goto(&format!("{}/calls/{run_id}/call-1", base(&standby)))
        .await;
    alice
        .wait_until(
            "document.getElementById('approve') !== null",
            "the call on the standby",
        )
        .await;
    alice.find("#approve").await.click().await.expect("click");
    alice
        .wait_until(
            "(document.getElementById('notice') || {}).textContent === 'Your decision was recorded: granted.'",
            "the grant through the standby",
        )
        .await;
    let events = ops.wait_for_event(&run_id, "aaa.approval.granted").await;
    assert_eq!(actor_name(events.last().unwrap()), "alice");
    alice.close().await;
    standby.shutdown().await;
    owner.shutdown().await;
}

#[tokio::test]
async fn values_from_models_and_clients_show_as_text_and_run_no_script() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    let send_email = ToolDefinition {
        name: "send_email".into(),
        description: "Send an <b>email</b>".into(),
        requires_approval: true,
        ..Default::default()
    };
    register(&mut workers, vec![send_email], &[]).await;
    let mut runs = server.runs().await;
    let script = "<script>window.pwned = 1</script>";
    let image = "\"><img src=x onerror=\"window.pwned = 2\">";
    let arguments = serde_json::json!({"to": script, "subject": image}).to_string();
    let request = StartRunRequest {
        task: format!("Mail {image} {script}"),
        labels: [("note".to_string(), image.to_string())].into(),
        ..scripted_run("send_email", &arguments)
    };
    let run_id = start_run(&mut runs, request).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let driver = Driver::start();
    let browser = driver.browser().await;
    let base = base(&server);
    browser.sign_in(&base, None).await;
    browser
        .wait_until(
            &format!(
                "document.querySelector('{}') !== null",
                row(&run_id, &call_id)
            ),
            "the row",
        )
        .await;
    let shown = browser.text(&row(&run_id, &call_id)).await;
    assert!(shown.contains(script) && shown.contains(image), "{shown}");
    browser
        .goto(&format!("{base}/calls/{run_id}/{call_id}"))
        .await;
    browser
        .wait_until(
            "document.getElementById('arguments') !== null",
            "the call's page",
        )
        .await;
    let text = browser.text("main").await;
    assert!(text.contains(script) && text.contains(image), "{text}");
    assert!(text.contains("Send an <b>email</b>"), "{text}");
    browser.goto(&format!("{base}/runs/{run_id}")).await;
    browser
        .wait_until(
            "document.getElementById('timeline') !== null",
            "the timeline",
        )
        .await;
    assert!(browser.text("#timeline").await.contains(script));
    let safe = browser
        .eval("return window.pwned === undefined && document.querySelectorAll('main script, main img, main b').length === 0;")
        .await;
    assert_eq!(safe, Value::Bool(true));
    browser.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_pages_fit_a_375_px_phone_and_screenshots_are_taken() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let mut first = None;
    for (task, args) in [
        ("Pay ACME $250 for the March invoice", REFERENCE_ARGS),
        (
            "Refund order 4411 to the customer's original card",
            r#"{"amount":4999,"to":"card ending 4242, order 4411 (a long note that must wrap on a phone)"}"#,
        ),
        (
            "Pay the electricity bill",
            r#"{"amount":120,"to":"City Power & Light"}"#,
        ),
    ] {
        let request = StartRunRequest {
            task: task.into(),
            labels: [("team".to_string(), "payments".to_string())].into(),
            ..scripted_run("wire_money", args)
        };
        let run_id = start_run(&mut runs, request).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        first.get_or_insert((run_id, call_id));
    }
    let (run_id, call_id) = first.unwrap();
    // One finished run for the timeline.
    let done = start_run(&mut runs, scripted_reference_run()).await;
    let done_call = wait_for_approval(&mut runs, &done).await;
    grant(&mut runs, &done, &done_call).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    wait_for_end(&mut runs, &done).await;
    worker.stop().await;

    let driver = Driver::start();
    let browser = driver.browser().await;
    let base = base(&server);
    browser.sign_in(&base, None).await;
    let (_keep, dir) = shots();
    // Tall enough for a whole call's page in one picture.
    browser
        .client
        .set_window_size(1100, 1500)
        .await
        .expect("resize");
    let pages = [
        ("inbox", format!("{base}/"), "#inbox li"),
        (
            "call",
            format!("{base}/calls/{run_id}/{call_id}"),
            "#arguments",
        ),
        ("timeline", format!("{base}/runs/{done}"), "#timeline li"),
    ];
    for (name, url, ready) in &pages {
        browser.goto(url).await;
        browser
            .wait_until(&format!("document.querySelector('{ready}') !== null"), name)
            .await;
        browser
            .screenshot(&dir.join(format!("web-{name}.png")))
            .await;
    }
    browser
        .client
        .set_window_size(375, 812)
        .await
        .expect("resize");
    let width = browser.eval("return window.innerWidth;").await;
    assert!(width.as_u64().is_some_and(|w| w <= 375), "viewport {width}");
    for (name, url, ready) in &pages {
        browser.goto(url).await;
        browser
            .wait_until(&format!("document.querySelector('{ready}') !== null"), name)
            .await;
        assert!(
            !browser.scrolls_sideways().await,
            "{name} scrolls sideways at 375 px"
        );
        browser
            .screenshot(&dir.join(format!("web-{name}-phone.png")))
            .await;
    }
    for (name, _, _) in &pages {
        let png = std::fs::read(dir.join(format!("web-{name}-phone.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}");
    }
    browser.close().await;
    server.shutdown().await;
}

// ------------------------------------------------------- plain HTTP tests

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Signs in with auth off over plain HTTP: the session cookie.
async fn cookie(client: &HttpClient, base: &str) -> String {
    let request = http::Request::post(format!("{base}/signin"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from_static(b"next=/")))
        .unwrap();
    let response = client.request(request).await.expect("POST /signin");
    assert_eq!(response.status(), 303);
    let set = response.headers()["set-cookie"].to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap().to_string()
}

async fn get(client: &HttpClient, url: &str, cookie: &str) -> (http::response::Parts, String) {
    let request = http::Request::get(url)
        .header("cookie", cookie)
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(client, request).await
}

/// Sends `request`: the answer's head and its body as text.
async fn send(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
) -> (http::response::Parts, String) {
    let response = client.request(request).await.expect("an HTTP answer");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// A form posted to `url` as the site's own page posts it, with the
/// session `cookie` ("" for none) and `Host: host` (`None`: the URL's).
fn form_post(
    url: &str,
    host: Option<&str>,
    cookie: &str,
    body: &str,
) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "same-origin");
    if let Some(host) = host {
        request = request.header("host", host);
    }
    if !cookie.is_empty() {
        request = request.header("cookie", cookie);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A GET of `url` with the session `cookie` ("" for none) and `Host: host`.
fn get_at(url: &str, host: &str, cookie: &str) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::get(url).header("host", host);
    if !cookie.is_empty() {
        request = request.header("cookie", cookie);
    }
    request.body(Full::new(Bytes::new())).unwrap()
}

/// Signs in with `token` over plain HTTP: the answer, and the session
/// cookie (`name=value`) when it set one.
async fn sign_in_with(
    client: &HttpClient,
    base: &str,
    token: &str,
) -> (http::response::Parts, String, Option<String>) {
    let body = format!("token={token}&next=/");
    let (parts, page) = send(
        client,
        form_post(&format!("{base}/signin"), None, "", &body),
    )
    .await;
    let cookie = parts
        .headers
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string());
    (parts, page, cookie)
}

/// The session cookie of a sign-in with `token` that must succeed.
async fn signed_in(client: &HttpClient, base: &str, token: &str) -> String {
    let (parts, page, cookie) = sign_in_with(client, base, token).await;
    assert_eq!(parts.status, 303, "sign-in with {token}: {page}");
    cookie.expect("a session cookie")
}

/// The CSRF token of the forms of a page.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF token in the page:\n{page}"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest.split('"').next().unwrap().to_string()
}

/// Asserts that `cookie` no longer opens the inbox: the sign-in page instead.
async fn assert_signed_out(client: &HttpClient, base: &str, cookie: &str, what: &str) {
    let (parts, page) = get(client, &format!("{base}/"), cookie).await;
    assert_eq!(parts.status, 303, "{what}: {page}");
    let to = parts.headers["location"].to_str().unwrap();
    assert!(to.starts_with("/signin"), "{what}: redirected to {to}");
}

/// The `data-key`s of the inbox rows in a page.
fn keys(page: &str) -> Vec<String> {
    page.split("<li class=\"call\" data-key=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect()
}

fn next_link(page: &str) -> Option<String> {
    let at = page.find("rel=\"next\" href=\"")?;
    let rest = &page[at + "rel=\"next\" href=\"".len()..];
    Some(rest.split('"').next()?.replace("&amp;", "&"))
}

/// Seeding 10,000 runs loads a 2-core machine for a minute: run beside the
/// whole suite it made other tests' bounded waits run out. So `.ci/run`
/// runs it on its own, on both stores:
/// `cargo test --test integration web::ten_thousand -- --ignored`.
#[tokio::test]
#[ignore = "heavy: .ci/run runs it on its own"]
async fn ten_thousand_pending_calls_are_served_a_page_at_a_time() {
    const PENDING: usize = 10_000;
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let channel = server.channel().await;
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = PENDING / 50;
    for _ in 0..50 {
        let mut runs = aaa::proto::run_service_client::RunServiceClient::new(channel.clone());
        tasks.spawn(async move {
            for _ in 0..per_task {
                start_run(&mut runs, scripted_reference_run()).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a starter task");
    }
    // Wait until every run waits (each runs its scripted model first).
    let mut approvals = server.approvals().await;
    let give_up = tokio::time::Instant::now() + WAIT * 10;
    loop {
        let mut count = 0;
        let mut page_token = String::new();
        loop {
            let page = approvals
                .list_approvals(ListApprovalsRequest {
                    page_size: 1000,
                    page_token,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            count += page.approvals.len();
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        if count == PENDING {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{count} of {PENDING} pending"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    println!("{PENDING} runs waiting after {:?}", started.elapsed());

    let base = base(&server);
    let client = http_client();
    let cookie = cookie(&client, &base).await;
    for order in ["oldest", "newest"] {
        let (parts, first) = get(&client, &format!("{base}/?order={order}"), &cookie).await;
        assert_eq!(parts.status, 200);
        let timing = parts.headers["server-timing"].to_str().unwrap().to_string();
        println!("inbox, {order} first, first page of {PENDING} pending: server-timing {timing}");
        let first_keys = keys(&first);
        assert_eq!(first_keys.len(), 50, "one page");
        let next = next_link(&first).expect("a next page");
        let (_, second) = get(&client, &format!("{base}{next}"), &cookie).await;
        let second_keys = keys(&second);
        assert_eq!(second_keys.len(), 50);
        let mut all: Vec<&String> = first_keys.iter().chain(&second_keys).collect();
        let in_order: Vec<&String> = {
            let mut sorted = all.clone();
            sorted.sort();
            if order == "newest" {
                sorted.reverse();
            }
            sorted
        };
        assert_eq!(all, in_order, "{order} first, across pages");
        all.dedup();
        assert_eq!(all.len(), 100);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn live_streams_end_when_the_server_stops() {
    // A long grace: a stop that waited for the open stream would outlast
    // the harness's bounded wait and fail.
    let mut server = TestServer::start_with(|config| {
        config.shutdown_grace = std::time::Duration::from_secs(600);
    })
    .await;
    let base = base(&server);
    let client = http_client();
    let cookie = cookie(&client, &base).await;
    let request = http::Request::get(format!("{base}/live/approvals"))
        .header("cookie", &cookie)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.expect("GET /live/approvals");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = body.frame().await.expect("a first event").expect("a frame");
    let first = String::from_utf8(first.into_data().unwrap().to_vec()).unwrap();
    assert!(first.contains("event: count"), "{first}");
    server.stop().await;
    let rest = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("the stream did not end with the server");
    drop(rest);
}

#[test]
fn a_public_url_that_is_not_an_http_url_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        "ftp://aaa.example.com",
        "aaa.example.com",
        "https://x.example/?a=1",
    ] {
        let output = serve_refused(
            dir.path(),
            &["--listen", "127.0.0.1:0", "--public-url", bad],
        );
        assert_eq!(output.status.code(), Some(64), "{bad}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--public-url"), "{bad}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

// ------------------------------------------- sessions, hosts, sign-in limits

/// A run of wire_money waiting for its approval: (run id, call id).
async fn a_waiting_call(clients: &mut Clients) -> (String, String) {
    register_wire_money(clients, 1).await;
    let run_id = clients
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = clients
        .wait_for_event(&run_id, "aaa.approval.requested")
        .await;
    let call_id = crate::support::call_id(events.last().unwrap());
    (run_id, call_id)
}

#[tokio::test]
async fn a_session_ends_when_its_token_is_rotated_or_removed_and_when_it_signs_out() {
    // The auth config each (re)start reads: the test changes it between
    // restarts, as an operator edits the file and restarts the server.
    let principals = Arc::new(std::sync::Mutex::new(auth_toml()));
    let file = principals.clone();
    let mut server = TestServer::start_with(move |config| {
        let text = file.lock().unwrap().clone();
        let auth = AuthConfig::parse(&text, Path::new(".")).expect("auth config");
        config.auth = Some(Arc::new(auth));
    })
    .await;
    let (run_id, call_id) = {
        let mut ops = Clients::with_token(&server, "token-ops").await;
        a_waiting_call(&mut ops).await
    };
    let client = http_client();
    let alice = signed_in(&client, &base(&server), "token-alice").await;
    let bob = signed_in(&client, &base(&server), "token-bob").await;
    let (parts, page) = get(&client, &format!("{}/", base(&server)), &alice).await;
    assert_eq!(parts.status, 200, "{page}");
    let alices_csrf = csrf_of(&page);

    // alice's token is rotated and bob is removed; the server restarts.
    *principals.lock().unwrap() = auth_toml_of(&[
        ("ops", "[\"admin\"]", "token-ops"),
        ("alice", "[\"approver\", \"reader\"]", "token-alice-2"),
    ]);
    server.restart().await;
    let at = base(&server);
    assert_signed_out(
        &client,
        &at,
        &alice,
        "alice's session after her token was rotated",
    )
    .await;
    assert_signed_out(&client, &at, &bob, "bob's session after he was removed").await;
    // Nor does the old session decide anything.
    let deny = format!("{at}/calls/{run_id}/{call_id}/deny");
    let digest = sha256_hex(REFERENCE_ARGS.as_bytes());
    let body = format!("csrf={alices_csrf}&sha256={digest}&reason=stale");
    let (parts, page) = send(&client, form_post(&deny, None, &alice, &body)).await;
    assert_eq!(parts.status, 401, "a denial with the old session: {page}");
    let events = ops_history(&server, &run_id).await;
    assert_eq!(count(&events, "aaa.approval.denied"), 0, "{events:?}");
    let (parts, _, cookie) = sign_in_with(&client, &at, "token-alice").await;
    assert_eq!(parts.status, 401, "the old token signs in no more");
    assert!(cookie.is_none());

    // Sign-out ends the session on the server, not only in the browser,
    // and across a restart.
    let alice = signed_in(&client, &at, "token-alice-2").await;
    let (parts, page) = get(&client, &format!("{at}/"), &alice).await;
    assert_eq!(parts.status, 200, "{page}");
    let csrf = csrf_of(&page);
    // A page left open (another tab) follows the inbox live.
    let request = http::Request::get(format!("{at}/live/approvals"))
        .header("cookie", &alice)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.expect("GET /live/approvals");
    assert_eq!(response.status(), 200);
    let mut live = response.into_body();
    let first = live.frame().await.expect("a first event").expect("a frame");
    let first = String::from_utf8(first.into_data().unwrap().to_vec()).unwrap();
    assert!(first.contains("event: count"), "{first}");
    let signout = format!("{at}/signout");
    let (parts, page) = send(
        &client,
        form_post(&signout, None, &alice, &format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(parts.status, 303, "{page}");
    assert_signed_out(&client, &at, &alice, "the session after sign-out").await;
    // A new request would be its next update: the stream ends instead.
    let mut ops = Clients::with_token(&server, "token-ops").await;
    let other = ops
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    ops.wait_for_event(&other, "aaa.approval.requested").await;
    let rest = tokio::time::timeout(WAIT, live.collect())
        .await
        .expect("the live stream did not end after sign-out")
        .expect("the stream's body")
        .to_bytes();
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("event: requested"), "{rest}");
    let (parts, page) = send(
        &client,
        form_post(&deny, None, &alice, &body.replace(&alices_csrf, &csrf)),
    )
    .await;
    assert_eq!(parts.status, 401, "a denial after sign-out: {page}");
    server.restart().await;
    let at = base(&server);
    assert_signed_out(
        &client,
        &at,
        &alice,
        "the session after sign-out and a restart",
    )
    .await;
    // Signing in again makes a new session.
    let again = signed_in(&client, &at, "token-alice-2").await;
    let (parts, page) = get(&client, &format!("{at}/"), &again).await;
    assert_eq!(parts.status, 200, "{page}");
    let events = ops_history(&server, &run_id).await;
    assert_eq!(count(&events, "aaa.approval.denied"), 0, "{events:?}");
    server.shutdown().await;
}

async fn ops_history(server: &TestServer, run_id: &str) -> Vec<aaa::proto::Event> {
    Clients::with_token(server, "token-ops")
        .await
        .history(run_id)
        .await
}

/// On one PostgreSQL (the test passes without doing anything otherwise):
/// signing out on one server ends the session on the other at once.
#[tokio::test(flavor = "multi_thread")]
async fn signing_out_on_one_server_of_a_cluster_ends_the_session_on_another() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (owner, standby) = owner_and_standby(&url).await;
    let client = http_client();
    let alice = signed_in(&client, &base(&owner), "token-alice").await;
    let (parts, page) = get(&client, &format!("{}/", base(&standby)), &alice).await;
    assert_eq!(parts.status, 200, "the session on the other server: {page}");
    let csrf = csrf_of(&page);
    let signout = format!("{}/signout", base(&standby));
    let (parts, page) = send(
        &client,
        form_post(&signout, None, &alice, &format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(parts.status, 303, "{page}");
    assert_signed_out(
        &client,
        &base(&owner),
        &alice,
        "on the server it was made on",
    )
    .await;
    assert_signed_out(
        &client,
        &base(&standby),
        &alice,
        "on the server it signed out on",
    )
    .await;
    // Signing in again makes a session that stands; a second sign-out
    // (the store keeps each record once: sign-outs are numbered) ends it
    // on both servers too.
    let again = signed_in(&client, &base(&owner), "token-alice").await;
    let (parts, page) = get(&client, &format!("{}/", base(&standby)), &again).await;
    assert_eq!(
        parts.status, 200,
        "a new session after the sign-out: {page}"
    );
    let csrf = csrf_of(&page);
    let (parts, page) = send(
        &client,
        form_post(
            &format!("{}/signout", base(&owner)),
            None,
            &again,
            &format!("csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(parts.status, 303, "the second sign-out: {page}");
    for server in [&owner, &standby] {
        assert_signed_out(&client, &base(server), &again, "after the second sign-out").await;
    }
    standby.shutdown().await;
    owner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_auth_off_a_request_naming_another_host_is_refused() {
    // DNS rebinding: a page at evil.test whose name now resolves to
    // 127.0.0.1 reaches the server with `Host: evil.test`.
    let server = TestServer::start().await;
    let mut clients = Clients::new(server.channel().await, None);
    let (run_id, call_id) = a_waiting_call(&mut clients).await;
    let base = base(&server);
    let port = server.addr().port();
    let client = http_client();
    let call = format!("{base}/calls/{run_id}/{call_id}");

    let evil = format!("evil.test:{port}");
    for host in ["evil.test", evil.as_str()] {
        let (parts, page) = send(
            &client,
            form_post(&format!("{base}/signin"), Some(host), "", "next=/"),
        )
        .await;
        assert_eq!(parts.status, 421, "Continue under {host}: {page}");
        assert!(
            parts.headers.get("set-cookie").is_none(),
            "no session for {host}"
        );
        assert!(
            page.contains(&format!("localhost:{port}")) && page.contains("--allow-host"),
            "the page names the accepted hosts and the flag: {page}"
        );
        for url in [
            format!("{base}/"),
            call.clone(),
            format!("{base}/live/approvals"),
        ] {
            let (parts, page) = send(&client, get_at(&url, host, "")).await;
            assert_eq!(parts.status, 421, "GET {url} as {host}: {page}");
        }
    }

    // A session made under a loopback name does not approve under evil.test.
    let cookie = cookie(&client, &base).await;
    let (parts, page) = send(
        &client,
        get_at(&call, &format!("localhost:{port}"), &cookie),
    )
    .await;
    assert_eq!(parts.status, 200, "{page}");
    let csrf = csrf_of(&page);
    let digest = sha256_hex(REFERENCE_ARGS.as_bytes());
    let approve = format!("{call}/approve");
    let body = format!("csrf={csrf}&sha256={digest}");
    let (parts, page) = send(&client, form_post(&approve, Some(&evil), &cookie, &body)).await;
    assert_eq!(parts.status, 421, "Approve as evil.test: {page}");
    let events = clients.history(&run_id).await;
    assert_eq!(count(&events, "aaa.approval.granted"), 0, "{events:?}");

    // The loopback names with the server's port are this server.
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (parts, page) = send(&client, get_at(&format!("{base}/"), &host, &cookie)).await;
        assert_eq!(parts.status, 200, "GET / as {host}: {page}");
    }
    let (parts, page) = send(
        &client,
        form_post(&approve, Some(&format!("localhost:{port}")), &cookie, &body),
    )
    .await;
    assert_eq!(parts.status, 303, "Approve as localhost: {page}");
    clients
        .wait_for_event(&run_id, "aaa.approval.granted")
        .await;
    server.shutdown().await;

    // --allow-host adds a name.
    let dir = tempfile::tempdir().unwrap();
    let child = ChildServer::start_args(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--allow-host", "aaa.test"],
    )
    .await;
    let base = format!("http://{}", child.addr());
    let port = child.addr().port();
    let (parts, page) = send(
        &client,
        get_at(&format!("{base}/"), &format!("aaa.test:{port}"), ""),
    )
    .await;
    // Served at once (auth off opens a session by itself; a redirect to the
    // sign-in page, 303, until issue 44).
    assert_eq!(parts.status, 200, "an allowed name: {page}");
    let (parts, page) = send(&client, get_at(&format!("{base}/"), "evil.test", "")).await;
    assert_eq!(parts.status, 421, "{page}");
    assert!(page.contains("aaa.test"), "{page}");
    child.stop();
}

/// An HTTP client whose connections come from `address` (any of
/// 127.0.0.0/8 is this machine): another client address.
fn http_client_from(address: [u8; 4]) -> HttpClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_local_address(Some(std::net::IpAddr::from(address)));
    Client::builder(TokioExecutor::new()).build(connector)
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_tokens_are_throttled_per_address_with_one_log_line_per_burst() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("auth.toml");
    std::fs::write(&config, auth_toml()).unwrap();
    let server = ChildServer::start_args(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--auth-config",
            config.to_str().unwrap(),
        ],
    )
    .await;
    let base = format!("http://{}", server.addr());
    let mallory = http_client();
    let mut refused = 0;
    for attempt in 1..=30 {
        let (parts, page, cookie) =
            sign_in_with(&mallory, &base, &format!("guess-{attempt}")).await;
        assert!(cookie.is_none());
        if attempt <= 5 {
            assert_eq!(parts.status, 401, "wrong token {attempt}: {page}");
            continue;
        }
        assert_eq!(parts.status, 429, "wrong token {attempt}: {page}");
        let retry: u64 = parts.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry), "Retry-After: {retry}");
        assert!(page.contains("Too many"), "{page}");
        refused += 1;
    }
    assert_eq!(refused, 25);
    // The right token is refused from that address too (a guess that hit
    // would otherwise be told so), but not from another.
    let (parts, _, _) = sign_in_with(&mallory, &base, "token-alice").await;
    assert_eq!(parts.status, 429);
    let alice = http_client_from([127, 0, 0, 2]);
    let cookie = signed_in(&alice, &base, "token-alice").await;
    let (parts, page) = get(&alice, &format!("{base}/"), &cookie).await;
    assert_eq!(parts.status, 200, "{page}");
    // One line for the burst, not one per attempt.
    server.wait_for_log_line("wrong credentials refused").await;
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("wrong credentials refused"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    server.stop();
}

#[tokio::test]
async fn a_throttled_address_signs_in_again_once_its_minute_is_over() {
    let server = start_with_auth().await;
    let base = base(&server);
    let client = http_client();
    for attempt in 1..=5 {
        let (parts, page, _) = sign_in_with(&client, &base, "token-mallory").await;
        assert_eq!(parts.status, 401, "wrong token {attempt}: {page}");
    }
    let (parts, page, _) = sign_in_with(&client, &base, "token-alice").await;
    assert_eq!(parts.status, 429, "{page}");
    server.clock().advance(std::time::Duration::from_secs(60));
    signed_in(&client, &base, "token-alice").await;
    server.shutdown().await;
}

/// Wrong credentials are counted per address across the server's doors:
/// five wrong tokens over gRPC hold the address back at gRPC (the right
/// token included: UNAUTHENTICATED with `retry_after_s`), at `/metrics`
/// and at the web sign-in (429 with `Retry-After`) alike; another address
/// is not held back, and a minute on this one passes again.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_tokens_over_grpc_hold_their_address_back_at_every_door() {
    let server = start_with_auth().await;
    let base = base(&server);
    let channel = server.channel().await;
    let list = |channel: tonic::transport::Channel, token: &'static str| async move {
        let mut clients = Clients::new(channel, Some(token));
        let request = aaa::proto::ListRunsRequest::default();
        clients.runs.list_runs(request).await.map(drop)
    };
    for attempt in 1..=5 {
        let status = list(channel.clone(), "token-guess")
            .await
            .expect_err("guessed");
        let info = assert_error(&status, tonic::Code::Unauthenticated, "UNAUTHENTICATED");
        assert!(
            !info.metadata.contains_key("retry_after_s"),
            "{attempt}: {status:?}"
        );
    }
    let status = list(channel.clone(), "token-alice")
        .await
        .expect_err("held back");
    let info = assert_error(&status, tonic::Code::Unauthenticated, "UNAUTHENTICATED");
    assert!(
        status.message().contains("too many wrong credentials"),
        "{status:?}"
    );
    let retry: u64 = info.metadata["retry_after_s"].parse().unwrap();
    assert_eq!(retry, 60, "{status:?}");

    let client = http_client();
    let metrics = http::Request::get(format!("{base}/metrics"))
        .header("authorization", "Bearer token-alice")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, text) = send(&client, metrics).await;
    assert_eq!(parts.status, 429, "{text}");
    assert_eq!(parts.headers["retry-after"], "60");
    let (parts, page, _) = sign_in_with(&client, &base, "token-alice").await;
    assert_eq!(parts.status, 429, "{page}");

    let elsewhere = tonic::transport::Endpoint::from_shared(base.clone())
        .unwrap()
        .local_address(Some(std::net::IpAddr::from([127, 0, 0, 2])))
        .connect()
        .await
        .expect("connect from 127.0.0.2");
    list(elsewhere, "token-alice")
        .await
        .expect("another address");

    server.clock().advance(std::time::Duration::from_secs(60));
    list(channel, "token-alice").await.expect("a minute on");
    server.shutdown().await;
}

/// Two servers with auth on one PostgreSQL: the owner of the runs, and a
/// standby that forwards to it.
async fn owner_and_standby(url: &str) -> (TestServer, TestServer) {
    let auth = Arc::new(AuthConfig::parse(&auth_toml(), Path::new(".")).expect("auth config"));
    let member = |standby: bool| {
        let (url, auth) = (url.to_string(), auth.clone());
        TestServer::start_with(move |config| {
            config.auth = Some(auth.clone());
            config.store_url = Some(url.clone());
            config.standby = standby;
        })
    };
    (member(false).await, member(true).await)
}
