//! Profiles: per-block forward and backward times, gradient sizes and the update time of one
//! worker's step: the one file format (`dptrain profile` writes it; the simulator and the
//! emulated device, [`crate::testbed::device`], read it) and what it may say ([`validate`]).
//! Its measurement on this machine is [`crate::measure::timing`]'s; profiles derived from a model's graph and a stated device speed are the simulator's
//! (`crate::sim::from_graph`).
//!
//! A block is the unit whose gradients become ready together. Measured profiles have the
//! training engine's blocks; profiles from a [`Graph`] have one block per node with parameters,
//! in topological order, so backward (which runs the blocks last first) produces them in reverse
//! topological order.

use crate::comm::powersgd::Matrix;
use crate::model::Graph;
use crate::output::OutputError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Largest per-worker batch a profile is made for: far past any real per-worker batch, and
/// small enough that step times and byte counts stay in range of the simulator's arithmetic.
pub const MAX_PROFILE_BATCH: usize = 1 << 20;

/// One block of a profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockProfile {
    /// Block name.
    pub name: String,
    /// Forward time of the block at the profile's batch, ms.
    pub forward_ms: f64,
    /// Backward time of the block (including copying its gradients out), ms.
    pub backward_ms: f64,
    /// Element count of each parameter (f32) of the block, in layer order.
    pub param_sizes: Vec<usize>,
    /// Forward multiply-accumulates of one sample.
    pub macs_per_sample: u64,
    /// The block's weight matrices as PowerSGD sees them ([`crate::plan::block_matrices`]'s
    /// rule: a convolution's `kh kw c/groups` rows of `o`, a linear layer's `out` rows of
    /// `in`), offsets within the block. Absent in files written before it existed: the
    /// simulator then cannot price `--compress powersgd:R`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrices: Option<Vec<Matrix>>,
    /// Of `backward_ms`, the time after the block's gradients are written: its layer's input
    /// gradient, which the net computes after handing the block over ([`crate::nn::Net`]'s
    /// backward), ms. Absent for a layer that does not split its backward, in profiles from
    /// a graph, and in files written before it existed: the block is then written at the end
    /// of its backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_grad_ms: Option<f64>,
}

impl BlockProfile {
    /// Gradient bytes the block contributes (f32).
    pub fn grad_bytes(&self) -> usize {
        4 * self.param_sizes.iter().sum::<usize>()
    }
}

/// A profile file: an object with a [`Profile`]'s keys.
pub const PROFILE_FILE: crate::output::Kind = crate::output::Kind {
    what: "a profile dptrain wrote",
    head: 64 << 20,
    is_one: |bytes| {
        crate::output::is_json_object_with(bytes, &["model", "batch", "blocks", "update_ms"])
    },
};

/// One worker's step, block by block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Model name.
    pub model: String,
    /// How the times were obtained (measured here, or the FLOPs assumptions).
    pub source: String,
    /// Per-worker batch the times are for (1..=[`MAX_PROFILE_BATCH`]).
    pub batch: usize,
    /// Input shape of one sample (C, H, W).
    pub input: [usize; 3],
    /// Blocks in forward order.
    pub blocks: Vec<BlockProfile>,
    /// Optimizer update of all parameters, ms.
    pub update_ms: f64,
    /// Coefficient of variation of one worker's step compute (forward + backward + update)
    /// across the measured steps and replicas (robust: from the median absolute deviation):
    /// the spread stragglers are drawn from. Absent in
    /// profiles from FLOPs or images/s, and in files written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_spread: Option<f64>,
}

impl Profile {
    /// Sum of the forward times, ms.
    pub fn forward_ms(&self) -> f64 {
        self.blocks.iter().map(|b| b.forward_ms).sum()
    }

    /// Sum of the backward times, ms.
    pub fn backward_ms(&self) -> f64 {
        self.blocks.iter().map(|b| b.backward_ms).sum()
    }

    /// Per block, ms from the start of backward until its gradients are written (backward
    /// runs the last block first; a block with an [`BlockProfile::input_grad_ms`] is written
    /// that long before its backward ends).
    pub fn backward_written_ms(&self) -> Vec<f64> {
        let mut written = vec![0.0; self.blocks.len()];
        let mut t = 0.0;
        for (k, b) in self.blocks.iter().enumerate().rev() {
            t += b.backward_ms;
            written[k] = t - b.input_grad_ms.unwrap_or(0.0);
        }
        written
    }

