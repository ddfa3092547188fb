//! The operator transcript of docs/operating.md is run as written: its background
//! `leasehold run` lines are started, `sleep` lines wait, and every other command's output must
//! hold the transcript's lines below it in order (ids, times, durations and other numbers
//! aside; `…` stands for lines left out). Set LEASEHOLD_PRINT_TRANSCRIPT=1 to print this run's
//! transcript, to paste into docs/operating.md when the output changes.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{BIN, temp_dir};

/// The transcript block of docs/operating.md (its first `console` block).
fn transcript() -> String {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operating.md"
    ))
    .unwrap();
    page.split_once("# Operating the fleet\n")
        .and_then(|(_, rest)| rest.split_once("```console\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("docs/operating.md's operator transcript")
        .0
        .to_owned()
}

/// A command line's words: split at spaces, double quotes kept together.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let (mut word, mut quoted) = (String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// A line with what changes from run to run replaced: durations (`11.0ms`, `2.9s`) by `D`,
/// trigger ids (`1a2423dcab9-50a0c854`) by `ID`, other digit runs by `N`; spaces collapsed.
fn shape(line: &str) -> String {
    line.split_whitespace()
        .map(|word| {
            let core = word.trim_end_matches([',', ')', ':', ';']);
            let tail = &word[core.len()..];
            let number = core.trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == 'µ');
            let is_duration = !number.is_empty()
                && number.len() < core.len()
                && number.chars().all(|c| c.is_ascii_digit() || c == '.')
                && ["ns", "µs", "ms", "s"].contains(&&core[number.len()..]);
            let is_id = core.split_once('-').is_some_and(|(a, b)| {
                b.len() == 8
                    && a.len() >= 8
                    && a.chars().chain(b.chars()).all(|c| c.is_ascii_hexdigit())
            });
            match (is_duration, is_id) {
                (true, _) => format!("D{tail}"),
                (_, true) => format!("ID{tail}"),
                _ => {
                    let mut out = String::new();
                    for c in word.chars() {
                        if !c.is_ascii_digit() {
                            out.push(c);
                        } else if !out.ends_with('N') {
                            out.push('N');
                        }
                    }
                    out
                }
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether every expected line (but `…` and blank ones) has the shape of a line of `output`,
/// in order.
fn holds(output: &str, expected: &[&str]) -> bool {
    let mut lines = output.lines().map(shape);
    expected
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && *l != "…")
        .all(|want| {
            let want = shape(want);
            lines.any(|line| line == want)
        })
}

#[test]
fn the_operator_transcript_runs_as_written() {
    let dir = temp_dir();
    let sweep = dir.path().join("sweep.sh");
    std::fs::write(&sweep, "#!/bin/sh\nexit 0\n").unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&sweep)
        .status()
        .unwrap();
    let print = std::env::var_os("LEASEHOLD_PRINT_TRANSCRIPT").is_some();
    let text = transcript();
    let mut background: Vec<Child> = Vec::new();
    let mut steps: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        match line.strip_prefix("$ ") {
            Some(command) => steps.push((command.to_owned(), Vec::new())),
            None => steps.last_mut().expect("a command first").1.push(line),
        }
    }
    assert!(steps.len() >= 6, "{text}");
    for (command, expected) in &steps {
        if print {
            println!("$ {command}");
        }
        if let Some(seconds) = command.strip_prefix("sleep ") {
            std::thread::sleep(Duration::from_secs(seconds.parse().unwrap()));
            continue;
        }
        let words = words(command.trim_end_matches('&').trim());
        assert_eq!(words[0], "leasehold", "{command}");
        if command.ends_with('&') {
            let log = std::fs::File::create(dir.path().join(format!("bg{}.log", background.len())))
                .unwrap();
            let child = Command::new(BIN)
                .args(&words[1..])
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            background.push(child);
            continue;
        }
        // A line that depends on timing (a run going at the moment status reads) gets a few
        // tries; commands that change something run once.
        let tries = if words[1] == "status" { 5 } else { 1 };
        let mut output = String::new();
        for attempt in 0..tries {
            let out = Command::new(BIN)
                .args(&words[1..])
                .current_dir(dir.path())
                .output()
                .unwrap();
            output = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "{command}: {output}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            if holds(&output, expected) {
                break;
            }
            assert!(
                attempt + 1 < tries || print,
                "docs/operating.md's output of `{command}` is not this run's (in order, \
                 numbers aside):\n--- docs/operating.md\n{}\n--- this run\n{output}",
                expected.join("\n")
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        if print {
            print!("{output}");
        }
    }
    for mut child in background {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
}

#[test]
fn shapes_leave_out_what_changes_between_runs() {
    assert_eq!(
        shape("sweep:run: run 1a2423dcab9-50a0c854 ended ok in 11.0ms (holder i2, token 17964)"),
        shape("sweep:run: run 1a2423ddd00-0f3e21aa ended ok in 9.7ms (holder i1, token 17965)")
    );
    assert_eq!(
        shape("sweep  group  2.9s  i1"),
        shape("sweep group 480.2ms i2")
    );
    assert_ne!(shape("sweep:run  idle"), shape("sweep:run  paused"));
    assert_eq!(words(r#"pause sweep --reason "vendor API down""#).len(), 4);
}
