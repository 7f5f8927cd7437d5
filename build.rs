//! Names the build in `hourglass --version` and serve's first log line: the commit it was built
//! from and that commit's date (README "Upgrades and rollbacks" tells builds apart by both), or
//! "unknown commit" outside a git checkout.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    let build = match (git(&["rev-parse", "--short=7", "HEAD"]), git(&["log", "-1", "--format=%cs", "HEAD"])) {
        (Some(commit), Some(date)) => format!("{commit}, {date}"),
        _ => "unknown commit".to_string(),
    };
    // Not `HOURGLASS_*`: cargo sets it for the tests too, whose `serve` would read it as a key.
    println!("cargo:rustc-env=HG_BUILD={build}");
    // Built again when HEAD moves: to another branch, or its branch to another commit.
    let git_dir = Path::new(".git");
    println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
    if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD")) {
        if let Some(branch) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed={}", git_dir.join(branch).display());
        }
    }
    println!("cargo:rerun-if-changed={}", git_dir.join("packed-refs").display());
}
