//! `dptrain bench suite`: every comparison the project is judged on, in one command, written
//! to one markdown file with plots, so a result can be reproduced (and a regression seen) by
//! running one thing and reading one page.
//!
//! Sections, each a short version of one `dptrain bench` command (the section says which, to
//! re-run it alone): step time per model and thread count, all-reduce bus bandwidth per size
//! (memory speed and an emulated link), the overlap grid, data wait with and without
//! preloading, the ablation, and the simulator against emulated runs. They run in this process
//! through the bench modules' functions, one after the other (so no two measurements share the
//! cores), and each section's tables are the markdown renderings of the result types its
//! command prints on the terminal.
//!
//! A section that fails is reported in the page (and the command then exits with an error
//! naming it) while the other sections still run: a benchmark prints figures, and one broken
//! section should not hide the rest.

use super::ablation::{AblationArgs, AblationSpec};
use super::allreduce::{self, bench_allreduce, AllReduceTable};
use super::data::{self, export_image_folder, DataResult, Loading};
use super::overlap::{self, GridSpec};
use super::simcheck::SimCheckArgs;
use super::step;
use super::ScratchDir;
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use crate::config::TrainOptions;
use crate::report::plot::{grouped_bars, log_x_lines, NamedSeries};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The markdown file the suite writes into its output directory (`README.md`, so a code host
/// shows it when the directory is opened).
pub const REPORT_FILE: &str = "README.md";

/// The suite's page, known by its first line.
const SUITE_PAGE: crate::output::Kind = crate::output::Kind {
    what: "a benchmark suite page dptrain wrote",
    head: 64,
    is_one: |head| head.starts_with(b"# Benchmark suite\n"),
};

/// Section headings, in page order.
pub const SECTIONS: [&str; 6] = [
    "Step time per model",
    "All-reduce bus bandwidth",
    "Overlap grid",
    "Data wait",
    "Ablation",
    "Simulator vs emulated",
];

/// The plots the suite draws (files in the output directory).
pub const PLOTS: [&str; 6] = [
    "step-time.png",
    "busbw-memory.png",
    "busbw-link.png",
    "overlap.png",
    "data-wait.png",
    "ablation.png",
];

/// Arguments of `dptrain bench suite`.
#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// Output directory: README.md, the plots, ablation.md and ablation.json.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Tiny sizes and a few steps per measurement: checks that every section runs (in about
    /// half a minute); the figures mean little.
    #[arg(long)]
    pub quick: bool,
}

/// The sizes of every section: full, or quick.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    step_models: Vec<&'static str>,
    step_threads: Vec<usize>,
    step_batch: usize,
    step_steps: usize,
    allreduce_sizes: Vec<(&'static str, usize)>,
    allreduce_iters: usize,
    allreduce_link: (&'static str, &'static str),
    overlap_model: &'static str,
    overlap_bandwidth: &'static str,
    overlap_modes: Vec<&'static str>,
    overlap_steps: usize,
    data_steps: usize,
    data_batches: usize,
    ablation: Vec<&'static str>,
    simcheck: Vec<&'static str>,
}

impl Plan {
    fn new(quick: bool) -> Self {
        const MIB: usize = 1 << 20;
        if quick {
            return Self {
                quick,
                step_models: vec!["lenet5"],
                step_threads: vec![1],
                step_batch: 16,
                step_steps: 2,
                allreduce_sizes: vec![("4K", 4096), ("64K", 65536)],
                allreduce_iters: 2,
                allreduce_link: ("10Gbit", "5us"),
                overlap_model: "lenet5",
                overlap_bandwidth: "1Gbit",
                overlap_modes: vec!["tree", "ring"],
                overlap_steps: 3,
                data_steps: 3,
                data_batches: 5,
                ablation: vec!["--steps", "3", "--repeats", "1", "--sim-workers", "8"],
                simcheck: vec![
                    "--model",
                    "lenet5",
                    "--steps",
                    "3",
                    "--link-bandwidth",
                    "100Mbit",
                ],
            };
        }
        Self {
            quick,
            step_models: vec!["lenet5", "vgg-small", "resnet20"],
            step_threads: vec![1, 2],
            step_batch: 64,
            step_steps: 20,
            allreduce_sizes: vec![
                ("4K", 4096),
                ("64K", 65536),
                ("1M", MIB),
                ("16M", 16 * MIB),
                ("64M", 64 * MIB),
            ],
            allreduce_iters: 5,
            allreduce_link: ("10Gbit", "5us"),
            // vgg-small's 0.64 MB of gradients take about as long as its backward (~70 ms on
            // one thread) at 100 Mbit/s: the regime where overlap matters most.
            overlap_model: "vgg-small",
            overlap_bandwidth: "100Mbit",
            overlap_modes: vec!["tree", "ring", "redundant", "auto"],
            overlap_steps: 30,
            data_steps: 60,
            data_batches: 100,
            ablation: vec![],
            simcheck: vec![],
        }
    }
}

