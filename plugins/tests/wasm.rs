//! Drives plugin discovery and the WASM host through `Registry::load`, `invoke` and
//! `invoke_hook`, with the WAT fixtures in `tests/fixtures/wasm/` — hostile ones included. After
//! every hostile call, a good plugin must still work.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lamplighter_plugins::{ActionContext, ActionError, HostError, HostFuture, HostPolicy, HostServices, Registry, WasmOptions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wasm")
}

/// Small limits, as a hostile plugin should meet them; fs and config granted to who asks.
fn options(data_dir: &Path) -> WasmOptions {
    WasmOptions {
        fuel: 100_000,
        memory_bytes: 16 * 1024 * 1024,
        wall_time: Duration::from_millis(500),
        allowed_capabilities: vec!["fs-read".into(), "fs-write".into(), "config-read".into()],
        data_dir: data_dir.to_path_buf(),
        plugin_config: BTreeMap::from([("files".to_owned(), json!({"greeting": "hello"}))]),
        host: HostPolicy::default(),
    }
}

/// The fixtures loaded with [`options`]; the data directory lives as long as the registry.
struct Loaded {
    registry: Registry,
    data: tempfile::TempDir,
}

fn load_with(change: impl FnOnce(&mut WasmOptions)) -> Loaded {
    let data = tempfile::tempdir().expect("tempdir");
    let mut opts = options(data.path());
    change(&mut opts);
    Loaded { registry: Registry::load(&[fixtures()], opts), data }
}

fn load() -> Loaded {
    load_with(|_| {})
}

fn ctx(dir: &Path) -> ActionContext {
    ActionContext {
        working_directory: dir.to_path_buf(),
        allowed_commands: Vec::new(),
        cancel: CancellationToken::new(),
        usage: Default::default(),
        output: None,
        host: None,
    }
}

fn load_error(registry: &Registry, plugin: &str) -> String {
    let info = registry.plugins().iter().find(|p| p.name == plugin).unwrap_or_else(|| panic!("plugin \"{plugin}\" not listed"));
    info.error.clone().unwrap_or_else(|| panic!("plugin \"{plugin}\" loaded, but should not have"))
}

/// The message of an `ActionError::Failed`, or a panic naming what came instead.
fn failure(result: Result<Value, ActionError>) -> String {
    match result {
        Err(ActionError::Failed { message, .. }) => message,
        other => panic!("expected ActionError::Failed, got {other:?}"),
    }
}

async fn echo_still_works(l: &Loaded) {
    let out = l.registry.invoke("echo", "echo", json!({"message": "still here"}), &ctx(l.data.path())).await;
    assert_eq!(out, Ok(json!({"action": "echo", "input": {"message": "still here"}})));
}

#[test]
fn discovery_lists_builtins_first_then_plugin_folders_with_their_kind() {
    let l = load();
    let plugins = l.registry.plugins();
    assert_eq!((plugins[0].name.as_str(), plugins[0].kind.as_str()), ("file-read", "builtin"));
    let echo = plugins.iter().find(|p| p.name == "echo").expect("echo listed");
    assert_eq!((echo.kind.as_str(), echo.version.as_str(), echo.error.as_deref()), ("wasm", "1.0.0", None));
    assert_eq!(echo.actions.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["echo", "anything"]);
    assert_eq!(echo.actions[0].parameters["properties"]["message"]["type"], "string");
    assert_eq!(echo.hooks, ["on-event"]);
    assert!(l.registry.has_action("echo", "echo"));
    assert!(l.registry.has_hook("echo", "on-event"));
    assert!(l.registry.action_names().contains(&"echo.echo".to_owned()));
    // Folders come in name order after the built-ins.
    let discovered: Vec<&str> = plugins.iter().filter(|p| p.kind != "builtin").map(|p| p.name.as_str()).collect();
    let mut sorted = discovered.clone();
    sorted.sort_unstable();
    assert_eq!(discovered, sorted);
}

