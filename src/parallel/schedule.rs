//! Priority scheduling (`--schedule priority`): the order in which the communication thread
//! reduces a step's buckets, and why the next step's forward need not wait for all of them.
//!
//! With `--schedule overlap` (DDP's and Horovod's schedule, the default) buckets are reduced in
//! the order backward fills them, the last layers first, and the update waits for every bucket:
//! when the link is slower than backward, the backlog at the end of backward is all exposed,
//! and the next forward cannot start before it is gone. Yet the next forward needs the first
//! layers' weights first, which backward produces last.
//!
//! `--schedule priority` (ByteScheduler, SOSP'19; P3, MLSys'19; TicTac) reorders that backlog:
//! 1. **Partitions**: each bucket is reduced in collectives of at most `--partition-kb`
//!    ([`crate::plan::partition_bytes`]), so a large late layer cannot hold back an early one
//!    for longer than one partition.
//! 2. **Priority**: whenever the communication thread is free it takes, among the partitions
//!    backward has filled, the one nearest the input.
//! 3. **Per-layer update and gated forward**: the worker does not wait for the step's buckets.
//!    The next step's forward runs layer by layer, and before a layer runs, the bucket holding
//!    its weights is waited for and applied (the same SGD, element by element, so the weights
//!    get the same bits as a whole update). So communication runs under the next forward too,
//!    and a step approaches max(compute, communication) instead of their sum.
//!
//! Every rank must run the same collectives in the same order, or a ring would pair bucket 3
//! on one rank with bucket 5 on another. So rank 0 decides, partition by partition, and
//! broadcasts each choice (the reducer's `PriorityStep`); the others wait for the chosen
//! bucket from their own backward if they do not hold it yet. [`priority_order`] is the same
//! rule in virtual time, for the simulator. The sums are the same collectives on the same
//! partitions in whatever order they run, so the weights are bit-identical to `--schedule
//! overlap` with the same buckets and partitions in every mode; only the time changes.
//! (Partitions themselves change the bits of ring and halving-doubling, whose order of
//! addition follows the chunk an element falls in; not of redundant, tree or shm, which add
//! in rank order.)
//!
//! 4. **The first bucket is not held up by a late one**: a partition is never interrupted, so
//!    one started just before backward hands over the first layers' bucket delays the whole
//!    next forward by the rest of its reduction. Rank 0 leaves the link idle for that bucket
//!    instead when the next forward would end sooner ([`FirstBucketWait`]: both orders played
//!    out against when the forward needs each bucket, [`ForwardNeeds`], with the hand-over
//!    predicted from the last step, [`StepHistory`]). Only rank 0's choice changes, so the
//!    collectives and the bits stay the same.
//!
//! The credit (ByteScheduler's, `--credit-kb`) is what one decision of rank 0 commits every
//! rank to: the partitions, input-first among the buckets rank 0 holds, up to the credit's
//! bytes (at least one). By default one partition: a partition that became urgent waits at most
//! for the one under way, and each partition costs a decision message. A larger credit sends
//! fewer decisions, and an urgent partition waits for up to the credit. The communication
//! thread still runs one collective at a time (the transports order messages by pair).

use std::fmt;
use std::time::{Duration, Instant};

/// How a reducer cuts and orders its collectives: the schedule, each bucket's partitions and,
/// under priority, how many partitions' values one decision of rank 0 commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceOrder {
    /// `--schedule`.
    pub schedule: Schedule,
    /// Values per partition (0: whole buckets).
    pub partition: usize,
    /// Values one decision commits to under priority (at least one partition, whatever this
    /// says; 0: one partition).
    pub credit: usize,
}

/// `--schedule`: when buckets are reduced and when the update happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Buckets in the order backward fills them; the update after all are back (DDP).
    #[default]
    Overlap,
    /// Buckets nearest the input first; each layer updated just before the next forward
    /// needs it.
    Priority,
}

impl Schedule {
    /// Parses `overlap` or `priority`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "overlap" => Ok(Self::Overlap),
            "priority" => Ok(Self::Priority),
            _ => Err(format!("--schedule must be overlap or priority, not {s:?}")),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Overlap => "overlap",
            Self::Priority => "priority",
        })
    }
}

