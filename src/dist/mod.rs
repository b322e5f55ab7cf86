//! Collective communication between training processes. The same binary
//! runs alone (world size 1) or under `mpirun`, where every rank holds an
//! MPI communicator; nothing else in the trainer knows which.

mod mpi_comm;

pub use mpi_comm::MpiComm;

/// The collectives training needs. Every rank must call each collective in
/// the same order; buffers are laid out the same on every rank.
pub trait Communicator {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Element-wise sum across ranks, in place.
    fn all_reduce_sum(&self, buf: &mut [f64]);
    /// Element-wise sum across ranks, in place.
    fn all_reduce_sum_f32(&self, buf: &mut [f32]);
    /// Every rank's `send`, indexed by rank.
    fn all_gather_u64(&self, send: &[u64]) -> Vec<Vec<u64>>;
    fn all_gather_f32(&self, send: &[f32]) -> Vec<Vec<f32>>;
    /// `send[r]` goes to rank r; returns what each rank sent here.
    fn all_to_all_u64(&self, send: &[Vec<u64>]) -> Vec<Vec<u64>>;
    fn all_to_all_f32(&self, send: &[Vec<f32>]) -> Vec<Vec<f32>>;
    fn barrier(&self);
    /// Sends `msg` to rank `to` alone (point to point, for the
    /// parameter-server roles of asynchronous training).
    fn send_bytes(&self, to: usize, msg: &[u8]);
    /// The next message sent here from rank `from`, or from any rank with
    /// `None`: (its sender, its bytes). Waits until one comes.
    fn receive_bytes(&self, from: Option<usize>) -> (usize, Vec<u8>);
    /// Ends every rank of the job with `code`.
    fn abort(&self, code: i32) -> !;
    /// Bytes this rank has handed to collectives so far (0 alone).
    fn bytes_sent(&self) -> u64 {
        0
    }
}

/// One process: every collective is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _: &mut [f64]) {}
    fn all_reduce_sum_f32(&self, _: &mut [f32]) {}
    fn all_gather_u64(&self, send: &[u64]) -> Vec<Vec<u64>> {
        vec![send.to_vec()]
    }
    fn all_gather_f32(&self, send: &[f32]) -> Vec<Vec<f32>> {
        vec![send.to_vec()]
    }
    fn all_to_all_u64(&self, send: &[Vec<u64>]) -> Vec<Vec<u64>> {
        send.to_vec()
    }
    fn all_to_all_f32(&self, send: &[Vec<f32>]) -> Vec<Vec<f32>> {
        send.to_vec()
    }
    fn barrier(&self) {}
    fn send_bytes(&self, to: usize, _: &[u8]) {
        panic!("a single process has no rank {to} to send to")
    }
    fn receive_bytes(&self, _: Option<usize>) -> (usize, Vec<u8>) {
        panic!("a single process has no other rank to receive from")
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// Whether this process was started by an MPI launcher.
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// (rank, size) as the MPI launcher tells its processes, before MPI is
/// initialised (for the logger); (0, 1) without a launcher.
pub fn launch_layout() -> (usize, usize) {
    let var = |names: &[&str]| names.iter().find_map(|n| std::env::var(n).ok()?.parse::<usize>().ok());
    let rank = var(&["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]).unwrap_or(0);
    let size = var(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]).unwrap_or(1);
    (rank, size)
}

/// The communicator for this process: MPI under `mpirun`, else `Single`.
pub fn init() -> anyhow::Result<std::rc::Rc<dyn Communicator>> {
    if launched_by_mpi() {
        Ok(std::rc::Rc::new(MpiComm::init()?))
    } else {
        Ok(std::rc::Rc::new(Single))
    }
}

/// Ranks that disagree with rank 0 on something every rank must share.
#[derive(Debug, thiserror::Error)]
#[error(
    "ranks disagree on {what}: rank(s) {ranks:?} differ from rank 0; start every rank with the same \
     config, flags and binary"
)]
pub struct Disagreement {
    pub what: String,
    pub ranks: Vec<usize>,
}

impl crate::error::Classified for Disagreement {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

/// The start-up handshake: every rank hands in a digest of `what` and all
/// of them learn whether the digests match. It must come before any
/// collective whose buffer sizes follow from `what`: ranks with different
/// configs would otherwise exchange buffers of different lengths.
pub fn agree(comm: &dyn Communicator, what: &str, digest: u64) -> Result<(), Disagreement> {
    let all = comm.all_gather_u64(&[digest]);
    let first = all.first().and_then(|d| d.first()).copied();
    let ranks: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| d.first().copied() != first || d.len() != 1)
        .map(|(r, _)| r)
        .collect();
    if ranks.is_empty() {
        Ok(())
    } else {
        Err(Disagreement {
            what: what.to_string(),
            ranks,
        })
    }
}
