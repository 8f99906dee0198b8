//! The MCP client side: the servers agents use (`mcp.servers`), each started on first use —
//! a child process speaking stdio, or a streamable-HTTP endpoint — kept while it answers,
//! started again when it has died, and stopped at shutdown. A server that cannot start fails
//! the calls that need it, with its stderr tail; the worker and other servers go on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientCacheConfig, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use lamplighter_config::McpServer;

/// How long a server may take to start and answer `initialize`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of a stdio server's stderr kept for error messages, and how much of each.
const STDERR_LINES: usize = 20;
const STDERR_LINE_MAX: usize = 1000;
/// How long a server gets to stop at shutdown before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A tool a server offers.
#[derive(Debug, Clone)]
pub(crate) struct McpTool {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) input_schema: Value,
}

/// A tool call's result: the text the model gets, and whether the server called it an error.
#[derive(Debug, Clone)]
pub(crate) struct McpResult {
    pub(crate) text: String,
    pub(crate) is_error: bool,
}

type Client = RunningService<RoleClient, ClientConfig>;

struct Live {
    /// The definition it was started with: a reload that changes it starts it again.
    def: McpServer,
    client: Arc<Client>,
    tools: Vec<McpTool>,
    stderr: Stderr,
    /// A stdio server's process: killed, with what it started, when this is dropped.
    process: Option<lamplighter_plugins::ServerProcess>,
}

/// What a stdio server printed last, and whether its stderr reached its end (it exited).
#[derive(Clone)]
struct Stderr {
    lines: Arc<Mutex<VecDeque<String>>>,
    closed: tokio::sync::watch::Receiver<bool>,
}

impl Stderr {
    /// The tail, once the process's stderr ended (or after a second): what it printed as it
    /// died is in it.
    async fn tail_at_end(&self) -> String {
        let mut closed = self.closed.clone();
        let _ = tokio::time::timeout(Duration::from_secs(1), closed.wait_for(|c| *c)).await;
        tail_text(&self.lines)
    }
}

/// The running servers, by name. One start at a time per server (the async lock is held
/// across the start); calls share the running client.
#[derive(Default)]
pub(crate) struct McpPool {
    servers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Live>>>>>,
}

impl std::fmt::Debug for McpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.servers.lock().map(|s| s.keys().cloned().collect()).unwrap_or_default();
        f.debug_struct("McpPool").field("servers", &names).finish()
    }
}

impl McpPool {
    fn slot(&self, name: &str) -> Arc<tokio::sync::Mutex<Option<Live>>> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.entry(name.to_string()).or_default().clone()
    }

    /// The server's client and tools, starting it if it is not running (or died, or its
    /// definition changed).
    async fn live(&self, name: &str, def: &McpServer) -> Result<(Arc<Client>, Vec<McpTool>, Stderr), String> {
        let slot = self.slot(name);
        let mut guard = slot.lock().await;
        if let Some(live) = guard.as_ref()
            && live.def == *def
            && !live.client.is_transport_closed()
        {
            return Ok((live.client.clone(), live.tools.clone(), live.stderr.clone()));
        }
        if let Some(old) = guard.take() {
            let why = if old.def == *def { "it stopped answering" } else { "its definition changed" };
            tracing::warn!(server = name, "restarting MCP server: {why}");
            stop(old).await;
        }
        let live = start(name, def).await?;
        let out = (live.client.clone(), live.tools.clone(), live.stderr.clone());
        *guard = Some(live);
        Ok(out)
    }

    /// The tools `name` offers (starting it if needed).
    pub(crate) async fn tools(&self, name: &str, def: &McpServer) -> Result<Vec<McpTool>, String> {
        Ok(self.live(name, def).await?.1)
    }

    /// Calls `tool` on `name`. A server that died during the call is started again on the next
    /// use; this call fails with what it printed.
    pub(crate) async fn call(&self, name: &str, def: &McpServer, tool: &str, args: Value, timeout: Duration) -> Result<McpResult, String> {
        let (client, _, stderr) = self.live(name, def).await?;
        let arguments = match args {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            other => return Err(format!("arguments must be a JSON object, not {other}")),
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let result = match tokio::time::timeout(timeout, client.call_tool(params)).await {
            Err(_) => return Err(format!("MCP server \"{name}\" did not answer {tool} within {}", humantime::format_duration(timeout))),
            Ok(r) => r,
        };
        match result {
            Ok(r) => {
                let mut text: Vec<String> = r.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
                if text.is_empty()
                    && let Some(s) = &r.structured_content
                {
                    text.push(s.to_string());
                }
                Ok(McpResult { text: text.join("\n"), is_error: r.is_error == Some(true) })
            }
            Err(ServiceError::McpError(e)) => Err(format!("MCP server \"{name}\" refused {tool}: {}", e.message)),
            Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                Err(format!("MCP server \"{name}\" stopped during {tool} ({e}){}", stderr.tail_at_end().await))
            }
            Err(e) => Err(format!("MCP server \"{name}\" failed {tool}: {e}")),
        }
    }

    /// Stops every server (at shutdown).
    pub(crate) async fn shutdown(&self) {
        let slots: Vec<_> = self.servers.lock().unwrap_or_else(|e| e.into_inner()).drain().map(|(_, s)| s).collect();
        for slot in slots {
            if let Some(live) = slot.lock().await.take() {
                stop(live).await;
            }
        }
    }
}