/// Partition `part` of `parts` of a bucket of `len` values: balanced contiguous ranges, in
/// buffer order (the bucket's last blocks, nearest the input, in the last partition).
pub fn partition_range(len: usize, parts: usize, part: usize) -> std::ops::Range<usize> {
    len * part / parts..len * (part + 1) / parts
}

/// How many partitions a bucket of `len` values is reduced in with partitions of
/// `partition` values (0: whole): at least one, none longer than `partition`.
pub fn partition_count(len: usize, partition: usize) -> usize {
    if partition == 0 {
        1
    } else {
        len.div_ceil(partition).max(1)
    }
}

/// Why priority scheduling cannot run with these settings, if it cannot (the trainer's options
/// and the simulator's alike): it sends each bucket as backward fills it (no `--overlap off`),
/// every worker updates its own replica (no tree mode, whose root updates alone and broadcasts
/// the weights), and each layer is updated as its bucket comes back, before the others are seen
/// (no `--on-nonfinite skip`, which decides on the whole gradient first).
pub fn priority_refusal(overlap: bool, root_updates: bool, skip_nonfinite: bool) -> Option<String> {
    if !overlap {
        return Some(
            "--schedule priority with --overlap off: priority scheduling sends each bucket as \
             backward fills it; use --overlap on (the default)"
                .into(),
        );
    }
    if root_updates {
        return Some(
            "--schedule priority with --comm tree: tree mode's worker 0 updates alone and \
             broadcasts the weights after the whole step, so no layer can be updated as its \
             bucket comes back; choose ring, hd, redundant, shm or auto"
                .into(),
        );
    }
    if skip_nonfinite {
        return Some(
            "--schedule priority with --on-nonfinite skip: skipping decides on the whole \
             gradient before any layer is updated, and priority scheduling updates each layer \
             as its bucket comes back; use --on-nonfinite stop or --schedule overlap"
                .into(),
        );
    }
    None
}

/// The most partitions one decision under a credit names (a message of 256 bytes).
pub const MAX_DECIDED: usize = 64;

/// Values a decision message carries: one partition without a credit (a single value), else up
/// to [`MAX_DECIDED`]. Every rank knows the credit, so all agree on the length.
pub fn decision_len(credit: usize) -> usize {
    if credit == 0 {
        1
    } else {
        MAX_DECIDED
    }
}

/// Whether a decision that names `taken` partitions of `values` values in all is complete
/// under `credit`: at least one partition, then up to the credit, at most [`decision_len`].
/// Rank 0's rule in the reducer and in [`priority_order`].
pub fn decision_full(taken: usize, values: usize, credit: usize) -> bool {
    taken == decision_len(credit) || (taken > 0 && values >= credit)
}

/// `--credit-kb` as values (`None`: 0, one partition per decision).
pub fn credit_values(credit_kb: Option<usize>) -> usize {
    credit_kb.map_or(0, |kb| kb.saturating_mul(1024) / 4)
}

/// Why `--partition-kb` or `--credit-kb` cannot be used with `schedule`, if they cannot (the
/// trainer's options and the simulator's alike).
pub fn order_refusal(
    schedule: Schedule,
    partition_kb: Option<usize>,
    credit_kb: Option<usize>,
) -> Option<String> {
    if partition_kb == Some(0) {
        return Some(
            "--partition-kb 0: a partition must hold at least 1 KiB (to send each layer in a \
             bucket of its own, use --bucket-kb 0)"
                .into(),
        );
    }
    match (credit_kb, schedule) {
        (Some(0), _) => Some(
            "--credit-kb 0: a decision commits to at least 1 KiB (the default, one partition \
             per decision, is --credit-kb auto)"
                .into(),
        ),
        (Some(kb), Schedule::Overlap) => Some(format!(
            "--credit-kb {kb} applies to --schedule priority (under overlap, buckets go in \
             backward's order with no decisions): add --schedule priority or drop it"
        )),
        _ => None,
    }
}

/// The order of a step's partitions under priority scheduling ([`priority_order`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PriorityOrder {
    /// Partition indices, in the order they are reduced.
    pub order: Vec<usize>,
    /// Per entry of `order`: whether rank 0 decides (and broadcasts the decision) before it.
    pub decides: Vec<bool>,
}

