// Shared by the fuzz targets (each includes it with `include!`).

/// A scratch directory of this fuzzing process.
#[allow(dead_code)]
fn scratch() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("rustrec-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch directory");
        d
    })
}

/// Splits `data` at the little-endian u32 it starts with (clamped): the
/// way one input carries two files.
#[allow(dead_code)]
fn two_parts(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_le_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let rest = &data[4..];
    Some(rest.split_at(n.min(rest.len())))
}

/// The projection of `columns` (name, type, required), no defaults.
#[allow(dead_code)]
fn projection(columns: &[(&str, rustrec::config::data_plan::ColumnType, bool)]) -> rustrec::data::Projection {
    rustrec::data::Projection {
        columns: columns
            .iter()
            .map(|&(name, ty, required)| rustrec::data::ProjColumn {
                name: name.into(),
                ty,
                default_val: String::new(),
                required,
            })
            .collect(),
    }
}
