//! Profiles the simulator derives from a model's graph and a stated device speed (its FLOPS, or
//! its published images/s for the model). The profile format is [`crate::measure::profile`]'s,
//! its measurement on this machine [`crate::measure::timing`]'s.

use crate::measure::profile::graph_blocks;
use crate::measure::Profile;
use crate::model::Graph;

/// The device a FLOPs-derived profile describes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpec {
    /// Peak throughput, TFLOPS.
    pub tflops: f64,
    /// Fraction of peak the model's kernels reach (0..1].
    pub efficiency: f64,
    /// Memory bandwidth in GB/s, for the (memory-bound) update.
    pub mem_gbs: f64,
}

/// How fast the simulated device computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeviceSpeed {
    /// From FLOPs: a stated peak and the fraction of it reached.
    Flops(DeviceSpec),
    /// From a measured or published training throughput of this model on one device: the step
    /// (forward, backward and update) at the profile's batch takes `batch / images_per_s`.
    ImagesPerSecond {
        /// Training images per second of one device.
        images_per_s: f64,
        /// Memory bandwidth in GB/s, for the update's share of the step.
        mem_gbs: f64,
    },
}

/// Bytes of memory traffic per parameter in an SGD-with-momentum update: read weight, gradient
/// and momentum, write weight and momentum (f32 each).
const UPDATE_BYTES_PER_PARAM: f64 = 20.0;

/// A profile from a model's graph: one block per node with parameters (see the module docs).
/// Forward of a block takes `2 x MACs x batch` FLOPs and backward twice that (gradients with
/// respect to inputs and to weights); nodes without MACs (activations, pooling) take no time in
/// this model. The update is memory-bound at `mem_gbs`. With [`DeviceSpeed::ImagesPerSecond`]
/// the same 1:2 split of forward and backward by MACs is scaled so that the whole step matches
/// the stated throughput.
pub fn from_graph(graph: &Graph, batch: usize, speed: DeviceSpeed) -> Result<Profile, String> {
    if batch == 0 {
        return Err("the batch must be at least 1".into());
    }
    // Each figure refused by its own name and value: a wrong one is named, not a neighbour.
    let positive = |flag: &str, v: f64| -> Result<(), String> {
        if v > 0.0 && v.is_finite() {
            return Ok(());
        }
        Err(format!(
            "{flag} {}: must be a finite number above 0",
            crate::terminal::number(v)
        ))
    };
    let mem_gbs = match speed {
        DeviceSpeed::Flops(d) => {
            positive("--device-tflops", d.tflops)?;
            if !(d.efficiency > 0.0 && d.efficiency <= 1.0) {
                return Err(format!(
                    "--efficiency {}: must be in (0, 1], the share of the peak reached",
                    crate::terminal::number(d.efficiency)
                ));
            }
            positive("--mem-gbs", d.mem_gbs)?;
            d.mem_gbs
        }
        DeviceSpeed::ImagesPerSecond {
            images_per_s,
            mem_gbs,
        } => {
            positive("--device-images-per-s", images_per_s)?;
            positive("--mem-gbs", mem_gbs)?;
            mem_gbs
        }
    };
    let nodes: Vec<_> = graph.nodes.iter().filter(|n| n.params > 0).collect();
    if nodes.is_empty() {
        return Err(format!("{} has no parameters to train", graph.name));
    }
    let update_ms = graph.num_params() as f64 * UPDATE_BYTES_PER_PARAM / (mem_gbs * 1e9) * 1e3;
    // Forward FLOPs of the whole model at this batch; every block's forward is its share.
    let total_macs: u64 = graph.macs();
    let forward_total_ms = match speed {
        DeviceSpeed::Flops(d) => {
            2.0 * total_macs as f64 * batch as f64 / (d.tflops * d.efficiency * 1e12) * 1e3
        }
        DeviceSpeed::ImagesPerSecond { images_per_s, .. } => {
            let step_ms = batch as f64 / images_per_s * 1e3;
            if step_ms <= update_ms {
                let n = crate::terminal::number::<f64>;
                // Times to 4 figures, in an exponent past the ordinary.
                let ms = |x: f64| match (1e-3..1e6).contains(&x) {
                    true => format!("{x:.3}"),
                    false => format!("{x:.3e}"),
                };
                return Err(format!(
                    "--device-images-per-s {}: at batch {batch} a step of {} ms, no longer \
                     than the update alone ({} ms at {} GB/s): check the figures",
                    n(images_per_s),
                    ms(step_ms),
                    ms(update_ms),
                    n(mem_gbs)
                ));
            }
            (step_ms - update_ms) / 3.0
        }
    };
    let mut blocks = graph_blocks(graph);
    for b in &mut blocks {
        let share = if total_macs > 0 {
            b.macs_per_sample as f64 / total_macs as f64
        } else {
            1.0 / nodes.len() as f64
        };
        b.forward_ms = forward_total_ms * share;
        b.backward_ms = 2.0 * b.forward_ms;
    }
    let shown = crate::terminal::number::<f64>;
    let source = match speed {
        DeviceSpeed::Flops(d) => format!(
            "flops: {} TFLOPS x {} efficiency, {} GB/s memory",
            shown(d.tflops),
            shown(d.efficiency),
            shown(d.mem_gbs)
        ),
        DeviceSpeed::ImagesPerSecond {
            images_per_s,
            mem_gbs,
        } => format!(
            "device throughput: {} images/s at batch {batch} (forward:backward 1:2 by MACs), \
             {} GB/s memory",
            shown(images_per_s),
            shown(mem_gbs)
        ),
    };
    let i = graph.input();
    Ok(Profile {
        model: graph.name.clone(),
        source,
        batch,
        input: [i.c, i.h, i.w],
        blocks,
        update_ms,
        compute_spread: None,
    })
}
