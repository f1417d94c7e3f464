//! Calls one server forwards to another carry the caller's principal in a
//! header, signed with the store's secret key (which every server of a
//! database shares and no client has), so that the server that serves the
//! call acts, checks roles and records the actor exactly as if the caller
//! had called it. With auth off there are no principals; the header then
//! names the caller's address ([`ForwardedPeer`]).
//!
//! A signature is good for one call, at one server, once, for 30 s. It
//! covers the principal, the method, the advertised address of the server
//! the call is sent to, an expiry, a random nonce and the SHA-256 of the
//! request body as sent (its gRPC frames), so it cannot be moved to
//! another request, another method or another server of the deployment.
//! The server that verifies it keeps its nonce until it expires and
//! refuses it the second time, so the same request cannot be sent again
//! either; and it refuses a signature made before it started (the nonces
//! its previous run saw are gone). Only servers hold the key, so a client
//! that sends these headers itself (made up, copied from another call, or
//! recorded and replayed) is refused.
//!
//! The calls whose request is a stream ([`REQUEST_STREAMS`]) are signed
//! before their messages exist: their signature covers no body, only the
//! rest (one use, one method, one server); their messages are as safe as
//! the connection that carries them, which across machines is TLS.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tonic::codegen::http::HeaderMap;

use super::Refusal;

/// With auth off, the address of the client a forwarded call came from:
/// the forwarding server signs it in place of a principal, so that the
/// actor of what the call appends names the client, not the forwarder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedPeer(pub String);

/// Marks a call another server of the cluster sent on, its signature
/// verified (calls only servers may make check for it).
#[derive(Debug, Clone, Copy)]
pub struct FromServer;

/// The caller's principal name, as the forwarding server authenticated it.
pub const PRINCIPAL: &str = "aaa-forwarded-principal";
/// `EXPIRES_MS.NONCE.HEX_MAC`; see [`sign`] for what the MAC covers.
pub const SIGNATURE: &str = "aaa-forwarded-signature";
/// How long a signature holds: enough for a hop between two servers whose
/// clocks differ by a few seconds, too short to keep.
const VALID_MS: i64 = 30_000;
/// The most nonces a server keeps (each until its signature expires):
/// 2^18 forwarded calls in 30 s, about 8,700 a second, in about 20 MiB. A
/// call past it is refused UNAVAILABLE, to be retried, rather than let a
/// nonce be forgotten before it expires.
const MAX_SEEN: usize = 1 << 18;
/// The calls whose request is a stream of messages: their signature covers
/// no body (see the module's documentation).
pub const REQUEST_STREAMS: [&str; 2] = [
    "/aaa.v1.SubscriptionService/Subscribe",
    "/aaa.v1.ClusterService/PeerPoll",
];

/// What a signature is for, besides the caller.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The gRPC path, `/package.Service/Method`.
    pub method: &'a str,
    /// The advertised address of the server the call is sent to.
    pub to: &'a str,
    /// The request body as sent: its gRPC frames (see [`unary_body`]).
    /// Not read for a request stream.
    pub body: &'a [u8],
}

/// Whether `method`'s request is a stream, whose body a signature does
/// not cover and whose messages are not buffered to verify it.
pub fn is_request_stream(method: &str) -> bool {
    REQUEST_STREAMS.contains(&method)
}

/// The body a gRPC client sends for one uncompressed message: a zero
/// compression flag, the message's length (4 bytes, big-endian), the
/// message. What a call made with tonic is signed over.
pub fn unary_body(message: &impl prost::Message) -> Vec<u8> {
    let length = message.encoded_len();
    let mut body = Vec::with_capacity(5 + length);
    body.push(0);
    body.extend_from_slice(&(length as u32).to_be_bytes());
    message
        .encode(&mut body)
        .expect("a Vec grows to any message");
    body
}

/// Whether a call carries either forwarded header (and so is verified as
/// a forwarded call, its body read first).
pub fn carried(headers: &HeaderMap) -> bool {
    headers.contains_key(PRINCIPAL) || headers.contains_key(SIGNATURE)
}

