//! The task token's format: what a worker gets with each attempt it is
//! handed, and sends back with its heartbeats and result. Signed with the
//! store's token key (HMAC-SHA256), so a worker cannot make one for an
//! attempt it was not given.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::RunId;

/// What an attempt runs: a tool call, or a model call served by a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    Tool,
    Model,
}

/// The fencing token of an attempt: kind, run, attempt, the principal it
/// was handed to (empty with auth off) and call. A result carrying a token
/// whose attempt is no longer current is refused, and so is one from
/// another principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: TaskKind,
    pub run: RunId,
    pub attempt: u32,
    pub principal: String,
    pub call_id: String,
}

/// The text is not a token signed with this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("token: not a task token of this server")]
pub struct InvalidToken;

/// Bytes of the signature kept in a token (128 bits).
const TOKEN_MAC_BYTES: usize = 16;

impl Token {
    /// `KIND.MAC.RUN.ATTEMPT.PRINCIPAL.CALL`, the principal's name in hex
    /// (names may hold dots); the call id goes last, as it may hold dots.
    pub fn encode(&self, key: &[u8]) -> String {
        let kind = match self.kind {
            TaskKind::Tool => "t",
            TaskKind::Model => "m",
        };
        let body = format!(
            "{kind}.{}.{}.{}.{}",
            self.run,
            self.attempt,
            hex::encode(&self.principal),
            self.call_id
        );
        let mac = mac(key, &body).finalize().into_bytes();
        let (kind, rest) = body.split_at(1);
        format!("{kind}.{}{rest}", hex::encode(&mac[..TOKEN_MAC_BYTES]))
    }

    pub fn decode(text: &str, key: &[u8]) -> Result<Token, InvalidToken> {
        let mut parts = text.splitn(6, '.');
        let kind_text = parts.next().ok_or(InvalidToken)?;
        let signature = parts
            .next()
            .and_then(|m| hex::decode(m).ok())
            .ok_or(InvalidToken)?;
        let body_at = kind_text.len() + 1 + signature.len() * 2;
        let body = format!("{kind_text}{}", &text[body_at..]);
        mac(key, &body)
            .verify_truncated_left(&signature)
            .ok()
            .filter(|()| signature.len() == TOKEN_MAC_BYTES)
            .ok_or(InvalidToken)?;
        let kind = match kind_text {
            "t" => TaskKind::Tool,
            "m" => TaskKind::Model,
            _ => return Err(InvalidToken),
        };
        let run = parts.next().and_then(RunId::parse).ok_or(InvalidToken)?;
        let attempt = parts
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or(InvalidToken)?;
        let principal = parts
            .next()
            .and_then(|p| String::from_utf8(hex::decode(p).ok()?).ok())
            .ok_or(InvalidToken)?;
        let call_id = parts.next().filter(|c| !c.is_empty()).ok_or(InvalidToken)?;
        Ok(Token {
            kind,
            run,
            attempt,
            principal,
            call_id: call_id.to_string(),
        })
    }
}

fn mac(key: &[u8], body: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(body.as_bytes());
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_only_as_it_was_signed() {
        let key = [7u8; 32];
        let token = Token {
            kind: TaskKind::Tool,
            run: RunId::new(),
            attempt: 2,
            principal: "payments.worker".into(),
            call_id: "call.with.dots".into(),
        };
        let text = token.encode(&key);
        assert_eq!(Token::decode(&text, &key).unwrap(), token);
        // Another server's key, another attempt, another principal, a cut
        // signature: refused.
        assert!(Token::decode(&text, &[8u8; 32]).is_err());
        let principal = hex::encode("payments.worker");
        let other_attempt = text.replace(&format!(".2.{principal}"), &format!(".3.{principal}"));
        assert_ne!(other_attempt, text);
        assert!(Token::decode(&other_attempt, &key).is_err());
        let other_principal = text.replace(&principal, &hex::encode("other-worker"));
        assert_ne!(other_principal, text);
        assert!(Token::decode(&other_principal, &key).is_err());
        let (kind, rest) = text.split_at(2);
        assert!(Token::decode(&format!("{kind}{}", &rest[2..]), &key).is_err());
        for junk in ["", "t", "t.", "t..", "x.00.1.2", "not-a-token"] {
            assert!(Token::decode(junk, &key).is_err(), "{junk}");
        }
    }
}
