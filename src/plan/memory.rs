//! The one estimate of a run's memory, checked before anything large is allocated: what
//! `train`, `profile`, `bench *` and `model show` ask ([`estimate`], then
//! [`MemoryEstimate::check`]).
//!
//! A run holds, per worker: the parameters (and the trainer's copy of them for broadcasts), the
//! gradients (the reducer's bucket buffers, which backward writes into), the momentum, the
//! activations (one buffer per layer output for the per-worker batch, as `nn::Net` plans
//! them: fused activations share their layer's) and the activations' gradients (shared by
//! liveness: the walk `nn::Net` allocates from, `nn::flow`); per compute thread, the kernels' scratch (the
//! convolution's column matrix, GEMM's packed blocks); for the run, the input pipeline's batch
//! buffers and the in-process fabric between workers ([`crate::comm::transport::fabric_bytes`]:
//! its channels grow as workers^2). Thread stacks and the allocator's per-thread arenas are
//! address space, not resident memory: they count only against `RLIMIT_AS`.
//!
//! The check is against what this process may take ([`crate::limits::memory_room`]: the
//! smallest of `MemAvailable`, the cgroup's headroom and `RLIMIT_AS` minus the mapped size).

use crate::backend::ConvAlgo;
use crate::limits::{human_bytes, MemoryError, MemoryLimit, MemoryRoom};
use crate::model::{Graph, Op};

/// What a run is, as far as its memory goes.
#[derive(Debug, Clone)]
pub struct MemoryInputs<'a> {
    /// The model (`None`: no model, e.g. `bench allreduce`).
    pub graph: Option<&'a Graph>,
    /// Samples per worker per step.
    pub batch_per_worker: usize,
    /// Workers in this process.
    pub workers: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// A training step (gradients, momentum, activation gradients), not inference alone.
    pub training: bool,
    /// Batch buffers of the input pipeline (`workers x (prefetch + 1)`; 0 for none).
    pub data_buffers: usize,
    /// Other threads of the run (loader threads, communication threads).
    pub other_threads: usize,
    /// Floats of the largest message between workers (0: no messages).
    pub largest_message: usize,
    /// Message buffers of `largest_message` floats each worker holds at once (its warm
    /// buffers, or `workers - 1` in flight in the redundant mode).
    pub messages_per_worker: usize,
    /// Further buffers per worker in bytes, with what they are (an all-reduce's buffer and
    /// scratch).
    pub extra_per_worker: Option<(&'static str, f64)>,
    /// Bytes of data already in memory when the check runs (a data set loaded whole): part of
    /// what the run holds, but not of what it has still to take.
    pub loaded: f64,
    /// How the 3x3 stride-1 convolutions are computed: Winograd's transformed weights and
    /// tiles are memory direct convolution does not take.
    pub conv_algo: ConvAlgo,
    /// The command's option that sets `workers`, named in what to lower (`--workers`;
    /// `profile`'s `--concurrent`; `None` for a command of one worker, `bench step`).
    pub workers_flag: Option<&'static str>,
    /// The command's option that sets `largest_message`, if one does (`bench allreduce`'s
    /// `--sizes`; a training run's largest message is its weights).
    pub message_flag: Option<&'static str>,
}

impl<'a> MemoryInputs<'a> {
    /// A training run of `graph` at `batch_per_worker` on `workers` x `threads`, no pipeline
    /// and no messages (fill in the rest).
    pub fn training(
        graph: &'a Graph,
        batch_per_worker: usize,
        workers: usize,
        threads: usize,
    ) -> Self {
        Self {
            graph: Some(graph),
            batch_per_worker,
            workers,
            threads,
            training: true,
            data_buffers: 0,
            other_threads: 0,
            largest_message: 0,
            messages_per_worker: 0,
            extra_per_worker: None,
            loaded: 0.0,
            conv_algo: ConvAlgo::default(),
            workers_flag: Some("--workers"),
            message_flag: None,
        }
    }
}

/// One part of an estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPart {
    /// What it is.
    pub what: &'static str,
    /// Bytes, over the whole process.
    pub bytes: f64,
    /// What to lower to make it smaller.
    pub lower: String,
}

/// A run's memory, by part.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryEstimate {
    /// Resident memory, by part.
    pub parts: Vec<MemoryPart>,
    /// Address space on top of it (thread stacks, allocator arenas): counts against
    /// `RLIMIT_AS` only.
    pub address_space_only: f64,
    /// Resident already when the check runs (the program, a data set loaded whole): in what
    /// the process will hold ([`MemoryEstimate::peak`]), not in what it has still to take.
    pub resident: f64,
}

