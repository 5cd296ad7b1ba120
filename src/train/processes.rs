//! The processes of a run: one (in-process transport) or one per MPI rank (`--transport mpi`).
//!
//! [`ProcessGroup`] is this process's view: its rank, the gradient transport to hand to its
//! worker, the control messages the run needs across processes (the start-up handshake, the
//! final replica check), and how MPI ends. It compiles without the `mpi` feature (then only the
//! single-process group exists), so the training code has no `cfg` branches.
//!
//! The handshake: before any work, every rank describes what must agree (model, dataset,
//! global batch, communication mode, bucket plan, ...) as `key = value` lines and exchanges a
//! hash of them; if the hashes differ, ranks exchange the lines themselves so that every rank
//! stops with an error that names the keys that differ and each rank's value.

use crate::comm::Transport;
use crate::config::{TrainConfig, TransportKind};
use crate::pipeline::Source;
use std::time::Duration;

/// Tags of the run's control messages (their own communicator, so any values would do).
const TAG_HANDSHAKE_HASH: u64 = 1;
const TAG_HANDSHAKE_LINES: u64 = 2;
const TAG_REPLICAS: u64 = 3;
const TAG_END: u64 = 4;

/// This process's place in the run.
pub struct ProcessGroup {
    rank: usize,
    size: usize,
    timeout: Duration,
    #[cfg(feature = "mpi")]
    mpi: Option<crate::comm::mpi_transport::MpiRuntime>,
}

