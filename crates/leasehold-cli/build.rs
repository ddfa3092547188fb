//! Names the commit this binary was built from, for `leasehold --version`: the `.cargo_vcs_info.json`
//! that `cargo package` writes into a packaged crate, else `git rev-parse HEAD` in a checkout,
//! else `unknown` (a source tree without either).

use std::path::Path;
use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    let dir = Path::new(&dir);
    let vcs_info = dir.join(".cargo_vcs_info.json");
    let commit = if vcs_info.exists() {
        println!("cargo:rerun-if-changed={}", vcs_info.display());
        std::fs::read_to_string(&vcs_info)
            .ok()
            .and_then(|text| packaged_commit(&text))
    } else {
        git_commit(dir)
    };
    let commit = commit.unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=LEASEHOLD_COMMIT={commit}");
}

/// The `"sha1"` of `{"git": {"sha1": "…"}, …}`, read without a JSON parser: the value is hex.
fn packaged_commit(text: &str) -> Option<String> {
    let after = &text[text.find("\"sha1\"")? + "\"sha1\"".len()..];
    let value = after
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let hex: String = value.chars().take_while(char::is_ascii_hexdigit).collect();
    (hex.len() >= 7).then_some(hex)
}

/// HEAD's commit, and the files whose change means a new one (HEAD itself, the branch it names,
/// packed refs), so a commit rebuilds this crate and nothing else does.
fn git_commit(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--verify", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for path in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &path]) {
            let path = dir.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}