fn mac(key: &[u8], principal: &str, call: &Call, expires_ms: i64, nonce: &str) -> Hmac<Sha256> {
    let body = if is_request_stream(call.method) {
        "a request stream".to_string()
    } else {
        hex::encode(Sha256::digest(call.body))
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    // Each part is printable ASCII without a newline (header values,
    // gRPC paths, addresses, digits and hex), so the text is unambiguous.
    mac.update(
        format!(
            "aaa forwarded call 2\n{principal}\n{}\n{}\n{expires_ms}\n{nonce}\n{body}",
            call.method, call.to
        )
        .as_bytes(),
    );
    mac
}

/// Puts the principal and its signature on a call being forwarded: good
/// for this call, at the server it is sent to, once, for [`VALID_MS`].
pub fn sign(headers: &mut HeaderMap, key: &[u8], principal: &str, call: &Call, now_ms: i64) {
    let expires_ms = now_ms + VALID_MS;
    // 122 random bits from a CSPRNG, as the web's session nonces.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let signature = hex::encode(
        mac(key, principal, call, expires_ms, &nonce)
            .finalize()
            .into_bytes(),
    );
    // Principal names are printable ASCII (the auth config checks them).
    if let Ok(name) = principal.parse() {
        headers.insert(PRINCIPAL, name);
    }
    if let Ok(value) = format!("{expires_ms}.{nonce}.{signature}").parse() {
        headers.insert(SIGNATURE, value);
    }
}

/// Checks the signatures of the forwarded calls a server receives, and
/// keeps each one's nonce until it expires.
pub struct Verifier {
    key: [u8; 32],
    /// This server's advertised address: signatures for another server's
    /// are refused.
    address: String,
    /// When this server started (wall time): a signature made before is
    /// refused, since the nonces seen before the start are not kept.
    started_ms: i64,
    seen: Mutex<Seen>,
}

impl Verifier {
    pub fn new(key: [u8; 32], address: String, started_ms: i64) -> Verifier {
        Verifier {
            key,
            address,
            started_ms,
            seen: Mutex::default(),
        }
    }

    /// The principal name a forwarded call carries, once its signature
    /// verifies for this call at this server and its nonce is new; `None`
    /// for a call that was not forwarded. `body` is the request's body as
    /// received (not read for a request stream).
    pub fn verify<'a>(
        &self,
        headers: &'a HeaderMap,
        method: &str,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Option<&'a str>, Refusal> {
        let (principal, signature) = match (headers.get(PRINCIPAL), headers.get(SIGNATURE)) {
            (None, None) => return Ok(None),
            (Some(principal), Some(signature)) => (principal, signature),
            _ => return Err(forged("it carries a principal or a signature alone")),
        };
        let principal = principal
            .to_str()
            .map_err(|_| forged("the principal is not visible ASCII"))?;
        let signature = signature
            .to_str()
            .map_err(|_| forged("the signature is not visible ASCII"))?;
        let mut parts = signature.splitn(3, '.');
        let (Some(expires), Some(nonce_hex), Some(mac_hex)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(forged("the signature is not EXPIRES.NONCE.MAC"));
        };
        let expires_ms: i64 = expires
            .parse()
            .map_err(|_| forged("the signature's expiry is not a number"))?;
        let nonce = parse_nonce(nonce_hex)?;
        let given = hex::decode(mac_hex).map_err(|_| forged("the signature's MAC is not hex"))?;
        let call = Call {
            method,
            to: &self.address,
            body,
        };
        mac(&self.key, principal, &call, expires_ms, nonce_hex)
            .verify_slice(&given)
            .map_err(|_| {
                forged(
                    "its signature does not verify (for this request, method and server; a \
                     signature is good for the one call it was made for)",
                )
            })?;
        if expires_ms < now_ms {
            return Err(forged("its signature expired"));
        }
        if expires_ms - VALID_MS < self.started_ms {
            return Err(Refusal::ForwardNotNow(
                "it was signed before this server started; send it again",
            ));
        }
        // Only signatures that verified reach the set, so only servers
        // (holders of the key) can fill it.
        self.seen
            .lock()
            .expect("poisoned")
            .first_use(nonce, expires_ms, now_ms)?;
        Ok(Some(principal))
    }
}

/// A nonce: 32 hex digits.
fn parse_nonce(hex: &str) -> Result<u128, Refusal> {
    let bad = || forged("the signature's nonce is not 32 hex digits");
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    u128::from_str_radix(hex, 16).map_err(|_| bad())
}