    /// All gradient bytes.
    pub fn grad_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.grad_bytes()).sum()
    }

    /// Parameter sizes per block, summed per block, the input of [`crate::parallel::BucketPlan::new`].
    pub fn block_sizes(&self) -> Vec<Vec<usize>> {
        self.blocks.iter().map(|b| b.param_sizes.clone()).collect()
    }

    /// The same per-block shape rescaled to these totals (ms). Used to check the communication
    /// and overlap model against a run on a shared machine, whose compute speed drifts between
    /// the profile and the run.
    pub fn rescaled(&self, forward_ms: f64, backward_ms: f64, update_ms: f64) -> Profile {
        let (f, b) = (self.forward_ms(), self.backward_ms());
        let mut p = self.clone();
        let backward_factor = if b > 0.0 { backward_ms / b } else { 0.0 };
        for blk in &mut p.blocks {
            blk.forward_ms *= if f > 0.0 { forward_ms / f } else { 0.0 };
            blk.backward_ms *= backward_factor;
            // A part of the block's backward scales with it.
            if let Some(part) = &mut blk.input_grad_ms {
                *part *= backward_factor;
            }
        }
        p.update_ms = update_ms;
        p.source = format!("{} (rescaled to the run's compute)", self.source);
        p
    }

    /// Writes the profile as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), OutputError> {
        let text = serde_json::to_string_pretty(self).expect("a profile serialises");
        crate::output::write_atomically(path, (text + "\n").as_bytes(), &PROFILE_FILE)
    }

    /// Reads a profile written by [`Profile::save`], refusing one that is not physical
    /// ([`validate`]).
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let path_buf = || path.to_path_buf();
        let text = crate::input::read_text(path, crate::input::FileKind::Profile)?;
        let p: Profile =
            serde_json::from_str(&text).map_err(|source| ProfileError::NotAProfile {
                path: path_buf(),
                source,
            })?;
        if p.blocks.is_empty() {
            return Err(ProfileError::NoBlocks { path: path_buf() });
        }
        validate(&p).map_err(|source| ProfileError::Unphysical {
            path: path_buf(),
            source,
        })?;
        Ok(p)
    }
}

/// Why a profile file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// It could not be read (or is not a regular file of a profile's size).
    #[error(transparent)]
    Read(#[from] crate::input::InputError),
    /// It is not a profile's JSON.
    #[error("{}: not a profile: {source}", .path.display())]
    NotAProfile {
        /// The file.
        path: PathBuf,
        /// What the JSON reader found.
        source: serde_json::Error,
    },
    /// It has no blocks.
    #[error("{}: profile has no blocks", .path.display())]
    NoBlocks {
        /// The file.
        path: PathBuf,
    },
    /// One of its numbers is not physical.
    #[error("{}: {source}; re-create the profile with `dptrain profile`", .path.display())]
    Unphysical {
        /// The file.
        path: PathBuf,
        /// Which number, and why.
        source: Unphysical,
    },
}

/// A number a profile may not state (see [`validate`]); the message names the field and its
/// value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unphysical {
    /// A per-worker batch outside 1..=[`MAX_PROFILE_BATCH`].
    #[error("batch is {0}: a profile is for a per-worker batch of 1 to {MAX_PROFILE_BATCH}")]
    Batch(usize),
    /// An input shape with a size of 0 or above 65536.
    #[error("input is {0:?}: each of (C, H, W) must be 1 to 65536")]
    Input([usize; 3]),
    /// No blocks, or more than 100000.
    #[error("has {0} blocks: a profile has 1 to 100000")]
    BlockCount(usize),
    /// A measured compute spread that is negative or not finite.
    #[error(
        "compute_spread is {}: a coefficient of variation, finite and >= 0",
        crate::terminal::number(*.0)
    )]
    Spread(f64),
    /// A time that is not finite, negative, or above a day.
    #[error(
        "{what} is {}: times must be finite, >= 0 and at most {MAX_MS} ms (a \
         day)",
        crate::terminal::number(*.value)
    )]
    Time {
        /// The field (`update_ms`, or a block's `forward_ms`/`backward_ms`, naming the block).
        what: String,
        /// Its value, ms.
        value: f64,
    },
    /// A block's input-gradient part of backward longer than its whole backward.
    #[error(
        "block '{name}' has input_grad_ms {part} above its backward_ms {whole}: it is a part \
         of the block's backward"
    )]
    InputGradPart {
        /// The block.
        name: String,
        /// Its `input_grad_ms`.
        part: f64,
        /// Its `backward_ms`.
        whole: f64,
    },
    /// Gradients above 1 TiB.
    #[error(
        "the blocks' param_sizes add up to {} of gradients, more than the 1 TiB a profile may \
         describe",
        crate::limits::human_bytes(*.0)
    )]
    GradBytes(f64),
    /// A weight matrix empty, overlapping the one before, or past its block's values.
    #[error(
        "block {block} ('{name}') matrix {index} ({rows} x {cols} at {offset}) is empty, \
         overlaps the one before or lies past the block's {len} values"
    )]
    Matrix {
        /// The block's index.
        block: usize,
        /// The block's name.
        name: String,
        /// The matrix's index in the block.
        index: usize,
        /// Its rows.
        rows: usize,
        /// Its columns.
        cols: usize,
        /// Its first value in the block.
        offset: usize,
        /// The block's values (its param_sizes added).
        len: usize,
    },
}

