//! The worker's HTTP listener: `GET /healthz` (alive), `GET /readyz` (storage reachable,
//! migrations applied, scheduler running), `GET /metrics` (Prometheus text; behind the bearer
//! token when auth is on), and the MCP endpoint at `/mcp` (streamable HTTP), which alone sits
//! behind all the guards of `security.rs`.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse as _;
use axum::routing::get;
use futures::StreamExt as _;
use lamplighter_config::WorkerConfig;
use lamplighter_jobs::Engine;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tower_http::limit::RequestBodyLimitLayer;

use crate::direct;
use crate::mcp::Control;
use crate::security::{self, Guard};
use crate::telemetry::PullReader;

/// The whole HTTP surface; `/mcp` is mounted when `mcp` is given.
pub(crate) fn router(engine: Engine, mcp: Option<(Control, &WorkerConfig)>, metrics: Arc<PullReader>) -> Router {
    let app = Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(readyz)).with_state(engine);
    match mcp {
        Some((control, worker)) => {
            let guard = Arc::new(Guard::from_env(worker));
            let app = match guard.oauth() {
                Some(oauth) => app.merge(resource_metadata(oauth)),
                None => app,
            };
            app.merge(metrics_route(metrics, guard.clone())).merge(mcp_routes(control, guard))
        }
        None => app,
    }
}

/// With OAuth, the protected-resource metadata (RFC 9728), unguarded as clients fetch it before
/// they hold a token: at the root well-known path and at its path form for the audience's path
/// (`/.well-known/oauth-protected-resource/mcp`), which is what the 401's `resource_metadata`
/// names. Any origin may read it (a browser-based client discovers the server this way).
fn resource_metadata(oauth: &crate::oauth::OAuth) -> Router {
    let body: Arc<str> = oauth.metadata().into();
    let serve = move || {
        let body = body.clone();
        async move {
            (
                [
                    (axum::http::header::CONTENT_TYPE, "application/json"),
                    (axum::http::header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
                    (axum::http::header::CACHE_CONTROL, "max-age=3600"),
                ],
                body.to_string(),
            )
        }
    };
    let url = oauth.metadata_url();
    let root = "/.well-known/oauth-protected-resource";
    let path_form = url.find(root).map(|i| url[i..].to_string()).filter(|p| p != root);
    let mut router = Router::new().route(root, get(serve.clone()));
    if let Some(p) = path_form {
        router = router.route(&p, get(serve));
    }
    router
}

/// How long `/metrics` waits for its reader to take the next piece of the page before it gives
/// up on it (a scraper that stopped reading must not hold a thread and the table for ever).
const PIECE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `/metrics`: every metric in the Prometheus text format. Metrics name jobs, so with auth on
/// a scraper sends the same bearer token (no Host or Origin checks: scrapers reach workers by
/// many names). The page is sent as it is made (a million jobs' gauges are over 100 MB of
/// it): a collection that fails is a 500; a failure after the first piece cuts the response
/// short, so the scraper counts the scrape as failed rather than taking half a page.
fn metrics_route(metrics: Arc<PullReader>, guard: Arc<Guard>) -> Router {
    let serve = move || {
        let metrics = metrics.clone();
        async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<String, String>>(2);
            let rt = tokio::runtime::Handle::current();
            // Collecting walks every series: off the async threads.
            tokio::task::spawn_blocking(move || {
                let send = |piece| rt.block_on(tx.send_timeout(piece, PIECE_WAIT)).is_ok();
                let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| metrics.prometheus(|p| send(Ok(p)))));
                match rendered {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => _ = send(Err(e)),
                    Err(_) => _ = send(Err("rendering the metrics failed".into())),
                }
            });
            match rx.recv().await {
                Some(Ok(first)) => {
                    let rest = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
                    let pieces = futures::stream::once(async { Ok(first) }).chain(rest).map(|p| p.map_err(std::io::Error::other));
                    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], Body::from_stream(pieces)).into_response()
                }
                Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot collect metrics: {e}\n")).into_response(),
                None => (StatusCode::INTERNAL_SERVER_ERROR, "cannot collect metrics\n").into_response(),
            }
        }
    };
    Router::new().route("/metrics", get(serve)).route_layer(axum::middleware::from_fn_with_state(guard, security::check_token))
}

/// 200 `ready` (and on PostgreSQL a `note: …` line for each other worker whose lease lapsed
/// in the last hour), or 503 with every reason, one a line (`not ready: …`).
async fn readyz(State(engine): State<Engine>) -> (StatusCode, String) {
    match engine.readiness().await {
        Ok(()) => {
            let notes: String = engine.notes().into_iter().map(|n| format!("note: {n}\n")).collect();
            (StatusCode::OK, format!("ready\n{notes}"))
        }
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.lines().map(|l| format!("not ready: {l}\n")).collect()),
    }
}

/// `/mcp`, guarded: Host/Origin checks and auth (outermost), then the body limit, then the
/// direct answer to reads (`direct.rs`), then rmcp.
/// `route_layer` keeps the guards off every other path, including the 404 fallback.
fn mcp_routes(control: Control, guard: Arc<Guard>) -> Router {
    // rmcp's own checks get the same lists: a second line, never a different policy.
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(guard.rmcp_allowed_hosts())
        .with_allowed_origins(guard.rmcp_allowed_origins())
        .enforce_origin_validation()
        .with_max_request_body_bytes(security::MAX_BODY_BYTES)
        // One `application/json` answer when the call sends nothing before its result; a call
        // that reports progress (e.g. `trigger_job` with `wait`) still gets an event stream.
        .with_json_response(true)
        // Ends sessions and their event streams when the worker stops, so the graceful HTTP
        // shutdown does not wait on clients that keep a stream open.
        .with_cancellation_token(control.stop_token().child_token());
    // The factory runs per session (older clients) or per request (2026-07-28): a clone of
    // `Control` is a few reference-count increments.
    let factory = control.clone();
    let service = StreamableHttpService::new(move || Ok(factory.for_session()), Arc::new(LocalSessionManager::default()), config);
    Router::new()
        .nest_service("/mcp", service)
        // Innermost: sees only what passed every guard, and hands on what it does not answer.
        .route_layer(axum::middleware::from_fn_with_state(direct::Direct::new(control), direct::answer))
        .route_layer(RequestBodyLimitLayer::new(security::MAX_BODY_BYTES))
        .route_layer(axum::middleware::from_fn_with_state(guard, security::check))
}
