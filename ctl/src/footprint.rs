//! A test that keeps lampctl small (SPEC §1): no wasmtime, sqlx or async-openai anywhere
//! under it. It walks lamplighter-ctl's dependencies in the workspace's Cargo.lock, which
//! lists for each package every dependency some workspace feature enables: a superset of
//! lampctl's own tree, so a heavy crate cannot hide from it.

use std::collections::BTreeSet;

const HEAVY: [&str; 3] = ["wasmtime", "sqlx", "async-openai"];

struct Package {
    name: String,
    version: String,
    /// Entries as the lock writes them: `name`, `name version` or `name version (source)`.
    dependencies: Vec<String>,
}

fn packages(lock: &str) -> Vec<Package> {
    lock.split("[[package]]")
        .skip(1)
        .map(|block| {
            let field = |key: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(key)?.strip_prefix(" = \"")?.strip_suffix('"'))
                    .unwrap_or_default()
                    .to_owned()
            };
            let dependencies = block
                .split_once("dependencies = [")
                .and_then(|(_, rest)| rest.split(']').next())
                .map(|list| list.split('"').skip(1).step_by(2).map(str::to_owned).collect())
                .unwrap_or_default();
            Package { name: field("name"), version: field("version"), dependencies }
        })
        .collect()
}

#[test]
fn lampctl_depends_on_no_heavy_crate() {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock")).expect("the workspace's Cargo.lock");
    let packages = packages(&lock);
    let find = |entry: &str| {
        let mut parts = entry.split_whitespace();
        let name = parts.next()?;
        let version = parts.next();
        packages.iter().find(|package| package.name == name && version.is_none_or(|version| package.version == version))
    };
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut stack = vec![find("lamplighter-ctl").expect("lamplighter-ctl in Cargo.lock")];
    while let Some(package) = stack.pop() {
        if seen.insert((package.name.as_str(), package.version.as_str())) {
            stack.extend(package.dependencies.iter().filter_map(|entry| find(entry.as_str())));
        }
    }
    assert!(seen.iter().any(|&(name, _)| name == "rmcp"), "the walk should reach rmcp; is the lock format understood?");
    let heavy: Vec<&(&str, &str)> = seen.iter().filter(|&&(name, _)| HEAVY.iter().any(|heavy| name.starts_with(*heavy))).collect();
    assert!(heavy.is_empty(), "lampctl must stay small (SPEC §1), but depends on {heavy:?}");
}
