//! Webhooks: a server-configured consumer group whose one member POSTs each
//! delivery as JSON to a URL, signed with HMAC-SHA256, and acks it on a 2xx
//! answer. A failed POST is nacked after a backoff that grows with the
//! attempt, so webhooks get the groups' guarantees: a durable cursor, at
//! least once, dead letters after max deliveries, replay.
//!
//! Each POST carries `X-Aaa-Delivery` (the delivery id, new per attempt),
//! `X-Aaa-Event` (`run_id/seq`: the key to deduplicate on) and
//! `X-Aaa-Signature-256: sha256=<hex HMAC-SHA256 of the body with the secret>`.

use std::time::Duration;

use bytes::Bytes;

use hmac::{Hmac, Mac};
use http_body_util::Full;
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Definition, Error, Membership, Outbound, Start, Subscriptions};
use crate::engine;
use crate::metrics::WebhookOutcome;
use crate::store::{EventRecord, RunId};
use prometheus_client::metrics::counter::Counter;

/// A delivery may stay unacked this long: longer than a POST's timeout plus
/// the longest backoff, so the backoff, not the ack timeout, paces retries.
const ACK_TIMEOUT: Duration = Duration::from_secs(300);
const POST_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// POSTs in flight at once per webhook.
const IN_FLIGHT: u32 = 8;

/// A webhook as the server's configuration declares it.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Names its consumer group, `webhook.<name>`.
    pub name: String,
    /// An `http://` or `https://` URL.
    pub url: http::Uri,
    /// PEM of the only CA trusted for an https URL (a receiver with a
    /// private CA); None trusts the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Patterns, as for Subscribe.
    pub event_types: Vec<String>,
    /// The HMAC-SHA256 key of the signature header.
    pub secret: String,
    /// Attempts before dead-lettering; 0 means the groups' default.
    pub max_deliveries: u32,
    /// The web inbox's base URL (`--public-url`, set by the server): each
    /// body links to the run's page and, for an event about a call, to the
    /// call's page. `None`: no links.
    pub public_url: Option<String>,
}

impl WebhookConfig {
    pub fn group(&self) -> String {
        format!("webhook.{}", self.name)
    }

    /// Reads and checks a webhooks file (TOML):
    ///
    /// ```toml
    /// [[webhook]]
    /// name = "notify"                            # group "webhook.notify"
    /// url = "https://hooks.example.com/aaa"  # http:// or https://
    /// event_types = ["aaa.approval.requested"]   # patterns, as for Subscribe
    /// secret_env = "NOTIFY_SECRET"               # or: secret = "..."
    /// max_deliveries = 10                        # optional
    /// ca_cert = "receiver-ca.pem"                # optional, relative to this file
    /// ```
    pub fn load(path: &std::path::Path) -> Result<Vec<WebhookConfig>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(std::path::Path::new("."));
        Self::parse(&text, base, |name| std::env::var(name).ok())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks the TOML text of a webhooks file; `env` looks up `secret_env`,
    /// and `ca_cert` paths are relative to `base`.
    pub fn parse(
        text: &str,
        base: &std::path::Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<WebhookConfig>, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            #[serde(default)]
            webhook: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            name: String,
            url: String,
            event_types: Vec<String>,
            secret: Option<String>,
            secret_env: Option<String>,
            #[serde(default)]
            max_deliveries: u32,
            ca_cert: Option<std::path::PathBuf>,
        }
        let file: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let mut names = std::collections::HashSet::new();
        let mut hooks = Vec::new();
        for entry in file.webhook {
            let at = format!("webhook '{}'", entry.name);
            let valid_name = !entry.name.is_empty()
                && entry
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
            if !valid_name || !names.insert(entry.name.clone()) {
                return Err(format!("{at}: names are unique: letters, digits and _ - ."));
            }
            let url: http::Uri = entry.url.parse().map_err(|e| format!("{at}: url: {e}"))?;
            if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
                return Err(format!("{at}: url: an http:// or https:// URL with a host"));
            }
            let ca_pem = match entry.ca_cert {
                Some(file) => {
                    let path = base.join(file);
                    let pem = std::fs::read(&path)
                        .map_err(|e| format!("{at}: ca_cert: {}: {e}", path.display()))?;
                    crate::https::trusted_roots(Some(&pem))
                        .map_err(|e| format!("{at}: ca_cert: {e}"))?;
                    Some(pem)
                }
                None => None,
            };
            if entry.event_types.is_empty() {
                return Err(format!("{at}: event_types: at least one"));
            }
            for pattern in &entry.event_types {
                super::check_pattern("event_types", pattern).map_err(|e| format!("{at}: {e}"))?;
            }
            let secret = match (entry.secret, entry.secret_env) {
                (Some(secret), None) => secret,
                (None, Some(var)) => {
                    env(&var).ok_or_else(|| format!("{at}: secret_env: ${var} is not set"))?
                }
                _ => return Err(format!("{at}: give one of secret and secret_env")),
            };
            if secret.is_empty() {
                return Err(format!("{at}: the secret is empty"));
            }
            if entry.max_deliveries > super::MAX_MAX_DELIVERIES {
                return Err(format!(
                    "{at}: max_deliveries: at most {}",
                    super::MAX_MAX_DELIVERIES
                ));
            }
            hooks.push(WebhookConfig {
                name: entry.name,
                url,
                ca_pem,
                event_types: entry.event_types,
                secret,
                max_deliveries: entry.max_deliveries,
                public_url: None,
            });
        }
        Ok(hooks)
    }
}

