#![allow(dead_code)]
pub mod models;

use std::path::PathBuf;

/// The shared folder beside the repository (sample configs, real data);
/// `RUSTREC_SHARED_DIR` overrides it.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("RUSTREC_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    assert!(
        dir.join("easyrec_configs").is_dir(),
        "shared folder not found at {} (set RUSTREC_SHARED_DIR)",
        dir.display()
    );
    dir
}

pub fn easyrec_configs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(shared_dir().join("easyrec_configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "config"))
        .collect();
    v.sort();
    assert!(v.len() >= 10, "expected the EasyRec sample configs, found {}", v.len());
    v
}

pub fn sample(name: &str) -> PathBuf {
    shared_dir().join("easyrec_configs").join(name)
}