#[test]
fn native_plugin_is_listed_as_unsupported() {
    let l = load();
    let native = l.registry.plugins().iter().find(|p| p.name == "native-plugin").expect("listed");
    assert_eq!(native.kind, "native");
    assert_eq!(
        native.error.as_deref(),
        Some(
            "plugin \"native-plugin\" is a .NET assembly (type: native), which Lamplighter cannot load; port it to WASM (see \
             plugins/examples)"
        )
    );
    assert_eq!(native.actions[0].name, "hello", "its actions are still listed");
    assert!(!l.registry.has_action("native-plugin", "hello"));
}

#[test]
fn malformed_manifest_names_the_file_line_and_column() {
    let l = load();
    let error = load_error(&l.registry, "malformed");
    let path = fixtures().join("malformed/manifest.json");
    assert!(error.starts_with(&format!("invalid plugin manifest {}:4:", path.display())), "{error}");
    assert!(error.contains("expected `,` or `}`"), "{error}");
}

#[test]
fn missing_export_and_wrong_signature_fail_at_load_naming_the_export() {
    let l = load();
    let error = load_error(&l.registry, "missing-export");
    assert!(error.starts_with("cannot load plugin \"missing-export\": "), "{error}");
    assert!(error.contains("it does not export \"get_output_len\" (func (result i32))"), "{error}");
    let error = load_error(&l.registry, "wrong-signature");
    assert!(error.contains("it exports \"execute\" as (type (func (param i32 i32) (result i32)))"), "{error}");
    assert!(error.contains("the ABI needs (func (param i32 i32 i32 i32) (result i32))"), "{error}");
}

#[test]
fn importing_a_capability_not_in_the_manifest_fails_at_load() {
    // Even when the operator allows fs-read, the manifest must ask for it.
    let l = load();
    let error = load_error(&l.registry, "no-capability");
    assert!(error.starts_with("plugin \"no-capability\" imports env.fs_read but capability \"fs-read\" was not granted"), "{error}");
}

#[test]
fn a_required_capability_the_operator_does_not_allow_fails_at_load() {
    let l = load_with(|o| o.allowed_capabilities = vec!["fs-read".into()]);
    let error = load_error(&l.registry, "files");
    assert!(error.starts_with("plugin \"files\" requires capability \"fs-write\", which the operator's configuration"), "{error}");
}

#[tokio::test]
async fn echo_round_trips_json_and_validates_parameters() {
    let l = load();
    let c = ctx(l.data.path());
    let out = l.registry.invoke("echo", "echo", json!({"message": "hi", "count": 2}), &c).await;
    assert_eq!(out, Ok(json!({"action": "echo", "input": {"message": "hi", "count": 2}})));
    let out = l.registry.invoke("echo", "echo", Value::Null, &c).await;
    assert_eq!(out, Ok(json!({"action": "echo", "input": {}})));
    // No schema: any object goes through.
    let out = l.registry.invoke("echo", "anything", json!({"x": [1, 2]}), &c).await;
    assert_eq!(out, Ok(json!({"action": "anything", "input": {"x": [1, 2]}})));

    let err = l.registry.invoke("echo", "echo", json!({"message": 3}), &c).await.expect_err("bad type");
    assert_eq!(err.to_string(), "echo.echo: parameter \"message\" must be a string, not an integer");
    let err = l.registry.invoke("echo", "shout", json!({}), &c).await.expect_err("unknown action");
    assert!(matches!(err, ActionError::UnknownAction { ref name, .. } if name == "echo.shout"), "{err}");
    let err = l.registry.invoke("missing-export", "run", json!({}), &c).await.expect_err("not loaded");
    assert!(matches!(err, ActionError::UnknownAction { .. }), "{err}");
}

#[tokio::test]
async fn endless_loop_runs_out_of_fuel_and_the_worker_carries_on() {
    let l = load();
    let c = ctx(l.data.path());
    let message = failure(l.registry.invoke("endless-loop", "run", json!({}), &c).await);
    assert_eq!(message, "plugin \"endless-loop\" ran out of fuel (limit 100000)");
    // The fuel it burnt is reported (for the fuel metric), all of it.
    assert_eq!(c.usage.fuel(), 100_000);
    l.registry.invoke("echo", "echo", json!({}), &c).await.expect("echo");
    let echo = c.usage.fuel() - 100_000;
    assert!(echo > 0 && echo < 10_000, "echo used {echo} fuel");
    echo_still_works(&l).await;
}