impl Subscriptions {
    /// Starts delivering to the webhook: joins its group (created at the end
    /// of the log the first time) and POSTs until shutdown.
    pub async fn start_webhook(&self, hook: WebhookConfig) -> Result<(), Error> {
        let definition = Definition {
            group: hook.group(),
            event_types: hook.event_types.clone(),
            labels: Default::default(),
            ack_timeout: Some(ACK_TIMEOUT),
            max_deliveries: (hook.max_deliveries > 0).then_some(hook.max_deliveries),
        };
        let membership = self.join(definition, Start::Now, IN_FLIGHT).await?;
        let shutdown = self.inner.shutdown.clone();
        let families = self.inner.metrics.families();
        let group = families.groups.label(&hook.group());
        let counter = |outcome| {
            let label = WebhookOutcome {
                group: group.clone(),
                outcome,
            };
            families.webhook_deliveries.get_or_create(&label).clone()
        };
        let outcomes = Outcomes {
            delivered: counter("delivered"),
            failed: counter("failed"),
        };
        tokio::spawn(deliver(membership, hook, outcomes, shutdown));
        Ok(())
    }
}

/// The webhook's member: a POST task per delivery; their outcomes come back
/// here to be acked or nacked in one place.
/// The webhook's deliveries, counted by how their POST went.
struct Outcomes {
    delivered: Counter,
    failed: Counter,
}

