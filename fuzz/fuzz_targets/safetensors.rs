//! Our checkpoints' tensor files (safetensors), parsed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rustrec::checkpoint::safetensors::read_file(data);
});
