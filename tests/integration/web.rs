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
    let mut text = String::new();
    for (name, roles) in [
        ("ops", "[\"admin\"]"),
        ("alice", "[\"approver\", \"reader\"]"),
        ("bob", "[\"approver\", \"reader\"]"),
        ("wanda", "[\"approver\"]"),
    ] {
        text.push_str(&format!(
            "[[principal]]\nname = \"{name}\"\nroles = {roles}\ntoken_sha256 = \"{}\"\n\n",
            sha256_hex(format!("token-{name}").as_bytes())
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
    // A link from a notification: sign-in first, then straight to the call.
    browser
        .goto(&format!("{base}/calls/{run_id}/{call_id}"))
        .await;
    browser
        .wait_until("location.pathname === '/signin'", "the sign-in page")
        .await;
    assert!(browser.text(".warning").await.contains("Auth is off"));
    browser
        .find("form[action='/signin'] button")
        .await
        .click()
        .await
        .expect("click");
    browser
        .wait_until(
            "document.getElementById('reason') !== null",
            "the call's page",
        )
        .await;
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
    let auth = Arc::new(AuthConfig::parse(&auth_toml(), Path::new(".")).expect("auth config"));
    let member = |standby: bool| {
        let (url, auth) = (url.clone(), auth.clone());
        TestServer::start_with(move |config| {
            config.auth = Some(auth.clone());
            config.store_url = Some(url.clone());
            config.standby = standby;
        })
    };
    let owner = member(false).await;
    let standby = member(true).await;
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
    let response = client.request(request).await.expect("GET");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts, String::from_utf8(body.to_vec()).expect("UTF-8"))
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
