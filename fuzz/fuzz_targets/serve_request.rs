//! A scoring request body as `serve` decodes it: JSON, then TF Serving's
//! and KServe v2's request forms against an export (made by `make fuzz`,
//! named by RUSTREC_FUZZ_EXPORT); and as Triton's binary tensor data, its
//! JSON header's length taken from the first bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fn model() -> &'static rustrec::export::runtime::ExportedModel {
    static MODEL: std::sync::OnceLock<rustrec::export::runtime::ExportedModel> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = std::env::var("RUSTREC_FUZZ_EXPORT").expect("RUSTREC_FUZZ_EXPORT names an export");
        rustrec::export::runtime::ExportedModel::load(std::path::Path::new(&dir)).expect("a loadable export")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Some((len, rest)) = data.split_first_chunk::<2>() {
        let header = u16::from_le_bytes(*len) as usize;
        if let Ok(body) = rustrec::serve::binary::parse(rest, header) {
            let _ = rustrec::serve::request::kserve_v2(&body, model());
        }
    }
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = rustrec::serve::request::tf_serving(&body, model());
    let _ = rustrec::serve::request::kserve_v2(&body, model());
});