/// A step's partitions as [`priority_order`] sees them, indexed in the order backward fills
/// their buckets, each bucket's in buffer order, so a higher index is nearer the input.
#[derive(Debug, Clone, Copy)]
pub struct StepPartitions<'a> {
    /// When each is ready, seconds from the start of the step.
    pub ready: &'a [f64],
    /// How long its reduction takes, s.
    pub busy: &'a [f64],
    /// Its values.
    pub values: &'a [usize],
    /// Its bucket (non-decreasing: the last is the bucket the next forward needs first).
    pub bucket: &'a [usize],
    /// Per bucket: seconds of the next forward, its waits left out, before it needs it.
    pub needed: &'a [f64],
}

/// The order in which to reduce a step's partitions under priority scheduling. One collective
/// at a time, none interrupted: whenever the communication thread is free it decides, taking
/// the ready partitions of highest index up to `credit` values (at least one, at most
/// [`MAX_DECIDED`]; `credit` 0: one), or waits for the next one to become ready, or, where
/// [`FirstBucketWait::pays`] says so, for the bucket the next forward needs first; the
/// partitions decided then run one after the other.
///
/// When the link keeps up, every bucket is done before the next is ready and this is the
/// order backward fills them (`--schedule overlap`'s); when a backlog builds, the buckets left
/// at the end of backward go input-first. This is the communication thread's rule (rank 0's
/// choice in the reducer's `PriorityStep`) run in virtual time, where the first bucket's
/// arrival is known rather than predicted from the last step: the simulator orders its
/// partitions with it.
pub fn priority_order(p: &StepPartitions<'_>, credit: usize) -> PriorityOrder {
    let n = p.ready.len();
    assert!(
        p.busy.len() == n && p.values.len() == n && p.bucket.len() == n,
        "one time, size and bucket per partition"
    );
    let mut done = vec![false; n];
    let mut out = PriorityOrder {
        order: Vec::with_capacity(n),
        decides: Vec::with_capacity(n),
    };
    let mut now = 0.0f64;
    while out.order.len() < n {
        if !(0..n).any(|i| !done[i] && p.ready[i] <= now) {
            // Idle until the next partition is ready (the earliest).
            let i = (0..n)
                .filter(|&i| !done[i])
                .min_by(|&a, &b| p.ready[a].total_cmp(&p.ready[b]))
                .expect("a partition is left");
            now = p.ready[i];
        }
        // One decision: input-first among those ready now, up to the credit.
        let (mut taken, mut taken_values) = (0, 0usize);
        for i in (0..n).rev() {
            if done[i] || p.ready[i] > now {
                continue;
            }
            if decision_full(taken, taken_values, credit) {
                break;
            }
            done[i] = true;
            out.order.push(i);
            out.decides.push(taken == 0);
            taken += 1;
            taken_values = taken_values.saturating_add(p.values[i]);
        }
        let decided = out.order.len() - taken..out.order.len();
        if let Some(first_ready) = first_bucket_wait(p, &out.order[decided.clone()], &done, now) {
            // Leave the link idle for the first bucket instead: undo the decision.
            for &i in &out.order[decided.clone()] {
                done[i] = false;
            }
            out.order.truncate(decided.start);
            out.decides.truncate(decided.start);
            now = first_ready;
            continue;
        }
        now += out.order[decided]
            .iter()
            .map(|&i| p.busy[i].max(0.0))
            .sum::<f64>();
    }
    out
}

/// In virtual time: when the bucket the next forward needs first is ready, if the link should
/// wait for it rather than run the partitions `decided` ([`FirstBucketWait`]).
fn first_bucket_wait(
    p: &StepPartitions<'_>,
    decided: &[usize],
    done: &[bool],
    now: f64,
) -> Option<f64> {
    let first = *p.bucket.last()?;
    let of_bucket = |b: usize| (0..p.ready.len()).filter(move |&i| p.bucket[i] == b);
    let first_ready = of_bucket(first)
        .filter(|&i| !done[i])
        .map(|i| p.ready[i])
        .min_by(f64::total_cmp)?;
    let wait = FirstBucketWait {
        due_in_s: first_ready - now,
        first_s: of_bucket(first).map(|i| p.busy[i]).sum(),
        decided_s: decided.iter().map(|&i| p.busy[i]).sum(),
    };
    let left: Vec<BucketLeft> = (0..first)
        .rev()
        .map(|b| BucketLeft {
            link_s: of_bucket(b)
                .filter(|&i| !done[i] || decided.contains(&i))
                .map(|i| p.busy[i])
                .sum(),
            decided_s: of_bucket(b)
                .filter(|i| decided.contains(i))
                .map(|i| p.busy[i])
                .sum(),
            needed_s: p.needed[b],
        })
        .filter(|l| l.link_s > 0.0)
        .collect();
    wait.pays(left.iter().copied()).then_some(first_ready)
}

