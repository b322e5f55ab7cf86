//! Reading whole files written elsewhere (configs, vocabularies, sampler
//! tables, an export's JSON) with a bound: only regular files are read (a
//! device such as `/dev/zero` or a FIFO never ends), and never more bytes
//! than the caller's limit, checked before and while reading, so neither a
//! huge file nor one that grows while read can exhaust memory.

use std::io::{self, Read};
use std::path::Path;

/// Mebibytes, for limits.
pub const MIB: u64 = 1 << 20;

/// The most a config file may hold.
pub const CONFIG_BYTES: u64 = 64 * MIB;

/// The most a vocabulary, a sampler's table or an export's description
/// may hold: a quarter of this machine's memory, at most 4 GiB.
pub fn table_bytes() -> u64 {
    let quarter = crate::config::sizes::physical_memory().map_or(u64::MAX, |m| m / 4);
    quarter.min(4096 * MIB)
}

/// The bytes of the regular file `path`, refused past `limit` bytes.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a directory, device or pipe is not read)",
        ));
    }
    let too_big = |n: u64| {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{n} bytes or more, over the {limit} bytes such a file may hold"),
        )
    };
    if meta.len() > limit {
        return Err(too_big(meta.len()));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    // One byte past the limit tells a file that grew from one that did not.
    (&mut f).take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(too_big(out.len() as u64));
    }
    Ok(out)
}

/// `read` as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    utf8(read(path, limit)?)
}

/// File bytes as text; an error for bytes that are not UTF-8.
pub fn utf8(bytes: Vec<u8>) -> io::Result<String> {
    String::from_utf8(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_directories_and_files_past_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "hello").unwrap();
        assert_eq!(read_text(&p, 5).unwrap(), "hello");
        assert_eq!(read(&p, 4).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            read(dir.path(), 1 << 20).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            read(Path::new("/dev/zero"), 1 << 20).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
