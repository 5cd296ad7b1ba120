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
//!
//! The per-rank report: at the end of a multi-process run every rank sends rank 0 where its
//! steps' time went ([`RankBreakdown`]: its own compute, waiting for the other ranks, waiting
//! for data) and how fast its link is; [`diagnose`] names a rank that computes much slower
//! than the others, or whose link is much slower.
//!
//! Why the links are probed rather than read off the steps' waits: in a synchronous collective
//! every rank waits for the slowest link alike (in a ring each waits on its left neighbour,
//! which waits on its own), so waiting does not say whose link is slow; and timing the
//! gradient messages themselves, as tried first, measured the ranks' scheduling on a busy
//! machine as much as their links (lenet5's messages are a few hundred KB). So once training
//! is over, with the cores idle, every rank sends [`PROBE_BYTES`] to the next rank at once
//! (each link carries one message each way) and times the one from the previous rank, the best
//! of [`PROBE_REPS`]; a rank's link is then the faster of the two paths through it (a path is
//! as fast as the slower of its two ends, so that is the rank's own link as soon as one
//! neighbour's is at least as fast). About 20 ms at 1 Gbit/s, 0.5 s at 100 Mbit/s.

use crate::comm::Transport;
use crate::config::{TrainConfig, TransportKind};
use crate::pipeline::Source;
use crate::train::metrics::Breakdown;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Tags of the run's control messages (their own communicator, so any values would do).
const TAG_HANDSHAKE_HASH: u64 = 1;
const TAG_HANDSHAKE_LINES: u64 = 2;
const TAG_REPLICAS: u64 = 3;
const TAG_END: u64 = 4;
const TAG_RANKS: u64 = 5;
// Only MPI runs probe links.
#[cfg(feature = "mpi")]
const TAG_PROBE_START: u64 = 6;
#[cfg(feature = "mpi")]
const TAG_PROBE: u64 = 7;
const TAG_PLAN_PROBE: u64 = 8;

/// Bytes of one link probe: large enough that the TCP start and the shaper's burst are small
/// beside it, small enough to take milliseconds on a fast link.
pub const PROBE_BYTES: usize = 2 << 20;
/// Timed probes per run (after one untimed, which opens the connections); the best counts, so
/// a probe slowed by a busy core does not make a link look slow.
pub const PROBE_REPS: usize = 3;

