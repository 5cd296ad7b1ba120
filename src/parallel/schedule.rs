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

/// The order in which to reduce partitions under priority scheduling, from when each is ready
/// (`ready[i]`, seconds from the start of the step) and how long its reduction takes
/// (`busy[i]`). Partitions are indexed in the order backward fills their buckets, each
/// bucket's in buffer order, so a higher index is nearer the input and goes first among those
/// ready. One collective at a time, none
/// interrupted: whenever the communication thread is free it takes the ready bucket of highest
/// index, or waits for the next one to become ready.
///
/// When the link keeps up, every bucket is done before the next is ready and this is the
/// order backward fills them (`--schedule overlap`'s); when a backlog builds, the buckets left
/// at the end of backward go input-first. This is the communication thread's rule (rank 0's
/// choice in the reducer's `PriorityStep`) run in virtual time: the simulator orders its
/// partitions with it.
pub fn priority_order(ready: &[f64], busy: &[f64]) -> Vec<usize> {
    assert_eq!(ready.len(), busy.len(), "one time of each per bucket");
    let n = ready.len();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut now = 0.0f64;
    while order.len() < n {
        let pick = (0..n).rev().find(|&i| !done[i] && ready[i] <= now);
        let next = match pick {
            Some(i) => i,
            None => {
                // Idle until the next bucket is ready (the earliest; on a tie, the nearer the
                // input).
                let i = (0..n)
                    .filter(|&i| !done[i])
                    .min_by(|&a, &b| ready[a].total_cmp(&ready[b]).then(b.cmp(&a)))
                    .expect("a bucket is left");
                now = ready[i];
                i
            }
        };
        done[next] = true;
        order.push(next);
        now += busy[next].max(0.0);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_that_keeps_up_keeps_backward_order() {
        // Each reduction ends before the next bucket is ready.
        let ready = [1.0, 2.0, 3.0, 4.0];
        let busy = [0.5; 4];
        assert_eq!(priority_order(&ready, &busy), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_backlog_goes_input_first() {
        // Bucket 0 takes the link for 10 s; 1, 2 and 3 are ready meanwhile and go input-first.
        let ready = [0.0, 1.0, 2.0, 3.0];
        let busy = [10.0, 1.0, 1.0, 1.0];
        assert_eq!(priority_order(&ready, &busy), vec![0, 3, 2, 1]);
        // Ready at once: input-first from the start.
        assert_eq!(priority_order(&[0.0; 3], &[1.0; 3]), vec![2, 1, 0]);
    }

    #[test]
    fn an_idle_link_waits_for_the_next_bucket() {
        // 2 is ready while 0 is reduced, 1 only later: 2 goes before 1.
        let ready = [0.0, 5.0, 0.5];
        let busy = [1.0, 1.0, 1.0];
        assert_eq!(priority_order(&ready, &busy), vec![0, 2, 1]);
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