/// Whether rank 0, with the link free and the bucket the next forward needs first (backward's
/// last) not yet handed over, should leave the link idle until it is rather than start the
/// partitions it would otherwise decide (TicTac's point, for the one bucket that gates the
/// whole next step).
///
/// A partition is never interrupted, so one started just before backward ends holds the first
/// bucket back for the rest of its reduction, and the next forward cannot begin meanwhile:
/// vgg-small, 2 workers, 170 Mbit/s, ring: a 148 KB partition of the last convolution started
/// 0.8 ms before the first convolution's 3.6 KB bucket was handed over, and the next forward
/// waited 6.3 ms for it (steps of 42.5 ms, against 37.5 at 160 Mbit/s). Held, the candidate
/// goes after the first bucket and the buckets nearer the input, and is late if the forward
/// reaches its layers before that. When the link is the bottleneck, its idle time is lost for
/// good, and the buckets the forward needs next are late by it: at 150 Mbit/s holding a
/// middle layer's partition made the next forward wait for it and the last convolution's
/// (steps of 39.8 ms against 38.2). So both orders are played out against when the next forward
/// needs each bucket, and the wait is taken when the forward ends sooner by more than the wait.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstBucketWait {
    /// Seconds until the first bucket is handed over.
    pub due_in_s: f64,
    /// Seconds its partitions take.
    pub first_s: f64,
    /// Seconds the partitions rank 0 would decide now take.
    pub decided_s: f64,
}

/// A bucket other than the first with partitions left in the step, as [`FirstBucketWait`]
/// weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketLeft {
    /// Seconds of its partitions left, those decided now included.
    pub link_s: f64,
    /// Seconds of those decided now.
    pub decided_s: f64,
    /// Seconds of the next forward, its waits left out, before it needs this bucket.
    pub needed_s: f64,
}

impl FirstBucketWait {
    /// Whether the next forward ends sooner if the link waits: `left` are the other buckets
    /// with partitions left, input-first (the order they go in once the first is here).
    pub fn pays(&self, left: impl Iterator<Item = BucketLeft> + Clone) -> bool {
        if !(self.due_in_s > 0.0 && self.due_in_s < self.decided_s) {
            return false;
        }
        // The forward starts when the first bucket is back and is held up by the bucket back
        // latest against its need: its start plus that delay (its end, less its own time).
        let forward_late_end = |start: f64, sent_before: bool| {
            let (mut t, mut stall) = (start, 0.0f64);
            for b in left.clone() {
                let link = if sent_before {
                    b.link_s - b.decided_s
                } else {
                    b.link_s
                };
                if link > 0.0 {
                    t += link;
                    stall = stall.max(t - start - b.needed_s);
                }
            }
            start + stall
        };
        let sent = forward_late_end(self.decided_s.max(self.due_in_s) + self.first_s, true);
        let held = forward_late_end(self.due_in_s + self.first_s, false);
        // The link's idle time is lost for the next step's buckets too where the link is the
        // bottleneck, and the hand-over may come later than predicted: the forward must gain
        // more than the wait. (Without this margin, vgg-small at 150 Mbit/s waited for gains
        // of about 1 ms, the hand-over came 1-2 ms late, and the step lost 2 ms.)
        sent - held > self.due_in_s
    }
}

/// When a worker's forward needs each bucket under priority scheduling, measured at its gates
/// in seconds of forward from the first gate, the waits at the gates left out (what the
/// forward would take with every bucket back in time). Each bucket carries its value to the
/// communication thread with the next backward's hand-over ([`StepHistory::handed`]).
#[derive(Debug, Clone)]
pub struct ForwardNeeds {
    /// This step's first gate.
    origin: Option<Instant>,
    /// Time waited at the gates since.
    waited: Duration,
    /// Per bucket (NaN: not gated this step).
    pub needed: Vec<f64>,
    /// Whether this step's forward is still running (no bucket handed over yet).
    open: bool,
}

impl ForwardNeeds {
    /// For `buckets` buckets, none measured.
    pub fn new(buckets: usize) -> Self {
        Self {
            origin: None,
            waited: Duration::ZERO,
            needed: vec![f64::NAN; buckets],
            open: false,
        }
    }

