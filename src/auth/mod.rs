//! Who may do what: the auth config file (principals, their roles, TLS),
//! how a caller proves to be a principal (bearer token or client
//! certificate), and the one table of which roles may call which RPC.
//!
//! Secrets never stay in memory: the file holds SHA-256 hashes of tokens and
//! of client certificates, and a presented token is hashed before lookup.

pub mod forwarded;
pub use forwarded::ForwardedPeer;
mod layer;
pub mod throttle;
pub use throttle::Throttle;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use layer::{credentials, remote_addr, AuthLayer};

/// What a principal may do (see [`RULES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Start and cancel runs, signal application events, read runs.
    Runner,
    /// Decide approvals (Signal aaa.approval.granted/denied), list and watch them.
    Approver,
    /// Serve tools and models (WorkerService).
    Worker,
    /// Read runs, events and approvals.
    Reader,
    /// Everything.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Runner => "runner",
            Role::Approver => "approver",
            Role::Worker => "worker",
            Role::Reader => "reader",
            Role::Admin => "admin",
        }
    }
}

use Role::{Approver, Reader, Runner, Worker};

/// Which roles may call each RPC; admin may call everything. The Signal row
/// lets both in: its handler then asks [`authorize_signal`], because which
/// role a signal needs depends on its event type. Methods not listed (a
/// service added later) are for admin only until they get a row.
pub const RULES: &[(&str, &[Role])] = &[
    ("/aaa.v1.RunService/StartRun", &[Runner]),
    ("/aaa.v1.RunService/GetRun", &[Runner, Reader]),
    ("/aaa.v1.RunService/ListRuns", &[Runner, Reader]),
    ("/aaa.v1.RunService/StreamEvents", &[Runner, Reader]),
    ("/aaa.v1.RunService/Signal", &[Runner, Approver]),
    ("/aaa.v1.RunService/CancelRun", &[Runner]),
    ("/aaa.v1.ApprovalService/ListApprovals", &[Approver, Reader]),
    (
        "/aaa.v1.ApprovalService/WatchApprovals",
        &[Approver, Reader],
    ),
    ("/aaa.v1.ApprovalService/DecideApprovals", &[Approver]),
    // The rules and the file they came from are for those who decide.
    ("/aaa.v1.PolicyService/GetPolicy", &[Approver]),
    ("/aaa.v1.GrantService/CreateGrant", &[Approver]),
    ("/aaa.v1.GrantService/RevokeGrant", &[Approver]),
    ("/aaa.v1.GrantService/ListGrants", &[Approver, Reader]),
    // Admin only.
    ("/aaa.v1.PolicyService/ReloadPolicy", &[]),
    ("/aaa.v1.WorkerService/RegisterWorker", &[Worker]),
    ("/aaa.v1.WorkerService/PollTask", &[Worker]),
    ("/aaa.v1.WorkerService/HeartbeatTask", &[Worker]),
    ("/aaa.v1.WorkerService/CompleteTask", &[Worker]),
    ("/aaa.v1.WorkerService/FailTask", &[Worker]),
    // Consumers of the global log read every run's events and ack them;
    // replaying dead letters re-delivers, so it stays with admin.
    ("/aaa.v1.SubscriptionService/Subscribe", &[Worker, Reader]),
    (
        "/aaa.v1.SubscriptionService/ListDeadLetters",
        &[Worker, Reader],
    ),
    // Every role: the SDKs read who owns which runs to send a run's writes
    // (a runner's cancel, an approver's grant, a worker's results) there.
    (
        "/aaa.v1.ClusterService/GetCluster",
        &[Runner, Approver, Worker, Reader],
    ),
    // A worker's poll another server sends on (refused unless forwarded).
    ("/aaa.v1.ClusterService/PeerPoll", &[Worker]),
];