/// One section of the page.
struct Section {
    title: &'static str,
    rerun: String,
    body: Result<String, String>,
    seconds: f64,
}

/// What a run of the suite produced.
#[derive(Debug, Clone)]
pub struct SuiteOutcome {
    /// The markdown file written.
    pub report: PathBuf,
    /// Sections that failed, with their errors.
    pub failures: Vec<(String, String)>,
    /// Wall time of the whole suite, s.
    pub wall_seconds: f64,
}

/// Runs every section, writes `out/README.md` and the plots. Fails only if the output cannot be
/// written; failed sections are listed in the outcome (and in the page).
pub fn run(out: &Path, quick: bool) -> Result<SuiteOutcome, String> {
    let started = Instant::now();
    let load_before = load_average();
    // Checked before the minutes of benchmarks whose page it would hold; one refused leaves
    // no empty --out it made.
    let mut created = crate::output::CreatedDirs::default();
    created.create(out).map_err(|e| format!("--out: {e}"))?;
    created.removed_if_failed(|| {
        crate::output::check_writable(&out.join(REPORT_FILE), &SUITE_PAGE)
            .map_err(|e| format!("--out: {e}"))
    })?;
    let plan = Plan::new(quick);
    let done = run_sections(&plan, out);
    let wall_seconds = started.elapsed().as_secs_f64();
    let report = out.join(REPORT_FILE);
    let load = format!(
        "{} at the start, {} at the end",
        load_before,
        load_average()
    );
    let text = page(&done, quick, wall_seconds, &load);
    crate::output::write_atomically(&report, text.as_bytes(), &SUITE_PAGE)?;
    let failures = done
        .iter()
        .filter_map(|s| {
            s.body
                .as_ref()
                .err()
                .map(|e| (s.title.to_string(), e.clone()))
        })
        .collect();
    Ok(SuiteOutcome {
        report,
        failures,
        wall_seconds,
    })
}

/// A section's measuring and its markdown: the plan, and the directory its plots go to.
type SectionFn = fn(&Plan, &Path) -> Result<String, String>;