#[tokio::test]
async fn endless_loop_with_ample_fuel_times_out_on_wall_time() {
    let l = load_with(|o| {
        o.fuel = u64::MAX / 2;
        o.wall_time = Duration::from_millis(300);
    });
    let started = Instant::now();
    let err = l.registry.invoke("endless-loop", "run", json!({}), &ctx(l.data.path())).await.expect_err("timeout");
    assert!(matches!(err, ActionError::Timeout { ref action, seconds: 1 } if action == "endless-loop.run"), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    echo_still_works(&l).await;
}

#[tokio::test]
async fn cancelling_stops_a_running_call() {
    let l = load_with(|o| {
        o.fuel = u64::MAX / 2;
        o.wall_time = Duration::from_secs(60);
    });
    let c = ctx(l.data.path());
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let err = l.registry.invoke("endless-loop", "run", json!({}), &c).await.expect_err("cancelled");
    assert!(matches!(err, ActionError::Cancelled { ref action } if action == "endless-loop.run"), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    echo_still_works(&l).await;
}

#[tokio::test]
async fn a_tick_for_one_call_does_not_stop_another() {
    // Both calls share the engine's epoch: cancelling the short one ticks it while the long one
    // runs, and the long one must carry on until its own, later, deadline.
    let l = load_with(|o| {
        o.fuel = u64::MAX / 2;
        o.wall_time = Duration::from_millis(1500);
    });
    let long_ctx = ctx(l.data.path());
    let short_ctx = ctx(l.data.path());
    let short = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let cancel_soon = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            short_ctx.cancel.cancel();
        };
        let (result, ()) = tokio::join!(l.registry.invoke("endless-loop", "run", json!({}), &short_ctx), cancel_soon);
        result
    };
    let started = Instant::now();
    let (long, short) = tokio::join!(l.registry.invoke("endless-loop", "run", json!({}), &long_ctx), short);
    assert!(matches!(short, Err(ActionError::Cancelled { .. })), "{short:?}");
    assert!(matches!(long, Err(ActionError::Timeout { .. })), "{long:?}");
    assert!(started.elapsed() >= Duration::from_millis(1400), "the long call stopped early, after {:?}", started.elapsed());
}

#[tokio::test]
async fn memory_bomb_is_stopped_at_the_memory_limit() {
    let l = load();
    let message = failure(l.registry.invoke("memory-bomb", "run", json!({}), &ctx(l.data.path())).await);
    assert!(message.starts_with("plugin \"memory-bomb\" exceeded its memory limit of 16 MiB (16777216 bytes)"), "{message}");
    echo_still_works(&l).await;
}

#[tokio::test]
async fn bad_pointers_are_errors_not_crashes() {
    let l = load();
    let c = ctx(l.data.path());
    let message = failure(l.registry.invoke("bad-output", "run", json!({}), &c).await);
    assert_eq!(message, "plugin \"bad-output\" returned an out-of-bounds output: 64 bytes at 2147483632, but its memory is 65536 bytes");
    let message = failure(l.registry.invoke("bad-allocate", "run", json!({}), &c).await);
    assert_eq!(
        message,
        "plugin \"bad-allocate\" returned an out-of-bounds pointer from allocate(3): 3 bytes at 4294967288, but its memory is 65536 bytes"
    );
    let message = failure(l.registry.invoke("bad-log", "run", json!({}), &c).await);
    assert_eq!(
        message,
        "plugin \"bad-log\" passed an out-of-bounds pointer to env.log: 4096 bytes at 4294901760, but its memory is 65536 bytes"
    );
    echo_still_works(&l).await;
}

#[tokio::test]
async fn garbage_output_trap_and_error_codes_are_action_errors() {
    let l = load();
    let c = ctx(l.data.path());
    let message = failure(l.registry.invoke("garbage-output", "run", json!({}), &c).await);
    assert!(message.starts_with("plugin \"garbage-output\" returned invalid JSON: expected ident"), "{message}");
    let message = failure(l.registry.invoke("error-code", "run", json!({}), &c).await);
    assert_eq!(message, "plugin \"error-code\" returned error code 3: bad input: name is required");
    let err = l.registry.invoke("trap", "run", json!({}), &c).await.expect_err("trap");
    assert_eq!(err.to_string(), "trap.run failed: plugin \"trap\" trapped: wasm `unreachable` instruction executed");
    assert!(!err.is_permanent());
    echo_still_works(&l).await;
}

