//! Compiles `workflows` (steps, templates, step references) and `pipelines`.

use std::collections::{BTreeMap, BTreeSet};

use super::jobs::read_limits;
use super::{Compiler, duration};
use crate::ai::Pipeline;
use crate::diag::{Diagnostic, Severity, did_you_mean, quoted_list};
use crate::load::keys;
use crate::raw;
use crate::template::{Template, Templated, Var};
use crate::workflow::{Decision, Step, StepKind, StepType, Workflow};
use crate::yaml::{Seg, YamlPath};

impl Compiler<'_> {
    /// Workflows with their steps typed and templates parsed. A workflow with an error is left
    /// out (the config then fails to load, so only partial configs see the difference).
    /// `limits`: the names of `scheduling.limits`, which steps may take.
    pub(super) fn workflows(&mut self, limits: &BTreeSet<&str>) -> BTreeMap<String, Workflow> {
        let agents: Vec<String> = self.loaded.raw.agents.as_ref().map(|a| a.keys().cloned().collect()).unwrap_or_default();
        let workflows = self.loaded.raw.workflows.clone().unwrap_or_default();
        let mut out = BTreeMap::new();
        for (wname, wf) in workflows {
            self.name_matches_key("workflows", &wname, wf.name.as_deref());
            let errors_before = self.diags.len();
            let mut ids: Vec<String> = Vec::new();
            let base = keys(&["workflows", &wname, "steps"]);
            let steps = self.steps(&wname, &wf.steps, &base, (&agents, limits), &mut ids);
            if wf.steps.is_empty() {
                self.err(&["workflows", &wname, "steps"], format!("workflow \"{wname}\" has no steps"));
            }
            // `then`/`else` must name steps of the same workflow.
            collect_refs(&wf.steps, &mut |sid, target| {
                if !ids.iter().any(|i| i == target) {
                    let hint = did_you_mean(target, ids.iter().map(String::as_str));
                    self.diags.push(Diagnostic::error(
                        self.loaded.sources.locate(&keys(&["workflows", &wname])),
                        format!("workflow \"{wname}\": step \"{sid}\" names step \"{target}\", which does not exist{hint}"),
                    ));
                }
            });
            if self.diags[errors_before..].iter().all(|d| d.severity != Severity::Error) {
                let all: Vec<String> = steps.iter().flat_map(Step::walk).map(|s| s.id.clone()).collect();
                let mut done = Vec::new();
                for (i, step) in steps.iter().enumerate() {
                    self.step_refs(&wname, step, &at_index(&base, i), &mut done, &all);
                }
                let workflow = Workflow { name: wname.clone(), description: wf.description, trigger: wf.trigger, steps };
                out.insert(wname, workflow);
            }
        }
        out
    }

    /// Warns about `${steps.<id>.output}` references in `step` that cannot resolve when it runs:
    /// to a step that does not exist, or to one that has not finished by then (it comes later,
    /// or runs alongside in the same `parallel`). Such a reference stays as written at run time.
    /// `done`: the steps finished before this one; it gains `step` and its children.
    fn step_refs(&mut self, wname: &str, step: &Step, path: &YamlPath, done: &mut Vec<String>, all: &[String]) {
        let mut vars: Vec<&Var> = step.when.iter().flat_map(Template::vars).collect();
        match &step.kind {
            StepKind::Agent { input, .. } | StepKind::Approval { input, .. } | StepKind::GroupChat { input, .. } => {
                vars.extend(input.iter().flat_map(Templated::vars));
            }
            StepKind::Plugin { input, parameters, .. } => {
                vars.extend(input.iter().chain(parameters).flat_map(Templated::vars));
            }
            StepKind::Condition { condition, .. } => vars.extend(condition.vars()),
            StepKind::Parallel { .. } => {}
        }
        let mut seen: Vec<&str> = Vec::new();
        for var in vars {
            let Var::StepOutput { step: target, .. } = var else { continue };
            if seen.contains(&target.as_str()) {
                continue;
            }
            seen.push(target);
            let why = if !all.contains(target) {
                let hint = did_you_mean(target, all.iter().map(String::as_str));
                format!("step \"{target}\" does not exist{hint}")
            } else if *target == step.id {
                "a step cannot use its own output".to_string()
            } else if !done.contains(target) {
                format!("step \"{target}\" has not finished when \"{}\" runs (it comes later, or runs alongside it)", step.id)
            } else {
                continue;
            };
            self.diags.push(Diagnostic::warning(
                self.loaded.sources.locate(path),
                format!("workflow \"{wname}\": step \"{}\" uses ${{steps.{target}.output}}, but {why}; it will stay as written", step.id),
            ));
        }
        if let StepKind::Parallel { steps } = &step.kind {
            // Children see what finished before the parallel step, not each other.
            let before = done.clone();
            let mut children_path = path.clone();
            children_path.push(Seg::Key("steps".into()));
            for (i, child) in steps.iter().enumerate() {
                let mut d = before.clone();
                self.step_refs(wname, child, &at_index(&children_path, i), &mut d, all);
            }
            done.extend(step.walk().iter().map(|s| s.id.clone()));
        } else {
            done.push(step.id.clone());
        }
    }

    /// The steps that are valid, in order; every error is reported on the way.
    /// `known`: the agents and the limits defined.
    fn steps(
        &mut self,
        wname: &str,
        steps: &[raw::Step],
        base: &YamlPath,
        known: (&[String], &BTreeSet<&str>),
        ids: &mut Vec<String>,
    ) -> Vec<Step> {
        let (agents, limits) = known;
        let mut out = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let mut path = base.clone();
            path.push(Seg::Index(i));
            let at = |p: &YamlPath, k: &str| {
                let mut p = p.clone();
                p.push(Seg::Key(k.into()));
                p
            };
            if ids.contains(&s.id) {
                let loc = self.loaded.sources.locate(&at(&path, "id"));
                self.diags.push(Diagnostic::error(
                    loc,
                    format!("workflow \"{wname}\": step id \"{}\" is used twice; step ids must be unique", s.id),
                ));
            }
            if s.id.contains(':') || s.id.is_empty() {
                let loc = self.loaded.sources.locate(&at(&path, "id"));
                self.diags.push(Diagnostic::error(
                    loc,
                    format!("workflow \"{wname}\": step id \"{}\" must be non-empty and without \":\" (reserved for agent waits)", s.id),
                ));
            }
            ids.push(s.id.clone());
            let need = |field: &str, v: &Option<String>, this: &mut Self| -> Option<String> {
                if v.is_none() {
                    let loc = this.loaded.sources.locate(&path);
                    this.diags.push(Diagnostic::error(
                        loc,
                        format!("workflow \"{wname}\": step \"{}\" of type {} needs \"{field}\"", s.id, s.kind),
                    ));
                }
                v.clone()
            };
            let templated = |v: &Option<raw::Any>| v.as_ref().map(Templated::parse);
            let kind = match StepType::parse(&s.kind) {
                Some(StepType::Agent) => {
                    let agent = need("agent", &s.agent, self);
                    if let Some(a) = &agent
                        && !agents.contains(a)
                    {
                        let hint = did_you_mean(a, agents.iter().map(String::as_str));
                        let loc = self.loaded.sources.locate(&at(&path, "agent"));
                        self.diags.push(Diagnostic::error(
                            loc,
                            format!(
                                "workflow \"{wname}\": step \"{}\" uses agent \"{a}\", which is not defined{hint} (defined agents: {})",
                                s.id,
                                quoted_list(agents.iter().map(String::as_str))
                            ),
                        ));
                    }
                    agent.map(|agent| StepKind::Agent { agent, input: templated(&s.input) })
                }
                Some(StepType::Plugin) => {
                    let plugin = need("plugin", &s.plugin, self);
                    let action = need("action", &s.action, self);
                    plugin.zip(action).map(|(plugin, action)| StepKind::Plugin {
                        plugin,
                        action,
                        input: templated(&s.input),
                        parameters: templated(&s.parameters),
                    })
                }
                Some(StepType::Condition) => need("condition", &s.condition, self).map(|c| StepKind::Condition {
                    condition: Template::parse(&c),
                    then: s.then.clone().unwrap_or_default(),
                    otherwise: s.otherwise.clone().unwrap_or_default(),
                }),
                Some(StepType::Parallel) => {
                    if let Some(children) = &s.steps {
                        let steps = self.steps(wname, children, &at(&path, "steps"), known, ids);
                        Some(StepKind::Parallel { steps })
                    } else {
                        let loc = self.loaded.sources.locate(&path);
                        self.diags
                            .push(Diagnostic::error(loc, format!("workflow \"{wname}\": parallel step \"{}\" needs \"steps\"", s.id)));
                        None
                    }
                }
                Some(StepType::GroupChat) => {
                    for a in s.agents.iter().flatten() {
                        if !agents.contains(a) {
                            let loc = self.loaded.sources.locate(&at(&path, "agents"));
                            self.diags.push(Diagnostic::error(
                                loc,
                                format!("workflow \"{wname}\": group chat step \"{}\" uses agent \"{a}\", which is not defined", s.id),
                            ));
                        }
                    }
                    Some(StepKind::GroupChat {
                        agents: s.agents.clone().unwrap_or_default(),
                        input: templated(&s.input),
                        max_iterations: s.max_iterations,
                    })
                }
                Some(StepType::Approval) => {
                    let timeout = match s.timeout.as_deref().map(duration) {
                        None => Ok(None),
                        Some(Ok(d)) => Ok(Some(d)),
                        Some(Err(e)) => {
                            let loc = self.loaded.sources.locate(&at(&path, "timeout"));
                            self.diags.push(Diagnostic::error(loc, format!("workflow \"{wname}\": step \"{}\": timeout {e}", s.id)));
                            Err(())
                        }
                    };
                    let on_timeout = match s.on_timeout.as_deref() {
                        None | Some("reject") => Ok(Decision::Reject),
                        Some("approve") => Ok(Decision::Approve),
                        Some(other) => {
                            let loc = self.loaded.sources.locate(&at(&path, "on_timeout"));
                            self.diags.push(Diagnostic::error(
                                loc,
                                format!(
                                    "workflow \"{wname}\": step \"{}\": on_timeout \"{other}\" is not a decision; use approve or reject",
                                    s.id
                                ),
                            ));
                            Err(())
                        }
                    };
                    timeout.ok().zip(on_timeout.ok()).map(|(timeout, on_timeout)| StepKind::Approval {
                        input: templated(&s.input),
                        timeout,
                        on_timeout,
                    })
                }
                None => {
                    let kinds = StepType::ALL.map(StepType::as_str);
                    let hint = did_you_mean(&s.kind, kinds.iter().copied());
                    let loc = self.loaded.sources.locate(&at(&path, "type"));
                    self.diags.push(Diagnostic::error(
                        loc,
                        format!(
                            "workflow \"{wname}\": step \"{}\" has unknown type \"{}\"{hint}; use one of {}",
                            s.id,
                            s.kind,
                            kinds.join(", ")
                        ),
                    ));
                    None
                }
            };
            let held = match (&s.limits, StepType::parse(&s.kind)) {
                (None, _) => Ok(Vec::new()),
                (Some(_), Some(t @ (StepType::Approval | StepType::Condition))) => {
                    let what =
                        if t == StepType::Approval { "an approval step waits for a person" } else { "a condition step decides at once" };
                    Err(format!("{what} and holds no limit; list the limits on the steps that do the work"))
                }
                (Some(value), _) => read_limits(&format!("step \"{}\"", s.id), value, limits).map_err(|e| format!("limits {e}")),
            };
            let held = held.unwrap_or_else(|e| {
                let loc = self.loaded.sources.locate(&at(&path, "limits"));
                self.diags.push(Diagnostic::error(loc, format!("workflow \"{wname}\": step \"{}\": {e}", s.id)));
                Vec::new()
            });
            if let Some(kind) = kind {
                out.push(Step { id: s.id.clone(), when: s.when.as_deref().map(Template::parse), limits: held, kind });
            }
        }
        out
    }

    pub(super) fn pipelines(&mut self) -> BTreeMap<String, Pipeline> {
        let agents: Vec<String> = self.loaded.raw.agents.as_ref().map(|a| a.keys().cloned().collect()).unwrap_or_default();
        let mut out = BTreeMap::new();
        for (name, p) in self.loaded.raw.pipelines.clone().unwrap_or_default() {
            for a in &p.steps {
                if !agents.contains(a) {
                    let hint = did_you_mean(a, agents.iter().map(String::as_str));
                    self.err(&["pipelines", &name, "steps"], format!("pipeline \"{name}\" uses agent \"{a}\", which is not defined{hint}"));
                }
            }
            out.insert(name, Pipeline { description: p.description, agents: p.steps });
        }
        out
    }
}

fn at_index(p: &YamlPath, i: usize) -> YamlPath {
    let mut p = p.clone();
    p.push(Seg::Index(i));
    p
}

/// Calls `f(step id, named step)` for every `then`/`else` reference.
/// Calls `f(step, target)` for each step named in a `then`/`else`, nested steps included. Reads
/// the raw steps: a condition step with an error of its own still has its names checked.
fn collect_refs(steps: &[raw::Step], f: &mut dyn FnMut(&str, &str)) {
    for s in steps {
        for t in s.then.iter().flatten().chain(s.otherwise.iter().flatten()) {
            f(&s.id, t);
        }
        if let Some(children) = &s.steps {
            collect_refs(children, f);
        }
    }
}