/// Bytes of the probe `--comm auto` plans with: it only has to tell standard link rates apart
/// (10x apart; see [`crate::plan::planned_link`]), so a quarter of a second at 100 Mbit/s.
pub const PLAN_PROBE_BYTES: usize = 1 << 20;
/// Timed plan probes (after one untimed); the best counts.
pub const PLAN_PROBE_REPS: usize = 2;

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
            timeout: Duration::from_secs_f64(crate::config::DEFAULT_COMM_TIMEOUT_S),
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
    /// through an in-process fabric (over `intra`'s emulated ports, if given), the others
    /// through MPI. `None` in a single-process run. Collective: every process calls it once,
    /// with the same `workers`, in the same order.
    pub fn transports(
        &self,
        workers: usize,
        intra: Option<crate::comm::LinkModel>,
    ) -> Result<Option<Vec<Box<dyn Transport>>>, String> {
        #[cfg(feature = "mpi")]
        if let Some(rt) = &self.mpi {
            let ports = rt.ports(workers, self.timeout)?;
            // Waits for a thread of this process get twice the timeout: a local peer is only
            // late because it waits on another process (a hierarchical leader, say), and that
            // wait, which names the process that was lost, must time out and report first; the
            // local waits then end at once, their peer's endpoint gone.
            let local = crate::comm::InProcessFabric::new(workers, intra, 2 * self.timeout);
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
        let _ = (workers, intra);
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

    /// The per-rank report (see the module docs): this process's `breakdown` (the mean over its
    /// workers' steps) and its probe of the path from the previous rank, gathered from every
    /// process, with what [`diagnose`] finds in them. Collective.
    pub fn rank_report(
        &self,
        breakdown: &Breakdown,
    ) -> Result<(Vec<RankBreakdown>, Vec<SlowRank>), String> {
        let m = &breakdown.mean;
        let mine = RankBreakdown {
            rank: self.rank,
            host: host_name(),
            steps: breakdown.steps,
            step_ms: m.step_ms,
            compute_ms: m.forward_ms + m.backward_ms + m.update_ms,
            comm_wait_ms: m.exposed_comm_ms,
            data_wait_ms: m.data_ms,
            from_previous_mb_per_s: self.probe_from_previous()?,
            link_mb_per_s: None,
        };
        let bytes = serde_json::to_vec(&mine).map_err(|e| e.to_string())?;
        let mut ranks = self
            .all_gather(&bytes, TAG_RANKS)?
            .iter()
            .map(|b| serde_json::from_slice::<RankBreakdown>(b))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("a rank sent an unreadable per-rank report: {e}"))?;
        let slow = diagnose(&mut ranks);
        Ok((ranks, slow))
    }

    /// The rate of the path from the previous rank to this one, MB/s (see the module docs);
    /// `None` without other processes. Collective.
    fn probe_from_previous(&self) -> Result<Option<f64>, String> {
        Ok(self
            .time_path_from_previous(PROBE_BYTES, PROBE_REPS)?
            .map(|bytes_per_s| bytes_per_s / 1e6))
    }

    /// The slowest path between two neighbouring ranks, bytes/s: every rank times its path
    /// from the previous one with [`PLAN_PROBE_BYTES`] and all take the least, so every rank
    /// plans for the same link. `None` without other processes. Collective.
    pub fn slowest_path_bytes_per_s(&self) -> Result<Option<f64>, String> {
        let Some(mine) = self.time_path_from_previous(PLAN_PROBE_BYTES, PLAN_PROBE_REPS)? else {
            return Ok(None);
        };
        let all = self.all_gather(&mine.to_le_bytes(), TAG_PLAN_PROBE)?;
        let rates: Option<Vec<f64>> = all
            .iter()
            .map(|b| Some(f64::from_le_bytes(b.as_slice().try_into().ok()?)))
            .collect();
        let rates = rates.ok_or("a rank sent an unreadable link measurement")?;
        Ok(rates.into_iter().reduce(f64::min))
    }

    /// The rate of the path from the previous rank into this one, bytes/s: `reps` timed
    /// transfers of `bytes` after an untimed one, the best. `None` without other processes.
    /// Collective.
    fn time_path_from_previous(&self, bytes: usize, reps: usize) -> Result<Option<f64>, String> {
        #[cfg(not(feature = "mpi"))]
        let _ = (bytes, reps);
        #[cfg(feature = "mpi")]
        if let (Some(rt), true) = (&self.mpi, self.size > 1) {
            let payload = vec![0u8; bytes];
            let mut best = Duration::MAX;
            for rep in 0..=reps {
                // Start together, so each probe times the transfer, not a late sender.
                self.all_gather(&[], TAG_PROBE_START)?;
                let took = rt
                    .shift_exchange(&payload, TAG_PROBE, self.timeout)
                    .map_err(|e| format!("probing the links: {e}"))?;
                if rep > 0 {
                    best = best.min(took);
                }
            }
            return Ok(Some(bytes as f64 / best.as_secs_f64().max(1e-9)));
        }
        Ok(None)
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

/// One rank's part of the per-rank report of a multi-process run (`ranks` in `summary.json`).
/// Times are means per step over the rank's workers, the first steps excluded as in the run's
/// breakdown.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankBreakdown {
    /// MPI rank.
    pub rank: usize,
    /// The host it ran on (its hostname).
    pub host: String,
    /// Worker steps averaged.
    pub steps: usize,
    /// Whole step.
    pub step_ms: f64,
    /// Forward, backward and update: the rank's own work.
    pub compute_ms: f64,
    /// Exposed communication: the step waiting for the other ranks' gradients.
    pub comm_wait_ms: f64,
    /// Waiting for the input pipeline.
    pub data_wait_ms: f64,
    /// The probed rate of the path from the previous rank (`rank - 1`, wrapping) into this
    /// one, in MB/s (`None` in a single-process run).
    pub from_previous_mb_per_s: Option<f64>,
    /// This rank's link, in MB/s: the faster of the two probed paths through it, from the
    /// previous rank and to the next (filled in by [`diagnose`]). A path is as fast as the
    /// slower of its two ends' links, so this is the rank's own link as soon as a neighbour's
    /// is at least as fast, and never more than it.
    pub link_mb_per_s: Option<f64>,
}

/// A rank the per-rank report singles out, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlowRank {
    /// MPI rank.
    pub rank: usize,
    /// Its host.
    pub host: String,
    /// What is slow about it, with the figures.
    pub reason: String,
}