#[tokio::test]
async fn granted_host_functions_work_inside_the_sandbox() {
    let l = load();
    let c = ctx(l.data.path());
    let out = l.registry.invoke("files", "roundtrip", json!({}), &c).await;
    assert_eq!(out, Ok(json!({"saved": true})));
    let on_disk = fs::read_to_string(l.data.path().join("plugins/files/notes/hello.txt")).expect("file in the sandbox");
    assert_eq!(on_disk, "{\"saved\":true}");
    // ../../outside.txt would be <data>/outside.txt: refused with ERR_DENIED.
    assert_eq!(l.registry.invoke("files", "escape", json!({}), &c).await, Ok(json!("denied")));
    assert_eq!(l.registry.invoke("files", "config", json!({}), &c).await, Ok(json!("hello")));
    // http-request is optional and not allowed: the stub answers ERR_DENIED.
    assert_eq!(l.registry.invoke("files", "http", json!({}), &c).await, Ok(json!("denied")));
}

#[tokio::test]
async fn a_granted_http_request_with_no_allowed_host_is_refused() {
    let l = load_with(|o| o.allowed_capabilities.push("http-request".into()));
    assert_eq!(l.registry.invoke("files", "http", json!({}), &ctx(l.data.path())).await, Ok(json!("denied")));
}

/// A small HTTP server on 127.0.0.1: `/small` answers "ok", `/big` 5,000 bytes, `/away`
/// redirects to `localhost` (a host the tests do not allow), `/hang` never answers. Counts the
/// requests to each path.
struct Web {
    port: u16,
    hits: Arc<std::sync::Mutex<BTreeMap<String, usize>>>,
}

