//! Limits shared across jobs and workers (SPEC §4a): the slot pools a run takes, and which of
//! the runs in line get a slot. Pure values and decisions: the store reads the facts (who
//! holds a slot, who waits) under a lock per pool and writes the answer in the same
//! transaction (the store's hand-over and its end writes). A leaf: it knows the config, nothing of the engine.
//!
//! A slot is held by a run that is `running`, or `queued` and handed to the queue (admitted,
//! not claimed yet), and that has a row in `ll_run_limits` for the pool, or names the pool in
//! its own `limit_hold` (a head an end's statement handed the slot to, on PostgreSQL). So a slot is freed
//! by whatever ends the run: its fenced end, or a takeover of its dead worker's lease, never
//! earlier.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;

use lamplighter_config::{LimitUse, Template, Var};

/// `scheduling.limits`: each limit's slots, by name.
pub(crate) type Sizes = BTreeMap<String, u32>;

/// One slot pool: a limit, and for a keyed limit the run's key (`""` for one pool).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pool {
    pub name: String,
    pub key: String,
}

impl Pool {
    /// As `ll_runs.limit_wait` holds it: `name`, or `name:key` (a limit's name has no `:`).
    pub(crate) fn encode(&self) -> String {
        if self.key.is_empty() { self.name.clone() } else { format!("{}:{}", self.name, self.key) }
    }

    pub(crate) fn decode(text: &str) -> Pool {
        match text.split_once(':') {
            Some((name, key)) => Pool { name: name.into(), key: key.into() },
            None => Pool { name: text.into(), key: String::new() },
        }
    }

    /// `limit "warehouse"`, or `limit "tenant" (key "acme")`.
    pub fn describe(&self) -> String {
        if self.key.is_empty() { format!("limit \"{}\"", self.name) } else { format!("limit \"{}\" (key \"{}\")", self.name, self.key) }
    }
}

/// A run waiting for a slot: the pool it waits on first, and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitWait {
    pub pool: Pool,
    pub since: Option<DateTime<Utc>>,
}

/// The pools a run of these `limits` takes, its keys rendered over its `input`. A reference
/// the input lacks reads as empty (those runs share one pool), and a string reads as itself,
/// any other value as its JSON.
pub(crate) fn pools_of(limits: &[LimitUse], input: Option<&Value>) -> Vec<Pool> {
    limits
        .iter()
        .map(|l| Pool {
            name: l.name.clone(),
            key: l.key.as_deref().map_or_else(String::new, |k| {
                Template::parse(k).render(|var| match var {
                    Var::Input(path) => Some(lookup(input, path)),
                    _ => None,
                })
            }),
        })
        .collect()
}

