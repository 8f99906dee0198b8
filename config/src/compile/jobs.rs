//! Compiles `scheduling.jobs`, one job at a time.

use std::collections::BTreeSet;
use std::collections::hash_map::Entry;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;

use super::types::{Deadline, OnMiss};
use super::{
    After, AfterOn, Backoff, CatchUp, Compiler, JobConfig, JsonText, LimitUse, Overlap, Retention, RetryPolicy, Target, Together, duration,
};
use crate::ai::Budget;
use crate::calendar::{self, Calendar};
use crate::diag::{Diagnostic, did_you_mean, quoted_list};
use crate::load::keys;
use crate::raw;
use crate::schedule::Shift;
use crate::schedule::{self, Schedule, ScheduleError, ScheduleSpec};

/// The workflows and agents a job may run, and the limits it may take, by name.
pub(super) struct Runnable<'n> {
    pub(super) workflows: BTreeSet<&'n str>,
    pub(super) agents: BTreeSet<&'n str>,
    pub(super) limits: BTreeSet<&'n str>,
    /// `scheduling.calendars`, resolved (those without errors).
    pub(super) calendars: std::collections::BTreeMap<String, Arc<Calendar>>,
    /// Every name under `scheduling.calendars`, with errors or not.
    pub(super) calendar_names: BTreeSet<String>,
    /// `scheduling.deadline`: the deadline of a job that sets none.
    pub(super) deadline: Option<Deadline>,
}

impl<'n> Runnable<'n> {
    pub(super) fn of<W, A>(workflows: impl IntoIterator<Item = &'n W>, agents: impl IntoIterator<Item = &'n A>) -> Self
    where
        W: AsRef<str> + ?Sized + 'n,
        A: AsRef<str> + ?Sized + 'n,
    {
        Self {
            workflows: workflows.into_iter().map(AsRef::as_ref).collect(),
            agents: agents.into_iter().map(AsRef::as_ref).collect(),
            limits: BTreeSet::new(),
            calendars: std::collections::BTreeMap::new(),
            calendar_names: BTreeSet::new(),
            deadline: None,
        }
    }

    /// With `scheduling.deadline`.
    pub(super) fn with_deadline(mut self, deadline: Option<Deadline>) -> Self {
        self.deadline = deadline;
        self
    }

    /// With `scheduling.calendars` (`named`: every name written there, also those with errors).
    pub(super) fn with_calendars(
        mut self,
        calendars: &std::collections::BTreeMap<String, Arc<Calendar>>,
        named: impl IntoIterator<Item = String>,
    ) -> Self {
        self.calendars = calendars.clone();
        self.calendar_names = named.into_iter().chain(calendars.keys().cloned()).collect();
        self
    }

    /// With the names of `scheduling.limits`.
    pub(super) fn with_limits(mut self, limits: impl IntoIterator<Item = &'n String>) -> Self {
        self.limits = limits.into_iter().map(String::as_str).collect();
        self
    }
}

/// Job names runs without a job are listed under (`workflow:NAME` for a workflow run by hand,
/// …), with whose runs they are: refused as the start of a job's name.
pub const RESERVED_JOB_PREFIXES: &[(&str, &str)] = &[
    ("workflow:", "runs of workflows started by hand"),
    ("agent:", "runs of agents started by hand or by notifications"),
    ("pipeline:", "runs of pipelines started by hand"),
    ("group-chat:", "group chats started by hand"),
    ("plugin:", "runs of plugin actions started by notifications"),
];

/// The reserved prefix `name` starts with, and whose runs it lists.
pub fn reserved_prefix(name: &str) -> Option<(&'static str, &'static str)> {
    RESERVED_JOB_PREFIXES.iter().copied().find(|(p, _)| name.starts_with(p))
}

