//! The WASM plugin host: compiles a plugin once, then runs each call in a fresh wasmtime store
//! with fuel, memory and wall-time limits, speaking the seed's ABI (SPEC §9).
//!
//! The ABI: the module exports `memory`, `allocate(len) -> ptr`, `execute(action_ptr,
//! action_len, input_ptr, input_len) -> i32` (0 = success), `get_output_ptr() -> ptr` and
//! `get_output_len() -> len`. The host writes the action name and the input JSON into buffers
//! the guest allocates, calls `execute`, and reads the output JSON back. A hook is the same call
//! with the action name `hook:<name>`.
//!
//! Host functions live in module `env`: `log` always; the others only when the manifest lists
//! their capability *and* the operator allows it (see [`HOST_FUNCTIONS`]). Which functions a
//! module imports is checked when it is loaded, so a plugin that imports a capability it was
//! not granted never loads, and every call uses a pre-linked [`InstancePre`].
//!
//! Wall time uses epoch interruption without a ticker thread: the engine's epoch is only
//! incremented when a call's own wall time runs out or it is cancelled, so an idle worker has no
//! periodic wake-ups. The epoch is shared by every store of the engine, so each store checks its
//! own stop flag in its epoch-deadline callback and carries on when the tick was meant for
//! another call.
//!
//! Nothing a module does can panic or crash the worker: a trap, running out of fuel, a memory
//! limit, a bad pointer (to or from a host function) or garbage output becomes an
//! [`ActionError`].

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{ErrorKind, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use wasmtime::{
    Caller, Config, Engine, ExternType, FuncType, InstancePre, Linker, Memory, Module, ResourceLimiter, Store, Trap, TypedFunc,
    UpdateDeadline,
};

use crate::builtin::confine;
use crate::host::{HostError, HostFuture, HostPolicy, HostServices, HttpRequest};
use crate::wasm_output::bytes;
use crate::{ActionError, Usage};

/// Limits and grants for WASM plugins, from the operator's configuration.
#[derive(Debug, Clone)]
pub struct WasmOptions {
    /// Fuel per call (about one unit per WebAssembly instruction).
    pub fuel: u64,
    /// Most bytes a plugin's linear memory may grow to, per call.
    pub memory_bytes: usize,
    /// Wall-time limit per call, enforced with epoch interruption.
    pub wall_time: Duration,
    /// Capabilities the operator allows WASM plugins to be given: `config-read`, `fs-read`,
    /// `fs-write`, `http-request`, `ai`, `mcp`. A plugin gets a capability only when its
    /// manifest lists it too.
    pub allowed_capabilities: Vec<String>,
    /// `fs_read`/`fs_write` work inside `<data_dir>/plugins/<plugin name>`.
    pub data_dir: PathBuf,
    /// What `config_get` answers, per plugin name: a JSON object of key → value.
    pub plugin_config: BTreeMap<String, Value>,
    /// What `http_request`, `ai_complete` and `mcp_call` may reach.
    pub host: HostPolicy,
}

impl Default for WasmOptions {
    fn default() -> Self {
        Self {
            fuel: 1_000_000,
            memory_bytes: 16 * 1024 * 1024,
            wall_time: Duration::from_secs(5),
            allowed_capabilities: Vec::new(),
            data_dir: PathBuf::from("data"),
            plugin_config: BTreeMap::new(),
            host: HostPolicy::default(),
        }
    }
}

/// Longest log line kept; the rest is cut.
const MAX_LOG_BYTES: usize = 8 * 1024;
/// Log lines per call; further ones are dropped so a plugin cannot flood the log.
const MAX_LOG_LINES: u32 = 1000;
/// Largest file `fs_read`/`fs_write` move in one host call.
const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;
/// Most bytes, and files, `fs_write` may write in one plugin call, so a loop cannot fill the
/// disk.
const MAX_WRITTEN_PER_CALL: usize = 64 * 1024 * 1024;
const MAX_WRITES_PER_CALL: u32 = 1000;
/// Longest path, config key or request a host function accepts.
const MAX_NAME_BYTES: usize = 4096;
/// Largest request `http_request`, `ai_complete` or `mcp_call` takes (a body, a prompt).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Most elements a table may grow to.
const MAX_TABLE_ELEMENTS: usize = 100_000;

// Codes host functions return to the guest (a non-negative result is a length). Documented in
// plugins/examples/README.md.
const ERR_NOT_FOUND: i32 = -1;
const ERR_DENIED: i32 = -2;
const ERR_TOO_LARGE: i32 = -3;
const ERR_IO: i32 = -4;
const ERR_INVALID: i32 = -5;
const ERR_UNAVAILABLE: i32 = -6;

/// A capability a manifest can ask for. The names are the seed manifests' where they have one
/// (`fs-read`, `fs-write`, `http-request`, `config-read`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capability {
    ConfigRead,
    FsRead,
    FsWrite,
    HttpRequest,
    Ai,
    Mcp,
}

impl Capability {
    const ALL: [Capability; 6] =
        [Capability::ConfigRead, Capability::FsRead, Capability::FsWrite, Capability::HttpRequest, Capability::Ai, Capability::Mcp];