/// One block (with zero times) per node with parameters, in topological order. MACs of nodes
/// without parameters (none in the graphs' accounting, which counts convolutions, linear layers
/// and batch norm, all with parameters) join the block before them, or the first block, so no
/// work is lost.
pub fn graph_blocks(graph: &Graph) -> Vec<BlockProfile> {
    let mut blocks: Vec<BlockProfile> = Vec::new();
    let mut pending = 0u64;
    for n in &graph.nodes {
        match blocks.last_mut() {
            _ if n.params > 0 => blocks.push(BlockProfile {
                input_grad_ms: None,
                name: n.name.clone(),
                forward_ms: 0.0,
                backward_ms: 0.0,
                param_sizes: vec![n.params],
                macs_per_sample: n.macs + std::mem::take(&mut pending),
                matrices: Some(node_matrices(graph, n)),
            }),
            Some(b) => b.macs_per_sample += n.macs,
            None => pending += n.macs,
        }
    }
    blocks
}

/// The weight matrix of a node with parameters, as the training engine lays it out (its
/// weight first in the block): what [`crate::plan::block_matrices`] reads from a net, here
/// from the graph alone (tests/sim.rs checks the two agree on the model zoo).
fn node_matrices(graph: &Graph, n: &crate::model::Node) -> Vec<Matrix> {
    use crate::model::{NodeOp, Op, Units};
    let fixed = |u: &Units| match u {
        Units::Fixed(v) => *v,
        Units::Expr(_) => unreachable!("a graph's counts are resolved"),
    };
    let Some(input) = n.inputs.first().map(|&i| graph.nodes[i].shape) else {
        return Vec::new();
    };
    let (rows, cols) = match &n.op {
        NodeOp::Layer(Op::Conv2d(c)) => (
            c.kernel[0] * c.kernel[1] * input.c / fixed(&c.groups).max(1),
            fixed(&c.out),
        ),
        NodeOp::Layer(Op::Linear(l)) => (fixed(&l.out), input.c * input.h * input.w),
        _ => return Vec::new(),
    };
    vec![Matrix {
        offset: 0,
        rows,
        cols,
    }]
}

/// Longest block, update time a profile may state, ms (a day: far beyond any real step).
const MAX_MS: f64 = 86_400_000.0;

/// Most gradient bytes a profile may describe (1 TiB: 256 G parameters).
const MAX_GRAD_BYTES: f64 = (1u64 << 40) as f64;

/// Checks that every number in `p` is physical: times finite, >= 0 and at most a day, a batch
/// of 1..=[`MAX_PROFILE_BATCH`], an input shape of positive sizes, and gradients of at most 1
/// TiB. Why: a profile is a JSON file anyone can edit, and one with negative or absurd numbers
/// printed 300-digit step times. (How big a simulation may be is the schedule compiler's
/// budget, `crate::sim::MAX_EVENTS`, counted on the recorded schedules themselves.)
pub fn validate(p: &Profile) -> Result<(), Unphysical> {
    let time = |what: String, value: f64| {
        if value.is_finite() && (0.0..=MAX_MS).contains(&value) {
            Ok(())
        } else {
            Err(Unphysical::Time { what, value })
        }
    };
    if p.batch == 0 || p.batch > MAX_PROFILE_BATCH {
        return Err(Unphysical::Batch(p.batch));
    }
    if p.input.iter().any(|&d| d == 0 || d > 1 << 16) {
        return Err(Unphysical::Input(p.input));
    }
    if p.blocks.is_empty() || p.blocks.len() > 100_000 {
        return Err(Unphysical::BlockCount(p.blocks.len()));
    }
    let mut grad_bytes = 0.0;
    for (i, b) in p.blocks.iter().enumerate() {
        time(format!("block {i} ('{}') forward_ms", b.name), b.forward_ms)?;
        time(
            format!("block {i} ('{}') backward_ms", b.name),
            b.backward_ms,
        )?;
        if let Some(ms) = b.input_grad_ms {
            time(format!("block {i} ('{}') input_grad_ms", b.name), ms)?;
            if ms > b.backward_ms {
                return Err(Unphysical::InputGradPart {
                    name: b.name.clone(),
                    part: ms,
                    whole: b.backward_ms,
                });
            }
        }
        grad_bytes += 4.0 * b.param_sizes.iter().map(|&n| n as f64).sum::<f64>();
    }
    time("update_ms".into(), p.update_ms)?;
    if let Some(spread) = p.compute_spread.filter(|s| !(s.is_finite() && *s >= 0.0)) {
        return Err(Unphysical::Spread(spread));
    }
    if grad_bytes > MAX_GRAD_BYTES {
        return Err(Unphysical::GradBytes(grad_bytes));
    }
    // Within 1 TiB of gradients the sums below cannot overflow.
    for (i, b) in p.blocks.iter().enumerate() {
        let len: usize = b.param_sizes.iter().sum();
        let mut at = 0;
        for (k, m) in b.matrices.iter().flatten().enumerate() {
            let end = m
                .rows
                .checked_mul(m.cols)
                .and_then(|n| n.checked_add(m.offset));
            match end {
                Some(end) if m.rows > 0 && m.cols > 0 && m.offset >= at && end <= len => at = end,
                _ => {
                    return Err(Unphysical::Matrix {
                        block: i,
                        name: b.name.clone(),
                        index: k,
                        rows: m.rows,
                        cols: m.cols,
                        offset: m.offset,
                        len,
                    })
                }
            }
        }
    }
    Ok(())
}
