//! Which samples each worker trains on at each step.
//!
//! Every epoch is one permutation of the training set, drawn from (seed, epoch) so it is the
//! same on every worker and every run. A global batch of B samples is the next B entries of the
//! permutation; worker w of N takes entries `w*B/N .. (w+1)*B/N` of it. The tail of the epoch
//! that does not fill a whole global batch is dropped (PyTorch's `drop_last=True`): every
//! step has the same shape on every worker, and the dropped samples differ from epoch to epoch.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Splits each epoch's permutation into global batches and each global batch into shards.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    global_batch: usize,
    workers: usize,
    seed: u64,
    // Multi-process runs: every process samples the same permutation, but its local workers
    // 0..workers are global workers first..first+workers of `world`.
    world: usize,
    first: usize,
}

impl DistributedSampler {
    /// A sampler over `len` samples; `global_batch` must divide evenly by `workers` (checked
    /// when the configuration is validated).
    pub fn new(len: usize, global_batch: usize, workers: usize, seed: u64) -> Self {
        assert!(
            crate::plan::per_worker_batch(global_batch, workers, 1).is_ok(),
            "global batch must divide by workers"
        );
        Self::for_ranks(len, global_batch, seed, workers, 0, workers)
    }

    /// A sampler for the `local` workers of one process that are global workers
    /// `first..first + local` of `world` (multi-process runs): shards are `global_batch / world`
    /// samples, and [`DistributedSampler::shard`] takes local worker indices.
    pub fn for_ranks(
        len: usize,
        global_batch: usize,
        seed: u64,
        world: usize,
        first: usize,
        local: usize,
    ) -> Self {
        assert!(
            crate::plan::per_worker_batch(global_batch, world, 1).is_ok() && first + local <= world,
            "global batch must divide by workers"
        );
        Self {
            len,
            global_batch,
            workers: local,
            seed,
            world,
            first,
        }
    }

    /// Full global batches per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        self.len / self.global_batch
    }

    /// Workers of this process (all of them in a single-process run).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Samples per worker per step.
    pub fn shard_size(&self) -> usize {
        self.global_batch / self.world
    }

    /// The global steps of `epochs` (epoch x steps per epoch + step in it).
    pub fn global_steps(&self, epochs: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let spe = self.steps_per_epoch();
        epochs.start * spe..epochs.end * spe
    }

    /// The permutation for `epoch`, written into `order` (reused across epochs).
    pub fn epoch_order(&self, epoch: usize, order: &mut Vec<u32>) {
        order.clear();
        order.extend(0..self.len as u32);
        let mut rng = ChaCha8Rng::seed_from_u64(
            self.seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        order.shuffle(&mut rng);
    }

    /// Worker `worker`'s (local index) sample indices at `step` of the epoch whose permutation
    /// is `order`.
    pub fn shard<'a>(&self, order: &'a [u32], step: usize, worker: usize) -> &'a [u32] {
        let start = step * self.global_batch + (self.first + worker) * self.shard_size();
        &order[start..start + self.shard_size()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_each_global_batch_and_epochs_differ() {
        let s = DistributedSampler::new(103, 12, 3, 5);
        assert_eq!(s.steps_per_epoch(), 8);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        s.epoch_order(0, &mut a);
        s.epoch_order(1, &mut b);
        assert_ne!(a, b);
        let mut seen: Vec<u32> = (0..8)
            .flat_map(|st| {
                (0..3)
                    .flat_map(|w| s.shard(&a, st, w).to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(seen.len(), 96);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 96, "a sample was given to two workers");
        let single = DistributedSampler::new(103, 12, 1, 5);
        // One worker with the whole batch sees the concatenation of the shards.
        let whole = single.shard(&a, 2, 0).to_vec();
        let parts: Vec<u32> = (0..3).flat_map(|w| s.shard(&a, 2, w).to_vec()).collect();
        assert_eq!(whole, parts);
    }
}
