//! The scheduler's share of the jobs on a shared database: each job's ticks are planned and
//! offered by one live worker, not by all of them.
//!
//! Workers that know the same scheduled jobs (the same [`digest`], written with their lease)
//! form a group; each job belongs to the group's member with the highest weight for it
//! (rendezvous hashing), so a worker that joins takes about 1/n of the jobs from the others
//! and one that leaves gives only its own away. Views of the group may differ for a moment
//! (a join not yet read by everyone): then a job has two owners and the tick's key lets one
//! win, or, while a member's lease runs out, none — the job's next owner fires the ticks due
//! since its last one, each of them (see `TickPolicy::each_since`). A worker of an earlier
//! version writes no digest and is in no group: it offers every tick, as before.
//!
//! The hash is FNV-1a with a 64-bit finalizer: stable across Rust versions and builds, since
//! every member must reach the same answer. Changing it changes [`SCHEME`], so workers that
//! divide differently never share a group.

use std::sync::Arc;

/// The version of the division, part of every digest.
const SCHEME: &str = "s1";

/// What the noticing of run outcomes is owned under, like a job's ticks (a name no job has:
/// neither YAML nor a runtime job's name holds a NUL).
const OUTCOMES: &str = "\u{0}outcomes";

/// One worker's share of the jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Share {
    /// The group, by name, in order; empty: this worker schedules every job.
    members: Arc<[String]>,
    /// Each member's key, in the order of `members`.
    keys: Arc<[u64]>,
    /// This worker's place in `members`.
    me: usize,
}

impl Share {
    /// Every job: the only worker of a database (SQLite), or one that knows no group.
    pub(crate) fn everything() -> Self {
        Share { members: Arc::from(Vec::new()), keys: Arc::from(Vec::new()), me: 0 }
    }

    /// `me`'s share among `members` (in any order; `me` is one of them whether named or not).
    pub(crate) fn among(me: &str, mut members: Vec<String>) -> Self {
        members.push(me.to_owned());
        members.sort_unstable();
        members.dedup();
        if members.len() == 1 {
            return Self::everything();
        }
        let keys: Vec<u64> = members.iter().map(|m| mix(fnv1a(m.bytes()))).collect();
        let me = members.iter().position(|m| m == me).unwrap_or(0);
        Share { members: members.into(), keys: keys.into(), me }
    }

    /// Whether this worker plans and offers `job`'s ticks.
    pub(crate) fn owns(&self, job: &str) -> bool {
        self.keys.is_empty() || self.owner_index(job) == self.me
    }

    /// Whether this worker notices the outcomes of the group's runs: one member does, so that
    /// the group's passes, job-state writes and prunings cost what one worker's do.
    pub(crate) fn notices_outcomes(&self) -> bool {
        self.owns(OUTCOMES)
    }

    /// The member `job` belongs to (this worker's name is not known to [`Share::everything`]:
    /// `None` there).
    #[cfg(test)]
    pub(crate) fn owner(&self, job: &str) -> Option<&str> {
        self.members.get(self.owner_index(job)).map(String::as_str)
    }

    fn owner_index(&self, job: &str) -> usize {
        let h = fnv1a(job.bytes());
        let mut best = (0u64, 0usize);
        for (i, k) in self.keys.iter().enumerate() {
            // Ties (never seen in practice) go to the first by name.
            let w = mix(h ^ k);
            if i == 0 || w > best.0 {
                best = (w, i);
            }
        }
        best.1
    }

    /// The group this share is of, by name (empty for [`Share::everything`]).
    pub(crate) fn members(&self) -> &[String] {
        &self.members
    }
}

/// The digest of the scheduled jobs a worker knows, by name: equal for two workers exactly when
/// (but for a 64-bit collision) they know the same jobs, whatever the order they list them in.
pub(crate) fn digest<'a>(jobs: impl Iterator<Item = &'a str>) -> String {
    let (mut sum, mut xor, mut n) = (0u64, 0u64, 0u64);
    for job in jobs {
        let h = mix(fnv1a(job.bytes()));
        sum = sum.wrapping_add(h);
        xor ^= mix(h);
        n += 1;
    }
    format!("{SCHEME}-{n}-{sum:016x}{xor:016x}")
}