/// A rank's link or compute stands out when it is this many times slower than the median of
/// the others': far outside the run-to-run noise of a shared machine, well inside the 10x of a
/// mis-configured or failing NIC.
const SLOW_FACTOR: f64 = 2.0;

/// Fills in every rank's `link_mb_per_s` and names the ranks that are slow: a link
/// `SLOW_FACTOR` below the others' median (with two ranks both paths touch both, so no link
/// can be blamed), or compute `SLOW_FACTOR` above the others' median. The neighbours of a
/// slow link are not named: their other path is fast.
pub fn diagnose(ranks: &mut [RankBreakdown]) -> Vec<SlowRank> {
    let n = ranks.len();
    let links: Vec<Option<f64>> = (0..n)
        .map(|r| {
            let into = ranks[r].from_previous_mb_per_s;
            let out = ranks[(r + 1) % n].from_previous_mb_per_s;
            [into, out].into_iter().flatten().reduce(f64::max)
        })
        .collect();
    let mut slow = Vec::new();
    for r in 0..n {
        ranks[r].link_mb_per_s = links[r];
        let others = |f: &dyn Fn(usize) -> Option<f64>| {
            median((0..n).filter(|&q| q != r).filter_map(f).collect())
        };
        let mut reasons = Vec::new();
        if let (Some(mine), Some(theirs)) = (links[r], others(&|q| links[q])) {
            if mine * SLOW_FACTOR < theirs {
                reasons.push(format!(
                    "its link is slow: {mine:.1} MB/s, the other ranks' {theirs:.1} MB/s \
                     (median)"
                ));
            }
        }
        let compute = ranks[r].compute_ms;
        let steps = |q: usize| ranks[q].steps > 0;
        if let Some(theirs) = others(&|q| steps(q).then_some(ranks[q].compute_ms)) {
            if steps(r) && compute > SLOW_FACTOR * theirs {
                reasons.push(format!(
                    "it computes slowly: {compute:.2} ms a step, the other ranks {theirs:.2} ms \
                     (median)"
                ));
            }
        }
        if !reasons.is_empty() {
            slow.push(SlowRank {
                rank: ranks[r].rank,
                host: ranks[r].host.clone(),
                reason: reasons.join("; "),
            });
        }
    }
    slow
}

/// The per-rank report as printed by rank 0: one line per rank, then the verdict.
pub fn describe_ranks(ranks: &[RankBreakdown], slow: &[SlowRank]) -> String {
    let mut out = String::from("per rank, mean per step:");
    for r in ranks {
        let link = r
            .link_mb_per_s
            .map_or("not probed".into(), |l| format!("{l:.1} MB/s"));
        out.push_str(&format!(
            "\n  rank {} ({}): step {:.2} ms = compute {:.2} + waiting for ranks {:.2} + \
             waiting for data {:.2}; link {link}",
            r.rank, r.host, r.step_ms, r.compute_ms, r.comm_wait_ms, r.data_wait_ms
        ));
    }
    if slow.is_empty() {
        out.push_str("\n  no rank stands out");
    }
    for s in slow {
        out.push_str(&format!(
            "\n  slow: rank {} ({}): {}",
            s.rank, s.host, s.reason
        ));
    }
    out
}

