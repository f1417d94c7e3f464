//! The `aaa` command for people, run as a child process against a real
//! server: start a run, see it in the inbox, approve or deny it, follow it
//! with `runs tail`, review the inbox by answering on stdin, `--json`
//! output, and the exit codes scripts rely on.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::*;

/// The reference steps for `--steps`: call wire_money, then echo its result.
const REFERENCE_STEPS: &str = r#"[{"tool_calls": [{"name": "wire_money", "arguments": {"amount": 250, "to": "ACME"}}]}, "echo"]"#;

/// A running `aaa` command: its stdout arrives line by line as it is
/// written; killed and reaped on drop.
struct Aaa {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: Option<JoinHandle<String>>,
}

/// How an `aaa` command ended.
struct Ended {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Aaa {
    /// Starts `aaa ARGS` with `stdin` as its whole input.
    fn start(server: &impl Server, args: &[&str], stdin: &str) -> Aaa {
        let mut command = Command::new(env!("CARGO_BIN_EXE_aaa"));
        command.args(args);
        Aaa::spawn(server, command, stdin)
    }

    /// Starts `command` with AAA_SERVER pointing at `server`.
    fn spawn(server: &impl Server, mut command: Command, stdin: &str) -> Aaa {
        let mut child = command
            .env("AAA_SERVER", format!("http://{}", server.addr()))
            .env_remove("AAA_TOKEN")
            .env_remove("AAA_PUBLIC_URL")
            .env_remove("AAA_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn aaa");
        let mut input = child.stdin.take().expect("stdin");
        let stdin = stdin.to_string();
        // Write and close (EOF) on a thread, so a full pipe cannot block the test.
        std::thread::spawn(move || {
            let _ = input.write_all(stdin.as_bytes());
        });
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Aaa {
            child,
            lines,
            stderr: Some(stderr),
        }
    }

    /// The next line of stdout; None once stdout is closed.
    async fn next_line(&mut self) -> Option<String> {
        tokio::time::timeout(WAIT, self.lines.recv())
            .await
            .expect("aaa printed nothing more and did not exit")
    }

    /// The rest of stdout, then the exit code and stderr.
    async fn finish(mut self) -> Ended {
        let mut stdout = String::new();
        while let Some(line) = self.next_line().await {
            stdout.push_str(&line);
            stdout.push('\n');
        }
        // stdout is closed: the process is exiting.
        let stderr = self.stderr.take().unwrap().join().expect("stderr reader");
        let status = self.child.wait().expect("wait for aaa");
        Ended {
            code: status.code().expect("aaa ended by a signal"),
            stdout,
            stderr,
        }
    }
}

impl Drop for Aaa {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `aaa ARGS` to its end.
async fn aaa(server: &impl Server, args: &[&str]) -> Ended {
    Aaa::start(server, args, "").finish().await
}

impl Ended {
    #[track_caller]
    fn ok(self) -> Ended {
        assert_eq!(self.code, 0, "aaa failed: {}", self.stderr);
        self
    }

    /// Checks the exit code and that stderr is one line; returns that line.
    #[track_caller]
    fn error_line(&self, code: i32) -> &str {
        assert_eq!(
            self.code, code,
            "exit code; stdout: {}, stderr: {}",
            self.stdout, self.stderr
        );
        assert_eq!(self.stderr.lines().count(), 1, "one line: {}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self.stderr.trim_end()
    }

    #[track_caller]
    fn json(&self) -> Value {
        parse(&self.stdout)
    }
}

#[track_caller]
fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn steps_file(dir: &tempfile::TempDir, steps: &str) -> PathBuf {
    let path = dir.path().join("steps.json");
    std::fs::write(&path, steps).expect("write steps");
    path
}

/// Starts the reference run with `aaa runs start`; returns its id.
async fn start_with_cli(server: &impl Server, steps: &str, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let steps = steps_file(&dir, steps);
    let mut args = vec!["runs", "start", "Pay ACME $250", "--tool", "wire_money"];
    args.extend(["--steps", steps.to_str().unwrap()]);
    args.extend(extra);
    let started = aaa(server, &args).await.ok();
    started.stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn on_call_approves_a_wire_transfer_from_the_terminal() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let run_id = start_with_cli(&server, REFERENCE_STEPS, &["--label", "team=payments"]).await;

    // Follow the run live; it stops at the approval request.
    let mut tail = Aaa::start(&server, &["runs", "tail", &run_id, "--json"], "");
    let mut events = Vec::new();
    while events
        .last()
        .is_none_or(|e: &Value| e["type"] != "aaa.approval.requested")
    {
        let line = tail
            .next_line()
            .await
            .expect("tail ended before the approval request");
        events.push(parse(&line));
    }

    // The inbox shows the call with its exact arguments: 250, not 250.0.
    let inbox = aaa(
        &server,
        &["approvals", "ls", "--json", "--label", "team=payments"],
    )
    .await
    .ok()
    .json();
    assert_eq!(inbox["next_page_token"], "");
    let approval = &inbox["approvals"][0];
    assert_eq!(approval["run_id"], run_id.as_str());
    assert_eq!(approval["tool"], "wire_money");
    assert_eq!(approval["task"], "Pay ACME $250");
    assert_eq!(approval["arguments"], json!({"amount": 250, "to": "ACME"}));
    assert_eq!(approval["arguments"]["amount"].as_u64(), Some(250));
    let call_id = approval["call_id"].as_str().unwrap().to_string();
    let sha256 = approval["arguments_sha256"].as_str().unwrap().to_string();

    let args = [
        "approve",
        &run_id,
        &call_id,
        "--comment",
        "checked with finance",
        "--sha256",
        &sha256,
    ];
    let approved = aaa(&server, &args).await.ok();
    assert_eq!(
        approved.stdout.trim(),
        format!("granted {call_id} of run {run_id}")
    );

    // The worker runs the tool; tail follows to the run's end and exits 0.
    let rest = tail.finish().await.ok();
    events.extend(rest.stdout.lines().map(parse));
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, REFERENCE_TYPES);
    let granted = &events[5]["data"];
    assert_eq!(granted["comment"], "checked with finance");
    assert_eq!(granted["arguments_sha256"], sha256.as_str());
    assert_eq!(
        events[10]["data"]["value"]["text"], REFERENCE_TEXT,
        "aaa.run.completed: {}",
        events[10]
    );
    assert_eq!(events[10]["seq"].as_u64(), Some(11));
    assert_eq!(worker.stop().await.len(), 1, "the tool ran once");

