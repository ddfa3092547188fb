//! The README's first command, `leasehold demo`, as a newcomer runs it: it must finish, say
//! that no tick ran twice, and print what the README's transcript shows.

mod common;

use common::*;

#[test]
fn the_demo_runs_and_no_tick_runs_twice() {
    let dir = temp_dir();
    let out = std::process::Command::new(BIN)
        .args(["demo", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("duplicate ticks      0"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    // A few ticks fall while the killed leader's lease (3 s) runs out, at a tick a second.
    let missed: u64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("missed ticks"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("a missed ticks line");
    assert!(missed <= 5, "{stdout}");
    the_readme_transcript_is_in(&stdout);
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

/// Every line of the README's demo transcript (but `…` and blank ones) has the shape of a line
/// of `output`, in the same order.
fn the_readme_transcript_is_in(output: &str) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let transcript = readme
        .split_once("## What the demo shows")
        .and_then(|(_, rest)| rest.split_once("```text\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README's demo transcript")
        .0;
    let mut lines = output.lines().map(shape);
    for want in transcript.lines().map(str::trim) {
        if want.is_empty() || want == "…" {
            continue;
        }
        let want_shape = shape(want);
        assert!(
            lines.any(|line| line == want_shape),
            "the README's demo line {want:?} (shape {want_shape:?}) is not in this run's output \
             (in order):\n{output}"
        );
    }
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