/// Services anyone may call: load balancers probe health, and tools list
/// the API through reflection before they have credentials.
const OPEN_SERVICES: &[&str] = &[
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// An authenticated caller: the name recorded as the actor of the events it
/// causes, its roles, and the tools and models it may serve as a worker.
/// The auth layer puts it in the request extensions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Principal {
    pub name: String,
    pub roles: Vec<Role>,
    pub tools: Vec<String>,
    pub models: Vec<String>,
    /// Approver groups (`finance`, `sre-oncall`): a call whose tool or
    /// policy names groups may be decided only by their members.
    pub groups: Vec<String>,
}

impl Principal {
    fn has_any(&self, roles: &[Role]) -> bool {
        self.roles
            .iter()
            .any(|r| *r == Role::Admin || roles.contains(r))
    }

    /// Is it an admin? Admins may also loosen a tool's gate at
    /// RegisterWorker, which only tightens it for anyone else.
    pub fn is_admin(&self) -> bool {
        self.has_any(&[])
    }

    /// May it read (`read`) or act on runs that others started? Runners
    /// read, signal and cancel only the runs they started; readers read
    /// every run; admin does anything.
    pub fn sees_every_run(&self, read: bool) -> bool {
        let roles: &[Role] = if read { &[Reader] } else { &[] };
        self.has_any(roles)
    }

    /// May it serve (register, poll) the tool or model `name`? Only those
    /// its `tools` / `models` list; admin serves any.
    pub fn may_serve(&self, kind: Served, name: &str) -> Result<(), Refusal> {
        let allowed = match kind {
            Served::Tool => &self.tools,
            Served::Model => &self.models,
        };
        if self.has_any(&[]) || allowed.iter().any(|t| t == name) {
            return Ok(());
        }
        Err(Refusal::NotAllowedToServe {
            principal: self.name.clone(),
            kind,
            name: name.to_string(),
        })
    }
}

/// What a worker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Tool,
    Model,
}

impl fmt::Display for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Served::Tool => "tool",
            Served::Model => "model",
        })
    }
}

