//! `--comm auto` on clusters of hosts that share a NIC: the cost model's route for a bucket
//! (flat, leader or 2-D hierarchy, and the mode) checked against what it models, the
//! simulator's replay of the real algorithms' recorded schedules, over a grid of hosts x
//! devices per host x link rates x bucket sizes (issue 22).
//!
//! The rule: auto (with the default `--hierarchical auto`) is never more than 5% slower than
//! the best fixed choice a user could make (`--comm tree|ring|hd|redundant` x `--hierarchical
//! 2d|leader|off`) in the simulator; with `--hierarchical 2d` or `leader` fixed, never more
//! than 5% slower than that hierarchy's best mode; forced flat (`off`), 15%.

use std::time::Duration;

use dptrain::comm::{CommMode, Hierarchy, LinkModel};
use dptrain::plan::{BucketFlags, CommChoice, HierarchyChoice};
use dptrain::sim::{BlockProfile, Profile, Simulator, StepConfig, Stragglers, Topology};

fn link(bits_per_s: f64, lat_us: u64) -> LinkModel {
    LinkModel {
        bandwidth_bytes_per_s: bits_per_s / 8.0,
        latency: Duration::from_micros(lat_us),
    }
}

/// One block of `bytes` of gradient and no compute: the step is the collective.
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
            macs_per_sample: 0,
        }],
        update_ms: 0.0,
        compute_spread: None,
    }
}

fn config(topology: Topology, comm: CommChoice, hierarchy: HierarchyChoice) -> StepConfig {
    StepConfig {
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
fn auto_is_within_five_percent_of_the_best_fixed_choice_on_every_cluster() {
    // NICs from 100 Mbit/s to 100 Gbit/s; within a host, a PCIe-class port (12 GB/s, as the
    // issue's P100 hosts) and this machine's in-process link (5 GB/s, 20 us).
    let nics = [
        link(100e6, 100),
        link(1e9, 50),
        link(10e9, 10),
        link(100e9, 5),
    ];
    let intras = [link(96e9, 2), link(40e9, 20)];
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
                    };
                    for bytes in [4096usize, 65_536, 1 << 20, 16 << 20, 256 << 20] {
                        let p = comm_only(bytes);
                        let step = |sim: &mut Simulator, c, h| {
                            sim.step(&p, &config(topology, c, h)).unwrap()
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
