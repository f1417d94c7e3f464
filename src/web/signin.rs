//! Signing in and out. With auth on, a person signs in with a principal's
//! bearer token (posted in a form, checked once, never kept or logged) or,
//! under mTLS, with the client certificate the browser presented; either
//! way the session names the principal and keeps a fingerprint of that
//! credential. Wrong ones are counted per address, with the server's other
//! doors (see `auth::throttle`). With
//! auth off there is nobody to be: a page starts a session by itself (see
//! `open_session`), whose CSRF token guards the forms, and this form only
//! keeps the name a person gives for their decisions (unverified). Signing
//! out ends the principal's sessions on every server (see `sessions`).

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use http::request::Parts;
use http::{header, StatusCode};
use serde::Deserialize;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::html::Html;
use super::session;
use super::{refusal, Visitor, Web};
use crate::auth::{authenticate_from, sha256_hex, CredentialKind, Refusal};

#[derive(Deserialize)]
pub struct Next {
    #[serde(default)]
    next: String,
}

#[derive(Deserialize)]
pub struct SignIn {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
    /// With auth off: the name to record decisions under (unverified);
    /// absent when the form has no such field.
    approver: Option<String>,
}

#[derive(Deserialize)]
pub struct Csrf {
    #[serde(default)]
    csrf: String,
}

/// Where to go after signing in: a path of this site, never another site
/// (`//host` or `/\host` would leave it).
fn local_path(next: &str) -> &str {
    let local = next.starts_with('/')
        && !next.starts_with("//")
        && !next.starts_with("/\\")
        && !next.chars().any(|c| c.is_control());
    if local {
        next
    } else {
        "/"
    }
}

pub async fn page(State(web): State<Web>, parts: Parts, Query(next): Query<Next>) -> Response {
    let typed = session::approver_value(&parts.headers).unwrap_or_default();
    form(&web, local_path(&next.next), None, StatusCode::OK, &typed)
}

fn form(web: &Web, next: &str, error: Option<&str>, status: StatusCode, typed: &str) -> Response {
    let mut h = Html::new();
    h.raw("<section class=\"signin\"><h1>Sign in</h1>");
    if let Some(error) = error {
        h.raw("<p class=\"error\" id=\"error\" role=\"alert\">")
            .text(error)
            .raw("</p>");
    }
    h.raw("<form method=\"post\" action=\"/signin\"><input type=\"hidden\" name=\"next\" value=\"")
        .text(next)
        .raw("\">");
    match &web.0.settings.auth {
        Some(auth) => {
            h.raw(
                "<label for=\"token\">Your aaa token</label>\
                 <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" autofocus>",
            );
            if auth.tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some()) {
                h.raw(
                    "<p class=\"hint\">Or leave it empty to sign in with the client certificate \
                     your browser presents.</p>",
                );
            }
            h.raw("<button type=\"submit\" class=\"primary\">Sign in</button>");
        }
        None => {
            h.raw(
                "<p>Auth is off: there are no accounts, and anyone who reaches this page may \
                 decide every call. Decisions are recorded under your address, and the name \
                 you give here beside it, marked unverified.</p>\
                 <label for=\"approver\">Your name (optional)</label>\
                 <input id=\"approver\" name=\"approver\" maxlength=\"64\" autocomplete=\"name\" value=\"",
            )
            .text(typed)
            .raw("\"><button type=\"submit\" class=\"primary\" autofocus>Continue</button>");
        }
    }
    h.raw("</form></section>");
    let mut response = super::page(web, None, "Sign in", "", &h);
    *response.status_mut() = status;
    response
}

/// A sign-in form posted from another site would sign the browser in as
/// someone else (login CSRF): the browser's Origin must be this site.
fn same_origin(parts: &Parts) -> bool {
    // Browsers say where a request comes from (Fetch Metadata); older ones
    // send the Origin.
    if let Some(site) = parts.headers.get("sec-fetch-site") {
        return matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = parts.headers.get(header::ORIGIN) else {
        return true;
    };
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let origin = origin.to_str().ok();
    match (origin, host) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, rest)| rest == host),
        _ => false,
    }
}

