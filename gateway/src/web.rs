//! The HTTP side: `/healthz` and `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::decide::Engine;

/// The HTTP routes.
pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(engine)
}

async fn healthz(State(engine): State<Arc<Engine>>) -> Response {
    let domains = engine.config().domain_names().len();
    (StatusCode::OK, format!("ok: {domains} domains\n")).into_response()
}

async fn metrics(State(engine): State<Arc<Engine>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        engine.metrics.encode(),
    )
        .into_response()
}
