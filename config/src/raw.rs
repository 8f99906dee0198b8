//! The raw config model: serde types that mirror the YAML exactly, with the seed's field names.
//! Nothing here is validated; `compile` turns these into the resolved model.
//!
//! Every struct denies unknown fields so that the generated JSON Schema says so, and the
//! unknown-key pass in `schema.rs` can answer a typo with "did you mean".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A free-form YAML value (job input, plugin parameters).
pub(crate) type Any = serde_json::Value;

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Lamplighter configuration")]
pub(crate) struct RawConfig {
    pub(crate) framework: Option<Framework>,
    pub(crate) ai: Option<Ai>,
    /// Per-provider limits (also accepted as `ai.rate_limits`, as in the seed).
    pub(crate) rate_limits: Option<BTreeMap<String, RateLimit>>,
    pub(crate) agents: Option<BTreeMap<String, Agent>>,
    pub(crate) pipelines: Option<BTreeMap<String, Pipeline>>,
    pub(crate) workflows: Option<BTreeMap<String, Workflow>>,
    pub(crate) scheduling: Option<Scheduling>,
    pub(crate) plugins: Option<Plugins>,
    pub(crate) hooks: Option<Hooks>,
    pub(crate) mcp: Option<Mcp>,
    pub(crate) worker: Option<Worker>,
    pub(crate) telemetry: Option<Telemetry>,
    /// Skill folders agents name in their `skills` (SPEC §6).
    pub(crate) skills: Option<Skills>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Skills {
    /// Folders holding one folder per skill, each with a `SKILL.md` (front matter `name`,
    /// `description`; the instructions below it) and any files it refers to.
    pub(crate) dirs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Framework {
    pub(crate) name: Option<String>,
    pub(crate) version: Option<String>,
    /// Minimum log level: trace, debug, info, warn, error (the seed's .NET names are accepted).
    pub(crate) log_level: Option<String>,
    /// Working data directory; relative paths resolve against the process working directory.
    pub(crate) data_dir: Option<String>,
    /// More YAML files to merge, relative to the importing file; globs allowed.
    pub(crate) imports: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ai {
    pub(crate) default_model: Option<String>,
    pub(crate) providers: Option<BTreeMap<String, Provider>>,
    pub(crate) rate_limits: Option<BTreeMap<String, RateLimit>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Provider {
    /// Azure OpenAI resource endpoint.
    pub(crate) endpoint: Option<String>,
    /// Any OpenAI-compatible base URL.
    pub(crate) base_url: Option<String>,
    pub(crate) api_key: Option<String>,
    pub(crate) api_version: Option<String>,
    pub(crate) models: Option<BTreeMap<String, Model>>,
    /// How long one model call may take before it is abandoned and retried (default `120s`).
    pub(crate) timeout: Option<String>,
    /// Retries of a model call that failed with 429, 5xx, a timeout or a dropped connection
    /// (default 3), with backoff; a `Retry-After` from the provider wins over the backoff.
    pub(crate) max_retries: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Model {
    pub(crate) id: String,
    pub(crate) deployment_name: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) api_type: Option<String>,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) default_temperature: Option<f64>,
    /// Prices per million tokens, for `budget.max_cost` and the cost shown with each run.
    pub(crate) pricing: Option<Pricing>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Pricing {
    /// Price of a million prompt (input) tokens.
    pub(crate) input: f64,
    /// Price of a million completion (output) tokens.
    pub(crate) output: f64,
}

/// Limits on one run of an agent (on an agent, or on a job; the job's fields win).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Budget {
    /// Prompt plus completion tokens over every model call of the run.
    pub(crate) max_tokens_total: Option<u64>,
    pub(crate) max_tool_calls: Option<u32>,
    /// In the currency of the models' `pricing`.
    pub(crate) max_cost: Option<f64>,
    /// Time spent in model and tool calls over the whole run (waits for a decision do not
    /// count), e.g. `10m`.
    pub(crate) max_duration: Option<String>,
    /// `fail` (default): the run fails with "budget exceeded"; `ask`: it waits for approval to
    /// go on with the budget raised by as much again.
    pub(crate) on_budget: Option<String>,
}

/// `auto` (default), `deny` or `ask`, for every tool or, in the long form, for the tools
/// listed (`plugin.action`, `server.tool`, or `prefix.*`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ToolApproval {
    Mode(String),
    Listed {
        mode: String,
        #[serde(default)]
        tools: Option<Vec<String>>,
    },
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimit {
    pub(crate) requests_per_minute: Option<u32>,
    pub(crate) tokens_per_minute: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Agent {
    pub(crate) name: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) provider: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) max_iters: Option<u32>,
    pub(crate) system_prompt: Option<String>,
    pub(crate) system_prompt_file: Option<String>,
    pub(crate) skills: Option<Vec<String>>,
    pub(crate) plugins: Option<Vec<String>>,
    pub(crate) mcp_servers: Option<Vec<String>>,
    pub(crate) allowed_actions: Option<Vec<String>>,
    pub(crate) allowed_commands: Option<Vec<String>>,
    pub(crate) working_directory: Option<String>,
    pub(crate) delegates: Option<Vec<String>>,
    pub(crate) budget: Option<Budget>,
    /// Whether tool calls need a person when the agent runs unattended.
    pub(crate) tool_approval: Option<ToolApproval>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Pipeline {
    pub(crate) description: Option<String>,
    /// Agent names, run in order; each gets the previous one's output.
    pub(crate) steps: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Workflow {
    pub(crate) name: Option<String>,
    pub(crate) description: Option<String>,
    /// `manual` or `scheduled` (informational, as in the seed).
    pub(crate) trigger: Option<String>,
    pub(crate) steps: Vec<Step>,
}

/// One workflow step. Flat, as in the seed: which fields apply depends on `type`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) agent: Option<String>,
    pub(crate) plugin: Option<String>,
    pub(crate) action: Option<String>,
    pub(crate) input: Option<Any>,
    pub(crate) parameters: Option<Any>,
    pub(crate) condition: Option<String>,
    pub(crate) then: Option<Vec<String>>,
    #[serde(rename = "else")]
    pub(crate) otherwise: Option<Vec<String>>,
    pub(crate) when: Option<String>,
    pub(crate) steps: Option<Vec<Step>>,
    pub(crate) agents: Option<Vec<String>>,
    pub(crate) max_iterations: Option<u32>,
    /// Approval steps: how long to wait for a decision (e.g. `24h`); none waits until decided.
    pub(crate) timeout: Option<String>,
    /// Approval steps: what a timeout decides, `approve` or `reject` (default `reject`).
    pub(crate) on_timeout: Option<String>,
    /// The `scheduling.limits` the step holds a slot of while it runs (as a job's `limits`;
    /// a `parallel` holds its children's too): the run gives its slot back and waits in line
    /// for them when it reaches the step, and frees them when the step ends.
    #[schemars(with = "Option<Vec<LimitSchema>>")]
    pub(crate) limits: Option<Any>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Scheduling {
    pub(crate) storage: Option<Storage>,
    /// Default IANA time zone for jobs (default UTC).
    ///
    /// Across daylight-saving changes (as cronie does it): a cron job whose seconds, minute or
    /// hour field starts with `*` (`*/15 * * * *`, `0 * * * *`) follows real time — it fires at
    /// every instant whose local time matches, so it keeps running through both passes of the
    /// repeated autumn hour and simply continues across the spring gap. Every other cron job
    /// (a fixed time of day such as `30 2 * * *`, lists, ranges) fires a repeated local time
    /// once, at its first occurrence, and a local time inside the spring gap at the same offset
    /// after it (02:30 → 03:30); two entries landing on one instant fire once. `every:` and
    /// `at:` are instants and are unaffected.
    pub(crate) timezone: Option<String>,
    pub(crate) jobs: Option<BTreeMap<String, Job>>,
    /// Notifications for every job that sets no `notify` of its own.
    pub(crate) notify: Option<Vec<Notify>>,
    /// Named concurrency limits shared by every job and every worker: `{warehouse: 2, gpu: 1}`.
    /// A job lists the ones it takes (`limits: [warehouse]`) and holds one slot of each while
    /// its run runs; a run without a free slot waits, queued, first come first served.
    pub(crate) limits: Option<BTreeMap<String, u32>>,
    /// Named sets of days a job may fire on (`calendar:` of a job): `{business: {weekdays:
    /// ["mon..fri"], except: [holidays]}, holidays: {dates: ["2026-12-24..2026-12-26"]}}`.
    pub(crate) calendars: Option<BTreeMap<String, CalendarDef>>,
    /// The deadline of every job that sets none of its own.
    pub(crate) deadline: Option<DeadlineDef>,
}

/// A set of days: its `weekdays` and its `dates` (every day when it lists neither), less the
/// days of the calendars under `except`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CalendarDef {
    /// Days of the week: `mon` … `sun`, or a range such as `mon..fri`.
    pub(crate) weekdays: Option<Vec<String>>,
    /// Days, `2026-12-24`, or inclusive ranges, `2027-04-01..2027-04-02`.
    pub(crate) dates: Option<Vec<String>>,
    /// An iCalendar file (relative to the config's folder) whose events' days are days of the
    /// calendar: RRULE, RDATE and EXDATE expanded; a timed event covers the days it touches.
    pub(crate) ics: Option<String>,
    /// Calendars whose days are not days of this one.
    pub(crate) except: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Storage {
    /// `sqlite` (default) or `postgres`.
    pub(crate) provider: Option<String>,
    /// A sqlx URL (`sqlite://…`, `postgres://…`) or the seed's `Data Source=…` form; e.g.
    /// `${DATABASE_URL}`.
    pub(crate) connection_string: Option<String>,
    /// PostgreSQL: connections each worker keeps open (default 10).
    pub(crate) pool_size: Option<u32>,
    /// PostgreSQL: the longest a statement may run before the server cancels it (default `30s`).
    pub(crate) statement_timeout: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Job {
    pub(crate) description: Option<String>,
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) workflow: Option<String>,
    pub(crate) agent: Option<String>,
    pub(crate) plugin: Option<String>,
    pub(crate) action: Option<String>,
    pub(crate) input: Option<Any>,
    pub(crate) parameters: Option<Any>,
    /// 5-field cron (minute resolution), 6-field with seconds, or a macro such as `@daily`.
    pub(crate) cron: Option<String>,
    /// A fixed interval such as `90s` or `15m`.
    pub(crate) every: Option<String>,
    /// A one-shot RFC 3339 instant.
    pub(crate) at: Option<String>,
    /// IANA time zone; defaults to `scheduling.timezone`, then UTC.
    ///
    /// Across daylight-saving changes (as cronie does it): a cron job whose seconds, minute or
    /// hour field starts with `*` (`*/15 * * * *`, `0 * * * *`) follows real time — it fires at
    /// every instant whose local time matches, so it keeps running through both passes of the
    /// repeated autumn hour and simply continues across the spring gap. Every other cron job
    /// (a fixed time of day such as `30 2 * * *`, lists, ranges) fires a repeated local time
    /// once, at its first occurrence, and a local time inside the spring gap at the same offset
    /// after it (02:30 → 03:30); two entries landing on one instant fire once. `every:` and
    /// `at:` are instants and are unaffected.
    pub(crate) timezone: Option<String>,
    pub(crate) enabled: Option<bool>,
    /// What fires when several ticks are due at once (after downtime, a suspend or a clock
    /// step): `latest` (default) exactly one run, for the newest due tick; `all` every due tick
    /// once, in order; `skip` none that is more than a minute late. Ticks older than
    /// `catch_up_window` (default 1 day) never fire.
    pub(crate) catch_up: Option<String>,
    pub(crate) catch_up_window: Option<String>,
    /// `forbid` (default), `allow`, `replace` or `queue`.
    pub(crate) overlap: Option<String>,
    pub(crate) retries: Option<Retries>,
    pub(crate) timeout: Option<String>,
    pub(crate) jitter: Option<String>,
    pub(crate) retention: Option<Retention>,
    pub(crate) working_directory: Option<String>,
    pub(crate) allowed_commands: Option<Vec<String>>,
    /// For agent jobs: limits on each run, over the agent's own `budget`.
    pub(crate) budget: Option<Budget>,
    /// Who is told when runs fail, recover, succeed or wait for a person (replaces
    /// `scheduling.notify` for this job; `[]` tells nobody).
    pub(crate) notify: Option<Vec<Notify>>,
    /// Names for handling jobs as a group: `list_jobs`, `pause_job`, `resume_job` and
    /// `trigger_job` take a `tag` (`lampctl jobs pause --tag finance`). Letters, digits, `-`,
    /// `_`, `.` and `/`, up to 64 characters.
    pub(crate) tags: Option<Vec<String>>,
    /// Runs the job once after each qualifying run of other jobs: `after: [extract]` (after each
    /// success), or `after: {jobs: [a, b], on: success | failure | finished, within: 12h}`,
    /// which waits for a new outcome of every job named (fan-in), each within the window of the
    /// others. May stand alone or beside `cron`, `every` or `at`. The run's input carries
    /// `upstream: {JOB: {run_id, status, output}}`.
    #[schemars(with = "Option<AfterSchema>")]
    pub(crate) after: Option<Any>,
    /// The `scheduling.limits` each run holds a slot of while it runs: `[warehouse]`, or
    /// `[{name: tenant, key: "${input.tenant}"}]` for N at once per distinct key. Manual
    /// triggers, retries, backfills and `after` runs count too.
    #[schemars(with = "Option<Vec<LimitSchema>>")]
    pub(crate) limits: Option<Any>,
    /// A name of `scheduling.calendars`: the job's schedule fires only on its days, read in
    /// the job's zone. `{name, shift: previous | next}` moves a fire on a day off the calendar
    /// to the same local time of the calendar's day before or after (once, if that day already
    /// fires then).
    #[schemars(with = "Option<CalendarSchema>")]
    pub(crate) calendar: Option<Any>,
    /// When a tick must have started or a run finished, or someone is told
    /// (`deadline_missed`): replaces `scheduling.deadline` as a whole (`{}`: none).
    pub(crate) deadline: Option<DeadlineDef>,
}

/// A job's deadlines.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadlineDef {
    /// A tick (cron, every, at; catch-up too) must have started this long after its scheduled
    /// instant: `5m`.
    pub(crate) start_within: Option<String>,
    /// A run (with its retries) must have finished this long after its tick, or after it was
    /// asked for (manual, api, after, backfill): `2h`.
    pub(crate) finish_within: Option<String>,
    /// A run must have finished by this local time (`"06:00"`, the job's zone), the first
    /// after its tick or after it was asked for.
    pub(crate) finish_by: Option<String>,
    /// `notify` (default): tell, and let it run; `cancel`: tell, and stop a run past
    /// finish_within or finish_by.
    pub(crate) on_miss: Option<String>,
}

/// The shapes an entry of a job's `limits` takes (read by hand, for errors that name the field).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum LimitSchema {
    Name(String),
    Keyed {
        /// A name of `scheduling.limits`.
        name: String,
        /// A template over the run's input (`${input.tenant}`): the limit's N hold per
        /// distinct key. A reference the input lacks reads as empty.
        key: Option<String>,
    },
}

/// The shapes a job's `calendar` takes (read by hand, for errors that name the field).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum CalendarSchema {
    Name(String),
    Shifted {
        /// A name of `scheduling.calendars`.
        name: String,
        /// `previous` or `next`: where a fire on a day off the calendar goes (left out, it
        /// is skipped).
        shift: Option<ShiftSchema>,
    },
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum ShiftSchema {
    Previous,
    Next,
}

/// The shapes `after` takes (read by hand, for errors that name the field).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum AfterSchema {
    Jobs(Vec<String>),
    Rule {
        jobs: Vec<String>,
        /// `success` (default), `failure`, or `finished` (any outcome but a skipped tick).
        on: Option<String>,
        /// How long an outcome waits for the others' (e.g. `12h`); default: for ever.
        within: Option<String>,
    },
}

/// One notification rule.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Notify {
    /// `failure` (a run's final outcome, after its retries, is failed, timed out or
    /// interrupted), `success`, `recovery` (the first success after failures),
    /// `approval_waiting` or `budget_asked`.
    pub(crate) on: Option<String>,
    /// `failure`: from the Nth failure in a row on (default 1). `recovery`: only after at least
    /// N failures in a row.
    pub(crate) after_consecutive: Option<u32>,
    pub(crate) to: Option<NotifyTo>,
}