pub async fn submit(State(web): State<Web>, parts: Parts, Form(input): Form<SignIn>) -> Response {
    let next = local_path(&input.next).to_string();
    if !same_origin(&parts) {
        return refusal(
            StatusCode::FORBIDDEN,
            "A sign-in must come from this site's own form.",
        );
    }
    let peer = crate::auth::remote_addr(&parts.extensions);
    let (principal, fingerprint) = match &web.0.settings.auth {
        None => {
            if !peer.is_some_and(|p| p.ip().is_loopback()) {
                return refusal(
                    StatusCode::FORBIDDEN,
                    "With auth off the web inbox answers only on loopback.",
                );
            }
            if let Some(Err(error)) = input.approver.as_deref().map(session::approver_name) {
                let typed = input.approver.as_deref().unwrap_or("");
                return form(&web, &next, Some(&error), StatusCode::BAD_REQUEST, typed);
            }
            (String::new(), String::new())
        }
        Some(auth) => {
            let cert = parts
                .extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.peer_certs())
                .and_then(|certs| certs.first().map(|c| c.as_ref().to_vec()));
            let token = input.token.trim();
            let (bearer, cert, kind, hash) = match (token.is_empty(), cert) {
                (false, _) => (
                    Some(token),
                    None,
                    CredentialKind::Token,
                    sha256_hex(token.as_bytes()),
                ),
                (true, Some(der)) => {
                    let hash = sha256_hex(&der);
                    (None, Some(der), CredentialKind::Cert, hash)
                }
                (true, None) => {
                    return form(
                        &web,
                        &next,
                        Some("Enter your token."),
                        StatusCode::UNAUTHORIZED,
                        "",
                    )
                }
            };
            let throttle = &web.0.settings.throttle;
            match authenticate_from(auth, throttle, peer, bearer, cert.as_deref()) {
                Ok(principal) => (
                    principal.name,
                    session::fingerprint(&web.0.settings.key, kind, &hash),
                ),
                Err(Refusal::Throttled { retry_after_s }) => {
                    let message = format!(
                        "Too many wrong sign-ins from your address: try again in {retry_after_s} s."
                    );
                    let mut response = form(
                        &web,
                        &next,
                        Some(&message),
                        StatusCode::TOO_MANY_REQUESTS,
                        "",
                    );
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, retry_after_s.into());
                    return response;
                }
                Err(_) => {
                    return form(
                        &web,
                        &next,
                        Some("That token (or certificate) matches no principal."),
                        StatusCode::UNAUTHORIZED,
                        "",
                    );
                }
            }
        }
    };
    let now = web.0.settings.clock.now_ms();
    let session = match web.0.sessions.issue(&principal, &fingerprint, now).await {
        Ok(session) => session,
        Err(e) => {
            tracing::warn!("web sign-in: cannot read the principal's sign-out: {e}");
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "The server cannot start a session right now (its store is unavailable): \
                 try again in a moment.",
            );
        }
    };
    if !principal.is_empty() {
        tracing::info!(principal, "web sign-in");
    }
    let mut response = (
        [(
            header::SET_COOKIE,
            session.set_cookie(web.0.settings.tls, now),
        )],
        Redirect::to(&next),
    )
        .into_response();
    // Auth off: keep the name typed (an empty one forgets it).
    let typed = input.approver.as_deref().map(session::approver_name);
    if let (None, Some(Ok(name))) = (&web.0.settings.auth, typed) {
        let cookie = session::set_approver_cookie(&name, web.0.settings.tls);
        if let Ok(cookie) = cookie.parse() {
            response.headers_mut().append(header::SET_COOKIE, cookie);
        }
    }
    response
}

pub async fn sign_out(
    State(web): State<Web>,
    visitor: Visitor,
    Form(form): Form<Csrf>,
) -> Response {
    if let Some(refused) = visitor.refuse_without_csrf(&web, &form.csrf) {
        return refused;
    }
    let now = web.0.settings.clock.now_ms();
    if let Err(e) = web.0.sessions.sign_out(&visitor.session, now).await {
        tracing::warn!("web sign-out: cannot record it: {e}");
        return refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "The sign-out could not be recorded (the server's store is unavailable), so the \
             session still stands: try again in a moment.",
        );
    }
    let mut response = (
        [(
            header::SET_COOKIE,
            session::clear_cookie(web.0.settings.tls),
        )],
        Redirect::to("/signin"),
    )
        .into_response();
    if web.0.settings.auth.is_none() {
        let forget = session::set_approver_cookie("", web.0.settings.tls);
        if let Ok(forget) = forget.parse() {
            response.headers_mut().append(header::SET_COOKIE, forget);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn only_local_paths_are_followed_after_sign_in() {
        assert_eq!(local_path("/calls/r/c"), "/calls/r/c");
        assert_eq!(local_path("//evil.example/x"), "/");
        assert_eq!(local_path("/\\evil.example"), "/");
        assert_eq!(local_path("https://evil.example"), "/");
        assert_eq!(local_path(""), "/");
    }
}