    /// A step begins: its forward is measured afresh.
    pub fn begin_step(&mut self) {
        self.origin = None;
        self.waited = Duration::ZERO;
        self.needed.fill(f64::NAN);
        self.open = true;
    }

    /// Backward has handed a bucket over: the forward is over, and what gates later (the
    /// drains before an evaluation, a checkpoint, a commit or the end of an epoch) is not it.
    pub fn close(&mut self) {
        self.open = false;
    }

    /// The forward reached the gate of bucket `b` at `at`.
    pub fn needs(&mut self, b: usize, at: Instant) {
        if !self.open {
            return;
        }
        let origin = *self.origin.get_or_insert(at);
        let forward = at
            .saturating_duration_since(origin)
            .saturating_sub(self.waited);
        self.needed[b] = forward.as_secs_f64();
    }

    /// The forward waited `d` at a gate.
    pub fn waited(&mut self, d: Duration) {
        self.waited += d;
    }
}

/// What rank 0 remembers between steps to predict, under priority scheduling, when the
/// bucket the next forward needs first will be handed over, and what waiting for it costs
/// ([`FirstBucketWait`]): when backward handed each bucket over in the last step, how long
/// each bucket's partitions took, and when the forward needs each. Sized once; no step
/// allocates.
#[derive(Debug, Clone)]
pub struct StepHistory {
    /// This step: when each bucket was handed over.
    handed: Vec<Option<Instant>>,
    /// The last step: seconds from bucket i's hand-over to the first bucket's (NaN: unknown).
    gap: Vec<f64>,
    /// Seconds one partition of bucket i took when last reduced (NaN: unknown).
    partition: Vec<f64>,
    /// Partitions of bucket i.
    parts: Vec<usize>,
    /// Seconds of forward, waits left out, before the forward needs bucket i (NaN: unknown).
    needed: Vec<f64>,
    /// Whether this step already waited for the first bucket past its deadline.
    timed_out: bool,
}

impl StepHistory {
    /// Nothing known yet of `buckets` buckets.
    pub fn new(buckets: usize) -> Self {
        Self {
            handed: vec![None; buckets],
            gap: vec![f64::NAN; buckets],
            partition: vec![f64::NAN; buckets],
            parts: vec![0; buckets],
            needed: vec![f64::NAN; buckets],
            timed_out: false,
        }
    }

    /// A step begins: no bucket handed over yet.
    pub fn begin_step(&mut self) {
        self.handed.fill(None);
        self.timed_out = false;
    }

    /// Backward handed bucket `b`, of `parts` partitions, over `at`; the forward before it
    /// needed it after `needed` seconds of its own (NaN: it had no gate for it this step, and
    /// the last value known stays).
    pub fn handed(&mut self, b: usize, at: Instant, parts: usize, needed: f64) {
        self.handed[b] = Some(at);
        self.parts[b] = parts;
        if needed.is_finite() {
            self.needed[b] = needed;
        }
    }

    /// A partition of bucket `b` took `took`.
    pub fn reduced(&mut self, b: usize, took: Duration) {
        self.partition[b] = took.as_secs_f64();
    }

    /// The waiting for the first bucket ran past its deadline: not again this step.
    pub fn timed_out(&mut self) {
        self.timed_out = true;
    }

    /// The step ends: its hand-overs become the last step's.
    pub fn end_step(&mut self) {
        let Some(Some(first)) = self.handed.last().copied() else {
            return;
        };
        for (gap, handed) in self.gap.iter_mut().zip(&self.handed) {
            *gap = handed.map_or(f64::NAN, |h| {
                first.saturating_duration_since(h).as_secs_f64()
            });
        }
    }