/// Where a notification goes: one of `webhook`, `workflow`, `agent`, `plugin` (with `action`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NotifyTo {
    /// A URL, or `{url, headers, format: generic | slack}`.
    pub(crate) webhook: Option<WebhookTo>,
    /// A workflow run with the event as its input.
    pub(crate) workflow: Option<String>,
    /// An agent run with the event as its input.
    pub(crate) agent: Option<String>,
    /// A plugin action run with the event as its parameter `event` (`plugin: p`, `action: a`,
    /// or `plugin: p.a`).
    pub(crate) plugin: Option<String>,
    pub(crate) action: Option<String>,
}

/// A webhook: its URL alone, or with headers and a body format.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum WebhookTo {
    Url(String),
    Full(WebhookFull),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookFull {
    pub(crate) url: Option<String>,
    /// Sent with each request (e.g. `Authorization: Bearer ${HOOK_TOKEN}`).
    pub(crate) headers: Option<BTreeMap<String, String>>,
    /// `generic` (default: the event as JSON) or `slack` (`{"text": …}`).
    pub(crate) format: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Retries {
    /// Retries after the first attempt.
    pub(crate) max: Option<u32>,
    /// `exponential` or `fixed`.
    pub(crate) backoff: Option<String>,
    pub(crate) initial: Option<String>,
    pub(crate) max_delay: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Retention {
    pub(crate) max_runs: Option<u32>,
    pub(crate) max_age: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Plugins {
    pub(crate) dirs: Option<Vec<String>>,
    pub(crate) native_trust_dirs: Option<Vec<String>>,
    pub(crate) global: Option<Vec<String>>,
    pub(crate) per_agent: Option<BTreeMap<String, Vec<String>>>,
    /// Limits and grants for WASM plugins (Lamplighter's addition to the seed's section).
    pub(crate) wasm: Option<WasmPlugins>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WasmPlugins {
    /// Fuel per call, about one unit per instruction (default 1000000).
    pub(crate) fuel: Option<u64>,
    /// Most linear memory per call in MiB (default 16).
    pub(crate) memory_mb: Option<u64>,
    /// Wall time per call, e.g. "5s" (default 5s).
    pub(crate) timeout: Option<String>,
    /// Capabilities plugins may be granted when their manifest asks: config-read, fs-read,
    /// fs-write, http-request, ai, mcp (default none).
    pub(crate) capabilities: Option<Vec<String>>,
    /// What `config_get` answers, per plugin name.
    pub(crate) config: Option<BTreeMap<String, serde_json::Value>>,
    /// What `http_request` may reach (with the `http-request` capability).
    pub(crate) http: Option<WasmHttp>,
    /// Which models `ai_complete` may use (with the `ai` capability).
    pub(crate) ai: Option<WasmAi>,
    /// Which MCP tools `mcp_call` may call (with the `mcp` capability).
    pub(crate) mcp: Option<WasmMcp>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WasmHttp {
    /// Hosts requests and redirects may go to: `api.example.com`, or `*.example.com` for its
    /// subdomains (default none: every request is refused).
    pub(crate) allowed_hosts: Option<Vec<String>>,
    /// The whole exchange, e.g. "10s" (default 10s; the call's own timeout still applies).
    pub(crate) timeout: Option<String>,
    /// The most of a response body a plugin gets, in KiB (default 1024); the rest is cut.
    pub(crate) max_response_kb: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WasmAi {
    /// Model aliases a plugin may ask for (default: only `ai.default_model`, asked for by
    /// leaving `model` out).
    pub(crate) models: Option<Vec<String>>,
    /// The most tokens one completion may produce (default 1024).
    pub(crate) max_tokens: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WasmMcp {
    /// MCP tools a plugin may call: `server.tool`, or `server.*` (default none).
    pub(crate) tools: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Hooks {
    pub(crate) bindings: Option<Vec<HookBinding>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HookBinding {
    pub(crate) event: String,
    pub(crate) plugin: String,
    pub(crate) hook: String,
    pub(crate) priority: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Mcp {
    pub(crate) servers: Option<BTreeMap<String, McpServer>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpServer {
    pub(crate) command: Option<String>,
    pub(crate) args: Option<Vec<String>>,
    pub(crate) env: Option<BTreeMap<String, String>>,
    pub(crate) url: Option<String>,
    pub(crate) headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Worker {
    /// Unique worker name; default `<host>-<pid>-<random>`.
    pub(crate) name: Option<String>,
    pub(crate) concurrency: Option<u32>,
    pub(crate) shutdown_grace: Option<String>,
    /// How long a worker's runs stay its own without a heartbeat (default 30s); after that the
    /// other workers on a shared database take them over. Heartbeats go every third of it.
    pub(crate) lease: Option<String>,
    pub(crate) mcp: Option<WorkerMcp>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerMcp {
    /// `http` (default) or `stdio`; the HTTP listener always serves health checks.
    pub(crate) transport: Option<String>,
    pub(crate) host: Option<String>,
    pub(crate) port: Option<u16>,
    pub(crate) auth: Option<Auth>,
    /// Host names the worker may be reached by, beyond loopback and `host` (e.g. the name a
    /// remote `lampctl` uses); also `$LAMPLIGHTER_ALLOWED_HOSTS`, comma-separated.
    pub(crate) allowed_hosts: Option<Vec<String>>,
    /// TLS on the worker's listener (`cert_file`, `key_file`, optional `client_ca_file` for
    /// mutual TLS), or `terminated_by_proxy: true` for a TLS-terminating proxy in front.
    pub(crate) tls: Option<Tls>,
    /// Jobs created, changed and deleted at runtime over MCP (off by default).
    pub(crate) manage_jobs: Option<ManageJobs>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManageJobs {
    /// Whether MCP clients may create, change, delete and backfill jobs (default false).
    pub(crate) enabled: Option<bool>,
    /// What a runtime job may run: patterns such as `workflow:*`, `agent:news-*`,
    /// `plugin:file-save.*` (default: every workflow and agent, every plugin action but
    /// `shell-exec`'s).
    pub(crate) targets: Option<Vec<String>>,
    /// The most runtime jobs there may be (default 1000).
    pub(crate) max_jobs: Option<u32>,
    /// The largest definition, in bytes of JSON (default 65536).
    pub(crate) max_definition_bytes: Option<u32>,
    /// The most runs one backfill may create (default 100).
    pub(crate) max_backfill: Option<u32>,
    /// The commands a runtime job may allow (`allowed_commands`); a runtime job allows at most
    /// these, and these when it names none (default none: any command `shell-exec` may run,
    /// when a target pattern allows `shell-exec` at all).
    pub(crate) allowed_commands: Option<Vec<String>>,
    /// Folders a runtime job's `working_directory` may be in (default: the data directory).
    pub(crate) working_directories: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Auth {
    /// `none`, `bearer` or `oauth`.
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    /// With `type: oauth`: the identity provider whose access tokens (JWTs) are accepted.
    pub(crate) oauth: Option<OAuth>,
    /// One token with every right (the `manage` role).
    pub(crate) token: Option<String>,
    /// Named tokens, each with a role: `read`, `operate` or `manage`.
    pub(crate) tokens: Option<Vec<Token>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OAuth {
    /// The issuer (`iss`) exactly as the provider's discovery document gives it; its keys are
    /// found from `<issuer>/.well-known/openid-configuration`. `https`, or `http` on loopback.
    pub(crate) issuer: Option<String>,
    /// The URL clients reach the worker's MCP endpoint by (e.g.
    /// `https://lamplighter.example.com/mcp`): the `resource` of the protected-resource
    /// metadata and the `aud` a token must carry (RFC 8707).
    pub(crate) audience: Option<String>,
    /// The scope that gives each role (defaults `lamplighter:read`, `lamplighter:operate`,
    /// `lamplighter:manage`).
    pub(crate) scopes: Option<OAuthScopes>,
    /// How far `exp` and `nbf` may be off (default 60s).
    pub(crate) leeway: Option<String>,
    /// Other `aud` values a token may carry instead of `audience`, for providers that put an
    /// application id there (Microsoft Entra ID's v2 tokens).
    pub(crate) token_audiences: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OAuthScopes {
    pub(crate) read: Option<String>,
    pub(crate) operate: Option<String>,
    pub(crate) manage: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Token {
    /// Who holds it: recorded as the actor of what it does.
    pub(crate) name: Option<String>,
    pub(crate) token: Option<String>,
    /// `read` (lists, gets, follow, resources), `operate` (+ pause, resume, trigger, cancel,
    /// approve, reject, run workflows) or `manage` (+ create, change, delete and backfill
    /// jobs; reload).
    pub(crate) role: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tls {
    pub(crate) cert_file: Option<String>,
    pub(crate) key_file: Option<String>,
    /// Clients must present a certificate signed by this CA (mutual TLS).
    pub(crate) client_ca_file: Option<String>,
    /// TLS ends at a proxy in front of the worker, which listens in plain HTTP behind it.
    pub(crate) terminated_by_proxy: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Telemetry {
    pub(crate) enabled: Option<bool>,
    pub(crate) service_name: Option<String>,
    pub(crate) service_version: Option<String>,
    pub(crate) resource_attributes: Option<BTreeMap<String, String>>,
    pub(crate) traces: Option<Signal>,
    pub(crate) metrics: Option<Signal>,
    pub(crate) logs: Option<Signal>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Signal {
    pub(crate) exporter: Option<String>,
    pub(crate) endpoint: Option<String>,
    /// OTLP's wire: `grpc` (port 4317) or `http/protobuf` (port 4318; the default). Unset:
    /// `OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub(crate) protocol: Option<String>,
    pub(crate) enable_sensitive_data: Option<bool>,
    pub(crate) sampling: Option<Sampling>,
    pub(crate) export_interval_ms: Option<u64>,
    pub(crate) min_level: Option<String>,
    /// Metrics only: export the per-job gauges (last success, next fire, consecutive failures,
    /// oldest running run, oldest wait for a decision), one series per job each (default true):
    /// every job's at `/metrics`, up to 10,000 jobs' over OTLP. Turn off for very large job
    /// counts.
    pub(crate) per_job: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Sampling {
    pub(crate) strategy: Option<String>,
    pub(crate) ratio: Option<f64>,
}
