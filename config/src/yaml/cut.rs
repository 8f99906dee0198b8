//! A large file's jobs parsed in two parts at once.
//!
//! yaml-rust2's scanner reads some 24 MB a second here: a million jobs' 190 MB keep one core
//! busy for eight seconds, while the builder on the other core waits a third of the time.
//! So a large file whose `scheduling.jobs` is a block mapping is cut at a job near its middle:
//! the jobs from there to the mapping's end are parsed on their own, as a mapping indented as
//! they are, while the rest of the file (the text before the cut and after the jobs) is
//! parsed as it is; the two values are then put together. The text is cut by its lines alone,
//! before any parse, so what decides that the parts fit together is checked as they are built
//! ([`Watch`]): that the rest reached the cut in the jobs mapping's own block (not inside a
//! quoted scalar or a flow collection), and that its next key after the jobs is the one the
//! cut expects; that the cut-out jobs are a mapping at the jobs' indentation, with no anchor
//! or alias (an anchor's name is shared across the file). Anything that does not fit, an
//! error in either part included, is parsed whole by the caller, as before: a part's error
//! may be one the cut made, not the file's.

use std::borrow::Cow;

use super::{Builder, Event, Marker, Open, OpenKind, PositionIndex, ROOT, Value, build, key_child};

/// From this size on a file is cut (8 MB: some 40,000 jobs).
pub(super) const CUT_FROM: usize = 8 * 1024 * 1024;

/// Where a text is cut: its jobs from `from` up to `to` are parsed apart from the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cut {
    /// The start of a job's line, near the middle of the text.
    from: usize,
    /// The start of the first line after it indented less than the jobs (the mapping's end),
    /// or the text's end.
    to: usize,
    /// The jobs' indentation.
    indent: usize,
}

impl Cut {
    /// A cut of `text` by its lines: after a `jobs:` line, the jobs' indentation is that of
    /// the line after it; the cut is at the first line of a job (a plain key, so indented)
    /// from the middle of the text on; the jobs end at the first line of content indented
    /// less, which must start a plain key too. `None` if the text has none of these, or has a
    /// carriage return (a line break the parser counts apart from `\n`).
    pub(super) fn find(text: &str) -> Option<Cut> {
        if text.contains('\r') {
            return None;
        }
        let mut lines = lines_from(text, 0);
        let (_, jobs) = lines.by_ref().find(|(_, l)| indent(l) > 0 && is_jobs_key(&l[indent(l)..]))?;
        let (first, first_job) = lines.find(|(_, l)| is_content(l))?;
        let n = indent(first_job);
        if n <= indent(jobs) || !starts_key(first_job, n) {
            return None;
        }
        // The next line's start from the middle on ('\n' is a character of its own).
        let middle = text.len() / 2;
        let start = text.as_bytes()[middle..].iter().position(|&b| b == b'\n').map(|i| middle + i + 1)?.max(first + 1);
        let (from, _) = lines_from(text, start).find(|(_, l)| indent(l) == n && starts_key(l, n))?;
        let to = match lines_from(text, from).skip(1).find(|(_, l)| is_content(l) && indent(l) < n) {
            Some((to, l)) if starts_key(l, indent(l)) => to,
            Some(_) => return None,
            None => text.len(),
        };
        Some(Cut { from, to, indent: n })
    }
}

