//! Web sessions without server state: a cookie naming the signed-in
//! principal and an expiry, signed with the store's token key (which every
//! server of a cluster shares, so any of them behind a load balancer
//! accepts it), and a CSRF token derived from the cookie. Nothing secret is
//! in the cookie: the token a person signs in with is checked once and
//! forgotten.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The session cookie's name.
pub const COOKIE: &str = "aaa_session";
/// How long a session lasts after sign-in.
pub const LIFETIME_MS: i64 = 12 * 3600 * 1000;

/// A verified session: who signed in (empty with auth off) and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: String,
    pub expires_ms: i64,
    /// The cookie's value, from which the CSRF token is derived.
    value: String,
}

fn mac(key: &[u8], purpose: &str, parts: &[&str]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(b"aaa web ");
    mac.update(purpose.as_bytes());
    for part in parts {
        mac.update(b"\n");
        mac.update(part.as_bytes());
    }
    mac
}

impl Session {
    /// A new session for `principal` (names are `[A-Za-z0-9_.:@-]`, so `~`
    /// separates the fields), with a random nonce so that two sign-ins
    /// get two CSRF tokens.
    pub fn issue(key: &[u8], principal: &str, now_ms: i64) -> Session {
        let expires_ms = now_ms + LIFETIME_MS;
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let expires = expires_ms.to_string();
        let signature = hex::encode(
            mac(key, "session", &[principal, &expires, &nonce])
                .finalize()
                .into_bytes(),
        );
        Session {
            principal: principal.to_string(),
            expires_ms,
            value: format!("{principal}~{expires}~{nonce}~{signature}"),
        }
    }

    /// The session a cookie value names, if its signature verifies and it
    /// has not expired.
    pub fn verify(key: &[u8], value: &str, now_ms: i64) -> Option<Session> {
        let mut fields = value.split('~');
        let (principal, expires, nonce, signature) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        if fields.next().is_some() {
            return None;
        }
        let given = hex::decode(signature).ok()?;
        mac(key, "session", &[principal, expires, nonce])
            .verify_slice(&given)
            .ok()?;
        let expires_ms: i64 = expires.parse().ok()?;
        (expires_ms > now_ms).then(|| Session {
            principal: principal.to_string(),
            expires_ms,
            value: value.to_string(),
        })
    }

    /// The CSRF token every state-changing form of this session carries.
    pub fn csrf(&self, key: &[u8]) -> String {
        hex::encode(mac(key, "csrf", &[&self.value]).finalize().into_bytes())
    }

    /// Whether `given` is this session's CSRF token (compared in constant time).
    pub fn csrf_matches(&self, key: &[u8], given: &str) -> bool {
        let Ok(given) = hex::decode(given) else {
            return false;
        };
        mac(key, "csrf", &[&self.value])
            .verify_slice(&given)
            .is_ok()
    }

    /// The `Set-Cookie` value that stores this session: HttpOnly, SameSite
    /// Strict, Secure under TLS, expiring with the session.
    pub fn set_cookie(&self, secure: bool, now_ms: i64) -> String {
        let max_age = (self.expires_ms - now_ms).max(0) / 1000;
        format!(
            "{COOKIE}={}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
            self.value,
            if secure { "; Secure" } else { "" }
        )
    }
}

/// The `Set-Cookie` value that signs out.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The session cookie's value among a request's `Cookie` headers.
pub fn cookie_value(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_session_verifies_until_it_expires_and_only_with_its_key() {
        let session = Session::issue(KEY, "alice", 1_000);
        let value = session.value.clone();
        assert_eq!(Session::verify(KEY, &value, 1_000), Some(session.clone()));
        assert_eq!(Session::verify(KEY, &value, 1_000 + LIFETIME_MS), None);
        assert_eq!(Session::verify(b"another key", &value, 1_000), None);
        let forged = value.replacen("alice", "admin", 1);
        assert_eq!(Session::verify(KEY, &forged, 1_000), None);
        assert_eq!(
            Session::verify(KEY, "alice~9999999999999~x~00", 1_000),
            None
        );
        assert_eq!(Session::verify(KEY, "", 1_000), None);
    }

    #[test]
    fn csrf_tokens_belong_to_one_session() {
        let one = Session::issue(KEY, "alice", 1_000);
        let two = Session::issue(KEY, "alice", 1_000);
        assert!(one.csrf_matches(KEY, &one.csrf(KEY)));
        assert!(!one.csrf_matches(KEY, &two.csrf(KEY)));
        assert!(!one.csrf_matches(KEY, ""));
        assert!(!one.csrf_matches(KEY, "zz"));
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_under_tls() {
        let session = Session::issue(KEY, "alice", 1_000);
        let cookie = session.set_cookie(true, 1_000);
        assert!(
            cookie.contains("HttpOnly; SameSite=Strict; Secure"),
            "{cookie}"
        );
        assert!(cookie.contains("Max-Age=43200"), "{cookie}");
        assert!(!session.set_cookie(false, 1_000).contains("Secure"));
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::COOKIE,
            format!("x=1; {COOKIE}={}", session.value).parse().unwrap(),
        );
        assert_eq!(cookie_value(&headers), Some(session.value.as_str()));
    }
}
