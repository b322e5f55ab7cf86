//! Where the rows of an embedding table live across ranks: the one place
//! that knows the row-to-rank rule.

/// How a collection's tables are placed on the ranks of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// Every rank holds whole tables (data parallel, or one process).
    Replicated,
    /// Row `g` lives on rank `g % size`, at local index `g / size`
    /// (EmbeddingParallelStrategy).
    RowWise { rank: usize, size: usize },
}

impl Sharding {
    /// Whether tables are split over ranks.
    pub fn is_sharded(self) -> bool {
        matches!(self, Sharding::RowWise { size, .. } if size > 1)
    }

    /// The rank that owns global row `g`.
    pub fn owner(self, g: u64) -> usize {
        match self {
            Sharding::Replicated => 0,
            Sharding::RowWise { size, .. } => g as usize % size,
        }
    }

    /// Index among this rank's rows of global row `g` (which it must own).
    pub fn local(self, g: u64) -> usize {
        match self {
            Sharding::Replicated => g as usize,
            Sharding::RowWise { rank, size } => {
                debug_assert_eq!(g as usize % size, rank, "row {g} is not local");
                g as usize / size
            }
        }
    }

    /// Global row of this rank's local row `l`.
    pub fn global(self, l: usize) -> u64 {
        match self {
            Sharding::Replicated => l as u64,
            Sharding::RowWise { rank, size } => (l * size + rank) as u64,
        }
    }

    /// How many of a `rows`-row table's rows this rank holds.
    pub fn local_rows(self, rows: usize) -> usize {
        match self {
            Sharding::Replicated => rows,
            Sharding::RowWise { rank, size } => (rows + size - 1 - rank) / size,
        }
    }

    /// This rank's rows (of `dim` values each) out of a whole table.
    pub fn own_rows(self, whole: &[f32], dim: usize) -> Vec<f32> {
        match self {
            Sharding::Replicated => whole.to_vec(),
            Sharding::RowWise { rank, size } => whole
                .chunks(dim.max(1))
                .skip(rank)
                .step_by(size)
                .flatten()
                .copied()
                .collect(),
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
            let s = Sharding::RowWise { rank, size };
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
        assert_eq!(Sharding::Replicated.own_rows(&whole, 2), whole);
    }
}