/// The lines of `text` from `at` (a line's start) on, each with where it starts, without its
/// line break.
fn lines_from(text: &str, at: usize) -> impl Iterator<Item = (usize, &str)> {
    let rest = text.get(at..).unwrap_or_default();
    rest.split_inclusive('\n').scan(at, |next, line| {
        let start = *next;
        *next += line.len();
        Some((start, line.strip_suffix('\n').unwrap_or(line)))
    })
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Not blank, not a comment.
fn is_content(line: &str) -> bool {
    let rest = line.trim_start_matches(' ');
    !rest.trim().is_empty() && !rest.starts_with('#')
}

/// `jobs:`, with nothing after it but a comment.
fn is_jobs_key(rest: &str) -> bool {
    rest.strip_prefix("jobs:").is_some_and(|after| {
        let after = after.trim_start_matches([' ', '\t']);
        after.is_empty() || after.starts_with('#')
    })
}

/// The line's text at `at` starts a plain scalar that can only be a key or a value, not a
/// quote, a collection, an anchor, a tag or a comment.
fn starts_key(line: &str, at: usize) -> bool {
    line.as_bytes().get(at).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

fn count_lines(text: &str) -> usize {
    text.as_bytes().iter().filter(|&&b| b == b'\n').count()
}

/// The path of the mapping a cut's jobs go into.
fn jobs_path() -> u64 {
    key_child(key_child(ROOT, "scheduling"), "jobs")
}

/// Parses `text` in two parts at `cut`, the cut-out jobs on a thread of their own; what a
/// whole parse would give, or `None` where the parts do not fit together or either did not
/// parse (see the module's doc).
pub(super) fn parse(text: &str, cut: Cut, depth: Option<usize>) -> Option<(Value, PositionIndex)> {
    let (head, jobs, tail) = (text.get(..cut.from)?, text.get(cut.from..cut.to)?, text.get(cut.to..)?);
    let head_lines = count_lines(head);
    let rest: Cow<str> = if tail.is_empty() { Cow::Borrowed(head) } else { Cow::Owned([head, tail].concat()) };
    // The rest: its lines from the tail's first on are the jobs' lines further down.
    let mut outer = Builder::for_text(text, depth, true);
    outer.placed.from_line = head_lines + 1;
    outer.placed.lines = count_lines(jobs);
    outer.watch =
        Some(Watch::new(Some(Seam { line: head_lines + 1, key_col: (!tail.is_empty()).then(|| indent(tail)), state: SeamState::InJobs })));
    // The jobs: their root is the jobs' mapping, their first line the head's next.
    let mut inner = Builder::for_text(jobs, depth, true);
    inner.placed.root = jobs_path();
    inner.placed.depth = 2;
    inner.placed.lines = head_lines;
    inner.watch = Some(Watch::new(None));
    let (outer_end, inner_end) = std::thread::scope(|s| {
        let inner = std::thread::Builder::new().name("config-cut".into()).spawn_scoped(s, || build(jobs, &mut inner)).ok()?;
        let outer_end = build(&rest, &mut outer);
        Some((outer_end, inner.join().ok()?))
    })?;
    let fits = |w: &Option<Watch>, root: bool| w.as_ref().is_some_and(|w| w.fits(cut.indent, root));
    if !matches!((outer_end, inner_end), (Some(Ok(true)), Some(Ok(true)))) || !fits(&outer.watch, false) || !fits(&inner.watch, true) {
        return None;
    }
    let mut root = outer.take_root(&rest);
    let Value::Mapping(cut_out) = inner.take_root(jobs) else {
        return None;
    };
    let Some(Value::Mapping(all)) = root.get_mut("scheduling").and_then(|s| s.get_mut("jobs")) else {
        return None;
    };
    // A job in both parts: the whole parse says where.
    if cut_out.keys().any(|k| all.contains_key(k)) {
        return None;
    }
    all.extend(cut_out);
    outer.map.extend(inner.map);
    Some((root, PositionIndex { map: outer.map, depth }))
}

/// What a part of a cut file checks as it is built.
pub(super) struct Watch {
    /// The path of the jobs' mapping, and the column its first key is at.
    jobs: u64,
    first_key_col: Option<usize>,
    /// An anchor or an alias was read.
    anchored: bool,
    /// The rest's (the part around the jobs): where it reaches the cut.
    seam: Option<Seam>,
}

/// Where the rest of a cut file reaches the cut: the line that was the cut's in the file is
/// the first of the tail (or past the end, without one).
struct Seam {
    line: usize,
    /// The column of the tail's first key, if there is a tail.
    key_col: Option<usize>,
    state: SeamState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeamState {
    /// Before the jobs' mapping has ended: nothing may start at the seam or after it.
    InJobs,
    /// The jobs' mapping has ended: next, the tail's first key at the seam, or the stream's
    /// end without a tail.
    AfterJobs,
    Fits,
    DoesNotFit,
}

impl Watch {
    fn new(seam: Option<Seam>) -> Self {
        Watch { jobs: jobs_path(), first_key_col: None, anchored: false, seam }
    }

    /// Sees an event before it is built, with the collections open then.
    pub(super) fn see(&mut self, event: &Event, mark: Marker, open: &[Open]) {
        let starts = match event {
            Event::Scalar(_, _, anchor, _) | Event::MappingStart(anchor, _) | Event::SequenceStart(anchor, _) => {
                self.anchored |= *anchor != 0;
                true
            }
            Event::Alias(_) => {
                self.anchored = true;
                true
            }
            _ => false,
        };
        if starts
            && self.first_key_col.is_none()
            && let Some(Open { path, kind: OpenKind::Map(map, None), .. }) = open.last()
            && *path == self.jobs
            && map.is_empty()
        {
            self.first_key_col = Some(mark.col());
        }
        let Some(seam) = &mut self.seam else {
            return;
        };
        let ends = matches!(event, Event::MappingEnd | Event::SequenceEnd | Event::DocumentEnd);
        seam.state = match seam.state {
            SeamState::InJobs if ends => {
                let jobs_end = matches!(event, Event::MappingEnd) && open.len() == 3 && open.last().is_some_and(|o| o.path == self.jobs);
                if jobs_end { SeamState::AfterJobs } else { SeamState::InJobs }
            }
            SeamState::InJobs if mark.line() >= seam.line => SeamState::DoesNotFit,
            SeamState::AfterJobs if ends => SeamState::AfterJobs,
            SeamState::AfterJobs => {
                let tail_key = matches!(event, Event::Scalar(..))
                    && seam.key_col == Some(mark.col())
                    && mark.line() == seam.line
                    && matches!(open.last(), Some(Open { kind: OpenKind::Map(_, None), .. }));
                let end_without_tail = matches!(event, Event::StreamEnd) && seam.key_col.is_none();
                if tail_key || end_without_tail { SeamState::Fits } else { SeamState::DoesNotFit }
            }
            state => state,
        };
    }

    /// Whether the part fits the cut: its jobs' keys at `indent`; the cut-out jobs
    /// (`cut_out`) with no anchor or alias; the rest through its seam.
    fn fits(&self, indent: usize, cut_out: bool) -> bool {
        self.first_key_col == Some(indent) && !(cut_out && self.anchored) && self.seam.as_ref().is_none_or(|s| s.state == SeamState::Fits)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Keep, parse as parse_whole};
    use super::*;

    /// Jobs of every shape a cut could fall inside: block scalars kept and clipped, quoted
    /// scalars and flow collections over lines, sequences at the key's indentation, comments
    /// and blank lines indented less than the jobs, a plain scalar over lines, complex keys;
    /// and job 10 anchored by a name the file used before it.
    fn jobs(n: usize) -> String {
        let mut s = String::new();
        for i in 0..n {
            s.push_str(&match i % 8 {
                _ if i == 10 => format!("    job-{i}: &shared {{n: {i}}}\n"),
                0 => format!("    job-{i}:\n      cron: \"{i} * * * *\"\n      parameters: {{ path: \"out/{i}.txt\",\n        content: x }}\n"),
                1 => format!("    job-{i}:\n      script: |+\n        echo {i}\n        jobs: not a key\n\n# a comment at the left\n\n"),
                2 => format!("    job-{i}:\n      note: \"a quoted\n        scalar over lines: {i}\"\n      steps:\n      - a\n      - b: [1,\n          2]\n"),
                3 => format!("    job-{i}: {{cron: \"@daily\", n: {i}}}\n  # a comment less indented\n"),
                4 => format!("    job-{i}:\n      text: >\n        folded\n        {i}\n"),
                5 => format!("    job-{i}:\n    - listed at the key's indentation {i}\n    - x\n"),
                6 => format!("    job_{i}: plain\n      continued {i}\n"),
                _ => format!("    ? job-{i}\n    : {{cron: x}}\n"),
            });
        }
        s
    }

    fn file(n: usize, tail: &str) -> String {
        format!("worker:\n  base: &shared {{n: 0}}\nscheduling:\n  timezone: UTC\n  jobs:\n{}{tail}", jobs(n))
    }

    /// The cut at `from`, the jobs' mapping ending where `find` would end it.
    fn cut_at(text: &str, from: usize) -> Cut {
        let to = lines_from(text, from).skip(1).find(|(_, l)| is_content(l) && indent(l) < 4).map_or(text.len(), |(to, _)| to);
        Cut { from, to, indent: 4 }
    }

    /// Wherever a cut falls, at every line of the jobs' indentation, the two parts either fit
    /// together into what a whole parse gives (the value and every position), or do not fit;
    /// and every cut at a job's plain key after the anchored job fits (the cuts `find` makes).
    #[test]
    fn a_cut_anywhere_gives_the_whole_parse_or_none() {
        for tail in ["", "  calendars: {}\nworkflows:\n  w: *shared\n"] {
            let text = file(24, tail);
            let (value, positions) = parse_whole(&text, Keep::Every).expect("the whole text parses");
            let (mut fitted, mut refused) = (0, 0);
            for (from, line) in lines_from(&text, 0) {
                if indent(line) != 4 || !text[..from].contains("  jobs:\n") {
                    continue;
                }
                let after_anchor = line.split(':').next().and_then(|k| k.get(8..)?.parse::<usize>().ok()).is_some_and(|i| i > 10);
                match parse(&text, cut_at(&text, from), None) {
                    Some((v, p)) => {
                        assert_eq!(v, value, "cut at {line:?}, tail {tail:?}");
                        assert!(p.map == positions.map, "positions, cut at {line:?}, tail {tail:?}");
                        fitted += 1;
                    }
                    None => {
                        assert!(!(starts_key(line, 4) && after_anchor), "a cut at {line:?} fits, tail {tail:?}");
                        refused += 1;
                    }
                }
            }
            assert!(fitted >= 10 && refused >= 10, "fitted {fitted}, refused {refused}");
        }
    }

    /// Cuts that `find` would not make, each at a line of the jobs' indentation: in a mapping
    /// indented less than its first key (a whole parse refuses the file), and in another
    /// section's mapping after the jobs. Neither fits, though each part parses.
    #[test]
    fn cuts_outside_the_jobs_own_block_do_not_fit() {
        let deeper = "scheduling:\n  jobs:\n      a: 1\n      b: 2\n    c: 3\n";
        assert!(parse_whole(deeper, Keep::Every).is_err());
        let elsewhere = "scheduling:\n  jobs:\n    a: 1\n  other:\n    b: 2\n    c: 3\n";
        assert!(parse_whole(elsewhere, Keep::Every).is_ok());
        for (text, at) in [(deeper, "    c: 3"), (elsewhere, "    b: 2"), (elsewhere, "    c: 3")] {
            let from = text.find(at).unwrap();
            assert!(parse(text, cut_at(text, from), None).is_none(), "{text:?} cut at {at:?}");
        }
    }

    /// `find` cuts a large file at the first job from its middle on, and ends the jobs where
    /// the next section starts; a file it cannot read by lines it does not cut.
    #[test]
    fn a_large_file_is_cut_at_a_job_from_its_middle() {
        let jobs: String = (0..1000).map(|i| format!("    job-{i}:\n      cron: \"@daily\"\n      note: \"{i}\"\n")).collect();
        let text =
            format!("scheduling:\n  timezone: UTC\n  jobs:\n    # the jobs\n{jobs}  # after them\n  limits: {{}}\nworkflows: {{}}\n");
        let cut = Cut::find(&text).expect("a cut");
        assert_eq!(cut.indent, 4);
        assert!(text[cut.from..].starts_with("    job-") && (text.len() / 2..text.len() / 2 + 100).contains(&cut.from), "{cut:?}");
        assert!(text[cut.to..].starts_with("  limits:"), "{cut:?}");
        let ((value, positions), (whole, every)) = (parse(&text, cut, Some(3)).expect("fits"), parse_whole(&text, Keep::Shallow).unwrap());
        assert!(value == whole && positions.map == every.map && positions.depth == Some(3));
        let ends_with_jobs = format!("scheduling:\n  jobs:\n{jobs}");
        assert_eq!(Cut::find(&ends_with_jobs).map(|c| c.to), Some(ends_with_jobs.len()));
        for refused in [
            text.replace('\n', "\r\n"),
            text.replace("  jobs:\n", "  jobs: # comment\n  x: 1\n"),
            text.replace("  limits: {}", "  - listed"),
            text.replace("  jobs:\n", "  jobs: {}\n"),
        ] {
            assert_eq!(Cut::find(&refused), None, "{}", &refused[..60]);
        }
    }
}