impl Web {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hits: Arc<std::sync::Mutex<BTreeMap<String, usize>>> = Arc::default();
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    *counted.lock().unwrap_or_else(|e| e.into_inner()).entry(path.clone()).or_default() += 1;
                    let reply = match path.as_str() {
                        "/small" => "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-test: yes\r\nconnection: close\r\n\r\nok".to_owned(),
                        "/big" => format!("HTTP/1.1 200 OK\r\ncontent-length: 5000\r\nconnection: close\r\n\r\n{}", "x".repeat(5000)),
                        "/away" => format!(
                            "HTTP/1.1 302 Found\r\nlocation: http://localhost:{port}/small\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        ),
                        "/hang" => {
                            // Holds the connection open and never answers.
                            std::future::pending::<()>().await;
                            return;
                        }
                        _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
                    };
                    let _ = socket.write_all(reply.as_bytes()).await;
                });
            }
        });
        Self { port, hits }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap_or_else(|e| e.into_inner()).get(path).copied().unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_reaches_only_allowed_hosts_within_its_limits() {
    let web = Web::start().await;
    let l = load_with(|o| {
        o.allowed_capabilities.extend(["http-request".into(), "ai".into(), "mcp".into()]);
        o.host.allowed_hosts = vec![format!("127.0.0.1:{}", web.port)];
        o.host.max_response_bytes = 1000;
    });
    let c = ctx(l.data.path());
    let http = |params: Value| l.registry.invoke("outbound", "http", params, &c);

    // Allowed: the answer (longer than the guest's first buffer) comes from one request.
    let out = http(json!({"url": web.url("/small"), "headers": {"accept": "text/plain"}})).await.expect("answered");
    assert_eq!((out["status"].as_u64(), out["body"].as_str(), out["truncated"].as_bool()), (Some(200), Some("ok"), Some(false)), "{out}");
    assert_eq!(out["headers"]["x-test"], "yes");
    assert_eq!(web.hits("/small"), 1, "the guest's retry with a bigger buffer did not send the request again");
    // Too large: cut at the limit, and said.
    let out = http(json!({"url": web.url("/big")})).await.expect("answered");
    assert_eq!((out["body"].as_str().map(str::len), out["truncated"].as_bool()), (Some(1000), Some(true)));
    // A redirect to a host not in the list is not followed: the plugin gets the redirect.
    let out = http(json!({"url": web.url("/away")})).await.expect("answered");
    assert_eq!(out["status"], 302);
    assert_eq!(web.hits("/small"), 1, "localhost is not in the list");
    // Refused before anything is sent: a host not in the list, a request that is not one.
    assert_eq!(http(json!({"url": format!("http://localhost:{}/small", web.port)})).await, Ok(json!({"code": -2})));
    assert_eq!(http(json!({"url": "https://example.com/"})).await, Ok(json!({"code": -2})));
    assert_eq!(http(json!({"url": "http://127.0.0.1:9/small"})).await, Ok(json!({"code": -2})), "another port of the listed IP");
    assert_eq!(http(json!({"url": "not a url"})).await, Ok(json!({"code": -5})));
    assert_eq!(http(json!({"url": web.url("/small"), "method": "BREW"})).await, Ok(json!({"code": -5})));
    assert_eq!(http(json!({"url": web.url("/small"), "body": "x".repeat(2 * 1024 * 1024)})).await, Ok(json!({"code": -3})));
    // Without the run's services (here: none given), models and MCP tools are unavailable.
    assert_eq!(l.registry.invoke("outbound", "ai", json!({"prompt": "hi"}), &c).await, Ok(json!({"code": -6})));
    assert_eq!(l.registry.invoke("outbound", "mcp", json!({"server": "s", "tool": "t"}), &c).await, Ok(json!({"code": -6})));
    // A request that outlives the call's wall time is stopped with it.
    let started = Instant::now();
    let err = http(json!({"url": web.url("/hang")})).await.expect_err("timed out");
    assert!(matches!(err, ActionError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "stopped at its wall time: {:?}", started.elapsed());
    echo_still_works(&l).await;

    // Not granted by the operator: the stub refuses, whatever the request.
    let denied = load_with(|o| o.host.allowed_hosts = vec![format!("127.0.0.1:{}", web.port)]);
    let out = denied.registry.invoke("outbound", "http", json!({"url": web.url("/small")}), &ctx(denied.data.path())).await;
    assert_eq!(out, Ok(json!({"code": -2})));
    assert_eq!(web.hits("/small"), 1);
}

/// Host services that answer from memory and remember what they were asked.
#[derive(Default)]
struct Fake {
    seen: std::sync::Mutex<Vec<Value>>,
    refuse: bool,
}

impl HostServices for Fake {
    fn observed<'a>(
        &'a self,
        plugin: &'a str,
        function: &'static str,
        target: String,
        call: HostFuture<'a, Result<Value, HostError>>,
    ) -> HostFuture<'a, Result<Value, HostError>> {
        Box::pin(async move {
            self.seen.lock().unwrap_or_else(|e| e.into_inner()).push(json!({"observed": [plugin, function, target]}));
            if self.refuse {
                return Err(HostError::Denied("cancelled by hook gate.veto: change freeze".into()));
            }
            call.await
        })
    }

    fn complete<'a>(&'a self, _plugin: &'a str, request: Value) -> HostFuture<'a, Result<Value, HostError>> {
        Box::pin(async move {
            self.seen.lock().unwrap_or_else(|e| e.into_inner()).push(request.clone());
            Ok(json!({"content": format!("echo: {}", request["prompt"].as_str().unwrap_or_default()), "input_tokens": 3}))
        })
    }

    fn mcp_call<'a>(
        &'a self,
        _plugin: &'a str,
        server: &'a str,
        tool: &'a str,
        arguments: Value,
    ) -> HostFuture<'a, Result<Value, HostError>> {
        Box::pin(async move {
            if tool == "broken" {
                return Err(HostError::Failed("the server closed the connection".into()));
            }
            Ok(json!({"text": format!("{server}.{tool} {arguments}"), "is_error": false}))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_complete_and_mcp_call_go_through_the_runs_services_within_the_operators_lists() {
    let l = load_with(|o| {
        o.allowed_capabilities.extend(["ai".into(), "mcp".into()]);
        o.host.ai_models = vec!["small".into()];
        o.host.ai_max_tokens = 100;
        o.host.mcp_tools = vec!["docs.*".into(), "github.search".into()];
    });
    let fake = Arc::new(Fake::default());
    let mut c = ctx(l.data.path());
    c.host = Some(fake.clone());
    let call = |action: &'static str, params: Value| l.registry.invoke("outbound", action, params, &c);

    assert_eq!(call("ai", json!({"prompt": "hi"})).await, Ok(json!({"content": "echo: hi", "input_tokens": 3})));
    assert_eq!(
        call("ai", json!({"model": "small", "prompt": "more", "max_tokens": 5000})).await.map(|v| v["content"].clone()),
        Ok(json!("echo: more"))
    );
    assert_eq!(call("ai", json!({"model": "large", "prompt": "no"})).await, Ok(json!({"code": -2})));
    assert_eq!(call("ai", json!({"model": 7, "prompt": "no"})).await, Ok(json!({"code": -5})));
    let seen = fake.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(seen[0], json!({"observed": ["outbound", "ai_complete", "default"]}), "every call is an operation of the run");
    assert_eq!((seen[1]["prompt"].as_str(), seen[1]["max_tokens"].as_u64()), (Some("hi"), Some(100)), "the operator's ceiling applies");
    assert_eq!(seen[3]["max_tokens"], 100, "a larger max_tokens is lowered");
    assert_eq!(seen.len(), 4, "refused requests reach no service: {seen:?}");

    let out = call("mcp", json!({"server": "docs", "tool": "read", "arguments": {"page": 2}})).await;
    assert_eq!(out, Ok(json!({"text": "docs.read {\"page\":2}", "is_error": false})));
    assert_eq!(call("mcp", json!({"server": "github", "tool": "search"})).await.map(|v| v["is_error"].clone()), Ok(json!(false)));
    assert_eq!(call("mcp", json!({"server": "github", "tool": "delete_repo"})).await, Ok(json!({"code": -2})));
    assert_eq!(call("mcp", json!({"tool": "read"})).await, Ok(json!({"code": -5})));
    // A failure the service met is an answer the plugin can read.
    assert_eq!(call("mcp", json!({"server": "docs", "tool": "broken"})).await, Ok(json!({"error": "the server closed the connection"})));

    // A hook that refuses the operation: not attempted.
    let refusing = Arc::new(Fake { refuse: true, ..Fake::default() });
    let mut c = ctx(l.data.path());
    c.host = Some(refusing.clone());
    assert_eq!(l.registry.invoke("outbound", "ai", json!({"prompt": "hi"}), &c).await, Ok(json!({"code": -2})));
    assert_eq!(refusing.seen.lock().unwrap_or_else(|e| e.into_inner()).len(), 1, "observed, not completed");
}

#[tokio::test]
async fn hooks_are_called_through_execute_as_hook_name() {
    let l = load();
    let out = l.registry.invoke_hook("echo", "on-event", json!({"event": "plugin:echo:action:before"})).await;
    assert_eq!(out, Ok(json!({"action": "hook:on-event", "input": {"event": "plugin:echo:action:before"}})));
    let err = l.registry.invoke_hook("echo", "on-other", json!({})).await.expect_err("unknown hook");
    assert_eq!(err.to_string(), "plugin \"echo\" has no hook \"on-other\"; known hooks: echo.on-event");
    assert!(err.is_permanent());
    let err = l.registry.invoke_hook("file-read", "on-event", json!({})).await.expect_err("built-ins have no hooks");
    assert!(matches!(err, ActionError::UnknownHook { .. }), "{err}");
}

/// A plugin folder in a temporary plugin directory: `manifest` with the echo module as entry.
fn write_plugin(dir: &Path, folder: &str, manifest: Value) {
    let path = dir.join(folder);
    fs::create_dir_all(&path).expect("mkdir");
    fs::write(path.join("manifest.json"), manifest.to_string()).expect("manifest");
    fs::copy(fixtures().join("echo/plugin.wat"), path.join("plugin.wat")).expect("copy module");
}

fn echo_manifest(name: &str, entry: &str) -> Value {
    json!({
        "name": name, "version": "0.1.0", "type": "wasm", "entry": entry,
        "exports": {"actions": [{"name": "echo", "parameters": {"type": "object"}}]}
    })
}

#[test]
fn name_clashes_and_entries_outside_the_folder_are_load_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_plugin(dir.path(), "a-first", echo_manifest("twin", "plugin.wat"));
    write_plugin(dir.path(), "b-second", echo_manifest("twin", "plugin.wat"));
    write_plugin(dir.path(), "c-builtin", echo_manifest("file-read", "plugin.wat"));
    write_plugin(dir.path(), "d-escape", echo_manifest("escape", "../a-first/plugin.wat"));
    write_plugin(dir.path(), "e-unknown", json!({"name": "odd", "type": "python", "entry": "x.py"}));
    write_plugin(dir.path(), "f-bad-name", echo_manifest("../evil", "plugin.wat"));
    let registry = Registry::load(&[dir.path().to_path_buf()], options(dir.path()));
    let by_folder = |name: &str| registry.plugins().iter().filter(|p| p.name == name).collect::<Vec<_>>();

    let twins = by_folder("twin");
    assert_eq!(twins.len(), 2);
    assert_eq!(twins[0].error, None);
    let error = twins[1].error.as_deref().expect("second twin refused");
    assert!(error.contains(&dir.path().join("b-second").display().to_string()), "{error}");
    assert!(error.contains(&dir.path().join("a-first").display().to_string()), "{error}");
    assert!(registry.has_action("twin", "echo"));

    let clash = by_folder("file-read");
    assert_eq!(clash.len(), 2, "the built-in and the impostor");
    assert_eq!(clash[0].kind, "builtin");
    assert!(clash[1].error.as_deref().is_some_and(|e| e.contains("has the name of a built-in plugin")), "{:?}", clash[1].error);

    let error = load_error(&registry, "escape");
    assert!(error.starts_with("cannot load plugin \"escape\": entry \"../a-first/plugin.wat\" must be a relative path inside"), "{error}");
    let error = load_error(&registry, "odd");
    assert!(error.contains("has unknown type \"python\""), "{error}");
    assert!(load_error(&registry, "../evil").starts_with("plugin name \"../evil\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_at_once_each_get_a_fresh_instance() {
    let data = tempfile::tempdir().expect("tempdir");
    let registry = Arc::new(Registry::load(&[fixtures()], options(data.path())));
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (registry, c) = (Arc::clone(&registry), ctx(data.path()));
        // Spawning also checks that the call's future is `Send`, as the worker needs.
        calls.spawn(async move { (i, registry.invoke("echo", "echo", json!({"count": i}), &c).await) });
    }
    while let Some(joined) = calls.join_next().await {
        let (i, result) = joined.expect("task");
        assert_eq!(result, Ok(json!({"action": "echo", "input": {"count": i}})));
    }
}

/// The toolchain running the tests can build for `wasm32-unknown-unknown`: a fresh rustup
/// toolchain cannot until the target is added, which this does once.
#[allow(clippy::disallowed_methods, reason = "asking rustc and rustup about the toolchain")]
fn ensure_wasm_target() {
    let sysroot = std::process::Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args(["--print", "sysroot"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if Path::new(&sysroot).join("lib/rustlib/wasm32-unknown-unknown").is_dir() {
        return;
    }
    let added = std::process::Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]).status();
    assert!(
        added.is_ok_and(|s| s.success()),
        "the wasm32-unknown-unknown target is not installed and `rustup target add wasm32-unknown-unknown` failed"
    );
}

/// The Rust example in `plugins/examples/hello-wasm`, built for `wasm32-unknown-unknown` with
/// the toolchain running this test (the target added where missing), loaded from a plugins
/// directory as an operator would install it, then called as an action and as a hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_example_plugin_builds_loads_and_answers() {
    ensure_wasm_target();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/hello-wasm");
    let build = tempfile::tempdir().expect("tempdir");
    #[allow(clippy::disallowed_methods, reason = "building the example is this test's job")]
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "--target", "wasm32-unknown-unknown", "--quiet", "--manifest-path"])
        .arg(example.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", build.path())
        .status()
        .expect("run cargo");
    assert!(status.success(), "the example does not build; is the target installed? `rustup target add wasm32-unknown-unknown`");

    let plugins = tempfile::tempdir().expect("tempdir");
    let folder = plugins.path().join("hello-wasm");
    fs::create_dir_all(&folder).expect("mkdir");
    fs::copy(example.join("manifest.json"), folder.join("manifest.json")).expect("manifest");
    fs::copy(build.path().join("wasm32-unknown-unknown/release/hello_wasm.wasm"), folder.join("hello_wasm.wasm")).expect("module");
    let data = tempfile::tempdir().expect("tempdir");
    let web = Web::start().await;
    let mut opts = options(data.path());
    opts.allowed_capabilities.push("http-request".into());
    opts.host.allowed_hosts = vec![format!("127.0.0.1:{}", web.port)];
    let registry = Registry::load(&[plugins.path().to_path_buf()], opts);
    let info = registry.plugins().iter().find(|p| p.name == "hello-wasm").expect("listed");
    assert_eq!((info.kind.as_str(), info.error.as_deref()), ("wasm", None));

    let out = registry.invoke("hello-wasm", "greet", json!({"name": "Ada"}), &ctx(data.path())).await.expect("greet");
    assert_eq!(out, json!({"greeting": "Hello, Ada!"}));
    let out = registry.invoke("hello-wasm", "greet", json!({}), &ctx(data.path())).await.expect("greet with the default");
    assert_eq!(out, json!({"greeting": "Hello, World!"}));
    let err = registry.invoke("hello-wasm", "greet", json!({"name": 7}), &ctx(data.path())).await.expect_err("checked by the schema");
    assert!(err.to_string().contains("parameter \"name\" must be a string"), "{err}");
    registry.invoke_hook("hello-wasm", "audit", json!({"event": "run.finished"})).await.expect("hook");

    // Its `fetch` goes through the host's http_request, to a host the operator allows only.
    let out = registry.invoke("hello-wasm", "fetch", json!({"url": web.url("/small")}), &ctx(data.path())).await.expect("fetch");
    assert_eq!((out["status"].as_u64(), out["body"].as_str()), (Some(200), Some("ok")), "{out}");
    let err = registry.invoke("hello-wasm", "fetch", json!({"url": "https://example.com/"}), &ctx(data.path())).await.expect_err("refused");
    assert!(err.to_string().contains("http_request refused the request (code -2)"), "{err}");
}

