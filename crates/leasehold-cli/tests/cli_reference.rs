//! docs/cli.md ends with every option of every command, as `leasehold COMMAND --help` prints
//! it: this test checks the page says what the binary says. After changing an option, run it
//! with LEASEHOLD_WRITE_CLI_REFERENCE=1 to write the section afresh.

mod common;

use std::process::Command;

use common::BIN;

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
const HEADING: &str = "## Every option\n";

/// Commands of the build a user installs (chaos and bench are behind features).
const LEFT_OUT: [&str; 3] = ["help", "chaos", "bench"];

/// `leasehold ARGS`' stdout, at a fixed width so the text does not depend on the terminal.
fn help(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env("COLUMNS", "100")
        .output()
        .expect("run leasehold");
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The commands `leasehold --help` lists, in its order.
fn commands() -> Vec<String> {
    let top = help(&["--help"]);
    let list = top
        .split_once("Commands:\n")
        .and_then(|(_, rest)| rest.split_once("\n\n"))
        .expect("a command list")
        .0;
    list.lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| !LEFT_OUT.contains(c))
        .map(str::to_owned)
        .collect()
}

/// The section as the binary has it.
fn section() -> String {
    let mut text = format!(
        "{HEADING}\nWhat `leasehold COMMAND --help` prints, for each command (`leasehold man` has \
         the same as manual pages). `crates/leasehold-cli/tests/cli_reference.rs` checks that \
         this is the binary's text.\n"
    );
    for command in commands() {
        text.push_str(&format!(
            "\n### `leasehold {command}`\n\n```text\n{}```\n",
            help(&[&command, "--help"])
        ));
    }
    text
}

#[test]
fn the_cli_page_lists_every_option_as_the_binary_has_it() {
    let page = std::fs::read_to_string(PAGE).unwrap();
    let (before, documented) = page
        .split_once(&format!("\n{HEADING}"))
        .expect("docs/cli.md has a section `## Every option`, its last");
    let wanted = section();
    if std::env::var_os("LEASEHOLD_WRITE_CLI_REFERENCE").is_some() {
        std::fs::write(PAGE, format!("{before}\n{wanted}")).unwrap();
        return;
    }
    assert!(
        format!("{HEADING}{documented}") == wanted,
        "docs/cli.md's `## Every option` is not what the binary prints: run this test with \
         LEASEHOLD_WRITE_CLI_REFERENCE=1 to write it afresh"
    );
}
