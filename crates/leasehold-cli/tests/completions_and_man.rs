//! `leasehold completions bash|zsh|fish` and `leasehold man` (issue 41): each script is loaded
//! by its own shell and completes the commands and flags this binary has (the internal
//! `witness` and `supervise` never offered); the manual pages render with groff and cover every
//! visible command. The shells and groff come from Debian's packages (scripts/stores.sh).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{BIN, path_str, temp_dir};

/// The commands every build has; `chaos` and `bench` come with their features.
const ALWAYS: [&str; 12] = [
    "run",
    "status",
    "pause",
    "resume",
    "trigger",
    "forget",
    "serve",
    "history",
    "next",
    "completions",
    "man",
    "demo",
];
const HIDDEN: [&str; 2] = ["witness", "supervise"];

/// The commands `leasehold --help` lists (with `help`), sorted: what a person is offered.
fn commands() -> Vec<String> {
    let help = stdout(&leasehold(&["--help"]));
    let listed = help
        .split("Commands:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap();
    let mut names: Vec<String> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    names.sort();
    for command in ALWAYS.iter().chain(&["help"]) {
        assert!(names.iter().any(|n| n == command), "{command} in --help");
    }
    names
}

fn leasehold(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Writes `leasehold completions SHELL` into `dir` and returns its path.
fn script(dir: &Path, shell: &str) -> String {
    let path = dir.join(format!("leasehold.{shell}"));
    std::fs::write(&path, stdout(&leasehold(&["completions", shell]))).unwrap();
    path_str(&path)
}

/// Runs `program -c code` and returns its stdout, failing on a non-zero exit.
fn shell(program: &str, code: &str) -> String {
    stdout(&Command::new(program).args(["-c", code]).output().unwrap())
}

/// The words bash offers after `line` (completing its last word), using the script's own
/// completion function as bash's `complete -F` would call it.
fn bash_offers(script: &str, line: &[&str]) -> Vec<String> {
    let words = line
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let code = format!(
        "source '{script}'\n\
         COMP_WORDS=({words}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}\n\
         _leasehold leasehold '{}' '{}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        line.len() - 1,
        line.join(" "),
        line[line.len() - 1],
        line[line.len().saturating_sub(2)],
    );
    shell("bash", &code).lines().map(str::to_owned).collect()
}

/// The words fish offers for `line` (`complete -C`, fish's own completion engine).
fn fish_offers(script: &str, line: &str) -> Vec<String> {
    let out = shell("fish", &format!("source '{script}'; complete -C '{line}'"));
    out.lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn bash_completes_commands_and_flags() {
    let dir = temp_dir();
    let script = script(dir.path(), "bash");
    // Registered for the command.
    let registered = shell("bash", &format!("source '{script}'; complete -p leasehold"));
    assert!(
        registered.contains("-F _leasehold leasehold"),
        "{registered}"
    );
    let mut offered = bash_offers(&script, &["leasehold", ""]);
    offered.sort();
    // The flags of the top level come along with the commands.
    offered.retain(|w| !w.starts_with('-'));
    assert_eq!(offered, commands());
    assert_eq!(
        bash_offers(&script, &["leasehold", "comp"]),
        ["completions"]
    );
    let flags = bash_offers(&script, &["leasehold", "run", "--ev"]);
    assert_eq!(flags, ["--every"]);
    let mut shells = bash_offers(&script, &["leasehold", "completions", ""]);
    shells.retain(|w| !w.starts_with('-'));
    assert_eq!(shells, ["bash", "zsh", "fish"]);
}

#[test]
fn fish_completes_commands_and_flags() {
    let dir = temp_dir();
    let script = script(dir.path(), "fish");
    let mut offered = fish_offers(&script, "leasehold ");
    offered.sort();
    assert_eq!(offered, commands());
    let flags = fish_offers(&script, "leasehold run --ev");
    assert_eq!(flags, ["--every"]);
    // (clap_complete's fish script completes flags and commands, not positional values.)
    assert_eq!(fish_offers(&script, "leasehold history --j"), ["--json"]);
}

#[test]
fn zsh_script_parses_and_defines_the_completion_function() {
    let dir = temp_dir();
    let script = script(dir.path(), "zsh");
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.starts_with("#compdef leasehold\n"), "{}", &text[..80]);
    // Syntax only (-n), then loaded with compdef stubbed (it needs compinit, which needs a
    // terminal): the function zsh's completion system calls is defined.
    shell("zsh", &format!("zsh -n '{script}'"));
    let defined = shell(
        "zsh",
        &format!("compdef() {{ :; }}; source '{script}'; whence -w _leasehold"),
    );
    assert_eq!(defined.trim(), "_leasehold: function");
    for command in commands() {
        assert!(
            text.contains(&format!("\n'{command}:")),
            "{command} not described"
        );
    }
    for hidden in HIDDEN {
        assert!(
            !text.contains(&format!("\n'{hidden}:")),
            "{hidden} in the zsh script"
        );
    }
}

#[test]
fn a_shell_without_a_script_is_a_usage_error() {
    let output = leasehold(&["completions", "powershell"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("powershell"), "{stderr}");
    assert!(stderr.contains("bash, zsh, fish"), "{stderr}");
}

/// `page` rendered by groff as a terminal would show it.
fn render(page: &Path) -> String {
    stdout(
        &Command::new("groff")
            .args(["-man", "-Tutf8", "-P", "-cbou"])
            .arg(page)
            .output()
            .unwrap(),
    )
}

#[test]
fn man_prints_leasehold_1_listing_every_command() {
    let dir = temp_dir();
    let page = dir.path().join("leasehold.1");
    std::fs::write(&page, stdout(&leasehold(&["man"]))).unwrap();
    let shown = render(&page);
    assert!(shown.contains("NAME"), "{shown}");
    assert!(
        shown.contains("leasehold - Run any command as a single-active job across machines"),
        "{shown}"
    );
    for command in commands().iter().filter(|c| *c != "help") {
        assert!(
            shown.contains(&format!("leasehold-{command}(1)")),
            "{command} in {shown}"
        );
    }
    for hidden in HIDDEN {
        assert!(!shown.contains(hidden), "{hidden} in leasehold(1)");
    }
}

#[test]
fn man_dir_writes_a_page_per_command() {
    let dir = temp_dir();
    let out = dir.path().join("man1");
    stdout(&leasehold(&["man", "--dir", &path_str(&out)]));
    let mut pages: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    let mut expected: Vec<String> = commands()
        .iter()
        .filter(|c| *c != "help")
        .map(|c| format!("leasehold-{c}.1"))
        .chain(["leasehold.1".to_owned()])
        .collect();
    expected.sort();
    assert_eq!(pages, expected);
    let run = render(&out.join("leasehold-run.1"));
    assert!(run.contains("--every"), "{run}");
    assert!(run.contains("--on-store-down"), "{run}");
}
