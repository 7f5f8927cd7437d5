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
}

/// The error of a checkpoint whose step `what` on `path` failed with `e`.
fn failed(what: &str, path: &Path, e: &dyn std::fmt::Display) -> Error {
    Error::Checkpoint(format!("{what} {}: {e}", path.display()))
}

impl Store {
    /// Writes a consistent copy of the store into `dir`, which must not exist yet (its parent is
    /// created if missing), while the store goes on (module docs). Opened as a data directory
    /// with the default `archive_dir`, it answers what this store did at the checkpoint. On an
    /// error `dir` is removed again.
    pub fn checkpoint(&self, dir: &Path) -> Result<CheckpointSummary> {
        if dir.exists() {
            return Err(Error::Checkpoint(format!("{} exists already", dir.display())));
        }
        // Spills and cold deletes change the manifest and the files together: not meanwhile.
        let _spills = self.spill_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // The approximate message counts wait in memory for their next batch: written first.
        self.flush_message_counts()?;
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed("creating", parent, &e))?;
        }
        std::fs::create_dir(dir).map_err(|e| failed("creating", dir, &e))?;
        // A checkpoint cut short is no backup: what it wrote goes (best effort), so that no
        // directory under the checkpoints looks like one.
        self.fill_checkpoint(dir).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(dir);
        })
    }

    /// Writes the checkpoint into `dir`, which exists and is empty ([`Store::checkpoint`]).
    fn fill_checkpoint(&self, dir: &Path) -> Result<CheckpointSummary> {
        let db_dir = dir.join("rocksdb");
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(&db_dir))
            .map_err(|e| failed("writing the RocksDB checkpoint", &db_dir, &e))?;
        let mut summary = CheckpointSummary { dir: dir.to_path_buf(), archive_files: 0, archive_in_bucket: false };
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
                // A link where the file system allows it (the same one), else a copy.
                if std::fs::hard_link(&file, &to).is_err() {
                    std::fs::copy(&file, &to).map_err(|e| failed("copying", &file, &e))?;
                }
                summary.archive_files += 1;
            }
        }
        Ok(summary)
    }
}
