//! Jobs on calendars (SPEC §4a): a job fires only on its calendar's days, for jobs from files
//! and jobs made at runtime alike, and a calendar that does not exist is refused by name.

use serde_json::Value;

use crate::support::Worker;

/// Far enough ahead that the test does not depend on today: March 2031, its first three days
/// excepted.
const CALENDARS: &str =
    "calendars:\n  march: {dates: [\"2031-03-01..2031-03-05\"], except: [off]}\n  off: {dates: [\"2031-03-01..2031-03-03\"]}\n";

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
    let show = |job: &str| {
        let (code, out, err) = w.ctl(&["jobs", "show", job, "-o", "json"]);
        assert_eq!(code, 0, "{out}{err}");
        serde_json::from_str::<Value>(&out).unwrap()
    };
    let payroll = show("payroll");
    assert_eq!(payroll["next_fire"], "2031-03-04T06:00:00Z", "the first day of march not in off: {payroll}");
    assert_eq!(payroll["schedule"], "cron: 0 6 * * * on calendar \"march\"", "{payroll}");

    // A schedule previewed on a calendar, from an instant of choice: the days passed over, and why.
    let (code, out, err) = w.ctl(&[
        "schedule",
        "preview",
        "--cron",
        "0 6 * * *",
        "--calendar",
        "march",
        "--from",
        "2031-02-28T12:00:00Z",
        "-n",
        "2",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let preview: Value = serde_json::from_str(&out).unwrap();
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
}
