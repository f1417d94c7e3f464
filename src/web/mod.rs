//! The web approval inbox, served by `aaa serve` on the gRPC port beside
//! gRPC (see `http`): server-rendered pages (html), a small script and a
//! stylesheet embedded in the binary, sign-in to a signed cookie session
//! (session), and every read and decision made through the server's own
//! gRPC API as the signed-in principal (client). Pages: the inbox (inbox),
//! a call's page and its decisions (call), runs and their timelines
//! (runs), events in words (events); live updates as Server-Sent Events
//! (live); sign-in and out (signin), which sessions still stand
//! (sessions); the host names the pages answer to (hosts); the headers
//! that keep the page from being framed or injected, and the embedded
//! assets (security). See docs/web.md.

mod call;
mod client;
mod events;
pub mod hosts;
pub mod html;
mod inbox;
mod live;
mod runs;
mod security;
pub mod session;
mod sessions;
mod signin;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;
use http::StatusCode;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::auth::{AuthConfig, Principal};
use crate::clock::Clock;
use crate::store::SharedStore;
pub use client::Caller;
use hosts::AllowedHosts;
use html::Html;
use session::Session;
use sessions::Sessions;

/// What the pages need from the server.
pub struct Settings {
    /// The auth config; `None`: auth is off and the pages answer only on
    /// loopback.
    pub auth: Option<Arc<AuthConfig>>,
    /// Served over TLS: cookies are Secure.
    pub tls: bool,
    /// The store's token key: signs sessions and the principal on calls.
    pub key: [u8; 32],
    /// This server's advertised address, which the calls are signed for.
    pub address: String,
    /// A channel to this server's own gRPC address.
    pub channel: Channel,
    /// Cancelled when the server stops: every live stream ends.
    pub stopping: CancellationToken,
    /// Where sign-outs are kept, for every server of the deployment.
    pub store: SharedStore,
    /// The server's clock: sessions' times.
    pub clock: Clock,
    /// Wrong credentials per address, shared with the server's other doors.
    pub throttle: Arc<crate::auth::Throttle>,
    /// The host names the pages answer to.
    pub hosts: AllowedHosts,
}

/// The pages' shared state.
#[derive(Clone)]
pub struct Web(Arc<Shared>);

pub struct Shared {
    settings: Settings,
    sessions: Sessions,
}

/// The web inbox's routes, to merge into the server's HTTP router.
pub fn router(settings: Settings) -> Router {
    let sessions = Sessions::new(
        settings.key,
        settings.auth.as_deref(),
        settings.store.clone(),
    );
    let web = Web(Arc::new(Shared { settings, sessions }));
    Router::new()
        .route("/", get(inbox::page_handler))
        .route("/signin", get(signin::page).post(signin::submit))
        .route("/signout", post(signin::sign_out))
        .route("/calls/{run}/{call}", get(call::page_handler))
        .route("/calls/{run}/{call}/approve", post(call::decide))
        .route("/calls/{run}/{call}/deny", post(call::decide))
        .route("/calls/{run}/{call}/edit", post(call::decide))
        .route("/runs", get(runs::list))
        .route("/runs/{run}", get(runs::timeline))
        .route("/live/approvals", get(live::approvals))
        .route("/live/runs/{run}", get(live::run_events))
        .route("/assets/app.js", get(security::script))
        .route("/assets/app.css", get(security::style))
        .layer(axum::middleware::from_fn_with_state(
            web.clone(),
            open_session,
        ))
        .layer(axum::middleware::from_fn_with_state(
            web.clone(),
            check_host,
        ))
        .with_state(web)
        .layer(axum::middleware::map_response(security::headers))
}

/// Refuses a request that names another host than this server's (see
/// `hosts`): 421, with the names it answers to and how to add one. The
/// two assets are the same for everyone and are served under any name, so
/// that the refusal page has its style.
async fn check_host(State(web): State<Web>, request: Request, next: Next) -> Response {
    let hosts = &web.0.settings.hosts;
    let uri_host = request.uri().authority().map(|a| a.as_str());
    let header_host = request
        .headers()
        .get(http::header::HOST)
        .map(|h| h.to_str().unwrap_or("?"));
    let named: Vec<&str> = uri_host.into_iter().chain(header_host).collect();
    if request.uri().path().starts_with("/assets/")
        || (!named.is_empty() && named.iter().all(|h| hosts.allows(h)))
    {
        return next.run(request).await;
    }
    let given = match named.iter().find(|h| !hosts.allows(h)) {
        Some(host) => format!("'{}'", host.chars().take(100).collect::<String>()),
        None => "no host name".to_string(),
    };
    refusal(
        StatusCode::MISDIRECTED_REQUEST,
        &format!(
            "This request names {given}, which is not this server: the web inbox answers to {}. \
             To reach it under another name, start the server with --allow-host NAME \
             (env AAA_ALLOW_HOSTS), or with --public-url set to the URL people use.",
            hosts.describe()
        ),
    )
}

