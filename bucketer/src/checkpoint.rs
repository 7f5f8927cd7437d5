//! Checkpoints: a consistent copy of a running store, for backups.
//!
//! [`Store::checkpoint`] writes into a new directory what `hourglass serve --data-dir` opens:
//! `rocksdb/`, a RocksDB checkpoint (memtables flushed first, so it holds every write
//! committed before it; SST files hard-linked when on the same file system, else copied), and
//! with a local archive, `archive/`, the Parquet files its manifest names (hard links, else
//! copies). Spills and cold deletes wait meanwhile, so the manifest and the files agree. An
//! archive in an S3 bucket is not copied: the checkpoint's manifest names the bucket's files,
//! which a later cold delete removes (keep the bucket's versions for as long as a backup).
//!
//! A hard link shares the file's blocks, not a copy of them: SST and Parquet files are never
//! written again once complete, so the checkpoint stays as it was while the store goes on, and
//! takes space only as the store deletes or compacts away what it holds.
//!
//! A checkpoint is written under a hidden name beside its own (`.<name>.partial`) and renamed
//! once complete, so that a directory of checkpoints holds none cut short, by an error or a
//! crash; the next checkpoint there removes what a crash left. [`list_checkpoints`] lists a
//! directory's checkpoints with the bytes each alone holds, and [`delete_checkpoint`] deletes
//! one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;

use crate::{read, Error, Result, Store};

/// What [`Store::checkpoint`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// The checkpoint's directory.
    pub dir: PathBuf,
    /// Archive files it holds (0 without a local archive).
    pub archive_files: usize,
    /// Whether the archive is in an S3 bucket, whose files it does not hold.
    pub archive_in_bucket: bool,
    /// Archive files the manifest names that were missing from the local archive, relative to
    /// it (as in the checkpoint's `archive/`), and so not in the checkpoint: the store cannot
    /// read those partitions either. Listed in its [`MISSING_ARCHIVE_FILES`] file too.
    pub missing_archive_files: Vec<String>,
}

/// The file in a checkpoint naming, one a line, the archive files that were missing when it
/// was taken ([`CheckpointSummary::missing_archive_files`]); only in such a checkpoint.
pub const MISSING_ARCHIVE_FILES: &str = "MISSING-ARCHIVE-FILES";

/// The error of a checkpoint whose step `what` on `path` failed with `e`.
fn failed(what: &str, path: &Path, e: &dyn std::fmt::Display) -> Error {
    Error::Checkpoint(format!("{what} {}: {e}", path.display()))
}

