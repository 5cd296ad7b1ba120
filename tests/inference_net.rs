//! A net set up for inference only (`Net::for_inference`, what eval and predict run) gives the
//! same logits, to the bit, as the training net's evaluation forward, for every built-in model
//! that trains here and the every-layer fixture, in less buffer memory; it refuses a backward,
//! and a forward after the first allocates nothing.

use dptrain::model::{self, Graph};
use dptrain::nn::{FlatGrads, Mode, Net, NetConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the threads of the forward under test count (the harness runs other tests
    // beside it).
    static WATCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) && WATCHED.with(|w| w.get()) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn graph(name: &str) -> Arc<Graph> {
    if name == "every_layer" {
        let text = include_str!("fixtures/every_layer.toml");
        let spec = model::file::parse(text, "every_layer.toml", "every_layer").unwrap();
        return Arc::new(Graph::build(&spec, [3, 12, 12], 5).unwrap());
    }
    Arc::new(model::reference_graph(name).unwrap())
}

fn images(g: &Graph, n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n * g.input().numel())
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect()
}

#[test]
fn inference_nets_give_the_training_nets_evaluation_logits_to_the_bit() {
    let models = ["lenet5", "vgg-small", "resnet20", "resnet18", "mobilenetv2"];
    for name in models.into_iter().chain(["densenet-small", "every_layer"]) {
        let g = graph(name);
        let cfg = NetConfig {
            max_batch: 4,
            seed: 5,
        };
        let mut train = Net::new(g.clone(), cfg).unwrap();
        let mut infer = Net::for_inference(g.clone(), cfg).unwrap();
        assert_eq!(
            train.params(),
            infer.params(),
            "{name}: same initial weights"
        );
        // Training steps move the batch-norm statistics away from their initial values.
        let labels = [0u32, 1, 2, 3];
        for step in 0..2 {
            let x = images(&g, 4, step);
            let info = dptrain::nn::StepInfo {
                seed: 5,
                step,
                first_sample: 0,
                global_batch: 4,
            };
            train.forward(&x, &labels, 4, Mode::Train(info));
        }
        infer.state_mut().copy_from_slice(train.state());
        for n in [4, 3] {
            let x = images(&g, n, 9 + n as u64);
            let a = train.forward(&x, &labels, n, Mode::Eval);
            let b = infer.forward(&x, &labels, n, Mode::Eval);
            assert_eq!(train.logits(), infer.logits(), "{name} at batch {n}");
            assert_eq!(a, b, "{name}: same loss and correct count");
        }
        assert!(
            infer.buffer_bytes() < train.buffer_bytes(),
            "{name}: {} bytes of buffers, the training net {}",
            infer.buffer_bytes(),
            train.buffer_bytes()
        );
    }
}

#[test]
fn an_inference_net_refuses_a_backward_and_allocates_nothing_per_forward() {
    let g = graph("resnet20");
    let cfg = NetConfig {
        max_batch: 8,
        seed: 1,
    };
    let mut net = Net::for_inference(g.clone(), cfg).unwrap();
    let x = images(&g, 8, 1);
    let labels = [0u32; 8];
    net.forward(&x, &labels, 8, Mode::Eval);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .start_handler(|_| WATCHED.with(|w| w.set(true)))
        .build()
        .unwrap();
    pool.install(|| net.forward(&x, &labels, 8, Mode::Eval));
    WATCHED.with(|w| w.set(true));
    COUNTING.store(true, Ordering::SeqCst);
    for n in [8, 5, 8] {
        pool.install(|| net.forward(&x, &labels, n, Mode::Eval));
    }
    COUNTING.store(false, Ordering::SeqCst);
    WATCHED.with(|w| w.set(false));
    assert_eq!(
        ALLOCATIONS.load(Ordering::SeqCst),
        0,
        "allocations in forward"
    );
    let mut grads = FlatGrads::for_net(&net);
    let err = net.backward(&mut grads, &mut |_| Ok(())).unwrap_err();
    assert!(err.contains("inference"), "{err}");
}

#[test]
fn bench_infer_prints_a_result_line_per_thread_count_and_refuses_zero_threads() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
            .args([
                "bench", "infer", "--model", "lenet5", "--batch", "4", "--steps", "1",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["--threads", "1,2"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for t in [1, 2] {
        let line = format!("RESULT dptrain lenet5 infer threads={t} median_ms=");
        assert!(out.contains(&line), "{out}");
    }
    let o = run(&["--threads", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--threads 0"));
}