fn lookup(input: Option<&Value>, path: &[String]) -> String {
    let mut at = input;
    for part in path {
        at = at.and_then(|v| match v {
            Value::Object(m) => m.get(part),
            Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        });
    }
    match at {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// The pools as `ll_runs.limits` stores them (`None`: the run takes none).
pub(crate) fn stored(pools: &[Pool]) -> Option<String> {
    (!pools.is_empty()).then(|| Value::Array(pools.iter().map(|p| Value::from(vec![p.name.clone(), p.key.clone()])).collect()).to_string())
}

/// Reads `ll_runs.limits` back; a damaged value reads as none (the run is not held back).
pub(crate) fn from_stored(text: Option<&str>) -> Vec<Pool> {
    let Some(text) = text else { return Vec::new() };
    let Ok(pairs) = serde_json::from_str::<Vec<(String, String)>>(text) else { return Vec::new() };
    pairs.into_iter().map(|(name, key)| Pool { name, key }).collect()
}

/// Who of the runs in line gets a slot now.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Admission {
    /// Indexes into the line, in order.
    pub(crate) admitted: Vec<usize>,
    /// The runs that wait, each with the pool it waits on first.
    pub(crate) waiting: Vec<(usize, Pool)>,
}

/// Decides the line (the runs' pools, first come first): a run gets a slot of each of its
/// pools when every one has a free slot and no run before it waits on any of them — strictly
/// in order, so a run that needs two limits is not passed for ever by runs that need one of
/// them. A pool whose limit is no longer configured (a reload removed it) holds nobody back.
pub(crate) fn admit(line: &[&[Pool]], sizes: &Sizes, held: &HashMap<Pool, usize>) -> Admission {
    let mut held = held.clone();
    let mut blocked: HashSet<&Pool> = HashSet::new();
    let mut out = Admission::default();
    for (i, pools) in line.iter().enumerate() {
        let limited: Vec<(&Pool, usize)> =
            pools.iter().filter_map(|p| sizes.get(&p.name).map(|&n| (p, usize::try_from(n).unwrap_or(usize::MAX)))).collect();
        let full = limited.iter().find(|(p, n)| blocked.contains(p) || held.get(*p).copied().unwrap_or(0) >= *n);
        match full {
            None => {
                for (p, _) in &limited {
                    *held.entry((*p).clone()).or_default() += 1;
                }
                out.admitted.push(i);
            }
            Some((p, _)) => {
                out.waiting.push((i, (*p).clone()));
                blocked.extend(limited.iter().map(|(p, _)| *p));
            }
        }
    }
    out
}

/// The reason a waiting run shows: `waiting for limit "warehouse": 2 of 2 held by r1, r2`.
pub(crate) fn waiting_text(pool: &Pool, size: Option<u32>, holders: &[String]) -> String {
    match size {
        Some(n) => format!("waiting for {}: {} of {n} held by {}", pool.describe(), holders.len(), holders.join(", ")),
        None => format!("waiting for {}, which is no longer configured: it starts at the next hand-over", pool.describe()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, key: &str) -> Pool {
        Pool { name: name.into(), key: key.into() }
    }

    fn sizes(s: &[(&str, u32)]) -> Sizes {
        s.iter().map(|(n, k)| ((*n).to_string(), *k)).collect()
    }

    #[test]
    fn a_line_is_served_first_come_first_served_up_to_each_limit() {
        let wh = pool("warehouse", "");
        let line: Vec<Vec<Pool>> = vec![vec![wh.clone()], vec![wh.clone()], vec![wh.clone()]];
        let line: Vec<&[Pool]> = line.iter().map(Vec::as_slice).collect();
        let held = HashMap::from([(wh.clone(), 1)]);
        let a = admit(&line, &sizes(&[("warehouse", 2)]), &held);
        assert_eq!(a.admitted, vec![0]);
        assert_eq!(a.waiting, vec![(1, wh.clone()), (2, wh.clone())]);
        // Nothing held: two go, the third waits.
        let a = admit(&line, &sizes(&[("warehouse", 2)]), &HashMap::new());
        assert_eq!(a.admitted, vec![0, 1]);
        assert_eq!(a.waiting, vec![(2, wh)]);
    }

    #[test]
    fn keyed_pools_count_apart_and_a_run_waiting_on_two_limits_is_not_passed() {
        let (a, b) = (pool("tenant", "acme"), pool("tenant", "bolt"));
        let gpu = pool("gpu", "");
        let line: Vec<Vec<Pool>> = vec![vec![a.clone()], vec![a.clone()], vec![b.clone()], vec![b.clone(), gpu.clone()], vec![gpu.clone()]];
        let line: Vec<&[Pool]> = line.iter().map(Vec::as_slice).collect();
        let held = HashMap::from([(gpu.clone(), 1)]);
        let out = admit(&line, &sizes(&[("tenant", 1), ("gpu", 1)]), &held);
        // acme's first, bolt's first; bolt's second waits on gpu, and the gpu-only run behind
        // it waits too though it would fit nothing less.
        assert_eq!(out.admitted, vec![0, 2]);
        assert_eq!(out.waiting, vec![(1, a), (3, b), (4, gpu)]);
    }

    #[test]
    fn a_removed_limit_holds_nobody_back() {
        let gone = pool("gone", "");
        let line: Vec<Vec<Pool>> = vec![vec![gone.clone()], vec![gone]];
        let line: Vec<&[Pool]> = line.iter().map(Vec::as_slice).collect();
        assert_eq!(admit(&line, &Sizes::new(), &HashMap::new()).admitted, vec![0, 1]);
    }

    #[test]
    fn keys_render_over_the_input() {
        let uses = vec![
            LimitUse { name: "tenant".into(), key: Some("${input.tenant}".into()) },
            LimitUse { name: "region".into(), key: Some("${input.where.region}-${input.n}".into()) },
            LimitUse { name: "warehouse".into(), key: None },
        ];
        let input = serde_json::json!({"tenant": "acme", "where": {"region": "eu"}, "n": 3});
        assert_eq!(pools_of(&uses, Some(&input)), vec![pool("tenant", "acme"), pool("region", "eu-3"), pool("warehouse", "")]);
        // Missing references read as empty: those runs share a pool.
        assert_eq!(pools_of(&uses[..1], None), vec![pool("tenant", "")]);
        let stored_text = stored(&pools_of(&uses, Some(&input)));
        assert_eq!(from_stored(stored_text.as_deref()), pools_of(&uses, Some(&input)));
        assert_eq!(from_stored(Some("not json")), Vec::new());
        for p in [pool("tenant", "a:b"), pool("warehouse", "")] {
            assert_eq!(Pool::decode(&p.encode()), p);
        }
    }

    #[test]
    fn the_waiting_text_says_who_holds_the_slots() {
        let wh = pool("warehouse", "");
        assert_eq!(waiting_text(&wh, Some(2), &["r1".into(), "r2".into()]), "waiting for limit \"warehouse\": 2 of 2 held by r1, r2");
        assert!(
            waiting_text(&pool("tenant", "acme"), None, &[]).contains("limit \"tenant\" (key \"acme\"), which is no longer configured")
        );
    }
}