/// The nonces of the signatures accepted and not yet expired.
#[derive(Default)]
struct Seen {
    nonces: HashSet<u128>,
    /// The same, by expiry, to let them go in order.
    by_expiry: BTreeSet<(i64, u128)>,
}

impl Seen {
    /// Takes `nonce` until `expires_ms`, refusing it if it was taken.
    fn first_use(&mut self, nonce: u128, expires_ms: i64, now_ms: i64) -> Result<(), Refusal> {
        while let Some(&(expires, expired)) = self.by_expiry.first() {
            if expires >= now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.nonces.remove(&expired);
        }
        if self.nonces.contains(&nonce) {
            return Err(forged(
                "its signature was used before (a call is signed for one use)",
            ));
        }
        if self.nonces.len() >= MAX_SEEN {
            return Err(Refusal::ForwardNotNow(
                "this server holds as many forwarded calls' nonces as it keeps; send it again",
            ));
        }
        self.nonces.insert(nonce);
        self.by_expiry.insert((expires_ms, nonce));
        Ok(())
    }
}

fn forged(why: &'static str) -> Refusal {
    Refusal::ForwardRefused(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = *b"0123456789abcdef0123456789abcdef";
    const METHOD: &str = "/aaa.v1.RunService/Signal";
    const TO: &str = "10.0.0.2:50051";
    const BODY: &[u8] = b"\0\0\0\0\x02\x0a\x00";

    fn call(body: &[u8]) -> Call<'_> {
        Call {
            method: METHOD,
            to: TO,
            body,
        }
    }

    fn signed(principal: &str, call: &Call, now_ms: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        sign(&mut headers, &KEY, principal, call, now_ms);
        headers
    }

    /// The verifier of the server at [`TO`], started at 0.
    fn verifier() -> Verifier {
        Verifier::new(KEY, TO.to_string(), 0)
    }

    #[test]
    fn a_signed_principal_verifies_for_its_call_until_it_expires() {
        let headers = signed("alice", &call(BODY), 1_000);
        assert_eq!(
            verifier().verify(&headers, METHOD, BODY, 1_000),
            Ok(Some("alice"))
        );
        assert_eq!(
            verifier().verify(&headers, METHOD, BODY, 1_000 + VALID_MS),
            Ok(Some("alice"))
        );
        assert!(verifier()
            .verify(&headers, METHOD, BODY, 1_001 + VALID_MS)
            .is_err());
        let other_method = "/aaa.v1.RunService/CancelRun";
        assert!(verifier()
            .verify(&headers, other_method, BODY, 1_000)
            .is_err());
        let other_key = Verifier::new([7; 32], TO.to_string(), 0);
        assert!(other_key.verify(&headers, METHOD, BODY, 1_000).is_err());
    }

    #[test]
    fn a_signature_does_not_verify_for_another_body() {
        let headers = signed("alice", &call(BODY), 1_000);
        let refused = verifier().verify(&headers, METHOD, b"\0\0\0\0\x02\x0a\x01", 1_000);
        assert!(
            matches!(refused, Err(Refusal::ForwardRefused(why)) if why.contains("does not verify")),
            "{refused:?}"
        );
        assert!(verifier().verify(&headers, METHOD, b"", 1_000).is_err());
    }

    #[test]
    fn a_signature_does_not_verify_at_another_server() {
        let headers = signed("alice", &call(BODY), 1_000);
        let elsewhere = Verifier::new(KEY, "10.0.0.3:50051".to_string(), 0);
        assert!(elsewhere.verify(&headers, METHOD, BODY, 1_000).is_err());
    }

    #[test]
    fn a_nonce_is_refused_the_second_time() {
        let verifier = verifier();
        let headers = signed("alice", &call(BODY), 1_000);
        assert_eq!(
            verifier.verify(&headers, METHOD, BODY, 1_000),
            Ok(Some("alice"))
        );
        let again = verifier.verify(&headers, METHOD, BODY, 1_001);
        assert!(
            matches!(again, Err(Refusal::ForwardRefused(why)) if why.contains("used before")),
            "{again:?}"
        );
        // Each signing has its own nonce: the same request signed again
        // is a new call.
        let resigned = signed("alice", &call(BODY), 1_002);
        assert_ne!(resigned.get(SIGNATURE), headers.get(SIGNATURE));
        assert_eq!(
            verifier.verify(&resigned, METHOD, BODY, 1_002),
            Ok(Some("alice"))
        );
    }

    #[test]
    fn a_nonce_is_kept_until_its_signature_expires_and_then_let_go() {
        let verifier = verifier();
        let first = signed("alice", &call(BODY), 1_000);
        verifier.verify(&first, METHOD, BODY, 1_000).unwrap();
        let later = signed("alice", &call(BODY), 1_000 + VALID_MS + 1);
        verifier
            .verify(&later, METHOD, BODY, 1_000 + VALID_MS + 1)
            .unwrap();
        let seen = verifier.seen.lock().unwrap();
        assert_eq!((seen.nonces.len(), seen.by_expiry.len()), (1, 1));
    }

    #[test]
    fn past_the_bound_a_call_is_refused_to_be_sent_again() {
        let mut seen = Seen::default();
        for nonce in 0..MAX_SEEN as u128 {
            seen.first_use(nonce, 2_000, 1_000).unwrap();
        }
        let refused = seen.first_use(u128::MAX, 2_000, 1_000);
        assert!(
            matches!(refused, Err(Refusal::ForwardNotNow(_))),
            "{refused:?}"
        );
        // Once they expire, there is room again.
        seen.first_use(u128::MAX, 3_000, 2_001).unwrap();
        assert_eq!(seen.nonces.len(), 1);
    }

    #[test]
    fn a_signature_made_before_the_server_started_is_refused() {
        let headers = signed("alice", &call(BODY), 1_000);
        let restarted = Verifier::new(KEY, TO.to_string(), 1_001);
        let refused = restarted.verify(&headers, METHOD, BODY, 1_001);
        assert!(
            matches!(refused, Err(Refusal::ForwardNotNow(_))),
            "{refused:?}"
        );
    }

    #[test]
    fn a_request_streams_signature_covers_no_body() {
        let subscribe = REQUEST_STREAMS[0];
        let stream = Call {
            method: subscribe,
            to: TO,
            body: b"",
        };
        let headers = signed("alice", &stream, 1_000);
        assert_eq!(
            verifier().verify(&headers, subscribe, b"anything", 1_000),
            Ok(Some("alice"))
        );
    }

    #[test]
    fn a_changed_principal_a_lone_header_or_a_bad_nonce_is_refused() {
        let mut headers = signed("alice", &call(BODY), 1_000);
        headers.insert(PRINCIPAL, "admin".parse().unwrap());
        assert!(verifier().verify(&headers, METHOD, BODY, 1_000).is_err());
        headers.remove(SIGNATURE);
        assert!(verifier().verify(&headers, METHOD, BODY, 1_000).is_err());
        assert_eq!(
            verifier().verify(&HeaderMap::new(), METHOD, BODY, 1_000),
            Ok(None)
        );
        let mut headers = HeaderMap::new();
        headers.insert(PRINCIPAL, "alice".parse().unwrap());
        headers.insert(SIGNATURE, "2000.+1.00".parse().unwrap());
        let refused = verifier().verify(&headers, METHOD, BODY, 1_000);
        assert!(
            matches!(refused, Err(Refusal::ForwardRefused(why)) if why.contains("nonce")),
            "{refused:?}"
        );
    }

    /// What signing and verifying cost per forwarded call, by body size,
    /// printed (run it in release: `cargo test --release --lib
    /// auth::forwarded -- --ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn sign_and_verify_cost_per_call() {
        const CALLS: i64 = 10_000;
        for size in [120, 4096, 65536] {
            let body = vec![0x5a; size];
            let verifier = verifier();
            let started = std::time::Instant::now();
            // One call a millisecond: the set holds the last 30 s of them.
            for now in 1_000..1_000 + CALLS {
                let headers = signed("approver", &call(&body), now);
                verifier.verify(&headers, METHOD, &body, now).unwrap();
            }
            let per_call = started.elapsed() / CALLS as u32;
            println!("body {size:>6} B: sign + verify {per_call:?} per call");
        }
    }

    #[test]
    fn unary_body_frames_one_message_as_a_grpc_client_sends_it() {
        let message = prost_types::Duration {
            seconds: 1,
            nanos: 0,
        };
        assert_eq!(unary_body(&message), b"\0\0\0\0\x02\x08\x01");
    }
}