impl Compiler<'_> {
    /// `scheduling.limits`: each a plain name (as a tag is) with at least one slot.
    pub(super) fn limits(&mut self, raw: Option<&std::collections::BTreeMap<String, u32>>) -> std::collections::BTreeMap<String, u32> {
        let mut out = std::collections::BTreeMap::new();
        for (name, &n) in raw.into_iter().flatten() {
            if let Err(e) = check_tag(name) {
                self.err(&["scheduling", "limits", name], format!("limit name {e}"));
            } else if n == 0 {
                self.err(
                    &["scheduling", "limits", name],
                    format!("limit \"{name}\" has 0 slots, so no run that takes it could ever start; give it 1 or more, or pause its jobs"),
                );
            } else {
                out.insert(name.clone(), n);
            }
        }
        out
    }

    /// `scheduling.calendars`, resolved: every problem of every calendar told, located.
    pub(super) fn calendars(
        &mut self,
        raw: Option<&std::collections::BTreeMap<String, raw::CalendarDef>>,
        cwd: &Path,
    ) -> std::collections::BTreeMap<String, Arc<Calendar>> {
        let mut written = std::collections::BTreeMap::new();
        for (name, def) in raw.into_iter().flatten() {
            if let Err(e) = check_tag(name) {
                self.err(&["scheduling", "calendars", name], format!("calendar name {e}"));
                continue;
            }
            let ics = match &def.ics {
                None => None,
                Some(file) => match self.ics_days(name, file, cwd) {
                    Some(days) => Some(days),
                    None => continue,
                },
            };
            fn list(v: &Option<Vec<String>>) -> &[String] {
                v.as_deref().unwrap_or(&[])
            }
            let (weekdays, dates, except) = (list(&def.weekdays), list(&def.dates), list(&def.except));
            written.insert(name.clone(), calendar::Written { weekdays, dates, except, ics });
        }
        let (calendars, problems) = calendar::resolve(&written);
        for pr in problems {
            let mut path: Vec<&str> = vec!["scheduling", "calendars", &pr.calendar];
            path.extend(pr.field.iter().map(String::as_str));
            self.err(&path, pr.message);
        }
        calendars
    }

    /// A `deadline:` (a job's, or `scheduling.deadline`) read at `path`; `None` once its
    /// mistakes are told (each field's).
    pub(super) fn deadline(&mut self, path: &[&str], whose: &str, d: &raw::DeadlineDef) -> Option<Deadline> {
        let mut ok = true;
        let mut at = |this: &mut Self, field: &str, message: String| {
            let mut p = path.to_vec();
            p.push(field);
            this.err(&p, format!("{whose}: deadline {field} {message}"));
            ok = false;
        };
        let mut within = |this: &mut Self, field: &'static str, v: &Option<String>| -> Option<Duration> {
            match duration(v.as_deref()?) {
                Ok(d) if d.is_zero() => {
                    at(this, field, "is 0, which every run misses; give a duration such as \"5m\", or leave it out".into());
                    None
                }
                Ok(d) => Some(d),
                Err(e) => {
                    at(this, field, e);
                    None
                }
            }
        };
        let start_within = within(self, "start_within", &d.start_within);
        let finish_within = within(self, "finish_within", &d.finish_within);
        let finish_by = match d.finish_by.as_deref() {
            None => None,
            Some(t) => match chrono::NaiveTime::parse_from_str(t.trim(), "%H:%M") {
                Ok(t) => Some(t),
                Err(_) => {
                    at(self, "finish_by", format!("\"{t}\" is not a local time of day; write it as \"HH:MM\", e.g. \"06:00\""));
                    None
                }
            },
        };
        let on_miss = match d.on_miss.as_deref() {
            None | Some("notify") => OnMiss::Notify,
            Some("cancel") if d.finish_within.is_none() && d.finish_by.is_none() => {
                at(
                    self,
                    "on_miss",
                    "cancel stops a run past finish_within or finish_by, and this deadline has neither; add one, or write on_miss: notify"
                        .into(),
                );
                OnMiss::Notify
            }
            Some("cancel") => OnMiss::Cancel,
            Some(o) => {
                at(self, "on_miss", format!("\"{o}\" is not notify or cancel{}", did_you_mean(o, ["notify", "cancel"])));
                OnMiss::Notify
            }
        };
        ok.then_some(Deadline { start_within, finish_within, finish_by, on_miss })
    }

    /// The days of calendar `name`'s iCalendar `file` (relative to `cwd`); `None` once a
    /// mistake is told, on the file's line when it is in the file.
    fn ics_days(&mut self, name: &str, file: &str, cwd: &Path) -> Option<Arc<std::collections::BTreeMap<chrono::NaiveDate, String>>> {
        let path = cwd.join(file);
        let here = ["scheduling", "calendars", name, "ics"];
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                self.err(
                    &here,
                    format!(
                        "calendar \"{name}\": ics file {} cannot be read ({e}); the path is relative to the config's folder",
                        path.display()
                    ),
                );
                return None;
            }
        };
        match crate::ics::days(&text) {
            Ok(days) => Some(Arc::new(days)),
            Err(e) => {
                let at = crate::Location { file: path.clone(), line: e.line, col: 1 };
                self.diags.push(Diagnostic::error(Some(at), format!("calendar \"{name}\": ics file {}: {}", path.display(), e.message)));
                // Where the config names the file, too, so both places are found.
                self.err(&here, format!("calendar \"{name}\": ics file {} has a mistake on line {} (told there)", path.display(), e.line));
                None
            }
        }
    }

    pub(super) fn job(
        &mut self,
        name: &str,
        j: &mut raw::Job,
        runnable: &Runnable<'_>,
        default_tz: (&String, &Result<Tz, ScheduleError>),
        cwd: &Path,
    ) -> Option<JobConfig> {
        let p = |k: &'static str| ["scheduling", "jobs", name, k];
        let mut ok = true;
        if let Some((prefix, whose)) = reserved_prefix(name) {
            let loc = self.loaded.sources.locate(&keys(&["scheduling", "jobs", name]));
            self.diags.push(Diagnostic::error(
                loc,
                format!("job \"{name}\": job names cannot start with \"{prefix}\" ({whose} are listed under it); rename the job"),
            ));
            ok = false;
        }
        let (workflows, agents) = (&runnable.workflows, &runnable.agents);
        let kind = j.kind.clone().or_else(|| {
            // Infer the type from the one target field given.
            match (&j.workflow, &j.agent, &j.plugin) {
                (Some(_), None, None) => Some("workflow".into()),
                (None, Some(_), None) => Some("agent".into()),
                (None, None, Some(_)) => Some("plugin".into()),
                _ => None,
            }
        });
        let target = match kind.as_deref() {
            Some("workflow") => match &j.workflow {
                Some(w) if workflows.contains(w.as_str()) => Some(Target::Workflow(w.clone())),
                Some(w) => {
                    let hint = did_you_mean(w, workflows.iter().copied());
                    self.err(
                        &p("workflow"),
                        format!(
                            "job \"{name}\" runs workflow \"{w}\", which is not defined{hint} (defined workflows: {})",
                            quoted_list(workflows.iter().copied())
                        ),
                    );
                    None
                }
                None => {
                    self.err(&p("type"), format!("job \"{name}\" is of type workflow but names no \"workflow\""));
                    None
                }
            },
            Some("agent") => match &j.agent {
                Some(a) if agents.contains(a.as_str()) => Some(Target::Agent(a.clone())),
                Some(a) => {
                    let hint = did_you_mean(a, agents.iter().copied());
                    self.err(
                        &p("agent"),
                        format!(
                            "job \"{name}\" runs agent \"{a}\", which is not defined{hint} (defined agents: {})",
                            quoted_list(agents.iter().copied())
                        ),
                    );
                    None
                }
                None => {
                    self.err(&p("type"), format!("job \"{name}\" is of type agent but names no \"agent\""));
                    None
                }
            },
            Some("plugin") => match (&j.plugin, &j.action) {
                (Some(plugin), Some(action)) => Some(Target::Plugin { plugin: plugin.clone(), action: action.clone() }),
                (Some(plugin), None) => match plugin.split_once('.') {
                    Some((pl, ac)) => Some(Target::Plugin { plugin: pl.into(), action: ac.into() }),
                    None => {
                        self.err(&p("plugin"), format!("job \"{name}\" runs plugin \"{plugin}\" but names no \"action\""));
                        None
                    }
                },
                _ => {
                    self.err(&p("type"), format!("job \"{name}\" is of type plugin but names no \"plugin\""));
                    None
                }
            },
            Some(other) => {
                let hint = did_you_mean(other, ["workflow", "agent", "plugin"]);
                self.err(&p("type"), format!("job \"{name}\" has unknown type \"{other}\"{hint}; use workflow, agent or plugin"));
                None
            }
            None => {
                self.err(
                    &["scheduling", "jobs", name],
                    format!("job \"{name}\" needs \"type\" (workflow, agent or plugin) and its target"),
                );
                None
            }
        };
        ok &= target.is_some();
        let schedules: Vec<ScheduleSpec> =
            [j.cron.clone().map(ScheduleSpec::Cron), j.every.clone().map(ScheduleSpec::Every), j.at.clone().map(ScheduleSpec::At)]
                .into_iter()
                .flatten()
                .collect();
        if schedules.len() > 1 {
            self.err(&["scheduling", "jobs", name], format!("job \"{name}\" sets more than one of cron, every, at; keep one"));
            ok = false;
        }
        let (timezone, tz) = match &j.timezone {
            None => (default_tz.0.clone(), default_tz.1.clone()),
            Some(own) => {
                let tz = schedule::parse_tz(own);
                if let Err(e) = &tz {
                    self.err(&p("timezone"), format!("job \"{name}\": {e}"));
                    ok = false;
                }
                (own.clone(), tz)
            }
        };
        let mut dur = |this: &mut Self, k: &'static str, v: &Option<String>| -> Option<Duration> {
            let s = v.as_ref()?;
            match duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    this.err(&p(k), format!("job \"{name}\": {k} {e}"));
                    ok = false;
                    None
                }
            }
        };
        let catch_up_window = dur(self, "catch_up_window", &j.catch_up_window).unwrap_or(Duration::from_secs(24 * 3600));
        let timeout = dur(self, "timeout", &j.timeout);
        let jitter = dur(self, "jitter", &j.jitter);
        let catch_up = match j.catch_up.as_deref() {
            None | Some("latest") => CatchUp::Latest,
            Some("skip") => CatchUp::Skip,
            Some("all") => CatchUp::All,
            Some(o) => {
                self.err(
                    &p("catch_up"),
                    format!(
                        "job \"{name}\": catch_up \"{o}\" is not one of skip, latest, all{}",
                        did_you_mean(o, ["skip", "latest", "all"])
                    ),
                );
                ok = false;
                CatchUp::Latest
            }
        };
        let overlap = match j.overlap.as_deref() {
            None | Some("forbid") => Overlap::Forbid,
            Some("allow") => Overlap::Allow,
            Some("replace") => Overlap::Replace,
            Some("queue") => Overlap::Queue,
            Some(o) => {
                self.err(
                    &p("overlap"),
                    format!(
                        "job \"{name}\": overlap \"{o}\" is not one of forbid, allow, replace, queue{}",
                        did_you_mean(o, ["forbid", "allow", "replace", "queue"])
                    ),
                );
                ok = false;
                Overlap::Forbid
            }
        };
        let retries = match &j.retries {
            None => RetryPolicy::default(),
            Some(r) => {
                let rp = |k: &'static str| ["scheduling", "jobs", name, "retries", k];
                let mut d = |this: &mut Self, k: &'static str, v: &Option<String>, dflt: u64| match v {
                    None => Duration::from_secs(dflt),
                    Some(s) => duration(s).unwrap_or_else(|e| {
                        this.err(&rp(k), format!("job \"{name}\": retries.{k} {e}"));
                        ok = false;
                        Duration::from_secs(dflt)
                    }),
                };
                let initial = d(self, "initial", &r.initial, 60);
                let max_delay = d(self, "max_delay", &r.max_delay, 3600);
                let backoff = match r.backoff.as_deref() {
                    None | Some("exponential") => Backoff::Exponential { initial, max_delay },
                    Some("fixed") => Backoff::Fixed(initial),
                    Some(o) => {
                        self.err(&rp("backoff"), format!("job \"{name}\": retries.backoff \"{o}\" is not one of exponential, fixed"));
                        ok = false;
                        Backoff::Fixed(initial)
                    }
                };
                RetryPolicy { max: r.max.unwrap_or(3), backoff }
            }
        };
        let retention = match &j.retention {
            None => Retention { max_runs: Some(100), max_age: None },
            Some(r) => {
                let max_age = match &r.max_age {
                    None => None,
                    Some(s) => match duration(s) {
                        Ok(d) => Some(d),
                        Err(e) => {
                            self.err(
                                &["scheduling", "jobs", name, "retention", "max_age"],
                                format!("job \"{name}\": retention.max_age {e}"),
                            );
                            ok = false;
                            None
                        }
                    },
                };
                Retention { max_runs: r.max_runs, max_age }
            }
        };
        // Every error at once, the schedule's too, read in UTC when the job's own zone is wrong
        // (that error is reported already). A job whose only error is its schedule is still
        // returned, without a schedule, so the checks after compiling (plugin actions) report
        // theirs too.
        let zone = if ok { tz.clone() } else { Ok(tz.clone().unwrap_or(Tz::UTC)) };
        let has_schedule = !schedules.is_empty();
        let schedule = schedules.into_iter().next().and_then(|spec| {
            let field = spec.field();
            // Looked up by the spec itself (copied only to build a new schedule): a million
            // jobs, a few hundred thousand schedules.
            let (vacant, spec) = match zone.as_ref() {
                Ok(tz) => match self.schedules.entry((spec, *tz)) {
                    Entry::Occupied(shared) => return Some(shared.get().clone()),
                    Entry::Vacant(vacant) => {
                        let spec = vacant.key().0.clone();
                        (Some(vacant), spec)
                    }
                },
                Err(_) => (None, spec),
            };
            match Schedule::build(spec, &zone) {
                Ok(s) => {
                    let s = Arc::new(s);
                    if let Some(vacant) = vacant {
                        vacant.insert(s.clone());
                    }
                    Some(s)
                }
                Err(e) => {
                    self.err(&p(field), format!("job \"{name}\": {e}"));
                    None
                }
            }
        });
        let calendar_shape = || {
            format!(
                "job \"{name}\": calendar must be a name of scheduling.calendars (calendar: NAME), or {{name: NAME, shift: previous | next}}"
            )
        };
        let calendar = match &j.calendar {
            None => None,
            Some(serde_json::Value::String(name)) => Some((name.clone(), Shift::Skip)),
            Some(serde_json::Value::Object(o)) => {
                let shift = match o.get("shift") {
                    None => Some(Shift::Skip),
                    Some(serde_json::Value::String(s)) if s == "previous" => Some(Shift::Previous),
                    Some(serde_json::Value::String(s)) if s == "next" => Some(Shift::Next),
                    Some(other) => {
                        self.err(
                            &["scheduling", "jobs", name, "calendar", "shift"],
                            format!("job \"{name}\": calendar shift {other} is not previous or next; write shift: previous (a fire on a day off the calendar fires on the calendar's day before) or shift: next (on its day after), or leave shift out to skip it"),
                        );
                        None
                    }
                };
                let unknown: Vec<&String> = o.keys().filter(|k| *k != "name" && *k != "shift").collect();
                match (o.get("name"), shift, unknown.first()) {
                    (_, _, Some(k)) => {
                        self.err(
                            &["scheduling", "jobs", name, "calendar", k.as_str()],
                            format!("job \"{name}\": calendar has no field \"{k}\"; it takes name and shift"),
                        );
                        return None;
                    }
                    (Some(serde_json::Value::String(n)), Some(shift), None) => Some((n.clone(), shift)),
                    (_, None, None) => return None,
                    _ => {
                        self.err(&p("calendar"), calendar_shape());
                        return None;
                    }
                }
            }
            Some(_) => {
                self.err(&p("calendar"), calendar_shape());
                return None;
            }
        };
        let schedule = match (&calendar, schedule) {
            (None, schedule) => schedule,
            (Some((cal, shift)), schedule) => match (runnable.calendars.get(cal), schedule, &tz) {
                (None, ..) if runnable.calendar_names.contains(cal) => {
                    self.err(&p("calendar"), format!("job \"{name}\": calendar \"{cal}\" cannot be used: it has errors of its own"));
                    ok = false;
                    None
                }
                (None, ..) => {
                    let hint = crate::diag::did_you_mean(cal, runnable.calendar_names.iter().map(String::as_str));
                    let known = crate::diag::quoted_list(runnable.calendar_names.iter().map(String::as_str));
                    self.err(
                        &p("calendar"),
                        format!("job \"{name}\": calendar \"{cal}\" is not one of scheduling.calendars{hint} (defined calendars: {known})"),
                    );
                    ok = false;
                    None
                }
                (Some(_), None, _) if !has_schedule => {
                    self.err(
                        &p("calendar"),
                        format!("job \"{name}\": a calendar keeps the days a schedule fires on, and this job has none; add cron, every or at, or remove calendar"),
                    );
                    ok = false;
                    None
                }
                (Some(c), Some(s), Ok(zone)) => Some(Arc::new((*s).clone().on_calendar(c.clone(), *zone, *shift))),
                (Some(_), s, _) => s,
            },
        };
        if !ok {
            return None;
        }
        let budget =
            Some(self.budget(&["scheduling", "jobs", name, "budget"], j.budget.as_ref())).filter(|b| *b != Budget::default()).map(Box::new);
        let notify = match &j.notify {
            None => None,
            Some(rules) => Some(self.notify(&p("notify"), &format!("job \"{name}\""), rules, runnable)?),
        };
        let mut tags: Vec<String> = Vec::new();
        for (i, tag) in j.tags.iter().flatten().enumerate() {
            match check_tag(tag) {
                Ok(()) if !tags.contains(tag) => tags.push(tag.clone()),
                Ok(()) => {}
                Err(e) => {
                    let at = i.to_string();
                    self.err(&["scheduling", "jobs", name, "tags", &at], format!("job \"{name}\": tag {e}"));
                    return None;
                }
            }
        }
        let after = match &j.after {
            None => None,
            Some(value) => match read_after(name, value) {
                Ok(after) => Some(after),
                Err(e) => {
                    self.err(&p("after"), format!("job \"{name}\": after {e}"));
                    return None;
                }
            },
        };
        let limits = match &j.limits {
            None => Vec::new(),
            Some(value) => match read_limits(&format!("job \"{name}\""), value, &runnable.limits) {
                Ok(limits) => limits,
                Err(e) => {
                    self.err(&p("limits"), format!("job \"{name}\": limits {e}"));
                    return None;
                }
            },
        };
        let deadline = match &j.deadline {
            Some(d) => Some(self.deadline(&["scheduling", "jobs", name, "deadline"], &format!("job \"{name}\""), d)?),
            None => runnable.deadline,
        };
        let together = (!tags.is_empty() || after.is_some() || !limits.is_empty() || deadline.is_some())
            .then(|| Box::new(Together { tags, after, limits, deadline }));
        Some(JobConfig {
            name: name.to_string(),
            description: j.description.clone(),
            target: target?,
            input: j.input.take().map(Box::new),
            parameters: j.parameters.take().map(|p| JsonText::new(&p)),
            schedule,
            timezone,
            enabled: j.enabled.unwrap_or(true),
            catch_up,
            catch_up_window,
            overlap,
            retries,
            timeout,
            jitter,
            retention,
            working_directory: j.working_directory.as_ref().map(|w| cwd.join(w)),
            allowed_commands: j.allowed_commands.clone().unwrap_or_default().into(),
            budget,
            notify,
            together,
        })
    }
}

