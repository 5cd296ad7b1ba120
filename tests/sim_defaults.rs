//! The simulator's measured defaults (`sim::defaults`): each positive, documented and cited;
//! stragglers that cost more as the workers grow; the ideal network an upper bound of the
//! prediction with the defaults; `simulate` printing both; and the published comparisons
//! against what they were published at. Fast: well under 10 s in a release build.

use std::time::Duration;

use dptrain::comm::{CommMode, LinkModel};
use dptrain::plan::{BucketFlags, CommChoice, HierarchyChoice};
use dptrain::sim::{
    from_graph, DeviceSpeed, Overheads, Profile, Simulator, StepConfig, Stragglers, Topology,
    MEASURED,
};

fn link(bw: f64, lat_us: u64) -> LinkModel {
    LinkModel {
        bandwidth_bytes_per_s: bw,
        latency: Duration::from_micros(lat_us),
    }
}

/// ResNet-50 at 32 images on a device of P100's throughput (Goyal et al.'s step).
fn resnet50() -> Profile {
    let g = dptrain::model::reference_graph("resnet50").unwrap();
    let speed = DeviceSpeed::ImagesPerSecond {
        images_per_s: 177.1,
        mem_gbs: 732.0,
    };
    from_graph(&g, 32, speed).unwrap()
}

fn cfg(
    topology: Topology,
    comm: CommMode,
    hierarchy: HierarchyChoice,
    overlap: bool,
) -> StepConfig {
    StepConfig {
        compress: dptrain::plan::CompressChoice::NONE,
        schedule: dptrain::parallel::Schedule::Overlap,
        partition_kb: None,
        credit_kb: None,
        topology,
        comm: CommChoice::Fixed(comm),
        hierarchy,
        overlap,
        buckets: BucketFlags::default(),
        planning_link: None,
        planning_intra: None,
        stragglers: Stragglers::NONE,
    }
}

/// `c` with the measured defaults applied to its (line-rate) topology and their stragglers.
fn measured(c: StepConfig) -> StepConfig {
    let o = MEASURED.overheads();
    StepConfig {
        topology: o.apply(c.topology),
        stragglers: Stragglers {
            spread: o.compute_spread,
            seed: 1,
            steps: 20,
        },
        ..c
    }
}

#[test]
fn every_default_is_positive_documented_and_cited() {
    let o = MEASURED.overheads();
    // The values docs/bench/sim-check.md and src/sim/defaults.rs state.
    assert_eq!(o.message_overhead, Duration::from_micros(14));
    assert_eq!(o.nic_efficiency, 0.94);
    assert_eq!(o.compute_spread, 0.015);
    assert_eq!(o.step_overhead, Duration::from_micros(500));
    assert!(o.message_overhead > Duration::ZERO && o.step_overhead > Duration::ZERO);
    assert!(o.nic_efficiency > 0.0 && o.nic_efficiency < 1.0);
    assert!(o.compute_spread > 0.0);
    o.validate().unwrap();
    // Each names its measurement: a source one can look up, not a bare number.
    let sources = [
        (MEASURED.message_overhead.source, "sim-check.md"),
        (MEASURED.nic_efficiency.source, "nccl-tests/issues/290"),
        (MEASURED.compute_spread.source, "arXiv:2208.11035"),
        (MEASURED.step_overhead.source, "horovod/horovod#2468"),
    ];
    for (source, cites) in sources {
        assert!(source.len() > 100 && source.contains(cites), "{source}");
    }
    let rows = MEASURED.rows();
    assert_eq!(rows[0].1, "14 us");
    assert_eq!(rows[1].1, "94% of the line rate");
    assert_eq!(rows[2].1, "1.5% per worker and step");
    assert_eq!(rows[3].1, "0.5 ms");
    assert!(rows
        .iter()
        .all(|(what, _, s)| !what.is_empty() && !s.is_empty()));
}

#[test]
fn the_straggler_cost_grows_with_the_workers() {
    let p = resnet50();
    let mut sim = Simulator::new();
    // A network fast enough that communication hides under backward: what is left is the
    // wait for the slowest worker, exactly (up to 64) and through one host past it.
    let cost = |sim: &mut Simulator, n: usize| {
        let c = cfg(
            Topology::flat(n, link(100e9, 1)),
            CommMode::Ring,
            HierarchyChoice::Auto,
            true,
        );
        let with = StepConfig {
            stragglers: Stragglers {
                spread: MEASURED.compute_spread.value,
                seed: 1,
                steps: 20,
            },
            ..c
        };
        sim.step(&p, &with).unwrap().step_ms / sim.step(&p, &c).unwrap().step_ms
    };
    let costs: Vec<f64> = [2, 8, 64, 256, 1024]
        .iter()
        .map(|&n| cost(&mut sim, n))
        .collect();
    assert!(costs.windows(2).all(|w| w[1] > w[0]), "{costs:?}");
    // About the expected slowest of N draws at 1.5%: 1 + 0.015 sqrt(2 ln N) at most.
    assert!(costs[0] > 1.0 && costs[4] < 1.0 + 0.015 * (2.0 * 1024f64.ln()).sqrt() + 0.01);
    // Past 64 workers the slowest draw stands for every worker: close to simulating each.
    let c = StepConfig {
        stragglers: Stragglers {
            spread: 0.015,
            seed: 3,
            steps: 10,
        },
        ..cfg(
            Topology::flat(128, link(100e9, 1)),
            CommMode::Ring,
            HierarchyChoice::Auto,
            true,
        )
    };
    let bound = Simulator::new().step(&p, &c).unwrap();
    let exact = Simulator::new().every_rank().step(&p, &c).unwrap();
    assert_eq!((bound.simulated_ranks, exact.simulated_ranks), (1, 128));
    let r = bound.step_ms / exact.step_ms;
    assert!(
        (0.99..1.02).contains(&r),
        "{} vs {}",
        bound.step_ms,
        exact.step_ms
    );
}