async fn deliver(
    mut membership: Membership,
    hook: WebhookConfig,
    outcomes: Outcomes,
    shutdown: CancellationToken,
) {
    let client = match crate::https::client(hook.ca_pem.as_deref()) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("webhook {}: {e}", hook.name);
            return;
        }
    };
    let (done_tx, mut done) = mpsc::channel::<(String, Option<String>)>(IN_FLIGHT as usize);
    loop {
        tokio::select! {
            out = membership.next() => match out {
                Ok(Outbound::Delivery { delivery_id, event, attempt, .. }) => {
                    let (client, hook, done_tx) = (client.clone(), hook.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let failure = post(&client, &hook, &delivery_id, attempt, &event).await.err();
                        if failure.is_some() {
                            tokio::time::sleep(backoff(attempt)).await;
                        }
                        let _ = done_tx.send((delivery_id, failure)).await;
                    });
                }
                Ok(Outbound::AckResult { .. }) => {}
                Err(e) => {
                    if !matches!(e, Error::Engine(engine::Error::ShuttingDown)) {
                        tracing::error!("webhook {}: {e}", hook.name);
                    }
                    return;
                }
            },
            Some((delivery_id, failure)) = done.recv() => {
                match &failure {
                    Some(reason) => {
                        outcomes.failed.inc();
                        tracing::warn!("webhook {}: delivery {delivery_id} failed: {reason}", hook.name);
                    }
                    None => {
                        outcomes.delivered.inc();
                    }
                }
                if membership.answer(delivery_id, failure).await.is_err() {
                    return;
                }
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

/// 1 s after the first failure, doubling up to a minute.
fn backoff(attempt: u32) -> Duration {
    let doubled = Duration::from_secs(1).saturating_mul(1 << attempt.saturating_sub(1).min(16));
    doubled.min(MAX_BACKOFF)
}

/// The POST body: the delivery and its event, data as JSON (not text), and
/// with a `public_url`, `links` to the pages of the run and of the call the
/// event is about (sign-in still required: the links grant nothing).
pub fn body(
    group: &str,
    delivery_id: &str,
    attempt: u32,
    event: &EventRecord,
    public_url: Option<&str>,
) -> Vec<u8> {
    let data: serde_json::Value =
        serde_json::from_str(&event.data_json).unwrap_or(serde_json::Value::Null);
    let run_id = RunId::from_slice(&event.run_id).map(|r| r.to_string());
    let links = match (public_url, &run_id) {
        (Some(base), Some(run)) => {
            let mut links = serde_json::json!({ "run": crate::present::run_url(base, run) });
            if let Some(call) = data["call_id"].as_str() {
                links["call"] = crate::present::call_url(base, run, call).into();
            }
            Some(links)
        }
        _ => None,
    };
    let mut body = serde_json::json!({
        "group": group,
        "delivery_id": delivery_id,
        "attempt": attempt,
        "event": {
            "run_id": run_id,
            "seq": event.seq,
            "position": event.position,
            "type": event.event_type,
            "time_ms": event.time_ms,
            "data": data,
        },
    });
    if let Some(links) = links {
        body["links"] = links;
    }
    serde_json::to_vec(&body).expect("JSON values serialize")
}

/// `sha256=<hex>` of the body, keyed with the secret.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

use crate::https::HttpsClient;

async fn post(
    client: &HttpsClient,
    hook: &WebhookConfig,
    delivery_id: &str,
    attempt: u32,
    event: &EventRecord,
) -> Result<(), String> {
    let body = body(
        &hook.group(),
        delivery_id,
        attempt,
        event,
        hook.public_url.as_deref(),
    );
    let run_id = RunId::from_slice(&event.run_id).map_or_else(String::new, |r| r.to_string());
    let request = http::Request::post(hook.url.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-aaa-delivery", delivery_id)
        .header("x-aaa-event", format!("{run_id}/{}", event.seq))
        .header("x-aaa-signature-256", signature(&hook.secret, &body))
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad request: {e}"))?;
    let response = tokio::time::timeout(POST_TIMEOUT, client.request(request))
        .await
        .map_err(|_| format!("no answer within {POST_TIMEOUT:?}"))?
        .map_err(|e| format!("POST failed: {e}"))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    use super::*;
    use crate::store::{SharedStore, WriteBatch};

    #[test]
    fn signature_is_hmac_sha256_hex() {
        let body = b"The quick brown fox jumps over the lazy dog";
        assert_eq!(
            signature("key", body),
            "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }

    #[test]
    fn webhooks_files_are_checked() {
        let env = |name: &str| (name == "SECRET").then(|| "from-env".to_string());
        let hooks = WebhookConfig::parse(
            r#"
            [[webhook]]
            name = "notify"
            url = "http://127.0.0.1:8080/aaa"
            event_types = ["aaa.approval.requested"]
            secret_env = "SECRET"
            [[webhook]]
            name = "audit"
            url = "http://audit.local/in"
            event_types = ["*"]
            secret = "s"
            max_deliveries = 10
            "#,
            std::path::Path::new("."),
            env,
        )
        .unwrap();
        assert_eq!(hooks.len(), 2);
        assert_eq!(hooks[0].group(), "webhook.notify");
        assert_eq!(hooks[0].secret, "from-env");
        assert_eq!(hooks[1].max_deliveries, 10);
        let entry = |line: &str| {
            format!(
                "[[webhook]]\nname = \"n\"\nurl = \"http://h/\"\nevent_types = [\"a.*\"]\n{line}\n"
            )
        };
        for (text, error) in [
            (entry("secret = \"s\"\nurl2 = 1"), "unknown field"),
            (entry(""), "give one of secret and secret_env"),
            (entry("secret_env = \"NOPE\""), "$NOPE is not set"),
            (
                entry("secret = \"s\"").replace("a.*", "a.*.b"),
                "event_types",
            ),
            (
                entry("secret = \"s\"").replace("http://h/", "ftp://h/"),
                "http:// or https://",
            ),
            (entry("secret = \"s\"").repeat(2), "unique"),
        ] {
            let refused = WebhookConfig::parse(&text, std::path::Path::new("."), env).unwrap_err();
            assert!(refused.contains(error), "{text}: {refused}");
        }
    }

    #[test]
    fn bodies_link_to_the_pages_of_the_run_and_the_call() {
        let run = RunId::new();
        let event = EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq: 5,
            event_type: "aaa.approval.requested".into(),
            data_json: r#"{"call_id":"call-1","name":"wire_money"}"#.into(),
            ..Default::default()
        };
        let with = body(
            "webhook.n",
            "d",
            1,
            &event,
            Some("https://aaa.example.com/"),
        );
        let with: serde_json::Value = serde_json::from_slice(&with).unwrap();
        assert_eq!(
            with["links"]["call"],
            format!("https://aaa.example.com/calls/{run}/call-1")
        );
        assert_eq!(
            with["links"]["run"],
            format!("https://aaa.example.com/runs/{run}")
        );
        let without: serde_json::Value =
            serde_json::from_slice(&body("webhook.n", "d", 1, &event, None)).unwrap();
        assert!(without.get("links").is_none(), "{without}");
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let delays: Vec<u64> = [1, 2, 3, 7, 8, 100].map(|a| backoff(a).as_secs()).to_vec();
        assert_eq!(delays, [1, 2, 4, 60, 60, 60]);
    }

    /// One HTTP/1.1 request as the receiver saw it.
    struct Received {
        headers: HashMap<String, String>,
        body: Vec<u8>,
    }

    /// A receiver on an ephemeral port that answers each request with the
    /// next of `statuses` and reports what it got.
    async fn receiver(statuses: Vec<u16>) -> (http::Uri, mpsc::UnboundedReceiver<Received>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut statuses = statuses.into_iter();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let mut socket = BufReader::new(socket);
                loop {
                    let mut headers = HashMap::new();
                    let mut line = String::new();
                    if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                        break; // the client closed the connection
                    }
                    loop {
                        line.clear();
                        socket.read_line(&mut line).await.unwrap();
                        match line.trim_end().split_once(": ") {
                            Some((k, v)) => headers.insert(k.to_lowercase(), v.to_string()),
                            None => break,
                        };
                    }
                    let length = headers["content-length"].parse().unwrap();
                    let mut body = vec![0; length];
                    socket.read_exact(&mut body).await.unwrap();
                    let status = statuses.next().unwrap_or(200);
                    let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                    socket.get_mut().write_all(answer.as_bytes()).await.unwrap();
                    let _ = tx.send(Received { headers, body });
                }
            }
        });
        (url.parse().unwrap(), rx)
    }

    async fn append(store: &SharedStore, run: RunId, seq: u64, ty: &str, data: &str) {
        let mut batch = WriteBatch::default();
        batch.push_event(EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            event_type: ty.into(),
            data_json: data.into(),
            ..Default::default()
        });
        store.commit(batch).await.unwrap();
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<Received>) -> Received {
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("no POST came")
            .expect("receiver stopped")
    }

    #[tokio::test]
    async fn posts_signed_json_and_retries_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(&crate::store::Settings::new(dir.path()))
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let subscriptions = Subscriptions::new(
            store.clone(),
            shutdown.clone(),
            crate::metrics::Metrics::new(),
        );
        let (url, mut received) = receiver(vec![500]).await;
        let hook = WebhookConfig {
            name: "payments".into(),
            url,
            ca_pem: None,
            event_types: vec!["app.*".into()],
            secret: "s3cret".into(),
            max_deliveries: 0,
            public_url: Some("https://aaa.example.com/".into()),
        };
        subscriptions.start_webhook(hook).await.unwrap();

        let run = RunId::new();
        append(&store, run, 1, "other.thing", "{}").await;
        append(&store, run, 2, "app.paid", r#"{"amount":250}"#).await;

        let first = next(&mut received).await;
        let second = next(&mut received).await; // after the 500 and a 1 s backoff
        for post in [&first, &second] {
            assert_eq!(
                post.headers["x-aaa-signature-256"],
                signature("s3cret", &post.body)
            );
            assert_eq!(post.headers["x-aaa-event"], format!("{run}/2"));
            assert_eq!(post.headers["content-type"], "application/json");
        }
        assert_ne!(
            first.headers["x-aaa-delivery"],
            second.headers["x-aaa-delivery"]
        );
        let body: serde_json::Value = serde_json::from_slice(&second.body).unwrap();
        assert_eq!(body["attempt"], 2);
        assert_eq!(body["group"], "webhook.payments");
        assert_eq!(body["event"]["type"], "app.paid");
        assert_eq!(body["event"]["data"]["amount"].to_string(), "250");
        assert_eq!(
            body["links"]["run"],
            format!("https://aaa.example.com/runs/{run}")
        );
        assert!(body["links"].get("call").is_none(), "{body}");

        // Acked: the next event is the next POST.
        append(&store, run, 3, "app.paid", r#"{"amount":7}"#).await;
        let third = next(&mut received).await;
        assert_eq!(third.headers["x-aaa-event"], format!("{run}/3"));
        shutdown.cancel();
        store.close().await;
    }
}
