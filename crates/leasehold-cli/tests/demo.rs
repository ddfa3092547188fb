//! The README's first command, `leasehold demo`, as a newcomer runs it: it must finish, say
//! that no tick ran twice, and print what docs/demo.md's transcript shows.

mod common;

use common::*;

/// As a newcomer runs it, without `--dir`: the folder it names is gone when it ends, as its
/// output says.
#[test]
fn the_demo_runs_and_no_tick_runs_twice() {
    let out = std::process::Command::new(BIN)
        .arg("demo")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("duplicate ticks      0"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    let files = stdout
        .lines()
        .find_map(|l| l.strip_prefix("files: "))
        .and_then(|l| {
            l.strip_suffix(" (removed when the demo ends; `leasehold demo --dir DIR` keeps them)")
        })
        .unwrap_or_else(|| panic!("no files line saying they are removed:\n{stdout}"));
    assert!(
        !std::path::Path::new(files).exists(),
        "{files} is still there"
    );
    // A few ticks fall while the killed leader's lease (3 s) runs out, at a tick a second.
    let missed: u64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("missed ticks"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("a missed ticks line");
    assert!(missed <= 5, "{stdout}");
    the_documented_transcript_is_in(&stdout);
}

/// With `--dir`, the demo says its files are kept, and they are: the store, the ledger and each
/// instance's log.
#[test]
fn the_demo_keeps_its_files_in_the_dir_given() {
    let dir = temp_dir();
    let out = std::process::Command::new(BIN)
        .args(["demo", "--ticks", "1", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains(&format!("files: {} (kept)", dir.path().display())),
        "{stdout}"
    );
    for file in [
        "demo.db",
        "ledger.jsonl",
        "instance-1.log",
        "instance-2.log",
    ] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
}

/// A line with every number replaced by its kind: `N` for a count, a duration or an instance
/// number (up to 6 digits), `N13` for a slot in ms, `N16` for a clock-seeded token; so a
/// transcript of slots in seconds or of tokens 1 and 5 no longer matches. Spaces collapse, so
/// column widths do not matter.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut digits = 1;
            while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
                chars.next();
                digits += 1;
            }
            // A decimal fraction belongs to the number.
            if chars.peek() == Some(&'.') {
                let mut ahead = chars.clone();
                ahead.next();
                if ahead.peek().is_some_and(|c| c.is_ascii_digit()) {
                    chars.next();
                    while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
                        chars.next();
                    }
                }
            }
            if digits <= 6 {
                out.push('N');
            } else {
                out.push_str(&format!("N{digits}"));
            }
        } else if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every line of docs/demo.md's transcript (but `…` and blank ones) has the shape of a line
/// of `output`, in the same order.
fn the_documented_transcript_is_in(output: &str) {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/demo.md"))
        .unwrap();
    let transcript = page
        .split_once("# What the demo shows\n")
        .and_then(|(_, rest)| rest.split_once("```text\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("docs/demo.md's transcript")
        .0;
    let mut lines = output.lines().map(shape);
    for want in transcript.lines().map(str::trim) {
        if want.is_empty() || want == "…" {
            continue;
        }
        let want_shape = shape(want);
        assert!(
            lines.any(|line| matches(&line, &want_shape)),
            "docs/demo.md's line {want:?} (shape {want_shape:?}) is not in this run's output \
             (in order):\n{output}"
        );
    }
}

/// Whether `line` is `want`, where a `…` in `want` stands for any text (a temporary path).
fn matches(line: &str, want: &str) -> bool {
    let mut parts = want.split('…');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[test]
fn an_ellipsis_in_a_line_stands_for_any_text() {
    let want = "files: … (removed when the demo ends)";
    assert!(matches(
        "files: /tmp/.tmpAb1 (removed when the demo ends)",
        want
    ));
    assert!(!matches("files: /tmp/.tmpAb1 (kept)", want));
    assert!(matches("tick N13", "tick N13"));
    assert!(!matches("tick N13 ran", "tick N13"));
}

#[test]
fn shapes_tell_slots_and_tokens_from_counts() {
    assert_eq!(
        shape("[  1.0s] tick 1796251134000: ran on instance-2 (fencing token 1796346856465002)"),
        "[ Ns] tick N13: ran on instance-N (fencing token N16)"
    );
    assert_ne!(
        shape("[  1.0s] tick 1796251134: ran on instance-2 (fencing token 1)"),
        shape("[  1.0s] tick 1796251134000: ran on instance-2 (fencing token 1796346856465002)")
    );
}