impl ProcessGroup {
    /// The group of a single-process run.
    pub fn single() -> Self {
        Self {
            rank: 0,
            size: 1,
            timeout: Duration::from_secs(120),
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// Starts the group for `kind`: initialises MPI for [`TransportKind::Mpi`] (once per
    /// process). `timeout` bounds every wait for another process.
    pub fn start(kind: TransportKind, timeout: Duration) -> Result<Self, String> {
        match kind {
            TransportKind::InProcess => Ok(Self {
                timeout,
                ..Self::single()
            }),
            #[cfg(feature = "mpi")]
            TransportKind::Mpi => {
                let rt = crate::comm::mpi_transport::MpiRuntime::init(timeout)?;
                Ok(Self {
                    rank: rt.rank(),
                    size: rt.size(),
                    timeout,
                    mpi: Some(rt),
                })
            }
            #[cfg(not(feature = "mpi"))]
            TransportKind::Mpi => TransportKind::parse("mpi").map(|_| Self::single()),
        }
    }

    /// This process's rank (0 in a single-process run).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes in the run.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The gradient transports of this process's `workers` worker threads (element `w` for
    /// local worker `w`), each over every worker of the run: global rank
    /// `rank() * workers + w` of `size() * workers`, the threads of this process reached
    /// through an in-process fabric, the others through MPI. `None` in a single-process run.
    /// Collective: every process calls it once, with the same `workers`, in the same order.
    pub fn transports(&self, workers: usize) -> Result<Option<Vec<Box<dyn Transport>>>, String> {
        #[cfg(feature = "mpi")]
        if let Some(rt) = &self.mpi {
            let ports = rt.ports(workers, self.timeout)?;
            // Waits for a thread of this process get twice the timeout: a local peer is only
            // late because it waits on another process (a hierarchical leader, say), and that
            // wait, which names the process that was lost, must time out and report first; the
            // local waits then end at once, their peer's endpoint gone.
            let local = crate::comm::InProcessFabric::new(workers, None, 2 * self.timeout);
            return Ok(Some(
                local
                    .into_iter()
                    .zip(ports)
                    .map(|(local, port)| {
                        Box::new(crate::comm::HybridTransport::new(local, Box::new(port)))
                            as Box<dyn Transport>
                    })
                    .collect(),
            ));
        }
        let _ = workers;
        Ok(None)
    }

    /// Every process's `mine`, in rank order.
    pub fn all_gather(&self, mine: &[u8], tag: u64) -> Result<Vec<Vec<u8>>, String> {
        self.all_gather_within(mine, tag, self.timeout)
    }

    fn all_gather_within(
        &self,
        mine: &[u8],
        tag: u64,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, String> {
        #[cfg(feature = "mpi")]
        if let Some(rt) = &self.mpi {
            return rt
                .all_gather_bytes(mine, tag, timeout)
                .map_err(|e| e.to_string());
        }
        let _ = (tag, timeout);
        Ok(vec![mine.to_vec()])
    }

    /// Ends the group. After a failure (`ok == false`) the processes still alive meet briefly
    /// (so all of them have reported before any exits, and mpirun does not cut a report
    /// short); if one does not come (it died or hangs), MPI is left without `MPI_Finalize`,
    /// which could wait for it forever.
    pub fn end(self, ok: bool) {
        let met = ok
            || self
                .all_gather_within(&[], TAG_END, self.timeout.min(Duration::from_secs(2)))
                .is_ok();
        #[cfg(feature = "mpi")]
        if let Some(rt) = self.mpi {
            if met {
                drop(rt);
            } else {
                rt.abandon();
            }
        }
        let _ = met;
    }

    /// The start-up handshake (see the module docs): `Ok` when every process describes the
    /// same run, otherwise an error naming what differs. A no-op in a single-process run.
    pub fn handshake(&self, lines: &[(String, String)]) -> Result<(), String> {
        if self.size == 1 {
            return Ok(());
        }
        let text: String = lines.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        let hash = hash_bytes(text.as_bytes());
        let hashes = self.all_gather(&hash.to_le_bytes(), TAG_HANDSHAKE_HASH)?;
        if hashes.iter().all(|h| h[..] == hash.to_le_bytes()) {
            return Ok(());
        }
        let all = self.all_gather(text.as_bytes(), TAG_HANDSHAKE_LINES)?;
        let parsed: Vec<Vec<(String, String)>> = all
            .iter()
            .map(|t| {
                String::from_utf8_lossy(t)
                    .lines()
                    .filter_map(|l| l.split_once(" = "))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .collect();
        let mut diffs = Vec::new();
        for (key, _) in lines {
            let values: Vec<&str> = parsed
                .iter()
                .map(|p| {
                    p.iter()
                        .find(|(k, _)| k == key)
                        .map_or("(missing)", |(_, v)| v.as_str())
                })
                .collect();
            if values.iter().any(|v| *v != values[0]) {
                let per_rank: Vec<String> = values
                    .iter()
                    .enumerate()
                    .map(|(r, v)| format!("rank {r}: {v}"))
                    .collect();
                diffs.push(format!("{key} ({})", per_rank.join(", ")));
            }
        }
        if diffs.is_empty() {
            diffs.push(
                "the ranks run different dptrain versions (same settings, different \
                 descriptions)"
                    .into(),
            );
        }
        Err(format!(
            "the MPI ranks disagree about the run, so none starts: {}; give every rank the \
             same options and data",
            diffs.join("; ")
        ))
    }

    /// Every process's final weight hashes (its workers'), concatenated in rank order.
    pub fn gather_hashes(&self, mine: &[u64]) -> Result<Vec<u64>, String> {
        let bytes: Vec<u8> = mine.iter().flat_map(|h| h.to_le_bytes()).collect();
        let all = self.all_gather(&bytes, TAG_REPLICAS)?;
        Ok(all
            .iter()
            .flat_map(|b| b.chunks_exact(8))
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }
}

/// What every process of a run must agree on, as `key = value` lines for the handshake.
pub fn run_description(
    cfg: &TrainConfig,
    train: &Source,
    test_len: usize,
    start_epoch: usize,
) -> Result<Vec<(String, String)>, String> {
    let device = candle_core::Device::Cpu;
    let net = crate::models::build(
        &cfg.model,
        train.shape(),
        train.num_classes(),
        cfg.seed,
        &device,
    )
    .map_err(|e| e.to_string())?;
    let plan = {
        let (first_cap, cap) = crate::train::worker::bucket_caps(cfg);
        crate::parallel::BucketPlan::new(&net, first_cap, cap)
    };
    let ops: Vec<String> = crate::train::worker::bucket_ops(cfg, &plan)
        .iter()
        .map(|o| o.to_string())
        .collect();
    let sizes: Vec<String> = plan.buckets.iter().map(|b| b.len.to_string()).collect();
    // Labels in order: cheap, and catches a different file or a different --train-limit.
    let labels: Vec<u8> = (0..train.len())
        .flat_map(|i| train.label(i).to_le_bytes())
        .collect();
    let s = |v: &dyn std::fmt::Display| v.to_string();
    Ok(vec![
        ("dptrain version".into(), s(&env!("CARGO_PKG_VERSION"))),
        ("model".into(), s(&cfg.model)),
        ("dataset".into(), s(&cfg.dataset)),
        ("training samples".into(), s(&train.len())),
        (
            "training labels hash".into(),
            format!("{:016x}", hash_bytes(&labels)),
        ),
        ("test samples".into(), s(&test_len)),
        ("input shape".into(), format!("{:?}", train.shape())),
        ("classes".into(), s(&train.num_classes())),
        ("global batch".into(), s(&cfg.batch)),
        ("workers per process".into(), s(&cfg.workers)),
        ("epochs".into(), s(&cfg.epochs)),
        ("first epoch (resume)".into(), s(&start_epoch)),
        ("seed".into(), s(&cfg.seed)),
        ("lr".into(), s(&cfg.lr)),
        ("lr schedule".into(), format!("{:?}", cfg.lr_schedule)),
        ("warmup steps".into(), s(&cfg.warmup_steps)),
        ("sgd".into(), format!("{:?}", cfg.sgd)),
        ("augment".into(), s(&cfg.augment)),
        ("comm".into(), s(&cfg.comm)),
        ("overlap".into(), s(&cfg.overlap)),
        ("hierarchical".into(), s(&cfg.hierarchical)),
        (
            "bucket plan".into(),
            format!("{} [{}]", plan.describe(), sizes.join(",")),
        ),
        ("bucket ops".into(), ops.join(",")),
    ])
}

/// FNV-1a over bytes (stable across processes and builds, unlike `DefaultHasher`).
fn hash_bytes(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ *x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}
