//! What a profile may ask of this machine: the largest per-worker batch a profile is made for,
//! and whether a measured step fits in memory.

use crate::model::reference_graph;

/// Largest per-worker batch a profile is made for: far past any real per-worker batch, and
/// small enough that step times and byte counts stay in range of the simulator's arithmetic.
pub const MAX_PROFILE_BATCH: usize = 1 << 20;

/// Bytes a measured training step needs per sample, as a multiple of the f32 bytes of every
/// layer's output: the network keeps each output for backward and at most as much again in
/// gradient buffers (shared by liveness, usually far less); 2.5 leaves a margin for the
/// kernels' scratch.
const STEP_BYTES_FACTOR: f64 = 2.5;

/// Refuses a measured profile whose step would not fit in this machine's memory.
pub fn check_step_memory(model: &str, batch: usize, replicas: usize) -> Result<(), String> {
    let g = reference_graph(model)?;
    let elems: usize = g.nodes.iter().map(|n| n.shape.numel()).sum();
    let bytes = 4.0 * elems as f64 * STEP_BYTES_FACTOR * batch as f64 * replicas as f64
        + 16.0 * g.num_params() as f64 * replicas as f64;
    let replicas = if replicas > 1 {
        format!(" on {replicas} replicas")
    } else {
        String::new()
    };
    crate::limits::check_memory(
        &format!("a {model} step at batch {batch}{replicas}"),
        bytes,
        "lower --batch",
    )
}