/// Every section in page order: its title, the command that re-runs it alone, and its
/// function.
fn sections(plan: &Plan) -> [(&'static str, String, SectionFn); 6] {
    [
        (
            SECTIONS[0],
            format!(
                "dptrain bench step --model {} --batch {} --threads {} --steps {}",
                plan.step_models.join(","),
                plan.step_batch,
                join(&plan.step_threads),
                plan.step_steps
            ),
            step_section,
        ),
        (
            SECTIONS[1],
            format!(
                "dptrain bench allreduce --workers 2 --sizes {} --comm tree,ring,hd,redundant --iters {} [--link-bandwidth {} --link-latency {}]",
                plan.allreduce_sizes.iter().map(|s| s.0).collect::<Vec<_>>().join(","),
                plan.allreduce_iters,
                plan.allreduce_link.0,
                plan.allreduce_link.1
            ),
            allreduce_section,
        ),
        (
            SECTIONS[2],
            format!(
                "dptrain bench overlap --model {} --workers 2 --threads 1 --link-bandwidth {} --comm {} --steps {}",
                plan.overlap_model,
                plan.overlap_bandwidth,
                plan.overlap_modes.join(","),
                plan.overlap_steps
            ),
            overlap_section,
        ),
        (
            SECTIONS[3],
            format!(
                "dptrain data export-images --dataset mnist --out /tmp/mnist-png --limit {} && dptrain bench data --dataset imagefolder --data-dir /tmp/mnist-png --augment crop:4,flip --workers 2 --threads 1 --loader-threads 1,2 --steps {} --batches {}",
                data_samples(plan),
                plan.data_steps,
                plan.data_batches
            ),
            data_section,
        ),
        (
            SECTIONS[4],
            format!("dptrain bench ablation {}", plan.ablation.join(" "))
                .trim_end()
                .to_string(),
            ablation_section,
        ),
        (
            SECTIONS[5],
            format!("dptrain bench sim-check {}", plan.simcheck.join(" "))
                .trim_end()
                .to_string(),
            simcheck_section,
        ),
    ]
}

/// Runs every section in turn, saying which is running; a failed section says so and the
/// next one runs.
fn run_sections(plan: &Plan, out: &Path) -> Vec<Section> {
    let q = if plan.quick { " (quick)" } else { "" };
    let mut done = Vec::new();
    for (title, rerun, f) in sections(plan) {
        crate::outln!("[suite{q}] {title} ...");
        let t = Instant::now();
        let body = f(plan, out);
        if let Err(e) = &body {
            crate::outln!("[suite{q}] {title} failed: {e}");
        }
        done.push(Section {
            title,
            rerun,
            body,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    done
}

/// Runs `dptrain bench suite`.
pub fn run_command(a: SuiteArgs) -> Result<(), String> {
    let o = run(&a.out, a.quick)?;
    crate::outln!(
        "suite written to {} (and {} plots); total wall time {:.0} s ({:.1} min)",
        o.report.display(),
        PLOTS.len(),
        o.wall_seconds,
        o.wall_seconds / 60.0
    );
    if o.failures.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} section(s) failed (the others are in {}): {}",
        o.failures.len(),
        o.report.display(),
        o.failures
            .iter()
            .map(|(t, e)| format!("{t}: {e}"))
            .collect::<Vec<_>>()
            .join("; ")
    ))
}

/// The whole page.
fn page(sections: &[Section], quick: bool, wall_seconds: f64, load: &str) -> String {
    let mut s = String::from("# Benchmark suite\n\n");
    s += &format!(
        "Written by `dptrain bench suite{}` ({} in all, on {} CPU core(s); 1-minute load \
         average {load}){}. Every figure is from this machine at that moment: when other jobs \
         share the cores (a load average above the core count), runs slow down unevenly, so \
         read differences of less than ~10-20% as noise. Each section says how to re-run it \
         alone.\n\n",
        if quick { " --quick" } else { "" },
        minutes(wall_seconds),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if quick {
            "; **quick mode: tiny sizes and a few steps, the figures mean little**"
        } else {
            ""
        }
    );
    for sec in sections {
        s += &format!("- [{}](#{})\n", sec.title, anchor(sec.title));
    }
    for sec in sections {
        s += &format!(
            "\n## {}\n\nRe-run just this: `{}` ({:.0} s here)\n\n",
            sec.title, sec.rerun, sec.seconds
        );
        match &sec.body {
            Ok(body) => s += body,
            Err(e) => s += &format!("**This section failed**: {e}\n"),
        }
    }
    s += &format!("\nTotal wall time: {:.0} s.\n", wall_seconds);
    s
}

/// The 1-minute load average (`/proc/loadavg`), or "unknown" where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// "4.2 min" or "35 s".
fn minutes(seconds: f64) -> String {
    if seconds >= 90.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{seconds:.0} s")
    }
}

/// The anchor a markdown renderer gives a heading: lower case, spaces to dashes, other
/// punctuation dropped.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// Training samples exported for the data-wait section's ImageFolder: enough for the
/// pipeline-alone batches and for the training runs (5 untimed steps each) at batch 64.
fn data_samples(plan: &Plan) -> usize {
    64 * (plan.data_steps.max(plan.data_batches) + 5)
}

/// Step time of each model at 1 and 2 threads (one worker, synthetic batch).
fn step_section(plan: &Plan, out: &Path) -> Result<String, String> {
    let mut s = format!(
        "One worker, batch {}, synthetic data; medians of {} steps after 3 warm-up steps, ms.\n\n",
        plan.step_batch, plan.step_steps
    );
    let table = step::measure_table(
        &plan.step_models,
        plan.step_batch,
        &plan.step_threads,
        plan.step_steps,
        crate::backend::ConvAlgo::Direct,
        |_, _| {},
    )?;
    s += &table.markdown();
    let series: Vec<NamedSeries<f64>> = plan
        .step_threads
        .iter()
        .map(|&t| {
            let times = table.rows.iter().filter(|r| r.threads == t);
            (
                format!("{t} thread(s)"),
                times.map(|r| r.times.step_ms).collect(),
            )
        })
        .collect();
    let groups: Vec<String> = plan.step_models.iter().map(|m| m.to_string()).collect();
    grouped_bars(
        &out.join(PLOTS[0]),
        &format!("Training step time, batch {}", plan.step_batch),
        "ms per step",
        &groups,
        &series,
    )?;
    s += &format!("\n![Step time per model]({})\n", PLOTS[0]);
    Ok(s)
}

