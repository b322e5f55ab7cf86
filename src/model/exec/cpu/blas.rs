//! OpenBLAS's `cblas_sgemm`, loaded at run time where the system has it,
//! for the CPU executor's matrix products.
//!
//! Measured on a 2-core AMD EPYC with AVX2 only (Zen 3, November 2026, same
//! process, alternating): OpenBLAS 0.3.21's Zen kernels ran the training
//! shapes with every side from 128 up 10-40% faster than the `gemm` crate's
//! AVX2 kernel (a 2048x2048 square at 164-174 GFLOP/s against 117-125), and
//! narrow ones slower (`NARROW`). On CPUs with AVX-512 the `gemm` crate's
//! AVX-512 kernels were the fastest measured (2.2-2.6x PyTorch's training
//! there) and OpenBLAS has not been measured against them, so by default
//! OpenBLAS runs the products on CPUs without AVX-512F where it loads, and
//! the `gemm` crate everywhere else. `RUSTREC_MATMUL=openblas` or `=gemm`
//! chooses either on any CPU (to measure). Both pick their kernels by CPU
//! at run time: one binary for every x86-64 machine.
//!
//! Each product is split among the compute pool's threads (rayon's), each
//! part one single-threaded OpenBLAS call: OpenBLAS's own threads would
//! spin between products while the pool's threads wait for the cores. Only
//! a build of OpenBLAS that takes concurrent calls (its pthread or OpenMP
//! flavour; Debian's serial one is built without locking) is used.

use std::sync::OnceLock;

use rayon::prelude::*;

/// `cblas_sgemm(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
/// beta, c, ldc)` with 32-bit integers (`libopenblas.so.0`'s interface).
type Sgemm =
    unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, f32, *const f32, i32, *const f32, i32, f32, *mut f32, i32) -> ();

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// The loaded library and its entry point.
pub struct Blas {
    sgemm: Sgemm,
    /// OpenBLAS's configuration string (version, kernel family).
    pub config: String,
    _lib: libloading::Library,
}

/// Which matrix kernels the executor uses, and why.
pub enum Kernels {
    OpenBlas(Blas),
    /// The `gemm` crate, with the reason OpenBLAS is not used.
    Gemm(String),
}

impl Kernels {
    /// One line naming the kernels, for reports.
    pub fn describe(&self) -> String {
        match self {
            Kernels::OpenBlas(b) => format!("OpenBLAS ({})", b.config.trim()),
            Kernels::Gemm(why) => format!("the gemm crate ({why})"),
        }
    }
}

/// The matrix kernels of this process, decided on first use (see the
/// module's text): `RUSTREC_MATMUL` when set, else OpenBLAS on a CPU
/// without AVX-512F where it loads, else the `gemm` crate. Held once per
/// process like the CPU-feature detection of the kernels themselves (the
/// library, once loaded, stays loaded; nothing in it changes).
pub fn kernels() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let asked = std::env::var("RUSTREC_MATMUL").ok();
        match asked.as_deref() {
            Some("gemm") => return Kernels::Gemm("RUSTREC_MATMUL=gemm".into()),
            Some("openblas") | None => {}
            Some(other) => {
                log::warn!("RUSTREC_MATMUL={other} is neither gemm nor openblas; choosing by CPU");
            }
        }
        if asked.as_deref() != Some("openblas") && has_avx512f() {
            return Kernels::Gemm("its AVX-512 kernels on this CPU".into());
        }
        match load() {
            Ok(b) => Kernels::OpenBlas(b),
            Err(why) => Kernels::Gemm(why),
        }
    })
}

fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn load() -> Result<Blas, String> {
    // SAFETY: loading runs the library's initialisers; libopenblas.so.0 is
    // the system's BLAS, whose initialisers only set up its own state.
    let lib = unsafe { libloading::Library::new("libopenblas.so.0") }.map_err(|_| "no libopenblas.so.0".to_string())?;
    // SAFETY: these are OpenBLAS's documented C entry points with these
    // signatures (32-bit integer interface of libopenblas.so.0).
    unsafe {
        let sgemm = *lib.get::<Sgemm>(b"cblas_sgemm\0").map_err(|e| e.to_string())?;
        let parallel = *lib
            .get::<unsafe extern "C" fn() -> i32>(b"openblas_get_parallel\0")
            .map_err(|e| e.to_string())?;
        let set_threads = *lib
            .get::<unsafe extern "C" fn(i32)>(b"openblas_set_num_threads\0")
            .map_err(|e| e.to_string())?;
        let get_config = *lib
            .get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(b"openblas_get_config\0")
            .map_err(|e| e.to_string())?;
        if parallel() == 0 {
            return Err("this OpenBLAS is its serial build, which does not take concurrent calls".into());
        }
        // Each call runs on the calling pool thread alone.
        set_threads(1);
        let config = std::ffi::CStr::from_ptr(get_config()).to_string_lossy().into_owned();
        Ok(Blas {
            sgemm,
            config,
            _lib: lib,
        })
    }
}

/// Products with a side below this stay with the `gemm` crate: on the AVX2
/// machine above OpenBLAS ran `[2048x13]·[13x512]` at 54-56 GFLOP/s against
/// gemm's 73, a 1-wide output at 10 against 20, a 4-wide one at 31 against
/// 39; from 128 on it was as fast or faster.
const NARROW: usize = 64;

/// Products smaller than this many multiply-adds run in one call.
const SPLIT_FROM: usize = 1 << 18;

impl Blas {
    /// `c[m, n] (+)= op(a) · op(b)` as `kernels::matmul` defines it, split
    /// among the pool's threads by rows of `c` (or by columns when it has
    /// few rows). `false`, and nothing done, for a product with a side
    /// below `NARROW` (where the `gemm` crate measured faster) or one that
    /// does not fit OpenBLAS's 32-bit integers: the caller then uses `gemm`.
    ///
    /// # Safety
    /// `c` must be valid for writes (and reads when `acc`) of `m * n`
    /// values aliasing neither `a` nor `b`, which must hold `m * k` and
    /// `k * n` values; `m`, `k`, `n` non-zero.
    pub unsafe fn matmul(
        &self,
        c: *mut f32,
        (a, ta): (&[f32], bool),
        (b, tb): (&[f32], bool),
        (m, k, n): (usize, usize, usize),
        acc: bool,
    ) -> bool {
        if m.min(k).min(n) < NARROW || [m, k, n].iter().any(|&d| i32::try_from(d).is_err()) {
            return false;
        }
        let threads = rayon::current_num_threads();
        let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
        // Rows r0.. (rows of them) and columns c0.. (cols) of c.
        let call = |c: SendPtr, (r0, rows): (usize, usize), (c0, cols): (usize, usize)| {
            // SAFETY: by the caller's contract every part's pointers, leading
            // dimensions and shape lie within `a`, `b` and `c`; parts write
            // disjoint blocks of `c`.
            unsafe {
                let cp = c.0.add(r0 * n + c0);
                if !acc {
                    // OpenBLAS's own zeroing for beta = 0 (`sgemm_beta`) stores
                    // one value at a time (3.95% of MMoE's samples; zeroed
                    // here with vector stores, 3.28%), then OpenBLAS adds onto
                    // it (beta = 1 skips that pass): 0 + x as with beta = 0.
                    if cols == n {
                        std::ptr::write_bytes(cp, 0, rows * n);
                    } else {
                        for row in 0..rows {
                            std::ptr::write_bytes(cp.add(row * n), 0, cols);
                        }
                    }
                }
                let ap = if ta { a.as_ptr().add(r0) } else { a.as_ptr().add(r0 * k) };
                let bp = if tb { b.as_ptr().add(c0 * k) } else { b.as_ptr().add(c0) };
                (self.sgemm)(
                    ROW_MAJOR,
                    if ta { TRANS } else { NO_TRANS },
                    if tb { TRANS } else { NO_TRANS },
                    rows as i32,
                    cols as i32,
                    k as i32,
                    1.0,
                    ap,
                    lda as i32,
                    bp,
                    ldb as i32,
                    1.0,
                    cp,
                    n as i32,
                )
            }
        };
        let c = SendPtr(c);
        if threads < 2 || m * k * n < SPLIT_FROM {
            call(c, (0, m), (0, n));
        } else if m >= 16 * threads {
            // Row blocks, a multiple of 16 rows each (the kernels' tile).
            let rows = m.div_ceil(threads).next_multiple_of(16);
            (0..m.div_ceil(rows))
                .into_par_iter()
                .for_each(|p| call(c, (p * rows, rows.min(m - p * rows)), (0, n)));
        } else {
            // Column blocks of every row, 8 columns apart.
            let cols = n.div_ceil(threads).next_multiple_of(8);
            (0..n.div_ceil(cols))
                .into_par_iter()
                .for_each(|p| call(c, (0, m), (p * cols, cols.min(n - p * cols))));
        }
        true
    }
}