/// Jobs by name, as `after`'s checks read them: a map of the files' jobs, or a worker's jobs in
/// force (the files' and the runtime ones, kept apart).
pub trait JobsByName {
    fn job(&self, name: &str) -> Option<&JobConfig>;
    /// Every name, for a did-you-mean.
    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_>;
}

impl JobsByName for std::collections::BTreeMap<String, JobConfig> {
    fn job(&self, name: &str) -> Option<&JobConfig> {
        self.get(name)
    }

    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.keys().map(String::as_str))
    }
}

/// What is wrong with the `after` of `jobs` taken together: a job named that is not among them
/// (with a did-you-mean), and every job on a cycle (each with a way round it).
/// `(job, message)`, in job order.
pub fn after_problems(jobs: &std::collections::BTreeMap<String, JobConfig>) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for (name, job) in jobs {
        let Some(after) = job.after() else { continue };
        problems.extend(after_mistakes(name, after, jobs).into_iter().map(|m| (name.clone(), format!("job \"{name}\": after {m}"))));
    }
    problems
}

/// What is wrong with job `name` running `after`, among `jobs` as they would be with it so
/// (its own entry there, if any, is not read): each job named that is not defined (with a
/// did-you-mean), and a cycle through it (with a way round), each as the rest of a sentence
/// after "after " (`names job "x", which is not defined`).
pub fn after_mistakes<J: JobsByName + ?Sized>(name: &str, after: &After, jobs: &J) -> Vec<String> {
    let mut mistakes = Vec::new();
    for up in after.jobs.iter().filter(|up| jobs.job(up).is_none()) {
        let close = did_you_mean(up, jobs.names().filter(|k| *k != name));
        mistakes.push(format!("names job \"{up}\", which is not defined{close}"));
    }
    let upstream = |job: &str| -> &[String] {
        if job == name { &after.jobs } else { jobs.job(job).and_then(JobConfig::after).map(|a| a.jobs.as_slice()).unwrap_or_default() }
    };
    // A search up from it, each job visited once, remembering where it came from: reaching
    // itself again is a cycle.
    let mut came_from: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut stack: Vec<&str> = vec![name];
    while let Some(at) = stack.pop() {
        for up in upstream(at) {
            if up == name {
                let mut steps = vec![at];
                while let Some(&back) = came_from.get(steps[steps.len() - 1]) {
                    steps.push(back);
                }
                steps.reverse();
                steps.push(name);
                mistakes.push(format!("makes a cycle: {}", steps.join(" → ")));
                return mistakes;
            }
            if !came_from.contains_key(up.as_str()) {
                came_from.insert(up.as_str(), at);
                stack.push(up.as_str());
            }
        }
    }
    mistakes
}

