//! `project-detect.analyze`: the languages, frameworks and build tools of a project, judged by
//! marker files (`Cargo.toml`, `package.json`, `pyproject.toml`, `go.mod`, `pom.xml`,
//! `*.csproj`, …) and, for a few of them, by the dependencies they declare.
//!
//! The seed describes the action as "detect project language, framework, and build tools", so
//! the result is `{ directory, languages, frameworks, build_tools, markers }`: lists in the order
//! found, without duplicates, and `markers` the files the verdict rests on (relative to the
//! analyzed directory). The directory and its direct subdirectories are looked at, so a
//! monorepo's `frontend/package.json` or a .NET solution's `src/App/App.csproj` one level down
//! is still seen; deeper trees, hidden directories, dependency and build-output folders are not.
//! Only regular files are read (never through a symlink), at most [`MAX_MARKER_BYTES`] each.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::confine;
use super::params::Params;
use crate::{ActionContext, ActionError};

/// Marker files read for dependency names are read up to this size.
const MAX_MARKER_BYTES: u64 = 1024 * 1024;
/// Most directory entries one analysis looks at.
const MAX_ENTRIES: usize = 10_000;

/// File name → (language, build tool).
const MARKERS: &[(&str, Option<&str>, Option<&str>)] = &[
    ("Cargo.toml", Some("Rust"), Some("Cargo")),
    ("go.mod", Some("Go"), Some("Go modules")),
    ("package.json", Some("JavaScript"), None),
    ("tsconfig.json", Some("TypeScript"), None),
    ("deno.json", Some("TypeScript"), Some("Deno")),
    ("deno.jsonc", Some("TypeScript"), Some("Deno")),
    ("pyproject.toml", Some("Python"), None),
    ("setup.py", Some("Python"), Some("setuptools")),
    ("setup.cfg", Some("Python"), Some("setuptools")),
    ("requirements.txt", Some("Python"), Some("pip")),
    ("Pipfile", Some("Python"), Some("Pipenv")),
    ("poetry.lock", Some("Python"), Some("Poetry")),
    ("uv.lock", Some("Python"), Some("uv")),
    ("pom.xml", Some("Java"), Some("Maven")),
    ("build.gradle", Some("Java"), Some("Gradle")),
    ("build.gradle.kts", Some("Kotlin"), Some("Gradle")),
    ("settings.gradle", None, Some("Gradle")),
    ("settings.gradle.kts", None, Some("Gradle")),
    ("build.sbt", Some("Scala"), Some("sbt")),
    ("Gemfile", Some("Ruby"), Some("Bundler")),
    ("composer.json", Some("PHP"), Some("Composer")),
    ("mix.exs", Some("Elixir"), Some("Mix")),
    ("rebar.config", Some("Erlang"), Some("rebar3")),
    ("stack.yaml", Some("Haskell"), Some("Stack")),
    ("Package.swift", Some("Swift"), Some("Swift Package Manager")),
    ("pubspec.yaml", Some("Dart"), Some("pub")),
    ("CMakeLists.txt", Some("C/C++"), Some("CMake")),
    ("meson.build", Some("C/C++"), Some("Meson")),
    ("Makefile", None, Some("Make")),
    ("GNUmakefile", None, Some("Make")),
    ("package-lock.json", None, Some("npm")),
    ("yarn.lock", None, Some("Yarn")),
    ("pnpm-lock.yaml", None, Some("pnpm")),
    ("bun.lock", None, Some("Bun")),
    ("bun.lockb", None, Some("Bun")),
    ("Dockerfile", None, Some("Docker")),
    ("docker-compose.yml", None, Some("Docker Compose")),
    ("docker-compose.yaml", None, Some("Docker Compose")),
    ("compose.yaml", None, Some("Docker Compose")),
    ("compose.yml", None, Some("Docker Compose")),
];

/// File extension → (language, build tool), for markers whose name varies.
const EXTENSIONS: &[(&str, Option<&str>, &str)] = &[
    ("csproj", Some("C#"), ".NET"),
    ("fsproj", Some("F#"), ".NET"),
    ("vbproj", Some("Visual Basic"), ".NET"),
    ("sln", None, ".NET"),
    ("slnx", None, ".NET"),
    ("cabal", Some("Haskell"), "Cabal"),
    ("gemspec", Some("Ruby"), "RubyGems"),
    ("nimble", Some("Nim"), "Nimble"),
];