impl Store {
    /// Writes a consistent copy of the store into `dir`, which must not exist yet (its parent is
    /// created if missing), while the store goes on (module docs). Opened as a data directory
    /// with the default `archive_dir`, it answers what this store did at the checkpoint. It is
    /// written as `.<name>.partial` beside `dir` and renamed `dir` once complete; on an error
    /// that is removed again, and what a crash left of earlier ones is removed first.
    pub fn checkpoint(&self, dir: &Path) -> Result<CheckpointSummary> {
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str())) else {
            return Err(Error::Checkpoint(format!("{} names no directory to write into", dir.display())));
        };
        // Spills and cold deletes change the manifest and the files together: not meanwhile.
        // Checkpoints of this store are written one at a time too, so no partial one beside
        // this is being written (one is what a crash left), and none into `dir` since the check.
        let _spills = self.spill_lock.lock().unwrap_or_else(PoisonError::into_inner);
        if dir.exists() {
            return Err(Error::Checkpoint(format!("{} exists already", dir.display())));
        }
        // The approximate message counts wait in memory for their next batch: written first.
        self.flush_message_counts()?;
        std::fs::create_dir_all(parent).map_err(|e| failed("creating", parent, &e))?;
        remove_partial_checkpoints(parent)?;
        let partial = parent.join(partial_name(name));
        std::fs::create_dir(&partial).map_err(|e| failed("creating", &partial, &e))?;
        // A checkpoint cut short is no backup: what it wrote goes (best effort).
        let written = self.fill_checkpoint(&partial).and_then(|summary| {
            std::fs::rename(&partial, dir).map_err(|e| failed("renaming", &partial, &e))?;
            Ok(CheckpointSummary { dir: dir.to_path_buf(), ..summary })
        });
        written.inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&partial);
        })
    }

    /// Writes the checkpoint into `dir`, which exists and is empty ([`Store::checkpoint`]).
    fn fill_checkpoint(&self, dir: &Path) -> Result<CheckpointSummary> {
        let db_dir = dir.join("rocksdb");
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(&db_dir))
            .map_err(|e| failed("writing the RocksDB checkpoint", &db_dir, &e))?;
        let mut summary = CheckpointSummary {
            dir: dir.to_path_buf(),
            archive_files: 0,
            archive_in_bucket: false,
            missing_archive_files: Vec::new(),
        };
        let Some(cfg) = self.cfg.archive.as_ref() else { return Ok(summary) };
        if cfg.object_store.is_some() {
            summary.archive_in_bucket = true;
            return Ok(summary);
        }
        let names: Vec<String> = read(&self.catalog).by_name.keys().map(|n| n.to_string()).collect();
        for name in names {
            for (_, _, file) in self.archived_partitions(&name) {
                let rel = file.strip_prefix(&cfg.root).map_err(|e| failed("placing", &file, &e))?;
                let to = dir.join("archive").join(rel);
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| failed("creating", parent, &e))?;
                }
                // A link where the file system allows it (the same one), else a copy. A file gone
                // (deleted by hand, a disk's damage) is named, not a reason to take no backup
                // of the rest: the store cannot read it either. A symbolic link (a file moved to
                // another disk) is followed: the checkpoint holds its data, not a link a copy
                // of the checkpoint elsewhere would find dangling (QA52 F1).
                let file = match std::fs::canonicalize(&file) {
                    Ok(target) => target,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        summary.missing_archive_files.push(rel.display().to_string());
                        continue;
                    }
                    Err(e) => return Err(failed("reading", &file, &e)),
                };
                if std::fs::hard_link(&file, &to).is_err() {
                    match std::fs::copy(&file, &to) {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !file.exists() => {
                            summary.missing_archive_files.push(rel.display().to_string());
                            continue;
                        }
                        Err(e) => return Err(failed("copying", &file, &e)),
                    }
                }
                summary.archive_files += 1;
            }
        }
        if !summary.missing_archive_files.is_empty() {
            let list = dir.join(MISSING_ARCHIVE_FILES);
            let text: String = summary.missing_archive_files.iter().map(|f| format!("{f}\n")).collect();
            std::fs::write(&list, text).map_err(|e| failed("writing", &list, &e))?;
        }
        Ok(summary)
    }
}

/// The hidden name a checkpoint named `name` is written under until complete.
fn partial_name(name: &str) -> String {
    format!(".{name}.partial")
}

/// Whether `name` is that of a checkpoint being written, or cut short by a crash.
fn is_partial(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".partial")
}

/// Removes the checkpoints a crash cut short in `root` (`.<name>.partial`).
fn remove_partial_checkpoints(root: &Path) -> Result<()> {
    let entries = std::fs::read_dir(root).map_err(|e| failed("listing", root, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| failed("listing", root, &e))?;
        if entry.file_name().to_str().is_some_and(is_partial) {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(|e| failed("removing", &path, &e))?;
            tracing::warn!(path = %path.display(), "removed a checkpoint a crash cut short");
        }
    }
    Ok(())
}

/// A checkpoint in a directory of checkpoints ([`list_checkpoints`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    /// The name of its directory (`POST /v1/checkpoints` names it by its UTC time).
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The files it holds.
    pub files: u64,
    /// Their bytes, shared or not.
    pub bytes: u64,
    /// The bytes of the files it alone holds (one link each): what deleting it frees. The
    /// others are hard links it shares with the store or with other checkpoints.
    pub unshared_bytes: u64,
}

