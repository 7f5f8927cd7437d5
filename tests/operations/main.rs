//! Operating Hourglass: checkpoints, the configuration file and its variables, the docker-compose
//! deployment kept consistent with them, and the ordered shutdown under load. One binary;
//! helpers in `util`. Everything listens on 127.0.0.1 only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../util/mod.rs"]
mod util;

mod checkpoint;
mod compact;
mod compose;
mod config_file;
mod shutdown;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (the root package's manifest directory).
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A file of the repository.
fn repo_file(rel: &str) -> PathBuf {
    repo().join(rel)
}

/// `hourglass ARGS` run in the repository root with only `vars` in its environment, so the
/// caller's `HOURGLASS_*` variables cannot change the result.
fn hourglass(args: &[&str], vars: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .current_dir(repo())
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .expect("run hourglass")
}

/// Standard output as lines.
fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}