/// All-reduce time and bus bandwidth per size and mode, 2 workers, at memory speed and on an
/// emulated link.
fn allreduce_section(plan: &Plan, out: &Path) -> Result<String, String> {
    let (bw, lat) = plan.allreduce_link;
    let link = LinkModel {
        bandwidth_bytes_per_s: parse_bandwidth(bw)?,
        latency: parse_duration(lat)?,
    };
    let mut s = format!(
        "2 workers (threads) in this process; median of {} all-reduces after 2 warm-ups (the \
         slowest rank's time). busbw = bytes / time x 2(N-1)/N (nccl-tests' definition). \
         \"memory\": no emulation; \"{bw} / {lat}\": every rank's port emulated at that \
         bandwidth and latency.\n\n",
        plan.allreduce_iters
    );
    for (k, (name, l)) in [
        ("memory".to_string(), None),
        (format!("{bw} / {lat}"), Some(link)),
    ]
    .into_iter()
    .enumerate()
    {
        s += &format!("Link: {name}.\n\n");
        let mut table = AllReduceTable {
            name_width: allreduce::IN_PROCESS_NAME_WIDTH,
            rows: Vec::new(),
        };
        let mut series: Vec<NamedSeries<(f64, f64)>> = Vec::new();
        for mode in CommMode::ALL {
            let mut points = Vec::new();
            for &(_, bytes) in &plan.allreduce_sizes {
                let r = bench_allreduce(2, bytes, mode, l, plan.allreduce_iters)?;
                points.push((bytes as f64, r.busbw / 1e9));
                table.rows.push(r.named(mode.to_string()));
            }
            series.push((mode.to_string(), points));
        }
        s += &table.markdown();
        let file = PLOTS[1 + k];
        log_x_lines(
            &out.join(file),
            &format!("All-reduce bus bandwidth, 2 workers, link: {name}"),
            "bytes",
            "busbw, GB/s",
            &series,
        )?;
        s += &format!("\n![busbw, {name}]({file})\n\n");
    }
    Ok(s)
}

/// The overlap grid: modes x overlap on/off at one bandwidth.
fn overlap_section(plan: &Plan, out: &Path) -> Result<String, String> {
    let scratch = ScratchDir::new("suite-overlap");
    let (workers, batch, latency) = (2, 64, "50us");
    let spec = GridSpec {
        model: plan.overlap_model.into(),
        workers,
        batch,
        threads: 1,
        steps: plan.overlap_steps,
        bucket_kb: None,
        conv_algo: crate::backend::ConvAlgo::default(),
    };
    let single = overlap::single_worker_images_per_s(&spec, scratch.path())?;
    let mut s = format!(
        "{}, {workers} workers x 1 thread, global batch {batch}, synthetic data, emulated link \
         {} / {latency}; {} timed steps per cell (mean step). Efficiency: weak scaling against 1 \
         worker at batch {} ({single:.0} images/s). hidden % = communication under backward.\n\n",
        plan.overlap_model,
        plan.overlap_bandwidth,
        plan.overlap_steps,
        batch / workers
    );
    let bandwidths = [Some(plan.overlap_bandwidth.to_string())];
    let cases = overlap::grid_cases(
        &bandwidths,
        &plan.overlap_modes,
        &[crate::parallel::Schedule::Overlap],
        latency,
    );
    let grid = overlap::measure_grid(&spec, single, &cases, scratch.path(), |_, _| {})?;
    s += &grid.markdown();
    let series: Vec<NamedSeries<f64>> = [("overlap on", true), ("overlap off", false)]
        .into_iter()
        .map(|(name, on)| {
            let cells = grid.cells.iter().filter(|c| c.case.overlap == on);
            (name.to_string(), cells.map(|c| c.mean.step_ms).collect())
        })
        .collect();
    let groups: Vec<String> = plan.overlap_modes.iter().map(|m| m.to_string()).collect();
    grouped_bars(
        &out.join(PLOTS[3]),
        &format!(
            "{}, 2 workers, {}: mean step time",
            plan.overlap_model, plan.overlap_bandwidth
        ),
        "ms per step",
        &groups,
        &series,
    )?;
    s += &format!("\n![Overlap grid]({})\n", PLOTS[3]);
    Ok(s)
}