    fn name(self) -> &'static str {
        match self {
            Capability::ConfigRead => "config-read",
            Capability::FsRead => "fs-read",
            Capability::FsWrite => "fs-write",
            Capability::HttpRequest => "http-request",
            Capability::Ai => "ai",
            Capability::Mcp => "mcp",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// One function the host offers in module `env`: all parameters and the result are `i32`.
struct HostFunction {
    name: &'static str,
    /// `None`: always available.
    capability: Option<Capability>,
    params: usize,
    returns: bool,
}

static HOST_FUNCTIONS: [HostFunction; 7] = [
    HostFunction { name: "log", capability: None, params: 2, returns: false },
    HostFunction { name: "config_get", capability: Some(Capability::ConfigRead), params: 4, returns: true },
    HostFunction { name: "fs_read", capability: Some(Capability::FsRead), params: 4, returns: true },
    HostFunction { name: "fs_write", capability: Some(Capability::FsWrite), params: 4, returns: true },
    HostFunction { name: "http_request", capability: Some(Capability::HttpRequest), params: 4, returns: true },
    HostFunction { name: "ai_complete", capability: Some(Capability::Ai), params: 4, returns: true },
    HostFunction { name: "mcp_call", capability: Some(Capability::Mcp), params: 4, returns: true },
];

/// The exports the ABI needs besides `memory`: name, number of `i32` parameters, returns `i32`.
const ABI_EXPORTS: [(&str, usize, bool); 4] =
    [("allocate", 1, true), ("execute", 4, true), ("get_output_ptr", 0, true), ("get_output_len", 0, true)];

/// What the plugin gets for a capability it can import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grant {
    /// Listed in the manifest and allowed by the operator: the real function.
    Granted,
    /// Listed as optional, not allowed by the operator: a stub that returns `ERR_DENIED`, so
    /// the plugin can run without it.
    Denied,
    /// Not listed in the manifest: importing it is a load error.
    NotListed,
}

/// The one engine all WASM plugins of a registry share: fuel and epoch interruption on.
pub(crate) fn new_engine() -> Result<Engine, String> {
    let mut config = Config::new();
    config.consume_fuel(true);
    config.epoch_interruption(true);
    // The default, written down: guest stack per call. Blocking-pool threads have 2 MiB stacks,
    // which leaves room for the host functions.
    config.max_wasm_stack(512 * 1024);
    Engine::new(&config).map_err(|e| format!("the WebAssembly engine cannot start: {e:#}"))
}

/// What a manifest says about a WASM plugin, as [`compile`] needs it.
pub(crate) struct Spec<'a> {
    pub(crate) name: &'a str,
    pub(crate) required: &'a [String],
    pub(crate) optional: &'a [String],
}

/// A compiled, linked WASM plugin, ready to be instantiated once per call.
pub(crate) struct WasmPlugin {
    name: Arc<str>,
    engine: Engine,
    pre: InstancePre<HostState>,
    fuel: u64,
    memory_bytes: usize,
    wall_time: Duration,
    sandbox: Arc<PathBuf>,
    config: Option<Arc<Map<String, Value>>>,
    policy: Arc<HostPolicy>,
    /// `http_request`'s client, when the plugin was granted it.
    http: Option<reqwest::Client>,
}

impl fmt::Debug for WasmPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WasmPlugin")
            .field("name", &self.name)
            .field("fuel", &self.fuel)
            .field("memory_bytes", &self.memory_bytes)
            .field("wall_time", &self.wall_time)
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

/// Compiles `bytes` (a `.wasm` binary, or WAT text) and checks, before any call, that the module
/// has the ABI's exports and imports only host functions it was granted. Errors are whole
/// messages naming the plugin.
pub(crate) fn compile(engine: &Engine, spec: Spec<'_>, bytes: &[u8], opts: &WasmOptions) -> Result<WasmPlugin, String> {
    let name = spec.name;
    let cannot = |reason: String| format!("cannot load plugin \"{name}\": {reason}");
    let allowed = |c: Capability| opts.allowed_capabilities.iter().any(|a| a == c.name());

    // Capabilities the manifest requires must exist and be allowed, or the plugin cannot work.
    for required in spec.required {
        match Capability::parse(required) {
            None => {
                return Err(cannot(format!(
                    "it requires capability \"{required}\", which WASM plugins cannot be given (they can have: {})",
                    Capability::ALL.map(Capability::name).join(", ")
                )));
            }
            Some(c) if !allowed(c) => {
                return Err(format!(
                    "plugin \"{name}\" requires capability \"{required}\", which the operator's configuration does not allow; add it to \
                     the allowed capabilities of WASM plugins to load this plugin"
                ));
            }
            Some(_) => {}
        }
    }
    for optional in spec.optional {
        if Capability::parse(optional).is_none() {
            tracing::warn!(plugin = name, capability = %optional, "unknown optional capability ignored");
        }
    }
    let grant = |c: Capability| {
        let listed = spec.required.iter().chain(spec.optional).any(|s| s == c.name());
        match (listed, allowed(c)) {
            (true, true) => Grant::Granted,
            (true, false) => Grant::Denied,
            (false, _) => Grant::NotListed,
        }
    };

    let module = Module::new(engine, bytes).map_err(|e| cannot(format!("{e:#}")))?;
    check_exports(&module).map_err(cannot)?;
    check_imports(name, &module, &grant)?;

    let mut linker: Linker<HostState> = Linker::new(engine);
    define_host_functions(&mut linker, &grant).map_err(|e| cannot(format!("cannot define host functions: {e:#}")))?;
    let pre = linker.instantiate_pre(&module).map_err(|e| cannot(format!("{e:#}")))?;

    let config = match opts.plugin_config.get(name) {
        None => None,
        Some(Value::Object(map)) => Some(Arc::new(map.clone())),
        Some(_) => return Err(cannot("its configuration (for config_get) must be an object of key → value".to_owned())),
    };
    let http = match grant(Capability::HttpRequest) {
        Grant::Granted => Some(opts.host.client().map_err(|e| cannot(format!("cannot build its HTTP client: {e}")))?),
        Grant::Denied | Grant::NotListed => None,
    };
    Ok(WasmPlugin {
        name: Arc::from(name),
        engine: engine.clone(),
        pre,
        fuel: opts.fuel,
        memory_bytes: opts.memory_bytes,
        wall_time: opts.wall_time,
        sandbox: Arc::new(opts.data_dir.join("plugins").join(name)),
        config,
        policy: Arc::new(opts.host.clone()),
        http,
    })
}