/// With auth off there is nobody to sign in as, so a page asked for on
/// loopback without a session that stands gets one at once (no sign-in
/// step): the request is answered with it, and the response sets its
/// cookie. Auth on, other addresses, forms, live streams and assets pass
/// as they are.
async fn open_session(State(web): State<Web>, mut request: Request, next: Next) -> Response {
    let settings = &web.0.settings;
    let path = request.uri().path();
    let wanted = settings.auth.is_none()
        && request.method() == http::Method::GET
        && !path.starts_with("/assets/")
        && !path.starts_with("/live/")
        && crate::auth::remote_addr(request.extensions()).is_some_and(|p| p.ip().is_loopback());
    if !wanted {
        return next.run(request).await;
    }
    let now = settings.clock.now_ms();
    let held = session::cookie_value(request.headers())
        .and_then(|value| Session::verify(&settings.key, value, now));
    if let Some(held) = held {
        match web.0.sessions.stands(&held).await {
            Ok(true) => return next.run(request).await,
            Ok(false) => {}
            // The page's own check says so, with its refusal.
            Err(_) => return next.run(request).await,
        }
    }
    let session = match web.0.sessions.issue("", "", now).await {
        Ok(session) => session,
        Err(e) => {
            tracing::warn!("web: cannot start a session: {e}");
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "The server cannot start a session right now (its store is unavailable): \
                 try again in a moment.",
            );
        }
    };
    session::with_session_cookie(request.headers_mut(), session.value());
    let mut response = next.run(request).await;
    if let Ok(cookie) = session.set_cookie(settings.tls, now).parse() {
        response
            .headers_mut()
            .append(http::header::SET_COOKIE, cookie);
    }
    response
}

/// The signed-in person of a request.
pub struct Visitor {
    pub session: Session,
    /// Calls the API as this person.
    pub caller: Caller,
    /// With auth on, the principal; `None` with auth off.
    pub principal: Option<Principal>,
    /// With auth off, the name the person typed (unverified), if any.
    pub approver: Option<String>,
}

impl Visitor {
    pub fn csrf(&self, web: &Web) -> String {
        self.session.csrf(&web.0.settings.key)
    }

    /// Whether the person may see the approvals (ListApprovals and
    /// WatchApprovals need approver or reader); with auth off, anyone.
    pub fn sees_approvals(&self) -> bool {
        self.principal.as_ref().is_none_or(|p| {
            crate::auth::authorize("/aaa.v1.ApprovalService/WatchApprovals", p).is_ok()
        })
    }

    /// The refusal of a form whose CSRF token is not this session's;
    /// `None` when it is.
    pub fn refuse_without_csrf(&self, web: &Web, given: &str) -> Option<Response> {
        match self.session.csrf_matches(&web.0.settings.key, given) {
            true => None,
            false => Some(refusal(
                StatusCode::FORBIDDEN,
                "This form's CSRF token is missing or not this session's: reload the page and try again.",
            )),
        }
    }
}

impl FromRequestParts<Web> for Visitor {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &Web) -> Result<Visitor, Response> {
        let settings = &web.0.settings;
        let peer = crate::auth::remote_addr(&parts.extensions);
        if settings.auth.is_none() && !peer.is_some_and(|p| p.ip().is_loopback()) {
            return Err(refusal(
                StatusCode::FORBIDDEN,
                "With auth off the web inbox answers only on loopback: start the server with \
                 --auth-config to use it from another machine.",
            ));
        }
        let now = settings.clock.now_ms();
        let session = session::cookie_value(&parts.headers)
            .and_then(|value| Session::verify(&settings.key, value, now));
        let principal = match (&settings.auth, &session) {
            (Some(auth), Some(session)) => auth.principal_named(&session.principal),
            _ => None,
        };
        let signed_in = match &settings.auth {
            Some(_) => principal.is_some(),
            None => session.as_ref().is_some_and(|s| s.principal.is_empty()),
        };
        let session = match session.filter(|_| signed_in) {
            Some(session) => match web.0.sessions.stands(&session).await {
                Ok(true) => Some(session),
                Ok(false) => None,
                Err(e) => {
                    tracing::warn!("web: cannot check a session's sign-out: {e}");
                    return Err(refusal(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The server cannot check this session right now (its store is \
                         unavailable): try again in a moment.",
                    ));
                }
            },
            None => None,
        };
        let Some(session) = session else {
            if parts.method == http::Method::GET && !parts.uri.path().starts_with("/live/") {
                let next = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                return Err(
                    Redirect::to(&format!("/signin{}", html::query(&[("next", next)])))
                        .into_response(),
                );
            }
            return Err(refusal(
                StatusCode::UNAUTHORIZED,
                "Not signed in (the session expired, was signed out, or its token changed): \
                 sign in again.",
            ));
        };
        // With auth off the actor is the browser's address, and the name
        // the person typed beside it, marked as nobody checked it.
        let approver = match settings.auth {
            None => session::approver_value(&parts.headers),
            Some(_) => None,
        };
        let name = match (&principal, &approver) {
            (Some(p), _) => p.name.clone(),
            (None, Some(typed)) => match peer {
                Some(peer) => format!("{typed} (unverified, {})", peer.ip()),
                None => format!("{typed} (unverified)"),
            },
            (None, None) => peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        };
        Ok(Visitor {
            caller: Caller::new(
                settings.channel.clone(),
                settings.key,
                settings.address.clone(),
                name,
            ),
            session,
            principal,
            approver,
        })
    }
}

