//! Text from the store is untrusted where an operator reads it (`leasehold::text`), on a SQLite
//! store:
//!
//! - `pause --reason/--by` and `trigger --by` with a control or bidi character, or over the
//!   field's limit, exit 2 with one line on stderr and write nothing;
//! - `status` (the fleet, and named tasks), `history` and `pause` print texts that were written
//!   into the store directly, bypassing the doors (as an older release or a hand-written row
//!   could), with ESC, BEL, CR, LF, NUL, DEL, a C1 control and U+202E shown as escapes: none of
//!   those bytes reaches the terminal, and a newline in `by` forges no row. Their `--json` is
//!   exact, and as free of those characters.

mod common;

use common::{code, json_of, leasehold, path_str, temp_dir};
use leasehold::catalog::{Control, Pause, Registration, TriggerRequest};
use leasehold::history::{RecordTrigger, RunOutcome, RunRecord, RunRequest};
use leasehold::text::is_hidden;
use leasehold::{BoxStore, Catalog, HolderId, LeaseName, Slots, Store};

/// A terminal title change, a bell, a screen clear, a carriage return that overwrites the line,
/// NUL, DEL, the C1 CSI and a right-to-left override.
const ESCAPES: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{0}\u{7f}\u{9b}\u{202e}";
/// The same, as the CLI shows it.
const SHOWN: &str = "\\x1b]0;pwned\\x07\\x1b[2J\\r\\0\\x7f\\u{9b}\\u{202e}";
/// A `by` whose newline would print a row of its own.
const FORGED_BY: &str = "ops\nforged-task  running  every 1s";

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

/// Registers `task` as a live sidecar task of instance `side` (for a minute).
async fn register(store: &BoxStore, task: &str) {
    let definition =
        r#"{"source":"sidecar","schedule":"every 1s","on_store_down":"fail-closed","gated":true}"#;
    let (task, side) = (name(task), HolderId::new("side").unwrap());
    let registration = Registration {
        definition,
        ..leasehold_testkit::catalog::registration(&task, &side)
    };
    store.register(&registration).await.unwrap();
}

/// A SQLite store holding task `hostile`, paused and with a trigger pending, whose every free
/// text holds [`ESCAPES`] (and `by` a newline), and a history of a failed run, a manual run
/// and a paused slot carrying them too; and task `clean`, registered and nothing else.
async fn hostile_store(url: &str) {
    let store = leasehold_connect::open_store(url).await.unwrap();
    register(&store, "hostile").await;
    register(&store, "clean").await;
    let task = name("hostile");
    let now = store.now_millis().await.unwrap();
    let pause = Pause {
        by: FORGED_BY.to_owned(),
        reason: Some(format!("freeze {ESCAPES} end")),
        at_ms: now,
    };
    let control = Control {
        paused: Some(pause.clone()),
        trigger: Some(TriggerRequest {
            id: format!("id{ESCAPES}"),
            by: format!("asker{ESCAPES}"),
            at_ms: now,
            expires_ms: now + 300_000,
            slots: None,
        }),
    };
    store
        .set_control(&task, None, &control.to_json())
        .await
        .unwrap()
        .unwrap();
    let failed = RunRecord::started(
        Some(now - 2_000),
        RecordTrigger::Timer,
        format!("holder{ESCAPES}"),
        None,
        now - 2_000,
        None,
    )
    .ended(
        now - 1_900,
        RunOutcome::Failed {
            error: format!("stderr {ESCAPES}\nsecond line"),
        },
    );
    let mut manual =
        RunRecord::started(None, RecordTrigger::Manual, "side", None, now - 3_000, None)
            .ended(now - 2_900, RunOutcome::Ok);
    manual.request = Some(RunRequest {
        id: format!("id{ESCAPES}"),
        by: FORGED_BY.to_owned(),
    });
    let mut paused = RunRecord::missed(
        now - 1_000,
        1,
        now - 1_000,
        leasehold::history::MissReason::NotClaimed,
        "side",
    );
    paused.paused = Some(pause);
    for record in [failed, manual, paused] {
        store
            .record_history(&task, record.key(), &record.to_json(), 100)
            .await
            .unwrap();
    }
}

/// The first entry of `list` (a JSON array) whose `key` is `value`.
fn entry<'a>(list: &'a serde_json::Value, key: &str, value: &str) -> &'a serde_json::Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|e| e[key] == value)
        .unwrap_or_else(|| panic!("no {key} {value} in {list}"))
}

