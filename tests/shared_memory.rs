//! The shared-memory collective (`dptrain::comm::shared_memory`): the redundant mode's bits
//! on every worker, buffers of any length, collectives back to back, and every way a worker
//! can fail ending the others' collective with an error that names it, never a hang.

use dptrain::comm::{
    all_reduce_sum, shared_memory_all_reduce_sum, CommError, CommMode, InProcessFabric, LinkModel,
    Ownership, Transport,
};
use std::time::{Duration, Instant};

/// The collective sums in blocks of this many elements (`shared_memory::BLOCK`): lengths past
/// it cross a block boundary.
const BLOCK: usize = 2048;

fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.37 - 2.9 + rank as f32 * 1e-3)
        .collect()
}

/// The shared-memory all-reduce by one path: the one `all_reduce_sum` picks (one barrier for
/// small buffers when workers outnumber cores), or either of them forced, so both are tested
/// on any machine.
#[derive(Clone, Copy, Debug)]
enum Path {
    Picked,
    OneBarrier,
    TwoBarriers,
}

const PATHS: [Path; 3] = [Path::Picked, Path::OneBarrier, Path::TwoBarriers];

fn shm_sum(path: Path, t: &dyn Transport, buf: &mut [f32], tag: u64) -> Result<(), CommError> {
    let shm = t
        .shared_memory()
        .expect("an in-process fabric shares memory");
    match path {
        Path::Picked => shared_memory_all_reduce_sum(t, buf, tag),
        Path::OneBarrier => shm.staged_sum(buf, tag),
        Path::TwoBarriers => shm.two_barrier_sum(buf, tag),
    }
}

