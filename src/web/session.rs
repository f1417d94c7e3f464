//! Web sessions: a cookie naming the signed-in principal, when it was
//! issued, a nonce and a fingerprint of the credential it was made from,
//! signed with the store's token key (which every server of a cluster
//! shares, so any of them behind a load balancer accepts it), and a CSRF
//! token derived from the cookie. Nothing secret is in the cookie: the
//! token a person signs in with is checked once and forgotten, and the
//! fingerprint is a MAC of its configured hash under the server's key, so
//! a stolen cookie tells nothing about the token. Whether a verified
//! session still stands (its credential unchanged, not signed out) is
//! `sessions`' to say.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::auth::CredentialKind;

/// The session cookie's name.
pub const COOKIE: &str = "aaa_session";
/// How long a session lasts after sign-in.
pub const LIFETIME_MS: i64 = 12 * 3600 * 1000;

/// A verified session: who signed in (empty with auth off), when, and with
/// which credential (its fingerprint; empty with auth off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: String,
    pub issued_ms: i64,
    pub credential: String,
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

/// The fingerprint a session keeps of the credential it was made from: a
/// MAC, under the server's key, of the credential's kind and of the hex
/// SHA-256 the auth config holds for it (128 bits, hex).
pub fn fingerprint(key: &[u8], kind: CredentialKind, sha256_hex: &str) -> String {
    let tag = mac(key, "credential", &[kind.as_str(), sha256_hex])
        .finalize()
        .into_bytes();
    hex::encode(&tag[..16])
}

impl Session {
    /// A new session for `principal` made with the credential of
    /// `fingerprint` (names are `[A-Za-z0-9_.:@-]` and fingerprints hex, so
    /// `~` separates the fields), with a random nonce so that two sign-ins
    /// get two CSRF tokens.
    pub fn issue(key: &[u8], principal: &str, fingerprint: &str, issued_ms: i64) -> Session {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let issued = issued_ms.to_string();
        let signature = hex::encode(
            mac(key, "session", &[principal, &issued, &nonce, fingerprint])
                .finalize()
                .into_bytes(),
        );
        Session {
            principal: principal.to_string(),
            issued_ms,
            credential: fingerprint.to_string(),
            value: format!("{principal}~{issued}~{nonce}~{fingerprint}~{signature}"),
        }
    }

    /// The cookie's value.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// When the session ends by itself.
    pub fn expires_ms(&self) -> i64 {
        self.issued_ms.saturating_add(LIFETIME_MS)
    }

    /// The session a cookie value names, if its signature verifies and it
    /// has not expired.
    pub fn verify(key: &[u8], value: &str, now_ms: i64) -> Option<Session> {
        let fields: Vec<&str> = value.split('~').collect();
        let [principal, issued, nonce, fingerprint, signature] = fields[..] else {
            return None;
        };
        let given = hex::decode(signature).ok()?;
        mac(key, "session", &[principal, issued, nonce, fingerprint])
            .verify_slice(&given)
            .ok()?;
        let session = Session {
            principal: principal.to_string(),
            issued_ms: issued.parse().ok()?,
            credential: fingerprint.to_string(),
            value: value.to_string(),
        };
        (session.expires_ms() > now_ms).then_some(session)
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
        let max_age = (self.expires_ms() - now_ms).max(0) / 1000;
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
    named_cookie(headers, COOKIE)
}

/// The value of the cookie called `name` among a request's `Cookie` headers.
fn named_cookie<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(named, _)| *named == name)
        .map(|(_, value)| value)
}

/// With auth off: the cookie that keeps the name a person typed, so that
/// their decisions say who made them (unverified: nobody checks it). It is
/// beside the session rather than in it, so that the session's form stays
/// the one auth on uses.
pub const APPROVER_COOKIE: &str = "aaa_approver";
/// The longest name a person may give.
pub const APPROVER_MAX_CHARS: usize = 64;

