//! Skills (`skills.dirs`, an agent's `skills`): read at load, and every broken folder a located
//! error of the config.

use std::path::Path;

use lamplighter_config::{LoadOptions, load_with_env};

fn write(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// The config (and warnings) or the errors, as printed, the folder left out.
fn load(dir: &Path) -> Result<(lamplighter_config::Config, Vec<String>), Vec<String>> {
    let opts = LoadOptions { path: Some(dir.join("lamplighter.yaml")), cwd: Some(dir.to_path_buf()), ..Default::default() };
    let shown = |d: &lamplighter_config::Diagnostic| d.to_string().replace(&format!("{}/", dir.display()), "");
    match load_with_env(&opts, |_| None) {
        Ok(l) => Ok((l.config, l.warnings.iter().map(shown).collect())),
        Err(e) => Err(e.0.iter().map(shown).collect()),
    }
}

const AGENTS: &str = "ai:\n  providers:\n    local: {base_url: \"http://127.0.0.1:9/v1\", models: {m: {id: m}}}\n  default_model: m\n";

#[test]
fn skill_folders_are_read_and_agents_name_them() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "lamplighter.yaml", &format!("{AGENTS}skills:\n  dirs: [skills]\nagents:\n  writer:\n    skills: [release-notes]\n"));
    write(
        tmp.path(),
        "skills/release-notes/SKILL.md",
        "---\nname: release-notes\ndescription: Write release notes from a range of commits.\nlicense: MIT\nversion: 2\n---\n\nGroup the commits by area.\n",
    );
    write(tmp.path(), "skills/release-notes/templates/notes.md", "## Changes\n");
    write(tmp.path(), "skills/.git/SKILL.md", "not a skill: hidden folders are skipped");
    write(tmp.path(), "skills/README.md", "files next to the skill folders are not skills");
    let (c, warnings) = load(tmp.path()).unwrap_or_else(|e| panic!("{e:#?}"));
    let skill = &c.skills["release-notes"];
    assert_eq!(skill.description, "Write release notes from a range of commits.");
    assert_eq!(skill.dir, tmp.path().join("skills/release-notes"));
    assert_eq!(c.skills.len(), 1);
    assert_eq!(c.agents["writer"].skills, ["release-notes"]);
    assert_eq!(
        warnings,
        [
            "skills/release-notes/SKILL.md:5:1: warning: SKILL.md's front matter key \"version\" is not used here (known: name, description, license, allowed-tools, metadata, compatibility)"
        ]
    );
}

#[test]
fn broken_skill_folders_and_unknown_skills_are_located_errors() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "lamplighter.yaml",
        &format!("{AGENTS}skills:\n  dirs: [skills, more, missing]\nagents:\n  writer:\n    skills: [release-notes, releese-notes]\n"),
    );
    write(tmp.path(), "skills/release-notes/SKILL.md", "---\nname: release-notes\ndescription: Notes.\n---\nDo it.\n");
    write(tmp.path(), "skills/no-file/notes.md", "no SKILL.md here");
    write(tmp.path(), "skills/no-front/SKILL.md", "Just instructions.\n");
    write(tmp.path(), "skills/wrong-name/SKILL.md", "---\nname: right-name\ndescription: x\n---\nDo it.\n");
    write(tmp.path(), "skills/no-description/SKILL.md", "---\nname: no-description\n---\nDo it.\n");
    write(tmp.path(), "skills/empty/SKILL.md", "---\nname: empty\ndescription: x\n---\n\n");
    write(tmp.path(), "skills/bad-yaml/SKILL.md", "---\nname: bad-yaml\ndescription: [unclosed\n---\nDo it.\n");
    write(tmp.path(), "more/release-notes/SKILL.md", "---\nname: release-notes\ndescription: again\n---\nDo it.\n");
    let errors = load(tmp.path()).unwrap_err();
    let want = [
        "lamplighter.yaml:9:29: error: agent \"writer\" names skill \"releese-notes\", which is not defined (did you mean \"release-notes\"?)",
        "lamplighter.yaml:6:24: error: skills.dirs: cannot read the folder missing",
        "lamplighter.yaml:6:10: error: skills.dirs: the folder skills/no-file is not a skill: cannot read its SKILL.md",
        "more/release-notes/SKILL.md:1:1: error: skill \"release-notes\" is defined twice",
        "skills/bad-yaml/SKILL.md:4:1: error: SKILL.md's front matter is not YAML",
        "skills/empty/SKILL.md:5:1: error: SKILL.md has no instructions below its front matter",
        "skills/no-description/SKILL.md:1:1: error: SKILL.md needs a `description:`",
        "skills/no-front/SKILL.md:1:1: error: SKILL.md has no front matter",
        "skills/wrong-name/SKILL.md:2:1: error: skill name \"right-name\" differs from its folder's \"wrong-name\"",
    ];
    for w in want {
        assert!(errors.iter().any(|e| e.starts_with(w)), "missing {w}\nin {errors:#?}");
    }
    assert_eq!(errors.len(), want.len(), "{errors:#?}");
}
