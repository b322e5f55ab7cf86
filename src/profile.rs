//! A per-phase account of where a training step's time goes: each phase's
//! calls, seconds and the work it did (floating-point operations for matrix
//! products, bytes moved for the rest), so a report can set achieved
//! GFLOP/s and GB/s beside the machine's limits. Held by whoever asks for
//! one (`Trainer::set_profile`, the CPU executor's `Cpu::profiled`); nothing
//! is recorded, nor any name formatted, without one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// What a phase did, for its rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// Floating-point operations (a multiply-add is two).
    Flops(f64),
    /// Bytes read and written.
    Bytes(f64),
}

/// Where a phase sits: a step's part, or an op of the model's pass
/// (inside the step's `Level::Step` phase named `MODEL_PASS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    Step,
    Op,
}

/// The step phase that the executor's ops (`Level::Op`) account for in part.
pub const MODEL_PASS: &str = "model forward, loss, backward";

/// One phase's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub level: Level,
    pub name: String,
    pub calls: u64,
    pub secs: f64,
    pub flops: f64,
    pub bytes: f64,
}

/// Phases recorded so far, in the order first seen.
#[derive(Debug, Default)]
pub struct Profile {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: Vec<Entry>,
    index: HashMap<(Level, String), usize>,
}

impl Profile {
    /// Adds one call of phase `name` that took `secs` and did `work`.
    pub fn record(&self, level: Level, name: String, secs: f64, work: Option<Work>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { entries, index } = &mut *g;
        let i = *index.entry((level, name.clone())).or_insert_with(|| {
            entries.push(Entry {
                level,
                name,
                calls: 0,
                secs: 0.0,
                flops: 0.0,
                bytes: 0.0,
            });
            entries.len() - 1
        });
        let e = &mut entries[i];
        e.calls += 1;
        e.secs += secs;
        match work {
            Some(Work::Flops(f)) => e.flops += f,
            Some(Work::Bytes(b)) => e.bytes += b,
            None => {}
        }
    }

    /// Every phase's totals so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).entries.clone()
    }

    /// Forgets what was recorded (after warm-up steps).
    pub fn clear(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.entries.clear();
        g.index.clear();
    }
}

/// The name of step phase `name`, as `timed` takes it.
pub fn step_phase(name: &'static str) -> (Level, impl FnOnce() -> String) {
    (Level::Step, move || name.to_string())
}

/// Runs `f`, recording it as a call of phase `name()` (with `work` of its
/// result) in `profile` when there is one; without one only `f` runs.
pub fn timed<T>(
    profile: Option<&Profile>,
    (level, name): (Level, impl FnOnce() -> String),
    work: impl FnOnce(&T) -> Option<Work>,
    f: impl FnOnce() -> T,
) -> T {
    match profile {
        None => f(),
        Some(p) => {
            let t = Instant::now();
            let out = f();
            let secs = t.elapsed().as_secs_f64();
            p.record(level, name(), secs, work(&out));
            out
        }
    }
}