/// Why a call was refused. Mapped to a gRPC status in `api::status`; the
/// text names no secret, so it is also what the server logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("missing credentials: send `authorization: Bearer TOKEN` or a client certificate")]
    MissingCredentials,
    #[error("unknown credentials: the token or client certificate matches no principal")]
    UnknownCredentials,
    #[error("malformed credentials: {0}")]
    MalformedCredentials(&'static str),
    #[error(
        "too many wrong credentials from this address: its calls are refused for {retry_after_s} s more, right ones included"
    )]
    Throttled { retry_after_s: u64 },
    #[error(
        "{principal} may not call {method}: it needs the role {}",
        or_list(needed)
    )]
    MissingRole {
        principal: String,
        method: String,
        /// The roles that would do, admin last.
        needed: Vec<&'static str>,
    },
    #[error("{principal} did not start run '{run}': a runner acts only on the runs it started")]
    NotRunOwner { principal: String, run: String },
    #[error(
        "{principal} started run '{run}' and may not decide its approvals (separation of duties)"
    )]
    SeparationOfDuties { principal: String, run: String },
    #[error(
        "{principal} may not serve the {kind} '{name}': add it to the principal's {kind}s in the auth config"
    )]
    NotAllowedToServe {
        principal: String,
        kind: Served,
        name: String,
    },
    #[error(
        "the worker identity '{identity}' belongs to another principal; choose another identity"
    )]
    IdentityTaken { identity: String },
    #[error("{principal} may not report on this task: it was handed to another principal")]
    NotTaskHolder { principal: String },
    #[error("a call forwarded by another aaa server is refused: {0}")]
    ForwardRefused(&'static str),
    /// A genuine forwarded call this server cannot take now (it started
    /// after the call was signed, or keeps as many nonces as it may): the
    /// forwarding server's caller retries, and the call is signed anew.
    #[error("a call forwarded by another aaa server cannot be taken now: {0}")]
    ForwardNotNow(&'static str),
    #[error("{principal} may not decide call '{call}': only the approver groups {} may", groups.join(", "))]
    NotAnApproverForCall {
        principal: String,
        call: String,
        /// The groups that would do.
        groups: Vec<String>,
    },
}

/// The principal behind a caller's credentials, through the throttle, at
/// every door (gRPC calls, `/metrics`, the MCP endpoint, the web sign-in).
/// An address that sent [`throttle::FAILURES`] wrong ones within a minute
/// is refused before they are looked at. A wrong one is counted, and the
/// first of its address's minute logged (with the minute before's counts),
/// so a flood of guesses writes one line a minute.
pub fn authenticate_from(
    auth: &AuthConfig,
    throttle: &Throttle,
    peer: Option<std::net::SocketAddr>,
    bearer: Option<&str>,
    cert_der: Option<&[u8]>,
) -> Result<Principal, Refusal> {
    if let throttle::Verdict::Closed { retry_after_s } = throttle.check(peer) {
        return Err(Refusal::Throttled { retry_after_s });
    }
    let found = auth.authenticate(bearer, cert_der);
    if let Err(Refusal::UnknownCredentials) = found {
        if let Some(first) = throttle.failed(peer) {
            let (wrong, refused) = first.before.unwrap_or_default();
            tracing::warn!(
                peer = peer.map(|p| p.to_string()),
                previous_minute_wrong = wrong,
                previous_minute_refused = refused,
                "wrong credentials refused: the token or client certificate matches no \
                 principal; more from this address within a minute are counted, not logged, \
                 and after {} its calls are refused until the minute ends",
                throttle::FAILURES,
            );
        }
    }
    found
}

/// Is `method` (a gRPC path, `/package.Service/Method`) open to anyone?
pub fn is_open(method: &str) -> bool {
    OPEN_SERVICES.iter().any(|s| method.starts_with(s))
}

/// May `principal` call `method`? Open methods are not asked about.
pub fn authorize(method: &str, principal: &Principal) -> Result<(), Refusal> {
    let allowed = RULES
        .iter()
        .find(|(path, _)| *path == method)
        .map_or(&[][..], |(_, roles)| *roles);
    if principal.has_any(allowed) {
        return Ok(());
    }
    Err(missing_role(principal, method, allowed))
}

/// May `principal` read the server's metrics (`GET /metrics`)? Readers
/// and admins may.
pub fn authorize_scrape(principal: &Principal) -> Result<(), Refusal> {
    if principal.has_any(&[Reader]) {
        return Ok(());
    }
    Err(missing_role(principal, "GET /metrics", &[Reader]))
}

/// May `principal` append an event of `event_type` with Signal? Decisions
/// need approver; application events need runner.
pub fn authorize_signal(principal: &Principal, event_type: &str) -> Result<(), Refusal> {
    let needed: &[Role] = if crate::domain::event::is_decision(event_type) {
        &[Approver]
    } else {
        &[Runner]
    };
    if principal.has_any(needed) {
        return Ok(());
    }
    Err(missing_role(
        principal,
        &format!("Signal {event_type}"),
        needed,
    ))
}

fn missing_role(principal: &Principal, method: &str, allowed: &[Role]) -> Refusal {
    let mut needed: Vec<&str> = allowed.iter().map(|r| r.as_str()).collect();
    needed.push(Role::Admin.as_str());
    Refusal::MissingRole {
        principal: principal.name.clone(),
        method: method.to_string(),
        needed,
    }
}

/// "runner, reader or admin".
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Principal names end up in events and logs: keep them plain.
fn is_principal_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:@".contains(c))
}

/// Hex SHA-256, the form tokens and certificates take in the config file.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// How a caller proves to be a principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CredentialKind {
    /// A bearer token, by the SHA-256 of its text.
    Token,
    /// A client certificate, by the SHA-256 of its DER form.
    Cert,
}

impl CredentialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Token => "token",
            CredentialKind::Cert => "cert",
        }
    }
}

