//! The workspace's crates depend on one another one way: a crate's source (`src/`, its unit
//! tests included, its comments and doc examples not) names only the workspace crates among its
//! `[dependencies]`. A dev-dependency
//! on a crate built on top of it (the test harness, which depends on the core) serves its
//! integration tests (`tests/`) only; named from `src/`, it would make the core's unit tests lean
//! on a layer above it.

use std::collections::BTreeSet;
use std::path::Path;

/// The workspace's members and their crate names (`mdrelay-proto` is `mdrelay_proto` in code).
fn members(root: &Path) -> Vec<(String, String)> {
    let manifest: toml::Table = toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    members
        .iter()
        .map(|m| {
            let dir = m.as_str().unwrap().to_string();
            let crate_manifest: toml::Table =
                toml::from_str(&std::fs::read_to_string(root.join(&dir).join("Cargo.toml")).unwrap()).unwrap();
            (dir, crate_manifest["package"]["name"].as_str().unwrap().replace('-', "_"))
        })
        .collect()
}

/// Every `.rs` file under `dir`, generated code left out.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "generated") {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn a_crates_source_names_only_the_workspace_crates_it_depends_on() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members = members(&root);
    let mut wrong = Vec::new();
    for (dir, own) in &members {
        let manifest: toml::Table =
            toml::from_str(&std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap()).unwrap();
        let depends: BTreeSet<String> = manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|d| d.keys().map(|k| k.replace('-', "_")).collect())
            .unwrap_or_default();
        let mut files = Vec::new();
        sources(&root.join(dir).join("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (_, other) in members.iter().filter(|(_, name)| name != own && !depends.contains(name)) {
                // Comments and doc examples left out: a doctest is built as an integration test.
                let code = |l: &&str| !l.trim_start().starts_with("//");
                if let Some(line) = text.lines().position(|l| code(&l) && l.contains(&format!("{other}::"))) {
                    wrong.push(format!("{}:{}: names {other}, not among its [dependencies]", file.display(), line + 1));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "sources reaching past their dependencies:\n{}", wrong.join("\n"));
}

/// The relay protocol's core does no I/O: its `clippy.toml` bans reading files, sockets, clocks,
/// sleeping and OS randomness, and CI's clippy pass (`-D warnings`) holds its code to that. This
/// keeps the ban from being thinned or allowed away in the crate's code: the one allowance is on
/// the test-only module that finds the shared captures.
#[test]
fn the_relay_core_is_banned_from_io_by_its_clippy_configuration() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("proto/clippy.toml")).unwrap()).unwrap();
    let banned = |key: &str| -> BTreeSet<String> {
        config[key].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap().to_string()).collect()
    };
    let (methods, types) = (banned("disallowed-methods"), banned("disallowed-types"));
    for method in ["std::time::Instant::now", "std::time::SystemTime::now", "std::thread::sleep", "rand::random"] {
        assert!(methods.contains(method), "proto/clippy.toml no longer bans {method}: {methods:?}");
    }
    for ty in ["std::fs::File", "std::net::TcpStream", "std::net::TcpListener", "std::net::UdpSocket"] {
        assert!(types.contains(ty), "proto/clippy.toml no longer bans {ty}: {types:?}");
    }
    let mut files = Vec::new();
    sources(&root.join("proto/src"), &mut files);
    let mut allowed = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("clippy::disallowed_") && !line.contains("`expected` serves mdrelay-iex") {
                allowed.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(allowed.is_empty(), "the I/O ban is allowed away in the core's code:\n{}", allowed.join("\n"));
}
