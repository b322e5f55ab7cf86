//! A TensorFlow checkpoint: the index (first part) and its one data file
//! (second part), opened, verified and every variable read.
#![no_main]
use libfuzzer_sys::fuzz_target;

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    let Some((index, shard)) = two_parts(data) else {
        return;
    };
    let prefix = scratch().join("model.ckpt-1");
    std::fs::write(scratch().join("model.ckpt-1.data-00000-of-00001"), shard).expect("scratch write");
    if let Ok(ckpt) = rustrec::checkpoint::tensorflow::TfCheckpoint::from_index(&prefix, index) {
        let _ = ckpt.verify_all();
        let _ = ckpt.global_step();
        let names: Vec<String> = ckpt.entries.keys().cloned().collect();
        for name in names {
            let _ = ckpt.read_f32(&name);
        }
    }
});