/// FNV-1a, 64 bits: stable across Rust versions and builds, unlike std's hasher. What must
/// come out the same on every worker and after every upgrade rests on it: a job's share, a
/// tick's jitter, a notification target's key, a tool's name.
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// MurmurHash3's 64-bit finalizer: every input bit moves every output bit, which FNV alone
/// does not do for names that differ in their last characters (`job-00001`, `job-00002`).
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("job-{i:05}")).collect()
    }

    fn workers(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("w-{i}")).collect()
    }

    #[test]
    fn every_job_has_one_owner_and_every_member_agrees_on_it() {
        let group = workers(3);
        let shares: Vec<Share> = group.iter().map(|w| Share::among(w, group.clone())).collect();
        for job in names(3000) {
            let owners: Vec<&Share> = shares.iter().filter(|s| s.owns(&job)).collect();
            assert_eq!(owners.len(), 1, "{job}");
            let named: Vec<Option<&str>> = shares.iter().map(|s| s.owner(&job)).collect();
            assert!(named.iter().all(|o| *o == named[0]), "{job}: {named:?}");
        }
    }

    #[test]
    fn shares_are_even_and_a_join_or_a_leave_moves_only_its_own_part() {
        let jobs = names(30_000);
        let three = workers(3);
        let count = |share: &Share| jobs.iter().filter(|j| share.owns(j)).count();
        for w in &three {
            let n = count(&Share::among(w, three.clone()));
            assert!((9_400..=10_600).contains(&n), "{w} holds {n} of 30,000");
        }
        // A fourth joins: jobs move only to it, about a quarter of them.
        let four = workers(4);
        let (before, after) = (Share::among("w-0", three.clone()), Share::among("w-0", four.clone()));
        let mut moved = 0;
        for j in &jobs {
            let (from, to) = (before.owner(j).unwrap(), after.owner(j).unwrap());
            if from != to {
                assert_eq!(to, "w-3", "{j} moved from {from} to {to}, not to the new member");
                moved += 1;
            }
        }
        assert!((7_000..=8_000).contains(&moved), "{moved} of 30,000 moved to the fourth");
        // One leaves: only its jobs move.
        let without = Share::among("w-0", vec!["w-0".into(), "w-2".into()]);
        for j in &jobs {
            if before.owner(j) != Some("w-1") {
                assert_eq!(before.owner(j), without.owner(j), "{j} moved though its owner stayed");
            }
        }
    }

    #[test]
    fn one_member_of_a_group_notices_its_outcomes_and_a_leave_hands_that_on() {
        for n in 1..=12 {
            let group = workers(n);
            let noticers: Vec<&String> = group.iter().filter(|w| Share::among(w, group.clone()).notices_outcomes()).collect();
            assert_eq!(noticers.len(), 1, "{n} workers: {noticers:?}");
            // Without it, exactly one of the rest notices.
            let rest: Vec<String> = group.iter().filter(|w| *w != noticers[0]).cloned().collect();
            if !rest.is_empty() {
                let next = rest.iter().filter(|w| Share::among(w, rest.clone()).notices_outcomes()).count();
                assert_eq!(next, 1, "{n} workers less the noticer");
            }
        }
        assert!(Share::everything().notices_outcomes());
    }

    #[test]
    fn a_lone_worker_and_a_worker_outside_any_group_schedule_everything() {
        let alone = Share::among("w-a", vec!["w-a".into()]);
        assert_eq!(alone, Share::everything());
        assert!(names(100).iter().all(|j| alone.owns(j) && Share::everything().owns(j)));
        // Its own name is one of the group whether listed or not.
        assert_eq!(Share::among("w-a", vec!["w-b".into()]), Share::among("w-a", vec!["w-b".into(), "w-a".into()]));
    }

    /// How the division grows (the table in BENCHMARKS.md comes from this, run with
    /// `--nocapture`): for many workers the largest share stays within a few percent of the
    /// mean once each holds a few thousand jobs, and a join moves about 1/(n+1) of the jobs, all
    /// to the newcomer.
    #[test]
    fn shares_stay_even_and_moves_small_as_the_group_grows() {
        let jobs = names(100_000);
        for n in [2usize, 3, 10, 30, 100] {
            let group = workers(n);
            let share = Share::among("w-0", group.clone());
            let mut held = vec![0usize; n];
            let mut owner = Vec::with_capacity(jobs.len());
            for j in &jobs {
                held[share.owner_index(j)] += 1;
                owner.push(share.owner(j).unwrap());
            }
            let mean = jobs.len() as f64 / n as f64;
            let max = *held.iter().max().unwrap() as f64;
            // A join: the newcomer is w-n.
            let joined = Share::among("w-0", workers(n + 1));
            let moved = jobs.iter().zip(&owner).filter(|(j, o)| joined.owner(j) != Some(**o)).count();
            let to_newcomer = jobs.iter().filter(|j| joined.owner(j) == Some(format!("w-{n}").as_str())).count();
            println!(
                "{n:>3} workers: share mean {mean:.0}, largest {max:.0} ({:+.1} %); a join moves {moved} ({:.2} % against 1/(n+1) = {:.2} %)",
                (max / mean - 1.0) * 100.0,
                moved as f64 * 100.0 / jobs.len() as f64,
                100.0 / (n + 1) as f64
            );
            assert_eq!(moved, to_newcomer, "{n}: every moved job went to the newcomer");
            let expected = jobs.len() as f64 / (n + 1) as f64;
            assert!((moved as f64 - expected).abs() < 5.0 * expected.sqrt() + 1.0, "{n}: {moved} moved, about {expected:.0} expected");
            // Binomial spread: the largest of n shares within five standard deviations.
            assert!(max - mean < 5.0 * mean.sqrt(), "{n}: largest share {max} against a mean of {mean:.0}");
        }
    }

    #[test]
    fn the_division_is_pinned_across_builds() {
        // Workers of different builds must divide alike: a change here is a change of SCHEME.
        let share = Share::among("w-a", vec!["w-b".into(), "w-c".into()]);
        let owners: Vec<&str> = ["nightly", "hourly", "job-00001", "job-00002", "backup"].iter().map(|j| share.owner(j).unwrap()).collect();
        assert_eq!(owners, ["w-c", "w-c", "w-b", "w-a", "w-c"]);
        assert_eq!(digest(["a", "b"].into_iter()), "s1-2-f109dbe12009a12b5cb79aff1dd6102f");
    }

    #[test]
    fn the_digest_is_of_the_set_of_jobs() {
        let d = |jobs: &[&str]| digest(jobs.iter().copied());
        assert_eq!(d(&["a", "b", "c"]), d(&["c", "a", "b"]));
        assert_ne!(d(&["a", "b", "c"]), d(&["a", "b"]));
        assert_ne!(d(&["a", "b"]), d(&["a", "c"]));
        assert_ne!(d(&["ab"]), d(&["a", "b"]));
        assert_ne!(d(&[]), d(&[""]));
    }
}
