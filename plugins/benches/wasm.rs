//! Benchmark (not a test): one WASM action call with a cached module — a fresh store and
//! instance, then `execute` on a small JSON round trip, through `Registry::invoke` as the worker
//! calls it — against a built-in action (`file-read.read` of a small file). Prints p50 and p99.
//!
//! Run: `cargo bench -p lamplighter-plugins --bench wasm` (optionally `-- 5000` for N).

use std::path::Path;
use std::time::{Duration, Instant};

use lamplighter_plugins::{ActionContext, ActionError, Registry, WasmOptions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const DEFAULT_N: usize = 2000;
const WARM_UP: usize = 100;

fn main() {
    let n = std::env::args().skip(1).find_map(|a| a.parse::<usize>().ok()).unwrap_or(DEFAULT_N);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    runtime.block_on(run(n));
}

async fn run(n: usize) {
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::write(data.path().join("small.txt"), "one\ntwo\nthree\n").expect("write small.txt");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wasm");
    let opts = WasmOptions { data_dir: data.path().to_path_buf(), ..WasmOptions::default() };

    let started = Instant::now();
    let registry = Registry::load(&[fixtures], opts);
    let load = started.elapsed();
    let wasm_count = registry.plugins().iter().filter(|p| p.kind == "wasm" && p.error.is_none()).count();
    assert!(
        registry.has_action("echo", "echo"),
        "the echo fixture did not load: {:?}",
        registry.plugins().iter().find(|p| p.name == "echo")
    );

    let ctx = ActionContext {
        working_directory: data.path().to_path_buf(),
        allowed_commands: Vec::new(),
        cancel: CancellationToken::new(),
        usage: Default::default(),
        output: None,
        host: None,
    };
    let wasm = measure(n, || registry.invoke("echo", "echo", json!({"message": "hello", "count": 3}), &ctx)).await;
    let builtin = measure(n, || registry.invoke("file-read", "read", json!({"path": "small.txt"}), &ctx)).await;

    println!("lamplighter-plugins WASM benchmark: N = {n} calls each, after {WARM_UP} warm-up calls");
    println!("load + compile of {wasm_count} WASM fixture plugins: {}", format_duration(load));
    println!("{:<44} {:>10} {:>10}", "call", "p50", "p99");
    report("wasm echo.echo (instantiate + execute)", &wasm);
    report("built-in file-read.read (3-line file)", &builtin);
}

/// Times `n` calls one after another (after a warm-up); each must succeed.
async fn measure<F, Fut>(n: usize, mut call: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Value, ActionError>>,
{
    for _ in 0..WARM_UP {
        call().await.expect("warm-up call");
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let result = call().await;
        times.push(started.elapsed());
        result.expect("call");
    }
    times.sort_unstable();
    times
}

fn report(name: &str, sorted: &[Duration]) {
    let at = |percent: usize| sorted[(sorted.len() * percent / 100).min(sorted.len() - 1)];
    println!("{name:<44} {:>10} {:>10}", format_duration(at(50)), format_duration(at(99)));
}

fn format_duration(d: Duration) -> String {
    if d < Duration::from_millis(1) { format!("{:.1} µs", d.as_secs_f64() * 1e6) } else { format!("{:.2} ms", d.as_secs_f64() * 1e3) }
}