/// The median of `v` (`None` when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// This machine's host name (per UTS namespace, so each host of `scripts/cluster.sh` has its
/// own), or "?" where the kernel does not say.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// What every process of a run must agree on, as `key = value` lines for the handshake.
pub fn run_description(
    cfg: &TrainConfig,
    graph: &std::sync::Arc<crate::model::Graph>,
    train: &Source,
    test_len: usize,
    start_epoch: usize,
) -> Result<Vec<(String, String)>, String> {
    let net = crate::nn::Net::new(
        graph.clone(),
        crate::nn::NetConfig {
            max_batch: 1,
            seed: cfg.seed,
        },
    )
    .map_err(|e| e.to_string())?;
    let planning = cfg.plan_inputs();
    let plan = planning.bucket_plan(&crate::plan::block_lens(&net));
    let ops: Vec<String> = planning
        .bucket_ops(&plan)
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
        (
            "model fingerprint".into(),
            format!("{:016x}", graph.fingerprint()),
        ),
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
        ("skip bad samples".into(), s(&cfg.skip_bad_samples)),
        ("normalize".into(), s(&cfg.normalize)),
        (
            "eval transform".into(),
            cfg.eval_transform
                .as_ref()
                .map_or("-".into(), |t| t.to_string()),
        ),
        ("comm".into(), s(&cfg.comm)),
        ("overlap".into(), s(&cfg.overlap)),
        ("hierarchical".into(), s(&cfg.hierarchy)),
        ("compress".into(), s(&cfg.compress)),
        ("skip non-finite updates".into(), s(&cfg.skip_nonfinite)),
        ("convolution algorithm".into(), s(&cfg.conv_algo)),
        (
            "port within a process (--intra-bandwidth)".into(),
            cfg.intra_link.map_or("-".into(), |l| format!("{l:?}")),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank that computed `compute_ms` a step and whose path from the previous rank moved
    /// `from_previous` MB/s.
    fn rank(r: usize, compute_ms: f64, from_previous: Option<f64>) -> RankBreakdown {
        RankBreakdown {
            rank: r,
            host: format!("h{}", r + 1),
            steps: 10,
            step_ms: compute_ms + 1.0,
            compute_ms,
            comm_wait_ms: 1.0,
            data_wait_ms: 0.0,
            from_previous_mb_per_s: from_previous,
            link_mb_per_s: None,
        }
    }

    #[test]
    fn a_slow_link_is_blamed_on_its_rank_not_on_its_neighbours() {
        // Four ranks, rank 2's link 10x slower: the paths 1->2 and 2->3 are slow.
        let mut ranks = vec![
            rank(0, 5.0, Some(100.0)),
            rank(1, 5.0, Some(98.0)),
            rank(2, 5.0, Some(10.0)),
            rank(3, 5.0, Some(9.0)),
        ];
        let slow = diagnose(&mut ranks);
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert_eq!((slow[0].rank, slow[0].host.as_str()), (2, "h3"));
        assert!(
            slow[0].reason.contains("link is slow"),
            "{}",
            slow[0].reason
        );
        let links: Vec<f64> = ranks.iter().map(|r| r.link_mb_per_s.unwrap()).collect();
        assert_eq!(links, [100.0, 98.0, 10.0, 100.0]);
        let text = describe_ranks(&ranks, &slow);
        assert!(text.contains("slow: rank 2 (h3)"), "{text}");
        // Three ranks, the middle one slow.
        let mut three = vec![
            rank(0, 5.0, Some(100.0)),
            rank(1, 5.0, Some(10.0)),
            rank(2, 5.0, Some(10.0)),
        ];
        let slow = diagnose(&mut three);
        assert_eq!(slow.iter().map(|s| s.rank).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn two_ranks_or_even_links_blame_no_link_but_slow_compute_is_named() {
        // Two ranks: both paths touch both ends, so neither can be blamed.
        let mut two = vec![rank(0, 5.0, Some(10.0)), rank(1, 5.0, Some(100.0))];
        assert!(diagnose(&mut two).is_empty());
        assert_eq!(two[0].link_mb_per_s, Some(100.0));
        assert_eq!(two[1].link_mb_per_s, Some(100.0));
        // Even links, rank 2 computing 4x longer.
        let mut three = vec![
            rank(0, 5.0, Some(100.0)),
            rank(1, 6.0, Some(90.0)),
            rank(2, 22.0, Some(95.0)),
        ];
        let slow = diagnose(&mut three);
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert_eq!(slow[0].rank, 2);
        assert!(
            slow[0].reason.contains("computes slowly"),
            "{}",
            slow[0].reason
        );
        // Nothing probed (one process): no link figures, no verdict.
        let mut one = vec![rank(0, 5.0, None)];
        assert!(diagnose(&mut one).is_empty());
        assert!(one[0].link_mb_per_s.is_none());
        assert!(describe_ranks(&one, &[]).contains("not probed"));
    }
}
