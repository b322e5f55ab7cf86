//! Property test of the loaders: random mutations of a real config, of
//! checkpoint bytes and of CSV rows must each end in a result or a user
//! error (exit 1), never a panic or an internal error, and never allocate
//! more than a stated bound. The cases are drawn from fixed seeds, so a
//! failure names a case that reproduces.
//!
//! This file is its own test binary: its allocator counts the bytes live
//! at the peak of each case.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustrec::config::typed::TrainingPlan;
use rustrec::util::Rng;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `case`, returning its result and the most bytes it had live at once.
fn measured<T>(case: impl FnOnce() -> T) -> (std::thread::Result<T>, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(case));
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

const MIB: usize = 1 << 20;
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The mutations: flip, delete, duplicate, insert and splice in numbers
/// that are huge, negative or not numbers at all.
fn mutate(rng: &mut Rng, text: &[u8], max_spots: u64) -> Vec<u8> {
    let mut b = text.to_vec();
    let spots = 1 + rng.below(max_spots);
    for _ in 0..spots {
        let at = rng.below(b.len().max(1) as u64) as usize;
        match rng.below(10) {
            0 => {
                if let Some(x) = b.get_mut(at) {
                    *x ^= 1 << rng.below(8);
                }
            }
            1 => {
                let end = (at + 1 + rng.below(40) as usize).min(b.len());
                b.drain(at.min(end)..end);
            }
            2 => {
                let end = (at + 1 + rng.below(80) as usize).min(b.len());
                let piece = b[at.min(end)..end].to_vec();
                b.splice(at..at, piece);
            }
            3 => {
                let junk = ["{", "}", "\"", ":", "[", "]", "\n", "\0", "\u{feff}", "é"];
                let j = junk[rng.below(junk.len() as u64) as usize];
                b.splice(at..at, j.bytes());
            }
            _ => {
                // Replace the next number with a hostile one.
                let numbers = [
                    "4294967295",
                    "18446744073709551615",
                    "-1",
                    "0",
                    "nan",
                    "1e999",
                    "99999999999999",
                ];
                let n = numbers[rng.below(numbers.len() as u64) as usize];
                if let Some(start) = (at..b.len()).find(|&i| b[i].is_ascii_digit()) {
                    let end = (start..b.len()).find(|&i| !b[i].is_ascii_digit()).unwrap_or(b.len());
                    b.splice(start..end, n.bytes());
                }
            }
        }
    }
    b
}

fn assert_user_error(err: &anyhow::Error, what: &str) {
    assert_eq!(
        rustrec::cli::exit_code(err),
        1,
        "{what}: an internal error (exit 2) where a user error was due: {err:#}"
    );
}

#[test]
fn mutated_inputs_give_results_or_user_errors_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(20261123);

    // Configs: parse, validate, plan, and build the model when its claims
    // fit in 64 MiB; everything built must stay within 512 MiB.
    let base = std::fs::read(Path::new(ROOT).join("samples/wide_and_deep_criteo_sample.config")).unwrap();
    let cfg_path = dir.path().join("fuzz.config");
    let (mut planned, mut built) = (0, 0);
    for case in 0..300 {
        let text = mutate(&mut rng, &base, 1);
        std::fs::write(&cfg_path, &text).unwrap();
        let (out, peak) = measured(|| -> anyhow::Result<bool> {
            let loaded = rustrec::config::load_pipeline(&cfg_path, &Default::default())?;
            let plan = TrainingPlan::from_config(&loaded.config)?;
            if plan.memory.check(64 * MIB as u64, 1).is_err() {
                return Ok(false);
            }
            rustrec::train::Trainer::new(plan)?;
            Ok(true)
        });
        let what = format!("config case {case}:\n{}", String::from_utf8_lossy(&text));
        match out {
            Err(_) => panic!("{what}\npanicked"),
            Ok(Err(e)) => assert_user_error(&e, &what),
            Ok(Ok(b)) => {
                planned += 1;
                built += usize::from(b);
            }
        }
        assert!(peak <= 512 * MIB, "{what}\nallocated {} MiB", peak / MIB);
    }
    // The mutations leave many configs valid: both paths are exercised.
    assert!(planned >= 30 && built >= 20, "planned {planned}, built {built}");

    // Checkpoint bytes: the safetensors reader allocates no more than the
    // file's own size (plus its parsed header), whatever the header says.
    let values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let file = dir.path().join("t.safetensors");
    rustrec::checkpoint::write_file(
        &file,
        &[
            rustrec::checkpoint::TensorRef::new("w", vec![10, 100], &values),
            rustrec::checkpoint::TensorRef::new("b", vec![1000], &values),
        ],
    )
    .unwrap();
    let good = std::fs::read(&file).unwrap();
    for case in 0..2000 {
        let bytes = mutate(&mut rng, &good, 3);
        let (out, peak) = measured(|| rustrec::checkpoint::read_file(&bytes));
        assert!(out.is_ok(), "checkpoint case {case} panicked");
        assert!(
            peak <= 4 * bytes.len() + MIB,
            "checkpoint case {case}: {peak} bytes for a {}-byte file",
            bytes.len()
        );
    }

    // CSV rows, read and encoded through evaluation.
    let plan_cfg = rustrec::config::load_pipeline(
        &Path::new(ROOT).join("samples/wide_and_deep_criteo_sample.config"),
        &Default::default(),
    )
    .unwrap();
    let trainer = rustrec::train::Trainer::new(TrainingPlan::from_config(&plan_cfg.config).unwrap()).unwrap();
    let csv = std::fs::read(Path::new(ROOT).join("data/criteo_sample.csv")).unwrap();
    let csv: Vec<u8> = csv.split(|b| *b == b'\n').take(20).collect::<Vec<_>>().join(&b'\n');
    let data = dir.path().join("rows.csv");
    let mut ok = 0;
    for case in 0..150 {
        let rows = mutate(&mut rng, &csv, 2);
        std::fs::write(&data, &rows).unwrap();
        let paths = [data.to_string_lossy().into_owned()];
        let (out, peak) = measured(|| trainer.evaluate(&paths));
        let what = format!("CSV case {case}:\n{}", String::from_utf8_lossy(&rows));
        match out {
            Err(_) => panic!("{what}\npanicked"),
            Ok(Err(e)) => assert_user_error(&e, &what),
            Ok(Ok(_)) => ok += 1,
        }
        assert!(peak <= 256 * MIB, "{what}\nallocated {} MiB", peak / MIB);
    }
    assert!(ok >= 10, "only {ok} CSV cases read");
}
