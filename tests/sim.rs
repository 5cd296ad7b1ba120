//! The step simulator: recorded schedules against the real traffic and the alpha-beta
//! formulas, the symmetric shortcut against every rank simulated, the topology's links, the
//! limits at scale, stragglers, overlap, and profiles.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dptrain::comm::record::{record_rank, Event};
use dptrain::comm::{
    cost_terms, predicted_time, AcrossOp, CommError, CommMode, Hierarchy, InProcessFabric,
    LinkModel, Transport, WireFormat,
};
use dptrain::measure::profile::ProfileError;
use dptrain::model::reference_graph;
use dptrain::parallel::BucketOp;
use dptrain::plan::{BucketFlags, CommChoice, HierarchyChoice};
use dptrain::sim::{
    from_graph, search_buckets, simulate_step, BlockProfile, DeviceSpec, DeviceSpeed, Job, Profile,
    Simulator, StepConfig, StepResult, Stragglers, Topology,
};

fn link(bw: f64, lat_us: u64) -> LinkModel {
    LinkModel {
        bandwidth_bytes_per_s: bw,
        latency: Duration::from_micros(lat_us),
    }
}

/// A transport that forwards to a real one and notes every send and receive, as
/// [`dptrain::comm::record::RecordingTransport`] would.
struct Tap<'a> {
    inner: &'a dyn Transport,
    log: Mutex<Vec<Event>>,
}

impl Transport for Tap<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.log.lock().unwrap().push(Event::Send {
            to,
            elems: data.len(),
        });
        self.inner.send(to, tag, data)
    }
    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.log.lock().unwrap().push(Event::Recv {
            from,
            elems: out.len(),
        });
        self.inner.recv(from, tag, out)
    }
}

/// Every job the trainer's communication threads run over `world` ranks.
fn jobs(world: usize) -> Vec<Job> {
    let mut v: Vec<Job> = CommMode::ALL
        .iter()
        .map(|&m| Job::Bucket(BucketOp::AllReduce(m), WireFormat::F32))
        .collect();
    v.push(Job::Bucket(BucketOp::ReduceToRoot, WireFormat::F32));
    v.push(Job::WeightBroadcast);
    for w in 2..world {
        if world.is_multiple_of(w) {
            for hierarchy in Hierarchy::ALL {
                for m in CommMode::ALL {
                    let op = BucketOp::Hierarchical {
                        hierarchy,
                        across: AcrossOp::AllReduce(m),
                        workers_per_process: w,
                    };
                    v.push(Job::Bucket(op, WireFormat::F32));
                }
            }
        }
    }
    // Compressed, every message is half as long (in f32 carriers) and still an exact fraction.
    let compressed: Vec<Job> = v
        .iter()
        .filter_map(|j| match *j {
            Job::Bucket(op, _) => Some(Job::Bucket(op, WireFormat::F16)),
            Job::WeightBroadcast => None,
        })
        .collect();
    v.extend(compressed);
    v
}