/// The checkpoints in `root`, by name: each directory holding a RocksDB checkpoint
/// (`rocksdb/CURRENT`), not one being written; none when `root` does not exist.
pub fn list_checkpoints(root: &Path) -> Result<Vec<CheckpointEntry>> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(failed("listing", root, &e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| failed("listing", root, &e))?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        found.extend(checkpoint_entry(root, name)?);
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// The checkpoint named `name` in `root`, as [`list_checkpoints`] lists it; `None` when `name`
/// is none it lists (a checkpoint being written, a directory without `rocksdb/CURRENT`, or a
/// name that is not one entry of `root`).
fn checkpoint_entry(root: &Path, name: String) -> Result<Option<CheckpointEntry>> {
    let dir = root.join(&name);
    let one_entry = Path::new(&name).file_name().is_some_and(|n| n == name.as_str());
    if !one_entry || is_partial(&name) || !dir.join("rocksdb").join("CURRENT").is_file() {
        return Ok(None);
    }
    let mut listed = CheckpointEntry { name, dir: dir.clone(), files: 0, bytes: 0, unshared_bytes: 0 };
    add_files(&dir, &mut listed)?;
    Ok(Some(listed))
}

/// Adds the files under `dir` to `entry`'s counts (symbolic links are not followed).
fn add_files(dir: &Path, entry: &mut CheckpointEntry) -> Result<()> {
    for item in std::fs::read_dir(dir).map_err(|e| failed("listing", dir, &e))? {
        let path = item.map_err(|e| failed("listing", dir, &e))?.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| failed("reading", &path, &e))?;
        if meta.is_dir() {
            add_files(&path, entry)?;
        } else if meta.is_file() {
            entry.files += 1;
            entry.bytes += meta.len();
            if meta.nlink() == 1 {
                entry.unshared_bytes += meta.len();
            }
        }
    }
    Ok(())
}

/// Deletes the checkpoint named `name` in `root`, one [`list_checkpoints`] lists, answering it
/// as it was; `None` when there is none by that name (nothing else in `root` is deleted).
///
/// A checkpoint a process has open as its store (`serve --data-dir` on it, in place) is not
/// deleted ([`Error::CheckpointInUse`]): that process would go on acknowledging writes into
/// files that no longer exist, and lose them all at its stop.
pub fn delete_checkpoint(root: &Path, name: &str) -> Result<Option<CheckpointEntry>> {
    let Some(found) = checkpoint_entry(root, name.to_string())? else { return Ok(None) };
    if let Some(pid) = lock_holder_within(&found.dir) {
        return Err(Error::CheckpointInUse { name: found.name, pid });
    }
    std::fs::remove_dir_all(&found.dir).map_err(|e| failed("deleting", &found.dir, &e))?;
    Ok(Some(found))
}

/// A process holding the lock of a RocksDB store anywhere under `dir` (a `rocksdb` directory
/// of its own, or of a checkpoint of a checkpoint opened in place: QA52 F7, the nested store was
/// deleted under the process writing to it), if one does. Symbolic links are not followed.
fn lock_holder_within(dir: &Path) -> Option<i32> {
    if dir.file_name().is_some_and(|n| n == "rocksdb") {
        if let Some(pid) = rocksdb_lock_holder(dir) {
            return Some(pid);
        }
    }
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| lock_holder_within(&e.path()))
}

/// The process that holds the lock of the RocksDB store in `db_dir` (its `LOCK` file, which
/// RocksDB holds with a POSIX record lock while the store is open), if one does. Asked with
/// `F_GETLK`, which takes no lock.
fn rocksdb_lock_holder(db_dir: &Path) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(db_dir.join("LOCK")).ok()?;
    #[allow(unsafe_code)]
    // SAFETY: `flock` is plain data (zeroes are a valid value), and `fcntl(F_GETLK)` reads and
    // writes only the `flock` it is given, on a descriptor `file` keeps open.
    let lock = unsafe {
        let mut lock: libc::flock = std::mem::zeroed();
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        (libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) == 0).then_some(lock)?
    };
    (lock.l_type != libc::F_UNLCK as libc::c_short).then_some(lock.l_pid)
}
