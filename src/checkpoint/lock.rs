//! One training job per model_dir: an exclusive lock on `model_dir/.lock`,
//! held for the life of the job. The operating system drops the lock when
//! the holder exits, however it exits, so a dead job never leaves a stale
//! lock behind; the file itself only tells who holds it.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::Unusable;

const LOCK_FILE: &str = ".lock";

/// The held lock; dropping it (or exiting) releases it.
#[derive(Debug)]
pub struct ModelDirLock {
    _file: File,
    path: PathBuf,
}

impl ModelDirLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes the lock on `model_dir` (creating the directory), or says which
/// process holds it.
pub fn lock_model_dir(model_dir: &Path) -> anyhow::Result<ModelDirLock> {
    fs::create_dir_all(model_dir)
        .map_err(|e| Unusable(format!("cannot create model_dir {}: {e}", model_dir.display())))?;
    let path = model_dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Unusable(format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            file.read_to_string(&mut holder).ok();
            let holder = holder.trim();
            return Err(Unusable(format!(
                "model_dir {} is in use by another training job{}; one job may train in a model_dir at a time",
                model_dir.display(),
                if holder.is_empty() {
                    String::new()
                } else {
                    format!(" ({holder})")
                }
            ))
            .into());
        }
        Err(TryLockError::Error(e)) => {
            return Err(Unusable(format!("cannot lock {}: {e}", path.display())).into());
        }
    }
    let me = format!("pid {} on {}", std::process::id(), hostname());
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(me.as_bytes())?;
    Ok(ModelDirLock { _file: file, path })
}

/// This machine's name, as a lock names its holder ("" when unknown).
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_model_dir(dir.path()).unwrap();
        let err = lock_model_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("in use by another training job"), "{err}");
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(first);
        lock_model_dir(dir.path()).unwrap();
    }
}
