//! A steady-state training step allocates nothing: a counting global allocator watches every
//! thread of the run but the test's own (workers, their communication threads, the loader
//! threads) while worker 0 runs steps 3 to 10, with 2 workers and overlap on, for each
//! built-in model that trains here.

use dptrain::config::TrainOptions;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // The test's thread (which runs the run's event loop: progress, metrics) is not counted.
    static EXEMPT: Cell<bool> = const { Cell::new(false) };
}

static TRACE: AtomicBool = AtomicBool::new(false);
static TRACES: std::sync::Mutex<Vec<(usize, std::backtrace::Backtrace)>> =
    std::sync::Mutex::new(Vec::new());

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if COUNTING.load(Ordering::Relaxed) && !EXEMPT.with(|e| e.get()) && !INSIDE.with(|i| i.get()) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size, Ordering::Relaxed);
        // DPTRAIN_ALLOC_TRACE=1: where each counted allocation comes from.
        if TRACE.load(Ordering::Relaxed) {
            INSIDE.with(|i| i.set(true));
            let bt = std::backtrace::Backtrace::force_capture();
            TRACES.lock().unwrap().push((size, bt));
            INSIDE.with(|i| i.set(false));
        }
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size());
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new);
        System.realloc(p, l, new)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Counts from the start of worker 0's step 3 to the end of its step 10.
fn observer(rank: usize, step: usize, started: bool) {
    if rank != 0 {
        return;
    }
    if started && step == 3 {
        COUNTING.store(true, Ordering::SeqCst);
    }
    if !started && step == 10 {
        COUNTING.store(false, Ordering::SeqCst);
    }
}

#[test]
fn steady_state_steps_allocate_nothing() {
    dptrain::train::worker::set_step_observer(observer).unwrap();
    TRACE.store(
        std::env::var_os("DPTRAIN_ALLOC_TRACE").is_some(),
        Ordering::SeqCst,
    );
    EXEMPT.with(|e| e.set(true));
    let dir = tempfile::tempdir().unwrap();
    // (model, dataset, batch, --conv-algo): 14+ steps in one epoch, so no evaluation falls in
    // the window. resnet18 with auto runs both Winograd tiles (F(2x2) on its 4x4 layers).
    let cases = [
        ("lenet5", "synthetic:1x28x28:10", 32, "direct", "none"),
        ("vgg-small", "synthetic:3x32x32:10", 16, "direct", "none"),
        ("resnet20", "synthetic:3x32x32:10", 16, "direct", "none"),
        ("mobilenetv2", "synthetic:3x32x32:10", 8, "direct", "none"),
        ("resnet18", "synthetic:3x32x32:10", 8, "direct", "none"),
        (
            "densenet-small",
            "synthetic:3x32x32:10",
            16,
            "direct",
            "none",
        ),
        ("resnet18", "synthetic:3x32x32:10", 8, "auto", "none"),
        (
            "vgg-small",
            "synthetic:3x32x32:10",
            16,
            "winograd:2",
            "none",
        ),
        // Compressed gradients encode into a buffer the communication thread reserved.
        ("vgg-small", "synthetic:3x32x32:10", 16, "direct", "fp16"),
        ("lenet5", "synthetic:1x28x28:10", 32, "direct", "bf16"),
        // PowerSGD's state and both rounds' buffers travel with the bucket, allocated once.
        ("lenet5", "synthetic:1x28x28:10", 32, "direct", "powersgd:2"),
    ];
    // Priority scheduling: buckets in partitions, rank 0's decisions, the update of each
    // bucket in the next forward.
    let priority_cases = [
        ("vgg-small", "synthetic:3x32x32:10", 16, "direct", "none"),
        ("lenet5", "synthetic:1x28x28:10", 32, "direct", "powersgd:2"),
    ];
    let all = cases.iter().map(|&c| (c, false));
    let all = all.chain(priority_cases.iter().map(|&c| (c, true)));
    for ((name, dataset, batch, conv_algo, compress), priority) in all {
        let schedule = if priority { "priority" } else { "overlap" };
        let model = format!("{name} ({conv_algo}, --compress {compress}, --schedule {schedule})");
        let model = model.as_str();
        ALLOCATIONS.store(0, Ordering::SeqCst);
        BYTES.store(0, Ordering::SeqCst);
        let o = TrainOptions {
            model: Some(name.into()),
            conv_algo: Some(conv_algo.into()),
            dataset: Some(dataset.into()),
            workers: Some(2),
            threads: Some(1),
            batch: Some(batch),
            epochs: Some(1),
            train_limit: Some(batch * 12),
            test_limit: Some(16),
            overlap: Some("on".into()),
            comm: Some("ring".into()),
            compress: Some(compress.into()),
            bucket_kb: Some(64.into()),
            schedule: Some(schedule.into()),
            partition_kb: priority.then_some(16.into()),
            run_dir: Some(
                dir.path()
                    .join(format!("{name}-{conv_algo}-{compress}-{schedule}")),
            ),
            quiet: true,
            no_checkpoints: true,
            ..Default::default()
        };
        dptrain::train::train(o.resolve().unwrap()).unwrap_or_else(|e| panic!("{model}: {e}"));
        assert!(
            !COUNTING.load(Ordering::SeqCst),
            "{model}: the window closed"
        );
        let (n, bytes) = (
            ALLOCATIONS.load(Ordering::SeqCst),
            BYTES.load(Ordering::SeqCst),
        );
        for (size, bt) in TRACES.lock().unwrap().drain(..) {
            eprintln!("{model}: allocation of {size} bytes:\n{bt}");
        }
        assert_eq!(
            n, 0,
            "{model}: steps 3-10 allocated {n} times ({bytes} bytes)"
        );
    }
}
