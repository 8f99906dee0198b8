//! Jobs on calendars (SPEC §4a): a job fires only on its calendar's days, for jobs from files
//! and jobs made at runtime alike, and a calendar that does not exist is refused by name.

use serde_json::Value;

use crate::support::Worker;

/// Far enough ahead that the test does not depend on today: March 2031, its first three days
/// excepted.
const CALENDARS: &str = "calendars:\n  march: {dates: [\"2031-03-01..2031-03-05\"], except: [off]}\n  off: {dates: [\"2031-03-01..2031-03-03\"]}\n  \
     early-nov: {dates: [\"2026-11-02..2026-11-04\"]}\n";

#[test]
fn a_job_fires_only_on_its_calendars_days_and_says_so() {
    let mut w = Worker::new("");
    w.write_scheduling(
        "",
        CALENDARS,
        "payroll:\n  cron: \"0 6 * * *\"\n  calendar: march\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {path: p.txt, content: p}",
        "manage_jobs:\n  enabled: true\n",
    );
    w.start();
    let show = |job: &str| w.ctl_json(&["jobs", "show", job]);
    let payroll = show("payroll");
    assert_eq!(payroll["next_fire"], "2031-03-04T06:00:00Z", "the first day of march not in off: {payroll}");
    assert_eq!(payroll["schedule"], "cron: 0 6 * * * on calendar \"march\"", "{payroll}");
    // The days passed over until then, the first few of them (years of them, here).
    let days = payroll["calendar_days"].as_array().expect("calendar days");
    assert_eq!(days.len(), 21, "{payroll}");
    assert!(days[0].as_str().unwrap().contains("skipped: not a day of calendar \"march\""), "{payroll}");
    assert!(days[20].as_str().unwrap().contains("more days passed over"), "{payroll}");

    // A schedule previewed on a calendar, from an instant of choice: the days passed over, and why.
    let preview =
        w.ctl_json(&["schedule", "preview", "--cron", "0 6 * * *", "--calendar", "march", "--from", "2031-02-28T12:00:00Z", "-n", "2"]);
    let out = preview.to_string();
    let utc: Vec<&str> = preview["next_fires"].as_array().unwrap().iter().map(|f| f["utc"].as_str().unwrap()).collect();
    assert_eq!(utc, ["2031-03-04T06:00:00Z", "2031-03-05T06:00:00Z"], "{out}");
    assert_eq!(
        preview["notes"],
        serde_json::json!([
            "2031-03-01 skipped: in calendar \"off\"",
            "2031-03-02 skipped: in calendar \"off\"",
            "2031-03-03 skipped: in calendar \"off\""
        ]),
        "{out}"
    );
    // With a shift, the days off the calendar move their fires: three days' onto the 4th, once.
    let preview = w.ctl_json(&[
        "schedule",
        "preview",
        "--cron",
        "0 6 * * *",
        "--calendar",
        "march",
        "--shift",
        "next",
        "--from",
        "2031-02-28T12:00:00Z",
        "-n",
        "2",
    ]);
    let out = preview.to_string();
    let utc: Vec<&str> = preview["next_fires"].as_array().unwrap().iter().map(|f| f["utc"].as_str().unwrap()).collect();
    assert_eq!(utc, ["2031-03-04T06:00:00Z", "2031-03-05T06:00:00Z"], "{out}");
    assert_eq!(preview["notes"][0], "2031-03-01 shifted to 2031-03-04: in calendar \"off\"", "{out}");
    let (code, _, err) = w.ctl(&["schedule", "preview", "--cron", "0 6 * * *", "--shift", "next"]);
    assert_ne!(code, 0);
    assert!(err.contains("--calendar"), "a shift needs a calendar: {err}");
    let (code, out, _) = w.ctl(&["schedule", "preview", "--cron", "0 6 * * *", "--calendar", "march", "--from", "2031-02-28T12:00:00Z"]);
    assert_eq!(code, 0);
    assert!(out.contains("2031-03-01 skipped: in calendar \"off\""), "the text says it too: {out}");
    let (code, _, err) = w.ctl(&["schedule", "preview", "--cron", "0 6 * * *", "--calendar", "mrach"]);
    assert_ne!(code, 0);
    assert!(err.contains("calendar: \"mrach\" is not one of scheduling.calendars (did you mean \"march\"?)"), "{err}");
    let (code, _, err) = w.ctl(&["schedule", "preview", "--cron", "0 6 * * *", "--from", "tomorrow"]);
    assert_ne!(code, 0);
    assert!(err.contains("from: \"tomorrow\" is not an RFC 3339 instant"), "{err}");

    // A runtime job takes a calendar as a file's job does; one naming none defined is refused.
    let file = w.dir.path().join("late.yaml");
    std::fs::write(
        &file,
        "cron: \"30 18 * * *\"\ncalendar: march\nplugin: file-save\naction: save\nparameters: {path: l.txt, content: l}\n",
    )
    .unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "late", "-f", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(show("late")["next_fire"], "2031-03-04T18:30:00Z");
    std::fs::write(
        &file,
        "cron: \"30 18 * * *\"\ncalendar: marhc\nplugin: file-save\naction: save\nparameters: {path: l.txt, content: l}\n",
    )
    .unwrap();
    let (code, _, err) = w.ctl(&["jobs", "create", "typo", "-f", &file.display().to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains("calendar \"marhc\" is not one of scheduling.calendars (did you mean \"march\"?)"), "{err}");

    // A backfill keeps to the calendar: the days of the week asked for that are its days.
    std::fs::write(
        &file,
        "cron: \"0 6 * * *\"\ncalendar: early-nov\nplugin: file-save\naction: save\nparameters: {path: n.txt, content: n}\n",
    )
    .unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "nov", "-f", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let dry = w.ctl_json(&["jobs", "backfill", "nov", "--from", "2026-11-01T00:00:00Z", "--to", "2026-11-08T00:00:00Z", "--dry-run"]);
    let out = dry.to_string();
    let ticks: Vec<&str> = dry["ticks"].as_array().unwrap().iter().map(|t| t["scheduled_at"].as_str().unwrap()).collect();
    assert_eq!(ticks, ["2026-11-02T06:00:00Z", "2026-11-03T06:00:00Z", "2026-11-04T06:00:00Z"], "{out}");
    // A job on a calendar with a shift: jobs show names the days its fires move from.
    std::fs::write(
        &file,
        "cron: \"0 6 * * *\"\ncalendar: {name: march, shift: next}\nplugin: file-save\naction: save\nparameters: {path: m.txt, content: m}\n",
    )
    .unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "moved", "-f", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let moved = show("moved");
    assert_eq!(moved["schedule"], "cron: 0 6 * * * on calendar \"march\" (shift next)", "{moved}");
    let days: Vec<&str> = moved["calendar_days"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert!(
        days.iter().all(|d| d.contains("shifted to 2031-03-04") || d.contains("more days")),
        "every day's fire moves to the first day of march: {days:?}"
    );
}

/// A tick moved by `shift: previous` fires once at the instant it moves to, on both backends,
/// also when its worker is killed (SIGKILL) after running it and started again with
/// `catch_up: all`. The job (made at runtime) fires only on tomorrow's date, its calendar is today alone: so
/// its tick (tomorrow's, and next year's too) moves to today at the same time, and the run
/// at that instant can only come from the shift.
fn a_shifted_tick_fires_once_across_a_kill_9(storage: &str) {
    use chrono::{Datelike, Timelike};
    // The job's zone is a fixed offset where it is about noon now, so today's fire and the day
    // it is on stay the same day however long the test takes, whatever the hour in UTC.
    let now = chrono::Utc::now();
    let east = (12 - i64::from(now.hour())).clamp(-12, 14);
    let zone = if east > 0 { format!("Etc/GMT-{east}") } else { format!("Etc/GMT+{}", -east) };
    let local = |t: chrono::DateTime<chrono::Utc>| t + chrono::Duration::hours(east);
    let mut w = Worker::new("");
    w.write_scheduling(
        "",
        &format!("{storage}calendars:\n  today: {{dates: [\"{}\"]}}\n", local(now).format("%Y-%m-%d")),
        "",
        "manage_jobs:\n  enabled: true\n",
    );
    w.start();
    // Made at runtime once the worker is up (a PostgreSQL worker takes its time to start), so
    // the fire is a few seconds ahead whatever the start took.
    let fire = (chrono::Utc::now() + chrono::Duration::seconds(8)).with_nanosecond(0).unwrap();
    let (at, tomorrow) = (local(fire), local(fire) + chrono::Duration::days(1));
    let cron = format!("{} {} {} {} {} *", at.second(), at.minute(), at.hour(), tomorrow.day(), tomorrow.month());
    let file = w.dir.path().join("payroll.yaml");
    std::fs::write(
        &file,
        format!("cron: \"{cron}\"\ntimezone: {zone}\ncalendar: {{name: today, shift: previous}}\ncatch_up: all\nplugin: file-save\naction: save\nparameters: {{path: p.txt, content: p}}\n"),
    )
    .unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "payroll", "-f", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let job = w.ctl_json(&["jobs", "show", "payroll"]);
    let at = fire.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(job["next_fire"], at.as_str(), "tomorrow's tick moved to today: {job}");
    assert_eq!(job["schedule"], format!("cron: {cron} on calendar \"today\" (shift previous)"), "{job}");
    let runs = |w: &Worker| -> Vec<Value> { w.ctl_json(&["runs", "list", "--job", "payroll"])["runs"].as_array().unwrap().clone() };
    crate::support::poll(
        "the shifted tick to run",
        std::time::Duration::from_secs(60),
        || runs(&w).iter().any(|r| r["status"] == "succeeded").then_some(()),
        || format!("{:#?}\n{}", runs(&w), w.log()),
    );
    w.signal("KILL");
    w.wait_exit(std::time::Duration::from_secs(10));
    w.start();
    // Started again after its only fire: nothing more is due, ever (next year's tick moves to
    // this same past instant).
    let job = w.ctl_json(&["jobs", "show", "payroll"]);
    assert!(job["next_fire"].is_null(), "{job}");
    // A manual run through the same worker has been taken and run after the restart's catch-up
    // pass (which comes first): the scheduler had its chance to fire the tick again.
    let (code, out, err) = w.ctl(&["jobs", "trigger", "payroll", "--wait", "--timeout", "30"]);
    assert_eq!(code, 0, "{out}{err}");
    let all = runs(&w);
    let ticks: Vec<&Value> = all.iter().filter(|r| r["trigger"] != "manual").collect();
    assert_eq!(ticks.len(), 1, "one run for the shifted tick: {all:#?}");
    assert_eq!(ticks[0]["scheduled_at"], at.as_str(), "{all:#?}");
    assert_eq!(ticks[0]["trigger"], "cron", "{all:#?}");
}

#[test]
fn a_shifted_tick_fires_once_across_a_kill_9_on_sqlite() {
    a_shifted_tick_fires_once_across_a_kill_9("");
}

#[test]
fn a_shifted_tick_fires_once_across_a_kill_9_on_postgres() {
    let cluster = lamplighter_tests::pg::Cluster::start();
    a_shifted_tick_fires_once_across_a_kill_9(&format!("storage:\n  provider: postgres\n  connection_string: \"{}\"\n", cluster.url()));
}

/// The holiday files and the rules file: the days the product reads from each equal the days
/// an independent library expands (Python `icalendar` + `recurring-ical-events`, through
/// `tests/oracle/ics_days.py`), with the same event's summary on each, over five years; and
/// the oracle's answer is the one recorded in `tests/data/ics/expected/` (a library update
/// that changes it is seen).
#[test]
fn ics_files_expand_to_the_days_an_independent_library_finds() {
    let python = lamplighter_tests::setup::python_ics();
    let root = crate::support::repo_root();
    let mut counted = 0;
    for name in ["de", "us", "gb-eng", "jp", "fr", "rules"] {
        let file = root.join(format!("tests/data/ics/{name}.ics"));
        let out = std::process::Command::new(&python)
            .arg(root.join("tests/oracle/ics_days.py"))
            .arg(&file)
            .args(["2026-01-01", "2031-01-01"])
            .output()
            .expect("run the oracle");
        assert!(out.status.success(), "oracle on {name}: {}", String::from_utf8_lossy(&out.stderr));
        let oracle: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let recorded: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(root.join(format!("tests/data/ics/expected/{name}.json"))).unwrap()).unwrap();
        assert_eq!(oracle, recorded, "{name}: the oracle's answer moved from the recorded one");
        let text = std::fs::read_to_string(&file).unwrap();
        let ours = lamplighter_config::ics_days(&text).unwrap_or_else(|(line, e)| panic!("{name}.ics:{line}: {e}"));
        let (from, to) = (chrono::NaiveDate::from_ymd_opt(2026, 1, 1).unwrap(), chrono::NaiveDate::from_ymd_opt(2031, 1, 1).unwrap());
        let ours: Vec<Value> =
            ours.range(from..to).map(|(d, s)| serde_json::json!({"day": d.format("%Y-%m-%d").to_string(), "summary": s})).collect();
        assert_eq!(ours, oracle, "{name}: days and summaries");
        assert!(oracle.len() >= 30, "{name}: a real file ({} days)", oracle.len());
        counted += oracle.len();
    }
    assert!(counted > 300, "{counted}");
}

/// The fire times of jobs on business days less Germany's or the United States' public
/// holidays (their .ics files), around year ends and DST changes, equal croniter's fires
/// filtered by the same days (`tests/oracle/calendar_fires.py`).
#[test]
fn calendar_jobs_fire_when_croniter_filtered_by_the_same_days_does() {
    let python = lamplighter_tests::setup::python_ics();
    let root = crate::support::repo_root();
    let dir = tempfile::tempdir().unwrap();
    let mut compared = 0;
    for (country, zone) in [("de", "Europe/Berlin"), ("us", "America/New_York")] {
        std::fs::copy(root.join(format!("tests/data/ics/{country}.ics")), dir.path().join("holidays.ics")).unwrap();
        for cron in ["30 6 * * *", "0 9,17 * * *", "*/30 8-9 * * 1-5", "15 4 1,15 * *"] {
            let yaml = format!(
                "scheduling:\n  calendars:\n    business: {{weekdays: [mon..fri], except: [holidays]}}\n    holidays: {{ics: holidays.ics}}\n  jobs:\n    j:\n      cron: \"{cron}\"\n      timezone: {zone}\n      calendar: business\n      type: plugin\n      plugin: file-save\n      action: save\n"
            );
            std::fs::write(dir.path().join("lamplighter.yaml"), yaml).unwrap();
            let opts = lamplighter_config::LoadOptions {
                path: Some(dir.path().join("lamplighter.yaml")),
                cwd: Some(dir.path().to_path_buf()),
                ..Default::default()
            };
            let config = lamplighter_config::load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
            let schedule = config.jobs["j"].schedule.clone().unwrap();
            for from in ["2026-12-20T00:00:00Z", "2027-03-25T12:00:00Z", "2027-10-29T00:00:00Z", "2029-12-22T17:00:00Z"] {
                let out = std::process::Command::new(&python)
                    .arg(root.join("tests/oracle/calendar_fires.py"))
                    .args([cron, zone])
                    .arg(dir.path().join("holidays.ics"))
                    .args([from, "25"])
                    .output()
                    .expect("run the oracle");
                assert!(out.status.success(), "oracle: {}", String::from_utf8_lossy(&out.stderr));
                let oracle: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
                let start = chrono::DateTime::parse_from_rfc3339(from).unwrap().with_timezone(&chrono::Utc);
                let ours: Vec<String> =
                    schedule.upcoming(start, 25).iter().map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).collect();
                assert_eq!(ours, oracle, "{cron} in {zone} on {country} business days from {from}");
                compared += ours.len();
            }
        }
    }
    assert_eq!(compared, 2 * 4 * 4 * 25);
}
