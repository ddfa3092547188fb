//! The README's library example is `src/bin/quickstart.rs`, which the test command builds: this
//! keeps the two the same, so the README's snippet compiles as written.

#[test]
fn the_readme_library_example_is_the_quickstart_binary() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let library = readme
        .split_once("## The library")
        .expect("a section `## The library`")
        .1;
    let snippet = library
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .expect("a rust block in `## The library`")
        .0;
    let quickstart =
        std::fs::read_to_string(format!("{root}/examples/src/bin/quickstart.rs")).unwrap();
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
