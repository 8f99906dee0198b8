//! The worker's HTTP listener: `GET /healthz` (alive) and `GET /readyz` (storage reachable,
//! migrations applied, scheduler running). The MCP endpoint will be mounted at `/mcp` here.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use lamplighter_jobs::Engine;

pub(crate) fn router(engine: Engine) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(readyz)).with_state(engine)
}

async fn readyz(State(engine): State<Engine>) -> (StatusCode, &'static str) {
    if engine.ready().await { (StatusCode::OK, "ready\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready\n") }
}