/// Each rank's messages when `job` really runs on `world` threads over the in-process fabric.
fn real_traffic(job: Job, world: usize, len: usize) -> Vec<Vec<Event>> {
    let eps = InProcessFabric::new(world, None, Duration::from_secs(20));
    std::thread::scope(|s| {
        let handles: Vec<_> = eps
            .iter()
            .map(|t| {
                s.spawn(move || {
                    let tap = Tap {
                        inner: t,
                        log: Mutex::new(Vec::new()),
                    };
                    let mut buf: Vec<f32> = (0..len).map(|i| (i + t.rank()) as f32).collect();
                    job.run(&tap, &mut buf, &mut Vec::new()).unwrap();
                    tap.log.into_inner().unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn recorded_schedules_are_the_real_traffic() {
    // Recording one rank alone, without moving data, gives exactly the messages that rank
    // sends and receives when every rank runs the algorithm for real.
    for world in [2usize, 3, 4, 5, 6, 8] {
        for job in jobs(world) {
            for len in [1usize, 7, 64] {
                let real = real_traffic(job, world, len);
                for (r, got) in real.iter().enumerate() {
                    let rec =
                        record_rank(world, r, len, 1 << 20, |t, b, s| job.run(t, b, s)).unwrap();
                    assert_eq!(&rec, got, "{job} over {world}, {len} elements, rank {r}");
                }
            }
        }
    }
}

#[test]
fn a_recording_at_the_exact_length_scales_to_any_length() {
    // The simulator records once at `exact_len` and scales messages by the bucket's size: the
    // scaled sizes are within one element of the algorithm's own at every length.
    for world in [2usize, 3, 5, 6, 8, 12] {
        for job in jobs(world) {
            let exact = job.exact_len(world).unwrap();
            for len in [exact, 2 * exact, 1000, 12_345] {
                for r in 0..world {
                    let run = |t: &dyn Transport, b: &mut [f32], s: &mut Vec<f32>| job.run(t, b, s);
                    let at_len = record_rank(world, r, len, 1 << 20, run).unwrap();
                    let at_exact = record_rank(world, r, exact, 1 << 20, run).unwrap();
                    assert_eq!(at_len.len(), at_exact.len(), "{job} over {world}");
                    for (a, b) in at_len.iter().zip(&at_exact) {
                        let (pa, ea, pb, eb) = match (a, b) {
                            (Event::Send { to: x, elems: e }, Event::Send { to: y, elems: f })
                            | (
                                Event::Recv { from: x, elems: e },
                                Event::Recv { from: y, elems: f },
                            ) => (x, e, y, f),
                            _ => panic!("{job} over {world}: {a:?} vs {b:?}"),
                        };
                        assert_eq!(pa, pb);
                        let scaled = *eb as f64 * len as f64 / exact as f64;
                        // Two dimensions round twice: the shard, then the mode's chunk of it.
                        let two_d = matches!(
                            job,
                            Job::Bucket(
                                BucketOp::Hierarchical {
                                    hierarchy: Hierarchy::TwoD,
                                    ..
                                },
                                _
                            )
                        );
                        assert!(
                            (*ea as f64 - scaled).abs() < if two_d { 2.0 } else { 1.0 },
                            "{job} over {world}, {len} elements, rank {r}: {ea} vs {scaled}"
                        );
                    }
                }
            }
        }
    }
    assert!(Job::Bucket(BucketOp::Native, WireFormat::F32)
        .exact_len(4)
        .unwrap_err()
        .contains("MPI's own"));
}

/// A profile without compute whose gradients are one block of `bytes` bytes.
fn comm_only(bytes: usize) -> Profile {
    Profile {
        model: "comm-only".into(),
        source: "test".into(),
        batch: 1,
        input: [1, 1, 1],
        blocks: vec![BlockProfile {
            name: "b".into(),
            forward_ms: 0.0,
            backward_ms: 0.0,
            param_sizes: vec![bytes / 4],
            matrices: None,
            input_grad_ms: None,
            macs_per_sample: 0,
        }],
        update_ms: 0.0,
        compute_spread: None,
    }
}

fn cfg(topology: Topology, comm: CommChoice, overlap: bool, cap_kb: Option<usize>) -> StepConfig {
    StepConfig {
        compress: dptrain::plan::CompressChoice::NONE,
        schedule: dptrain::parallel::Schedule::Overlap,
        partition_kb: None,
        credit_kb: None,
        topology,
        comm,
        hierarchy: HierarchyChoice::Auto,
        overlap,
        buckets: BucketFlags {
            first_kb: cap_kb,
            kb: cap_kb,
        },
        planning_link: None,
        planning_intra: None,
        stragglers: Stragglers::NONE,
    }
}

/// Everything in one bucket.
const ONE_BUCKET: Option<usize> = Some(1 << 30);

#[test]
fn recorded_schedules_reproduce_the_alpha_beta_formulas() {
    // One bucket, no compute, one port per worker: the simulated time of each algorithm's
    // recorded schedule is the cost model's formula.
    let links = [link(1e9, 10), link(125e6, 50), link(10e9, 0)];
    let mut sim = Simulator::new();
    for l in &links {
        for world in [2usize, 3, 4, 5, 6, 7, 8, 12, 16, 33, 64, 128] {
            for bytes in [4usize, 4096, 12_344, 1 << 20, 10_000_000] {
                for mode in CommMode::ALL {
                    let c = cfg(
                        Topology::flat(world, *l),
                        CommChoice::Fixed(mode),
                        true,
                        ONE_BUCKET,
                    );
                    // Tree mode's buckets are reduce-to-root + broadcast of the weights: the
                    // tree all-reduce's two halves, run as the trainer runs them.
                    let r = sim.step(&comm_only(bytes), &c).unwrap();
                    let sim_s = r.step_ms / 1e3;
                    let t = cost_terms(mode, world, bytes);
                    let exact = t.latency_terms * l.latency.as_secs_f64()
                        + t.serialized_bytes / l.bandwidth_bytes_per_s;
                    let predicted = predicted_time(mode, world, bytes, l).as_secs_f64();
                    let what = format!(
                        "{mode} N={world} {bytes} B {l:?}: sim {sim_s} formula {exact} model \
                         {predicted}"
                    );
                    if mode == CommMode::Tree && !world.is_power_of_two() {
                        // The formula charges every round a full critical path; off a power of
                        // two some subtrees are shallower, and the schedule finishes earlier.
                        // The cost model walks the tree, so it sees them.
                        assert!(sim_s <= exact * (1.0 + 1e-9), "{what}");
                        assert!(sim_s >= 0.5 * exact, "{what}");
                        assert!(predicted <= exact * (1.0 + 1e-9) + 2e-9, "{what}");
                        assert!((predicted - sim_s).abs() <= 0.10 * sim_s + 2e-9, "{what}");
                        continue;
                    }
                    assert!((exact - predicted).abs() <= 2e-9, "{what}");
                    if mode == CommMode::HalvingDoubling && !world.is_power_of_two() {
                        // The ranks that skip the fold-in run ahead, and their early sends can
                        // hold a lagging rank's receive port; the formula ignores that port
                        // contention.
                        assert!(sim_s >= exact * (1.0 - 1e-9), "{what}");
                        assert!(sim_s <= exact * 1.01, "{what}");
                    } else {
                        assert!((sim_s - exact).abs() <= 1e-9 * exact.max(1e-6), "{what}");
                    }
                }
            }
        }
    }
}

/// A profile with uneven blocks, some without parameters.
fn uneven() -> Profile {
    let spec: [(f64, f64, &[usize]); 6] = [
        (1.0, 2.0, &[1000, 10]),
        (0.5, 1.5, &[]),
        (2.0, 3.0, &[200_000, 100]),
        (0.2, 0.4, &[5000]),
        (1.0, 2.0, &[300_000, 300]),
        (0.1, 0.3, &[20_000, 10]),
    ];
    Profile {
        model: "uneven".into(),
        source: "test".into(),
        batch: 8,
        input: [3, 8, 8],
        blocks: spec
            .iter()
            .enumerate()
            .map(|(i, (f, b, p))| BlockProfile {
                name: format!("b{i}"),
                forward_ms: *f,
                backward_ms: *b,
                param_sizes: p.to_vec(),
                matrices: None,
                input_grad_ms: None,
                macs_per_sample: 0,
            })
            .collect(),
        update_ms: 0.7,
        compute_spread: None,
    }
}

fn cluster(hosts: usize, d: usize) -> Topology {
    Topology {
        hosts,
        devices_per_host: d,
        intra: link(20e9, 2),
        nic: link(1.25e9, 15),
        overhead: Duration::from_micros(3),
        step_overhead: Duration::ZERO,
    }
}

fn all_comms() -> Vec<CommChoice> {
    let mut v: Vec<CommChoice> = CommMode::ALL
        .iter()
        .map(|&m| CommChoice::Fixed(m))
        .collect();
    v.push(CommChoice::Auto);
    v
}

fn close(a: &StepResult, b: &StepResult) -> bool {
    let c = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-3);
    c(a.step_ms, b.step_ms) && c(a.exposed_ms, b.exposed_ms) && c(a.comm_ms, b.comm_ms)
}

/// Every `--hierarchical` setting.
const HIERARCHIES: [HierarchyChoice; 4] = [
    HierarchyChoice::Auto,
    HierarchyChoice::Fixed(Hierarchy::TwoD),
    HierarchyChoice::Fixed(Hierarchy::Leader),
    HierarchyChoice::Off,
];

#[test]
fn one_host_of_a_symmetric_schedule_stands_for_all() {
    // Simulating host 0's ranks (and mapping what the others send to it) gives the same step as
    // simulating every rank, for every mode, flat and hierarchical, overlap on and off.
    let p = uneven();
    let mut symmetric_seen = 0;
    for (hosts, d) in [
        (4, 1),
        (8, 1),
        (5, 1),
        (4, 2),
        (2, 4),
        (8, 2),
        (6, 2),
        (3, 3),
        (4, 4),
    ] {
        let topo = cluster(hosts, d);
        for comm in all_comms() {
            for hierarchy in HIERARCHIES {
                for overlap in [true, false] {
                    for cap in [None, Some(0), ONE_BUCKET] {
                        let c = StepConfig {
                            hierarchy,
                            ..cfg(topo, comm, overlap, cap)
                        };
                        let fast = Simulator::new().step(&p, &c).unwrap();
                        let full = Simulator::new().every_rank().step(&p, &c).unwrap();
                        assert_eq!(full.simulated_ranks, hosts * d);
                        let what = format!(
                            "{hosts}x{d} {comm} hier={hierarchy} overlap={overlap} cap={cap:?}: \
                             {fast:?} vs {full:?}"
                        );
                        assert!(close(&fast, &full), "{what}");
                        if fast.simulated_ranks < full.simulated_ranks {
                            assert_eq!(fast.simulated_ranks, d, "{what}");
                            symmetric_seen += 1;
                        }
                    }
                }
            }
        }
    }
    // Ring, redundant and hd on powers of two did take the shortcut.
    assert!(symmetric_seen > 200, "{symmetric_seen}");
}

#[test]
fn the_links_and_the_shared_nic_cost_what_the_port_model_says() {
    let s = 8_000_000usize;
    let sf = s as f64;
    let topo = Topology {
        hosts: 2,
        devices_per_host: 4,
        intra: link(20e9, 2),
        nic: link(1e9, 30),
        overhead: Duration::from_micros(5),
        step_overhead: Duration::ZERO,
    };
    let (ai, an) = (7e-6, 35e-6);
    let (bi, bn) = (1.0 / 20e9, 1.0 / 1e9);
    // Leader ring: 3 buffers into the leader's port, a 2-leader ring of two half-buffer
    // rounds over the NICs, 3 buffers out of the leader's port.
    let c = StepConfig {
        hierarchy: HierarchyChoice::Fixed(Hierarchy::Leader),
        ..cfg(topo, CommChoice::Fixed(CommMode::Ring), true, ONE_BUCKET)
    };
    let r = simulate_step(&comm_only(s), &c).unwrap();
    let want = (3.0 * sf * bi + ai) + 2.0 * (sf / 2.0 * bn + an) + (3.0 * sf * bi + ai);
    assert!(
        (r.step_ms / 1e3 - want).abs() < 1e-9,
        "{} vs {want}",
        r.step_ms / 1e3
    );
    // 2-D ring: 3 quarter-buffers through every port each way; between, 4 rings of 2 rounds
    // of eighths share each NIC (8 eighths through it, the last one's latency after).
    let c = StepConfig {
        hierarchy: HierarchyChoice::Fixed(Hierarchy::TwoD),
        ..cfg(topo, CommChoice::Fixed(CommMode::Ring), true, ONE_BUCKET)
    };
    let r = simulate_step(&comm_only(s), &c).unwrap();
    let want = 2.0 * (0.75 * sf * bi + ai) + (sf * bn + an);
    assert!(
        (r.step_ms / 1e3 - want).abs() < 1e-9,
        "{} vs {want}",
        r.step_ms / 1e3
    );
    assert_eq!(r.simulated_ranks, 4);
    // Flat redundant: each worker sends its buffer to the 4 workers of the other host through
    // its host's one NIC, which the host's 4 workers share: 16 buffers per NIC, then the last
    // message's latency.
    let c = StepConfig {
        hierarchy: HierarchyChoice::Off,
        ..cfg(
            topo,
            CommChoice::Fixed(CommMode::Redundant),
            true,
            ONE_BUCKET,
        )
    };
    let r = simulate_step(&comm_only(s), &c).unwrap();
    let want = 16.0 * sf * bn + an;
    assert!(
        (r.step_ms / 1e3 - want).abs() < 1e-9,
        "{} vs {want}",
        r.step_ms / 1e3
    );
    // The same workers, one per host: 7 buffers through each port.
    let flat = Topology::flat(8, topo.nic);
    let r = simulate_step(
        &comm_only(s),
        &cfg(
            flat,
            CommChoice::Fixed(CommMode::Redundant),
            true,
            ONE_BUCKET,
        ),
    )
    .unwrap();
    let want = 7.0 * sf * bn + 30e-6;
    assert!(
        (r.step_ms / 1e3 - want).abs() < 1e-9,
        "{} vs {want}",
        r.step_ms / 1e3
    );
}

#[test]
fn the_trainers_rules_choose_buckets_and_operations() {
    let p = uneven();
    let topo = cluster(4, 2);
    // Several hosts of several workers reduce hierarchically (2-D by default), else flat.
    for (hier, want) in [
        (HierarchyChoice::Auto, "2d:ring"),
        (HierarchyChoice::Fixed(Hierarchy::Leader), "leader:ring"),
        (HierarchyChoice::Off, "ring"),
    ] {
        let c = StepConfig {
            hierarchy: hier,
            ..cfg(topo, CommChoice::Fixed(CommMode::Ring), true, None)
        };
        let (_, ops) = dptrain::sim::plan(&p, &c).unwrap();
        assert!(ops.iter().all(|o| o.to_string() == want), "{ops:?}");
    }
    // Tree mode reduces to the root, which updates and broadcasts (flat, always).
    let c = cfg(topo, CommChoice::Fixed(CommMode::Tree), true, None);
    let (_, ops) = dptrain::sim::plan(&p, &c).unwrap();
    assert!(ops.iter().all(|o| *o == BucketOp::ReduceToRoot));
    // Auto without caps: buckets hold at least what the planning link moves in one latency.
    let slow = link(1.25e9, 2000);
    let c = StepConfig {
        planning_link: Some(slow),
        planning_intra: None,
        ..cfg(Topology::flat(4, slow), CommChoice::Auto, true, None)
    };
    let (plan, _) = dptrain::sim::plan(&p, &c).unwrap();
    let cap = dptrain::comm::min_bucket_bytes(&slow);
    assert!(plan.buckets[..plan.buckets.len() - 1]
        .iter()
        .all(|b| b.len * 4 >= cap));
    assert!(plan.buckets.len() < 5);
    // mpi-native has no schedule of ours.
    let c = cfg(topo, CommChoice::Native, true, None);
    assert!(simulate_step(&p, &c).unwrap_err().contains("MPI's own"));
}

#[test]
fn a_million_workers_finish_or_are_refused_in_seconds_and_billions_are_refused() {
    let p = from_graph(
        &reference_graph("lenet5").unwrap(),
        32,
        DeviceSpeed::ImagesPerSecond {
            images_per_s: 5000.0,
            mem_gbs: 100.0,
        },
    )
    .unwrap();
    for workers in [1_000_000usize, 4_000_000_000] {
        for comm in all_comms() {
            let started = Instant::now();
            let c = cfg(Topology::flat(workers, link(1.25e9, 5)), comm, true, None);
            let r = simulate_step(&p, &c);
            let took = started.elapsed();
            match &r {
                Ok(r) => assert!(workers < 4_000_000_000 && r.step_ms > 0.0),
                Err(e) => assert!(
                    e.contains("limit") && e.contains("simulate fewer workers"),
                    "{workers} {comm}: {e}"
                ),
            }
            assert!(
                took < Duration::from_secs(60),
                "{workers} workers {comm}: {took:?} ({r:?})"
            );
        }
    }
    // Ring at a million workers is recorded through one rank and simulated.
    let c = cfg(
        Topology::flat(1_000_000, link(1.25e9, 5)),
        CommChoice::Fixed(CommMode::Ring),
        true,
        ONE_BUCKET,
    );
    assert_eq!(simulate_step(&p, &c).unwrap().simulated_ranks, 1);
}

#[test]
fn stragglers_cost_more_at_scale_and_are_seeded() {
    let p = uneven();
    let at = |workers: usize, spread: f64, seed: u64| {
        let c = StepConfig {
            stragglers: Stragglers {
                spread,
                seed,
                steps: 30,
            },
            ..cfg(
                Topology::flat(workers, link(10e9, 5)),
                CommChoice::Fixed(CommMode::Ring),
                true,
                None,
            )
        };
        simulate_step(&p, &c).unwrap()
    };
    let none = at(8, 0.0, 1);
    assert_eq!(none.simulated_ranks, 1);
    let some = at(8, 0.1, 1);
    assert_eq!(some.simulated_ranks, 8);
    assert!(
        some.step_ms > none.step_ms * 1.02,
        "{} vs {}",
        some.step_ms,
        none.step_ms
    );
    // The slowest of more workers is slower.
    assert!(at(64, 0.1, 1).step_ms > some.step_ms);
    // Seeded: the same seed gives the same figures, another seed others.
    assert_eq!(at(8, 0.1, 1), some);
    assert_ne!(at(8, 0.1, 2).step_ms, some.step_ms);
    // The mean compute stays the profile's (the draws have mean 1).
    assert!((some.backward_ms / p.backward_ms() - 1.0).abs() < 0.05);
}

#[test]
fn overlap_never_slows_a_step() {
    let p = uneven();
    for topo in [
        Topology::flat(1, link(1e9, 10)),
        Topology::flat(3, link(50e6, 200)),
        Topology::flat(8, link(20e9, 1)),
        Topology::flat(13, link(1e9, 10)),
        cluster(4, 2),
        cluster(3, 4),
    ] {
        for comm in all_comms() {
            for cap in [Some(0usize), Some(4), Some(1024), ONE_BUCKET, None] {
                let on = simulate_step(&p, &cfg(topo, comm, true, cap)).unwrap();
                let off = simulate_step(&p, &cfg(topo, comm, false, cap)).unwrap();
                assert!(
                    on.step_ms <= off.step_ms * (1.0 + 1e-12),
                    "{comm} {topo:?} cap={cap:?}: on {} > off {}",
                    on.step_ms,
                    off.step_ms
                );
                // Neither is faster than the compute alone.
                let compute = p.forward_ms() + p.backward_ms();
                assert!(on.step_ms >= compute);
            }
        }
    }
}

#[test]
fn priority_scheduling_hides_the_link_under_the_next_forward_within_the_bound() {
    let p = uneven();
    let compute = p.forward_ms() + p.backward_ms() + p.update_ms;
    let priority = |c: StepConfig| StepConfig {
        schedule: dptrain::parallel::Schedule::Priority,
        ..c
    };
    // About 2.1 MB of gradients: at 150 MB/s a ring of 2 moves them in about the compute's
    // time, where the next forward has the most to hide; at 20 GB/s nothing is left to hide.
    for (bw, gains) in [(150e6, true), (20e9, false)] {
        let topo = Topology::flat(2, link(bw, 20));
        for comm in [
            CommMode::Ring,
            CommMode::Redundant,
            CommMode::HalvingDoubling,
        ] {
            let base = cfg(topo, CommChoice::Fixed(comm), true, None);
            let over = simulate_step(&p, &base).unwrap();
            let prio = simulate_step(&p, &priority(base)).unwrap();
            // Never faster than the compute, nor than the communication thread's busy time.
            assert!(
                prio.step_ms >= compute.max(prio.comm_ms) * (1.0 - 1e-9),
                "{comm} {bw}"
            );
            if gains {
                assert!(
                    prio.step_ms < 0.95 * over.step_ms,
                    "{comm}: priority {} against overlap {}",
                    prio.step_ms,
                    over.step_ms
                );
            } else {
                assert!(prio.step_ms <= over.step_ms * 1.05, "{comm} fast link");
            }
        }
    }
    // What the trainer refuses, the simulator refuses with the same words.
    let topo = Topology::flat(2, link(150e6, 20));
    let tree = priority(cfg(topo, CommChoice::Fixed(CommMode::Tree), true, None));
    let err = simulate_step(&p, &tree).unwrap_err();
    assert!(
        err.contains("--schedule priority with --comm tree"),
        "{err}"
    );
    let off = priority(cfg(topo, CommChoice::Fixed(CommMode::Ring), false, None));
    let err = simulate_step(&p, &off).unwrap_err();
    assert!(
        err.contains("--schedule priority with --overlap off"),
        "{err}"
    );
    // PowerSGD in tree mode: refused by both, in the trainer's words.
    let mut powersgd_tree = cfg(topo, CommChoice::Fixed(CommMode::Tree), true, None);
    powersgd_tree.compress = dptrain::plan::CompressChoice::PowerSgd { rank: 1 };
    let err = simulate_step(&p, &powersgd_tree).unwrap_err();
    let trainer = dptrain::config::TrainOptions {
        workers: Some(2),
        comm: Some("tree".into()),
        compress: Some("powersgd:1".into()),
        ..Default::default()
    }
    .resolve()
    .unwrap_err();
    assert!(
        err.contains("--compress powersgd:1 with --comm tree"),
        "{err}"
    );
    assert_eq!(err, trainer);
}

#[test]
fn a_credit_saves_decisions_and_is_refused_where_the_trainer_refuses_it() {
    let p = uneven();
    let compute = p.forward_ms() + p.backward_ms() + p.update_ms;
    // 4 ranks (a decision crosses two hops of rank 0's tree), 16 KiB partitions and a 1 ms
    // latency: each decision costs 2 ms of the communication thread's time.
    let base = StepConfig {
        schedule: dptrain::parallel::Schedule::Priority,
        partition_kb: Some(16),
        ..cfg(
            Topology::flat(4, link(150e6, 1000)),
            CommChoice::Fixed(CommMode::Ring),
            true,
            None,
        )
    };
    let one = simulate_step(&p, &base).unwrap();
    let credit = StepConfig {
        credit_kb: Some(1024),
        ..base
    };
    let many = simulate_step(&p, &credit).unwrap();
    assert!(
        many.comm_ms < one.comm_ms - 10.0,
        "a credit of 1 MiB: {} ms of communication, one decision per partition: {} ms",
        many.comm_ms,
        one.comm_ms
    );
    for r in [&one, &many] {
        assert!(r.step_ms >= compute.max(r.comm_ms) * (1.0 - 1e-9));
    }
    // The trainer's refusals, in its words.
    let zero = StepConfig {
        credit_kb: Some(0),
        ..base
    };
    let err = simulate_step(&p, &zero).unwrap_err();
    assert!(err.contains("--credit-kb 0"), "{err}");
    let overlap = StepConfig {
        schedule: dptrain::parallel::Schedule::Overlap,
        ..credit
    };
    let err = simulate_step(&p, &overlap).unwrap_err();
    assert!(
        err.contains("--credit-kb 1024 applies to --schedule priority"),
        "{err}"
    );
}

#[test]
fn one_worker_is_compute_only_and_search_is_no_worse() {
    let p = uneven();
    let l = link(1e9, 10);
    let one = simulate_step(&p, &cfg(Topology::flat(1, l), CommChoice::Auto, true, None)).unwrap();
    assert!((one.step_ms - (p.forward_ms() + p.backward_ms() + p.update_ms)).abs() < 1e-9);
    assert_eq!(one.exposed_ms, 0.0);
    let mut sim = Simulator::new();
    for world in [4usize, 16] {
        let c = cfg(
            Topology::flat(world, l),
            CommChoice::Fixed(CommMode::Ring),
            true,
            Some(0),
        );
        let (_, best) = search_buckets(&mut sim, &p, &c).unwrap();
        assert!(best.step_ms <= sim.step(&p, &c).unwrap().step_ms);
    }
}

#[test]
fn default_buckets_pipeline_a_large_ring_and_stay_near_the_best_cap_where_compute_hides_them() {
    // ResNet-50 at batch 32 on a 9.3 TFLOPS device (40% of peak), ring and auto, 10 Gbit/s
    // and 5 us: the default caps against one bucket per block (the link's latency-bytes is
    // 6 KB, less than most blocks) and against the best of the search's caps.
    let p = from_graph(
        &reference_graph("resnet50").unwrap(),
        32,
        flops(9.3, 0.4, 900.0),
    )
    .unwrap();
    let l = link(1.25e9, 5);
    let mut sim = Simulator::new();
    for (world, comm, most) in [
        (256, CommChoice::Fixed(CommMode::Ring), 1.10),
        (256, CommChoice::Auto, 1.05),
        (8, CommChoice::Auto, 1.02),
    ] {
        let at = |kb| cfg(Topology::flat(world, l), comm, true, kb);
        let default = sim.step(&p, &at(None)).unwrap().step_ms;
        let per_block = sim.step(&p, &at(Some(0))).unwrap().step_ms;
        let (_, best) = search_buckets(&mut sim, &p, &at(Some(0))).unwrap();
        assert!(
            default <= most * best.step_ms,
            "{world} {comm:?}: default caps {default} ms, best {} ms",
            best.step_ms
        );
        assert!(default <= per_block * 1.001, "{world} {comm:?}");
        if world == 256 && comm == CommChoice::Fixed(CommMode::Ring) {
            // One bucket per block pays the ring's 510 latencies per block: nearly twice the step.
            assert!(per_block > 1.8 * default, "{per_block} against {default}");
        }
    }
    // Where compute hides the communication (100 Gbit/s, 8 workers), the larger caps cost
    // less than 1% of the step against one bucket per block.
    let fast = link(12.5e9, 5);
    let at = |kb| cfg(Topology::flat(8, fast), CommChoice::Auto, true, kb);
    let default = sim.step(&p, &at(None)).unwrap().step_ms;
    let per_block = sim.step(&p, &at(Some(0))).unwrap().step_ms;
    assert!(default <= 1.01 * per_block, "{default} against {per_block}");
}

/// Equal up to the last bit of the times (serde_json's default float parser may round the
/// 17th significant digit differently).
fn assert_same(a: &Profile, b: &Profile) {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-15 * x.abs().max(y.abs());
    assert_eq!(
        (&a.model, &a.source, a.batch, a.input, a.blocks.len()),
        (&b.model, &b.source, b.batch, b.input, b.blocks.len())
    );
    assert!(close(a.update_ms, b.update_ms));
    assert_eq!(a.compute_spread, b.compute_spread);
    for (x, y) in a.blocks.iter().zip(&b.blocks) {
        assert_eq!(
            (&x.name, &x.param_sizes, x.macs_per_sample),
            (&y.name, &y.param_sizes, y.macs_per_sample)
        );
        assert!(close(x.forward_ms, y.forward_ms) && close(x.backward_ms, y.backward_ms));
    }
}

fn flops(tflops: f64, efficiency: f64, mem_gbs: f64) -> DeviceSpeed {
    DeviceSpeed::Flops(DeviceSpec {
        tflops,
        efficiency,
        mem_gbs,
    })
}

#[test]
fn profile_round_trips_through_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    let p = from_graph(
        &reference_graph("resnet50").unwrap(),
        32,
        flops(15.0, 0.4, 900.0),
    )
    .unwrap();
    p.save(&path).unwrap();
    assert_same(&Profile::load(&path).unwrap(), &p);
    let mut u = uneven();
    u.compute_spread = Some(0.031);
    u.save(&path).unwrap();
    assert_same(&Profile::load(&path).unwrap(), &u);
    // A file without the spread (written before it existed) still loads.
    let text = std::fs::read_to_string(&path).unwrap();
    let old = text.replace(",\n  \"compute_spread\": 0.031", "");
    assert!(!old.contains("compute_spread"), "{old}");
    std::fs::write(&path, old).unwrap();
    assert_eq!(Profile::load(&path).unwrap().compute_spread, None);
    std::fs::write(&path, "{\"model\": 3}").unwrap();
    let err = Profile::load(&path).unwrap_err();
    assert!(
        matches!(err, ProfileError::NotAProfile { .. })
            && err.to_string().contains("not a profile"),
        "{err}"
    );
}

#[test]
fn graph_profiles_have_a_block_per_layer_with_parameters() {
    let g = reference_graph("vgg16").unwrap();
    let p = from_graph(&g, 16, flops(10.0, 0.5, 1000.0)).unwrap();
    let with_params: Vec<_> = g.nodes.iter().filter(|n| n.params > 0).collect();
    assert_eq!(p.blocks.len(), with_params.len());
    for (b, n) in p.blocks.iter().zip(&with_params) {
        assert_eq!(b.name, n.name);
        let want = 2.0 * n.macs as f64 * 16.0 / 5e12 * 1e3;
        assert!((b.forward_ms - want).abs() <= 1e-9 * want.max(1.0));
        assert!((b.backward_ms - 2.0 * b.forward_ms).abs() <= 1e-12);
    }
    assert_eq!(p.grad_bytes(), 4 * g.num_params());
    // From images/s: the whole step takes batch / images_per_s.
    let p = from_graph(
        &reference_graph("resnet50").unwrap(),
        32,
        DeviceSpeed::ImagesPerSecond {
            images_per_s: 178.0,
            mem_gbs: 732.0,
        },
    )
    .unwrap();
    let step = p.forward_ms() + p.backward_ms() + p.update_ms;
    assert!((step - 32.0 / 178.0 * 1e3).abs() < 1e-9);
    assert!((p.backward_ms() - 2.0 * p.forward_ms()).abs() < 1e-9);
    let err = from_graph(
        &reference_graph("resnet50").unwrap(),
        32,
        DeviceSpeed::ImagesPerSecond {
            images_per_s: 1e9,
            mem_gbs: 1.0,
        },
    )
    .unwrap_err();
    assert!(err.contains("no longer than the update"), "{err}");
}

#[test]
fn graphs_have_the_published_flops() {
    // Published MAC counts (conv and fc; the graphs also count BatchNorm): within 3%.
    let cases = [
        ("alexnet", 0.71e9),
        ("vgg16", 15.5e9),
        ("resnet50", 4.1e9),
        ("inception-v3", 5.7e9),
        ("inception-v3-noaux", 5.7e9),
    ];
    for (name, macs) in cases {
        let m = reference_graph(name).unwrap().macs() as f64;
        assert!((m / macs - 1.0).abs() < 0.03, "{name}: {m} MACs vs {macs}");
    }
    assert!(reference_graph("resnet-9000")
        .unwrap_err()
        .contains("unknown model"));
}

#[test]
fn measured_profile_has_every_block_and_its_spread() {
    let p = dptrain::sim::measure(&dptrain::sim::MeasureSpec {
        concurrent: 2,
        ..dptrain::sim::MeasureSpec::new("lenet5", 4, 1, 3)
    })
    .unwrap();
    assert_eq!(p.blocks.len(), 5);
    assert!(p
        .blocks
        .iter()
        .all(|b| b.forward_ms > 0.0 && b.backward_ms > 0.0));
    assert!(p.update_ms > 0.0);
    assert_eq!(
        p.grad_bytes(),
        4 * reference_graph("lenet5").unwrap().num_params()
    );
    let spread = p.compute_spread.unwrap();
    assert!((0.0..1.0).contains(&spread), "{spread}");
}

#[test]
fn the_published_run_is_predicted_within_ten_points() {
    // Goyal et al. 2017: ~90% from 8 to 256 P100s; the inputs and their sources are in
    // `bench::simcheck::goyal2017` (and docs/bench/sim-check.md).
    let p = dptrain::bench::simcheck::goyal2017().unwrap();
    assert_eq!(p.published, 90.0);
    let d = p.predicted() - p.published;
    assert!(d.abs() <= 10.0, "predicted {:.1}%", p.predicted());
    // Every input says where it comes from.
    assert!(p.assumptions.iter().all(|a| !a.source.is_empty()));
    // The variants move the way the inputs say: a slower NIC or no overlap costs efficiency.
    let eff = |name: &str| p.rows.iter().find(|r| r.0.starts_with(name)).unwrap().3;
    assert!(eff("NIC at half") < p.predicted());
    assert!(eff("overlap off") < p.predicted());
}

fn dptrain(args: &[&str], dir: &std::path::Path) -> (i32, String, String) {
    let started = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{args:?} took {:?}",
        started.elapsed()
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn profiles_with_unphysical_numbers_are_refused_on_load_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    let mut good = serde_json::to_value(uneven()).unwrap();
    good["blocks"][0]["matrices"] = serde_json::json!([{"offset": 0, "rows": 10, "cols": 100}]);
    good["blocks"][1]["input_grad_ms"] = 0.0.into();
    good["compute_spread"] = 0.015.into();
    let cases: [(&str, serde_json::Value, &str); 11] = [
        ("/compute_spread", (-1.0).into(), "compute_spread is -1"),
        (
            "/blocks/1/input_grad_ms",
            1e6.into(),
            "block 'b1' has input_grad_ms 1000000 above its backward_ms",
        ),
        (
            "/blocks/1/input_grad_ms",
            (-1.0).into(),
            "block 1 ('b1') input_grad_ms is -1",
        ),
        // Block 0 holds 1010 values.
        (
            "/blocks/0/matrices/0/rows",
            11.into(),
            "block 0 ('b0') matrix 0 (11 x 100 at 0) is empty, overlaps the one before or lies \
             past the block's 1010 values",
        ),
        (
            "/blocks/0/matrices/0/cols",
            0.into(),
            "block 0 ('b0') matrix 0 (10 x 0 at 0)",
        ),
        (
            "/blocks/1/forward_ms",
            (-5.0).into(),
            "block 1 ('b1') forward_ms is -5",
        ),
        (
            "/blocks/0/backward_ms",
            1e300.into(),
            "block 0 ('b0') backward_ms is 1e300",
        ),
        ("/update_ms", (-0.5).into(), "update_ms is -0.5"),
        ("/batch", 0.into(), "batch is 0"),
        ("/input/1", 0.into(), "input is [3, 0, 8]"),
        (
            "/blocks/0/param_sizes/0",
            (1u64 << 60).into(),
            "more than the 1 TiB a profile may describe",
        ),
    ];
    for (pointer, value, want) in cases {
        let mut bad = good.clone();
        *bad.pointer_mut(pointer).unwrap() = value;
        std::fs::write(&path, bad.to_string()).unwrap();
        let err = Profile::load(&path).unwrap_err();
        assert!(
            matches!(err, ProfileError::Unphysical { .. }),
            "{pointer}: {err:?}"
        );
        let err = err.to_string();
        assert!(
            err.contains(want) && err.contains("p.json"),
            "{pointer}: {err}"
        );
        // `simulate` exits 1 with it instead of printing 300-digit step times.
        let (code, out, err) = dptrain(
            &["simulate", "--profile", "p.json", "--workers", "8"],
            dir.path(),
        );
        assert_eq!(code, 1, "{out}{err}");
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn profile_refuses_unknown_names_and_batches_the_machine_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = dptrain(
        &["profile", "--model", "alexnet2", "--out", "a.json"],
        dir.path(),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("alexnet2: unknown model: did you mean 'alexnet'?")
            && err.contains("alexnet, vgg16"),
        "{err}"
    );
    assert!(!err.contains("can only be profiled from FLOPs"), "{err}");
    // 313 GB of input alone: refused, not aborted.
    let (code, _, err) = dptrain(
        &[
            "profile",
            "--model",
            "lenet5",
            "--batch",
            "100000000",
            "--out",
            "b.json",
        ],
        dir.path(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--batch 100000000"), "{err}");
    let (code, _, err) = dptrain(
        &[
            "profile",
            "--model",
            "vgg-small",
            "--batch",
            "1000000",
            "--out",
            "b.json",
        ],
        dir.path(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("needs about") && err.contains("lower --batch"),
        "{err}"
    );
    assert!(!dir.path().join("b.json").exists());
    // Small enough, it runs.
    let (code, _, err) = dptrain(
        &[
            "profile", "--model", "lenet5", "--batch", "8", "--steps", "1", "--out", "c.json",
        ],
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn absurd_worker_counts_on_the_command_line_end_in_seconds() {
    // The command line: absurd worker counts and every mode at a million.
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = dptrain(
        &[
            "profile",
            "--model",
            "lenet5",
            "--device-tflops",
            "10",
            "--out",
            "l.json",
        ],
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
    // A count past what any run or simulation holds is refused before anything runs (one
    // past 2^63 overflowed the tree walk's rank arithmetic).
    for absurd in ["4000000000", "18446744073709551615"] {
        let (code, out, err) = dptrain(
            &["simulate", "--profile", "l.json", "--workers", absurd],
            dir.path(),
        );
        assert_eq!(code, 1, "{out}");
        assert!(
            err.contains(&format!("{absurd} workers is more than the 16777216")),
            "{err}"
        );
        assert!(out.is_empty(), "{out}");
    }
    // Every row of a count too large for a mode's records is refused with the limit, in
    // seconds (the helper asserts the time), and with nothing simulated the command fails.
    let (code, out, err) = dptrain(
        &[
            "simulate",
            "--profile",
            "l.json",
            "--workers",
            "16777216",
            "--comm",
            "ring",
        ],
        dir.path(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("every configuration (2) was refused"), "{err}");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("16777216 ")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for r in rows {
        assert!(
            r.contains("refused:") && r.contains("simulate fewer workers"),
            "{r}"
        );
    }
    // A million: ring is simulated through one host, hd (not a power of two) refused.
    let (code, out, err) = dptrain(
        &[
            "simulate",
            "--profile",
            "l.json",
            "--workers",
            "1000000",
            "--comm",
            "ring,hd",
            "--overlap",
            "on",
        ],
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
    let ring = out.lines().find(|l| l.contains(" ring ")).unwrap();
    assert!(!ring.contains("refused"), "{ring}");
    let hd = out.lines().find(|l| l.contains(" hd ")).unwrap();
    assert!(
        hd.contains("refused:") && hd.contains("over the limit"),
        "{hd}"
    );
    // Priority scheduling cuts a 4 GB gradient into 16 KiB partitions: 250,000 of them, which
    // took minutes to order and memory per partition and rank (counted per bucket, the step
    // was within the message limit). Refused in seconds, naming the partitions to give.
    std::fs::write(
        dir.path().join("huge.toml"),
        "input = [3, 32, 32]\nclasses = 10\nlayers = [\n\
         { type = \"conv2d\", name = \"a\", out = 100000, kernel = 3, padding = 1 },\n\
         { type = \"flatten\" },\n{ type = \"linear\", name = \"fc\", out = \"classes\" },\n]\n",
    )
    .unwrap();
    for (workers, partition_kb) in [("2", "16"), ("1024", "64")] {
        let (code, out, err) = dptrain(
            &[
                "simulate",
                "--model",
                "huge.toml",
                "--device-tflops",
                "100",
                "--batch",
                "1",
                "--comm",
                "ring",
                "--schedule",
                "priority",
                "--workers",
                workers,
                "--partition-kb",
                partition_kb,
            ],
            dir.path(),
        );
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            out.contains("over the simulator's limit of 16384: give --partition-kb 245 or more"),
            "{out}"
        );
    }
}

/// `simulate` and `train` given the same bucket flags plan the same buckets and operations:
/// both flag sets parsed by their own commands' argument definitions, the trainer's plan from
/// its resolved configuration and its network's blocks, the simulator's from a profile of the
/// same blocks on the same link. (They once differed: `simulate --bucket-kb 128` also capped
/// the first bucket at 128 KiB, `train` at 0.)
#[test]
fn simulate_and_train_plan_the_same_buckets_from_the_same_flags() {
    use clap::Parser;
    use dptrain::cli::simulate::SimulateArgs;
    use dptrain::config::TrainOptions;
    #[derive(Parser)]
    struct Train {
        #[command(flatten)]
        options: TrainOptions,
    }
    #[derive(Parser)]
    struct Simulate {
        #[command(flatten)]
        args: SimulateArgs,
    }
    let link_flags = ["--link-bandwidth", "1Gbit", "--link-latency", "200us"];
    let given = link(1.25e8, 200);
    let (_, net) = graph_and_net("resnet20");
    let lens = dptrain::plan::block_lens(&net);
    let profile = Profile {
        model: "resnet20".into(),
        source: "the trainer's blocks".into(),
        batch: 1,
        input: [3, 32, 32],
        blocks: lens
            .iter()
            .enumerate()
            .map(|(i, &n)| BlockProfile {
                name: format!("b{i}"),
                forward_ms: 1.0,
                backward_ms: 2.0,
                param_sizes: vec![n],
                matrices: None,
                input_grad_ms: None,
                macs_per_sample: 1,
            })
            .collect(),
        update_ms: 1.0,
        compute_spread: None,
    };
    let mut distinct = std::collections::BTreeSet::new();
    for flags in [
        &[][..],
        &["--bucket-kb", "128"],
        &["--first-bucket-kb", "64"],
        &["--first-bucket-kb", "16", "--bucket-kb", "256"],
        &["--bucket-kb", "0"],
        &["--first-bucket-kb", "0", "--bucket-kb", "0"],
        // `auto` is the default by name: as if not given, alone and beside the other flag.
        &["--bucket-kb", "auto"],
        &["--bucket-kb", "auto", "--first-bucket-kb", "64"],
    ] {
        for comm in ["ring", "auto", "tree"] {
            let train = Train::try_parse_from(
                [
                    "train",
                    "--model",
                    "resnet20",
                    "--workers",
                    "2",
                    "--comm",
                    comm,
                ]
                .iter()
                .chain(&link_flags)
                .chain(flags),
            )
            .unwrap()
            .options
            .resolve()
            .unwrap();
            let planning = train.plan_inputs();
            let trainer_plan = planning.bucket_plan(&lens);
            let trainer_ops = planning.bucket_ops(&trainer_plan);

            let sim = Simulate::try_parse_from(
                [
                    "simulate",
                    "--model",
                    "resnet20",
                    "--workers",
                    "2",
                    "--comm",
                    comm,
                ]
                .iter()
                .chain(&link_flags)
                .chain(flags),
            )
            .unwrap()
            .args;
            let step = StepConfig {
                buckets: sim.bucket_flags(),
                ..cfg(
                    Topology::flat(2, given),
                    CommChoice::parse(comm).unwrap(),
                    true,
                    None,
                )
            };
            let (sim_plan, sim_ops) = dptrain::sim::plan(&profile, &step).unwrap();
            assert_eq!(sim_plan, trainer_plan, "{flags:?} --comm {comm}");
            assert_eq!(sim_ops, trainer_ops, "{flags:?} --comm {comm}");
            distinct.insert(trainer_plan.buckets.len());
        }
    }
    // The flags above plan differently from one another, so the comparison is not vacuous.
    assert!(distinct.len() >= 3, "{distinct:?}");
}

// `--comm auto` on clusters of hosts that share a NIC (issue 22): the cost model's route for a
// bucket (flat, leader or 2-D hierarchy, and the mode) checked against what it models, the
// simulator's replay of the real algorithms' recorded schedules, over a grid of hosts x
// devices per host x link rates x bucket sizes. The rule: auto (with the default
// `--hierarchical auto`) is never more than 5% slower than the best fixed choice a user could
// make (`--comm tree|ring|hd|redundant` x `--hierarchical 2d|leader|off`) in the simulator;
// with `--hierarchical 2d` or `leader` fixed, never more than 5% slower than that hierarchy's
// best mode; forced flat (`off`), 15%.

fn one_bucket_config(
    topology: Topology,
    comm: CommChoice,
    hierarchy: HierarchyChoice,
) -> StepConfig {
    StepConfig {
        compress: dptrain::plan::CompressChoice::NONE,
        schedule: dptrain::parallel::Schedule::Overlap,
        partition_kb: None,
        credit_kb: None,
        topology,
        comm,
        hierarchy,
        overlap: true,
        // One bucket of the whole gradient.
        buckets: BucketFlags {
            first_kb: Some(1 << 30),
            kb: Some(1 << 30),
        },
        planning_link: None,
        planning_intra: None,
        stragglers: Stragglers::NONE,
    }
}

/// Every fixed choice a user can make.
fn fixed_choices() -> Vec<(CommChoice, HierarchyChoice)> {
    let hierarchies = [
        HierarchyChoice::Fixed(Hierarchy::TwoD),
        HierarchyChoice::Fixed(Hierarchy::Leader),
        HierarchyChoice::Off,
    ];
    let mut v = Vec::new();
    for m in CommMode::ALL {
        for h in hierarchies {
            v.push((CommChoice::Fixed(m), h));
        }
    }
    v
}

#[test]
fn auto_is_within_five_percent_of_the_best_fixed_choice_on_every_cluster_in_the_simulator() {
    // NICs from 100 Mbit/s to 100 Gbit/s; within a host, a PCIe-class port (12 GB/s, as the
    // issue's P100 hosts) and this machine's in-process link (5 GB/s, 20 us).
    let bits = |bits_per_s: f64, lat_us| link(bits_per_s / 8.0, lat_us);
    let nics = [
        bits(100e6, 100),
        bits(1e9, 50),
        bits(10e9, 10),
        bits(100e9, 5),
    ];
    let intras = [bits(96e9, 2), bits(40e9, 20)];
    let mut sim = Simulator::new();
    let mut worst: (f64, String) = (0.0, String::new());
    let mut failures = Vec::new();
    let mut cases = 0;
    for hosts in [2usize, 3, 4, 8, 16] {
        for d in [1usize, 2, 4, 8] {
            for nic in nics {
                for intra in intras {
                    let topology = Topology {
                        hosts,
                        devices_per_host: d,
                        intra,
                        nic,
                        overhead: Duration::ZERO,
                        step_overhead: Duration::ZERO,
                    };
                    for bytes in [4096usize, 65_536, 1 << 20, 16 << 20, 256 << 20] {
                        let p = comm_only(bytes);
                        let step = |sim: &mut Simulator, c, h| {
                            sim.step(&p, &one_bucket_config(topology, c, h)).unwrap()
                        };
                        let fixed: Vec<(f64, String, HierarchyChoice)> = fixed_choices()
                            .into_iter()
                            .map(|(c, h)| (step(&mut sim, c, h).step_ms, format!("{c} {h}"), h))
                            .collect();
                        // `--hierarchical auto` against every fixed choice, and each fixed
                        // hierarchy (with `--comm auto`) against the modes in it.
                        for h in [
                            HierarchyChoice::Auto,
                            HierarchyChoice::Off,
                            HierarchyChoice::Fixed(Hierarchy::TwoD),
                            HierarchyChoice::Fixed(Hierarchy::Leader),
                        ] {
                            let auto = step(&mut sim, CommChoice::Auto, h);
                            let (best, best_name, _) = fixed
                                .iter()
                                // `--comm tree` updates at the root and is flat whatever
                                // the hierarchy: a choice beside the flat modes only.
                                .filter(|f| match h {
                                    HierarchyChoice::Auto => true,
                                    HierarchyChoice::Off => f.2 == h || f.1.starts_with("tree"),
                                    _ => f.2 == h && !f.1.starts_with("tree"),
                                })
                                .min_by(|a, b| a.0.total_cmp(&b.0))
                                .unwrap();
                            let ratio = auto.step_ms / best;
                            let what = format!(
                                "{hosts}x{d} nic {:.0} Mbit/s {:?} intra {:.0} GB/s, {bytes} B, \
                                 --hierarchical {h}: auto ({}) {:.4} ms vs best fixed \
                                 ({best_name}) {best:.4} ms: {ratio:.3}x",
                                nic.bandwidth_bytes_per_s * 8e-6,
                                nic.latency,
                                intra.bandwidth_bytes_per_s * 1e-9,
                                auto.bucket_ops[0],
                                auto.step_ms,
                            );
                            cases += 1;
                            if ratio > worst.0 {
                                worst = (ratio, what.clone());
                            }
                            // Forced flat on hosts that share a NIC, the model prices halving-
                            // doubling's fold off powers of two (3 hosts) and the tree's small
                            // buckets less well: within 15% there (3 of 800 cases past 5%
                            // when this was written), 5% everywhere else.
                            let bound = if h == HierarchyChoice::Off {
                                1.15
                            } else {
                                1.05
                            };
                            if ratio > bound {
                                failures.push(what);
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("{cases} cases; worst: {}", worst.1);
    assert!(
        failures.is_empty(),
        "{} of {cases} cases slower than the bound allows:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One block of `rows x cols` weights and `bias` more values, all its gradient ready at once
/// and no compute: a step that is its communication alone.
fn one_matrix(rows: usize, cols: usize, bias: usize) -> Profile {
    let mut p = comm_only(4 * (rows * cols + bias));
    p.blocks[0].matrices = Some(vec![dptrain::comm::powersgd::Matrix {
        offset: 0,
        rows,
        cols,
    }]);
    p
}

fn powersgd(c: StepConfig, rank: usize) -> StepConfig {
    StepConfig {
        compress: dptrain::plan::CompressChoice::PowerSgd { rank },
        ..c
    }
}

#[test]
fn powersgd_sends_two_rounds_and_pays_its_arithmetic_on_the_communication_thread() {
    use dptrain::comm::powersgd::PowerSgdRates;
    let (rows, cols, bias) = (1152, 256, 256);
    let p = one_matrix(rows, cols, bias);
    // 2 workers on a ring without latency: each round costs its bytes over the link.
    let bw = 12.5e6;
    let base = cfg(
        Topology::flat(2, link(bw, 0)),
        CommChoice::Fixed(CommMode::Ring),
        true,
        ONE_BUCKET,
    );
    let none = simulate_step(&p, &base).unwrap();
    assert!((none.comm_ms - 4.0 * (rows * cols + bias) as f64 / bw * 1e3).abs() < 1e-6);
    for rank in [1, 4] {
        let r = simulate_step(&p, &powersgd(base, rank)).unwrap();
        // Round 1: the bias and P (rows x rank); round 2: Q (cols x rank).
        let sent = (bias + rows * rank + cols * rank) as f64;
        let arithmetic: f64 = PowerSgdRates::MEASURED
            .seconds(rows * cols, rank)
            .iter()
            .sum();
        let expected = (4.0 * sent / bw + arithmetic) * 1e3;
        assert!(
            (r.comm_ms - expected).abs() < 1e-6,
            "rank {rank}: {} ms against {expected} ms",
            r.comm_ms
        );
        // The step ends after the product sent back, with the per-step overhead at zero.
        assert!((r.step_ms - expected).abs() < 1e-6, "{}", r.step_ms);
        assert!(r.step_ms < none.step_ms / 10.0);
    }
    // A matrix too small to gain at this rank travels whole in round 1, as the trainer sends
    // it: an 8 x 8 one after the large one costs its 64 values and no arithmetic.
    let mut with_small = one_matrix(rows, cols, bias + 64);
    with_small.blocks[0]
        .matrices
        .as_mut()
        .unwrap()
        .push(dptrain::comm::powersgd::Matrix {
            offset: rows * cols,
            rows: 8,
            cols: 8,
        });
    let rank = 4;
    let r = simulate_step(&with_small, &powersgd(base, rank)).unwrap();
    let sent = (bias + 64 + rows * rank + cols * rank) as f64;
    let arithmetic: f64 = PowerSgdRates::MEASURED
        .seconds(rows * cols, rank)
        .iter()
        .sum();
    assert!((r.comm_ms - (4.0 * sent / bw + arithmetic) * 1e3).abs() < 1e-6);
}

#[test]
fn powersgd_rounds_are_pipelined_across_buckets_under_overlap() {
    use dptrain::comm::powersgd::PowerSgdRates;
    // Three blocks of one matrix each, a bucket each, no compute, a link of latency alone:
    // each collective costs one all-reduce's latency `c`. Under overlap each bucket's round
    // 2 travels in the next one's round 1: 4 collectives, not 6, and the arithmetic of all
    // three; under priority each bucket's two rounds stay together (6, and 3 decisions).
    let (rows, cols, rank) = (1152, 256, 4);
    let mut p = one_matrix(rows, cols, 0);
    p.blocks = (0..3)
        .map(|k| BlockProfile {
            name: format!("b{k}"),
            ..p.blocks[0].clone()
        })
        .collect();
    let base = cfg(
        Topology::flat(2, link(1e15, 100)),
        CommChoice::Fixed(CommMode::Ring),
        true,
        Some(4 * rows * cols / 1024),
    );
    let one = simulate_step(
        &comm_only(4),
        &cfg(base.topology, base.comm, true, ONE_BUCKET),
    );
    let c = one.unwrap().comm_ms;
    assert!(c > 0.1, "{c} ms");
    let arithmetic: f64 = PowerSgdRates::MEASURED
        .seconds(rows * cols, rank)
        .iter()
        .sum::<f64>()
        * 3e3;
    let over = simulate_step(&p, &powersgd(base, rank)).unwrap();
    assert_eq!(over.bucket_bytes.len(), 3, "{:?}", over.bucket_bytes);
    let expected = 4.0 * c + arithmetic;
    assert!(
        (over.comm_ms - expected).abs() < 1e-3,
        "overlap {} ms against {expected} ms",
        over.comm_ms
    );
    let priority = StepConfig {
        schedule: dptrain::parallel::Schedule::Priority,
        ..powersgd(base, rank)
    };
    let prio = simulate_step(&p, &priority).unwrap();
    assert!(
        prio.comm_ms > 6.0 * c + arithmetic - 1e-3,
        "priority {} ms, 6 collectives {} ms",
        prio.comm_ms,
        6.0 * c + arithmetic
    );
    // Where the carried bytes cost more than the latency saved (100 Mbit/s, 10 us: Q's 4 KiB
    // take 330 us, a collective's latency 20 us), the plan keeps each bucket's rounds
    // together: 6 collectives, as under priority.
    let bw = 12.5e6;
    let bytes_bound = cfg(
        Topology::flat(2, link(bw, 10)),
        CommChoice::Fixed(CommMode::Ring),
        true,
        base.buckets.kb,
    );
    let one = cfg(bytes_bound.topology, bytes_bound.comm, true, ONE_BUCKET);
    let c = simulate_step(&comm_only(4), &one).unwrap().comm_ms;
    let sent = 3.0 * 4.0 * ((rows + cols) * rank) as f64 / bw * 1e3;
    let over = simulate_step(&p, &powersgd(bytes_bound, rank)).unwrap();
    let expected = 6.0 * c + sent + arithmetic;
    assert!(
        (over.comm_ms - expected).abs() < 2e-3,
        "bytes-bound: {} ms against {expected} ms",
        over.comm_ms
    );
    // The middle block sent whole (no matrix): bucket 0's round 2 travels in it, and bucket
    // 2's two rounds follow: 4 collectives, not 5, and two buckets' arithmetic.
    let c = simulate_step(
        &comm_only(4),
        &cfg(base.topology, base.comm, true, ONE_BUCKET),
    )
    .unwrap()
    .comm_ms;
    p.blocks[1].matrices = Some(Vec::new());
    let over = simulate_step(&p, &powersgd(base, rank)).unwrap();
    let expected = 4.0 * c + arithmetic * 2.0 / 3.0;
    assert!(
        (over.comm_ms - expected).abs() < 1e-3,
        "a bucket sent whole in the middle: {} ms against {expected} ms",
        over.comm_ms
    );
}

#[test]
fn powersgd_needs_the_profiles_matrices_and_runs_whole_under_priority() {
    let base = cfg(
        Topology::flat(2, link(12.5e6, 0)),
        CommChoice::Fixed(CommMode::Ring),
        true,
        None,
    );
    let err = simulate_step(&comm_only(1 << 20), &powersgd(base, 4)).unwrap_err();
    assert!(
        err.contains("does not list its weight matrices") && err.contains("dptrain profile"),
        "{err}"
    );
    // Under priority a PowerSGD bucket is one partition: rank 0's decision (4 bytes over
    // the link) and then the same two rounds and arithmetic as under overlap.
    let priority = StepConfig {
        schedule: dptrain::parallel::Schedule::Priority,
        ..powersgd(base, 4)
    };
    let p = one_matrix(1152, 256, 256);
    let over = simulate_step(&p, &powersgd(base, 4)).unwrap();
    let prio = simulate_step(&p, &priority).unwrap();
    let decision_ms = 4.0 / 12.5e6 * 1e3;
    assert!(
        (prio.comm_ms - over.comm_ms - decision_ms).abs() < 1e-6,
        "priority {} ms, overlap {} ms",
        prio.comm_ms,
        over.comm_ms
    );
    // A rank at which nothing gains is refused in the trainer's words, huge ones included.
    for rank in [64, 1 << 63] {
        let err = simulate_step(&one_matrix(64, 64, 0), &powersgd(base, rank)).unwrap_err();
        assert!(
            err.contains(&format!("at rank {rank} no weight of this model")),
            "{err}"
        );
    }
}

/// A built-in model's graph for 3x32x32 images and 10 classes, and its net at batch 1.
fn graph_and_net(model: &str) -> (std::sync::Arc<dptrain::model::Graph>, dptrain::nn::Net) {
    let graph = std::sync::Arc::new(
        dptrain::train::build_graph(model, [3, 32, 32], 10)
            .unwrap_or_else(|e| panic!("{model}: {e}")),
    );
    let cfg = dptrain::nn::NetConfig {
        max_batch: 1,
        seed: 1,
    };
    let net = dptrain::nn::Net::new(graph.clone(), cfg).unwrap();
    (graph, net)
}

#[test]
fn the_graphs_weight_matrices_are_the_nets() {
    use dptrain::model::BUILTIN;
    for (model, _) in BUILTIN.iter().take(6) {
        let (graph, net) = graph_and_net(model);
        let from_graph: Vec<_> = dptrain::measure::profile::graph_blocks(&graph)
            .into_iter()
            .map(|b| b.matrices.expect("a graph's blocks list their matrices"))
            .collect();
        assert_eq!(from_graph, dptrain::plan::block_matrices(&net), "{model}");
    }
}

#[test]
fn the_schedule_search_is_never_worse_than_either_schedule_and_keeps_to_what_the_trainer_allows() {
    use dptrain::parallel::Schedule;
    use dptrain::sim::search_schedule;
    let p = uneven();
    let mut sim = Simulator::new();
    for bw in [150e6, 20e9] {
        let base = cfg(
            Topology::flat(2, link(bw, 20)),
            CommChoice::Fixed(CommMode::Ring),
            true,
            None,
        );
        let found = search_schedule(&mut sim, &p, &base, false).unwrap();
        let overlap = sim.step(&p, &base).unwrap();
        let priority = sim
            .step(
                &p,
                &StepConfig {
                    schedule: Schedule::Priority,
                    ..base
                },
            )
            .unwrap();
        assert!((found.overlap_ms - overlap.step_ms).abs() < 1e-9);
        assert!(found.result.step_ms <= overlap.step_ms.min(priority.step_ms) + 1e-9);
        // What it reports is what that configuration gives.
        assert_eq!(found.result, sim.step(&p, &found.cfg).unwrap());
        if bw < 1e9 {
            // A link about as slow as compute: priority wins (the test above).
            assert_eq!(found.cfg.schedule, Schedule::Priority, "{bw}");
        }
    }
    // Tree mode and overlap off refuse priority: the search answers overlap.
    let topo = Topology::flat(2, link(150e6, 20));
    for c in [
        cfg(topo, CommChoice::Fixed(CommMode::Tree), true, None),
        cfg(topo, CommChoice::Fixed(CommMode::Ring), false, None),
    ] {
        let found = search_schedule(&mut sim, &p, &c, true).unwrap();
        assert_eq!(found.cfg.schedule, Schedule::Overlap);
        assert!(found.bucket_kb.is_some());
    }
}

#[test]
fn simulate_searches_the_schedule_and_prices_powersgd_from_a_models_graph() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    std::fs::write(&path, serde_json::to_string(&uneven()).unwrap()).unwrap();
    let p = path.to_str().unwrap();
    let common = ["--workers", "2", "--link-latency", "20us", "--comm", "ring"];
    let (code, out, err) = dptrain(
        &[
            &["simulate", "--profile", p, "--link-bandwidth", "150MB/s"][..],
            &common,
            &[
                "--overlap",
                "on",
                "--compute-spread",
                "0",
                "--search-schedule",
            ],
        ]
        .concat(),
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("priority, partitions of") && out.contains("x overlap's"),
        "{out}"
    );
    // PowerSGD from a graph profile (its matrices are the graph's): far less on the link.
    let graph = [
        "simulate",
        "--model",
        "vgg-small",
        "--device-tflops",
        "1",
        "--efficiency",
        "0.5",
        "--mem-gbs",
        "10",
        "--link-bandwidth",
        "20Mbit",
        "--overlap",
        "on",
    ];
    let comm_ms = |compress: &str| {
        let (code, out, err) = dptrain(
            &[&graph[..], &common, &["--compress", compress]].concat(),
            dir.path(),
        );
        assert_eq!(code, 0, "{err}");
        let row = out.lines().last().unwrap().to_string();
        row.split_whitespace()
            .nth(8)
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    let (none, rank1) = (comm_ms("none"), comm_ms("powersgd:1"));
    assert!(
        rank1 < none / 10.0,
        "powersgd:1 {rank1} ms against none {none} ms"
    );
}

#[test]
fn a_block_written_before_its_input_gradient_leaves_that_much_earlier() {
    // Two blocks of 1.25 MB, a bucket each, on a 125 MB/s link (10 ms each, latency 0).
    // Backward runs b1 (10 ms) then b0 (1 ms): b1's bucket is done at 20 ms, b0's, which
    // waits for it, at 30. With b1 written 6 ms before its backward ends (its input
    // gradient after), b1's bucket is done at 14, b0's at 24: the step 6 ms shorter.
    let block = |name: &str, backward_ms: f64| BlockProfile {
        name: name.into(),
        forward_ms: 0.0,
        backward_ms,
        param_sizes: vec![312_500],
        matrices: None,
        input_grad_ms: None,
        macs_per_sample: 0,
    };
    let mut p = Profile {
        model: "two".into(),
        source: "test".into(),
        batch: 1,
        input: [1, 1, 1],
        blocks: vec![block("b0", 1.0), block("b1", 10.0)],
        update_ms: 0.0,
        compute_spread: None,
    };
    let c = cfg(
        Topology::flat(2, link(125e6, 0)),
        CommChoice::Fixed(CommMode::Redundant),
        true,
        Some(1),
    );
    let mut sim = Simulator::new();
    let whole = sim.step(&p, &c).unwrap().step_ms;
    p.blocks[1].input_grad_ms = Some(6.0);
    let split = sim.step(&p, &c).unwrap().step_ms;
    assert!((whole - 30.0).abs() < 0.01, "{whole}");
    assert!((split - 24.0).abs() < 0.01, "{split}");
}

#[test]
fn a_rescaled_profile_scales_the_input_gradient_with_its_backward() {
    let mut p = uneven();
    p.blocks[2].input_grad_ms = Some(1.0);
    let before = p.backward_written_ms();
    let half = p.rescaled(p.forward_ms(), p.backward_ms() / 2.0, p.update_ms);
    assert_eq!(half.blocks[2].input_grad_ms, Some(0.5));
    for (k, (a, b)) in before.iter().zip(half.backward_written_ms()).enumerate() {
        assert!(
            (a / 2.0 - b).abs() < 1e-12,
            "block {k}: {a} / 2 against {b}"
        );
    }
    // Written before its backward ends by the input gradient, after the later blocks'.
    let later: f64 = p.blocks[3..].iter().map(|b| b.backward_ms).sum();
    assert!(
        (before[2] - (later + 3.0 - 1.0)).abs() < 1e-12,
        "{before:?}"
    );
}