/// The program itself once running: code, libraries, the allocator's own (measured: a
/// `train` of lenet5 at batch 64 peaked 44 MiB above its data set and buffers).
const PROGRAM_BYTES: f64 = 48.0 * 1024.0 * 1024.0;

/// Stack reserved per thread (Rust's default for spawned threads, which rayon keeps).
const STACK_BYTES: f64 = 2.0 * 1024.0 * 1024.0;

/// Address space glibc reserves per malloc arena (`HEAP_MAX_SIZE` on 64-bit); a process gets
/// up to 8 per core, one per thread that allocates while the others hold theirs.
const ARENA_BYTES: f64 = 64.0 * 1024.0 * 1024.0;

/// What `inputs` needs, by part.
pub fn estimate(inputs: &MemoryInputs) -> MemoryEstimate {
    let w = inputs.workers.max(1) as f64;
    let b = inputs.batch_per_worker as f64;
    let mut parts = Vec::new();
    let mut part = |what, bytes: f64, lower: String| {
        if bytes > 0.0 {
            parts.push(MemoryPart { what, bytes, lower });
        }
    };
    let workers_now = match inputs.workers_flag {
        Some(flag) => format!("{flag} ({} now)", inputs.workers),
        None => format!("the workers ({} now)", inputs.workers),
    };
    // "--threads" and, where the command has one, the option that sets the workers.
    let threads_or_workers = match inputs.workers_flag {
        Some(flag) => format!("--threads or {flag}"),
        None => "--threads".to_string(),
    };
    if let Some(g) = inputs.graph {
        let p = g.nodes.iter().map(|n| n.params as f64).sum::<f64>();
        let model = format!("the model's size ({} parameters now)", p);
        // Parameters and the kernels' packed copy of the weights; with training also their
        // gradients, the momentum and the copy the trainer broadcasts weights through.
        let (copies, what) = if inputs.training {
            (5.0, "parameters, gradients and momentum")
        } else {
            (2.0, "parameters")
        };
        part(what, 4.0 * p * copies * w, model);
        let (acts, grads) = activation_floats(g);
        let batch = format!("--batch ({} per worker now)", inputs.batch_per_worker);
        part("activations", 4.0 * acts * b * w, batch.clone());
        if inputs.training {
            part("activation gradients", 4.0 * grads * b * w, batch.clone());
        }
        let input = g.input().numel() as f64 + 1.0;
        part(
            "input pipeline batches",
            4.0 * input * b * inputs.data_buffers as f64,
            "--prefetch or --batch".into(),
        );
        // Per compute thread: the kernels' scratch, and the column matrix's rows of the widest
        // layer beyond it (`backend::thread_scratch_floats`).
        let (scratch, col_rows) = crate::backend::thread_scratch_floats();
        let (scratch, col_rows) = (scratch as f64, col_rows as f64);
        let width = max_column_width(g);
        let lower = if width > scratch / col_rows {
            format!(
                "the model's convolutions (a column row of {width} values: kernel x kernel x \
                 input channels), {threads_or_workers}"
            )
        } else {
            threads_or_workers.clone()
        };
        part(
            "compute threads' scratch",
            4.0 * (scratch + col_rows * width) * (inputs.threads as f64) * w,
            lower,
        );
        // The thread scratch is the buffer im2col's column matrix uses: only its growth past
        // that counts.
        let (net, thread) = conv_algo_floats(g, inputs.conv_algo);
        let thread = (thread - col_rows * width).max(0.0);
        part(
            "Winograd workspace",
            4.0 * (net + thread * inputs.threads as f64) * w,
            format!("{threads_or_workers}, or give --conv-algo direct (which needs none)"),
        );
    }
    if let Some((what, bytes)) = inputs.extra_per_worker {
        let lower = match inputs.message_flag {
            Some(flag) => format!("{flag} (or {workers_now})"),
            None => workers_now.clone(),
        };
        part(what, bytes * w, lower);
    }
    part(
        "messages between workers",
        crate::comm::transport::fabric_bytes(
            inputs.workers,
            inputs.largest_message,
            inputs.messages_per_worker,
        ),
        match inputs.message_flag {
            Some(flag) => format!("{flag} or {workers_now}"),
            None => workers_now,
        },
    );
    let threads = w * (inputs.threads as f64 + 1.0) + inputs.other_threads as f64 + 1.0;
    let arenas = threads.min(8.0 * crate::limits::cores() as f64);
    MemoryEstimate {
        parts,
        address_space_only: threads * STACK_BYTES + arenas * ARENA_BYTES,
        resident: PROGRAM_BYTES + inputs.loaded,
    }
}

