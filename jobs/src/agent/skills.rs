//! Skills (SPEC §6): what an agent's prompt says of its skills, and `load_skill`, the tool that
//! reads a skill's instructions or one of its files when the agent decides it needs them. Its
//! calls are recorded like any tool call, so a resumed conversation reads the same text.

use std::path::{Component, Path};

use serde_json::{Value, json};

use lamplighter_config::Skill;

/// The tool's name.
pub(crate) const TOOL: &str = "load_skill";

/// The most of a skill file a call returns (under the 100 KB a tool result keeps); more is
/// refused, saying so.
const MAX_FILE: u64 = 96 * 1024;

/// The files listed with a skill's instructions, at most.
const MAX_LISTED: usize = 200;

/// The part of the system prompt that lists the skills.
pub(crate) fn prompt(skills: &[&Skill]) -> String {
    let mut s = format!(
        "You have skills: instructions for particular tasks, with files they may refer to. When a task calls for one, \
         load its instructions with the {TOOL} tool before you start, and follow them; read a file of the skill with \
         {TOOL} and `file` when its instructions point to it.\n"
    );
    for k in skills {
        s.push_str(&format!("- {}: {}\n", k.name, k.description.trim()));
    }
    s
}

/// The tool's description and argument schema.
pub(crate) fn tool(skills: &[&Skill]) -> (String, Value) {
    let names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
    let description = format!("Load a skill's instructions (or, with `file`, one of its files). Skills: {}.", names.join(", "));
    let schema = json!({
        "type": "object",
        "properties": {
            "skill": {"type": "string", "enum": names, "description": "Which skill"},
            "file": {"type": "string", "description": "A file of the skill, relative to its folder; leave out for its instructions"}
        },
        "required": ["skill"]
    });
    (description, schema)
}

/// What a call answers: the instructions (the `SKILL.md` below its front matter) and the list
/// of the skill's other files; or, with `file`, that file's text. Errors are for the model.
pub(crate) fn load(skills: &[&Skill], args: &Value) -> Result<String, String> {
    let Some(name) = args.get("skill").and_then(Value::as_str) else {
        return Err("`skill` is missing: name one of your skills".into());
    };
    let Some(skill) = skills.iter().find(|s| s.name == name) else {
        let names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
        return Err(format!("there is no skill \"{name}\"; your skills are: {}", names.join(", ")));
    };
    match args.get("file") {
        None | Some(Value::Null) => instructions(skill),
        Some(Value::String(f)) => file(skill, f),
        Some(other) => Err(format!("`file` must be a path as a string, not {other}")),
    }
}

fn instructions(skill: &Skill) -> Result<String, String> {
    let text = std::fs::read_to_string(skill.dir.join("SKILL.md")).map_err(|e| format!("cannot read skill \"{}\": {e}", skill.name))?;
    let body = lamplighter_config::split_front_matter(&text).map_or(text.as_str(), |(_, body)| body.trim_start_matches(['\r', '\n']));
    let mut files = Vec::new();
    list(&skill.dir, &skill.dir, &mut files);
    files.sort();
    let mut out = format!("# Skill: {}\n\n{}", skill.name, body.trim_end());
    if !files.is_empty() {
        let more = files.len().saturating_sub(MAX_LISTED);
        files.truncate(MAX_LISTED);
        out.push_str(&format!("\n\nFiles of this skill (read one with {TOOL} and `file`):\n"));
        for f in &files {
            out.push_str(&format!("- {f}\n"));
        }
        if more > 0 {
            out.push_str(&format!("- … and {more} more\n"));
        }
    }
    Ok(out)
}

