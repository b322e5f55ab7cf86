//! A pipeline config: parsed, validated and planned, its model built when
//! its memory claims are small (the start-up path of every binary).
#![no_main]
use libfuzzer_sys::fuzz_target;

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    let path = scratch().join("fuzz.config");
    std::fs::write(&path, data).expect("scratch write");
    let Ok(loaded) = rustrec::config::load_pipeline(&path, &Default::default()) else {
        return;
    };
    let Ok(plan) = rustrec::config::typed::TrainingPlan::from_config(&loaded.config) else {
        return;
    };
    if plan.memory.check(64 << 20, 1).is_ok() {
        let _ = rustrec::train::Trainer::new(plan);
    }
});