/// `(func (param i32 i32) (result i32))`, as wasmtime prints function types.
fn abi_type(params: usize, returns: bool) -> String {
    let mut text = "(func".to_owned();
    if params > 0 {
        text.push_str(" (param");
        for _ in 0..params {
            text.push_str(" i32");
        }
        text.push(')');
    }
    if returns {
        text.push_str(" (result i32)");
    }
    text.push(')');
    text
}

fn has_type(ty: &FuncType, params: usize, returns: bool) -> bool {
    ty.params().len() == params
        && ty.params().all(|p| p.is_i32())
        && ty.results().len() == usize::from(returns)
        && ty.results().all(|r| r.is_i32())
}

fn kind_of(ty: &ExternType) -> &'static str {
    match ty {
        ExternType::Func(_) => "a function",
        ExternType::Global(_) => "a global",
        ExternType::Table(_) => "a table",
        ExternType::Memory(_) => "a memory",
        ExternType::Tag(_) => "a tag",
    }
}

/// Every problem with the ABI exports at once, so an author fixes them in one go.
fn check_exports(module: &Module) -> Result<(), String> {
    let mut problems = Vec::new();
    match module.get_export("memory") {
        Some(ExternType::Memory(m)) if !m.is_64() && !m.is_shared() => {}
        Some(ExternType::Memory(_)) => {
            problems.push("its \"memory\" export is 64-bit or shared; the ABI needs a plain 32-bit memory".to_owned())
        }
        Some(other) => problems.push(format!("its \"memory\" export is {}, not a memory", kind_of(&other))),
        None => problems.push("it does not export \"memory\"".to_owned()),
    }
    for (export, params, returns) in ABI_EXPORTS {
        let wanted = abi_type(params, returns);
        match module.get_export(export) {
            Some(ExternType::Func(ty)) if has_type(&ty, params, returns) => {}
            Some(ExternType::Func(ty)) => problems.push(format!("it exports \"{export}\" as {ty}, but the ABI needs {wanted}")),
            Some(other) => problems.push(format!("its \"{export}\" export is {}, but the ABI needs a function {wanted}", kind_of(&other))),
            None => problems.push(format!("it does not export \"{export}\" {wanted}")),
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(format!("{} (see plugins/examples/README.md for the ABI)", problems.join("; "))) }
}

fn check_imports(name: &str, module: &Module, grant: &dyn Fn(Capability) -> Grant) -> Result<(), String> {
    let provided = || HOST_FUNCTIONS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ");
    for import in module.imports() {
        let (from, item) = (import.module(), import.name());
        let Some(host) = HOST_FUNCTIONS.iter().find(|f| from == "env" && f.name == item) else {
            return Err(format!(
                "cannot load plugin \"{name}\": it imports {from}.{item}, which Lamplighter does not provide; WASM plugins may import \
                 only these functions from module \"env\": {}",
                provided()
            ));
        };
        let ty = import.ty();
        let ExternType::Func(func) = &ty else {
            return Err(format!("cannot load plugin \"{name}\": it imports env.{item} as {}, but it is a function", kind_of(&ty)));
        };
        if !has_type(func, host.params, host.returns) {
            return Err(format!(
                "cannot load plugin \"{name}\": it imports env.{item} as {func}, but the host defines {}",
                abi_type(host.params, host.returns)
            ));
        }
        if let Some(capability) = host.capability
            && grant(capability) == Grant::NotListed
        {
            return Err(format!(
                "plugin \"{name}\" imports env.{item} but capability \"{}\" was not granted: its manifest does not list it under \
                 \"capabilities\"",
                capability.name()
            ));
        }
    }
    Ok(())
}

fn define_host_functions(linker: &mut Linker<HostState>, grant: &dyn Fn(Capability) -> Grant) -> wasmtime::Result<()> {
    linker.func_wrap("env", "log", host_log)?;
    for host in &HOST_FUNCTIONS {
        let Some(capability) = host.capability else { continue };
        match grant(capability) {
            Grant::NotListed => {}
            Grant::Denied => {
                linker.func_wrap("env", host.name, |_: i32, _: i32, _: i32, _: i32| -> i32 { ERR_DENIED })?;
            }
            Grant::Granted => {
                match capability {
                    Capability::ConfigRead => linker.func_wrap("env", host.name, host_config_get)?,
                    Capability::FsRead => linker.func_wrap("env", host.name, host_fs_read)?,
                    Capability::FsWrite => linker.func_wrap("env", host.name, host_fs_write)?,
                    Capability::HttpRequest => linker.func_wrap("env", host.name, host_http_request)?,
                    Capability::Ai => linker.func_wrap("env", host.name, host_ai_complete)?,
                    Capability::Mcp => linker.func_wrap("env", host.name, host_mcp_call)?,
                };
            }
        }
    }
    Ok(())
}

/// The stop flag a call's store checks when the engine's epoch ticks.
const RUNNING: u8 = 0;
const TIMED_OUT: u8 = 1;
const CANCELLED: u8 = 2;

/// Why the host stopped a call; carried through wasmtime's error so it can be told apart from
/// a trap of the guest's own making.
#[derive(Debug)]
enum Abort {
    TimedOut,
    Cancelled,
    MemoryLimit {
        limit: usize,
        wanted: usize,
    },
    /// A host function refused the guest's arguments (e.g. an out-of-bounds pointer).
    Guest(String),
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Abort::TimedOut => f.write_str("timed out"),
            Abort::Cancelled => f.write_str("was cancelled"),
            Abort::MemoryLimit { limit, wanted } => {
                write!(f, "exceeded its memory limit of {}: it asked for {wanted} bytes", bytes(*limit))
            }
            Abort::Guest(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Abort {}

/// Per-call store data.
struct HostState {
    plugin: Arc<str>,
    limiter: Limiter,
    sandbox: Arc<PathBuf>,
    config: Option<Arc<Map<String, Value>>>,
    log_lines: u32,
    /// Bytes and files `fs_write` wrote so far in this call.
    written: usize,
    writes: u32,
    /// The run's models and MCP servers (none in hooks).
    services: Option<Arc<dyn HostServices>>,
    policy: Arc<HostPolicy>,
    http: Option<reqwest::Client>,
    /// Cancelled when the call is stopped: an outgoing host call in flight stops with it.
    host_stop: CancellationToken,
    /// Why the call was stopped (the epoch flag).
    stop_flag: Arc<AtomicU8>,
    /// An outgoing call's answer that did not fit the guest's buffer (function, request,
    /// answer): asked again with a bigger one, it is given without a second request.
    unread: Option<(&'static str, Vec<u8>, Vec<u8>)>,
}

/// Caps memory (with an error naming the limit, rather than `memory.grow` quietly returning
/// -1), tables and the number of instances, memories and tables per store.
struct Limiter {
    memory_bytes: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            return Err(wasmtime::Error::new(Abort::MemoryLimit { limit: self.memory_bytes, wanted: desired }));
        }
        Ok(maximum.is_none_or(|max| desired <= max))
    }

    fn table_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS && maximum.is_none_or(|max| desired <= max))
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        4
    }

    fn memories(&self) -> usize {
        1
    }
}

