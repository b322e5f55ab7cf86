//! Input paths on remote storage, expanded as local ones are
//! (`data::paths`): a "directory" (a prefix) stands for the non-hidden
//! objects directly in it; `*`, `?`, `[...]` match within a name and `**`
//! across directories. One listing of the literal prefix, then matching.

use std::path::PathBuf;

use super::{object, StorageError};

/// Whether a path holds a glob wildcard (`*`, `?`, `[`); local paths
/// (`data::paths`) and remote ones expand by the same rule.
pub fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The files remote path `url` stands for, sorted (none: the caller says so).
pub fn expand(url: &str) -> Result<Vec<PathBuf>, StorageError> {
    let (scheme_authority, key) = match url.split_once("://") {
        Some((s, rest)) => {
            let (auth, key) = rest.split_once('/').unwrap_or((rest, ""));
            (format!("{s}://{auth}"), key)
        }
        None => (String::new(), url),
    };
    let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
    let Some(first_wild) = parts.iter().position(|p| has_wildcard(p)) else {
        let o = object(std::path::Path::new(url))?;
        if !key.ends_with('/') && o.size()?.is_some() {
            return Ok(vec![PathBuf::from(url)]);
        }
        let files = o
            .list()?
            .into_iter()
            .filter(|l| !l.relative.contains('/') && !l.relative.starts_with('.'))
            .map(|l| l.path)
            .collect();
        return Ok(files);
    };
    let base = format!("{scheme_authority}/{}", parts[..first_wild].join("/"));
    let pattern_text = parts[first_wild..].join("/");
    let pattern = glob::Pattern::new(&pattern_text).map_err(|e| StorageError {
        url: url.to_string(),
        endpoint: "-".into(),
        message: format!("not a valid pattern: {e}"),
    })?;
    let options = glob::MatchOptions {
        require_literal_separator: true,
        require_literal_leading_dot: true,
        ..glob::MatchOptions::new()
    };
    let o = object(std::path::Path::new(base.trim_end_matches('/')))?;
    Ok(o.list()?
        .into_iter()
        .filter(|l| pattern.matches_with(&l.relative, options))
        .map(|l| l.path)
        .collect())
}