/// The validated auth config: who the principals are, how they prove it,
/// and the policies. Built once, before any port is bound.
#[derive(Clone)]
pub struct AuthConfig {
    /// Principals by the hex SHA-256 of their token.
    by_token: HashMap<String, Principal>,
    /// Principals by the hex SHA-256 of their client certificate (DER).
    by_cert: HashMap<String, Principal>,
    /// The principal that started a run may not decide its approvals.
    pub separation_of_duties: bool,
    pub tls: Option<TlsFiles>,
}

/// The server's certificate chain and key, and the CA that client
/// certificates must chain to (mTLS), all PEM.
#[derive(Clone)]
pub struct TlsFiles {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: no hashes, no key material in logs.
        let mut names: Vec<&str> = self
            .by_token
            .values()
            .chain(self.by_cert.values())
            .map(|p| p.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        f.debug_struct("AuthConfig")
            .field("principals", &names)
            .field("separation_of_duties", &self.separation_of_duties)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The file as written (TOML).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    separation_of_duties: bool,
    tls: Option<TlsSection>,
    #[serde(default, rename = "principal")]
    principals: Vec<PrincipalSection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalSection {
    name: String,
    roles: Vec<Role>,
    token_sha256: Option<String>,
    cert_sha256: Option<String>,
    /// The tools and models it may serve as a worker (none when absent).
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    models: Vec<String>,
    /// Its approver groups.
    #[serde(default)]
    groups: Vec<String>,
}

/// Why the auth config file was refused: one readable line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl AuthConfig {
    /// Reads and validates the TOML file at `path`; TLS paths in it are
    /// relative to the file's folder.
    pub fn load(path: &Path) -> Result<AuthConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        AuthConfig::parse(&text, base)
            .map_err(|ConfigError(e)| ConfigError(format!("{}: {e}", path.display())))
    }

