//! `leasehold history TASK --svg FILE`: the runs of a real `leasehold run` plus recorded misses
//! and a paused slot, as a well-formed SVG with a bar per run and a marker per miss. With
//! `LEASEHOLD_SVG_OUT=DIR` the picture is kept there to look at.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{BIN, path_str, temp_dir};
use leasehold::catalog::Pause;
use leasehold::history::{MissReason, RunRecord};
use leasehold::{LeaseName, Slots};
use serde_json::Value;

fn history(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("history")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn titles(doc: &roxmltree::Document, element: &str) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name(element))
        .filter_map(|n| n.children().find(|c| c.has_tag_name("title")))
        .map(|t| t.text().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_history_with_misses_and_a_pause_is_drawn_bar_by_bar() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("h.db")));
    // Every third slot fails.
    let mut run = Command::new(BIN)
        .args([
            "run", "--store", &url, "--lease", "pic", "--every", "1s", "--",
        ])
        .args(["sh", "-c", "test $(( LEASEHOLD_SLOT / 1000 % 3 )) -ne 0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(run.wait().unwrap().success());

    // A gap of 3 slots while the store was down, and a slot that fell in a pause.
    let store = leasehold_connect::open_store(&url).await.unwrap();
    let task = LeaseName::new("pic:run").unwrap();
    let now = leasehold::Store::now_millis(&store).await.unwrap() / 1000 * 1000;
    let gap = RunRecord::missed(now + 1_000, 3, now + 3_000, MissReason::StoreDown, "b");
    let mut paused = RunRecord::missed(now + 5_000, 1, now + 5_000, MissReason::NotClaimed, "b");
    paused.paused = Some(Pause {
        by: "alice".into(),
        reason: Some("freeze".into()),
        at_ms: now + 4_500,
    });
    for record in [gap, paused] {
        store
            .record_history(&task, record.key(), &record.to_json(), 100)
            .await
            .unwrap();
    }

    let json = history(&["--store", &url, "pic", "--json", "--limit", "1000"]);
    let doc: Value = serde_json::from_slice(&json.stdout).unwrap();
    let records = doc["runs"].as_array().unwrap();
    let misses = records.iter().filter(|r| r["outcome"] == "missed").count();
    let runs = records.len() - misses;
    assert!(runs >= 3, "{records:?}");
    assert_eq!(misses, 2);

    let file = dir.path().join("pic.svg");
    let out = history(&["--store", &url, "pic", "--svg", &path_str(&file)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        said.trim(),
        format!("wrote {}: {} entries of pic", file.display(), records.len())
    );
    let svg = std::fs::read_to_string(&file).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let bars = titles(&doc, "rect");
    assert_eq!(bars.len(), runs, "{bars:?}");
    assert!(bars.iter().any(|t| t.starts_with("ok · slot ")), "{bars:?}");
    assert!(bars.iter().any(|t| t.starts_with("failed: ")), "{bars:?}");
    let markers = titles(&doc, "path");
    assert_eq!(markers.len(), misses, "{markers:?}");
    assert!(svg.contains(">paused by alice: freeze</text>"), "{svg}");
    assert!(svg.contains(">3 missed: store-down</text>"), "{svg}");
    if let Some(out) = std::env::var_os("LEASEHOLD_SVG_OUT") {
        std::fs::copy(&file, std::path::Path::new(&out).join("history.svg")).unwrap();
    }
}

#[test]
fn a_task_without_history_is_an_empty_picture_and_svg_excludes_json() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("e.db")));
    // A store (history does not create one) without this task.
    let made = Command::new(BIN)
        .args(["run", "--store", &url, "--lease", "other", "--", "true"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let file = dir.path().join("none.svg");
    let out = history(&["--store", &url, "nothing-here", "--svg", &path_str(&file)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&file).unwrap();
    roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert!(svg.contains(">no runs recorded</text>"));

    let out = history(&["--store", &url, "x", "--svg", &path_str(&file), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let unwritable = dir.path().join("no/such/dir/x.svg");
    let out = history(&["--store", &url, "x", "--svg", &path_str(&unwritable)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot write") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
}
