//! The documents stay true to the code: the README's library example is
//! `src/bin/quickstart.rs` (which the test command builds, so the snippet compiles as written),
//! the layout lists every crate, the core README every store, docs/metrics.md every tick outcome.

#[test]
fn the_readme_library_example_is_the_quickstart_binary() {
    let readme = read("README.md");
    let library = readme
        .split_once("## The library")
        .expect("a section `## The library`")
        .1;
    let snippet = library
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .expect("a rust block in `## The library`")
        .0;
    let quickstart = read("examples/src/bin/quickstart.rs");
    // The binary's own doc comment and the blank line after it are not in the README.
    let code: String = quickstart
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        snippet, code,
        "README.md's library example differs from examples/src/bin/quickstart.rs"
    );
}

fn root() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", root())).unwrap()
}

/// The workspace's crates, by directory name.
fn crates() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("{}/crates", root()))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The README's Layout section lists every crate (it once left out leasehold-etcd and
/// leasehold-witness).
#[test]
fn the_readme_layout_names_every_crate() {
    let readme = read("README.md");
    let layout = readme
        .split_once("## Layout")
        .expect("a section `## Layout`")
        .1;
    for name in crates() {
        assert!(
            layout.contains(&format!("crates/{name}/")),
            "README.md's Layout lacks crates/{name}/"
        );
    }
}

/// The core crate's README names every store crate: those that run the conformance suite (it
/// once named three).
#[test]
fn the_core_readme_names_every_store() {
    let core = read("crates/leasehold/README.md");
    let stores: Vec<String> = crates()
        .into_iter()
        .filter(|name| {
            std::path::Path::new(&format!("{}/crates/{name}/tests/conformance.rs", root())).exists()
        })
        .collect();
    assert!(stores.len() >= 4, "{stores:?}");
    for name in stores {
        assert!(
            core.contains(&format!("`{name}`")),
            "crates/leasehold/README.md does not name {name}"
        );
    }
}

/// docs/metrics.md lists every `outcome` label of `leasehold_ticks_total`: the strings
/// `TickOutcome::as_str` returns, read from its source (the enum is non-exhaustive, so a test
/// cannot list its variants; it once lacked `skipped-not-owner`).
#[test]
fn the_metrics_doc_names_every_tick_outcome() {
    let source = read("crates/leasehold/src/scheduling/task.rs");
    let body = source
        .split_once("impl TickOutcome {")
        .and_then(|(_, rest)| rest.split_once("\n}\n"))
        .expect("impl TickOutcome in scheduling/task.rs")
        .0;
    let labels: Vec<&str> = body
        .lines()
        .filter_map(|l| l.split_once("=> \"")?.1.split_once('"'))
        .map(|(label, _)| label)
        .collect();
    assert!(labels.len() >= 9, "{labels:?}");
    let metrics = read("docs/metrics.md");
    let ticks = metrics
        .lines()
        .find(|l| l.contains("`leasehold_ticks_total`"))
        .expect("leasehold_ticks_total in docs/metrics.md");
    for label in labels {
        assert!(
            ticks.contains(&format!("`{label}`")),
            "docs/metrics.md's leasehold_ticks_total lacks the outcome `{label}`"
        );
    }
}