    /// Validates the TOML text of an auth config; `base` is the folder
    /// relative TLS paths start from.
    pub fn parse(text: &str, base: &Path) -> Result<AuthConfig, ConfigError> {
        let file: File = toml::from_str(text).map_err(|e| ConfigError(e.message().to_string()))?;
        if file.principals.is_empty() {
            return Err(ConfigError(
                "no [[principal]]: nobody could call the server".into(),
            ));
        }
        let tls = file.tls.map(|t| t.read(base)).transpose()?;
        let mtls = tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some());
        let mut config = AuthConfig {
            by_token: HashMap::new(),
            by_cert: HashMap::new(),
            separation_of_duties: file.separation_of_duties,
            tls,
        };
        let mut names = std::collections::HashSet::new();
        for p in file.principals {
            let at = format!("principal '{}'", p.name);
            if !is_principal_name(&p.name) {
                return Err(ConfigError(format!(
                    "{at}: a name is 1 to 128 letters, digits and _ - . : @"
                )));
            }
            if !names.insert(p.name.clone()) {
                return Err(ConfigError(format!("{at} is listed twice")));
            }
            if p.roles.is_empty() {
                return Err(ConfigError(format!("{at}: roles is empty")));
            }
            if p.token_sha256.is_none() && p.cert_sha256.is_none() {
                return Err(ConfigError(format!(
                    "{at}: give token_sha256 or cert_sha256"
                )));
            }
            if p.cert_sha256.is_some() && !mtls {
                return Err(ConfigError(format!(
                    "{at}: cert_sha256 needs [tls] client_ca, so that clients can present certificates"
                )));
            }
            for (field, names) in [
                ("tools", &p.tools),
                ("models", &p.models),
                ("groups", &p.groups),
            ] {
                for name in names {
                    // The names RegisterWorker would take.
                    crate::domain::check::name(field, name)
                        .map_err(|e| ConfigError(format!("{at}: {e}")))?;
                }
            }
            let principal = Principal {
                name: p.name,
                roles: p.roles,
                tools: p.tools,
                models: p.models,
                groups: p.groups,
            };
            for (field, hash, map) in [
                ("token_sha256", p.token_sha256, &mut config.by_token),
                ("cert_sha256", p.cert_sha256, &mut config.by_cert),
            ] {
                let Some(hash) = hash else { continue };
                let hash = hash.to_ascii_lowercase();
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ConfigError(format!(
                        "{at}: {field} is not 64 hex digits (the hex SHA-256)"
                    )));
                }
                if hash == sha256_hex(b"") {
                    return Err(ConfigError(format!(
                        "{at}: {field} is the hash of the empty string, which no caller may use"
                    )));
                }
                if map.insert(hash, principal.clone()).is_some() {
                    return Err(ConfigError(format!(
                        "{at}: its {field} is also another principal's"
                    )));
                }
            }
        }
        Ok(config)
    }

    /// The principal behind a bearer token or a client certificate (DER).
    /// A token, when sent, decides: a wrong one is refused even if the
    /// connection has a known certificate. Private: callers go through
    /// [`authenticate_from`], which counts wrong ones.
    fn authenticate(
        &self,
        bearer: Option<&str>,
        cert_der: Option<&[u8]>,
    ) -> Result<Principal, Refusal> {
        let found = match (bearer, cert_der) {
            (Some(token), _) => self.by_token.get(&sha256_hex(token.as_bytes())),
            (None, Some(der)) => self.by_cert.get(&sha256_hex(der)),
            (None, None) => return Err(Refusal::MissingCredentials),
        };
        found.cloned().ok_or(Refusal::UnknownCredentials)
    }

    /// Every credential of the file: how it proves (a token or a client
    /// certificate), the hex SHA-256 the file holds for it (lowercase, as
    /// [`sha256_hex`] gives), and the principal it proves. The web inbox
    /// binds its sessions to them, so that rotating one ends the sessions
    /// made with the old.
    pub fn credentials(&self) -> impl Iterator<Item = (CredentialKind, &str, &Principal)> {
        let tokens = self
            .by_token
            .iter()
            .map(|(hash, p)| (CredentialKind::Token, hash.as_str(), p));
        let certs = self
            .by_cert
            .iter()
            .map(|(hash, p)| (CredentialKind::Cert, hash.as_str(), p));
        tokens.chain(certs)
    }

    /// The principal of that name (a call another server forwarded names
    /// its caller so).
    pub fn principal_named(&self, name: &str) -> Option<Principal> {
        self.by_token
            .values()
            .chain(self.by_cert.values())
            .find(|p| p.name == name)
            .cloned()
    }
}

impl TlsFiles {
    /// The rustls settings: the server's identity and, with a client CA,
    /// client certificates asked for but optional, so that token callers
    /// connect too (the auth layer refuses callers with neither).
    pub fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let mut tls =
            ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem));
        if let Some(ca) = &self.client_ca_pem {
            tls = tls
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(true);
        }
        tls
    }
}

