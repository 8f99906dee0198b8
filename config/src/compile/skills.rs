//! Compiles `skills.dirs`: each folder in them is a skill, read and checked at load, so that a
//! broken skill is a located error of the config rather than a surprise mid-run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Compiler;
use crate::ai::Skill;
use crate::diag::{Diagnostic, Location};
use crate::load::keys;
use crate::yaml::{self, Seg};

/// The front matter keys of a `SKILL.md` besides `name` and `description`, as the common skill
/// format defines them; accepted and not used here.
const KNOWN_KEYS: &[&str] = &["name", "description", "license", "allowed-tools", "metadata", "compatibility"];

/// Longest name and description, as the common skill format bounds them.
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1024;

impl Compiler<'_> {
    /// The skills of every folder of `skills.dirs` (relative to `cwd`), by name.
    pub(super) fn skills(&mut self, cwd: &Path) -> BTreeMap<String, Skill> {
        let dirs = self.loaded.raw.skills.as_ref().and_then(|s| s.dirs.clone()).unwrap_or_default();
        let mut out: BTreeMap<String, Skill> = BTreeMap::new();
        for (i, d) in dirs.iter().enumerate() {
            let at = [keys(&["skills", "dirs"]), vec![Seg::Index(i)]].concat();
            let dir = cwd.join(d);
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) => {
                    let loc = self.loaded.sources.locate(&at);
                    self.diags.push(Diagnostic::error(loc, format!("skills.dirs: cannot read the folder {}: {e}", dir.display())));
                    continue;
                }
            };
            let mut folders: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
                .collect();
            folders.sort();
            for folder in folders {
                let Some(skill) = self.skill(&folder, &at) else { continue };
                if let Some(first) = out.get(&skill.name) {
                    let loc = Location { file: folder.join("SKILL.md"), line: 1, col: 1 };
                    self.diags.push(Diagnostic::error(
                        Some(loc),
                        format!("skill \"{}\" is defined twice: also in {}", skill.name, first.dir.display()),
                    ));
                    continue;
                }
                out.insert(skill.name.clone(), skill);
            }
        }
        out
    }

    /// One skill folder, checked: its `SKILL.md`, front matter with a `name` (the folder's)
    /// and a `description`, and instructions below it.
    fn skill(&mut self, folder: &Path, listed_at: &[Seg]) -> Option<Skill> {
        let file = folder.join("SKILL.md");
        let folder_name = folder.file_name().unwrap_or_default().to_string_lossy().to_string();
        let at = |line: usize| Some(Location { file: file.clone(), line, col: 1 });
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                let loc = self.loaded.sources.locate(listed_at);
                self.diags.push(Diagnostic::error(
                    loc,
                    format!("skills.dirs: the folder {} is not a skill: cannot read its SKILL.md ({e})", folder.display()),
                ));
                return None;
            }
        };
        let Some((front, body)) = yaml::split_front_matter(&text) else {
            let msg = "SKILL.md has no front matter: start it with a `---` line, `name:` and `description:`, and another `---`";
            self.diags.push(Diagnostic::error(at(1), msg));
            return None;
        };
        // The line of a front matter key, for errors about it (the file's first line is `---`).
        let line_of = |key: &str| front.lines().position(|l| l.starts_with(&format!("{key}:"))).map_or(1, |i| i + 2);
        let map = match serde_yaml::from_str::<serde_yaml::Value>(front) {
            Ok(serde_yaml::Value::Mapping(m)) => m,
            Ok(_) => {
                self.diags.push(Diagnostic::error(at(2), "SKILL.md's front matter is not a map of keys"));
                return None;
            }
            Err(e) => {
                let line = e.location().map_or(2, |l| l.line() + 1);
                self.diags.push(Diagnostic::error(at(line), format!("SKILL.md's front matter is not YAML: {e}")));
                return None;
            }
        };
        let text_of = |key: &str| map.get(key).and_then(serde_yaml::Value::as_str).map(str::trim).filter(|s| !s.is_empty());
        let mut ok = true;
        let name = text_of("name");
        match name {
            None => {
                self.diags.push(Diagnostic::error(at(line_of("name")), "SKILL.md needs a `name:` (the folder's name)"));
                ok = false;
            }
            Some(n) if n != folder_name => {
                let msg = format!("skill name \"{n}\" differs from its folder's \"{folder_name}\": they must be the same");
                self.diags.push(Diagnostic::error(at(line_of("name")), msg));
                ok = false;
            }
            Some(n) if n.len() > MAX_NAME || !n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') => {
                let msg = format!("skill name \"{n}\" must be lowercase letters, digits and hyphens, at most {MAX_NAME} characters");
                self.diags.push(Diagnostic::error(at(line_of("name")), msg));
                ok = false;
            }
            Some(_) => {}
        }
        let description = text_of("description");
        match description {
            None => {
                let msg = "SKILL.md needs a `description:`: what the skill does and when to use it (the agent chooses by it)";
                self.diags.push(Diagnostic::error(at(line_of("description")), msg));
                ok = false;
            }
            Some(d) if d.len() > MAX_DESCRIPTION => {
                let msg = format!("the skill's description is {} characters; at most {MAX_DESCRIPTION}", d.len());
                self.diags.push(Diagnostic::error(at(line_of("description")), msg));
                ok = false;
            }
            Some(_) => {}
        }
        if body.trim().is_empty() {
            let line = text[..text.len() - body.len()].lines().count() + 1;
            self.diags.push(Diagnostic::error(at(line), "SKILL.md has no instructions below its front matter"));
            ok = false;
        }
        for key in map.keys().filter_map(serde_yaml::Value::as_str) {
            if !KNOWN_KEYS.contains(&key) {
                let msg = format!("SKILL.md's front matter key \"{key}\" is not used here (known: {})", KNOWN_KEYS.join(", "));
                self.diags.push(Diagnostic::warning(at(line_of(key)), msg));
            }
        }
        ok.then(|| Skill { name: folder_name, description: description.unwrap_or_default().to_string(), dir: folder.to_path_buf() })
    }
}
