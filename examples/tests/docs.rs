//! The documents stay true to the code: the README's library example is
//! `src/bin/quickstart.rs` (which the test command builds, so the snippet compiles as written),
//! docs/layout.md lists every crate, the core README every store, docs/metrics.md every tick
//! outcome, and every relative link of README.md and docs/ leads somewhere.

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

/// docs/layout.md lists every crate (the README's Layout, where it was, once left out
/// leasehold-etcd and leasehold-witness).
#[test]
fn the_layout_names_every_crate() {
    let layout = read("docs/layout.md");
    for name in crates() {
        assert!(
            layout.contains(&format!("crates/{name}/")),
            "docs/layout.md lacks crates/{name}/"
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

/// Every relative link of README.md, docs/ and the other documents beside the code leads to a
/// file that exists, and a `#fragment` into a Markdown file to one of its headings (as GitHub
/// names them). README's reference moved to docs/ pages once; nothing checked the links then.
#[test]
fn every_relative_link_leads_somewhere() {
    let mut pages: Vec<String> = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
        .map(str::to_owned)
        .to_vec();
    pages.extend(markdown_in("docs"));
    for dir in ["crates", "clients", "examples"] {
        for entry in std::fs::read_dir(format!("{}/{dir}", root())).unwrap() {
            let readme = format!("{dir}/{}/README.md", entry.unwrap().file_name().display());
            if std::path::Path::new(&format!("{}/{readme}", root())).exists() {
                pages.push(readme);
            }
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        for target in link_targets(&read(page)) {
            // Web addresses, and rustdoc's links to items (crate READMEs are crate docs).
            if target.contains("://") || target.starts_with("mailto:") || is_item(&target) {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = match path {
                "" => page.clone(),
                path => resolve(page, path),
            };
            if !std::path::Path::new(&format!("{}/{file}", root())).exists() {
                broken.push(format!("{page}: {target} (no {file})"));
            } else if let Some(fragment) = fragment.filter(|_| file.ends_with(".md"))
                && !heading_ids(&read(&file)).iter().any(|id| id == fragment)
            {
                broken.push(format!("{page}: {target} (no such heading in {file})"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Whether a link target names a Rust item (`leasehold::Lease`, `mod@column`) for rustdoc.
fn is_item(target: &str) -> bool {
    let path = target.split('#').next().unwrap_or_default();
    !path.contains('/') && (path.contains("::") || path.contains('@'))
}

/// The Markdown files of a directory of the repository, as paths from its root.
fn markdown_in(dir: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(format!("{}/{dir}", root()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("{dir}/{name}"))
        .collect();
    found.sort();
    found
}

/// The Markdown text outside fenced code blocks and code spans: what a link can be in.
fn prose(markdown: &str) -> String {
    let mut fenced = false;
    let mut text = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            text.push_str(line);
            text.push('\n');
        }
    }
    // Odd pieces between backticks are code spans (which may wrap a line).
    text.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, piece)| piece)
        .collect()
}

/// The targets of `[text](target)` and `![alt](target)` links.
fn link_targets(markdown: &str) -> Vec<String> {
    prose(markdown)
        .split("](")
        .skip(1)
        .filter_map(|rest| {
            let end = rest.find([')', ' ', '\n'])?;
            Some(rest[..end].to_owned())
        })
        .collect()
}

/// `path` relative to the directory of `page`, both from the repository's root.
fn resolve(page: &str, path: &str) -> String {
    let mut parts: Vec<&str> = page.split('/').collect();
    parts.pop();
    for part in path.trim_end_matches('/').split('/') {
        match part {
            "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// The ids GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as
/// `-`, a repeated id numbered `-1`, `-2`, ….
fn heading_ids(markdown: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(title) = line.trim_start_matches('#').strip_prefix(' ') else {
            continue;
        };
        if fenced || !line.starts_with('#') {
            continue;
        }
        let id: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let seen = ids.iter().filter(|i| **i == id).count();
        ids.push(match seen {
            0 => id,
            n => format!("{id}-{n}"),
        });
    }
    ids
}