/// A typed approver name, trimmed, or why it cannot be one. Names travel
/// in an HTTP header to the API (see `client`), so they are printable
/// ASCII: letters, digits, spaces and `. _ - @ '`.
pub fn approver_name(text: &str) -> Result<String, String> {
    let name = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if name.chars().count() > APPROVER_MAX_CHARS {
        return Err(format!(
            "A name has at most {APPROVER_MAX_CHARS} characters."
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || " ._-@'".contains(c);
    match name.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!(
            "A name may hold letters, digits, spaces and . _ - @ ' (not '{c}')."
        )),
        None => Ok(name),
    }
}

/// The approver name a request's cookie keeps, if it is one.
pub fn approver_value(headers: &http::HeaderMap) -> Option<String> {
    let bytes = hex::decode(named_cookie(headers, APPROVER_COOKIE)?).ok()?;
    let name = approver_name(&String::from_utf8(bytes).ok()?).ok()?;
    (!name.is_empty()).then_some(name)
}

/// The `Set-Cookie` value that keeps `name` (hex, as cookies take no
/// spaces), for as long as a session lasts; an empty name clears it.
pub fn set_approver_cookie(name: &str, secure: bool) -> String {
    let max_age = if name.is_empty() {
        0
    } else {
        LIFETIME_MS / 1000
    };
    format!(
        "{APPROVER_COOKIE}={}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        hex::encode(name),
        if secure { "; Secure" } else { "" }
    )
}

/// A request's `Cookie` headers with `value` as its session cookie (the
/// session a page issues for the request it answers).
pub fn with_session_cookie(headers: &mut http::HeaderMap, value: &str) {
    let others: Vec<String> = headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| !pair.is_empty() && pair.split_once('=').is_none_or(|(n, _)| n != COOKIE))
        .map(str::to_string)
        .collect();
    let mut pairs = others;
    pairs.push(format!("{COOKIE}={value}"));
    headers.remove(http::header::COOKIE);
    if let Ok(joined) = pairs.join("; ").parse() {
        headers.insert(http::header::COOKIE, joined);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_session_verifies_until_it_expires_and_only_with_its_key() {
        let session = Session::issue(KEY, "alice", "00ff", 1_000);
        let value = session.value.clone();
        assert_eq!(Session::verify(KEY, &value, 1_000), Some(session.clone()));
        assert_eq!(Session::verify(KEY, &value, 1_000 + LIFETIME_MS), None);
        assert_eq!(Session::verify(b"another key", &value, 1_000), None);
        let forged = value.replacen("alice", "admin", 1);
        assert_eq!(Session::verify(KEY, &forged, 1_000), None);
        // Another credential's fingerprint breaks the signature too.
        let forged = value.replacen("~00ff~", "~00fe~", 1);
        assert_eq!(Session::verify(KEY, &forged, 1_000), None);
        assert_eq!(
            Session::verify(KEY, "alice~9999999999999~x~~00", 1_000),
            None
        );
        // The form before credentials were bound (four fields) is refused.
        assert_eq!(
            Session::verify(KEY, "alice~9999999999999~x~00", 1_000),
            None
        );
        assert_eq!(Session::verify(KEY, "", 1_000), None);
    }

    #[test]
    fn csrf_tokens_belong_to_one_session() {
        let one = Session::issue(KEY, "alice", "", 1_000);
        let two = Session::issue(KEY, "alice", "", 1_000);
        assert!(one.csrf_matches(KEY, &one.csrf(KEY)));
        assert!(!one.csrf_matches(KEY, &two.csrf(KEY)));
        assert!(!one.csrf_matches(KEY, ""));
        assert!(!one.csrf_matches(KEY, "zz"));
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_under_tls() {
        let session = Session::issue(KEY, "alice", "", 1_000);
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

    #[test]
    fn fingerprints_tell_credentials_apart_under_one_key() {
        let token = crate::auth::sha256_hex(b"token-alice");
        let one = fingerprint(KEY, CredentialKind::Token, &token);
        assert_eq!(one.len(), 32);
        assert_eq!(one, fingerprint(KEY, CredentialKind::Token, &token));
        assert_ne!(one, fingerprint(KEY, CredentialKind::Cert, &token));
        let rotated = crate::auth::sha256_hex(b"token-alice-2");
        assert_ne!(one, fingerprint(KEY, CredentialKind::Token, &rotated));
        assert_ne!(
            one,
            fingerprint(b"another key", CredentialKind::Token, &token)
        );
        // Not the configured hash itself.
        assert!(!token.contains(&one));
    }

    #[test]
    fn an_approver_name_is_kept_in_its_own_cookie_and_checked() {
        assert_eq!(approver_name("  Ann   Lee ").unwrap(), "Ann Lee");
        assert_eq!(approver_name("").unwrap(), "");
        assert!(approver_name("a;b").unwrap_err().contains("';'"));
        assert!(approver_name(&"x".repeat(65)).is_err());
        let set = set_approver_cookie("Ann Lee", false);
        let pair = set.split(';').next().unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::COOKIE,
            format!("x=1; {pair}").parse().unwrap(),
        );
        assert_eq!(approver_value(&headers).as_deref(), Some("Ann Lee"));
        assert!(set_approver_cookie("", false).contains("Max-Age=0"));
        // A session issued for the request replaces a stale one, keeps the rest.
        headers.append(
            http::header::COOKIE,
            format!("{COOKIE}=stale").parse().unwrap(),
        );
        with_session_cookie(&mut headers, "fresh");
        assert_eq!(cookie_value(&headers), Some("fresh"));
        assert_eq!(approver_value(&headers).as_deref(), Some("Ann Lee"));
    }
}
