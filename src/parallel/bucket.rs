//! The bucket plan: which parameters' gradients travel together, and where they live.
//!
//! Backward produces gradients block by block, last block first. Parameters are therefore laid
//! out in reverse block order and cut into buckets of whole blocks: a bucket closes once it
//! holds at least its byte cap, so the first bucket (the last blocks, ready first) can be
//! smaller than the rest and its communication starts early. A bucket is complete as soon as
//! backward has finished its lowest-numbered block.

use crate::nn::Net;
use std::ops::Range;

/// Where one parameter's gradient lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSlot {
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
    /// Parameters (indices into `Net::params()`) in the bucket, in buffer order.
    pub params: Vec<usize>,
    /// Number of f32 elements.
    pub len: usize,
}

impl Bucket {
    /// The block whose completion makes this bucket ready (the lowest-numbered one).
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
    /// Slot of each parameter, indexed like `Net::params()`.
    pub slots: Vec<ParamSlot>,
    /// For each block, the bucket that becomes ready when the block finishes backward.
    pub ready_at_block: Vec<Option<usize>>,
    /// For each block, its parameters (indices into `Net::params()`).
    pub block_params: Vec<Vec<usize>>,
}

impl BucketPlan {
    /// Plans buckets for `net`: the first closes at `first_cap_bytes`, the others at
    /// `cap_bytes` (0 means one block per bucket).
    pub fn new(net: &Net, first_cap_bytes: usize, cap_bytes: usize) -> Self {
        let block_sizes: Vec<Vec<usize>> = net
            .blocks
            .iter()
            .map(|b| b.params().iter().map(|p| p.numel()).collect())
            .collect();
        Self::from_sizes(&block_sizes, first_cap_bytes, cap_bytes)
    }

    /// Plans buckets from parameter element counts per block (forward order).
    pub fn from_sizes(
        block_sizes: &[Vec<usize>],
        first_cap_bytes: usize,
        cap_bytes: usize,
    ) -> Self {
        let mut first_param = Vec::with_capacity(block_sizes.len());
        let mut n = 0;
        for sizes in block_sizes {
            first_param.push(n);
            n += sizes.len();
        }
        let mut slots = vec![
            ParamSlot {
                bucket: 0,
                range: 0..0
            };
            n
        ];
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut current = Bucket {
            blocks: Vec::new(),
            params: Vec::new(),
            len: 0,
        };
        for k in (0..block_sizes.len()).rev() {
            for (j, &size) in block_sizes[k].iter().enumerate() {
                let p = first_param[k] + j;
                slots[p] = ParamSlot {
                    bucket: buckets.len(),
                    range: current.len..current.len + size,
                };
                current.params.push(p);
                current.len += size;
            }
            if block_sizes[k].is_empty() && current.blocks.is_empty() && !buckets.is_empty() {
                // A block without parameters joins the bucket before it; nothing to wait for.
                buckets.last_mut().expect("checked").blocks.push(k);
                continue;
            }
            current.blocks.push(k);
            let cap = if buckets.is_empty() {
                first_cap_bytes
            } else {
                cap_bytes
            };
            if (current.len > 0 && current.len * 4 >= cap) || k == 0 {
                buckets.push(std::mem::replace(
                    &mut current,
                    Bucket {
                        blocks: Vec::new(),
                        params: Vec::new(),
                        len: 0,
                    },
                ));
            }
        }
        let mut ready_at_block = vec![None; block_sizes.len()];
        for (i, b) in buckets.iter().enumerate() {
            ready_at_block[b.ready_after_block()] = Some(i);
        }
        let block_params = block_sizes
            .iter()
            .zip(&first_param)
            .map(|(sizes, &f)| (f..f + sizes.len()).collect())
            .collect();
        Self {
            buckets,
            slots,
            ready_at_block,
            block_params,
        }
    }

    /// Total gradient elements.
    pub fn total_len(&self) -> usize {
        self.buckets.iter().map(|b| b.len).sum()
    }

    /// A short description, e.g. `3 buckets: 0.1, 0.4, 0.2 MB`.
    pub fn describe(&self) -> String {
        let sizes: Vec<String> = self
            .buckets
            .iter()
            .map(|b| format!("{:.3}", b.len as f64 * 4.0 / 1e6))
            .collect();
        format!("{} buckets: {} MB", self.buckets.len(), sizes.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_reverse_block_order_and_caps() {
        // Blocks (forward order) with parameter sizes in elements (4 bytes each).
        let sizes = vec![vec![100, 10], vec![], vec![1000, 10], vec![50]];
        let plan = BucketPlan::from_sizes(&sizes, 100, 4000);
        // First bucket: block 3 (200 B >= 100 B cap). Then blocks 2,1 (4040 B >= 4000), then block 0.
        assert_eq!(plan.buckets.len(), 3);
        assert_eq!(plan.buckets[0].blocks, vec![3]);
        assert_eq!(plan.buckets[1].blocks, vec![2, 1]);
        assert_eq!(plan.buckets[2].blocks, vec![0]);
        assert_eq!(plan.buckets[1].params, vec![2, 3]);
        assert_eq!(
            plan.slots[3],
            ParamSlot {
                bucket: 1,
                range: 1000..1010
            }
        );
        assert_eq!(plan.ready_at_block, vec![Some(2), Some(1), None, Some(0)]);
        assert_eq!(plan.total_len(), 1170);
        // Cap 0: one bucket per block that has parameters.
        let fine = BucketPlan::from_sizes(&sizes, 0, 0);
        assert_eq!(
            fine.buckets
                .iter()
                .map(|b| b.blocks.clone())
                .collect::<Vec<_>>(),
            vec![vec![3], vec![2, 1], vec![0]]
        );
        // Huge cap: everything in one bucket, ready after block 0.
        let one = BucketPlan::from_sizes(&sizes, usize::MAX, usize::MAX);
        assert_eq!(one.buckets.len(), 1);
        assert_eq!(one.ready_at_block[0], Some(0));
    }
}