#[test]
fn the_ideal_network_bounds_the_prediction_with_the_defaults() {
    let p = resnet50();
    let mut sim = Simulator::new();
    let host = |hosts: usize, d: usize| Topology {
        hosts,
        devices_per_host: d,
        intra: link(20e9, 5),
        nic: link(10e9 / 8.0, 10),
        overhead: Duration::ZERO,
        step_overhead: Duration::ZERO,
    };
    for topo in [host(8, 1), host(4, 4), host(16, 8), host(64, 1)] {
        for comm in [CommMode::Ring, CommMode::HalvingDoubling] {
            for hierarchical in [HierarchyChoice::Auto, HierarchyChoice::Off] {
                for overlap in [true, false] {
                    let c = cfg(topo, comm, hierarchical, overlap);
                    let ideal = sim.step(&p, &c).unwrap().step_ms;
                    let with = sim.step(&p, &measured(c)).unwrap().step_ms;
                    assert!(
                        with > ideal,
                        "{topo:?} {comm} hier {hierarchical} overlap {overlap}: {with} <= {ideal}"
                    );
                }
            }
        }
    }
    // The ideal network is the old defaults: no overheads at all.
    assert_eq!(Overheads::IDEAL.apply(host(2, 2)), host(2, 2));
}

#[test]
fn the_published_runs_land_where_the_doc_says() {
    let runs = dptrain::bench::simcheck::published_runs().unwrap();
    assert!(!runs.is_empty());
    for p in &runs {
        // The measured defaults only take efficiency away from the ideal network, and bring
        // the prediction nearer the published figure.
        assert!(p.predicted() < p.ideal, "{}: {p:?}", p.title);
        assert!((p.predicted() - p.published).abs() < (p.ideal - p.published).abs());
        assert!(p.assumptions.iter().all(|a| !a.source.is_empty()));
    }
    // Goyal et al. 2017 (ResNet-50, 8 -> 256 P100s, ~90%): 93.1% with the defaults and a
    // bucket per layer as they aggregated, 99.9% on the ideal network
    // (docs/bench/sim-check.md). Held here to what the defaults give, so that a change to the
    // model or the defaults shows.
    let g = &runs[0];
    assert!(g.title.starts_with("Goyal"));
    assert_eq!(g.published, 90.0);
    assert!((g.predicted() - 93.1).abs() < 0.5, "{}", g.predicted());
    assert!((g.ideal - 99.9).abs() < 0.5, "{}", g.ideal);
}

#[test]
fn simulate_prints_the_ideal_network_beside_each_prediction() {
    let args = [
        "simulate",
        "--model",
        "resnet50",
        "--device-images-per-s",
        "177.1",
        "--workers",
        "8,64",
        "--comm",
        "ring",
        "--overlap",
        "on",
    ];
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
            .args(args.iter().chain(extra))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let effs = |text: &str| -> Vec<(f64, Option<f64>)> {
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<&str>>())
            .filter(|f| f.len() >= 12 && f[2] == "ring")
            .map(|f| {
                (
                    f[11].parse().unwrap(),
                    f.get(12).map(|s| s.parse().unwrap()),
                )
            })
            .collect()
    };
    let (ok, out, err) = run(&[]);
    assert!(ok, "{err}");
    assert!(out.contains("ideal%"), "{out}");
    assert!(
        out.contains("message 14.0 us (measured default)")
            && out.contains("NIC 94% of the line rate (measured default)"),
        "{out}"
    );
    let measured = effs(&out);
    assert_eq!(measured.len(), 2, "{out}");
    for (eff, ideal) in &measured {
        assert!(eff < &ideal.unwrap(), "{out}");
    }
    // Every overhead given as the ideal network's: the ideal column, within rounding.
    let (ok, out0, err) = run(&[
        "--message-overhead",
        "0",
        "--nic-efficiency",
        "1",
        "--step-overhead",
        "0",
        "--compute-spread",
        "0",
    ]);
    assert!(ok, "{err}");
    assert!(out0.contains("message 0.0 us (given)"), "{out0}");
    for (eff, ideal) in effs(&out0) {
        assert!((eff - ideal.unwrap()).abs() <= 0.1, "{out0}");
    }
    // --ideal alone: that column is the table, and the range is not printed.
    let (ok, ideal_out, err) = run(&["--ideal"]);
    assert!(ok, "{err}");
    assert!(
        !ideal_out.contains("ideal%") && ideal_out.contains("(ideal)"),
        "{ideal_out}"
    );
    let ideal_effs = effs(&ideal_out);
    for ((_, col), (eff, none)) in measured.iter().zip(&ideal_effs) {
        assert!(
            none.is_none() && (col.unwrap() - eff).abs() <= 0.1,
            "{ideal_out}"
        );
    }
    // Out of range: refused naming the flag.
    let (ok, _, err) = run(&["--nic-efficiency", "1.5"]);
    assert!(!ok && err.contains("--nic-efficiency"), "{err}");
}