/// The instruction sets this CPU offers that the kernels (gemm's, chosen
/// at run time) can use, best first: what a throughput figure was
/// measured with.
pub fn cpu_isa() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut have = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512f") {
            have.push("AVX-512F");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            have.push("AVX2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            have.push("FMA");
        }
        if have.is_empty() {
            have.push("SSE2");
        }
        have.join("+")
    }
    #[cfg(target_arch = "aarch64")]
    {
        "NEON".to_string()
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// The CPU's model name (Linux), for reports; empty when unknown.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// A report of `entries` over `steps` steps that took `step_secs` each:
/// per phase its time a step, share of the step and rate, the executor's
/// ops under the model pass with what they leave unexplained, then the
/// step's matrix work at `peak_gflops` against its time.
pub fn report(entries: &[Entry], steps: u64, step_secs: f64, peak_gflops: f64) -> String {
    use std::fmt::Write;
    let steps = steps.max(1) as f64;
    let mut out = String::new();
    let line = |out: &mut String, indent: &str, e: &Entry| {
        let secs = e.secs / steps;
        let rate = if e.flops > 0.0 {
            format!(
                "{:>8.1} GFLOP/s ({:.0}% of peak)",
                e.flops / e.secs / 1e9,
                100.0 * e.flops / e.secs / 1e9 / peak_gflops
            )
        } else if e.bytes > 0.0 {
            format!("{:>8.2} GB/s", e.bytes / e.secs / 1e9)
        } else {
            String::new()
        };
        let name = format!("{indent}{}", e.name);
        let _ = writeln!(
            out,
            "  {name:<52} {:>6.1} {:>8.3} {:>6.1}%  {rate}",
            e.calls as f64 / steps,
            secs * 1e3,
            100.0 * secs / step_secs
        );
    };
    let _ = writeln!(
        out,
        "  {:<52} {:>6} {:>8} {:>7}  rate",
        "phase", "calls", "ms/step", "share"
    );
    let ops: Vec<&Entry> = entries.iter().filter(|e| e.level == Level::Op).collect();
    let op_secs: f64 = ops.iter().map(|e| e.secs).sum();
    let mut accounted = 0.0;
    for e in entries.iter().filter(|e| e.level == Level::Step) {
        accounted += e.secs;
        line(&mut out, "", e);
        if e.name == MODEL_PASS && !ops.is_empty() {
            let mut sorted = ops.clone();
            sorted.sort_by(|a, b| b.secs.total_cmp(&a.secs));
            for op in sorted {
                line(&mut out, "  ", op);
            }
            line(
                &mut out,
                "  ",
                &Entry {
                    level: Level::Op,
                    name: "loss heads, tape bookkeeping".into(),
                    calls: steps as u64,
                    secs: (e.secs - op_secs).max(0.0),
                    flops: 0.0,
                    bytes: 0.0,
                },
            );
        }
    }
    line(
        &mut out,
        "",
        &Entry {
            level: Level::Step,
            name: "unaccounted (hand-offs between phases)".into(),
            calls: steps as u64,
            secs: (step_secs * steps - accounted).max(0.0),
            flops: 0.0,
            bytes: 0.0,
        },
    );
    if ops.is_empty() {
        // An executor that times no ops of its own (burn's, on a GPU): its
        // pass is one phase, and its matrix work is not counted.
        let _ = writeln!(
            out,
            "  (the executor times no ops of its own: the model pass is one phase)"
        );
        return out;
    }
    let flops: f64 = ops.iter().map(|e| e.flops).sum::<f64>() / steps;
    let at_peak = flops / (peak_gflops * 1e9);
    let matmul_secs: f64 = ops.iter().filter(|e| e.flops > 0.0).map(|e| e.secs).sum::<f64>() / steps;
    let _ = writeln!(
        out,
        "  matrix products: {:.2} GFLOP a step, {:.1} ms at the measured peak of {peak_gflops:.1} GFLOP/s, \
         {:.1} ms spent in them ({:.0}% of peak); the step takes {:.2}x the products' time at peak",
        flops / 1e9,
        at_peak * 1e3,
        matmul_secs * 1e3,
        100.0 * at_peak / matmul_secs.max(f64::MIN_POSITIVE),
        step_secs / at_peak.max(f64::MIN_POSITIVE)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_sum_per_name_and_the_model_pass_is_split_into_its_ops() {
        let p = Profile::default();
        timed(
            Some(&p),
            (Level::Step, || "pool".to_string()),
            |_| Some(Work::Bytes(2e9)),
            || (),
        );
        p.record(Level::Step, "pool".into(), 0.5, Some(Work::Bytes(1e9)));
        p.record(Level::Step, MODEL_PASS.into(), 2.0, None);
        p.record(Level::Op, "matmul 4x4x4".into(), 1.5, Some(Work::Flops(3e9)));
        let e = p.entries();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].calls, 2);
        assert_eq!(e[0].bytes, 3e9);
        let r = report(&e, 1, 4.0, 4.0);
        // 3 GFLOP at 4 GFLOP/s: 750 ms at peak; the op ran at 2 GFLOP/s.
        assert!(r.contains("2.0 GFLOP/s (50% of peak)"), "{r}");
        assert!(r.contains("750.0 ms at the measured peak"), "{r}");
        assert!(r.contains("5.33x"), "{r}");
        // What the model pass's ops leave: 0.5 s of its 2.
        let heads = r.lines().find(|l| l.contains("loss heads")).unwrap();
        assert!(heads.contains("500.000"), "{heads}");
        // An executor timing no ops: its pass unsplit, no matrix account.
        let passes: Vec<Entry> = e.iter().filter(|x| x.level == Level::Step).cloned().collect();
        let r = report(&passes, 1, 4.0, 4.0);
        assert!(!r.contains("loss heads") && !r.contains("matrix products"), "{r}");
        assert!(r.contains("times no ops of its own"), "{r}");
        p.clear();
        assert!(p.entries().is_empty());
        // Without a profile nothing is named.
        timed(None, (Level::Op, || -> String { panic!("named") }), |_| None, || ());
    }
}