/// Tells a call that was abandoned (its future dropped) to stop, so it does not run on to the
/// end of its fuel.
struct StopOnDrop {
    stop: Arc<AtomicU8>,
    host_stop: CancellationToken,
    engine: Engine,
    finished: bool,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if !self.finished && self.stop.compare_exchange(RUNNING, CANCELLED, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.host_stop.cancel();
            self.engine.increment_epoch();
        }
    }
}

impl WasmPlugin {
    pub(crate) async fn invoke_action(
        self: &Arc<Self>,
        action: &str,
        params: Value,
        cancel: &CancellationToken,
        usage: &Arc<Usage>,
        services: Option<Arc<dyn HostServices>>,
    ) -> Result<Value, ActionError> {
        self.call(format!("{}.{action}", self.name), action.to_owned(), params, cancel, usage.clone(), services).await
    }

    /// A hook: without the run's services (`ai_complete` and `mcp_call` answer unavailable;
    /// a model-call hook cannot call a model).
    pub(crate) async fn invoke_hook(self: &Arc<Self>, hook: &str, event: Value, usage: &Arc<Usage>) -> Result<Value, ActionError> {
        // Hooks have no cancellation of their own; the wall-time limit bounds them.
        let (label, name) = (format!("{}.hook:{hook}", self.name), format!("hook:{hook}"));
        self.call(label, name, event, &CancellationToken::new(), usage.clone(), None).await
    }

    /// Runs one call on the blocking pool, stopping it when its wall time runs out or `cancel`
    /// fires. `label` names the call in errors; `export_name` is what `execute` receives.
    async fn call(
        self: &Arc<Self>,
        label: String,
        export_name: String,
        input: Value,
        cancel: &CancellationToken,
        usage: Arc<Usage>,
        services: Option<Arc<dyn HostServices>>,
    ) -> Result<Value, ActionError> {
        if cancel.is_cancelled() {
            return Err(ActionError::Cancelled { action: label });
        }
        let input = serde_json::to_vec(&input)
            .map_err(|e| ActionError::Failed { action: label.clone(), message: format!("cannot encode the input as JSON: {e}") })?;
        let stop = Arc::new(AtomicU8::new(RUNNING));
        let host_stop = CancellationToken::new();
        let mut guard = StopOnDrop { stop: Arc::clone(&stop), host_stop: host_stop.clone(), engine: self.engine.clone(), finished: false };
        let plugin = Arc::clone(self);
        let (task_label, task_stop, task_host_stop) = (label.clone(), Arc::clone(&stop), host_stop.clone());
        let mut task = tokio::task::spawn_blocking(move || {
            plugin.run(&task_label, &export_name, &input, &task_stop, &usage, services, task_host_stop)
        });

        let wall = tokio::time::sleep(self.wall_time);
        tokio::pin!(wall);
        let reason = tokio::select! {
            joined = &mut task => {
                guard.finished = true;
                return self.joined(&label, joined);
            }
            () = &mut wall => TIMED_OUT,
            () = cancel.cancelled() => CANCELLED,
        };
        // Raise the flag, then tick: the call's store sees the tick at its next loop header or
        // function entry, reads the flag and traps. Tick again while it has not finished, in
        // case the tick came before its deadline was set or it was inside a host function.
        let _ = stop.compare_exchange(RUNNING, reason, Ordering::SeqCst, Ordering::SeqCst);
        host_stop.cancel();
        let joined = loop {
            self.engine.increment_epoch();
            if let Ok(joined) = tokio::time::timeout(Duration::from_millis(50), &mut task).await {
                break joined;
            }
        };
        guard.finished = true;
        self.joined(&label, joined)
    }

    fn joined(&self, label: &str, joined: Result<Result<Value, ActionError>, tokio::task::JoinError>) -> Result<Value, ActionError> {
        joined.unwrap_or_else(|e| {
            Err(ActionError::Failed { action: label.to_owned(), message: format!("plugin \"{}\" crashed the host: {e}", self.name) })
        })
    }