/// `after:` as written: a list of job names, or `{jobs, on, within}`; each error names what
/// to write.
fn read_after(name: &str, value: &serde_json::Value) -> Result<After, String> {
    use serde_json::Value;
    let names = |v: &Value, field: &str| -> Result<Vec<String>, String> {
        let list = v.as_array().ok_or_else(|| format!("{field}must be a list of job names, e.g. [extract]"))?;
        let mut jobs: Vec<String> = Vec::new();
        for item in list {
            let job = item.as_str().ok_or_else(|| format!("{field}must be a list of job names; {item} is not a name"))?;
            if job == name {
                return Err(format!("{field}names the job itself"));
            }
            if !jobs.iter().any(|j| j == job) {
                jobs.push(job.to_owned());
            }
        }
        if jobs.is_empty() {
            return Err(format!("{field}names no job; name at least one, e.g. [extract]"));
        }
        Ok(jobs)
    };
    match value {
        Value::Array(_) => Ok(After { jobs: names(value, "")?, on: AfterOn::Success, within: None }),
        Value::Object(map) => {
            if let Some(key) = map.keys().find(|k| !matches!(k.as_str(), "jobs" | "on" | "within")) {
                return Err(format!(
                    "has an unknown key \"{key}\"{}; it takes jobs, on and within",
                    crate::diag::did_you_mean(key, ["jobs", "on", "within"])
                ));
            }
            let jobs = names(map.get("jobs").ok_or("needs `jobs`: the jobs it runs after, e.g. {jobs: [a, b]}")?, "jobs ")?;
            let on = match map.get("on").map(|v| v.as_str()) {
                None | Some(Some("success")) => AfterOn::Success,
                Some(Some("failure")) => AfterOn::Failure,
                Some(Some("finished")) => AfterOn::Finished,
                Some(Some(other)) => {
                    return Err(format!(
                        "on \"{other}\" is not one of success, failure, finished{}",
                        crate::diag::did_you_mean(other, ["success", "failure", "finished"])
                    ));
                }
                Some(None) => return Err("on must be one of success, failure, finished".into()),
            };
            let within = match map.get("within") {
                None => None,
                Some(Value::String(s)) => Some(duration(s).map_err(|e| format!("within {e}"))?),
                Some(other) => return Err(format!("within {other} is not a duration; write e.g. \"12h\"")),
            };
            if within == Some(Duration::ZERO) {
                return Err("within must be longer than 0s".into());
            }
            Ok(After { jobs, on, within })
        }
        other => Err(format!("{other} must be a list of job names ([extract]) or {{jobs: [a, b], on: success, within: 12h}}")),
    }
}