impl MemoryEstimate {
    /// Resident bytes the run has still to take.
    pub fn total(&self) -> f64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// Resident bytes the process will hold at its peak: [`MemoryEstimate::total`] and what
    /// is resident already (what `VmHWM` measures).
    pub fn peak(&self) -> f64 {
        self.total() + self.resident
    }

    /// The parts, largest first: `activations 1.2 GiB, parameters ... 40.0 MiB`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<&MemoryPart> = self.parts.iter().collect();
        parts.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
        parts
            .iter()
            .map(|p| format!("{} {}", p.what, human_bytes(p.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Refuses `what` if it does not fit in what this process may take now.
    pub fn check(&self, what: &str) -> Result<(), MemoryError> {
        self.check_in(what, crate::limits::memory_room())
    }

    /// [`MemoryEstimate::check`] against a given room (`None`: unknown, passes). Under
    /// `RLIMIT_AS` the thread stacks and arenas count too.
    pub fn check_in(&self, what: &str, room: Option<MemoryRoom>) -> Result<(), MemoryError> {
        let Some(room) = room else {
            return Ok(());
        };
        let mut needed = self.total();
        if room.limit == MemoryLimit::AddressSpace {
            needed += self.address_space_only;
        }
        if crate::limits::fits(needed, room.bytes) {
            return Ok(());
        }
        let largest = self.parts.iter().max_by(|a, b| a.bytes.total_cmp(&b.bytes));
        let todo = match largest {
            Some(p) => format!(
                "lower {} ({} is the largest part, {})",
                p.lower,
                p.what,
                human_bytes(p.bytes)
            ),
            None => "lower the thread count".into(),
        };
        Err(MemoryError {
            what: format!("{what} ({})", self.describe()),
            needed,
            room,
            todo,
        })
    }
}

/// Floats per sample of a training net's activation buffers and of its activation-gradient
/// buffers, from the data flow `nn::Net` allocates them from (`nn::flow`): an activation
/// fused into the layer before it shares that layer's buffer, losses have none, and
/// gradients are shared by liveness.
pub fn activation_floats(g: &Graph) -> (f64, f64) {
    use crate::nn::flow;
    let flows = flow::flows(g, &flow::Fusion::plan(g, &flow::readers(g)));
    let numel = |i: usize| g.nodes[i].shape.numel();
    let acts = numel(0)
        + flows
            .iter()
            .filter(|f| !f.loss)
            .map(|f| numel(f.out))
            .sum::<usize>();
    let (grads, _) = flow::gradient_slots(&flows, g.nodes.len(), numel);
    (acts as f64, grads.iter().sum::<usize>() as f64)
}

/// Floats of the convolution algorithm's own buffers beyond direct convolution's: per net
/// (each packed position of the transformed weights grown to the largest of the layers that
/// have it) and per compute thread (the largest layer's scratch).
fn conv_algo_floats(g: &Graph, algo: ConvAlgo) -> (f64, f64) {
    let layers: Vec<_> = crate::nn::conv_geometries(g)
        .iter()
        .map(|geom| crate::backend::conv_algo_floats(algo, geom))
        .collect();
    let most = |f: &dyn Fn(&crate::backend::WinogradMemory) -> usize| {
        layers.iter().map(f).max().unwrap_or(0) as f64
    };
    let positions = most(&|l| l.positions) as usize;
    let packed: f64 = (0..positions)
        .map(|xi| most(&|l| if l.positions > xi { l.packed } else { 0 }))
        .sum();
    (packed, most(&|l| l.thread))
}

/// The widest column matrix row of the model's convolutions (kernel x kernel x input channels
/// per group), 0 without any.
fn max_column_width(g: &Graph) -> f64 {
    g.nodes
        .iter()
        .filter_map(|n| match n.layer() {
            // Its parameters are out x (kernel x kernel x channels per group), plus a bias.
            Some(Op::Conv2d(_)) => Some(n.params as f64 / n.shape.c.max(1) as f64),
            _ => None,
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(gib: u64, limit: MemoryLimit) -> Option<MemoryRoom> {
        Some(MemoryRoom {
            bytes: gib << 30,
            limit,
        })
    }

    #[test]
    fn lenet5_s_buffers_are_those_worked_out_by_hand() {
        // Activations per sample: the input (784) and each exec's output, the relus fused:
        // c1 3456, pool 864, c2 1024, pool 256, flatten 256, f1 120, f2 84, f3 10.
        // Gradients, walking backward: the loss takes buffer A for f3's (10); f3 needs f2's
        // (84) while A is live: B; then A is free and grows to f1's (120), B to flatten's
        // (256), A to pool's (256), B to c2's (1024), A to pool's (864), B to c1's (3456); c1
        // needs none for the data. Two buffers: 864 + 3456.
        let g = crate::model::reference_graph("lenet5").unwrap();
        assert_eq!(activation_floats(&g), (6854.0, 4320.0));
    }

    #[test]
    fn a_training_net_is_planned_as_the_net_allocates_it() {
        for model in ["lenet5", "resnet20", "vgg-small"] {
            let g = std::sync::Arc::new(crate::model::reference_graph(model).unwrap());
            let net = crate::nn::Net::new(
                g.clone(),
                crate::nn::NetConfig {
                    max_batch: 4,
                    seed: 1,
                },
            )
            .unwrap();
            let (acts, grads) = activation_floats(&g);
            assert_eq!(
                4.0 * 4.0 * (acts + grads),
                net.buffer_bytes() as f64,
                "{model}"
            );
        }
    }

    #[test]
    fn winograd_workspace_is_counted_where_winograd_runs() {
        use crate::backend::WinogradTile;
        let winograd = |model: &str, algo: ConvAlgo, threads: usize| {
            let g = crate::model::reference_graph(model).unwrap();
            let mut i = MemoryInputs::training(&g, 64, 1, threads);
            i.conv_algo = algo;
            estimate(&i)
                .parts
                .iter()
                .find(|p| p.what == "Winograd workspace")
                .map_or(0.0, |p| p.bytes)
        };
        let f4 = ConvAlgo::Winograd(WinogradTile::F4);
        assert_eq!(winograd("resnet18", ConvAlgo::Direct, 1), 0.0);
        // lenet5's convolutions are 5x5: nothing runs by Winograd.
        assert_eq!(winograd("lenet5", f4, 1), 0.0);
        // resnet18's largest 3x3 layer is 512 -> 512: 36 packed transformed positions of
        // 512 x 512 weights, at least.
        let one = winograd("resnet18", f4, 1);
        assert!(one >= 4.0 * 36.0 * 512.0 * 512.0, "{one}");
        // auto runs those layers' weight gradient direct: no scratch for it.
        assert!(winograd("resnet18", ConvAlgo::Auto, 1) < one);
        // Each compute thread adds its scratch; F(2x2) has 16 positions, not 36.
        assert!(winograd("resnet18", f4, 2) > one);
        let f2 = winograd("resnet18", ConvAlgo::Winograd(WinogradTile::F2), 1);
        assert!(f2 < one && f2 > 0.0, "{f2} {one}");
    }

    #[test]
    fn what_does_not_fit_is_refused_naming_the_largest_part() {
        let g = crate::model::reference_graph("vgg-small").unwrap();
        let e = estimate(&MemoryInputs::training(&g, 100_000, 1, 1));
        let err = e
            .check_in("vgg-small", room(4, MemoryLimit::MemAvailable))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--batch (100000 per worker now)") && err.contains("4.0 GiB available"),
            "{err}"
        );
        assert!(estimate(&MemoryInputs::training(&g, 64, 1, 1))
            .check_in("x", room(4, MemoryLimit::MemAvailable))
            .is_ok());
        // Stacks and arenas count against the address space only.
        let g = crate::model::reference_graph("lenet5").unwrap();
        let mut threads = MemoryInputs::training(&g, 1, 64, 16);
        threads.other_threads = 1000;
        let e = estimate(&threads);
        assert!(e.check_in("x", room(4, MemoryLimit::MemAvailable)).is_ok());
        assert!(e.check_in("x", room(4, MemoryLimit::AddressSpace)).is_err());
    }

    #[test]
    fn the_fabric_grows_as_workers_squared_and_is_counted() {
        let one = crate::comm::transport::fabric_bytes(100, 1000, 4);
        let two = crate::comm::transport::fabric_bytes(200, 1000, 4);
        // The message buffers are linear in the workers (they were 2 x workers per worker).
        let buffers = |w| {
            crate::comm::transport::fabric_bytes(w, 1 << 20, 4)
                - crate::comm::transport::fabric_bytes(w, 0, 4)
        };
        assert_eq!(buffers(200), 2.0 * buffers(100));
        assert!(two > 3.5 * one, "{one} {two}");
        let g = crate::model::reference_graph("lenet5").unwrap();
        let mut i = MemoryInputs::training(&g, 1, 1000, 1);
        i.largest_message = 61_706;
        i.messages_per_worker = 4;
        let err = estimate(&i)
            .check_in("x", room(16, MemoryLimit::MemAvailable))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--workers (1000 now)"), "{err}");
    }
}
