//! Input paths to files: a directory stands for the (non-hidden) files in
//! it; `*`, `?`, `[...]` match within a name and `**` across directories,
//! as the `glob` crate's patterns do (its matcher does not backtrack
//! exponentially on patterns like `*a*a*a*b`). The walk is ours, not the
//! crate's: a directory reached again through a symbolic link (a cycle) is
//! not entered twice, and a directory that cannot be read is reported by
//! name and skipped, the rest of the expansion going on.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use super::DataError;
use crate::storage::glob::has_wildcard;

fn is_hidden(p: &Path) -> bool {
    p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// Expands input paths into sorted files per path, in the paths' order.
pub fn expand_paths(paths: &[String]) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    for p in paths {
        let path = Path::new(p);
        if crate::storage::is_remote(path) {
            let files = crate::storage::glob::expand(p).map_err(|e| DataError::Remote(e.to_string()))?;
            if files.is_empty() {
                return Err(DataError::NoFiles(p.clone()));
            }
            out.extend(files);
            continue;
        }
        if !has_wildcard(p) {
            if path.is_dir() {
                let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|e| DataError::io(path, e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.is_file() && !is_hidden(p))
                    .collect();
                if files.is_empty() {
                    return Err(DataError::NoFiles(p.clone()));
                }
                files.sort();
                out.extend(files);
            } else {
                out.push(path.to_path_buf());
            }
            continue;
        }
        let mut files = expand_pattern(p)?;
        if files.is_empty() {
            return Err(DataError::NoFiles(p.clone()));
        }
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

/// The files `pattern` matches.
fn expand_pattern(pattern: &str) -> Result<Vec<PathBuf>, DataError> {
    let bad = |message: String| DataError::BadPattern {
        pattern: pattern.to_string(),
        message,
    };
    let options = glob::MatchOptions {
        require_literal_leading_dot: true,
        ..glob::MatchOptions::new()
    };
    // The literal directory the pattern starts from, then its parts.
    let mut base = PathBuf::new();
    let mut parts: Vec<Part> = Vec::new();
    for c in Path::new(pattern).components() {
        match c {
            Component::Normal(s) => {
                let s = s.to_str().ok_or_else(|| bad("is not UTF-8".into()))?;
                if parts.is_empty() && !has_wildcard(s) {
                    base.push(s);
                } else if s == "**" {
                    parts.push(Part::AnyDirs);
                } else if s.contains("**") {
                    return Err(bad("`**` must be a whole path component".into()));
                } else {
                    let p = glob::Pattern::new(s).map_err(|e| bad(e.to_string()))?;
                    parts.push(Part::Name(p));
                }
            }
            other if parts.is_empty() => base.push(other.as_os_str()),
            _ => return Err(bad("`.` and `..` only before the first wildcard".into())),
        }
    }
    if base.as_os_str().is_empty() {
        base.push(".");
    }
    let mut walk = Walk {
        options,
        files: Vec::new(),
        seen: HashSet::new(),
        relative: !Path::new(pattern).is_absolute() && !pattern.starts_with("./"),
    };
    walk.visit(&base, &parts);
    Ok(walk.files)
}

enum Part {
    /// `**`: any number of directories, none included.
    AnyDirs,
    Name(glob::Pattern),
}

struct Walk {
    options: glob::MatchOptions,
    files: Vec<PathBuf>,
    /// The directories entered, by device and inode: a cycle of links ends.
    seen: HashSet<(u64, u64)>,
    /// Whether matches are shown without the leading `./` of the base.
    relative: bool,
}

impl Walk {
    fn shown(&self, p: PathBuf) -> PathBuf {
        match p.strip_prefix(".") {
            Ok(rest) if self.relative => rest.to_path_buf(),
            _ => p,
        }
    }

    /// The entries of directory `dir`, or none when it cannot be read (a
    /// warning names it) or was entered before on this walk.
    fn entries(&mut self, dir: &Path) -> Vec<(String, PathBuf)> {
        let Ok(meta) = std::fs::metadata(dir) else {
            return Vec::new();
        };
        if !meta.is_dir() || !self.seen.insert((meta.dev(), meta.ino())) {
            return Vec::new();
        }
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                .collect(),
            Err(e) => {
                log::warn!("input glob: skipping {}: {e}", dir.display());
                Vec::new()
            }
        }
    }

    fn visit(&mut self, at: &Path, parts: &[Part]) {
        let Some((first, rest)) = parts.split_first() else {
            if at.is_file() {
                let p = self.shown(at.to_path_buf());
                self.files.push(p);
            }
            return;
        };
        match first {
            Part::AnyDirs => {
                // Zero directories here, then each subdirectory in turn
                // (each entered once: `entries` ends cycles).
                let seen_before = self.seen.clone();
                self.visit(at, rest);
                self.seen = seen_before;
                for (name, path) in self.entries(at) {
                    if name.starts_with('.') || !path.is_dir() {
                        continue;
                    }
                    self.visit(&path, parts);
                }
            }
            Part::Name(p) => {
                let last = rest.is_empty();
                for (name, path) in self.entries(at) {
                    if !p.matches_with(&name, self.options) {
                        continue;
                    }
                    if last || path.is_dir() {
                        self.visit(&path, rest);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_cycles_end_and_unreadable_directories_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/x1.csv"), "").unwrap();
        std::fs::write(root.join("a/b/x2.csv"), "").unwrap();
        // Links back to the parent and the root: a walk that followed them
        // would not end (or grow exponentially).
        std::os::unix::fs::symlink(root.join("a"), root.join("a/b/up")).unwrap();
        std::os::unix::fs::symlink(root, root.join("a/b/top")).unwrap();
        let locked = root.join("a/locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::write(locked.join("x3.csv"), "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let pat = root.join("**/x*.csv").to_string_lossy().into_owned();
        let got = expand_paths(&[pat]);
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        let got = got.unwrap();
        assert!(got.contains(&root.join("a/x1.csv")), "{got:?}");
        assert!(got.contains(&root.join("a/b/x2.csv")), "{got:?}");
        // Each file at most once per path reaching it through no cycle.
        assert!(got.len() <= 5, "{got:?}");
        // An empty directory names itself.
        std::fs::create_dir(root.join("empty")).unwrap();
        let err = expand_paths(&[root.join("empty").to_string_lossy().into_owned()]).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