/// The destination handed to the pool's threads, each writing its own
/// block of it.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the threads write disjoint elements (see `Blas::matmul`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

#[cfg(test)]
mod tests {
    use super::*;

    /// `op(a) · op(b)` in f64, row-major, as `Blas::matmul` defines it.
    fn reference(a: &[f32], ta: bool, b: &[f32], tb: bool, (m, k, n): (usize, usize, usize)) -> Vec<f64> {
        let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] } as f64;
        let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] } as f64;
        (0..m * n)
            .map(|e| (0..k).map(|p| at(e / n, p) * bt(p, e % n)).sum())
            .collect()
    }

    /// OpenBLAS loads where `make deps` installed it, and its products,
    /// split by rows (2 threads) or by columns (8 threads over 64 rows),
    /// transposed or not, written or added, equal the definition.
    #[test]
    fn openblas_products_split_among_threads_equal_the_definition() {
        // Loaded here whatever `kernels()` chose for this CPU.
        let blas = match load() {
            Ok(b) => b,
            Err(why) => panic!("OpenBLAS does not load ({why}): `make deps` installs libopenblas0-pthread"),
        };
        let blas = &blas;
        let mut rng = crate::util::Rng::new(9);
        for (threads, (m, k, n)) in [
            (2, (300, 100, 70)),
            (8, (64, 90, 203)),
            (2, (64, 64, 64)),
            (1, (100, 80, 90)),
        ] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for (ta, tb, acc) in [
                (false, false, false),
                (true, false, true),
                (false, true, false),
                (true, true, true),
            ] {
                let a: Vec<f32> = (0..m * k).map(|_| rng.uniform() as f32 - 0.5).collect();
                let b: Vec<f32> = (0..k * n).map(|_| rng.uniform() as f32 - 0.5).collect();
                let c0: Vec<f32> = (0..m * n).map(|_| rng.uniform() as f32).collect();
                let mut c = c0.clone();
                // SAFETY: `c` holds m x n values; `a` and `b` their shapes.
                let done = pool.install(|| unsafe { blas.matmul(c.as_mut_ptr(), (&a, ta), (&b, tb), (m, k, n), acc) });
                assert!(done, "{m}x{k}x{n} runs on OpenBLAS");
                let want = reference(&a, ta, &b, tb, (m, k, n));
                for (e, (got, w)) in c.iter().zip(&want).enumerate() {
                    let w = w + if acc { c0[e] as f64 } else { 0.0 };
                    assert!(
                        (*got as f64 - w).abs() < 1e-4,
                        "{threads} threads, {m}x{k}x{n} ta {ta} tb {tb} acc {acc}: element {e} {got} against {w}"
                    );
                }
            }
        }
        // A narrow product is left to the gemm crate.
        let mut c = vec![0.0f32; 64 * 2];
        // SAFETY: as above.
        assert!(!unsafe {
            blas.matmul(
                c.as_mut_ptr(),
                (&[0.0; 64 * 8], false),
                (&[0.0; 8 * 2], false),
                (64, 8, 2),
                false,
            )
        });
    }
}
