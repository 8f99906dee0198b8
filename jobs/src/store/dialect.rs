//! What differs between the backends, as small interfaces by concern ([`Dialect`] for
//! connections, statements and locks; [`RunSql`], [`QueueSql`], [`LeaseSql`], [`ReadSql`],
//! [`UpkeepSql`]), and what the transaction scripts need to speak to any backend through them: values
//! to bind ([`Arg`], [`Stmt`]), rows to read ([`Record`] and the row readers), and SQL written
//! once, with `$n` placeholders (both drivers take them) and the few words the dialects spell
//! differently ([`Spelling`], rendered by [`sql!`]).
//!
//! A backend implements these for its store: how it connects, how it binds a row set (a
//! JSON array on SQLite, arrays on PostgreSQL) and a batch insert, how it locks (one writer, or row locks and
//! advisory locks), how it keeps leases (the application's clock, or the server's), its queue
//! adapter, and the reads it answers its own way for speed. Everything else is written once.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::ops::DerefMut;
use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlSafeStr;

use super::RunBrief;
use super::{Handed, JobOverview, JobState, RunEnd, StorageKind, StoreError, WorkerId, WorkerLease, from_ms};
use crate::run::{CallKind, CallRecord, FollowUp, Owner, Run, RunStatus, StepRecord, StepStatus, Trigger};

/// A value bound to a statement.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    Int(Option<i64>),
    Real(Option<f64>),
    Bool(bool),
    Text(Option<Cow<'a, str>>),
    /// The list a `{in $n}` tests membership of: a JSON array on SQLite, `text[]` on PostgreSQL.
    Texts(Vec<&'a str>),
    /// The row set a `{rows $n AS …}` reads, by column in the order it names them
    /// ([`Stmt::bind_rows`]): a JSON array of arrays on SQLite; an array a column on PostgreSQL,
    /// the first at `$n`, the others after the statement's own parameters ([`RowsBind`]).
    Rows(Vec<Column<'a>>),
}

/// One column of a row set ([`Arg::Rows`]), a value a row.
#[derive(Debug, Clone)]
pub(crate) enum Column<'a> {
    Texts(Vec<Option<Cow<'a, str>>>),
    Ints(Vec<Option<i64>>),
    Bools(Vec<bool>),
}

impl<'a> Column<'a> {
    /// An empty column of a row set's `ty` (`text`, `bigint` or `bool`), room for `n` values.
    fn of(name: &str, ty: &str, n: usize) -> Self {
        match ty {
            "text" => Column::Texts(Vec::with_capacity(n)),
            "bigint" => Column::Ints(Vec::with_capacity(n)),
            "bool" => Column::Bools(Vec::with_capacity(n)),
            _ => panic!("a row set's column {name} of type {ty}, which no backend binds"),
        }
    }

    /// `v` after this column's values. A value of another type is a bug in the statement, not
    /// input: it panics, as a row read as another type does ([`Record`]).
    fn push(&mut self, v: Arg<'a>) {
        match (self, v) {
            (Column::Texts(c), Arg::Text(v)) => c.push(v),
            (Column::Ints(c), Arg::Int(v)) => c.push(v),
            (Column::Bools(c), Arg::Bool(v)) => c.push(v),
            (c, v) => {
                let ty = match c {
                    Column::Texts(_) => "text",
                    Column::Ints(_) => "bigint",
                    Column::Bools(_) => "bool",
                };
                panic!("a value {v:?} in a row set's column of {ty}")
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Column::Texts(v) => v.len(),
            Column::Ints(v) => v.len(),
            Column::Bools(v) => v.len(),
        }
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}

impl From<Option<f64>> for Arg<'_> {
    fn from(v: Option<f64>) -> Self {
        Arg::Real(v)
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(Some(Cow::Borrowed(v)))
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(Some(Cow::Borrowed(v)))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Arg::Text(v.map(Cow::Borrowed))
    }
}

impl From<String> for Arg<'_> {
    fn from(v: String) -> Self {
        Arg::Text(Some(Cow::Owned(v)))
    }
}

impl From<Option<String>> for Arg<'_> {
    fn from(v: Option<String>) -> Self {
        Arg::Text(v.map(Cow::Owned))
    }
}

/// One statement: its text, its values in placeholder order, and what it does (the context
/// of its error).
pub(crate) struct Stmt<'a> {
    pub(crate) sql: sqlx::SqlStr,
    pub(crate) args: Vec<Arg<'a>>,
    pub(crate) what: &'static str,
}

impl<'a> Stmt<'a> {
    pub(crate) fn new(sql: impl SqlSafeStr, what: &'static str) -> Self {
        Self { sql: sql.into_sql_str(), args: Vec::new(), what }
    }

    /// A statement whose text was built for this call (a batch's rows, a listing's filters).
    pub(crate) fn built(sql: String, what: &'static str) -> Self {
        Self::new(sqlx::AssertSqlSafe(sql), what)
    }

    pub(crate) fn bind(mut self, v: impl Into<Arg<'a>>) -> Self {
        self.args.push(v.into());
        self
    }

    /// The list for a `{in $n}`.
    pub(crate) fn bind_list(mut self, v: impl IntoIterator<Item = &'a str>) -> Self {
        self.args.push(Arg::Texts(v.into_iter().collect()));
        self
    }