/// The input pipeline alone, and the data wait of training runs without and with preloading,
/// on an ImageFolder (PNG decode per sample) with augmentation.
fn data_section(plan: &Plan, out: &Path) -> Result<String, String> {
    let scratch = ScratchDir::new("suite-data");
    let images = scratch.path().join("images");
    export_image_folder("mnist", data_samples(plan), 100, &images)?;
    let base = TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(images.clone()),
        augment: Some("crop:4,flip".into()),
        model: Some("lenet5".into()),
        batch: Some(64),
        workers: Some(2),
        threads: Some(1),
        ..Default::default()
    };
    let mut s = format!(
        "MNIST exported as PNG files (decoded per sample by the loaders), augment crop:4,flip, \
         batch 64. First the pipeline alone ({} batches to one consumer that does nothing \
         else), then lenet5 training, 2 workers x 1 thread, {} timed steps (means).\n\n",
        plan.data_batches, plan.data_steps
    );
    let settings = [(1, 0), (1, 2), (2, 2)].map(|(loader_threads, prefetch)| Loading {
        loader_threads,
        prefetch,
    });
    let result = DataResult {
        pipeline: data::measure_pipeline(&base, &settings, plan.data_batches, |_| {})?,
        training: data::measure_training(
            &base,
            &settings,
            plan.data_steps,
            &scratch.path().join("run"),
            |_| {},
        )?,
    };
    s += &result.markdown();
    let bars = result.training.iter().map(|r| r.data_wait_pct).collect();
    let groups = vec![
        "in step".to_string(),
        "1 loader, prefetch 2".to_string(),
        "2 loaders, prefetch 2".to_string(),
    ];
    grouped_bars(
        &out.join(PLOTS[4]),
        "lenet5 on PNG files, 2 workers: data wait",
        "% of step time",
        &groups,
        &[("data wait".to_string(), bars)],
    )?;
    s += &format!("\n![Data wait]({})\n", PLOTS[4]);
    Ok(s)
}

/// The ablation (`bench ablation` with its defaults, or tiny in quick mode); also writes
/// `ablation.md` and `ablation.json`.
fn ablation_section(plan: &Plan, out: &Path) -> Result<String, String> {
    let args = parse_flags::<AblationArgs>("ablation", &plan.ablation)?;
    let report = super::ablation::run(&AblationSpec::from_args(&args)?)?;
    report.write(out)?;
    let groups: Vec<String> = report
        .measured
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let short = m.adds.split(" (").next().unwrap_or(&m.adds);
            format!(
                "{} {}",
                i + 1,
                short.replace("+ ", "+").replace(" mode", "")
            )
        })
        .collect();
    let values = report.measured.iter().map(|m| m.images_per_s).collect();
    grouped_bars(
        &out.join(PLOTS[5]),
        &format!(
            "Ablation: {}, {} workers, link {}",
            report.model, report.workers, report.link
        ),
        "images/s",
        &groups,
        &[("images/s".to_string(), values)],
    )?;
    Ok(format!(
        "{}\n![Ablation images/s per row]({})\n\nAlso in [ablation.md](ablation.md) and \
         [ablation.json](ablation.json).\n",
        report.markdown(),
        PLOTS[5]
    ))
}

/// `dptrain bench sim-check` (its defaults, or tiny in quick mode): its table.
fn simcheck_section(plan: &Plan, _out: &Path) -> Result<String, String> {
    let args = parse_flags::<SimCheckArgs>("sim-check", &plan.simcheck)?;
    let check = super::simcheck::measure_emulated(&args, &mut |_| {})?;
    Ok(format!(
        "The simulator's predicted step against short emulated runs of the same configuration \
         (`sim ms`: from a profile measured here; `cal ms`: the same with the run's own compute \
         times, isolating the communication model){}.\n\n{}",
        if plan.quick {
            ""
        } else {
            "; defaults of `bench sim-check`"
        },
        check.markdown()
    ))
}

/// A benchmark's arguments from `flags`, as its command line would parse them (defaults
/// included).
fn parse_flags<A: clap::Args>(command: &str, flags: &[&str]) -> Result<A, String> {
    #[derive(clap::Parser)]
    struct Cli<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    let argv = std::iter::once(command).chain(flags.iter().copied());
    <Cli<A> as clap::Parser>::try_parse_from(argv)
        .map(|c| c.args)
        .map_err(|e| e.to_string())
}
