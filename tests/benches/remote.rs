//! Remote control benchmark (issue 32): `get_job` round trips over TLS in the worker against
//! plain HTTP, same run, same machine, on loopback, from one rmcp client each.
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench remote -- [--calls 2000]
//! ```
//!
//! Each client keeps one connection per call, as rmcp's and lampctl's do (no pooling), so every
//! TLS call pays a full handshake (ECDSA P-256, TLS 1.3): the worst case a remote `lampctl`
//! sees. Both workers have 100 jobs.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Instant;

use common::{SAVE, Worker, jobs_yaml, summary};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let calls: usize =
        args.iter().position(|a| a == "--calls").and_then(|i| args.get(i + 1)).map_or(2000, |v| v.parse().expect("--calls N"));
    println!("binary: {}", common::bin().display());
    let pki_dir = tempfile::tempdir().expect("tempdir");
    let pki = lamplighter_tests::pki::Pki::new(pki_dir.path(), "bench");
    let (cert, key) = pki.server("server");
    let jobs = jobs_yaml(100, "0 3 * * *", SAVE);

    let mut plain = Worker::new(&jobs, 4);
    plain.start();
    let tls_top = format!("    tls: {{cert_file: {}, key_file: {}}}\n", cert.display(), key.display());
    let mut tls = Worker::with(&tls_top, &jobs, 4);
    tls.start_tls();

    let ca = reqwest::Certificate::from_pem(&std::fs::read(pki.ca()).expect("ca")).expect("pem");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    println!("\n== get_job, {calls} calls each, one client, loopback ==");
    for (label, url, client) in [
        ("plain HTTP", plain.url(), reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client")),
        (
            "TLS in the worker",
            format!("https://localhost:{}/mcp", tls.port()),
            reqwest::Client::builder().pool_max_idle_per_host(0).tls_certs_only([ca.clone()]).build().expect("client"),
        ),
    ] {
        let lat: Vec<i64> = rt.block_on(async {
            let transport = StreamableHttpClientTransport::with_client(client, StreamableHttpClientTransportConfig::with_uri(url));
            let c = ().serve(transport).await.expect("connect");
            let params = || {
                CallToolRequestParams::new("get_job")
                    .with_arguments(serde_json::json!({"name": "job-00042"}).as_object().cloned().expect("obj"))
            };
            for _ in 0..50 {
                c.call_tool(params()).await.expect("warm-up");
            }
            let mut lat = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                let r = c.call_tool(params()).await.expect("call");
                lat.push(t.elapsed().as_micros() as i64);
                assert_ne!(r.is_error, Some(true), "{r:?}");
            }
            let _ = c.cancel().await;
            lat
        });
        summary(&format!("{label}: get_job round trip µs"), lat);
    }
}
