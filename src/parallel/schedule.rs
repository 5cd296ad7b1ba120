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
//! The credit (ByteScheduler's, `--credit-kb`) is what one decision of rank 0 commits every
//! rank to: the partitions, input-first among the buckets rank 0 holds, up to the credit's
//! bytes (at least one). By default one partition: a partition that became urgent waits at most
//! for the one under way, and each partition costs a decision message. A larger credit sends
//! fewer decisions, and an urgent partition waits for up to the credit. The communication
//! thread still runs one collective at a time (the transports order messages by pair).

use std::fmt;

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
             per decision, is --credit-kb unset)"
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

/// The order in which to reduce partitions under priority scheduling, from when each is ready
/// (`ready[i]`, seconds from the start of the step), how long its reduction takes (`busy[i]`)
/// and its values (`values[i]`). Partitions are indexed in the order backward fills their
/// buckets, each bucket's in buffer order, so a higher index is nearer the input and goes
/// first among those ready. One collective at a time, none interrupted: whenever the
/// communication thread is free it decides, taking the ready partitions of highest index up to
/// `credit` values (at least one, at most [`MAX_DECIDED`]; `credit` 0: one), or waits for the
/// next one to become ready; the partitions decided then run one after the other.
///
/// When the link keeps up, every bucket is done before the next is ready and this is the
/// order backward fills them (`--schedule overlap`'s); when a backlog builds, the buckets left
/// at the end of backward go input-first. This is the communication thread's rule (rank 0's
/// choice in the reducer's `PriorityStep`) run in virtual time: the simulator orders its
/// partitions with it.
pub fn priority_order(
    ready: &[f64],
    busy: &[f64],
    values: &[usize],
    credit: usize,
) -> PriorityOrder {
    assert!(
        ready.len() == busy.len() && ready.len() == values.len(),
        "one time and size of each per partition"
    );
    let n = ready.len();
    let mut done = vec![false; n];
    let mut out = PriorityOrder {
        order: Vec::with_capacity(n),
        decides: Vec::with_capacity(n),
    };
    let mut now = 0.0f64;
    while out.order.len() < n {
        if !(0..n).any(|i| !done[i] && ready[i] <= now) {
            // Idle until the next partition is ready (the earliest).
            let i = (0..n)
                .filter(|&i| !done[i])
                .min_by(|&a, &b| ready[a].total_cmp(&ready[b]))
                .expect("a partition is left");
            now = ready[i];
        }
        // One decision: input-first among those ready now, up to the credit.
        let (mut taken, mut taken_values) = (0, 0usize);
        for i in (0..n).rev() {
            if done[i] || ready[i] > now {
                continue;
            }
            if decision_full(taken, taken_values, credit) {
                break;
            }
            done[i] = true;
            out.order.push(i);
            out.decides.push(taken == 0);
            taken += 1;
            taken_values = taken_values.saturating_add(values[i]);
        }
        let decided = out.order.len() - taken..out.order.len();
        now += out.order[decided]
            .iter()
            .map(|&i| busy[i].max(0.0))
            .sum::<f64>();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order without a credit (one partition per decision, each decided).
    fn order(ready: &[f64], busy: &[f64]) -> Vec<usize> {
        let o = priority_order(ready, busy, &vec![1; ready.len()], 0);
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
        let o = priority_order(&[0.0; 4], &[1.0; 4], &[10; 4], 25);
        assert_eq!(o.order, vec![3, 2, 1, 0]);
        assert_eq!(o.decides, vec![true, false, false, true]);
        // 2 becomes ready while 1 is reduced: alone it goes next, but a decision that named
        // 1 and 0 runs both first.
        let (ready, busy) = ([0.0, 0.0, 0.5], [1.0; 3]);
        assert_eq!(order(&ready, &busy), vec![1, 2, 0]);
        let o = priority_order(&ready, &busy, &[10; 3], 15);
        assert_eq!(o.order, vec![1, 0, 2]);
        assert_eq!(o.decides, vec![true, false, true]);
        // At most MAX_DECIDED partitions a decision, however large the credit.
        let n = MAX_DECIDED + 1;
        let o = priority_order(&vec![0.0; n], &vec![1.0; n], &vec![1; n], usize::MAX);
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