/// The seed's `plugins.dirs` points at its built-ins, shipped as .NET plugins under the
/// built-ins' names: those are served by Lamplighter's own built-ins, not reported as errors;
/// a WASM plugin that takes a built-in's name still is.
#[test]
fn the_seeds_dotnet_builds_of_builtins_are_served_by_the_builtins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |folder: &str, kind: &str| {
        fs::create_dir_all(dir.path().join(folder)).expect("mkdir");
        let manifest = json!({"name": folder, "version": "1.0.0", "type": kind, "entry": "x", "exports": {"actions": []}});
        fs::write(dir.path().join(folder).join("manifest.json"), manifest.to_string()).expect("manifest");
    };
    write("file-read", "native");
    write("shell-exec", "wasm");
    write("hello-world", "native");
    let data = tempfile::tempdir().expect("tempdir");
    let registry = Registry::load(&[dir.path().to_path_buf()], options(data.path()));
    let file_read: Vec<_> = registry.plugins().iter().filter(|p| p.name == "file-read").collect();
    assert_eq!(file_read.len(), 1, "listed once");
    assert_eq!((file_read[0].kind.as_str(), file_read[0].error.as_deref()), ("builtin", None));
    assert!(registry.has_action("file-read", "read"));
    let clash = registry.plugins().iter().find(|p| p.name == "shell-exec" && p.kind == "wasm").expect("the clash is listed");
    assert!(clash.error.as_deref().is_some_and(|e| e.contains("name of a built-in")), "{clash:?}");
    assert!(load_error(&registry, "hello-world").contains(".NET"));
}
