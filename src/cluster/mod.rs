//! This server's place among the servers of one database: its member name
//! and advertised address, which shards its engine serves (calls for their
//! runs are served here; others are forwarded to their shard's owner), and
//! where each shard's owner is (read from the database, kept until a
//! forward to it fails). See [`forward`] for how a call travels,
//! [`balance`] for how shards are shared out, and docs/cluster.md.

pub mod balance;
pub mod forward;
pub mod offers;
pub mod peers;
pub mod routes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Status;

use crate::proto::ErrorReason;
use crate::store::{ClusterView, Shards, SharedStore};

/// The shard whose owner serves the calls that name no run (grants,
/// worker registration, consumer groups) while the shards are not spread.
pub const ANY_SHARD: u8 = 0;
/// How long a read of who owns what is used before it is read again
/// (shards move between other servers without this one hearing of it).
const VIEW_KEPT: Duration = Duration::from_secs(1);
/// The longest a call waits for this server's engine to start on a shard
/// the database says it owns.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// How long a forward waits to connect to the owner.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where to reach the owner of the runs.
#[derive(Clone)]
pub struct Owner {
    pub server: String,
    pub address: String,
    pub channel: Channel,
}

pub struct Cluster {
    store: SharedStore,
    /// This server's member name and the address the others reach it at.
    pub server: String,
    pub address: String,
    /// The shards this server's engine serves now (none while it has no
    /// engine, or swaps one for another).
    serving: tokio::sync::watch::Sender<Shards>,
    /// Who owns which shard, as last read from the database; dropped when
    /// a forward to one of them fails.
    owners: Mutex<Option<(Arc<ClusterView>, std::time::Instant)>>,
    /// A channel to each owner forwarded to, by address; dropped when a
    /// forward through it fails.
    channels: Mutex<HashMap<String, Channel>>,
    /// How connections to the owner are made (TLS, keepalive).
    tls: Option<ClientTlsConfig>,
    keepalive: Duration,
    /// Signs the caller's principal on forwarded calls.
    pub(crate) key: [u8; 32],
    /// The DNS names of this server's own certificate (under TLS).
    own_names: Vec<String>,
    /// The streams that ask the other owners for tasks for this server's
    /// workers (with spread shards).
    pub(crate) links: peers::Links,
}