/// The skill's files other than `SKILL.md`, relative to its folder (hidden ones left out; a
/// linked folder is not followed, so the list stays inside the folder and ends).
fn list(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        if e.file_name().to_string_lossy().starts_with('.') || out.len() > MAX_LISTED {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            list(root, &p, out);
        } else if let Ok(rel) = p.strip_prefix(root)
            && rel != Path::new("SKILL.md")
        {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// One file of the skill, confined to its folder (no `..`, no absolute path, no link out).
fn file(skill: &Skill, rel: &str) -> Result<String, String> {
    let path = Path::new(rel.trim());
    if rel.trim().is_empty() || path.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(format!("\"{rel}\" is not a path inside the skill's folder: give it relative to the folder, without `..`"));
    }
    let full = skill.dir.join(path);
    let (Ok(real), Ok(root)) = (full.canonicalize(), skill.dir.canonicalize()) else {
        return Err(format!("skill \"{}\" has no file \"{rel}\"", skill.name));
    };
    if !real.starts_with(&root) {
        return Err(format!("\"{rel}\" leads outside the skill's folder"));
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("cannot read \"{rel}\": {e}"))?;
    if !meta.is_file() {
        return Err(format!("\"{rel}\" is a folder, not a file"));
    }
    if meta.len() > MAX_FILE {
        return Err(format!("\"{rel}\" is {} bytes; files of at most {MAX_FILE} bytes are read", meta.len()));
    }
    let bytes = std::fs::read(&real).map_err(|e| format!("cannot read \"{rel}\": {e}"))?;
    String::from_utf8(bytes).map_err(|_| format!("\"{rel}\" is not text (UTF-8); only text files are read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(dir: &Path) -> Skill {
        Skill { name: "release-notes".into(), description: "Write release notes from commits.".into(), dir: dir.to_path_buf() }
    }

    #[test]
    fn instructions_files_and_confinement() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("release-notes");
        std::fs::create_dir_all(dir.join("templates")).unwrap();
        std::fs::write(dir.join("SKILL.md"), "---\nname: release-notes\ndescription: x\n---\n\nGroup by area.\nUse templates/notes.md.\n")
            .unwrap();
        std::fs::write(dir.join("templates/notes.md"), "## Changes\n").unwrap();
        std::fs::write(tmp.path().join("secret.txt"), "no").unwrap();
        std::fs::write(dir.join("blob.bin"), [0xff, 0xfe, 0x00]).unwrap();
        let s = skill(&dir);
        let skills = [&s];

        let text = load(&skills, &json!({"skill": "release-notes"})).unwrap();
        assert!(text.starts_with("# Skill: release-notes\n\nGroup by area.\nUse templates/notes.md."), "{text}");
        assert!(!text.contains("description: x"), "the front matter is not repeated: {text}");
        assert!(text.contains("- templates/notes.md\n") && text.contains("- blob.bin\n") && !text.contains("- SKILL.md"), "{text}");
        assert_eq!(load(&skills, &json!({"skill": "release-notes", "file": "templates/notes.md"})).unwrap(), "## Changes\n");

        for (args, want) in [
            (json!({"skill": "release-notes", "file": "../secret.txt"}), "not a path inside the skill's folder"),
            (json!({"skill": "release-notes", "file": "/etc/passwd"}), "not a path inside the skill's folder"),
            (json!({"skill": "release-notes", "file": "missing.md"}), "has no file \"missing.md\""),
            (json!({"skill": "release-notes", "file": "templates"}), "is a folder"),
            (json!({"skill": "release-notes", "file": "blob.bin"}), "is not text"),
            (json!({"skill": "release-notes", "file": 3}), "must be a path as a string"),
            (json!({"skill": "other"}), "there is no skill \"other\"; your skills are: release-notes"),
            (json!({}), "`skill` is missing"),
        ] {
            let e = load(&skills, &args).unwrap_err();
            assert!(e.contains(want), "{args}: {e}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(tmp.path().join("secret.txt"), dir.join("link.txt")).unwrap();
            let e = load(&skills, &json!({"skill": "release-notes", "file": "link.txt"})).unwrap_err();
            assert!(e.contains("leads outside"), "{e}");
            // A linked folder (here: to the folder above, a loop) is not listed into.
            std::os::unix::fs::symlink(tmp.path(), dir.join("up")).unwrap();
            let text = load(&skills, &json!({"skill": "release-notes"})).unwrap();
            assert!(!text.contains("secret.txt") && !text.contains("up/"), "{text}");
        }
        std::fs::write(dir.join("huge.md"), "x".repeat(97 * 1024)).unwrap();
        let e = load(&skills, &json!({"skill": "release-notes", "file": "huge.md"})).unwrap_err();
        assert!(e.contains("files of at most 98304 bytes are read"), "{e}");
    }

    #[test]
    fn the_prompt_lists_names_and_descriptions() {
        let s = skill(Path::new("/x"));
        let p = prompt(&[&s]);
        assert!(p.contains("- release-notes: Write release notes from commits.\n") && p.contains(TOOL), "{p}");
    }
}