/// The output of `leasehold ARGS`, which must succeed, with no hidden character but the line
/// ends, and no line a `by` forged.
fn printed(args: &[&str]) -> String {
    let out = leasehold(args);
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        code(&out),
        0,
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw: Vec<char> = stdout
        .chars()
        .filter(|&c| is_hidden(c) && c != '\n')
        .collect();
    assert!(raw.is_empty(), "{args:?} printed {raw:?}:\n{stdout}");
    assert!(
        !stdout.lines().any(|l| l.starts_with("forged-task")),
        "{args:?} printed a forged row:\n{stdout}"
    );
    stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn texts_written_into_the_store_are_printed_escaped_and_their_json_is_exact() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("text.db")));
    hostile_store(&url).await;

    let fleet = printed(&["status", "--store", &url]);
    assert!(
        fleet.contains("paused by ops\\nforged-task  running  every 1s at "),
        "{fleet}"
    );
    assert!(
        fleet.contains(&format!(": freeze {SHOWN} end\n")),
        "{fleet}"
    );
    assert!(
        fleet.contains(&format!(
            "run id{SHOWN} asked for by asker{SHOWN}, not taken yet"
        )),
        "{fleet}"
    );

    // Named, a task's last run: the failed one, its stderr on the row.
    let named = printed(&["status", "--store", &url, "hostile"]);
    assert!(
        named.contains(&format!("failed: stderr {SHOWN}\\nsecond line\n")),
        "{named}"
    );

    let history = printed(&["history", "--store", &url, "hostile"]);
    assert!(
        history.contains(&format!("failed: stderr {SHOWN}\\nsecond line")),
        "{history}"
    );
    assert!(history.contains(&format!("holder{SHOWN}")), "{history}");
    assert!(
        history.contains(&format!(
            "paused by ops\\nforged-task  running  every 1s: freeze {SHOWN} end"
        )),
        "{history}"
    );
    // One line per record, under the two header lines.
    assert_eq!(history.lines().count(), 2 + 3, "{history}");

    // A second pause answers the first, as the store holds it.
    let again = printed(&["pause", "--store", &url, "hostile", "--by", "ops2"]);
    assert!(
        again.starts_with("hostile is already paused (by ops\\nforged-task  running  every 1s at "),
        "{again}"
    );

    // JSON is exact: parsed back, every text is what the store holds.
    let status = json_of(&["status", "--store", &url, "--json"]);
    printed(&["status", "--store", &url, "--json"]);
    let task = entry(&status["tasks"], "name", "hostile");
    assert_eq!(task["paused"]["by"], FORGED_BY, "{task}");
    assert_eq!(
        task["paused"]["reason"],
        format!("freeze {ESCAPES} end"),
        "{task}"
    );
    assert_eq!(task["trigger"]["by"], format!("asker{ESCAPES}"), "{task}");
    let runs = json_of(&["history", "--store", &url, "hostile", "--json"]);
    printed(&["history", "--store", &url, "hostile", "--json"]);
    let failed = entry(&runs["runs"], "outcome", "failed");
    assert_eq!(failed["error"], format!("stderr {ESCAPES}\nsecond line"));
    assert_eq!(failed["holder"], format!("holder{ESCAPES}"));
}

/// `leasehold ARGS` must fail with exit 2 and one line on stderr holding `expect`, showing no
/// hidden character.
fn refused(args: &[&str], expect: &str) {
    let out = leasehold(args);
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(code(&out), 2, "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(
        stderr.starts_with("leasehold: error: ") && stderr.contains(expect),
        "{args:?}: {stderr} lacks {expect:?}"
    );
    let raw: Vec<char> = stderr
        .chars()
        .filter(|&c| is_hidden(c) && c != '\n')
        .collect();
    assert!(raw.is_empty(), "{args:?}: {raw:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_or_trigger_with_hidden_characters_or_over_its_limit_exits_2_and_writes_nothing() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("text.db")));
    hostile_store(&url).await;
    let long = "r".repeat(120_000);
    let pause = |extra: &[&str]| -> Vec<String> {
        ["pause", "--store", &url, "clean"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    for (args, expect) in [
        (
            pause(&["--reason", "\u{1b}]0;x\u{7}"]),
            "reason holds the character \\x1b at byte 0;",
        ),
        (
            pause(&["--by", FORGED_BY]),
            "by holds the character \\n at byte 3;",
        ),
        (
            pause(&["--reason", "ok", "--by", "\u{202e}nimda"]),
            "by holds the character \\u{202e} at byte 0;",
        ),
        (
            pause(&["--reason", &long]),
            "reason is 120000 bytes long, the limit is 2000",
        ),
        (
            vec![
                "trigger".into(),
                "--store".into(),
                url.clone(),
                "clean".into(),
                "--by".into(),
                "bell\u{7}".into(),
            ],
            "by holds the character \\x07 at byte 4;",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, expect);
    }
    // Nothing was written: `clean` is neither paused nor asked to run.
    let status = json_of(&["status", "--store", &url, "--json"]);
    let clean = entry(&status["tasks"], "name", "clean");
    assert_eq!(clean["state"], "idle", "{clean}");
    assert!(
        clean["paused"].is_null() && clean["trigger"].is_null(),
        "{clean}"
    );
    // Plain text up to the limit, not ASCII only, is accepted.
    let reason = format!("vendor → down {}", "é".repeat(990));
    let out = leasehold(
        &pause(&["--reason", &reason])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let status = json_of(&["status", "--store", &url, "--json"]);
    let clean = entry(&status["tasks"], "name", "clean");
    assert_eq!(clean["paused"]["reason"], reason, "{clean}");
}
