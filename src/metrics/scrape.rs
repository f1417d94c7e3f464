//! `GET /metrics`: the registry in the OpenMetrics text format. With auth
//! on, the scraper authenticates as any other caller (a bearer token, or a
//! client certificate under mTLS) and needs the role `reader` (or admin):
//! give Prometheus a principal of its own.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tonic::codegen::http::{header, HeaderValue};

use super::Metrics;
use crate::auth::{AuthConfig, Throttle};

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct Scrape {
    metrics: Metrics,
    auth: Option<Arc<AuthConfig>>,
    throttle: Arc<Throttle>,
}

/// The `/metrics` route.
pub fn router(metrics: Metrics, auth: Option<Arc<AuthConfig>>, throttle: Arc<Throttle>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape {
            metrics,
            auth,
            throttle,
        })
}

async fn scrape(State(scrape): State<Scrape>, request: Request) -> Response {
    if let Some(auth) = &scrape.auth {
        let checked = crate::auth::credentials(
            auth,
            &scrape.throttle,
            request.headers(),
            request.extensions(),
        )
        .and_then(|principal| crate::auth::authorize_scrape(&principal));
        if let Err(refusal) = checked {
            return crate::http::refused(&refusal);
        }
    }
    let mut response = scrape.metrics.render().await.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}