fn tail_text(stderr: &Mutex<VecDeque<String>>) -> String {
    let lines = stderr.lock().unwrap_or_else(|e| e.into_inner());
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends with:\n{}", lines.iter().cloned().collect::<Vec<_>>().join("\n"))
    }
}

async fn stop(live: Live) {
    match Arc::try_unwrap(live.client) {
        Ok(mut client) => {
            let _ = client.close_with_timeout(STOP_TIMEOUT).await;
        }
        // A call still holds it: cancelling its token ends the service (and the call).
        Err(client) => client.cancellation_token().cancel(),
    }
    // The process, if any, with what it started.
    drop(live.process);
}

fn client_config() -> ClientConfig {
    ClientConfig::new(ClientCapabilities::default(), Implementation::new("lamplighter", env!("CARGO_PKG_VERSION")))
}

async fn start(name: &str, def: &McpServer) -> Result<Live, String> {
    let (closed_tx, closed) = tokio::sync::watch::channel(false);
    let stderr = Stderr { lines: Arc::new(Mutex::new(VecDeque::new())), closed };
    let mut process = None;
    let client = match def {
        McpServer::Stdio { command, args, env } => {
            let mut started = lamplighter_plugins::start_server(command, args, env)
                .map_err(|e| format!("MCP server \"{name}\" cannot start: {command}: {e}"))?;
            let (Some(stdout), Some(stdin)) = (started.stdout.take(), started.stdin.take()) else {
                return Err(format!("MCP server \"{name}\" cannot start: {command}: its stdin and stdout are not piped"));
            };
            process = Some(started);
            let transport = (stdout, stdin);
            match process.as_mut().and_then(|p| p.stderr.take()) {
                None => {
                    let _ = closed_tx.send(true);
                }
                Some(err) => {
                    let lines = stderr.lines.clone();
                    let server = name.to_string();
                    tokio::spawn(async move {
                        // Drained to its end whatever it holds (bytes that are not UTF-8, lines
                        // without end): a server whose stderr pipe closed would die writing to it.
                        let mut reader = BufReader::new(err);
                        let mut buf = Vec::new();
                        loop {
                            buf.clear();
                            match reader.read_until(b'\n', &mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(_) => {}
                            }
                            let line = String::from_utf8_lossy(&buf[..buf.len().min(STDERR_LINE_MAX)]).trim_end().to_string();
                            tracing::debug!(server = %server, "MCP server stderr: {line}");
                            let mut l = lines.lock().unwrap_or_else(|e| e.into_inner());
                            if l.len() == STDERR_LINES {
                                l.pop_front();
                            }
                            l.push_back(line);
                        }
                        let _ = closed_tx.send(true);
                    });
                }
            }
            connect(name, client_config().serve(transport), &stderr).await?
        }
        McpServer::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (k, v) in headers {
                let k = http::HeaderName::try_from(k.as_str()).map_err(|e| format!("MCP server \"{name}\": header {k}: {e}"))?;
                let v = http::HeaderValue::try_from(v.as_str()).map_err(|e| format!("MCP server \"{name}\": header {k}: {e}"))?;
                custom.insert(k, v);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).custom_headers(custom);
            let _ = closed_tx.send(true);
            connect(name, client_config().serve(StreamableHttpClientTransport::from_config(config)), &stderr).await?
        }
    };
    client.set_response_cache_config(ClientCacheConfig::disabled()).await;
    let tools = match tokio::time::timeout(START_TIMEOUT, client.list_all_tools()).await {
        Ok(Ok(tools)) => tools,
        Ok(Err(e)) => return Err(format!("MCP server \"{name}\" did not list its tools: {e}{}", stderr.tail_at_end().await)),
        Err(_) => return Err(format!("MCP server \"{name}\" did not list its tools within {}s", START_TIMEOUT.as_secs())),
    };
    let tools = tools
        .into_iter()
        .map(|t| McpTool {
            name: t.name.to_string(),
            description: t.description.map(|d| d.to_string()).unwrap_or_default(),
            input_schema: Value::Object((*t.input_schema).clone()),
        })
        .collect();
    tracing::info!(server = name, "MCP server started");
    Ok(Live { def: def.clone(), client: Arc::new(client), tools, stderr, process })
}

async fn connect<E: std::fmt::Display>(
    name: &str,
    serve: impl Future<Output = Result<Client, E>>,
    stderr: &Stderr,
) -> Result<Client, String> {
    match tokio::time::timeout(START_TIMEOUT, serve).await {
        Ok(Ok(c)) => Ok(c),
        // The process died (or closed stdout): what it printed, up to its end.
        Ok(Err(e)) => Err(format!("MCP server \"{name}\" did not start: {e}{}", stderr.tail_at_end().await)),
        Err(_) => {
            Err(format!("MCP server \"{name}\" did not answer initialize within {}s{}", START_TIMEOUT.as_secs(), tail_text(&stderr.lines)))
        }
    }
}
