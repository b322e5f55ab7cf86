//! One rule for every file this program writes where a user points it
//! (eval results, predictions, exports, summaries, state files): the
//! target is a regular file or absent (a FIFO, device or directory is
//! refused, never replaced), never a checkpoint or inside one, never one
//! of the job's inputs; it is written through a temporary beside it that
//! is removed when the write fails.

use std::path::{Component, Path, PathBuf};

use crate::error::{Classified, Fault};

/// Why a path may not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{}: not a regular file (a directory, device or pipe is never replaced)", path.display())]
    NotRegular { path: PathBuf },
    #[error("{}: not a directory", path.display())]
    NotDirectory { path: PathBuf },
    #[error("{}: inside the checkpoint {}; checkpoints are only written by training", path.display(), checkpoint.display())]
    InCheckpoint { path: PathBuf, checkpoint: PathBuf },
    #[error("{}: one of the files this job reads", path.display())]
    OverInput { path: PathBuf },
    #[error("{flag} {given}: must be a relative path inside {} (no `..`, not absolute)", root.display())]
    Outside { flag: String, given: String, root: PathBuf },
}

impl Classified for OutputError {
    fn fault(&self) -> Fault {
        Fault::User
    }
}

/// Whether a file or directory named `name` is (part of) a checkpoint:
/// ours (`model.ckpt-N`, staged `.model.ckpt-N.tmp`) or TensorFlow's
/// (`model.ckpt-N.index`, `.data-…`, `.meta`).
fn is_checkpoint_name(name: &str) -> bool {
    name.starts_with("model.ckpt-") || name.starts_with(".model.ckpt-")
}

/// `path` made absolute, its existing part resolved through links.
fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => resolved(dir).join(name),
        _ => std::env::current_dir().unwrap_or_default().join(path),
    }
}

/// Checks that `path` may be written by a job reading `inputs`.
pub fn check(path: &Path, inputs: &[PathBuf]) -> Result<(), OutputError> {
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            return Err(OutputError::NotRegular {
                path: path.to_path_buf(),
            });
        }
    }
    let full = resolved(path);
    if let Some(ckpt) = full
        .ancestors()
        .find(|a| a.file_name().and_then(|n| n.to_str()).is_some_and(is_checkpoint_name))
    {
        return Err(OutputError::InCheckpoint {
            path: path.to_path_buf(),
            checkpoint: ckpt.to_path_buf(),
        });
    }
    if inputs.iter().any(|i| resolved(i) == full) {
        return Err(OutputError::OverInput {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// `given` (the value of `flag`) as a path inside `root`: relative, and
/// without `..`, as a flag documented as "a file inside model_dir" means.
pub fn inside(root: &Path, given: &str, flag: &str) -> Result<PathBuf, OutputError> {
    let rel = Path::new(given);
    let ok = !given.is_empty()
        && rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !ok {
        return Err(OutputError::Outside {
            flag: flag.to_string(),
            given: given.to_string(),
            root: root.to_path_buf(),
        });
    }
    Ok(root.join(rel))
}

/// A temporary file beside a target, removed when dropped before
/// `committed` (a failed or interrupted write leaves nothing behind).
#[derive(Debug)]
pub struct Temp {
    pub path: PathBuf,
    committed: bool,
}

impl Temp {
    /// The hidden temporary `.NAME.tmp-PID` beside `target`.
    pub fn beside(target: &Path) -> Self {
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Temp {
            path: target.with_file_name(format!(".{name}.tmp-{}", std::process::id())),
            committed: false,
        }
    }

    /// Renames the temporary onto `target`.
    pub fn commit(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_checkpoints_inputs_and_paths_outside_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("model.ckpt-10")).unwrap();
        std::fs::write(d.join("in.csv"), "x").unwrap();
        assert!(check(&d.join("out.csv"), &[]).is_ok());
        assert!(matches!(check(d, &[]), Err(OutputError::NotRegular { .. })));
        assert!(matches!(
            check(Path::new("/dev/null"), &[]),
            Err(OutputError::NotRegular { .. })
        ));
        assert!(matches!(
            check(&d.join("model.ckpt-10/manifest.json"), &[]),
            Err(OutputError::InCheckpoint { .. })
        ));
        assert!(matches!(
            check(&d.join("model.ckpt-10.index"), &[]),
            Err(OutputError::InCheckpoint { .. })
        ));
        assert!(matches!(
            check(&d.join("./in.csv"), &[d.join("in.csv")]),
            Err(OutputError::OverInput { .. })
        ));
        assert!(inside(d, "eval/result.txt", "--eval_result_path").is_ok());
        for bad in ["../x", "/tmp/x", "a/../../x", ""] {
            assert!(inside(d, bad, "--eval_result_path").is_err(), "{bad}");
        }
        let t = Temp::beside(&d.join("r.txt"));
        std::fs::write(&t.path, "partial").unwrap();
        let tmp = t.path.clone();
        drop(t);
        assert!(!tmp.exists());
    }
}
