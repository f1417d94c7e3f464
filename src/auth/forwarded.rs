//! Calls one server forwards to another carry the caller's principal in a
//! header, signed with the store's secret key (which every server of a
//! database shares and no client has), so that the server that serves the
//! call acts, checks roles and records the actor exactly as if the caller
//! had called it. The signature covers the principal, the method and an
//! expiry a little ahead, so it cannot be moved to another call or kept.
//! With auth off there are no principals; the header then names the
//! caller's address ([`ForwardedPeer`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;
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
/// `EXPIRES_MS.HEX_MAC` over the principal, the method and the expiry.
pub const SIGNATURE: &str = "aaa-forwarded-signature";
/// How long a signature holds: enough for a hop between two servers whose
/// clocks differ by a few seconds, too short to keep.
const VALID_MS: i64 = 30_000;

fn mac(key: &[u8], principal: &str, method: &str, expires_ms: i64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(format!("aaa forwarded call\n{principal}\n{method}\n{expires_ms}").as_bytes());
    mac
}

/// Puts the principal and its signature on a call being forwarded.
pub fn sign(headers: &mut HeaderMap, key: &[u8], principal: &str, method: &str, now_ms: i64) {
    let expires_ms = now_ms + VALID_MS;
    let signature = hex::encode(
        mac(key, principal, method, expires_ms)
            .finalize()
            .into_bytes(),
    );
    // Principal names are printable ASCII (the auth config checks them).
    if let Ok(name) = principal.parse() {
        headers.insert(PRINCIPAL, name);
    }
    if let Ok(value) = format!("{expires_ms}.{signature}").parse() {
        headers.insert(SIGNATURE, value);
    }
}

/// The principal name a forwarded call carries, once its signature
/// verifies; `None` for a call that was not forwarded.
pub fn verify<'a>(
    headers: &'a HeaderMap,
    key: &[u8],
    method: &str,
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
    let (expires, mac_hex) = signature
        .split_once('.')
        .ok_or(forged("the signature is not EXPIRES.MAC"))?;
    let expires_ms: i64 = expires
        .parse()
        .map_err(|_| forged("the signature's expiry is not a number"))?;
    let given = hex::decode(mac_hex).map_err(|_| forged("the signature's MAC is not hex"))?;
    mac(key, principal, method, expires_ms)
        .verify_slice(&given)
        .map_err(|_| forged("its signature does not verify"))?;
    if expires_ms < now_ms {
        return Err(forged("its signature expired"));
    }
    Ok(Some(principal))
}

fn forged(why: &'static str) -> Refusal {
    Refusal::ForwardRefused(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const METHOD: &str = "/aaa.v1.RunService/Signal";

    fn signed(principal: &str, now_ms: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        sign(&mut headers, KEY, principal, METHOD, now_ms);
        headers
    }

    #[test]
    fn a_signed_principal_verifies_for_its_method_until_it_expires() {
        let headers = signed("alice", 1_000);
        assert_eq!(verify(&headers, KEY, METHOD, 1_000), Ok(Some("alice")));
        assert_eq!(
            verify(&headers, KEY, METHOD, 1_000 + VALID_MS),
            Ok(Some("alice"))
        );
        assert!(verify(&headers, KEY, METHOD, 1_001 + VALID_MS).is_err());
        assert!(verify(&headers, KEY, "/aaa.v1.RunService/CancelRun", 1_000).is_err());
        assert!(verify(&headers, b"another key", METHOD, 1_000).is_err());
    }

    #[test]
    fn a_changed_principal_or_a_lone_header_is_refused() {
        let mut headers = signed("alice", 1_000);
        headers.insert(PRINCIPAL, "admin".parse().unwrap());
        assert!(verify(&headers, KEY, METHOD, 1_000).is_err());
        headers.remove(SIGNATURE);
        assert!(verify(&headers, KEY, METHOD, 1_000).is_err());
        assert_eq!(verify(&HeaderMap::new(), KEY, METHOD, 1_000), Ok(None));
    }
}