    let run = aaa(&server, &["runs", "show", &run_id, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(run["status"], "completed");
    assert_eq!(run["result"], json!({"text": REFERENCE_TEXT}));
    assert_eq!(run["labels"], json!({"team": "payments"}));

    // A second grant changes nothing and says so; it still succeeds.
    let again = aaa(&server, &["approve", &run_id, &call_id]).await.ok();
    assert!(again.stdout.contains("already granted"), "{}", again.stdout);

    // The run is listed under its status and label; the text table names it.
    let listed = aaa(
        &server,
        &[
            "runs",
            "ls",
            "--status",
            "completed",
            "--label",
            "team=payments",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(listed["runs"][0]["run_id"], run_id.as_str());
    let table = aaa(&server, &["runs", "ls", "--token", "secret"])
        .await
        .ok();
    assert!(table.stdout.starts_with("RUN"), "{}", table.stdout);
    assert!(table.stdout.contains(&run_id), "{}", table.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_with_a_reason_and_tail_reports_the_failed_run() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    // Only one step: after the denial the script is exhausted and the run fails.
    let steps =
        r#"[{"tool_calls": [{"name": "wire_money", "arguments": {"amount": 250, "to": "ACME"}}]}]"#;
    let run_id = start_with_cli(&server, steps, &[]).await;
    let call_id = wait_for_approval(&mut server.runs().await, &run_id).await;

    let denied = aaa(
        &server,
        &["deny", &run_id, &call_id, "--reason", "not this vendor"],
    )
    .await
    .ok();
    assert_eq!(
        denied.stdout.trim(),
        format!("denied {call_id} of run {run_id}")
    );

    // A grant after the denial changes nothing: exit 1, saying what stands.
    let late = aaa(&server, &["approve", &run_id, &call_id]).await;
    let line = late.error_line(1);
    assert!(line.contains("already denied"), "{line}");

    // tail prints the story as readable lines (no color into a pipe) and
    // exits 4: the run failed.
    let tail = aaa(&server, &["runs", "tail", &run_id]).await;
    assert_eq!(tail.code, 4, "{}", tail.stderr);
    assert!(tail.stderr.is_empty(), "{}", tail.stderr);
    assert!(!tail.stdout.contains('\x1b'), "{}", tail.stdout);
    let lines: Vec<&str> = tail.stdout.lines().collect();
    let denial = lines.iter().find(|l| l.contains("aaa.approval.denied"));
    assert!(
        denial.is_some_and(|l| l.contains("not this vendor")),
        "{lines:?}"
    );
    let failed = lines.iter().find(|l| l.contains("aaa.tool.failed"));
    assert!(
        failed.is_some_and(|l| l.contains("ApprovalDenied: not this vendor")),
        "{lines:?}"
    );
    let last = lines.last().unwrap();
    assert!(
        last.contains("aaa.run.failed") && last.contains("ScriptExhausted"),
        "{last}"
    );

    let events = history(&mut server.runs().await, &run_id).await;
    let refusal = data(find(&events, "aaa.tool.failed"));
    assert_eq!(refusal["error"]["type"], "ApprovalDenied");
    assert_eq!(refusal["error"]["message"], "not this vendor");
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_one_line_and_exit_1_usage_errors_exit_2() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;

    let unknown = aaa(&server, &["runs", "show", "no-such-run"]).await;
    let line = unknown.error_line(1);
    assert!(line.starts_with("aaa: NOT_FOUND: "), "{line}");
    assert!(
        line.contains("no-such-run") && line.contains("RUN_NOT_FOUND"),
        "{line}"
    );
    assert!(unknown.stdout.is_empty());

    let missing = "01900000-0000-7000-8000-000000000000";
    let tail = aaa(&server, &["runs", "tail", missing, "--json"]).await;
    assert!(tail.error_line(1).contains(missing));

    let run_id = start_run(&mut server.runs().await, scripted_reference_run()).await;
    wait_for_approval(&mut server.runs().await, &run_id).await;
    let no_call = aaa(&server, &["approve", &run_id, "call-99"]).await;
    assert!(no_call.error_line(1).contains("CALL_NOT_FOUND"));
    let mismatch = aaa(&server, &["approve", &run_id, "call-1", "--sha256", "00"]).await;
    assert!(mismatch.error_line(1).contains("ARGUMENTS_MISMATCH"));

    let unregistered = aaa(
        &server,
        &["runs", "start", "x", "--tool", "nope", "--model", "m"],
    )
    .await;
    assert!(unregistered.error_line(1).contains("TOOL_NOT_REGISTERED"));

    // Usage: clap's own errors, and a --steps file that is not steps.
    let no_reason = aaa(&server, &["deny", &run_id, "call-1"]).await;
    assert_eq!(no_reason.code, 2, "{}", no_reason.stderr);
    let bad_token = aaa(&server, &["runs", "ls", "--token", "a\nb"]).await;
    assert_eq!(bad_token.code, 2, "{}", bad_token.stderr);
    let dir = tempfile::tempdir().unwrap();
    let bad = steps_file(&dir, r#"[{"say": "hi"}]"#);
    let args = ["runs", "start", "x", "--steps", bad.to_str().unwrap()];
    let bad_steps = aaa(&server, &args).await;
    assert!(bad_steps.error_line(2).contains("--steps"));

    // Nothing of the above changed the run: the call still waits.
    let pending = list_approvals(&mut server.approvals().await, Default::default()).await;
    assert_eq!(pending.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_server_exits_3() {
    let mut server = TestServer::start().await;
    // A port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!("http://127.0.0.1:{port}");
    for args in [
        vec!["runs", "ls", "--server", &down],
        vec!["approvals", "review", "--server", &down],
        vec!["approve", "r", "c", "--server", &down],
    ] {
        let ended = aaa(&server, &args).await;
        let line = ended.error_line(3);
        assert!(
            line.starts_with(&format!("aaa: cannot reach aaa server at {down}: ")),
            "{line}"
        );
    }

    // A server that stops while `runs tail` follows a waiting run.
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut server.runs().await, scripted_reference_run()).await;
    let mut tail = Aaa::start(&server, &["runs", "tail", &run_id], "");
    while let Some(line) = tail.next_line().await {
        if line.contains("aaa.approval.requested") {
            break;
        }
    }
    server.stop().await;
    let ended = tail.finish().await;
    let line = ended.error_line(3);
    assert!(line.contains("UNAVAILABLE"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn review_answers_piped_into_stdin() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let mut run_ids = Vec::new();
    for _ in 0..3 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        wait_for_approval(&mut runs, &run_id).await;
        run_ids.push(run_id);
    }

    // Oldest run first: approve, deny (an empty reason is asked again), skip;
    // then stdin ends, which ends the review.
    let answers = "a\nd\n\nnot this vendor\ns\n";
    let review = Aaa::start(&server, &["approvals", "review"], answers)
        .finish()
        .await
        .ok();
    let out = &review.stdout;
    assert!(out.contains("Pay ACME $250"), "{out}");
    assert!(out.contains("\"amount\": 250"), "{out}");
    assert!(
        out.contains(&format!("granted call-1 of run {}", run_ids[0])),
        "{out}"
    );
    assert!(out.contains("a denial needs a reason"), "{out}");
    assert!(
        out.contains(&format!("denied call-1 of run {}", run_ids[1])),
        "{out}"
    );
    assert!(
        out.contains("1 approved, 1 denied, 0 edited, 1 skipped"),
        "{out}"
    );

    let events = history(&mut runs, &run_ids[0]).await;
    let grant = data(find(&events, "aaa.approval.granted"));
    let request = data(find(&events, "aaa.approval.requested"));
    assert_eq!(grant["arguments_sha256"], request["arguments_sha256"]);
    let events = history(&mut runs, &run_ids[1]).await;
    assert_eq!(
        data(find(&events, "aaa.approval.denied"))["reason"],
        "not this vendor"
    );
    let pending = list_approvals(&mut server.approvals().await, Default::default()).await;
    let pending: Vec<&str> = pending.iter().map(|a| a.run_id.as_str()).collect();
    assert_eq!(pending, [run_ids[2].as_str()]);

    // Quit leaves the skipped call alone.
    let review = Aaa::start(&server, &["approvals", "review"], "q\n")
        .finish()
        .await
        .ok();
    assert!(review.stdout.contains(&run_ids[2]), "{}", review.stdout);
    let pending = list_approvals(&mut server.approvals().await, Default::default()).await;
    assert_eq!(pending.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_and_tail_json_keep_big_integers_exact() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let mut watch = Aaa::start(&server, &["approvals", "watch", "--json"], "");
    let first = parse(&watch.next_line().await.expect("snapshot_complete"));
    assert_eq!(first["snapshot_complete"], json!({"pending": 0}));

    let big = "18446744073709551617"; // 2^64 + 1
    let steps = REFERENCE_STEPS.replace("250", big);
    let run_id = start_with_cli(&server, &steps, &[]).await;

    let line = watch.next_line().await.expect("requested");
    let requested = parse(&line);
    assert_eq!(requested["requested"]["run_id"], run_id.as_str());
    assert_eq!(
        requested["requested"]["arguments"]["amount"].to_string(),
        big
    );
    assert!(requested["position"].as_u64().is_some());
    let call_id = requested["requested"]["call_id"].as_str().unwrap();

    aaa(&server, &["approve", &run_id, call_id]).await.ok();
    let resolved = loop {
        let item = parse(&watch.next_line().await.expect("resolved"));
        if item.get("heartbeat").is_none() {
            break item;
        }
    };
    assert_eq!(resolved["resolved"]["outcome"], "granted");
    assert_eq!(resolved["resolved"]["call_id"], call_id);
    drop(watch);

    let tail = aaa(&server, &["runs", "tail", &run_id, "--json"])
        .await
        .ok();
    let events: Vec<Value> = tail.stdout.lines().map(parse).collect();
    let request = events.iter().find(|e| e["type"] == "aaa.tool.requested");
    assert_eq!(
        request.unwrap()["data"]["arguments"]["amount"].to_string(),
        big
    );
    let tasks = worker.stop().await;
    assert!(tool_task(&tasks[0]).arguments_json.contains(big));
}

/// `aaa ARGS` in a pseudo-terminal made by util-linux `script`, so that its
/// stdin and stdout are a terminal; None when there is no `script`.
fn in_terminal(server: &impl Server, args: &str, stdin: &str, no_color: bool) -> Option<Aaa> {
    Command::new("script").arg("--version").output().ok()?;
    let line = format!("'{}' {args}", env!("CARGO_BIN_EXE_aaa"));
    let mut command = Command::new("script");
    command.args(["--quiet", "--return", "--command", &line, "/dev/null"]);
    match no_color {
        true => command.env("NO_COLOR", "1"),
        false => command.env_remove("NO_COLOR"),
    };
    Some(Aaa::spawn(server, command, stdin))
}

#[tokio::test(flavor = "multi_thread")]
async fn review_in_a_terminal_is_colored_unless_no_color() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &run_id).await;

    let plain = in_terminal(&server, &format!("runs show {run_id}"), "", true);
    let Some(plain) = plain else {
        eprintln!("skipped: no util-linux `script` to make a pseudo-terminal");
        return;
    };
    let plain = plain.finish().await.ok();
    assert!(
        plain.stdout.contains("waits for call-1"),
        "{}",
        plain.stdout
    );
    assert!(!plain.stdout.contains('\x1b'), "{}", plain.stdout);

    let review = in_terminal(&server, "approvals review", "a\n", false).unwrap();
    let review = review.finish().await.ok();
    assert!(
        review.stdout.contains("\x1b[1;33mwire_money"),
        "{}",
        review.stdout
    );
    assert!(
        review
            .stdout
            .contains(&format!("granted call-1 of run {run_id}")),
        "{}",
        review.stdout
    );
    wait_for_event(&mut runs, &run_id, "aaa.approval.granted").await;
}

/// Over TLS with auth on: the server's CA and a token get through; no token
/// is refused by the server (exit 1), no CA file is a usage error (exit 2).
#[tokio::test(flavor = "multi_thread")]
async fn over_tls_with_the_servers_ca_and_a_token() {
    let dir = tempfile::tempdir().unwrap();
    crate::auth::make_pki(dir.path());
    let text = format!(
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n\n\
         [[principal]]\nname = \"ops\"\nroles = [\"reader\"]\ntoken_sha256 = \"{}\"\n",
        aaa::auth::sha256_hex(b"token-ops")
    );
    let auth =
        std::sync::Arc::new(aaa::auth::AuthConfig::parse(&text, dir.path()).expect("auth config"));
    let server = TestServer::start_with(move |config| config.auth = Some(auth.clone())).await;
    let url = format!("https://localhost:{}", server.addr().port());
    let ca = dir.path().join("ca.pem");
    let ca = ca.to_str().unwrap();
    let tls = ["runs", "ls", "--json", "--server", &url, "--ca-cert", ca];

    let listed = aaa(&server, &[&tls[..], &["--token", "token-ops"]].concat())
        .await
        .ok();
    assert_eq!(listed.json()["runs"], json!([]), "{}", listed.stdout);

    let anonymous = aaa(&server, &tls).await;
    assert!(anonymous.error_line(1).contains("UNAUTHENTICATED"));

    let no_ca = aaa(&server, &["runs", "ls", "--server", &url]).await;
    assert!(no_ca.error_line(2).contains("--ca-cert"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_ends_a_waiting_run_once() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_with_cli(&server, REFERENCE_STEPS, &[]).await;
    wait_for_approval(&mut server.runs().await, &run_id).await;

    let cancelled = aaa(
        &server,
        &[
            "runs",
            "cancel",
            &run_id,
            "--reason",
            "duplicate payment",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert!(cancelled["seq"].as_u64().unwrap() > 0, "{cancelled}");
    let again = aaa(&server, &["runs", "cancel", &run_id]).await.ok();
    assert!(
        again.stdout.contains("already cancelled"),
        "{}",
        again.stdout
    );
    let tail = aaa(&server, &["runs", "tail", &run_id]).await;
    assert_eq!(tail.code, 4, "{}", tail.stderr);
    assert!(
        tail.stdout
            .lines()
            .last()
            .unwrap()
            .contains("aaa.run.cancelled"),
        "{}",
        tail.stdout
    );
    let events = history(&mut server.runs().await, &run_id).await;
    assert_eq!(
        data(find(&events, "aaa.run.cancelled"))["reason"],
        "duplicate payment"
    );
    assert!(!events.iter().any(|e| e.r#type == "aaa.tool.started"));
}

/// `review --wait` stays on call: a request made after the inbox was
/// reviewed is shown and answered as it comes.
#[tokio::test(flavor = "multi_thread")]
async fn review_wait_answers_a_request_that_comes_later() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let mut review = Aaa::start(&server, &["approvals", "review", "--wait"], "a\n");
    while let Some(line) = review.next_line().await {
        if line.starts_with("waiting for new requests") {
            break;
        }
    }
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let granted = format!("granted call-1 of run {run_id}");
    loop {
        let line = review.next_line().await.expect("review goes on");
        if line.contains(&granted) {
            break;
        }
    }
    let events = history(&mut runs, &run_id).await;
    assert_eq!(
        data(find(&events, "aaa.approval.granted"))["call_id"],
        "call-1"
    );
}

/// `aaa cluster status` names the server that answered and shows it as the
/// owner of every shard (the embedded store, or a lone server on a
/// database); the table has the same member.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_status_shows_the_lone_server_as_the_owner() {
    let server = TestServer::start().await;
    let status = aaa(&server, &["cluster", "status", "--json"])
        .await
        .ok()
        .json();
    let store = if on_postgres() {
        "postgres"
    } else {
        "embedded"
    };
    assert_eq!(status["store"], store, "{status}");
    assert_eq!(status["unowned_shards"], 0, "{status}");
    let members = status["members"].as_array().expect("members");
    assert_eq!(members.len(), 1, "{status}");
    assert_eq!(members[0]["server"], status["this_server"]);
    assert_eq!(members[0]["role"], "owner");
    assert_eq!(members[0]["shards"], 256);
    assert_eq!(
        members[0]["spreads"], false,
        "an in-process test server: one owner"
    );
    let table = aaa(&server, &["cluster", "status"]).await.ok().stdout;
    let header = match on_postgres() {
        true => "store postgres (one owner), 256 shards, 0 without a live owner",
        false => "store embedded, 256 shards, 0 without a live owner",
    };
    assert!(table.starts_with(header), "{table}");
    let name = status["this_server"].as_str().unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(name) && l.contains("owner")),
        "{table}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn edit_votes_and_batch_decisions_from_the_terminal() {
    let server = TestServer::start().await;
    let two_approvers = aaa::proto::ToolDefinition {
        approvals_required: 2,
        ..wire_money()
    };
    register(&mut server.workers().await, vec![two_approvers], &[]).await;
    let mut runs = server.runs().await;
    let mut run_ids = Vec::new();
    for _ in 0..3 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        wait_for_approval(&mut runs, &run_id).await;
        run_ids.push(run_id);
    }

    // An edit with the editor's grant: one vote of two on the new call.
    let edited = aaa(
        &server,
        &[
            "edit",
            &run_ids[0],
            "call-1",
            "--arguments",
            r#"{"amount":200,"to":"ACME"}"#,
            "--reason",
            "over the cap",
            "--grant",
            "--approver",
            "alice",
        ],
    )
    .await
    .ok();
    assert!(
        edited.stdout.contains(&format!(
            "edited call-1 of run {}: call-2 takes its place with your grant",
            run_ids[0]
        )),
        "{}",
        edited.stdout
    );
    let listing = aaa(
        &server,
        &["approvals", "ls", "--run", &run_ids[0], "--json"],
    )
    .await
    .ok()
    .json();
    let approval = &listing["approvals"][0];
    assert_eq!(approval["call_id"], "call-2");
    assert_eq!(approval["edited_from"], "call-1");
    assert_eq!(approval["votes"][0]["approver"], "alice");
    let voted = aaa(
        &server,
        &["approve", &run_ids[0], "call-2", "--approver", "alice"],
    )
    .await;
    assert!(
        voted.error_line(1).contains("alice already voted"),
        "{}",
        voted.stderr
    );

    // Everything listed, approved in one batch by bob: each call gets its
    // second grant (or first); then again: nothing more to decide.
    let listing = aaa(&server, &["approvals", "ls", "--json"])
        .await
        .ok()
        .stdout;
    let batch = Aaa::start(
        &server,
        &["approve", "--from", "-", "--approver", "bob"],
        &listing,
    )
    .finish()
    .await
    .ok();
    assert!(batch.stdout.contains("3 calls decided"), "{}", batch.stdout);
    let events = history(&mut runs, &run_ids[0]).await;
    assert_eq!(
        data(find(&events, "aaa.approval.granted"))["approvers"],
        json!(["alice", "bob"])
    );
    let again = Aaa::start(
        &server,
        &["approve", "--from", "-", "--approver", "bob"],
        &listing,
    )
    .finish()
    .await;
    assert!(
        again.error_line(1).contains("0 of 3 calls decided"),
        "{}",
        again.stderr
    );

    // review --batch: pick the remaining two by number and deny them.
    let denied = Aaa::start(
        &server,
        &["approvals", "review", "--batch"],
        "1-2\nd\nnot today\n",
    )
    .finish()
    .await
    .ok();
    assert!(
        denied.stdout.contains("2 calls decided"),
        "{}",
        denied.stdout
    );
    assert!(
        denied.stdout.contains("grants     1 of 2 grants (bob)"),
        "{}",
        denied.stdout
    );
    for run_id in &run_ids[1..] {
        let events = wait_for_end(&mut runs, run_id).await;
        assert_eq!(
            data(find(&events, "aaa.approval.denied"))["reason"],
            "not today"
        );
    }
}

/// The example policy of docs/policy.md, as printed there, with the
/// principals of the policy tests (alice and bob in finance, dave in
/// finance-leads, carol in no group): what it promises holds from the
/// terminal.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_policy_works_end_to_end_from_the_terminal() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/policy.md"))
        .expect("docs/policy.md");
    let example = docs
        .split("```toml\n")
        .find(|block| block.starts_with("# policy.toml"))
        .and_then(|block| block.split("```").next())
        .expect("the example policy in docs/policy.md");
    let dir = tempfile::tempdir().unwrap();
    let server = crate::policy::start(dir.path(), example).await;
    crate::policy::register_tools(&server).await;
    let file = dir.path().join("policy.toml");
    let mut runner = Clients::with_token(&server, &crate::auth::token("runner")).await;
    let mut start = async |arguments: &str| {
        let run_id = runner
            .runs
            .start_run(scripted_run("wire_money", arguments))
            .await
            .expect("StartRun")
            .into_inner()
            .run_id;
        let events = runner
            .follow_until(&run_id, true, |e| e.r#type.starts_with("aaa.approval."))
            .await;
        (run_id, events.last().unwrap().r#type.clone())
    };
    let as_ = |who: &str| format!("token-{who}");

    let tried = aaa(
        &server,
        &[
            "policy",
            "test",
            file.to_str().unwrap(),
            "--tool",
            "wire_money",
            "--arguments",
            r#"{"amount":50,"to":"ACME"}"#,
        ],
    )
    .await
    .ok();
    assert!(
        tried
            .stdout
            .starts_with("rule small-payments-to-known-vendors allows it"),
        "{}",
        tried.stdout
    );
    let (_, first) = start(r#"{"amount":50,"to":"ACME"}"#).await;
    assert_eq!(first, "aaa.approval.granted", "nobody asked");

    // Over 10,000: two of finance; carol is in none of the groups.
    let (large, first) = start(r#"{"amount":20000,"to":"Initech"}"#).await;
    assert_eq!(first, "aaa.approval.requested");
    let carols = aaa(
        &server,
        &[
            "approvals",
            "ls",
            "--mine",
            "--json",
            "--token",
            &as_("carol"),
        ],
    )
    .await
    .ok();
    assert_eq!(carols.json()["approvals"], json!([]));
    let refused = aaa(
        &server,
        &["approve", &large, "call-1", "--token", &as_("carol")],
    )
    .await;
    assert!(
        refused.error_line(1).contains("NOT_AN_APPROVER_FOR_CALL"),
        "{}",
        refused.stderr
    );
    let voted = aaa(
        &server,
        &["approve", &large, "call-1", "--token", &as_("alice")],
    )
    .await
    .ok();
    assert!(voted.stdout.contains("1 of 2 grants"), "{}", voted.stdout);
    let granted = aaa(
        &server,
        &["approve", &large, "call-1", "--token", &as_("bob")],
    )
    .await
    .ok();
    assert!(
        granted.stdout.starts_with("granted call-1"),
        "{}",
        granted.stdout
    );

    // Unanswered for 10 minutes: finance-leads may decide too.
    let (medium, _) = start(r#"{"amount":500,"to":"Initech"}"#).await;
    server.clock().advance(std::time::Duration::from_secs(601));
    runner
        .wait_for_event(&medium, "aaa.approval.escalated")
        .await;
    let events = runner.history(&medium).await;
    assert_eq!(
        count(&events, "aaa.approval.reminded"),
        1,
        "reminded after 5 minutes"
    );
    let granted = aaa(
        &server,
        &["approve", &medium, "call-1", "--token", &as_("dave")],
    )
    .await
    .ok();
    assert!(
        granted.stdout.starts_with("granted call-1"),
        "{}",
        granted.stdout
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn standing_grants_are_created_listed_and_revoked_from_the_terminal() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let create = [
        "grants",
        "create",
        "--tool",
        "wire_money",
        "--label",
        "team=payroll",
        "--condition",
        "args.amount < 1000",
        "--expires-in",
        "2h",
        "--max-uses",
        "2",
        "--reason",
        "payroll day",
        "--request-id",
        "payroll-day-1",
    ];
    let created = aaa(&server, &create).await.ok();
    let id = created.stdout.trim().to_string();
    assert_eq!(id.len(), 36, "the grant's id: {}", created.stdout);
    // The same command again (a script's retry) creates nothing more.
    let again = aaa(&server, &create).await.ok();
    assert_eq!(again.stdout.trim(), id);
    let listed = aaa(&server, &["grants", "ls", "--json"]).await.ok().json();
    assert_eq!(listed["grants"].as_array().unwrap().len(), 1, "{listed}");

    // A payroll run's call is granted by it, nobody asked.
    let run_id = start_with_cli(&server, REFERENCE_STEPS, &["--label", "team=payroll"]).await;
    let mut runs = server.runs().await;
    let events = wait_for_event(&mut runs, &run_id, "aaa.approval.granted").await;
    let actor = events.last().unwrap().actor.clone().unwrap();
    assert_eq!(
        (actor.kind, actor.name.as_str()),
        (aaa::proto::ActorKind::Grant as i32, id.as_str())
    );

    let listed = aaa(&server, &["grants", "ls", "--json"]).await.ok().json();
    let grant = &listed["grants"][0];
    assert_eq!(grant["id"], id.as_str());
    assert_eq!(grant["scope"]["labels"], json!({"team": "payroll"}));
    assert_eq!(
        (grant["uses"].clone(), grant["uses_left"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(grant["state"], "active");
    let table = aaa(&server, &["grants", "ls"]).await.ok();
    assert!(table.stdout.starts_with("ID"), "{}", table.stdout);
    assert!(table.stdout.contains("team=payroll"), "{}", table.stdout);
    assert!(table.stdout.contains("1/2"), "{}", table.stdout);

    let revoked = aaa(&server, &["grants", "revoke", &id, "--reason", "done"])
        .await
        .ok();
    assert_eq!(
        revoked.stdout.trim(),
        format!("revoked {id} (uses: 1): done")
    );
    let listed = aaa(&server, &["grants", "ls", "--json"]).await.ok().json();
    assert_eq!(listed["grants"], json!([]));
    let all = aaa(&server, &["grants", "ls", "--all", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(all["grants"][0]["state"], "revoked");
    assert_eq!(all["grants"][0]["revoke_reason"], "done");

    // Refusals: one line, exit 1, naming the field; usage errors exit 2.
    let refused = aaa(
        &server,
        &[
            "grants",
            "create",
            "--tool",
            "wire_money",
            "--condition",
            "args.amount <",
            "--reason",
            "x",
        ],
    )
    .await;
    let line = refused.error_line(1);
    assert!(
        line.contains("condition:") && line.ends_with("(INVALID_FIELD)"),
        "{line}"
    );
    let unknown = aaa(&server, &["grants", "revoke", "nope", "--reason", "x"]).await;
    assert!(unknown.error_line(1).ends_with("(GRANT_NOT_FOUND)"));
    let usage = aaa(
        &server,
        &[
            "grants",
            "create",
            "--tool",
            "wire_money",
            "--expires-in",
            "2 weeks",
            "--reason",
            "x",
        ],
    )
    .await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    server.shutdown().await;
}

#[tokio::test]
async fn approvals_ls_links_to_each_calls_page_in_the_web_inbox() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let mut runs = server.runs().await;
    let older = start_run(&mut runs, scripted_reference_run()).await;
    let newer = start_run(&mut runs, scripted_reference_run()).await;
    for run in [&older, &newer] {
        wait_for_approval(&mut runs, run).await;
    }

    // By default the links are on the --server URL, where the pages are.
    let listed = aaa(&server, &["approvals", "ls", "--links"]).await.ok();
    let header = listed.stdout.lines().next().unwrap();
    assert!(header.contains("LINK"), "{header}");
    let link = format!("http://{}/calls/{older}/call-1", server.addr());
    assert!(listed.stdout.contains(&link), "{}", listed.stdout);

    // --public-url (as `aaa serve` has it), newest first, as JSON.
    let args = [
        "approvals",
        "ls",
        "--links",
        "--json",
        "--newest-first",
        "--public-url",
        "https://aaa.example.com/",
    ];
    let listed = aaa(&server, &args).await.ok().json();
    let approvals = listed["approvals"].as_array().unwrap();
    assert_eq!(approvals[0]["run_id"], newer.as_str());
    assert_eq!(
        approvals[1]["link"],
        format!("https://aaa.example.com/calls/{older}/call-1")
    );
    // Without --links, no link.
    let listed = aaa(&server, &["approvals", "ls", "--json"])
        .await
        .ok()
        .json();
    assert!(listed["approvals"][0].get("link").is_none());
    server.shutdown().await;
}

/// Runs `aaa ARGS` without a server; returns its exit code and stderr.
fn aaa_alone(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_aaa"))
        .args(args)
        .env_remove("AAA_LOG")
        .env_remove("AAA_LISTEN")
        .stdin(Stdio::null())
        .output()
        .expect("run aaa");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code().expect("aaa ended by a signal"), stderr)
}

#[test]
fn an_unknown_flag_names_the_flag_to_use_instead() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    // `aaa serve`: one line, exit 64, naming the flag that does it.
    let cases: &[(&[&str], &str)] = &[
        (&["--port", "50052"], "use --listen 127.0.0.1:50052"),
        (&["--port=50052"], "use --listen 127.0.0.1:50052"),
        (&["--host", "0.0.0.0"], "use --listen 0.0.0.0:50051"),
        (&["--listn", "127.0.0.1:0"], "'--listen'"),
        (&["--data_dir", "x"], "'--data-dir'"),
        (&["--database", "x"], "--store postgres://"),
        (&["--zzz"], "`aaa serve --help` lists every flag"),
    ];
    for (args, hint) in cases {
        let mut all = vec!["serve", "--data-dir", data];
        all.extend_from_slice(args);
        let (code, stderr) = aaa_alone(&all);
        assert_eq!(code, 64, "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("aaa serve: unexpected argument"),
            "{stderr}"
        );
        assert!(
            stderr.contains(hint),
            "{args:?} should say {hint}: {stderr}"
        );
    }
    assert!(!data_exists(&dir), "a refused serve made no data dir");

    // Client commands: clap's usage error (exit 2) with a tip.
    let cases: &[(&[&str], &str)] = &[
        (
            &["runs", "ls", "--port", "50052"],
            "--server http://127.0.0.1:50052",
        ),
        (&["approvals", "ls", "--servr", "x"], "'--server'"),
        (&["runs", "ls", "--jsn"], "'--json'"),
    ];
    for (args, hint) in cases {
        let (code, stderr) = aaa_alone(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains("tip:"), "{args:?}: {stderr}");
        assert!(
            stderr.contains(hint),
            "{args:?} should say {hint}: {stderr}"
        );
    }
}

fn data_exists(dir: &tempfile::TempDir) -> bool {
    dir.path().join("data").exists()
}

#[test]
fn the_server_log_is_plain_text_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_aaa"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("AAA_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aaa serve");
    // Read the log up to the line that says the server serves, then stop it.
    let mut log = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.expect("stderr");
        log.push_str(&line);
        log.push('\n');
        if line.contains("serves shards") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains("INFO"), "the server logged: {log}");
    assert!(
        !log.contains("\x1b["),
        "escape codes in a piped log: {log:?}"
    );
}