    /// One call, start to end, on a blocking thread: new store, instantiate, write the action
    /// name and input, `execute`, read the output.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        label: &str,
        export_name: &str,
        input: &[u8],
        stop: &Arc<AtomicU8>,
        usage: &Usage,
        services: Option<Arc<dyn HostServices>>,
        host_stop: CancellationToken,
    ) -> Result<Value, ActionError> {
        let failed = |message: String| ActionError::Failed { action: label.to_owned(), message };
        let trap = |e: wasmtime::Error| self.error(label, stop, &e);
        let state = HostState {
            plugin: Arc::clone(&self.name),
            limiter: Limiter { memory_bytes: self.memory_bytes },
            sandbox: Arc::clone(&self.sandbox),
            config: self.config.clone(),
            log_lines: 0,
            written: 0,
            writes: 0,
            services,
            policy: Arc::clone(&self.policy),
            http: self.http.clone(),
            host_stop,
            stop_flag: Arc::clone(stop),
            unread: None,
        };
        let mut store = Store::try_new(&self.engine, state).map_err(trap)?;
        store.limiter(|state| &mut state.limiter);
        store.set_fuel(self.fuel).map_err(trap)?;
        store.set_epoch_deadline(1);
        let flag = Arc::clone(stop);
        store.epoch_deadline_callback(move |_| match flag.load(Ordering::SeqCst) {
            // Another call's tick: keep going until the next one.
            RUNNING => Ok(UpdateDeadline::Continue(1)),
            TIMED_OUT => Err(wasmtime::Error::new(Abort::TimedOut)),
            _ => Err(wasmtime::Error::new(Abort::Cancelled)),
        });

        let instance = self.pre.instantiate(&mut store).map_err(trap)?;
        let memory = instance.get_memory(&mut store, "memory").ok_or_else(|| failed(format!("plugin \"{}\" has no memory", self.name)))?;
        let allocate = instance.get_typed_func::<i32, i32>(&mut store, "allocate").map_err(trap)?;
        let execute = instance.get_typed_func::<(i32, i32, i32, i32), i32>(&mut store, "execute").map_err(trap)?;
        let output_ptr = instance.get_typed_func::<(), i32>(&mut store, "get_output_ptr").map_err(trap)?;
        let output_len = instance.get_typed_func::<(), i32>(&mut store, "get_output_len").map_err(trap)?;

        let (action_ptr, action_len) = self.put(&mut store, memory, &allocate, export_name.as_bytes(), label, stop)?;
        let (input_ptr, input_len) = self.put(&mut store, memory, &allocate, input, label, stop)?;
        let code = execute.call(&mut store, (action_ptr, action_len, input_ptr, input_len));
        usage.add_fuel(self.fuel.saturating_sub(store.get_fuel().unwrap_or(0)));
        let code = code.map_err(trap)?;
        let ptr = output_ptr.call(&mut store, ()).map_err(trap)?;
        let len = output_len.call(&mut store, ()).map_err(trap)?;

        crate::wasm_output::read(&self.name, code, ptr, len, memory.data(&store)).map_err(failed)
    }

    /// Copies `bytes` into a buffer the guest allocates; returns the guest pointer and length.
    fn put(
        &self,
        store: &mut Store<HostState>,
        memory: Memory,
        allocate: &TypedFunc<i32, i32>,
        bytes: &[u8],
        label: &str,
        stop: &AtomicU8,
    ) -> Result<(i32, i32), ActionError> {
        let failed = |message: String| ActionError::Failed { action: label.to_owned(), message };
        let len = match i32::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= self.memory_bytes => len,
            _ => return Err(failed(format!("the input of {} bytes does not fit in the plugin's memory limit", bytes.len()))),
        };
        let ptr = allocate.call(&mut *store, len).map_err(|e| self.error(label, stop, &e))?;
        memory.write(&mut *store, ptr as u32 as usize, bytes).map_err(|_| {
            failed(format!(
                "plugin \"{}\" returned an out-of-bounds pointer from allocate({len}): {} bytes at {}, but its memory is {} bytes",
                self.name,
                len,
                ptr as u32,
                memory.data_size(&*store)
            ))
        })?;
        Ok((ptr, len))
    }

    /// Maps a wasmtime error (trap, host abort, instantiation failure) to an action error.
    fn error(&self, label: &str, stop: &AtomicU8, e: &wasmtime::Error) -> ActionError {
        let action = label.to_owned();
        let timeout = || ActionError::Timeout {
            action: label.to_owned(),
            seconds: self.wall_time.as_secs() + u64::from(self.wall_time.subsec_nanos() > 0),
        };
        if let Some(abort) = e.downcast_ref::<Abort>() {
            return match abort {
                Abort::TimedOut => timeout(),
                Abort::Cancelled => ActionError::Cancelled { action },
                Abort::MemoryLimit { .. } | Abort::Guest(_) => {
                    ActionError::Failed { action, message: format!("plugin \"{}\" {abort}", self.name) }
                }
            };
        }
        match stop.load(Ordering::SeqCst) {
            TIMED_OUT => return timeout(),
            CANCELLED => return ActionError::Cancelled { action },
            _ => {}
        }
        let message = match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => format!("plugin \"{}\" ran out of fuel (limit {})", self.name, self.fuel),
            Some(Trap::Interrupt) => return timeout(),
            Some(trap) => {
                let text = trap.to_string();
                format!("plugin \"{}\" trapped: {}", self.name, text.strip_prefix("wasm trap: ").unwrap_or(&text))
            }
            None => format!("plugin \"{}\" failed: {e:#}", self.name),
        };
        ActionError::Failed { action, message }
    }
}

// ---- host functions ----------------------------------------------------------------------
//
// Each checks the guest's pointers against its memory and traps (an error, never a panic) when
// they are out of bounds; a request the host refuses returns an `ERR_*` code instead.

fn guest_error(message: String) -> wasmtime::Error {
    wasmtime::Error::new(Abort::Guest(message))
}

fn guest_memory(caller: &mut Caller<'_, HostState>, func: &str) -> wasmtime::Result<Memory> {
    caller
        .get_export("memory")
        .and_then(wasmtime::Extern::into_memory)
        .ok_or_else(|| guest_error(format!("called env.{func} without exporting \"memory\"")))
}

