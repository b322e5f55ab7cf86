//! The MPI communicator (OpenMPI through the `mpi` crate).

use std::cell::Cell;

use anyhow::Context;
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::point_to_point::{MatchedReceiveVec as _, Message, Status};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Destination as _, Equivalence, Source as _};
use mpi::Count;

use super::Communicator;

pub struct MpiComm {
    // Finalizes MPI when dropped; `world` must not outlive it.
    _universe: Universe,
    world: SimpleCommunicator,
    sent: Cell<u64>,
}

impl MpiComm {
    pub fn init() -> anyhow::Result<Self> {
        let universe = mpi::initialize().context("MPI could not be initialised (or was initialised twice)")?;
        let world = universe.world();
        Ok(MpiComm {
            _universe: universe,
            world,
            sent: Cell::new(0),
        })
    }

    fn count<T>(&self, items: usize) {
        self.sent
            .set(self.sent.get() + (items * std::mem::size_of::<T>()) as u64);
    }

    fn gather_v<T: Equivalence + Default + Clone>(&self, send: &[T]) -> Vec<Vec<T>> {
        let n = self.size();
        // What a ring all-gather sends: this rank's part to every other rank.
        self.count::<T>(send.len() * (n - 1));
        let mut counts = vec![0 as Count; n];
        self.world.all_gather_into(&(send.len() as Count), &mut counts[..]);
        let displs = displacements(&counts);
        let total: usize = counts.iter().map(|c| *c as usize).sum();
        let mut recv = vec![T::default(); total];
        {
            let mut part = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(send, &mut part);
        }
        split(recv, &counts)
    }

    fn to_all_v<T: Equivalence + Default + Clone>(&self, send: &[Vec<T>]) -> Vec<Vec<T>> {
        let n = self.size();
        assert_eq!(send.len(), n, "all_to_all needs one buffer per rank");
        let scounts: Vec<Count> = send.iter().map(|v| v.len() as Count).collect();
        let mut rcounts = vec![0 as Count; n];
        self.world.all_to_all_into(&scounts[..], &mut rcounts[..]);
        let flat: Vec<T> = send.iter().flat_map(|v| v.iter().cloned()).collect();
        self.count::<T>(flat.len() - send[self.rank()].len());
        let sdispls = displacements(&scounts);
        let rdispls = displacements(&rcounts);
        let total: usize = rcounts.iter().map(|c| *c as usize).sum();
        let mut recv = vec![T::default(); total];
        {
            let spart = Partition::new(&flat[..], &scounts[..], &sdispls[..]);
            let mut rpart = PartitionMut::new(&mut recv[..], &rcounts[..], &rdispls[..]);
            self.world.all_to_all_varcount_into(&spart, &mut rpart);
        }
        split(recv, &rcounts)
    }
}

impl Drop for MpiComm {
    /// A rank that panics takes the job down with it (exit 2, a bug)
    /// instead of finalising MPI while the others wait in a collective.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.world.abort(2);
        }
    }
}

fn displacements(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

fn split<T>(flat: Vec<T>, counts: &[Count]) -> Vec<Vec<T>> {
    let mut it = flat.into_iter();
    counts.iter().map(|c| it.by_ref().take(*c as usize).collect()).collect()
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn all_reduce_sum(&self, buf: &mut [f64]) {
        // A ring all-reduce sends about twice the buffer.
        self.count::<f64>(2 * buf.len());
        let send = buf.to_vec();
        self.world.all_reduce_into(&send[..], buf, SystemOperation::sum());
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) {
        self.count::<f32>(2 * buf.len());
        let send = buf.to_vec();
        self.world.all_reduce_into(&send[..], buf, SystemOperation::sum());
    }
    fn all_gather_u64(&self, send: &[u64]) -> Vec<Vec<u64>> {
        self.gather_v(send)
    }
    fn all_gather_f32(&self, send: &[f32]) -> Vec<Vec<f32>> {
        self.gather_v(send)
    }
    fn all_to_all_u64(&self, send: &[Vec<u64>]) -> Vec<Vec<u64>> {
        self.to_all_v(send)
    }
    fn all_to_all_f32(&self, send: &[Vec<f32>]) -> Vec<Vec<f32>> {
        self.to_all_v(send)
    }
    fn barrier(&self) {
        self.world.barrier();
    }
    fn send_bytes(&self, to: usize, msg: &[u8]) {
        self.count::<u8>(msg.len());
        self.world.process_at_rank(to as mpi::Rank).send(msg);
    }
    /// Polls instead of blocking: OpenMPI's blocking receive spins on a
    /// core, and a server or a worker waiting for its reply would take the
    /// cycles of the ranks doing the work on an oversubscribed machine.
    /// After a short spin it sleeps between probes.
    fn receive_bytes(&self, from: Option<usize>) -> (usize, Vec<u8>) {
        let mut tries = 0u32;
        let probed: (Message, Status) = loop {
            let probed = match from {
                Some(r) => self.world.process_at_rank(r as mpi::Rank).immediate_matched_probe(),
                None => self.world.any_process().immediate_matched_probe(),
            };
            if let Some(m) = probed {
                break m;
            }
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
            } else if tries < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        };
        let (bytes, status) = probed.matched_receive_vec::<u8>();
        (status.source_rank() as usize, bytes)
    }
    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
    fn bytes_sent(&self) -> u64 {
        self.sent.get()
    }
}