/// Marker file (name, or `.ext`) → (text it contains, lowercased, framework).
const FRAMEWORK_TEXT: &[(&str, &str, &str)] = &[
    (".csproj", "microsoft.net.sdk.web", "ASP.NET Core"),
    (".csproj", "microsoft.net.sdk.blazorwebassembly", "Blazor"),
    (".csproj", "<usemaui>true", ".NET MAUI"),
    (".csproj", "microsoft.net.sdk.worker", ".NET Worker Service"),
    ("go.mod", "github.com/gin-gonic/gin", "Gin"),
    ("go.mod", "github.com/labstack/echo", "Echo"),
    ("go.mod", "github.com/gofiber/fiber", "Fiber"),
    ("go.mod", "github.com/go-chi/chi", "chi"),
    ("pom.xml", "spring-boot", "Spring Boot"),
    ("pom.xml", "io.quarkus", "Quarkus"),
    ("pom.xml", "io.micronaut", "Micronaut"),
    ("build.gradle", "spring-boot", "Spring Boot"),
    ("build.gradle.kts", "spring-boot", "Spring Boot"),
    ("build.gradle.kts", "io.ktor", "Ktor"),
    ("pyproject.toml", "django", "Django"),
    ("pyproject.toml", "flask", "Flask"),
    ("pyproject.toml", "fastapi", "FastAPI"),
    ("requirements.txt", "django", "Django"),
    ("requirements.txt", "flask", "Flask"),
    ("requirements.txt", "fastapi", "FastAPI"),
    ("Pipfile", "django", "Django"),
    ("Pipfile", "flask", "Flask"),
    ("Pipfile", "fastapi", "FastAPI"),
    ("Gemfile", "'rails'", "Ruby on Rails"),
    ("Gemfile", "\"rails\"", "Ruby on Rails"),
    ("Gemfile", "sinatra", "Sinatra"),
    ("composer.json", "laravel/framework", "Laravel"),
    ("composer.json", "symfony/framework-bundle", "Symfony"),
    ("mix.exs", ":phoenix", "Phoenix"),
    ("pubspec.yaml", "flutter:", "Flutter"),
];

/// Python build backends named in `pyproject.toml` (lowercased text) → build tool.
const PYPROJECT_TOOLS: &[(&str, &str)] = &[
    ("[tool.poetry", "Poetry"),
    ("hatchling", "Hatch"),
    ("pdm-backend", "PDM"),
    ("flit_core", "Flit"),
    ("maturin", "maturin"),
    ("setuptools", "setuptools"),
];

/// `Cargo.toml` dependency → framework.
const CARGO_FRAMEWORKS: &[(&str, &str)] = &[
    ("axum", "Axum"),
    ("actix-web", "Actix Web"),
    ("rocket", "Rocket"),
    ("warp", "warp"),
    ("tokio", "Tokio"),
    ("tauri", "Tauri"),
    ("leptos", "Leptos"),
    ("bevy", "Bevy"),
];

/// `package.json` dependency → framework (or build tool, for bundlers).
const NPM_FRAMEWORKS: &[(&str, &str)] = &[
    ("next", "Next.js"),
    ("react", "React"),
    ("vue", "Vue"),
    ("nuxt", "Nuxt"),
    ("@angular/core", "Angular"),
    ("svelte", "Svelte"),
    ("@sveltejs/kit", "SvelteKit"),
    ("solid-js", "Solid"),
    ("express", "Express"),
    ("fastify", "Fastify"),
    ("@nestjs/core", "NestJS"),
    ("electron", "Electron"),
];
const NPM_BUNDLERS: &[(&str, &str)] = &[("vite", "Vite"), ("webpack", "webpack"), ("esbuild", "esbuild"), ("parcel", "Parcel")];

/// Subdirectories not looked into: dependencies and build output, not the project.
const SKIPPED_DIRS: &[&str] = &["node_modules", "target", "vendor", "bin", "obj", "dist", "build", "out", "venv", "__pycache__"];

#[derive(Debug, Default)]
struct Detected {
    languages: Vec<String>,
    frameworks: Vec<String>,
    build_tools: Vec<String>,
    markers: Vec<String>,
}

pub(crate) async fn analyze(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let dir = confine::resolve_dir(params.action(), &ctx.working_directory, params.str("directory"))?;
    let shown = params.str("directory").unwrap_or(".").to_owned();
    if !dir.is_dir() {
        return Err(params.failed(format!("\"{shown}\" is not a directory")));
    }
    let action = params.action().to_owned();
    let detected = tokio::task::spawn_blocking(move || detect(&dir))
        .await
        .map_err(|e| ActionError::Failed { action, message: format!("analysis task failed: {e}") })?;
    Ok(json!({
        "directory": shown,
        "languages": detected.languages,
        "frameworks": detected.frameworks,
        "build_tools": detected.build_tools,
        "markers": detected.markers,
    }))
}

fn detect(dir: &Path) -> Detected {
    let mut found = Detected::default();
    let mut seen = 0;
    let mut subdirs = Vec::new();
    for (entry_path, relative, is_dir) in entries(dir, "", &mut seen) {
        if is_dir {
            subdirs.push((entry_path, relative));
        } else {
            found.file(&entry_path, &relative);
        }
    }
    for (subdir, relative) in subdirs {
        for (entry_path, inner, is_dir) in entries(&subdir, &relative, &mut seen) {
            if !is_dir {
                found.file(&entry_path, &inner);
            }
        }
    }
    // A lock file alone names the package manager; `package.json` without one means npm.
    let js_tools = ["npm", "Yarn", "pnpm", "Bun", "Deno"];
    if found.markers.iter().any(|m| file_name(m) == "package.json") && !found.build_tools.iter().any(|t| js_tools.contains(&t.as_str())) {
        add(&mut found.build_tools, "npm");
    }
    found
}