/// The guest range `ptr..ptr+len`, or a trap naming the function.
fn guest_range(memory_len: usize, ptr: i32, len: i32, func: &str) -> wasmtime::Result<std::ops::Range<usize>> {
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    match start.checked_add(len) {
        Some(end) if end <= memory_len => Ok(start..end),
        _ => Err(guest_error(format!(
            "passed an out-of-bounds pointer to env.{func}: {len} bytes at {start}, but its memory is {memory_len} bytes"
        ))),
    }
}

/// Copies at most `max` bytes of the guest range (the whole range must be in bounds).
fn read_guest(caller: &Caller<'_, HostState>, memory: Memory, ptr: i32, len: i32, max: usize, func: &str) -> wasmtime::Result<Vec<u8>> {
    let data = memory.data(caller);
    let range = guest_range(data.len(), ptr, len, func)?;
    let end = range.end.min(range.start.saturating_add(max));
    Ok(data.get(range.start..end).unwrap_or_default().to_vec())
}

/// Writes `value` to the guest's buffer when it fits and returns its length; a buffer too small
/// gets nothing written and the same length back, so the guest can retry with a bigger one.
fn answer(
    caller: &mut Caller<'_, HostState>,
    memory: Memory,
    out_ptr: i32,
    out_cap: i32,
    value: &[u8],
    func: &str,
) -> wasmtime::Result<i32> {
    let Ok(len) = i32::try_from(value.len()) else {
        return Ok(ERR_TOO_LARGE);
    };
    let range = guest_range(memory.data_size(&*caller), out_ptr, out_cap, func)?;
    if value.len() > range.len() {
        return Ok(len);
    }
    memory.write(&mut *caller, range.start, value).map_err(|_| guest_error(format!("passed an out-of-bounds buffer to env.{func}")))?;
    Ok(len)
}

/// `log(ptr, len)`: one line of UTF-8 text to the worker's log, tagged with the plugin.
fn host_log(mut caller: Caller<'_, HostState>, ptr: i32, len: i32) -> wasmtime::Result<()> {
    let memory = guest_memory(&mut caller, "log")?;
    let bytes = read_guest(&caller, memory, ptr, len, MAX_LOG_BYTES, "log")?;
    let state = caller.data_mut();
    state.log_lines += 1;
    if state.log_lines > MAX_LOG_LINES {
        if state.log_lines == MAX_LOG_LINES + 1 {
            tracing::warn!(plugin = %state.plugin, "plugin logged more than {MAX_LOG_LINES} lines in one call; dropping the rest");
        }
        return Ok(());
    }
    let suffix = if (len as u32 as usize) > MAX_LOG_BYTES { " …(cut)" } else { "" };
    tracing::info!(plugin = %state.plugin, "{}{suffix}", String::from_utf8_lossy(&bytes));
    Ok(())
}

/// `config_get(key_ptr, key_len, out_ptr, out_cap) -> len | ERR_*`: the JSON text of one value
/// of the plugin's configuration.
fn host_config_get(mut caller: Caller<'_, HostState>, key_ptr: i32, key_len: i32, out_ptr: i32, out_cap: i32) -> wasmtime::Result<i32> {
    let memory = guest_memory(&mut caller, "config_get")?;
    if (key_len as u32 as usize) > MAX_NAME_BYTES {
        return Ok(ERR_INVALID);
    }
    let key = read_guest(&caller, memory, key_ptr, key_len, MAX_NAME_BYTES, "config_get")?;
    let Ok(key) = String::from_utf8(key) else {
        return Ok(ERR_INVALID);
    };
    let value = caller.data().config.as_ref().and_then(|config| config.get(&key)).map(serde_json::to_vec);
    match value {
        None => {
            // Still check the output buffer, so a bad pointer traps whatever the key.
            guest_range(memory.data_size(&caller), out_ptr, out_cap, "config_get")?;
            Ok(ERR_NOT_FOUND)
        }
        Some(Err(_)) => Ok(ERR_INVALID),
        Some(Ok(json)) => answer(&mut caller, memory, out_ptr, out_cap, &json, "config_get"),
    }
}

/// A path the guest passed, resolved inside the plugin's sandbox (created on first use), or the
/// code to return.
fn sandbox_path(caller: &Caller<'_, HostState>, memory: Memory, ptr: i32, len: i32, func: &str) -> wasmtime::Result<Result<PathBuf, i32>> {
    if (len as u32 as usize) > MAX_NAME_BYTES {
        guest_range(memory.data_size(caller), ptr, len, func)?;
        return Ok(Err(ERR_INVALID));
    }
    let raw = read_guest(caller, memory, ptr, len, MAX_NAME_BYTES, func)?;
    let Ok(path) = String::from_utf8(raw) else {
        return Ok(Err(ERR_INVALID));
    };
    let state = caller.data();
    if let Err(e) = confine::make_dir(state.sandbox.as_path()) {
        tracing::warn!(plugin = %state.plugin, sandbox = %state.sandbox.display(), error = %e, "cannot create the plugin's sandbox");
        return Ok(Err(ERR_IO));
    }
    match confine::resolve(&format!("{}: env.{func}", state.plugin), &state.sandbox, &path) {
        Ok(resolved) => Ok(Ok(resolved)),
        Err(e) => {
            tracing::warn!(plugin = %state.plugin, error = %e, "plugin file access refused");
            Ok(Err(ERR_DENIED))
        }
    }
}