/// `limits:` as written: names of `scheduling.limits` (`known`), or `{name, key}` with a key
/// template over the run's input; each error names what to write.
pub(super) fn read_limits(holder: &str, value: &serde_json::Value, known: &BTreeSet<&str>) -> Result<Vec<LimitUse>, String> {
    use serde_json::Value;
    let list = value.as_array().ok_or("must be a list of limit names, e.g. [warehouse] or [{name: tenant, key: \"${input.tenant}\"}]")?;
    let mut out: Vec<LimitUse> = Vec::new();
    for item in list {
        let (name, key) = match item {
            Value::String(name) => (name.clone(), None),
            Value::Object(map) => {
                if let Some(k) = map.keys().find(|k| !matches!(k.as_str(), "name" | "key")) {
                    return Err(format!(
                        "has an unknown key \"{k}\"{}; an entry takes name and key",
                        crate::diag::did_you_mean(k, ["name", "key"])
                    ));
                }
                let name = map
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("entry {item} needs `name`: a limit of scheduling.limits"))?;
                let key = match map.get("key") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(k)) => Some(check_limit_key(k)?),
                    Some(other) => return Err(format!("key {other} must be a template over the input, e.g. \"${{input.tenant}}\"")),
                };
                (name.to_owned(), key)
            }
            other => return Err(format!("entry {other} must be a limit's name or {{name, key}}")),
        };
        if !known.contains(name.as_str()) {
            let close = did_you_mean(&name, known.iter().copied());
            return Err(format!(
                "names limit \"{name}\", which scheduling.limits does not define{close} (defined limits: {})",
                quoted_list(known.iter().copied())
            ));
        }
        if out.iter().any(|l| l.name == name) {
            return Err(format!("names limit \"{name}\" twice; {holder} holds one slot of each limit"));
        }
        out.push(LimitUse { name, key });
    }
    Ok(out)
}

/// A limit's key is a template over the run's input only (`${input}`, `${input.a.b}`): a run's
/// key is known when it is queued, before anything runs.
fn check_limit_key(key: &str) -> Result<String, String> {
    let template = crate::Template::parse(key);
    if template.vars().next().is_none() {
        return Err(format!(
            "key \"{key}\" names nothing of the input, so every run has the same key; write e.g. \"${{input.tenant}}\", or leave the key out"
        ));
    }
    let other = template.parts().iter().find_map(|p| match p {
        crate::Part::Ref { var, text } if !matches!(var, crate::Var::Input(_)) => Some(text),
        _ => None,
    });
    if let Some(other) = other {
        return Err(format!("key \"{key}\" uses {other}; a limit's key may only use the run's input (${{input}}, ${{input.tenant}})"));
    }
    Ok(key.to_owned())
}

/// A tag is a plain name: letters, digits, `-`, `_`, `.` and `/`, 1–64 characters.
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > 64 {
        return Err(format!("{tag:?} must have 1–64 characters"));
    }
    match tag.chars().find(|c| !(c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))) {
        Some(c) => Err(format!("{tag:?} has {c:?}; a tag has letters, digits, -, _, . and / only")),
        None => Ok(()),
    }
}