    /// The row set for a `{rows $n AS j(…)}`: its columns in the order `j` names them, each as
    /// long as the others.
    pub(crate) fn bind_rows(mut self, cols: Vec<Column<'a>>) -> Self {
        debug_assert!(cols.windows(2).all(|w| w[0].len() == w[1].len()), "the columns of a row set differ in length");
        self.args.push(Arg::Rows(cols));
        self
    }
}

/// A row, read by column name. Both backends store the same columns with types that decode
/// alike (instants and counts as 64-bit integers, flags as booleans, JSON as text), so the
/// readers below serve both. A column of another type is a bug in the statement, not input:
/// it panics, as sqlx's `get` does.
pub(crate) trait Record: Send + Sync {
    fn int(&self, col: &str) -> i64;
    fn opt_int(&self, col: &str) -> Option<i64>;
    fn opt_real(&self, col: &str) -> Option<f64>;
    fn flag(&self, col: &str) -> bool;
    /// A flag the statement may not have selected.
    fn try_flag(&self, col: &str) -> Option<bool>;
    fn text(&self, col: &str) -> String;
    /// A text column, borrowed from the row (for a value that is parsed, not kept).
    fn str(&self, col: &str) -> &str;
    fn opt_text(&self, col: &str) -> Option<String>;
    /// A JSON text column, parsed; a damaged value reads as none.
    fn json<T: serde::de::DeserializeOwned>(&self, col: &str) -> Option<T> {
        self.opt_text(col).and_then(|s| serde_json::from_str(&s).ok())
    }
}

/// [`Record`] for a driver's row type.
macro_rules! record_for {
    ($row:ty) => {
        impl $crate::store::dialect::Record for $row {
            fn int(&self, col: &str) -> i64 {
                sqlx::Row::get(self, col)
            }
            fn opt_int(&self, col: &str) -> Option<i64> {
                sqlx::Row::get(self, col)
            }
            fn opt_real(&self, col: &str) -> Option<f64> {
                sqlx::Row::get(self, col)
            }
            fn flag(&self, col: &str) -> bool {
                sqlx::Row::get(self, col)
            }
            fn try_flag(&self, col: &str) -> Option<bool> {
                sqlx::Row::try_get(self, col).ok()
            }
            fn text(&self, col: &str) -> String {
                sqlx::Row::get(self, col)
            }
            fn str(&self, col: &str) -> &str {
                sqlx::Row::get(self, col)
            }
            fn opt_text(&self, col: &str) -> Option<String> {
                sqlx::Row::get(self, col)
            }
        }
    };
}
pub(crate) use record_for;

/// What [`RunSql::ends_and_claims_at_once`] wrote: each ended run with the status it took,
/// the tasks taken, and the claimed runs' rows.
/// The ends recorded (id, status taken), the queue tasks taken, the claimed runs' rows, and how
/// long the write waited for the writing connection (SQLite).
pub(crate) type EndsAndClaims<R> = (Vec<(String, RunStatus)>, usize, Vec<R>, Option<u64>);

/// What [`RunSql::ends_and_hand_offs_at_once`] wrote.
#[derive(Debug)]
pub(crate) struct HandOffs<R> {
    /// The ends recorded: each run with the status it took.
    pub(crate) done: Vec<(String, RunStatus)>,
    /// The heads claimed into the slots the ends freed (rows as [`RunSql::claim`]'s).
    pub(crate) claimed: Vec<R>,
    /// Heads given a slot: (id, the limit they waited on, since when in ms).
    pub(crate) taken: Vec<(String, String, i64)>,
    /// The pools freed whose line it did not serve (a head that takes other limits too, a
    /// limit a reload removed, or more heads than slots here), as `limit_wait` spells them.
    pub(crate) left: Vec<String>,
}

/// What a claim does with a run another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locked {
    /// Leave it: whoever holds it is handing it over.
    Skip,
    /// Wait for it, then claim it if it is still queued.
    Wait,
}

/// The words the dialects spell differently, for statements written once. In the text:
/// `{greatest}`, `{lock}`, `{lock_skip}`, `{undispatched}`, `{limit_waits}`, `{notification_seq}`, `{by_id}`, `{in $n}`,
/// `{rows $n AS j(col type, …)}` (and the statuses, `{Queued}`, `{step:Running}`).
pub(crate) struct Spelling {
    /// `{greatest}(a, b)`: the larger of two values.
    pub(crate) greatest: &'static str,
    /// `{lock}`, at the end of a `SELECT`: its rows are this transaction's until it ends.
    pub(crate) lock: &'static str,
    /// `{lock_skip}`, at the end of a `SELECT`: as `{lock}`, leaving out the rows another
    /// transaction holds.
    pub(crate) lock_skip: &'static str,
    /// `{undispatched}`, after `FROM ll_runs` in reads of queued runs not handed over: how to
    /// reach them through their partial index.
    pub(crate) undispatched: &'static str,
    /// `{limit_waits}`, after `FROM ll_runs` in reads of the runs waiting for a limit's slot:
    /// how to reach them through their partial index.
    pub(crate) limit_waits: &'static str,
    /// `{in $n}`: membership in the list bound at `$n` ([`Arg::Texts`]).
    pub(crate) in_list: fn(&str) -> String,
    /// `{rows $n AS j(col type, …)}`, after `FROM`: the row set bound at `$n`
    /// ([`Stmt::bind_rows`]) as a table `j` with those columns (`type`: `text`, `bigint` or
    /// `bool`). Arguments: its parameters (one, or one a column: [`Spelling::rows_bind`]), the
    /// alias, the columns.
    pub(crate) rows: RowsSpelling,
    /// How a row set is bound.
    pub(crate) rows_bind: RowsBind,
    /// How a batch insert binds its rows ([`insert_rows`]).
    pub(crate) batch: Batch,
    /// How a claim picks its runs among those `which` selects (a condition on `ll_runs`' `id`)
    /// that are still queued: `(before, from, condition)` — what comes before its `UPDATE`,
    /// after its `SET`, and as its `WHERE`. `skip`: leave runs another transaction holds. What
    /// differs is the locking: PostgreSQL locks the rows in id order first (several workers
    /// claim at once); SQLite's one writer needs none.
    pub(crate) claim_pick: fn(&str, bool) -> (String, String, String),
    /// `{by_id}`, before a condition on `status` in a statement that finds runs by a batch of
    /// ids: keeps the planner on the primary key where it would take the status index (see
    /// `finish_runs`): SQLite's unary `+`, PostgreSQL's `'' ||`.
    pub(crate) by_id: &'static str,
    /// `{lease_live}`, inside a condition on `ll_workers w`: `w`'s lease has not run out, on
    /// the clock leases are measured by. Empty where a backend serves one worker (a file lock
    /// keeps every other process out, so its lease cannot be taken over).
    pub(crate) lease_live: &'static str,
    /// `{notification_seq}`, in statements on `ll_notifications`: the order its rows were
    /// recorded in (a later row has a larger one).
    pub(crate) notification_seq: &'static str,
    /// What starts a numbered placeholder: statements are written with `$n`; SQLite's own is
    /// `?n` (it takes `$n` for a name).
    pub(crate) param: char,
}