/// `fs_read(path_ptr, path_len, out_ptr, out_cap) -> len | ERR_*`: a file of the sandbox.
fn host_fs_read(mut caller: Caller<'_, HostState>, path_ptr: i32, path_len: i32, out_ptr: i32, out_cap: i32) -> wasmtime::Result<i32> {
    let memory = guest_memory(&mut caller, "fs_read")?;
    guest_range(memory.data_size(&caller), out_ptr, out_cap, "fs_read")?;
    let path = match sandbox_path(&caller, memory, path_ptr, path_len, "fs_read")? {
        Ok(path) => path,
        Err(code) => return Ok(code),
    };
    let file = match fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(ERR_NOT_FOUND),
        Err(_) => return Ok(ERR_IO),
    };
    // Only regular files: a FIFO or device would block the call or never end.
    match file.metadata() {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Ok(ERR_INVALID),
        Err(_) => return Ok(ERR_IO),
    }
    let mut content = Vec::new();
    if file.take(MAX_FILE_BYTES as u64 + 1).read_to_end(&mut content).is_err() {
        return Ok(ERR_IO);
    }
    if content.len() > MAX_FILE_BYTES {
        return Ok(ERR_TOO_LARGE);
    }
    answer(&mut caller, memory, out_ptr, out_cap, &content, "fs_read")
}

/// `fs_write(path_ptr, path_len, data_ptr, data_len) -> 0 | ERR_*`: creates or replaces a file
/// of the sandbox, creating its parent folders.
fn host_fs_write(mut caller: Caller<'_, HostState>, path_ptr: i32, path_len: i32, data_ptr: i32, data_len: i32) -> wasmtime::Result<i32> {
    let memory = guest_memory(&mut caller, "fs_write")?;
    guest_range(memory.data_size(&caller), data_ptr, data_len, "fs_write")?;
    let len = data_len as u32 as usize;
    let state = caller.data();
    if len > MAX_FILE_BYTES || state.written.saturating_add(len) > MAX_WRITTEN_PER_CALL || state.writes >= MAX_WRITES_PER_CALL {
        return Ok(ERR_TOO_LARGE);
    }
    let path = match sandbox_path(&caller, memory, path_ptr, path_len, "fs_write")? {
        Ok(path) => path,
        Err(code) => return Ok(code),
    };
    let content = read_guest(&caller, memory, data_ptr, data_len, MAX_FILE_BYTES, "fs_write")?;
    if path.is_dir() {
        return Ok(ERR_INVALID);
    }
    if let Some(parent) = path.parent()
        && confine::make_dir(parent).is_err()
    {
        return Ok(ERR_IO);
    }
    let state = caller.data_mut();
    state.written += content.len();
    state.writes += 1;
    match fs::write(&path, &content) {
        Ok(()) => Ok(0),
        Err(_) => Ok(ERR_IO),
    }
}

/// A host call that leaves the sandbox (`http_request`, `ai_complete`, `mcp_call`): reads the
/// request (at most [`MAX_REQUEST_BYTES`] of JSON), has `start` check it and give the work (or
/// a code), blocks this call's thread on it until it ends or the call is stopped (its timeout,
/// its run cancelled), and writes the answer. An answer that did not fit the guest's buffer is
/// kept, so the guest's second call with a bigger one does not send the request again.
fn outgoing(
    caller: &mut Caller<'_, HostState>,
    (req_ptr, req_len, out_ptr, out_cap): (i32, i32, i32, i32),
    func: &'static str,
    start: impl FnOnce(&HostState, Value) -> Result<HostFuture<'static, Result<Value, HostError>>, HostError>,
) -> wasmtime::Result<i32> {
    let memory = guest_memory(caller, func)?;
    guest_range(memory.data_size(&*caller), out_ptr, out_cap, func)?;
    if (req_len as u32 as usize) > MAX_REQUEST_BYTES {
        guest_range(memory.data_size(&*caller), req_ptr, req_len, func)?;
        return Ok(ERR_TOO_LARGE);
    }
    let request = read_guest(caller, memory, req_ptr, req_len, MAX_REQUEST_BYTES, func)?;
    if let Some((f, r, a)) = caller.data_mut().unread.take()
        && f == func
        && r == request
    {
        return answer_kept(caller, memory, out_ptr, out_cap, func, request, a);
    }
    let plugin = Arc::clone(&caller.data().plugin);
    let refused = |e: HostError| match e {
        HostError::Denied(why) => {
            tracing::warn!(plugin = %plugin, "env.{func} refused: {why}");
            ERR_DENIED
        }
        HostError::Invalid(why) | HostError::Failed(why) => {
            tracing::warn!(plugin = %plugin, "env.{func}: a request it cannot make: {why}");
            ERR_INVALID
        }
        HostError::Unavailable(why) => {
            tracing::debug!(plugin = %plugin, "env.{func}: {why}");
            ERR_UNAVAILABLE
        }
    };
    let Ok(parsed) = serde_json::from_slice::<Value>(&request) else {
        return Ok(refused(HostError::Invalid("the request is not JSON".into())));
    };
    let work = match start(caller.data(), parsed) {
        Ok(work) => work,
        Err(e) => return Ok(refused(e)),
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(plugin = %plugin, "env.{func} was called outside the worker's runtime");
        return Ok(ERR_UNAVAILABLE);
    };
    let stop = caller.data().host_stop.clone();
    let outcome = handle.block_on(async move {
        tokio::select! {
            r = work => Some(r),
            () = stop.cancelled() => None,
        }
    });
    let value = match outcome {
        None => {
            let abort = if caller.data().stop_flag.load(Ordering::SeqCst) == TIMED_OUT { Abort::TimedOut } else { Abort::Cancelled };
            return Err(wasmtime::Error::new(abort));
        }
        Some(Ok(v)) => v,
        Some(Err(HostError::Failed(why))) => serde_json::json!({"error": why}),
        Some(Err(e)) => return Ok(refused(e)),
    };
    let bytes = serde_json::to_vec(&value).unwrap_or_default();
    answer_kept(caller, memory, out_ptr, out_cap, func, request, bytes)
}

