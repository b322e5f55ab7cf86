//! Where the rows of an embedding table live across ranks: the one place
//! that knows the row-to-rank rule.

/// How a collection's tables are placed on the ranks of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// Every rank holds whole tables (data parallel, or one process).
    Replicated,
    /// Row `g` lives on rank `g % owners`, at local index `g / owners`;
    /// this is rank `rank` of `size`. Every rank owns rows under
    /// EmbeddingParallelStrategy (`owners == size`); under asynchronous
    /// training only the server ranks `0..owners` do and the workers hold
    /// none.
    RowWise { rank: usize, size: usize, owners: usize },
}

impl Sharding {
    /// Row-wise over every rank of a job of `size`.
    pub fn row_wise(rank: usize, size: usize) -> Self {
        Sharding::RowWise {
            rank,
            size,
            owners: size,
        }
    }

    /// Whether tables are split over ranks.
    pub fn is_sharded(self) -> bool {
        matches!(self, Sharding::RowWise { size, .. } if size > 1)
    }

    /// (index, count) of this rank's part when rows are split and it holds
    /// some: the part a checkpoint file of this rank holds.
    pub fn shard(self) -> Option<(usize, usize)> {
        match self {
            Sharding::RowWise { rank, owners, .. } if self.is_sharded() && rank < owners => Some((rank, owners)),
            _ => None,
        }
    }

    /// The rank that owns global row `g`.
    pub fn owner(self, g: u64) -> usize {
        match self {
            Sharding::Replicated => 0,
            Sharding::RowWise { owners, .. } => g as usize % owners,
        }
    }

    /// Index among this rank's rows of global row `g` (which it must own).
    pub fn local(self, g: u64) -> usize {
        match self {
            Sharding::Replicated => g as usize,
            Sharding::RowWise { rank, owners, .. } => {
                debug_assert_eq!(g as usize % owners, rank, "row {g} is not local");
                g as usize / owners
            }
        }
    }

    /// Global row of this rank's local row `l`.
    pub fn global(self, l: usize) -> u64 {
        match self {
            Sharding::Replicated => l as u64,
            Sharding::RowWise { rank, owners, .. } => (l * owners + rank) as u64,
        }
    }

    /// How many of a `rows`-row table's rows this rank holds.
    pub fn local_rows(self, rows: usize) -> usize {
        match self {
            Sharding::Replicated => rows,
            Sharding::RowWise { rank, owners, .. } if rank < owners => (rows + owners - 1 - rank) / owners,
            Sharding::RowWise { .. } => 0,
        }
    }

    /// This rank's rows (of `dim` values each) out of a whole table.
    pub fn own_rows(self, whole: &[f32], dim: usize) -> Vec<f32> {
        match self {
            Sharding::Replicated => whole.to_vec(),
            Sharding::RowWise { rank, owners, .. } if rank < owners => whole
                .chunks(dim.max(1))
                .skip(rank)
                .step_by(owners)
                .flatten()
                .copied()
                .collect(),
            Sharding::RowWise { .. } => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_wise_shards_partition_a_table_and_round_trip() {
        let size = 3;
        let rows = 10;
        let whole: Vec<f32> = (0..rows * 2).map(|v| v as f32).collect();
        let mut seen = vec![0; rows];
        for rank in 0..size {
            let s = Sharding::row_wise(rank, size);
            let own = s.own_rows(&whole, 2);
            assert_eq!(own.len(), s.local_rows(rows) * 2);
            for l in 0..s.local_rows(rows) {
                let g = s.global(l);
                assert_eq!((s.owner(g), s.local(g)), (rank, l));
                assert_eq!(own[l * 2..l * 2 + 2], whole[g as usize * 2..g as usize * 2 + 2]);
                seen[g as usize] += 1;
            }
        }
        assert!(seen.iter().all(|c| *c == 1), "every row on exactly one rank: {seen:?}");
        // Two servers among four ranks: the workers hold nothing, the
        // servers split the table between them.
        let servers: Vec<Vec<f32>> = (0..4)
            .map(|rank| {
                let s = Sharding::RowWise {
                    rank,
                    size: 4,
                    owners: 2,
                };
                let own = s.own_rows(&whole, 2);
                assert_eq!(own.len(), s.local_rows(rows) * 2);
                assert_eq!(s.shard(), (rank < 2).then_some((rank, 2)));
                own
            })
            .collect();
        assert_eq!(servers[0], Sharding::row_wise(0, 2).own_rows(&whole, 2));
        assert_eq!(servers[1], Sharding::row_wise(1, 2).own_rows(&whole, 2));
        assert!(servers[2].is_empty() && servers[3].is_empty());
        assert_eq!(Sharding::Replicated.own_rows(&whole, 2), whole);
    }
}
