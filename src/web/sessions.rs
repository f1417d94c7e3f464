//! Which verified sessions still stand. A session is bound to the
//! credential it was made from: its cookie keeps that credential's
//! fingerprint (see `session::fingerprint`), and a session whose principal
//! no longer has a credential of that fingerprint (the token was rotated,
//! the certificate replaced, the principal removed) is over as soon as a
//! server runs with the new auth config. Signing out ends every session of
//! the principal issued until then, on every server: the time is kept in
//! the store, read on each request, so that a server that did not see the
//! sign-out refuses the cookie too, also after a restart. The store keeps
//! each idempotency record once and never replaces it, so a principal's
//! sign-outs are numbered records (`alice#1`, `alice#2`, ...): a server
//! knows how many it has read and asks for the next, one point read per
//! request; two servers signing one principal out at once both land, one
//! as the next number. They grow by one per sign-out, a person's action. With auth off there is nobody to tell apart: every session is
//! the one anonymous principal's, and signing out ends them all.

use std::collections::HashMap;
use std::sync::Mutex;

use super::session::{self, Session};
use crate::auth::AuthConfig;
use crate::store::{SharedStore, StoreError, WriteBatch};

/// Where sign-outs are kept among the store's idempotency records: the
/// principal's name (empty with auth off), `#` and the sign-out's number
/// from 1, holding the time in ms (big-endian) until which its sessions
/// are over.
const SIGNED_OUT: &[u8] = b"web-signed-out";
/// Tries of a sign-out that meets others' at once, before it gives up.
const SIGN_OUT_TRIES: usize = 16;

/// What is known of a principal's sign-outs: how many were read, and the
/// latest time they end sessions until.
#[derive(Debug, Clone, Copy, Default)]
struct SignedOut {
    count: u64,
    until: i64,
}

fn record(principal: &str, number: u64) -> String {
    format!("{principal}#{number}")
}

/// The server's view of sessions: the key that signs them, the credential
/// fingerprints of the auth config, and the sign-outs.
pub struct Sessions {
    key: [u8; 32],
    /// With auth on, each principal's credential fingerprints: computed
    /// once, since the auth config changes only with a restart.
    fingerprints: Option<HashMap<String, Vec<String>>>,
    store: SharedStore,
    /// The latest sign-out seen per principal. It only moves forward, so a
    /// session issued before it is refused without asking the store; any
    /// other is checked against the store, where another server may have
    /// recorded a later one. Bounded by the principals of the auth config
    /// (cookies name no others: their signature is the server's).
    signed_out: Mutex<HashMap<String, SignedOut>>,
}

impl Sessions {
    pub fn new(key: [u8; 32], auth: Option<&AuthConfig>, store: SharedStore) -> Sessions {
        let fingerprints = auth.map(|auth| {
            let mut by_principal: HashMap<String, Vec<String>> = HashMap::new();
            for (kind, hash, principal) in auth.credentials() {
                by_principal
                    .entry(principal.name.clone())
                    .or_default()
                    .push(session::fingerprint(&key, kind, hash));
            }
            by_principal
        });
        Sessions {
            key,
            fingerprints,
            store,
            signed_out: Mutex::new(HashMap::new()),
        }
    }

    /// A new session of `principal`, made with the credential of
    /// `fingerprint` ("" with auth off). It is issued after the principal's
    /// last sign-out even when this server's clock is behind the one that
    /// recorded it, so that it is not over before it starts.
    pub async fn issue(
        &self,
        principal: &str,
        fingerprint: &str,
        now_ms: i64,
    ) -> Result<Session, StoreError> {
        let signed_out = self.signed_out_until(principal).await?;
        let issued_ms = now_ms.max(signed_out.saturating_add(1));
        Ok(Session::issue(&self.key, principal, fingerprint, issued_ms))
    }

    /// Whether a verified session still stands: its principal still has
    /// the credential it was made from, and has not signed out since.
    pub async fn stands(&self, session: &Session) -> Result<bool, StoreError> {
        if let Some(fingerprints) = &self.fingerprints {
            let held = fingerprints
                .get(&session.principal)
                .is_some_and(|held| held.contains(&session.credential));
            if !held {
                return Ok(false);
            }
        }
        if session.issued_ms <= self.cached(&session.principal) {
            return Ok(false);
        }
        Ok(session.issued_ms > self.signed_out_until(&session.principal).await?)
    }

    /// Ends every session of the session's principal issued until now, on
    /// every server of the store.
    pub async fn sign_out(&self, session: &Session, now_ms: i64) -> Result<(), StoreError> {
        // Never before the session itself: its issue time may be ahead of
        // this server's clock (see `issue`).
        let until = now_ms.max(session.issued_ms);
        let principal = &session.principal;
        for _ in 0..SIGN_OUT_TRIES {
            self.signed_out_until(principal).await?;
            let next = self.known(principal).count + 1;
            let mut batch = WriteBatch::default();
            batch.put_request(
                SIGNED_OUT,
                &record(principal, next),
                until.to_be_bytes().to_vec(),
            );
            match self.store.commit(batch).await {
                Ok(_) => {
                    self.remember(principal, next, until);
                    return Ok(());
                }
                // Another server recorded this number first: read it, and
                // take the next.
                Err(StoreError::RequestRecorded { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Unavailable(format!(
            "signing '{principal}' out met {SIGN_OUT_TRIES} others at once; try again"
        )))
    }

    /// Until when the principal's sessions are over: the latest of its
    /// sign-outs, read from the store from the first this server has not
    /// seen, or 0 without one.
    async fn signed_out_until(&self, principal: &str) -> Result<i64, StoreError> {
        loop {
            let next = self.known(principal).count + 1;
            let Some(bytes) = self
                .store
                .request(SIGNED_OUT, &record(principal, next))
                .await?
            else {
                return Ok(self.known(principal).until);
            };
            let bytes: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
                StoreError::Corrupt(format!("the web sign-out of '{principal}' is not 8 bytes"))
            })?;
            self.remember(principal, next, i64::from_be_bytes(bytes));
        }
    }

    fn cached(&self, principal: &str) -> i64 {
        self.known(principal).until
    }

    fn known(&self, principal: &str) -> SignedOut {
        let cache = self.signed_out.lock().expect("sign-out cache");
        cache.get(principal).copied().unwrap_or_default()
    }

    fn remember(&self, principal: &str, number: u64, until: i64) {
        let mut cache = self.signed_out.lock().expect("sign-out cache");
        let known = cache.entry(principal.to_string()).or_default();
        known.count = known.count.max(number);
        known.until = known.until.max(until);
    }
}
