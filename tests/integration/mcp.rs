//! The `--mcp` file at start: a bad file exits 64 naming the upstream and
//! the field, and an upstream that cannot be reached fails the start
//! naming it; workers may not serve the gateway's model. (The gateway end
//! to end, with the MCP Python and TypeScript SDKs as clients and real
//! upstreams, is tests/mcp/, run by .ci/run.)

use std::process::Command;

/// `aaa serve --mcp FILE` on a loopback port, its exit code and stderr.
fn serve_with(mcp: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.toml");
    std::fs::write(&file, mcp).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_aaa"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--mcp")
        .arg(&file)
        .env_remove("AAA_AUTH_CONFIG")
        .output()
        .expect("run aaa");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_bad_mcp_file_exits_64_naming_the_upstream_and_the_field() {
    let cases = [
        (
            "[[upstream]]\nname = \"bank\"\ncommand = \"true\"\n[[upstream.tool]]\nname = \"wire_money\"\nrequires_approval = true\napprovals_required = 99\n",
            "upstream 'bank': tool[0].approvals_required",
        ),
        (
            "[[upstream]]\nname = \"bank\"\n[[upstream.tool]]\nname = \"echo\"\n",
            "upstream 'bank': give either command (a child process) or url",
        ),
        (
            "[[upstream]]\nname = \"bank\"\nurl = \"ftp://x\"\n[[upstream.tool]]\nname = \"echo\"\n",
            "upstream 'bank': url",
        ),
        (
            "[[upstream]]\nname = \"bank\"\ncommand = \"true\"\n[[upstream.tool]]\nname = \"echo\"\napprovers = [\"not a group!\"]\n",
            "upstream 'bank': tool[0].approvers",
        ),
        (
            "[[upstream]]\nname = \"bank\"\ncommand = \"true\"\n[[upstream.tool]]\nname = \"echo\"\n[[upstream.tool]]\nname = \"wire\"\nexpose_as = \"echo\"\n",
            "upstream 'bank': tool[1].expose_as",
        ),
        (
            "[[upstream]]\nname = \"bank\"\ncommand = \"true\"\nbogus = 1\n",
            "unknown field `bogus`",
        ),
    ];
    for (file, expected) in cases {
        let (code, stderr) = serve_with(file);
        assert_eq!(code, Some(64), "{file}: {stderr}");
        assert!(stderr.starts_with("aaa: --mcp "), "{stderr}");
        assert!(stderr.contains(expected), "{file}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn an_upstream_that_cannot_start_fails_the_start_naming_it() {
    let (code, stderr) = serve_with(
        "[[upstream]]\nname = \"bank\"\ncommand = \"/nonexistent/mcp-server\"\n[[upstream.tool]]\nname = \"echo\"\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr
            .contains("cannot serve MCP: upstream 'bank': cannot start '/nonexistent/mcp-server'"),
        "{stderr}"
    );
}

#[test]
fn header_values_never_print() {
    std::env::set_var("AAA_TEST_MCP_KEY", "s3cret-value");
    let config = aaa::mcp::McpConfig::parse(
        "[[upstream]]\nname = \"bank\"\nurl = \"https://bank.example/mcp\"\nheaders = { Authorization = \"Bearer lit3ral\" }\nheaders_from_env = { X-Key = \"AAA_TEST_MCP_KEY\" }\n[[upstream.tool]]\nname = \"echo\"\n",
        |name| std::env::var(name).ok(),
    )
    .unwrap();
    let printed = format!("{config:?}");
    assert!(
        !printed.contains("s3cret-value") && !printed.contains("lit3ral"),
        "{printed}"
    );
    let missing = aaa::mcp::McpConfig::parse(
        "[[upstream]]\nname = \"bank\"\nurl = \"https://bank.example/mcp\"\nheaders_from_env = { X-Key = \"AAA_TEST_MCP_UNSET\" }\n[[upstream.tool]]\nname = \"echo\"\n",
        |_| None,
    )
    .unwrap_err();
    assert_eq!(
        missing,
        "upstream 'bank': headers_from_env.X-Key: the environment variable AAA_TEST_MCP_UNSET is not set"
    );
}

/// The model `aaa.mcp` drives the runs of MCP sessions and only the
/// gateway serves it: a worker that registered or polled it would take
/// (and answer) the sessions' turns, so both are refused, naming the field.
/// The same for the gateway's worker identity.
#[tokio::test]
async fn a_worker_may_not_serve_the_gateways_model() {
    use crate::support::{Server, TestServer};
    use aaa::proto::{PollTaskRequest, RegisterWorkerRequest};

    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    let registered = workers
        .register_worker(RegisterWorkerRequest {
            identity: "w".into(),
            tools: vec![],
            models: vec!["gpt".into(), "aaa.mcp".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(
        registered.code(),
        tonic::Code::InvalidArgument,
        "{registered:?}"
    );
    assert!(
        registered
            .message()
            .contains("models[1]: 'aaa.mcp' is reserved for aaa's MCP gateway"),
        "{registered:?}"
    );
    let polled = workers
        .poll_task(PollTaskRequest {
            identity: "w".into(),
            tools: vec![],
            models: vec!["aaa.mcp".into()],
            wait_s: 0.001,
        })
        .await
        .unwrap_err();
    assert_eq!(polled.code(), tonic::Code::InvalidArgument, "{polled:?}");
    assert!(
        polled
            .message()
            .contains("models[0]: 'aaa.mcp' is reserved for aaa's MCP gateway"),
        "{polled:?}"
    );

    // Nor may a worker take the gateway's identity: its calls would be
    // recorded as served by the gateway.
    let registered = workers
        .register_worker(RegisterWorkerRequest {
            identity: "aaa.mcp".into(),
            tools: vec![],
            models: vec!["gpt".into()],
        })
        .await
        .unwrap_err();
    let polled = workers
        .poll_task(PollTaskRequest {
            identity: "aaa.mcp".into(),
            tools: vec![],
            models: vec!["gpt".into()],
            wait_s: 0.001,
        })
        .await
        .unwrap_err();
    for refused in [registered, polled] {
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(
            refused
                .message()
                .contains("identity: 'aaa.mcp' is reserved for aaa's MCP gateway"),
            "{refused:?}"
        );
    }
    server.shutdown().await;
}