/// A whole page: the shell (navigation, sign-out, the auth-off warning)
/// around `body`. `live` is the URL of the approvals stream that keeps the
/// count in the title current.
pub fn page(
    web: &Web,
    visitor: Option<&Visitor>,
    title: &str,
    live: &str,
    body: &Html,
) -> Response {
    // No stream that the person's roles would refuse (it would retry).
    let live = match visitor {
        Some(v) if !v.sees_approvals() => "",
        _ => live,
    };
    let mut h = Html::new();
    h.raw("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
        .raw("<title>")
        .text(title)
        .raw(" \u{2014} aaa</title><link rel=\"stylesheet\" href=\"/assets/app.css\">")
        .raw("<script src=\"/assets/app.js\" defer></script></head><body data-title=\"")
        .text(title)
        .raw(" \u{2014} aaa\" data-live=\"")
        .text(live)
        .raw("\"><header class=\"top\"><a class=\"brand\" href=\"/\">aaa</a>");
    if let Some(visitor) = visitor {
        h.raw("<nav><a href=\"/\">Inbox <span class=\"count\" id=\"count\"></span></a>")
            .raw("<a href=\"/runs\">Runs</a></nav>")
            .raw("<form class=\"signout\" method=\"post\" action=\"/signout\">")
            .raw("<input type=\"hidden\" name=\"csrf\" value=\"")
            .text(&visitor.csrf(web))
            .raw("\"><span class=\"who\" id=\"who\">")
            .text(visitor.caller.name())
            .raw("</span> <button type=\"submit\">Sign out</button></form>");
    }
    if let (Some(visitor), None) = (visitor, &web.0.settings.auth) {
        approver_form(&mut h, visitor);
    }
    h.raw("</header>");
    if web.0.settings.auth.is_none() {
        h.raw(
            "<p class=\"warning\" role=\"alert\">Auth is off: anyone who reaches this page may \
             decide every call. It answers on loopback only; run the server with --auth-config \
             to sign people in.</p>",
        );
    }
    h.raw("<main>").html(body).raw("</main></body></html>");
    axum::response::Html(h.into_string()).into_response()
}

/// With auth off: the name a person's decisions are recorded under, typed
/// once and kept (see `session::APPROVER_COOKIE`). It posts to /signin,
/// which keeps it and comes back to the page the script names in `next`
/// (without the script, to the inbox).
fn approver_form(h: &mut Html, visitor: &Visitor) {
    let typed = visitor.approver.as_deref().unwrap_or("");
    h.raw("<form class=\"approver\" method=\"post\" action=\"/signin\">")
        .raw("<input type=\"hidden\" name=\"next\" value=\"\" data-here>")
        .raw("<label for=\"approver\">Your name</label>")
        .raw("<input id=\"approver\" name=\"approver\" maxlength=\"64\" autocomplete=\"name\" value=\"")
        .text(typed)
        .raw("\"><button type=\"submit\" id=\"save-approver\">Save</button><span class=\"hint\">");
    match typed {
        "" => h.raw(
            "Decisions are recorded under your address only: type your name to be \
             recorded by it (unverified, as auth is off).",
        ),
        _ => h.raw("Recorded with your decisions, beside your address, marked unverified."),
    };
    h.raw("</span></form>");
}

/// A short page saying why a request was refused.
pub fn refusal(status: StatusCode, message: &str) -> Response {
    let mut h = Html::new();
    h.raw("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
        .raw(
            "<title>Refused \u{2014} aaa</title><link rel=\"stylesheet\" href=\"/assets/app.css\">",
        )
        .raw("</head><body><main><h1>Refused</h1><p class=\"error\" id=\"error\">")
        .text(message)
        .raw("</p><p><a href=\"/\">Back to the inbox</a></p></main></body></html>");
    (status, axum::response::Html(h.into_string())).into_response()
}

/// The page for a gRPC call the server refused: its status as HTTP, its
/// message as text.
pub fn status_page(status: &tonic::Status) -> Response {
    refusal(http_status(status.code()), status.message())
}

/// The HTTP status closest to a gRPC code.
pub fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => StatusCode::CONFLICT,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
