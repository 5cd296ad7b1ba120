//! The bucket plan: which layers' gradients travel together, and where they live.
//!
//! Backward finishes layers in reverse topological order (the order of [`crate::nn::Net`]'s
//! backward), each layer writing its whole parameter block's gradient at once. Blocks are
//! therefore laid out in that order and cut into buckets of whole blocks: a bucket closes
//! once it holds at least its byte cap, so the first bucket (the last layers, ready first)
//! can be smaller than the rest and its communication starts early. A bucket is complete as
//! soon as backward has finished its last block; readiness comes from the graph's order, not
//! from hand-made groups.
//!
//! The caps come from the planning rules ([`crate::plan`]), which the trainer, the simulator
//! and the benchmarks all call.

use std::ops::Range;

/// Where one block's gradient lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Bucket holding it.
    pub bucket: usize,
    /// Element range inside the bucket's buffer.
    pub range: Range<usize>,
}

/// A group of blocks whose gradients are reduced as one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Blocks in the bucket, in the order backward finishes them (descending).
    pub blocks: Vec<usize>,
    /// Number of f32 elements.
    pub len: usize,
}

impl Bucket {
    /// The block whose backward completes the bucket (the last one backward writes).
    pub fn ready_after_block(&self) -> usize {
        *self
            .blocks
            .last()
            .expect("a bucket holds at least one block")
    }
}

/// The buckets of one model for given caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    /// Buckets in the order they become ready.
    pub buckets: Vec<Bucket>,
    /// Slot of each block, indexed like the net's parameter blocks (forward order).
    pub slots: Vec<Slot>,
    /// For each block, the bucket that becomes ready when backward has written it.
    pub ready_at_block: Vec<Option<usize>>,
}

impl BucketPlan {
    /// Plans buckets for blocks of `lens` elements (forward order): the first closes at
    /// `first_cap_bytes`, the others at `cap_bytes` (0: one block per bucket).
    pub fn new(lens: &[usize], first_cap_bytes: usize, cap_bytes: usize) -> Self {
        let mut slots = vec![
            Slot {
                bucket: 0,
                range: 0..0
            };
            lens.len()
        ];
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut current = Bucket {
            blocks: Vec::new(),
            len: 0,
        };
        for b in (0..lens.len()).rev() {
            slots[b] = Slot {
                bucket: buckets.len(),
                range: current.len..current.len + lens[b],
            };
            current.blocks.push(b);
            current.len += lens[b];
            let cap = if buckets.is_empty() {
                first_cap_bytes
            } else {
                cap_bytes
            };
            // A block without gradients (a profile's) never closes a bucket on its own.
            if (current.len > 0 && current.len * 4 >= cap) || b == 0 {
                let done = std::mem::replace(
                    &mut current,
                    Bucket {
                        blocks: Vec::new(),
                        len: 0,
                    },
                );
                let last_index = buckets.len().saturating_sub(1);
                match buckets.last_mut() {
                    Some(last) if done.len == 0 => {
                        // Trailing empty blocks join the previous bucket.
                        for blk in done.blocks {
                            slots[blk].bucket = last_index;
                            slots[blk].range = last.len..last.len;
                            last.blocks.push(blk);
                        }
                    }
                    _ => buckets.push(done),
                }
            }
        }
        let mut ready_at_block = vec![None; lens.len()];
        for (i, bk) in buckets.iter().enumerate() {
            let last = bk.ready_after_block();
            ready_at_block[last] = Some(i);
        }
        Self {
            buckets,
            slots,
            ready_at_block,
        }
    }

    /// Total gradient elements.
    pub fn total_len(&self) -> usize {
        self.buckets.iter().map(|b| b.len).sum()
    }

    /// A short description, e.g. `3 buckets: 0.100, 0.400, 0.200 MB`.
    pub fn describe(&self) -> String {
        let sizes: Vec<String> = self
            .buckets
            .iter()
            .map(|b| format!("{:.3}", b.len as f64 * 4.0 / 1e6))
            .collect();
        format!(
            "{}: {} MB",
            crate::terminal::counted(self.buckets.len(), "bucket"),
            sizes.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_reverse_block_order_and_caps() {
        // Blocks (forward order) with sizes in elements (4 bytes each).
        let lens = [110, 1010, 20, 50];
        let plan = BucketPlan::new(&lens, 100, 4000);
        // First bucket: block 3 (200 B >= 100 B). Then 2, 1 (4120 B >= 4000), then block 0.
        let blocks: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.blocks.clone()).collect();
        assert_eq!(blocks, vec![vec![3], vec![2, 1], vec![0]]);
        assert_eq!(
            plan.slots[1],
            Slot {
                bucket: 1,
                range: 20..1030
            }
        );
        assert_eq!(plan.ready_at_block, vec![Some(2), Some(1), None, Some(0)]);
        assert_eq!(plan.total_len(), 1190);
        // Cap 0: one block per bucket.
        assert_eq!(BucketPlan::new(&lens, 0, 0).buckets.len(), 4);
        // Huge cap: one bucket, ready after block 0.
        let one = BucketPlan::new(&lens, usize::MAX, usize::MAX);
        assert_eq!(one.buckets.len(), 1);
        assert_eq!(one.ready_at_block[0], Some(0));
    }
}
