//! A real Prometheus (Debian's package, which `.ci/run` installs) scrapes
//! a test server's `/metrics`; the test asks Prometheus's HTTP API what it
//! scraped: the pending gauge rises while a run waits and falls when the
//! call is granted, and the wait histogram counts the wait.
//!
//! Prometheus scrapes on its own schedule (every second here), so the
//! test waits for each condition with a bounded poll of its API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::metrics::try_http_get;
use crate::support::*;

/// The Prometheus binary: `AAA_PROMETHEUS`, else Debian's. `.ci/run` sets
/// the variable; without either the test says it was skipped.
fn prometheus_binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("AAA_PROMETHEUS") {
        return Some(PathBuf::from(path));
    }
    let debian = PathBuf::from("/usr/bin/prometheus");
    debian.exists().then_some(debian)
}

/// A Prometheus process on a loopback port, scraping `target` every
/// second; killed when dropped.
struct Prometheus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus on a port found free, and waits until it listens.
    /// Another process may take that port between the look and
    /// Prometheus's bind; then Prometheus exits and is started again on
    /// another, up to three times.
    async fn start(binary: &PathBuf, target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: aaa\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write config");
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port();
            let address = format!("127.0.0.1:{port}");
            let mut child = Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={address}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start prometheus");
            let deadline = Instant::now() + WAIT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // it could not listen there: another port
                }
                if tokio::net::TcpStream::connect(&address).await.is_ok() {
                    return Prometheus {
                        child,
                        address,
                        _dir: dir,
                    };
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("prometheus did not listen on any of three ports");
    }

    /// The value of `query`'s single series, or None when it has none.
    async fn query(&self, query: &str) -> Option<f64> {
        let path = format!(
            "/api/v1/query?query={}",
            query
                .bytes()
                .map(|b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        );
        // Refused until Prometheus listens.
        let (status, body) = try_http_get(self.address.parse().ok()?, &path, None)
            .await
            .ok()?;
        if status != 200 {
            return None;
        }
        let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = answer["data"]["result"].as_array()?;
        let first = result.first()?;
        first["value"][1].as_str()?.parse().ok()
    }

    /// Waits (up to a minute) until `query` answers `want`.
    async fn wait_for(&self, query: &str, want: f64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.query(query).await;
            if got == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus still answers {got:?} to {query}, not {want}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_sees_a_call_wait_and_be_granted() {
    let Some(binary) = prometheus_binary() else {
        eprintln!("skipped: no prometheus (set AAA_PROMETHEUS or install Debian's package)");
        return;
    };
    let server = TestServer::start().await;
    let prometheus = Prometheus::start(&binary, server.addr()).await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;

    let pending = r#"aaa_approvals_pending{job="aaa",tool="wire_money"}"#;
    let waits = r#"aaa_approval_wait_seconds_count{job="aaa",tool="wire_money",outcome="granted"}"#;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    prometheus.wait_for(pending, 1.0).await;

    grant(&mut runs, &run_id, &call_id).await;
    let task = poll_until_task(&mut workers, "payments-1", &["wire_money"], &[]).await;
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    wait_for_end(&mut runs, &run_id).await;
    prometheus.wait_for(pending, 0.0).await;
    prometheus.wait_for(waits, 1.0).await;
    prometheus.wait_for(r#"up{job="aaa"}"#, 1.0).await;
    drop(prometheus);
    server.shutdown().await;
}