/// Every worker's result of `op` on its own input, as bits, over one fabric.
fn on_all(
    workers: usize,
    len: usize,
    op: &(dyn Fn(&dyn Transport, &mut Vec<f32>) + Sync),
) -> Vec<Vec<u32>> {
    let eps = InProcessFabric::new(workers, None, Duration::from_secs(10));
    std::thread::scope(|s| {
        let handles: Vec<_> = eps
            .iter()
            .map(|t| {
                s.spawn(move || {
                    let mut buf = input(t.rank(), len);
                    op(t, &mut buf);
                    buf.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn gives_the_redundant_modes_bits_on_every_worker_for_every_size_and_worker_count() {
    // Lengths not divisible by the worker count, shorter than it, and past one block.
    for workers in 1..=8 {
        for len in [1, 2, 7, 37, 1000, 2 * BLOCK + 3, 5 * BLOCK] {
            let redundant = on_all(workers, len, &|t, b| {
                all_reduce_sum(CommMode::Redundant, t, b, 0, &mut Vec::new()).unwrap()
            });
            for path in PATHS {
                let shm = on_all(workers, len, &|t, b| {
                    // Three times: the later collectives reuse the barrier and the other
                    // staging buffer, then the first again.
                    for tag in 0..3 {
                        *b = input(t.rank(), b.len());
                        shm_sum(path, t, b, tag).unwrap();
                    }
                });
                assert_eq!(shm, redundant, "{workers} workers, {len} floats, {path:?}");
            }
        }
    }
}

#[test]
fn buckets_of_several_steps_in_a_row_never_deadlock() {
    // Sizes that change from collective to collective, as a step's buckets do, and no
    // pause between steps: a worker that leaves one collective enters the next at once.
    let sizes = [5usize, 4096, 1, 333, 70_000, 2];
    let got = on_all(4, 1, &|t, b| {
        let mut bufs: Vec<Vec<f32>> = sizes.iter().map(|&n| input(t.rank(), n)).collect();
        for step in 0..50u64 {
            for (i, buf) in bufs.iter_mut().enumerate() {
                shared_memory_all_reduce_sum(t, buf, step << 16 | i as u64).unwrap();
                buf.iter_mut().for_each(|x| *x *= 0.25);
            }
        }
        *b = bufs.concat();
    });
    assert!(got.iter().all(|g| *g == got[0]));
}

#[test]
fn one_and_two_barrier_collectives_interleave_with_every_sum_right_and_no_deadlock() {
    // A staging buffer is rewritten two barriers after it was read: whatever mix of paths
    // and whichever worker is late, no worker reads a copy overwritten by the next
    // collective. Workers take turns to be slow.
    let lens = [300usize, 5000, 1, 70_000, 64];
    let workers = 4;
    let expected: Vec<Vec<Vec<u32>>> = lens
        .iter()
        .map(|&len| {
            on_all(workers, len, &|t, b| {
                all_reduce_sum(CommMode::Redundant, t, b, 0, &mut Vec::new()).unwrap()
            })
        })
        .collect();
    let ok = on_all(workers, 1, &|t, b| {
        let mut right = true;
        for round in 0..200usize {
            let which = round % lens.len();
            let path = [Path::OneBarrier, Path::OneBarrier, Path::TwoBarriers][round % 3];
            let mut buf = input(t.rank(), lens[which]);
            if round % workers == t.rank() {
                std::thread::sleep(Duration::from_micros(200));
            }
            shm_sum(path, t, &mut buf, round as u64).unwrap();
            let bits: Vec<u32> = buf.iter().map(|x| x.to_bits()).collect();
            right &= bits == expected[which][t.rank()];
        }
        b[0] = if right { 1.0 } else { 0.0 };
    });
    assert!(
        ok.iter().all(|r| r[0] == 1f32.to_bits()),
        "a sum went wrong: {ok:?}"
    );
}

#[test]
fn a_worker_that_is_gone_ends_the_others_collective_at_once_naming_it() {
    for path in PATHS {
        a_gone_worker_is_named(path);
    }
}

fn a_gone_worker_is_named(path: Path) {
    let mut eps = InProcessFabric::new(3, None, Duration::from_secs(30));
    drop(eps.remove(2));
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in &eps {
            s.spawn(move || {
                let err = shm_sum(path, t, &mut vec![1.0; 100], 9).unwrap_err();
                assert!(
                    matches!(
                        err,
                        CommError::PeerGone {
                            peer: 2,
                            tag: 9,
                            ..
                        }
                    ),
                    "{path:?}: {err}"
                );
            });
        }
    });
    assert!(started.elapsed() < Duration::from_secs(5), "{path:?}");
}

#[test]
fn the_timeout_names_the_worker_that_did_not_arrive() {
    for path in PATHS {
        the_absent_worker_is_named(path);
    }
}

fn the_absent_worker_is_named(path: Path) {
    // Workers 0 and 2 arrive; worker 1 keeps its endpoint and never calls.
    let eps = InProcessFabric::new(3, None, Duration::from_millis(100));
    let errs: Vec<CommError> = std::thread::scope(|s| {
        let handles: Vec<_> = [&eps[0], &eps[2]]
            .into_iter()
            .map(|t| s.spawn(move || shm_sum(path, t, &mut [1.0; 8], 6)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap_err())
            .collect()
    });
    // The first to time out names worker 1; the other may see it withdraw instead.
    assert!(
        errs.iter()
            .any(|e| matches!(e, CommError::Timeout { from: 1, .. })),
        "{errs:?}"
    );
    for e in &errs {
        assert!(
            matches!(
                e,
                CommError::Timeout { from: 1, .. } | CommError::PeerGone { .. }
            ),
            "{e}"
        );
    }
}

#[test]
fn a_worker_that_never_arrives_times_out_and_later_collectives_refuse() {
    let eps = InProcessFabric::new(2, None, Duration::from_millis(100));
    let err = shared_memory_all_reduce_sum(&eps[0], &mut [1.0; 8], 4).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::Timeout {
                rank: 0,
                from: 1,
                tag: 4,
                ..
            }
        ),
        "{err}"
    );
    // The group failed for good: rank 1 arriving now is refused, not left waiting.
    let err = shared_memory_all_reduce_sum(&eps[1], &mut [1.0; 8], 5).unwrap_err();
    assert!(matches!(err, CommError::PeerGone { peer: 0, .. }), "{err}");
}

#[test]
fn a_worker_that_fails_between_the_barriers_fails_everyones_collective() {
    let eps = InProcessFabric::new(3, None, Duration::from_secs(30));
    let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
        let handles: Vec<_> = eps
            .iter()
            .map(|t| {
                s.spawn(move || {
                    let shm = t.shared_memory().unwrap();
                    let mut buf = vec![1.0; 64];
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        shm.collective(&mut buf, 1, Ownership::Chunks, |part| {
                            if t.rank() == 1 {
                                panic!("injected between the barriers");
                            }
                            part.sum_to_all();
                            Ok(())
                        })
                    }))
                    .unwrap_or(Err(CommError::ThreadPanicked("rank 1".into())))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.iter().enumerate() {
        match (r, res) {
            (1, Err(CommError::ThreadPanicked(_))) => {}
            (_, Err(CommError::PeerGone { peer: 1, .. })) => {}
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn unequal_buffers_are_refused_on_every_worker() {
    // Also when the lengths would send workers down different paths (one staged, one not):
    // every worker checks the lengths at the same barrier, before either path goes on.
    for (path_of, lens) in [
        ([Path::Picked; 2], [10, 11]),
        ([Path::OneBarrier, Path::TwoBarriers], [10, 100_000]),
        ([Path::TwoBarriers, Path::OneBarrier], [10, 100_000]),
    ] {
        let eps = InProcessFabric::new(2, None, Duration::from_secs(10));
        std::thread::scope(|s| {
            for t in &eps {
                s.spawn(move || {
                    let mut buf = vec![1.0; lens[t.rank()]];
                    let err = shm_sum(path_of[t.rank()], t, &mut buf, 3).unwrap_err();
                    assert!(matches!(err, CommError::SizeMismatch { .. }), "{err}");
                    assert!(buf.iter().all(|&x| x == 1.0), "a buffer was touched");
                });
            }
        });
    }
}

#[test]
fn an_emulated_link_offers_no_shared_memory() {
    let link = LinkModel {
        bandwidth_bytes_per_s: 1e9,
        latency: Duration::ZERO,
    };
    let eps = InProcessFabric::new(2, Some(link), Duration::from_secs(1));
    assert!(eps[0].shared_memory().is_none());
    let err = shared_memory_all_reduce_sum(&eps[0], &mut [1.0], 0).unwrap_err();
    assert!(matches!(err, CommError::Unsupported { .. }), "{err}");
}