impl TlsSection {
    fn read(self, base: &Path) -> Result<TlsFiles, ConfigError> {
        let read = |name: &str, path: &Path| {
            let path = base.join(path);
            std::fs::read(&path).map_err(|e| {
                ConfigError(format!("[tls] {name}: cannot read {}: {e}", path.display()))
            })
        };
        let files = TlsFiles {
            cert_pem: read("cert", &self.cert)?,
            key_pem: read("key", &self.key)?,
            client_ca_pem: self
                .client_ca
                .as_deref()
                .map(|p| read("client_ca", p))
                .transpose()?,
        };
        // Build the acceptor once now, so a bad certificate or key is a
        // config error before any port is bound.
        if let Err(e) = tonic::transport::Server::builder().tls_config(files.server_config()) {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                reason = format!("{reason}: {cause}");
                source = cause.source();
            }
            return Err(ConfigError(format!("[tls]: {reason}")));
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(roles: &[Role]) -> Principal {
        Principal {
            name: "p".into(),
            roles: roles.to_vec(),
            ..Principal::default()
        }
    }

    #[test]
    fn admin_may_call_anything_even_unlisted_methods() {
        let admin = principal(&[Role::Admin]);
        assert!(authorize("/aaa.v1.WorkerService/PollTask", &admin).is_ok());
        assert!(authorize("/aaa.v1.Future/Method", &admin).is_ok());
        assert!(authorize("/aaa.v1.Future/Method", &principal(&[Runner])).is_err());
    }

    #[test]
    fn refusal_names_the_roles_that_would_do() {
        let refusal = authorize("/aaa.v1.RunService/GetRun", &principal(&[Worker])).unwrap_err();
        assert!(
            refusal.to_string().contains("runner, reader or admin"),
            "{refusal}"
        );
    }

    #[test]
    fn signal_role_depends_on_the_event_type() {
        let runner = principal(&[Runner]);
        let approver = principal(&[Approver]);
        assert!(authorize_signal(&runner, "app.note").is_ok());
        assert!(authorize_signal(&runner, "aaa.approval.granted").is_err());
        assert!(authorize_signal(&approver, "aaa.approval.denied").is_ok());
        assert!(authorize_signal(&approver, "app.note").is_err());
    }

    #[test]
    fn workers_serve_only_what_their_principal_lists() {
        let worker = Principal {
            tools: vec!["wire_money".into()],
            models: vec!["gpt".into()],
            ..principal(&[Worker])
        };
        assert!(worker.may_serve(Served::Tool, "wire_money").is_ok());
        assert!(worker.may_serve(Served::Model, "gpt").is_ok());
        // A tool's name is not a model's.
        assert!(worker.may_serve(Served::Model, "wire_money").is_err());
        let refusal = worker.may_serve(Served::Tool, "send_email").unwrap_err();
        assert!(
            refusal.to_string().contains("tool 'send_email'"),
            "{refusal}"
        );
        assert!(principal(&[Role::Admin])
            .may_serve(Served::Tool, "anything")
            .is_ok());
        assert!(principal(&[Worker])
            .may_serve(Served::Tool, "wire_money")
            .is_err());
    }

    #[test]
    fn tokens_are_looked_up_by_hash() {
        let text = format!(
            "[[principal]]\nname = \"ci\"\nroles = [\"runner\"]\ntoken_sha256 = \"{}\"\n",
            sha256_hex(b"s3cret").to_uppercase()
        );
        let config = AuthConfig::parse(&text, Path::new(".")).unwrap();
        assert_eq!(
            config.authenticate(Some("s3cret"), None).unwrap().name,
            "ci"
        );
        assert_eq!(
            config.authenticate(Some("wrong"), None),
            Err(Refusal::UnknownCredentials)
        );
        assert_eq!(
            config.authenticate(None, None),
            Err(Refusal::MissingCredentials)
        );
        assert!(!format!("{config:?}").contains(&sha256_hex(b"s3cret")));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            ("", "no [[principal]]"),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"boss\"]\ntoken_sha256 = \"00\"",
                "unknown variant",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"runner\"]\ntoken_sha256 = \"00\"",
                "64 hex digits",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"runner\"]",
                "give token_sha256",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"runner\"]\ncert_sha256 = \"00\"",
                "needs [tls] client_ca",
            ),
            (
                "colour = 1\n[[principal]]\nname = \"a\"\nroles = []",
                "unknown field",
            ),
            (
                "[[principal]]\nname = \"a\"\nroles = [\"runner\"]\n\
                 token_sha256 = \"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"",
                "hash of the empty string",
            ),
            (
                "[[principal]]\nname = \"w\"\nroles = [\"worker\"]\ntools = [\"a b\"]\n\
                 token_sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"",
                "principal 'w': tools: 'a b' contains ' '",
            ),
        ];
        for (text, expected) in cases {
            let error = AuthConfig::parse(text, Path::new(".")).err().unwrap();
            assert!(error.to_string().contains(expected), "{text:?}: {error}");
        }
    }
}