/// [`Spelling::rows`]: a row set's parameters, alias and columns (name, type) → its text.
pub(crate) type RowsSpelling = fn(&[String], &str, &[(&str, &str)]) -> String;

/// How a dialect binds a row set ([`Arg::Rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowsBind {
    /// All of it at its `$n`, as one value (SQLite: JSON text).
    One,
    /// A parameter a column: the first at its `$n`, the others numbered after the statement's
    /// own parameters, row sets in the order of their `$n` (PostgreSQL: typed arrays, which it
    /// reads three times as fast as a JSON row set in the write of ends).
    PerColumn,
}

/// How a dialect binds a batch insert's rows ([`insert_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batch {
    /// `VALUES` with a parameter a value (SQLite, which would read a row set out of JSON value
    /// by value).
    Values,
    /// A row set (`{rows}`): one statement text whatever the batch's size, prepared once a
    /// connection, and planned generically after the server's first five custom plans.
    /// PostgreSQL planned a `VALUES` list anew at every call: 3.5 ms a tick for a tick's 1,000
    /// runs (25,000 parameters).
    RowSet,
}

/// `sql` with its `$n` placeholders as `s` numbers them.
///
/// For SQLite, a `LIMIT $n` becomes `LIMIT +?n`. SQLite plans a statement for the value
/// bound to a bare `LIMIT ?n`, so it prepares the statement again at every execution (5 % of
/// a queue drain's CPU in `sqlite3Reprepare`, measured with perf in `cargo bench … runcore --
/// queue`). The unary plus makes the limit an expression evaluated at run time.
pub(crate) fn numbered(sql: &str, s: &Spelling) -> String {
    let param = s.param;
    if param == '$' {
        return sql.to_owned();
    }
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            if out.ends_with("LIMIT ") {
                out.push('+');
            }
            out.push(param);
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` as `s` spells it: statuses filled in ([`super::fill_statuses`]), the spelled words
/// replaced, placeholders numbered.
pub(crate) fn render(text: &str, s: &Spelling) -> String {
    let mut out = super::fill_statuses(text)
        .replace("{held}", HELD)
        .replace("{cancel_wins}", &super::CANCEL_WINS)
        .replace("{lease_live}", s.lease_live)
        .replace("{greatest}", s.greatest)
        .replace("{lock}", s.lock)
        .replace("{lock_skip}", s.lock_skip)
        .replace("{undispatched}", s.undispatched)
        .replace("{limit_waits}", s.limit_waits)
        .replace("{notification_seq}", s.notification_seq)
        .replace("{by_id}", s.by_id);
    // Row sets bound a column a parameter take theirs after the statement's own, in the
    // order of their `$n` (as the backend binds them).
    let sets = row_sets(&out);
    let mut by_param: Vec<&RowSet> = sets.iter().collect();
    by_param.sort_unstable_by_key(|r| r.param);
    let mut next = max_param(&out) + 1;
    let mut others = HashMap::new();
    for r in by_param {
        // A set named twice (read by two parts of one statement) is bound once.
        if others.contains_key(&r.param) {
            continue;
        }
        others.insert(r.param, next);
        next += r.cols.len() - 1;
    }
    // From the last, so that the earlier ones' places stay where they were found.
    for RowSet { at, param, alias, cols } in sets.into_iter().rev() {
        let params: Vec<String> = match s.rows_bind {
            RowsBind::One => vec![format!("${param}")],
            RowsBind::PerColumn => std::iter::once(param).chain(others[&param]..).take(cols.len()).map(|p| format!("${p}")).collect(),
        };
        let cols: Vec<(&str, &str)> = cols.iter().map(|(c, t)| (c.as_str(), t.as_str())).collect();
        out.replace_range(at, &(s.rows)(&params, &alias, &cols));
    }
    while let Some(start) = out.find("{in $") {
        let Some(len) = out[start..].find('}') else { break };
        let list = (s.in_list)(&out[start + 4..start + len]);
        out.replace_range(start..=start + len, &list);
    }
    numbered(&out, s)
}

/// The largest `$n` in `sql`.
fn max_param(sql: &str) -> usize {
    let mut max = 0;
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        max = max.max(rest[..digits].parse().unwrap_or(0));
    }
    max
}

/// A `{rows $n AS j(col type, …)}` in a statement's text.
struct RowSet {
    at: std::ops::Range<usize>,
    param: usize,
    alias: String,
    cols: Vec<(String, String)>,
}

/// Each `{rows $n AS j(col type, …)}` in `sql`, in text order: where it is, `n`, `j` and the
/// columns. A malformed one is a bug in a statement written here: it panics when the
/// statement is first rendered.
fn row_sets(sql: &str) -> Vec<RowSet> {
    let mut sets = Vec::new();
    let mut from = 0;
    while let Some(at) = sql[from..].find("{rows $") {
        let start = from + at;
        let len = sql[start..].find(")}").unwrap_or_else(|| panic!("{{rows}} without its end: {}", &sql[start..]));
        let spec = &sql[start + 7..start + len];
        let (param, rest) = spec.split_once(" AS ").unwrap_or_else(|| panic!("{{rows}} without AS: {spec}"));
        let param: usize = param.trim().parse().unwrap_or_else(|_| panic!("{{rows}} without a parameter number: {spec}"));
        let (alias, cols) = rest.split_once('(').unwrap_or_else(|| panic!("{{rows}} without columns: {spec}"));
        let cols = cols
            .split(',')
            .map(|c| c.trim().split_once(' ').unwrap_or_else(|| panic!("{{rows}} column without a type: {c}")))
            .map(|(c, t)| (c.to_owned(), t.trim().to_owned()))
            .collect();
        sets.push(RowSet { at: start..start + len + 2, param, alias: alias.trim().to_owned(), cols });
        from = start + len + 2;
    }
    sets
}

/// `{held}`: the run (`ll_runs`) is its worker's under a live lease of the epoch it was
/// claimed with — the fence every write a worker makes for a run passes. A run claimed before
/// epochs were recorded matches any epoch.
const HELD: &str =
    "EXISTS (SELECT 1 FROM ll_workers w WHERE w.name = ll_runs.worker AND w.epoch = coalesce(ll_runs.epoch, w.epoch) {lease_live})";

/// A statement's text for one dialect, rendered once per call site and dialect:
/// `sql!(D, "… {in $1}")` where `D: Dialect`. Without a dialect, `sql!("… {Queued}")` only
/// fills the statuses in (a backend's own statements). `$text` is evaluated once per dialect,
/// so it may be a `format!` of other fixed parts.
macro_rules! sql {
    ($d:ty, $text:expr) => {{
        static TEXTS: [std::sync::OnceLock<String>; 2] = [const { std::sync::OnceLock::new() }; 2];
        let text: &'static str = TEXTS[<$d as $crate::store::dialect::Dialect>::KIND as usize]
            .get_or_init(|| $crate::store::dialect::render(&$text, &<$d as $crate::store::dialect::Dialect>::SPELLING))
            .as_str();
        text
    }};
    ($text:expr) => {{
        static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| $crate::store::fill_statuses(&$text));
        let text: &'static str = TEXT.as_str();
        text
    }};
}
pub(crate) use sql;

/// A boxed-free future of a dialect's method.
pub(crate) trait Fut<T>: Future<Output = Result<T, StoreError>> + Send {}
impl<T, F: Future<Output = Result<T, StoreError>> + Send> Fut<T> for F {}

/// What a backend provides to every transaction script: its connections and statements, how
/// it spells what differs, and its locks. What differs by concern is in the traits below
/// ([`RunSql`], [`QueueSql`], [`LeaseSql`], [`ReadSql`], [`UpkeepSql`]); a store that
/// implements them all is a [`super::RunStore`].
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug + 'static {
    type Conn: Send;
    type Row: Record;
    /// A transaction of the connection that writes.
    type Tx: DerefMut<Target = Self::Conn> + Send;
    /// A connection of the store's: one of its pool's, or the one that writes.
    type Pooled: DerefMut<Target = Self::Conn> + Send;

    const KIND: StorageKind;
    /// How it spells what the dialects spell differently.
    const SPELLING: Spelling;
    /// The queue is the runs' own rows (a queued run with `dispatched_at` set; pushing writes
    /// nothing): a run that needs no hand-over decision — due, in no limit, of a job whose runs
    /// need not go one at a time — is handed to the queue by its insert, and no scheduler
    /// writes its row a second time to mark it. Where the queue is a table of its own, the
    /// scheduler hands such runs over (claimed into its free slots, or pushed).
    const QUEUED_BY_INSERT: bool = false;

    /// How long ends that claim nothing wait for more ends to join their write while other
    /// runs are still going (zero: none). Where a write is a round trip to a server and a
    /// commit of its own, fewer and larger writes cost it less.
    const ENDS_GATHER: std::time::Duration = std::time::Duration::ZERO;

    /// Starts a transaction that will write.
    fn begin(&self) -> impl Fut<Self::Tx>;
    fn commit(tx: Self::Tx) -> impl Fut<()>;
    /// Ends a transaction that wrote nothing at once (a dropped one would hold its locks until
    /// its connection is next used).
    fn rollback(tx: Self::Tx) -> impl Fut<()>;
    /// Makes what `tx` wrote so far durable short of its commit, so that a commit due at an
    /// instant ([`crate::store::Ticks::fire_ticks_held`]) has as little left to do as it can.
    /// A backend whose commit has nothing to gain from it does nothing.
    fn ahead_of_commit(&self, _tx: &mut Self::Tx) -> impl Fut<()> {
        async { Ok(()) }
    }
    /// A connection for reads.
    fn reader(&self) -> impl Fut<Self::Pooled>;
    /// A connection for a write outside a transaction (one statement).
    fn writer(&self) -> impl Fut<Self::Pooled>;
    /// A transaction of the end recorder's, the one writer of runs' ends: on a backend that
    /// gives those writes connections of their own, on one of them.
    fn begin_recording(&self) -> impl Fut<Self::Tx> {
        self.begin()
    }
    /// A connection of the end recorder's, for one statement (as [`Dialect::begin_recording`]).
    fn recording(&self) -> impl Fut<Self::Pooled> {
        self.writer()
    }

    fn execute(c: &mut Self::Conn, q: Stmt<'_>) -> impl Fut<u64>;
    fn fetch_all(c: &mut Self::Conn, q: Stmt<'_>) -> impl Fut<Vec<Self::Row>>;
    fn fetch_optional(c: &mut Self::Conn, q: Stmt<'_>) -> impl Fut<Option<Self::Row>>;

    /// Decides the ticks of `jobs` (sorted) one transaction at a time across writers.
    fn lock_jobs(c: &mut Self::Conn, jobs: &[&str]) -> impl Fut<()>;

    /// Admits runs to the slot pools `pools` (encoded, sorted) one transaction at a time
    /// across writers ([`crate::store::Handover::dispatch`]).
    fn lock_limits(c: &mut Self::Conn, pools: &[String]) -> impl Fut<()>;
}

/// The statements of runs that bind a batch or lock rows each backend's way: tick keys, ends, steps closed, claims.
pub(crate) trait RunSql: Dialect {
    /// Records tick keys `(job, scheduled instant, run id)`; returns the run ids whose key was
    /// new. Of two writers recording one key, the second finds it taken.
    fn record_ticks(c: &mut Self::Conn, keys: Vec<(&str, i64, &str)>) -> impl Fut<HashSet<String>>;
    /// Where the backend can write them as one statement: `finish_runs` and `close_steps` of
    /// `ends`, and the successes noticed at their end moving their jobs — each ended run with
    /// the status it took. `None`: the store writes them as statements.
    fn ends_at_once(
        &self,
        _ends: &[RunEnd<'_>],
        _now: i64,
    ) -> impl Future<Output = Option<Result<Vec<(String, RunStatus)>, StoreError>>> + Send {
        async { None }
    }
    /// Where the backend can write them as one statement: `finish_runs` and `close_steps` of
    /// `ends`, then the lease check, take and claim of up to `n` runs for `worker` that
    /// [`super::Ends::claim_queued`] makes — each ended run with the status it took, the
    /// tasks taken, and the claimed runs' rows (as [`RunSql::claim`]'s). `None`: the script
    /// writes them as a transaction of those statements.
    fn ends_and_claims_at_once(
        &self,
        _ends: &[RunEnd<'_>],
        _n: usize,
        _worker: &str,
        _now: i64,
    ) -> impl Future<Output = Option<Result<EndsAndClaims<Self::Row>, StoreError>>> + Send {
        async { None }
    }
    /// Where the backend can write them as one statement: `finish_runs` and `close_steps` of
    /// `ends`, and the hand-off of their slots (`handover::hand_off`, with `sizes`) to heads
    /// claimed for `worker`, at most `spare` of them. `None`: the store writes them as a
    /// transaction of statements.
    fn ends_and_hand_offs_at_once(
        &self,
        _ends: &[RunEnd<'_>],
        _sizes: &crate::limits::Sizes,
        _spare: usize,
        _worker: &str,
        _now: i64,
    ) -> impl Future<Output = Option<Result<HandOffs<Self::Row>, StoreError>>> + Send {
        async { None }
    }
    /// Marks the runs of `ids` still queued and not handed over as handed to the queue;
    /// returns those it marked.
    fn mark_dispatched(c: &mut Self::Conn, ids: &[String], now: i64) -> impl Fut<Vec<String>>;
}

/// The queue (apalis): tasks pushed, taken, forgotten.
pub(crate) trait QueueSql: Dialect {
    /// Pushes a task per run.
    fn push(c: &mut Self::Conn, ids: &[String]) -> impl Fut<()>;
    /// Takes and consumes up to `n` tasks: how many, and their run ids.
    fn take(c: &mut Self::Conn, n: usize) -> impl Fut<(usize, Vec<String>)>;
    /// Drops every task of our queue.
    fn forget_queue(c: &mut Self::Conn) -> impl Fut<()>;
}

/// Leases on the clock they are measured by, and the runs of workers that are gone.
pub(crate) trait LeaseSql: Dialect {
    /// Takes or renews `me`'s lease (see [`super::Leases::heartbeat`]).
    /// Returns the lease's epoch and the time it was written at on the clock leases are
    /// measured by (ms), or `None` when another process holds the name.
    fn heartbeat(&self, me: &WorkerId, lease: Duration, take_over: bool, now: i64) -> impl Fut<Option<(i64, i64)>>;
    /// The rows of `ll_workers` whose lease has not run out, by name.
    fn live_leases(c: &mut Self::Conn, now: i64) -> impl Fut<Vec<Self::Row>>;
    /// Marks the runs left `running` by workers that are gone `interrupted` (see
    /// [`super::Leases::recover`]) and returns them ([`run_cols`]).
    fn interrupt_orphans(c: &mut Self::Conn, starting: Option<&str>, now: i64) -> impl Fut<Vec<Self::Row>>;
}

/// Reads each backend answers its own way, for speed.
pub(crate) trait ReadSql: Dialect {
    fn job_states(&self) -> impl Fut<HashMap<String, JobState>>;
    fn job_overview(&self, job: &str, recent: u32) -> impl Fut<JobOverview>;
    fn last_runs(&self, jobs: &[&str]) -> impl Fut<HashMap<String, RunBrief>>;
    /// See [`super::Listings::listing_changes`].
    fn listing_changes(&self) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }
}

/// The backend's own upkeep.
pub(crate) trait UpkeepSql: Dialect {
    fn migrate(&self) -> impl Fut<()>;
    fn close(&self) -> impl Future<Output = ()> + Send;
    fn check(&self) -> impl Future<Output = Result<(), String>> + Send;
    /// What pruning single jobs leaves behind, and the backend's own upkeep.
    fn housekeeping(&self) -> impl Fut<()>;
}

/// The columns of a run, for [`run_from_row`] (a first attempt stores no root: it is its own).
macro_rules! run_cols {
    () => {
        "id, job, trigger, status, scheduled_at, due_at, enqueued_at, started_at, finished_at, attempt, input, parameters, output, error, worker, idempotency_key, retry_of, next_run_id, tokens_in, tokens_out, cost, trace_id, requested_by, limit_wait, limit_wait_since, limits, coalesce(root_id, id) AS root_id"
    };
}
pub(crate) use run_cols;

pub(crate) fn job_state_from_row(r: &impl Record) -> JobState {
    JobState {
        paused: r.flag("paused"),
        pause_reason: r.opt_text("pause_reason"),
        paused_at: r.opt_int("paused_at").map(from_ms),
        last_tick: r.opt_int("last_tick").map(from_ms),
    }
}

pub(crate) fn run_from_row(r: &impl Record) -> Run {
    let opt_t = |c: &str| r.opt_int(c).map(from_ms);
    Run {
        id: r.text("id"),
        owner: Owner::from_stored(r.str("job")),
        // Rows from a newer or damaged database read as the most cautious value, not a crash.
        trigger: Trigger::from_str(r.str("trigger")).unwrap_or(Trigger::Api),
        status: RunStatus::from_str(r.str("status")).unwrap_or(RunStatus::Failed),
        scheduled_at: opt_t("scheduled_at"),
        due_at: from_ms(r.int("due_at")),
        enqueued_at: from_ms(r.int("enqueued_at")),
        started_at: opt_t("started_at"),
        finished_at: opt_t("finished_at"),
        attempt: r.int("attempt").max(1) as u32,
        input: r.json("input"),
        parameters: r.json("parameters"),
        output: r.json("output"),
        error: r.opt_text("error"),
        worker: r.opt_text("worker"),
        idempotency_key: r.opt_text("idempotency_key"),
        root_id: r.text("root_id"),
        retry_of: r.opt_text("retry_of"),
        follow_up: FollowUp::from_stored(r.opt_text("next_run_id")),
        tokens_in: r.opt_int("tokens_in"),
        tokens_out: r.opt_int("tokens_out"),
        cost: r.opt_real("cost"),
        trace_id: r.opt_text("trace_id"),
        requested_by: r.opt_text("requested_by"),
        limit_wait: r
            .opt_text("limit_wait")
            .map(|w| crate::limits::LimitWait { pool: crate::limits::Pool::decode(&w), since: r.opt_int("limit_wait_since").map(from_ms) }),
        pools: crate::limits::from_stored(r.opt_text("limits").as_deref()),
    }
}

/// A claimed run with its snapshot, from a row that selected `job_snapshot` and [`run_cols`].
/// A snapshot that does not parse (a damaged row) reads as none: the run then uses the config
/// in force, as rows from before snapshots do.
pub(crate) fn handed_from_row(r: &impl Record) -> Handed {
    Handed { run: run_from_row(r), snapshot: r.json("job_snapshot"), resumed: r.try_flag("resumed").unwrap_or(false) }
}

pub(crate) fn step_from_row(r: &impl Record) -> StepRecord {
    let opt_t = |c: &str| r.opt_int(c).map(from_ms);
    StepRecord {
        step: r.text("step"),
        // A damaged or newer row reads as a step to run again, not a crash.
        status: StepStatus::from_str(r.str("status")).unwrap_or(StepStatus::Interrupted),
        attempt: r.int("attempt").max(1) as u32,
        run_id: r.text("run_id"),
        started_at: opt_t("started_at"),
        finished_at: opt_t("finished_at"),
        output: r.json("output"),
        error: r.opt_text("error"),
        resumes_on_reject: r.flag("resumes_on_reject"),
    }
}

/// A damaged row (an unknown kind) is left out rather than misread.
pub(crate) fn call_from_row(r: &impl Record) -> Option<CallRecord> {
    let kind = match r.str("kind") {
        "model" => CallKind::Model,
        "tool" => CallKind::Tool,
        _ => return None,
    };
    Some(CallRecord {
        conversation: r.text("conversation"),
        seq: u32::try_from(r.int("seq")).ok()?,
        kind,
        name: r.text("name"),
        call_id: r.opt_text("call_id"),
        request: r.json("request"),
        response: r.json("response"),
        error: r.opt_text("error"),
        input_tokens: u64::try_from(r.int("input_tokens")).unwrap_or(0),
        output_tokens: u64::try_from(r.int("output_tokens")).unwrap_or(0),
        cost: r.opt_real("cost"),
        run_id: r.text("run_id"),
        attempt: r.int("attempt").max(1) as u32,
        started_at: from_ms(r.int("started_at")),
        finished_at: from_ms(r.int("finished_at")),
    })
}

/// Live workers' rows (`SELECT * FROM ll_workers`) and the running runs (`worker`, `id`) as
/// [`WorkerLease`]s.
pub(crate) fn leases_with_runs(leases: &[impl Record], running: &[impl Record]) -> Vec<WorkerLease> {
    let mut by_worker: HashMap<String, Vec<String>> = HashMap::new();
    for r in running {
        by_worker.entry(r.text("worker")).or_default().push(r.text("id"));
    }
    leases
        .iter()
        .map(|r| {
            let name = r.text("name");
            WorkerLease {
                running: by_worker.remove(&name).unwrap_or_default(),
                name,
                host: r.text("host"),
                pid: u32::try_from(r.int("pid")).unwrap_or(0),
                started_at: from_ms(r.int("started_at")),
                heartbeat_at: from_ms(r.int("heartbeat_at")),
                lease_until: from_ms(r.int("lease_until")),
            }
        })
        .collect()
}

/// A batch insert: `INSERT INTO table (cols) … tail` of `rows`, each a value a column of `cols`
/// (name and type, as a row set names them: `text`, `bigint` or `bool`), bound as `s` binds a
/// batch ([`Batch`]). `tail` is already rendered and binds nothing (as a row set, the
/// statement is rendered again, tail and all, which leaves a rendered text as it is).
pub(crate) fn insert_rows<'a>(
    s: &Spelling,
    table: &str,
    cols: &[(&str, &str)],
    rows: Vec<Vec<Arg<'a>>>,
    tail: &str,
    what: &'static str,
) -> Stmt<'a> {
    let names = cols.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", ");
    match s.batch {
        Batch::Values => {
            let text = values(s, &format!("{table} ({names})"), cols.len(), rows.len(), tail);
            rows.into_iter().flatten().fold(Stmt::built(text, what), Stmt::bind)
        }
        Batch::RowSet => {
            debug_assert!(!tail.contains('$'), "a batch's tail binds nothing: {tail}");
            let typed = cols.iter().map(|(c, t)| format!("{c} {t}")).collect::<Vec<_>>().join(", ");
            let text = render(&format!("INSERT INTO {table} ({names}) SELECT {names} FROM {{rows $1 AS j({typed})}} {tail}"), s);
            let mut columns: Vec<Column<'a>> = cols.iter().map(|(c, t)| Column::of(c, t, rows.len())).collect();
            for row in rows {
                // Short, its columns would be read as NULLs to the end: a bug, stopped here.
                assert_eq!(row.len(), cols.len(), "a row of {table} with another number of values than its columns");
                for (col, v) in columns.iter_mut().zip(row) {
                    col.push(v);
                }
            }
            Stmt::built(text, what).bind_rows(columns)
        }
    }
}

/// `INSERT INTO table (cols) VALUES ($1, …), (…), … tail` for `rows` rows of `cols` values,
/// bound in row order ([`Batch::Values`]). `tail` is already rendered and binds nothing. SQLite gets anonymous `?`s: for a numbered one its driver asks SQLite the
/// placeholder's name, which SQLite finds by scanning a list of all of them (a 1,000-run
/// insert, 19,000 placeholders, took 350 ms); anonymous ones are bound in order.
fn values(s: &Spelling, table_and_cols: &str, cols: usize, rows: usize, tail: &str) -> String {
    let numbered = s.param == '$';
    let mut sql = String::with_capacity(table_and_cols.len() + tail.len() + rows * cols * 8);
    sql.push_str("INSERT INTO ");
    sql.push_str(table_and_cols);
    sql.push_str(" VALUES ");
    let mut n = 0;
    for row in 0..rows {
        sql.push_str(if row == 0 { "(" } else { ", (" });
        for col in 0..cols {
            n += 1;
            if col > 0 {
                sql.push_str(", ");
            }
            if numbered {
                sql.push('$');
                sql.push_str(&n.to_string());
            } else {
                sql.push('?');
            }
        }
        sql.push(')');
    }
    sql.push(' ');
    sql.push_str(tail);
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dialect as both backends' words would not spell it, to show every word is replaced.
    const ODD: Spelling = Spelling {
        greatest: "GREATEST",
        lock: "LOCKED",
        lock_skip: "LOCKED SKIP",
        undispatched: "UNDISPATCHED",
        limit_waits: "LIMIT_WAITS",
        in_list: |p| format!("IN LIST({p})"),
        rows: |p, alias, cols| {
            let cols: Vec<String> = cols.iter().map(|(c, t)| format!("{c}:{t}")).collect();
            format!("ROWS({}) {alias}[{}]", p.join(" "), cols.join(" "))
        },
        rows_bind: RowsBind::One,
        batch: Batch::Values,
        by_id: "BY_ID ",
        claim_pick: |which, skip| (format!("PICK({which}, {skip})"), String::new(), "PICKED".into()),
        lease_live: "LIVE",
        notification_seq: "SEQ",
        param: '?',
    };
    const PLAIN: Spelling = Spelling { param: '$', ..ODD };

    #[test]
    fn the_spelled_words_are_replaced() {
        let text = "SELECT id FROM ll_runs {undispatched} WHERE status = {Queued} AND job {in $1} AND n = {greatest}(a, $2) {lock}";
        assert_eq!(
            render(text, &ODD),
            "SELECT id FROM ll_runs UNDISPATCHED WHERE status = 'queued' AND job IN LIST(?1) AND n = GREATEST(a, ?2) LOCKED"
        );
        assert_eq!(render("ORDER BY {notification_seq}", &ODD), "ORDER BY SEQ");
        assert_eq!(
            render("UPDATE t SET a = j.a FROM {rows $1 AS j(id text, a bigint)} WHERE {by_id}t.id = j.id AND n = $2", &ODD),
            "UPDATE t SET a = j.a FROM ROWS(?1) j[id:text a:bigint] WHERE BY_ID t.id = j.id AND n = ?2"
        );
        assert_eq!(render("a = $1", &PLAIN), "a = $1");
    }

    /// A row set bound a column a parameter takes the first column's at its own `$n` and the
    /// others after the statement's own parameters, in the order of the sets' `$n`, as the
    /// backend binds them.
    #[test]
    fn row_sets_bound_by_column_number_their_parameters_after_the_statements_own() {
        let by_column = Spelling { rows_bind: RowsBind::PerColumn, ..PLAIN };
        assert_eq!(
            render("FROM {rows $3 AS k(x text, y bool)}, {rows $1 AS j(id text, a bigint, b text)} WHERE n = $2", &by_column),
            "FROM ROWS($3 $6) k[x:text y:bool], ROWS($1 $4 $5) j[id:text a:bigint b:text] WHERE n = $2"
        );
        assert_eq!(render("FROM {rows $1 AS j(id text, a bigint)} WHERE n = $2", &PLAIN), "FROM ROWS($1) j[id:text a:bigint] WHERE n = $2");
        assert_eq!(
            render(
                "FROM {rows $1 AS j(id text, a bigint)} WHERE n = $2 AND x IN (SELECT id FROM {rows $1 AS k(id text, a bigint)})",
                &by_column
            ),
            "FROM ROWS($1 $3) j[id:text a:bigint] WHERE n = $2 AND x IN (SELECT id FROM ROWS($1 $3) k[id:text a:bigint])",
            "a set read twice is bound once"
        );
    }

    /// A batch as `VALUES` binds its values row by row; as a row set, a column a parameter, in
    /// one text whatever the batch's size (the server prepares and plans it once).
    #[test]
    fn batches_bind_as_the_dialect_binds_a_batch() {
        assert_eq!(
            values(&PLAIN, "t (a, b)", 2, 2, "ON CONFLICT DO NOTHING"),
            "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4) ON CONFLICT DO NOTHING"
        );
        assert_eq!(values(&ODD, "t (a, b)", 2, 2, ""), "INSERT INTO t (a, b) VALUES (?, ?), (?, ?) ");
        let rows = |n: i64| (0..n).map(|i| vec![Arg::from(format!("r{i}")), Arg::from(i)]).collect::<Vec<_>>();
        let cols = [("a", "text"), ("b", "bigint")];
        let q = insert_rows(&PLAIN, "t", &cols, rows(2), "ON CONFLICT DO NOTHING", "w");
        assert_eq!(q.sql.as_str(), "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4) ON CONFLICT DO NOTHING");
        let texts: Vec<String> = q
            .args
            .iter()
            .map(|a| match a {
                Arg::Text(t) => t.as_deref().unwrap_or("").to_owned(),
                a => format!("{a:?}"),
            })
            .collect();
        assert_eq!(texts, ["r0", "Int(Some(0))", "r1", "Int(Some(1))"]);
        let by_column = Spelling { rows_bind: RowsBind::PerColumn, batch: Batch::RowSet, ..PLAIN };
        let (two, three) = (insert_rows(&by_column, "t", &cols, rows(2), "", "w"), insert_rows(&by_column, "t", &cols, rows(3), "", "w"));
        assert_eq!(two.sql.as_str(), "INSERT INTO t (a, b) SELECT a, b FROM ROWS($1 $2) j[a:text b:bigint] ");
        assert_eq!(two.sql.as_str(), three.sql.as_str(), "one text whatever the batch's size");
        match &three.args[..] {
            [Arg::Rows(c)] => match &c[..] {
                [Column::Texts(a), Column::Ints(b)] => {
                    assert_eq!(a.iter().map(|t| t.as_deref().unwrap_or("")).collect::<Vec<_>>(), ["r0", "r1", "r2"]);
                    assert_eq!(b, &[Some(0), Some(1), Some(2)]);
                }
                c => panic!("not a text and a bigint column: {c:?}"),
            },
            a => panic!("not one row set: {a:?}"),
        }
    }

    #[test]
    fn placeholders_are_numbered_as_the_dialect_numbers_them() {
        assert_eq!(numbered("a = $12 AND b = '$.x' AND c = $3", &ODD), "a = ?12 AND b = '$.x' AND c = ?3");
        assert_eq!(numbered("a = $1", &PLAIN), "a = $1");
    }

    /// SQLite prepares a bare `LIMIT ?n` again at every execution; `LIMIT +?n` it does not.
    #[test]
    fn a_bound_limit_is_an_expression_for_sqlite() {
        assert_eq!(numbered("SELECT a FROM t LIMIT $2", &ODD), "SELECT a FROM t LIMIT +?2");
        assert_eq!(numbered("SELECT a FROM t LIMIT $2", &PLAIN), "SELECT a FROM t LIMIT $2");
    }
}