/// The regular files and plain (not hidden, not skipped, not symlinked) directories in `dir`,
/// sorted by name, as (path, path relative to the analyzed directory, is a directory).
fn entries(dir: &Path, relative: &str, seen: &mut usize) -> Vec<(PathBuf, String, bool)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in read.filter_map(Result::ok) {
        *seen += 1;
        if *seen > MAX_ENTRIES {
            break;
        }
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path_in_dir = if relative.is_empty() { name.clone() } else { format!("{relative}/{name}") };
        if kind.is_dir() {
            if !name.starts_with('.') && !SKIPPED_DIRS.contains(&name.as_str()) {
                out.push((entry.path(), path_in_dir, true));
            }
        } else if kind.is_file() {
            out.push((entry.path(), path_in_dir, false));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

impl Detected {
    /// Records what one file says, if it is a marker.
    fn file(&mut self, path: &Path, relative: &str) {
        let name = file_name(relative);
        let extension = name.rsplit_once('.').map(|(_, ext)| ext).unwrap_or_default();
        let mut is_marker = false;
        if let Some(&(_, language, tool)) = MARKERS.iter().find(|&&(marker, _, _)| marker == name) {
            is_marker = true;
            if let Some(language) = language {
                add(&mut self.languages, language);
            }
            if let Some(tool) = tool {
                add(&mut self.build_tools, tool);
            }
        } else if let Some(&(_, language, tool)) = EXTENSIONS.iter().find(|&&(ext, _, _)| ext == extension) {
            is_marker = true;
            if let Some(language) = language {
                add(&mut self.languages, language);
            }
            add(&mut self.build_tools, tool);
        }
        if !is_marker {
            return;
        }
        self.markers.push(relative.to_owned());
        let key = if MARKERS.iter().any(|&(marker, _, _)| marker == name) { name.to_owned() } else { format!(".{extension}") };
        let needs_text = FRAMEWORK_TEXT.iter().any(|&(file, _, _)| file == key.as_str())
            || matches!(name, "Cargo.toml" | "package.json" | "pyproject.toml");
        if !needs_text {
            return;
        }
        let Some(text) = read_small(path) else {
            return;
        };
        let lower = text.to_lowercase();
        for &(file, needle, framework) in FRAMEWORK_TEXT {
            if file == key.as_str() && lower.contains(needle) {
                add(&mut self.frameworks, framework);
            }
        }
        match name {
            "Cargo.toml" => {
                for &(dependency, framework) in CARGO_FRAMEWORKS {
                    if declares_toml_key(&text, dependency) {
                        add(&mut self.frameworks, framework);
                    }
                }
            }
            "package.json" => self.package_json(&text),
            "pyproject.toml" => {
                // No known backend named: a plain `pip install .` project.
                let tool = PYPROJECT_TOOLS.iter().find(|&&(needle, _)| lower.contains(needle)).map_or("pip", |&(_, tool)| tool);
                add(&mut self.build_tools, tool);
            }
            _ => {}
        }
    }

    fn package_json(&mut self, text: &str) {
        let Ok(manifest) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let declared = |name: &str| {
            ["dependencies", "devDependencies", "peerDependencies"]
                .iter()
                .any(|section| manifest.get(section).and_then(Value::as_object).is_some_and(|deps| deps.contains_key(name)))
        };
        if declared("typescript") {
            add(&mut self.languages, "TypeScript");
        }
        for &(dependency, framework) in NPM_FRAMEWORKS {
            if declared(dependency) {
                add(&mut self.frameworks, framework);
            }
        }
        for &(dependency, tool) in NPM_BUNDLERS {
            if declared(dependency) {
                add(&mut self.build_tools, tool);
            }
        }
    }
}

/// True when a line of the TOML text starts with `key` as a key (`axum = …`, `axum.workspace
/// = true`), which is how `Cargo.toml` declares a dependency.
fn declares_toml_key(text: &str, key: &str) -> bool {
    text.lines().any(|line| line.trim_start().strip_prefix(key).is_some_and(|rest| rest.starts_with([' ', '\t', '=', '.'])))
}

fn read_small(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > MAX_MARKER_BYTES {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

fn file_name(relative: &str) -> &str {
    relative.rsplit('/').next().unwrap_or(relative)
}

fn add(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|existing| existing == item) {
        list.push(item.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::declares_toml_key;

    #[test]
    fn cargo_dependencies_are_keys_not_substrings() {
        let cargo = "[dependencies]\naxum = \"0.8\"\ntokio.workspace = true\nwarpgate = \"1\"\n# rocket = \"0.5\"\n";
        assert!(declares_toml_key(cargo, "axum"));
        assert!(declares_toml_key(cargo, "tokio"));
        assert!(!declares_toml_key(cargo, "warp"));
        assert!(!declares_toml_key(cargo, "rocket"));
    }
}
