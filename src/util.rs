//! Small deterministic helpers: a seedable RNG and the stable feature hash.

/// splitmix64 finalizer: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Keeps freed memory in the process for reuse. A training step allocates
/// and frees the same multi-megabyte activation buffers every time; with
/// glibc's defaults each comes back as fresh pages from the kernel, and the
/// page faults and zeroing cost a third of a DLRM step. Call once, first
/// thing in `main`. Does nothing on other C libraries.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        // Blocks up to 32 MiB (glibc's largest threshold) come from the
        // heap, and the heap is not trimmed below 1 GiB of free space.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// `len` copies of `value` in memory the kernel may back with huge pages
/// (2 MiB on x86-64 Linux, where transparent huge pages are left to
/// `madvise`, as Debian's default is): for embedding tables and their
/// optimizer slots, read and written at random rows. With 4 KiB pages each
/// of a batch's row lookups in tables of hundreds of MiB also misses the
/// TLB and walks the page table; 2 MiB pages keep the whole of a model's
/// tables within the TLB's reach. The advice is given before the first
/// write, when the pages are faulted in; the values are written on the
/// compute pool's threads, as faulting in gigabytes of tables on one thread
/// would lengthen start-up. Elsewhere a plain vector.
pub fn table_buffer(value: f32, len: usize) -> Vec<f32> {
    use rayon::iter::ParallelExtend;
    let mut v: Vec<f32> = Vec::with_capacity(len);
    advise_huge_pages(v.as_mut_ptr().cast(), len * std::mem::size_of::<f32>());
    v.par_extend(rayon::iter::repeat_n(value, len));
    v
}

/// Asks for huge pages on the whole 2 MiB pages inside `bytes` at `ptr`.
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize).saturating_add(bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside an allocation of this process;
            // MADV_HUGEPAGE changes how its pages are backed, never their
            // contents. A refusal (no THP in this kernel) leaves 4 KiB pages.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Makes the calling thread one of the threads of rayon's global pool (the
/// pool is then sized as rayon sizes it: RAYON_NUM_THREADS, else the
/// cores). Call it first thing on the thread that trains or scores. From
/// outside the pool, every parallel sweep and matrix product of a step
/// hands its work to the pool and sleeps until a pool thread wakes it: two
/// thread wake-ups per call, hundreds of calls a step. Inside the pool the
/// thread works its own share and the others steal from it. Measured with
/// `bench` on 2 threads (3 alternating runs each): MMoE 41.5k -> 48.3k
/// samples/s, DLRM 54.3k -> 61.0k. Not for a thread that serves requests
/// and never works on the pool's jobs (`serve` keeps the default pool).
/// Fails only when the pool was set up before (it then works as it was).
pub fn compute_on_this_thread(threads: Option<usize>) -> Result<(), rayon::ThreadPoolBuildError> {
    let mut pool = rayon::ThreadPoolBuilder::new().use_current_thread();
    if let Some(n) = threads {
        pool = pool.num_threads(n);
    }
    pool.build_global()
}

/// The sum of the squares of `x` in f64, over eight interleaved partial
/// sums added pairwise at the end (a fixed order: the same result on every
/// run). One running sum waits on each addition before the next (four
/// cycles each): a gradient of a million values took 0.6-0.85 ms a step
/// that way, where eight lanes keep the adder busy.
pub fn sum_of_squares(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += (*v as f64) * (*v as f64);
        }
    }
    for (a, v) in acc.iter_mut().zip(tail) {
        *a += (*v as f64) * (*v as f64);
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
}

/// Hasher for maps keyed by row ids: one splitmix64 mix instead of SipHash
/// (ids are not attacker-chosen keys here, and lookups sit on the hot path).
#[derive(Debug, Clone, Copy, Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = mix64(self.0 ^ *b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = mix64(self.0 ^ v);
    }
}

/// A hash map keyed by row ids.
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// The message a caught panic carried (`panic!`'s text), or "" when it
/// carried something else.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// The stable string hash behind `hash_bucket_size`: 64-bit FNV-1a over the
/// UTF-8 bytes, then the splitmix64 finalizer. Integers are hashed through
/// their decimal text, so CSV and Parquet inputs give the same buckets.
/// The export feature spec names this function, so it must never change.
pub fn hash_str(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

pub fn hash_i64(v: i64) -> u64 {
    with_decimal(v, hash_str)
}

/// `f` of the decimal text of `v`, without allocating.
pub fn with_decimal(v: i64, f: impl Fn(&str) -> u64) -> u64 {
    let mut buf = [0u8; 24];
    let mut n = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    f(std::str::from_utf8(&buf[i..]).expect("ascii digits"))
}

/// A small, fast, seedable generator (splitmix64 stream). Not for cryptography.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng {
            state: mix64(seed ^ 0x9e37_79b9_7f4a_7c15),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Normal truncated at two standard deviations (TensorFlow's truncated_normal).
    pub fn truncated_normal(&mut self) -> f64 {
        loop {
            let x = self.normal();
            if x.abs() <= 2.0 {
                return x;
            }
        }
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_int_matches_text() {
        assert_eq!(hash_i64(-42), hash_str("-42"));
        assert_eq!(hash_i64(0), hash_str("0"));
        assert_eq!(hash_i64(i64::MIN), hash_str(&i64::MIN.to_string()));
        // Pinned: exported feature specs depend on these values.
        assert_eq!(hash_str(""), mix64(0xcbf2_9ce4_8422_2325));
        assert_ne!(hash_str("a"), hash_str("b"));
    }

    /// Every length (the eight lanes and the tail) sums every square once.
    #[test]
    fn sum_of_squares_counts_every_value_once() {
        let mut rng = Rng::new(3);
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 1000, 1003] {
            let x: Vec<f32> = (0..n).map(|_| rng.uniform() as f32 * 4.0 - 2.0).collect();
            let want: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
            let got = sum_of_squares(&x);
            assert!(
                (got - want).abs() <= 1e-12 * want.max(1.0),
                "{n} values: {got} against {want}"
            );
        }
        assert_eq!(sum_of_squares(&[3.0, 4.0]), 25.0);
        // In f64: the squares of the largest f32 do not overflow.
        assert!(sum_of_squares(&[f32::MAX; 9]).is_finite());
    }

    #[test]
    fn rng_is_deterministic_and_uniformish() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let m: f64 = (0..10000).map(|_| a.uniform()).sum::<f64>() / 10000.0;
        assert!((m - 0.5).abs() < 0.02);
    }
}