impl Cluster {
    /// `ca_pem` is what the other servers' certificates chain to, when the
    /// servers use TLS; `keepalive` bounds how long a forwarded call waits
    /// on an owner that stopped answering (a paused or cut-off process).
    pub fn new(
        store: SharedStore,
        server: String,
        address: String,
        ca_pem: Option<&[u8]>,
        keepalive: Duration,
    ) -> Arc<Cluster> {
        let key = store.token_key();
        Arc::new(Cluster {
            store,
            server,
            address,
            serving: tokio::sync::watch::Sender::new(Shards::none()),
            owners: Mutex::new(None),
            channels: Mutex::default(),
            tls: ca_pem.map(|ca| ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca))),
            own_names: ca_pem.map(dns_names).unwrap_or_default(),
            keepalive,
            key,
            links: peers::Links::default(),
        })
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// The shards whose runs are served here rather than forwarded.
    pub fn serving(&self) -> Shards {
        *self.serving.borrow()
    }

    /// From now on the runs of `shards` are served here (an engine for
    /// them runs); every other call is forwarded.
    pub fn serve(&self, shards: Shards) {
        self.serving.send_replace(shards);
        // Who owns what changed: read it again at the next forward.
        *self.owners.lock().expect("poisoned") = None;
    }

    /// Who owns which shard: as last read, or read from the database now.
    async fn view(&self) -> Result<Arc<ClusterView>, Status> {
        if let Some((view, read_at)) = self.owners.lock().expect("poisoned").clone() {
            if read_at.elapsed() < VIEW_KEPT {
                return Ok(view);
            }
        }
        let view = self
            .store
            .cluster()
            .await
            .map_err(|e| unavailable(&format!("cannot read who owns the runs: {e}"), ""))?;
        let view = Arc::new(view);
        *self.owners.lock().expect("poisoned") = Some((view.clone(), std::time::Instant::now()));
        Ok(view)
    }

    /// The owner of `shard`: the one known, or the one the database names;
    /// `None` when that is this server (taking the shard over).
    pub async fn owner_of(&self, shard: u8) -> Result<Option<Owner>, Status> {
        let view = self.view().await?;
        let Some(member) = view.owner_of(shard) else {
            let last = view
                .shards
                .iter()
                .find(|lease| lease.shard == shard)
                .map_or("", |lease| lease.owner.as_str());
            self.forget_owners();
            return Err(unavailable(
                &format!(
                    "no server of the cluster holds shard {shard} of the runs now (its last \
                     owner stopped, and another takes it over once its lease lapses); retry \
                     shortly"
                ),
                last,
            ));
        };
        if member.server == self.server {
            return Ok(None);
        }
        self.owner(member).map(Some)
    }

    /// Whether `shard` is served here, or soon will be: the database names
    /// this server its owner and its engine is starting (a takeover, or
    /// one engine making way for another). Waits up to [`TAKEOVER_WAIT`]
    /// for it, so that a call meets a short delay rather than an error.
    pub async fn serves_soon(&self, shard: u8) -> bool {
        let mut serving = self.serving.subscribe();
        if serving.borrow().contains(shard) {
            return true;
        }
        let Ok(view) = self.view().await else {
            return false;
        };
        if view
            .owner_of(shard)
            .is_none_or(|owner| owner.server != self.server)
        {
            return false;
        }
        let started = tokio::time::timeout(
            TAKEOVER_WAIT,
            serving.wait_for(|shards| shards.contains(shard)),
        )
        .await;
        matches!(started, Ok(Ok(_)))
    }

    /// Every other live server that owns shards (as last read).
    pub async fn other_owners(&self) -> Vec<Owner> {
        let Ok(view) = self.view().await else {
            return Vec::new();
        };
        let mut owners: Vec<Owner> = Vec::new();
        for lease in &view.shards {
            // Most leases name an owner already seen: skip them before
            // looking for the member (this runs for every worker poll).
            if lease.owner == self.server || owners.iter().any(|o| o.server == lease.owner) {
                continue;
            }
            if let Some(owner) = view.holder(lease).and_then(|m| self.owner(m).ok()) {
                owners.push(owner);
            }
        }
        owners
    }

    /// Where to reach `member`, over the channel made for its address.
    fn owner(&self, member: &crate::store::Member) -> Result<Owner, Status> {
        let channel = {
            let mut channels = self.channels.lock().expect("poisoned");
            match channels.get(&member.address) {
                Some(channel) => channel.clone(),
                None => {
                    let channel = self.channel(&member.address)?;
                    channels.insert(member.address.clone(), channel.clone());
                    channel
                }
            }
        };
        Ok(Owner {
            server: member.server.clone(),
            address: member.address.clone(),
            channel,
        })
    }

    /// Forgets who owns what, and the channel to `owner`, after a forward
    /// to it failed: the next call reads the owners from the database
    /// again, and connects anew.
    pub fn forget(&self, owner: &Owner) {
        self.channels
            .lock()
            .expect("poisoned")
            .remove(&owner.address);
        self.forget_owners();
    }

    /// Forgets who owns what: the next call reads it from the database.
    pub fn forget_owners(&self) {
        *self.owners.lock().expect("poisoned") = None;
    }

    /// A channel to this server itself, at its advertised address (the web
    /// inbox calls the gRPC API through it as the signed-in person).
    /// Under TLS it checks the server's certificate for a name the
    /// certificate has (the advertised host if it is one), since the
    /// address may be one the certificate does not name (127.0.0.1).
    pub fn loopback(&self) -> Result<Channel, Status> {
        let host = host_of(&self.address);
        match self.own_names.first() {
            Some(name) if !self.own_names.iter().any(|n| n == host) => {
                self.channel_named(&self.address, name)
            }
            _ => self.channel(&self.address),
        }
    }

    /// The scheme clients reach this server with.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn channel(&self, address: &str) -> Result<Channel, Status> {
        self.channel_named(address, host_of(address))
    }

    /// A channel to `address` whose TLS (if any) expects the name `host`.
    fn channel_named(&self, address: &str, host: &str) -> Result<Channel, Status> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let bad = |e: &dyn std::fmt::Display| {
            unavailable(
                &format!("the owner's address '{address}' is unusable: {e}"),
                "",
            )
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| bad(&e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(self.keepalive)
            .keep_alive_timeout(self.keepalive)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone().domain_name(host))
                .map_err(|e| bad(&e))?;
        }
        Ok(endpoint.connect_lazy())
    }
}

/// The host of a `host:port` address (an IPv6 one without its brackets).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The DNS names of the first certificate in a PEM file (none if it does
/// not parse: the server would not have started with it).
fn dns_names(pem: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(pem) else {
        return Vec::new();
    };
    let Ok(cert) = pem.parse_x509() else {
        return Vec::new();
    };
    let Ok(Some(names)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            _ => None,
        })
        .collect()
}

/// UNAVAILABLE with OWNER_UNAVAILABLE, naming the last owner known.
pub fn unavailable(message: &str, owner: &str) -> Status {
    let metadata = match owner {
        "" => Default::default(),
        owner => [("owner".to_string(), owner.to_string())].into(),
    };
    crate::api::status::error_status(
        tonic::Code::Unavailable,
        ErrorReason::OwnerUnavailable,
        message,
        metadata,
    )
}