/// [`answer`], keeping an answer that did not fit for the guest's retry.
fn answer_kept(
    caller: &mut Caller<'_, HostState>,
    memory: Memory,
    out_ptr: i32,
    out_cap: i32,
    func: &'static str,
    request: Vec<u8>,
    value: Vec<u8>,
) -> wasmtime::Result<i32> {
    let written = answer(caller, memory, out_ptr, out_cap, &value, func)?;
    if written >= 0 && written as u32 as usize > out_cap as u32 as usize {
        caller.data_mut().unread = Some((func, request, value));
    }
    Ok(written)
}

/// `http_request(req_ptr, req_len, out_ptr, out_cap) -> len | ERR_*`: `{"method"?, "url",
/// "headers"?, "body"?}` to an allowed host; `{"status", "headers", "body", "truncated"}`.
fn host_http_request(mut caller: Caller<'_, HostState>, a: i32, b: i32, c: i32, d: i32) -> wasmtime::Result<i32> {
    outgoing(&mut caller, (a, b, c, d), "http_request", |state, request| {
        let req = HttpRequest::parse(&request, &state.policy)?;
        let client = state.http.clone().ok_or_else(|| HostError::Denied("no HTTP client for this plugin".into()))?;
        let (max, target) = (state.policy.max_response_bytes, req.host());
        let send: HostFuture<'static, _> = Box::pin(async move { req.send(&client, max).await });
        Ok(match state.services.clone() {
            // A hook has no run: its requests are not operations of one.
            None => send,
            Some(services) => {
                let plugin = Arc::clone(&state.plugin);
                Box::pin(async move { services.observed(&plugin, "http_request", target, send).await })
            }
        })
    })
}

/// The run's services, or why there are none (a hook).
fn services_of(state: &HostState, func: &str) -> Result<Arc<dyn HostServices>, HostError> {
    state.services.clone().ok_or_else(|| HostError::Unavailable(format!("env.{func} is available to actions, not to hooks")))
}

/// `ai_complete(req_ptr, req_len, out_ptr, out_cap) -> len | ERR_*`: a completion through the
/// run's providers (`{"model"?, "system"?, "prompt" | "messages", "max_tokens"?, "temperature"?}`).
fn host_ai_complete(mut caller: Caller<'_, HostState>, a: i32, b: i32, c: i32, d: i32) -> wasmtime::Result<i32> {
    outgoing(&mut caller, (a, b, c, d), "ai_complete", |state, mut request| {
        let services = services_of(state, "ai_complete")?;
        let Value::Object(fields) = &mut request else { return Err(HostError::Invalid("the request must be a JSON object".into())) };
        let model = match fields.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(m)) => Some(m.clone()),
            Some(_) => return Err(HostError::Invalid("model must be a model alias".into())),
        };
        if !state.policy.model_allowed(model.as_deref()) {
            let m = model.unwrap_or_default();
            return Err(HostError::Denied(format!("model \"{m}\" is not in plugins.wasm.ai.models")));
        }
        let ceiling = state.policy.ai_max_tokens;
        let asked = fields.get("max_tokens").and_then(Value::as_u64).unwrap_or(u64::from(ceiling));
        fields.insert("max_tokens".into(), Value::from(asked.min(u64::from(ceiling))));
        let plugin = Arc::clone(&state.plugin);
        let target = model.unwrap_or_else(|| "default".into());
        Ok(Box::pin(async move {
            let call = services.complete(&plugin, request);
            services.observed(&plugin, "ai_complete", target, call).await
        }))
    })
}

/// `mcp_call(req_ptr, req_len, out_ptr, out_cap) -> len | ERR_*`: `{"server", "tool",
/// "arguments"?}` of an allowed tool; `{"text", "is_error"}`.
fn host_mcp_call(mut caller: Caller<'_, HostState>, a: i32, b: i32, c: i32, d: i32) -> wasmtime::Result<i32> {
    outgoing(&mut caller, (a, b, c, d), "mcp_call", |state, request| {
        let services = services_of(state, "mcp_call")?;
        let text = |k: &str| request.get(k).and_then(Value::as_str).map(str::to_owned);
        let (Some(server), Some(tool)) = (text("server"), text("tool")) else {
            return Err(HostError::Invalid("the request needs \"server\" and \"tool\"".into()));
        };
        let arguments = match request.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => return Err(HostError::Invalid("arguments must be an object".into())),
        };
        if !state.policy.tool_allowed(&server, &tool) {
            return Err(HostError::Denied(format!("{server}.{tool} is not in plugins.wasm.mcp.tools")));
        }
        let plugin = Arc::clone(&state.plugin);
        Ok(Box::pin(async move {
            let call = services.mcp_call(&plugin, &server, &tool, arguments);
            services.observed(&plugin, "mcp_call", format!("{server}.{tool}"), call).await
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_types_print_like_wasmtime() {
        assert_eq!(abi_type(4, true), "(func (param i32 i32 i32 i32) (result i32))");
        assert_eq!(abi_type(0, true), "(func (result i32))");
        assert_eq!(abi_type(2, false), "(func (param i32 i32))");
    }

    #[test]
    fn guest_ranges_are_bounds_checked_without_overflow() {
        assert_eq!(guest_range(100, 10, 20, "log").ok(), Some(10..30));
        assert_eq!(guest_range(100, 0, 100, "log").ok(), Some(0..100));
        assert!(guest_range(100, 90, 11, "log").is_err());
        assert!(guest_range(100, -1, 1, "log").is_err());
        assert!(guest_range(100, 1, -1, "log").is_err());
    }

    #[test]
    fn capability_names_round_trip() {
        for c in Capability::ALL {
            assert_eq!(Capability::parse(c.name()), Some(c));
        }
        assert_eq!(Capability::parse("process-exec"), None);
    }
}