    /// Until when rank 0, free `now` and about to decide the partitions of buckets `decided`,
    /// should wait for the first bucket instead ([`FirstBucketWait`]), if it should; `left(b)`
    /// is how many partitions of bucket `b` are left this step (`None`: not handed over yet,
    /// so all of them, as many as in the last step). The first bucket's hand-over is predicted
    /// from the latest one of this step and the last step's gap between them; with no last
    /// step, or once a wait timed out this step, never.
    pub fn first_bucket_deadline(
        &self,
        now: Instant,
        decided: &[usize],
        left: impl Fn(usize) -> Option<usize>,
    ) -> Option<Instant> {
        let first = self.handed.len().checked_sub(1)?;
        if self.timed_out || self.handed[first].is_some() || decided.is_empty() {
            return None;
        }
        let (latest, at) = (0..first)
            .filter_map(|b| self.handed[b].map(|at| (b, at)))
            .max_by_key(|&(_, at)| at)?;
        let due = at + Duration::try_from_secs_f64(self.gap[latest]).ok()?;
        let in_decision = |b: usize| decided.iter().filter(|&&d| d == b).count() as f64;
        let wait = FirstBucketWait {
            due_in_s: due.saturating_duration_since(now).as_secs_f64(),
            first_s: self.parts[first] as f64 * self.partition[first],
            decided_s: decided.iter().map(|&b| self.partition[b]).sum(),
        };
        let buckets_left = (0..first).rev().filter_map(|b| {
            let parts = left(b).unwrap_or(self.parts[b]);
            (parts > 0).then(|| BucketLeft {
                link_s: parts as f64 * self.partition[b],
                decided_s: in_decision(b) * self.partition[b],
                needed_s: self.needed[b],
            })
        });
        let known = |v: f64| v.is_finite();
        let all_known = known(wait.first_s)
            && known(wait.decided_s)
            && buckets_left
                .clone()
                .all(|l| known(l.link_s) && known(l.needed_s));
        if !all_known || !wait.pays(buckets_left) {
            return None;
        }
        // Past twice the expected wait, or the decided partitions' own time, waiting is the
        // worse bet.
        let longest = (2.0 * wait.due_in_s).min(wait.decided_s);
        Some(now + Duration::from_secs_f64(longest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bucket indices 0, 1, 2, ...
    const IDS: [usize; 128] = {
        let mut ids = [0; 128];
        let mut i = 0;
        while i < ids.len() {
            ids[i] = i;
            i += 1;
        }
        ids
    };

    /// Partitions each a bucket of its own, every bucket needed at the forward's start.
    fn own_buckets<'a>(
        ready: &'a [f64],
        busy: &'a [f64],
        values: &'a [usize],
    ) -> StepPartitions<'a> {
        StepPartitions {
            ready,
            busy,
            values,
            bucket: &IDS[..ready.len()],
            needed: &[0.0; IDS.len()],
        }
    }

    /// vgg-small's end of step at 170 Mbit/s, in ms: bucket 0 (the last convolution, two
    /// partitions of 7 ms, which the next forward needs after 9.4 ms) handed over at 0,
    /// bucket 1 (the middle layers, 12.3 ms) at 5, the first bucket (0.3 ms) at 20.1, 0.8 ms
    /// after the link is free for bucket 0's second partition.
    #[test]
    fn the_link_waits_for_the_first_bucket_rather_than_start_a_long_late_partition() {
        let (ready, busy) = ([0.0, 0.0, 5.0, 20.1], [7.0, 7.0, 12.3, 0.3]);
        let p = StepPartitions {
            ready: &ready,
            busy: &busy,
            values: &[1; 4],
            bucket: &[0, 0, 1, 2],
            needed: &[9.4, 6.5, 0.0],
        };
        let o = priority_order(&p, 0);
        assert_eq!(o.order, vec![1, 2, 3, 0]);
        assert!(o.decides.iter().all(|&d| d));
        // Needed by the forward 0.5 ms in instead, it goes first.
        let soon = StepPartitions {
            needed: &[0.5, 2.0, 0.0],
            ..p
        };
        assert_eq!(priority_order(&soon, 0).order, vec![1, 2, 0, 3]);
        // Due later than the partition would take, or already here: no wait.
        let wait = FirstBucketWait {
            due_in_s: 0.8,
            first_s: 0.3,
            decided_s: 7.0,
        };
        let left = [BucketLeft {
            link_s: 7.0,
            decided_s: 7.0,
            needed_s: 9.4,
        }];
        assert!(wait.pays(left.iter().copied()));
        for due_in in [7.5, 0.0] {
            assert!(!FirstBucketWait {
                due_in_s: due_in,
                ..wait
            }
            .pays(left.iter().copied()));
        }
    }

    /// vgg-small at 150 Mbit/s: the first layer but one's bucket (2.15 ms) is free to go 1.3 ms
    /// before the first bucket; the next forward needs it 0.9 ms in, so it goes now.
    #[test]
    fn a_partition_the_next_forward_needs_early_goes_at_once() {
        let (ready, busy) = ([0.0, 0.5, 4.85], [3.55, 2.15, 0.35]);
        let p = StepPartitions {
            ready: &ready,
            busy: &busy,
            values: &[1; 3],
            bucket: &[0, 1, 2],
            needed: &[6.5, 0.9, 0.0],
        };
        assert_eq!(priority_order(&p, 0).order, vec![0, 1, 2]);
    }

    /// vgg-small at 150 Mbit/s, where the link is the bottleneck: a middle layer's partition
    /// (8.06 ms, needed 6.5 ms into the forward) could wait 2.7 ms for the first bucket, but
    /// then it and the last convolution's partition behind it (8.07 ms, needed at 9.4) are
    /// late by more than the forward would gain.
    #[test]
    fn a_busy_link_is_not_left_idle_when_the_buckets_behind_would_be_late() {
        let wait = FirstBucketWait {
            due_in_s: 2.7,
            first_s: 0.35,
            decided_s: 8.06,
        };
        let left = [
            BucketLeft {
                link_s: 8.06,
                decided_s: 8.06,
                needed_s: 6.5,
            },
            BucketLeft {
                link_s: 8.07,
                decided_s: 0.0,
                needed_s: 9.4,
            },
        ];
        assert!(!wait.pays(left.iter().copied()));
        // With nothing behind it, waiting pays.
        assert!(wait.pays(left[..1].iter().copied()));
    }

    #[test]
    fn the_forward_needs_each_bucket_after_its_own_time_not_its_waits() {
        let ms = |v: f64| Duration::from_secs_f64(v / 1e3);
        let base = Instant::now();
        let mut f = ForwardNeeds::new(3);
        f.begin_step();
        f.needs(2, base + ms(10.0));
        f.waited(ms(4.0));
        f.needs(1, base + ms(16.0));
        f.needs(0, base + ms(20.0));
        let needed: Vec<f64> = f.needed.iter().map(|s| s * 1e3).collect();
        for (got, want) in needed.iter().zip([6.0, 2.0, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{needed:?}");
        }
        // A new step measures from its own first gate; a bucket not reached is unknown, and
        // once backward hands a bucket over, gates (a drain's) are not the forward's.
        f.begin_step();
        f.needs(2, base + ms(50.0));
        f.needs(1, base + ms(53.0));
        f.close();
        f.needs(0, base + ms(90.0));
        assert!((f.needed[1] * 1e3 - 3.0).abs() < 1e-6);
        assert!(f.needed[0].is_nan());
    }

    #[test]
    fn rank_0_predicts_the_first_bucket_from_the_last_step_and_waits_at_most_twice_that() {
        let ms = |v: f64| Duration::from_secs_f64(v / 1e3);
        let base = Instant::now();
        let mut h = StepHistory::new(3);
        let none_here = |_: usize| None;
        // No last step: never.
        h.begin_step();
        h.handed(0, base, 2, f64::NAN);
        assert_eq!(
            h.first_bucket_deadline(base + ms(19.3), &[0], none_here),
            None
        );
        h.handed(1, base + ms(5.0), 1, f64::NAN);
        h.handed(2, base + ms(20.1), 1, f64::NAN);
        h.reduced(0, ms(7.0));
        h.reduced(1, ms(12.3));
        h.reduced(2, ms(0.3));
        h.end_step();
        // The next step, 40 ms on: bucket 1 handed over at 45 ms, so the first is due at
        // 60.1; at 59.3 the link is free and bucket 0's second partition is next.
        h.begin_step();
        h.handed(0, base + ms(40.0), 2, 9.4e-3);
        h.handed(1, base + ms(45.0), 1, 6.5e-3);
        // Bucket 0 has one partition left, bucket 1 is reduced, the first is not here.
        let left = |b: usize| [Some(1), Some(0), None][b];
        let now = base + ms(59.3);
        let deadline = h.first_bucket_deadline(now, &[0], left).expect("waits");
        let waits = deadline.duration_since(now).as_secs_f64() * 1e3;
        assert!((waits - 1.6).abs() < 1e-3, "{waits}");
        // Not for a partition that would end before the first bucket is due.
        assert_eq!(h.first_bucket_deadline(base + ms(52.0), &[0], left), None);
        // Not once it is here, nor again once a wait timed out.
        h.timed_out();
        assert_eq!(h.first_bucket_deadline(now, &[0], left), None);
        h.begin_step();
        h.handed(2, base + ms(80.0), 1, f64::NAN);
        assert_eq!(
            h.first_bucket_deadline(base + ms(79.0), &[0], none_here),
            None
        );
    }

    /// The order without a credit (one partition per decision, each decided).
    fn order(ready: &[f64], busy: &[f64]) -> Vec<usize> {
        let o = priority_order(&own_buckets(ready, busy, &vec![1; ready.len()]), 0);
        assert!(
            o.decides.iter().all(|&d| d),
            "every partition is decided alone"
        );
        o.order
    }

    #[test]
    fn a_credit_decides_several_partitions_input_first_and_the_late_wait_for_them() {
        // All ready at once, 10 values each, a credit of 25: the first decision takes 3, 2
        // and 1 (it stops once 30 >= 25), the second 0.
        let o = priority_order(&own_buckets(&[0.0; 4], &[1.0; 4], &[10; 4]), 25);
        assert_eq!(o.order, vec![3, 2, 1, 0]);
        assert_eq!(o.decides, vec![true, false, false, true]);
        // 2 becomes ready while 1 is reduced: alone it goes next, but a decision that named
        // 1 and 0 runs both first.
        let (ready, busy) = ([0.0, 0.0, 0.5], [1.0; 3]);
        assert_eq!(order(&ready, &busy), vec![1, 2, 0]);
        let o = priority_order(&own_buckets(&ready, &busy, &[10; 3]), 15);
        assert_eq!(o.order, vec![1, 0, 2]);
        assert_eq!(o.decides, vec![true, false, true]);
        // At most MAX_DECIDED partitions a decision, however large the credit.
        let n = MAX_DECIDED + 1;
        let (ready, busy) = (vec![0.0; n], vec![1.0; n]);
        let o = priority_order(&own_buckets(&ready, &busy, &vec![1; n]), usize::MAX);
        assert_eq!(o.decides.iter().filter(|&&d| d).count(), 2);
        assert!(o.decides[0] && o.decides[MAX_DECIDED]);
    }

    #[test]
    fn a_link_that_keeps_up_keeps_backward_order() {
        // Each reduction ends before the next bucket is ready.
        let ready = [1.0, 2.0, 3.0, 4.0];
        let busy = [0.5; 4];
        assert_eq!(order(&ready, &busy), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_backlog_goes_input_first() {
        // Bucket 0 takes the link for 10 s; 1, 2 and 3 are ready meanwhile and go input-first.
        let ready = [0.0, 1.0, 2.0, 3.0];
        let busy = [10.0, 1.0, 1.0, 1.0];
        assert_eq!(order(&ready, &busy), vec![0, 3, 2, 1]);
        // Ready at once: input-first from the start.
        assert_eq!(order(&[0.0; 3], &[1.0; 3]), vec![2, 1, 0]);
    }

    #[test]
    fn an_idle_link_waits_for_the_next_bucket() {
        // 2 is ready while 0 is reduced, 1 only later: 2 goes before 1.
        let ready = [0.0, 5.0, 0.5];
        let busy = [1.0, 1.0, 1.0];
        assert_eq!(order(&ready, &busy), vec![0, 2, 1]);
    }

    #[test]
    fn partitions_cover_a_bucket_in_order_and_schedules_parse() {
        for (len, partition) in [(10, 3), (7, 7), (5, 0), (0, 4), (1000, 1)] {
            let parts = partition_count(len, partition);
            assert!(parts >= 1);
            let ranges: Vec<_> = (0..parts).map(|p| partition_range(len, parts, p)).collect();
            assert_eq!(ranges.first().unwrap().start, 0);
            assert_eq!(ranges.last().unwrap().end, len);
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            if partition > 0 {
                assert!(
                    ranges.iter().all(|r| r.len() <= partition),
                    "{len} {partition}"
                );
            }
        }
        assert!(Schedule::parse("fifo").is_err());
        assert_eq!(Schedule::parse("priority"), Ok(Schedule::Priority));
        assert!(priority_refusal(false, false, false).is_some());
        assert!(priority_refusal(true, true, false).is_some());
        assert!(priority_refusal(true, false, true).is_some());
        assert!(priority_refusal(true, false, false).is_none());
    }
}
