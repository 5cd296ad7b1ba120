//! Every layer's gradients against central differences, through whole (tiny) networks: the
//! parameter gradients of each layer, and its input gradient through the parameters of a
//! layer before it. Covers groups, depthwise, dilation, padding, rectangular kernels, odd
//! sizes, batch 1, odd batches (a short last chunk), fused activations, label smoothing.

use dptrain::backend::{ConvAlgo, WinogradTile};
use dptrain::model::{
    BatchNorm, Conv2d, Graph, Linear, ModelBuilder, ModelSpec, Op, Pool, SoftmaxCrossEntropy,
    Units, INPUT,
};
use dptrain::nn::{FlatGrads, Mode, Net, NetConfig, StepInfo};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

fn step(n: usize) -> Mode {
    Mode::Train(StepInfo {
        seed: 7,
        step: 3,
        first_sample: 0,
        global_batch: n,
    })
}

/// Loss (mean over the batch) of `net` on the batch.
fn loss(net: &mut Net, x: &[f32], y: &[u32], n: usize) -> f64 {
    net.forward(x, y, n, step(n)).loss_sum / n as f64
}

/// How a check runs: the relative tolerance, how many random elements of each parameter block
/// it checks (all of a smaller block), and the convolution algorithm.
#[derive(Clone, Copy)]
struct Settings {
    tol: f64,
    picks: usize,
    algo: ConvAlgo,
}

const DEFAULT: Settings = Settings {
    tol: 3e-2,
    picks: 24,
    algo: ConvAlgo::Direct,
};

/// Checks every parameter block of `spec` on input `input` with batch `n`.
fn check(label: &str, spec: &ModelSpec, input: [usize; 3], classes: usize, n: usize) {
    check_with(label, spec, input, classes, n, DEFAULT)
}

/// [`check`] with a given relative tolerance and number of elements checked per block.
fn check_within(
    label: &str,
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    n: usize,
    tol: f64,
    picks: usize,
) {
    check_with(
        label,
        spec,
        input,
        classes,
        n,
        Settings {
            tol,
            picks,
            ..DEFAULT
        },
    )
}

/// [`check`] with `settings`.
fn check_with(
    label: &str,
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    n: usize,
    settings: Settings,
) {
    let Settings { tol, picks, algo } = settings;
    let g = Arc::new(Graph::build(spec, input, classes).unwrap_or_else(|e| panic!("{label}: {e}")));
    let mut net = Net::new(
        g.clone(),
        NetConfig {
            max_batch: n,
            seed: 11,
        },
    )
    .unwrap();
    net.set_conv_algo(algo);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let numel: usize = input.iter().product();
    let x: Vec<f32> = (0..n * numel)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let y: Vec<u32> = (0..n).map(|_| rng.gen_range(0..classes as u32)).collect();
    // Batch-norm gammas and biases away from their init, so every term of the gradient shows.
    let blocks = net.blocks().to_vec();
    for v in net.params_mut().iter_mut() {
        *v += rng.gen_range(-0.2f32..0.2);
    }
    let mut grads = FlatGrads::for_net(&net);
    net.forward(&x, &y, n, step(n));
    net.backward(&mut grads, &mut |_| Ok(())).unwrap();
    // Central differences at several step sizes. Near a ReLU or max-pool kink the estimate
    // converges only as the step shrinks below the kink's distance, so the analytical gradient
    // must match one of them; where none matches and the estimates disagree among themselves
    // the loss is not smooth there and the element is skipped (most elements must be smooth).
    let steps = [2e-3f32, 1e-3, 5e-4, 2.5e-4, 1.25e-4];
    let numerical = |net: &mut Net, p: usize, e: f32| {
        let w0 = net.params()[p];
        net.params_mut()[p] = w0 + e;
        let lp = loss(net, &x, &y, n);
        net.params_mut()[p] = w0 - e;
        let lm = loss(net, &x, &y, n);
        net.params_mut()[p] = w0;
        (lp - lm) / (2.0 * e as f64)
    };
    let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(b.abs()).max(1e-2);
    for (bi, b) in blocks.iter().enumerate() {
        let len = b.range.len();
        let picks: Vec<usize> = if len <= picks {
            (0..len).collect()
        } else {
            (0..picks).map(|_| rng.gen_range(0..len)).collect()
        };
        let (mut checked, mut worst) = (0, (0.0f64, 0usize, 0.0, 0.0));
        for &i in &picks {
            let p = b.range.start + i;
            let nums: Vec<f64> = steps.iter().map(|&e| numerical(&mut net, p, e)).collect();
            let ana = grads.block(bi)[i] as f64;
            let (best, num) = nums
                .iter()
                .map(|&v| (rel(v, ana), v))
                .fold((f64::MAX, 0.0), |a, b| if b.0 < a.0 { b } else { a });
            let spread = nums.iter().map(|&v| rel(v, nums[0])).fold(0.0, f64::max);
            if best >= tol && spread > 2e-2 {
                continue;
            }
            checked += 1;
            if best > worst.0 {
                worst = (best, i, num, ana);
            }
        }
        assert!(
            2 * checked >= picks.len(),
            "{label}: block '{}': only {checked} of {} elements have a smooth loss",
            b.name,
            picks.len()
        );
        assert!(
            worst.0 < tol,
            "{label}: block '{}' element {}: numerical {:.6e} vs analytical {:.6e} (rel. error {:.3})",
            b.name,
            worst.1,
            worst.2,
            worst.3,
            worst.0
        );
    }
}

/// `pre` (a 1x1 conv, so the tested layer's input gradient is checked through its weights),
/// then `body`, then a head to `classes`.
fn net_around(body: impl FnOnce(&mut ModelBuilder, &str) -> String) -> ModelSpec {
    let mut m = ModelBuilder::new("t");
    let x = m.conv2d("pre", INPUT, Conv2d::new(4, 1));
    let x = body(&mut m, &x);
    let x = m.flatten(&x);
    m.linear("head", &x, Linear::new(Units::classes()));
    m.build()
}

#[test]
fn conv2d_geometries() {
    let cases: Vec<(&str, Conv2d, [usize; 3])> = vec![
        ("3x3 pad 1", Conv2d::new(5, 3).padding(1), [3, 7, 6]),
        (
            "3x3 stride 2 pad 1",
            Conv2d::new(6, 3).stride(2).padding(1),
            [2, 9, 8],
        ),
        ("5x5 no pad", Conv2d::new(3, 5), [1, 9, 9]),
        (
            "dilation 2",
            Conv2d::new(4, 3).dilation(2).padding(2),
            [2, 8, 7],
        ),
        (
            "groups 2",
            Conv2d::new(6, 3).groups(2).padding(1),
            [4, 6, 6],
        ),
        (
            "depthwise",
            Conv2d::new(4, 3).depthwise().padding(1),
            [4, 6, 5],
        ),
        (
            "depthwise x2, stride 2",
            Conv2d::new(8, 3).depthwise().stride(2).padding(1),
            [4, 7, 7],
        ),
        ("1x1 no bias", Conv2d::new(5, 1).no_bias(), [3, 4, 4]),
        ("1x1 stride 2", Conv2d::new(5, 1).stride(2), [3, 5, 5]),
        (
            "rect 1x3 pad (0,1)",
            Conv2d {
                kernel: [1, 3],
                padding: Some([0, 1]),
                ..Conv2d::new(4, 1)
            },
            [2, 5, 6],
        ),
        (
            "rect 3x1 stride (2,1)",
            Conv2d {
                kernel: [3, 1],
                stride: [2, 1],
                ..Conv2d::new(4, 1)
            },
            [2, 7, 5],
        ),
        (
            "same padding",
            Conv2d {
                padding: None,
                ..Conv2d::new(3, 5)
            },
            [2, 6, 6],
        ),
    ];
    for (label, conv, input) in cases {
        // The conv reads the 1x1 pre-conv's 4 channels; depthwise needs 4 in.
        let spec = net_around(|m, x| m.conv2d("conv", x, conv.clone()));
        for n in [1, 5] {
            check(&format!("conv2d {label}, batch {n}"), &spec, input, 3, n);
        }
    }
}

/// A small residual net whose 3x3 stride-1 convolutions (padding 1, and 0 and 2, whose input
/// gradient is not Winograd's) run through each Winograd tile, odd sizes and a batch of 1.
#[test]
fn winograd_convolutions() {
    let mut m = ModelBuilder::new("t");
    let x = m.conv2d("c1", INPUT, Conv2d::new(5, 3).padding(1));
    let x = m.relu(&x);
    let y = m.conv2d("c2", &x, Conv2d::new(5, 3).padding(1).no_bias());
    let y = m.batch_norm("bn", &y);
    let x = m.add(&[&x, &y]);
    let x = m.conv2d("c3", &x, Conv2d::new(4, 3));
    let x = m.conv2d("c4", &x, Conv2d::new(3, 3).padding(2));
    let x = m.flatten(&x);
    m.linear("head", &x, Linear::new(Units::classes()));
    let spec = m.build();
    for tile in [WinogradTile::F2, WinogradTile::F4] {
        for (n, input) in [(1, [3, 7, 6]), (4, [2, 9, 9])] {
            let label = format!("winograd {tile:?}, batch {n}, input {input:?}");
            let algo = ConvAlgo::Winograd(tile);
            check_with(&label, &spec, input, 3, n, Settings { algo, ..DEFAULT });
        }
    }
}

#[test]
fn conv2d_fused_relu_and_first_layer() {
    let mut m = ModelBuilder::new("t");
    let x = m.conv2d("conv", INPUT, Conv2d::new(4, 3).padding(1));
    let x = m.relu(&x);
    let x = m.flatten(&x);
    m.linear("head", &x, Linear::new(Units::classes()));
    check("conv (first layer) + relu", &m.build(), [2, 5, 5], 3, 6);
}

#[test]
fn batch_norm_train_mode_with_fused_activations() {
    for act in ["none", "relu", "relu6"] {
        let spec = net_around(|m, x| {
            let c = m.conv2d("conv", x, Conv2d::new(3, 3).padding(1).no_bias());
            let b = m.layer("bn", Op::BatchNorm(BatchNorm::default()), &[&c]);
            match act {
                "relu" => m.relu(&b),
                "relu6" => m.relu6(&b),
                _ => b,
            }
        });
        for n in [1, 3, 8] {
            // Batch 1 with 1x1... here 5x5 pixels, so the statistics are over 25+ values.
            check(
                &format!("batch_norm + {act}, batch {n}"),
                &spec,
                [2, 5, 5],
                3,
                n,
            );
        }
    }
}

#[test]
fn pooling() {
    let cases: Vec<(&str, Op, [usize; 3])> = vec![
        ("max 2x2", Op::MaxPool(Pool::new(2)), [2, 6, 7]),
        (
            "max 3x3 stride 2 pad 1 (overlapping)",
            Op::MaxPool(Pool::new(3).stride(2).padding(1)),
            [2, 7, 7],
        ),
        ("avg 2x2", Op::AvgPool(Pool::new(2), true), [2, 6, 6]),
        (
            "avg 3x3 s1 p1 incl pad",
            Op::AvgPool(Pool::new(3).stride(1).padding(1), true),
            [2, 5, 5],
        ),
        (
            "avg 3x3 s2 p1 excl pad",
            Op::AvgPool(Pool::new(3).stride(2).padding(1), false),
            [2, 7, 6],
        ),
        ("global avg", Op::GlobalAvgPool, [2, 5, 3]),
    ];
    for (label, op, input) in cases {
        let spec = net_around(|m, x| m.layer("pool", op.clone(), &[x]));
        for n in [1, 4] {
            check(&format!("{label}, batch {n}"), &spec, input, 3, n);
        }
    }
}

#[test]
fn activations_add_concat_dropout() {
    let add = net_around(|m, x| {
        let a = m.conv2d("a", x, Conv2d::new(4, 3).padding(1));
        let s = m.add(&[&a, x]);
        m.relu(&s)
    });
    check("add + relu (residual)", &add, [2, 5, 5], 3, 5);
    let cat = net_around(|m, x| {
        let a = m.conv2d("a", x, Conv2d::new(3, 3).padding(1));
        let b = m.conv2d("b", x, Conv2d::new(2, 1));
        let c = m.concat(&[x, &a, &b]);
        m.relu6(&c)
    });
    check("concat of three + relu6", &cat, [2, 4, 5], 3, 3);
    let drop = net_around(|m, x| {
        let d = m.dropout(x, 0.3);
        m.relu(&d)
    });
    check("dropout", &drop, [2, 4, 4], 3, 4);
    let act = net_around(|m, x| {
        // A relu that cannot fuse: its input is read twice.
        let r = m.relu(x);
        let r6 = m.relu6(x);
        m.add(&[&r, &r6])
    });
    check("relu and relu6 unfused", &act, [2, 4, 4], 3, 3);
}

#[test]
fn linear_stack_with_label_smoothing() {
    let mut m = ModelBuilder::new("t");
    let x = m.flatten(INPUT);
    let x = m.linear("fc1", &x, Linear::new(7));
    let x = m.relu(&x);
    let x = m.linear(
        "fc2",
        &x,
        Linear {
            out: Units::Fixed(6),
            bias: false,
        },
    );
    let x = m.linear("fc3", &x, Linear::new(Units::classes()));
    let l = SoftmaxCrossEntropy {
        label_smoothing: 0.1,
        weight: 1.0,
    };
    m.layer("loss", Op::SoftmaxCrossEntropy(l), &[&x]);
    let spec = m.build();
    for n in [1, 9] {
        check(
            &format!("linear stack, smoothing, batch {n}"),
            &spec,
            [2, 3, 3],
            4,
            n,
        );
    }
}

#[test]
fn builtin_blocks_of_every_shape() {
    // Whole small networks from the built-in files at a small input. Deep networks with batch
    // norm on few rows put many ReLU kinks within any step a float difference can resolve, so
    // the bound is looser here; every layer type is checked tightly above.
    for (name, input) in [
        ("resnet20", [3, 8, 8]),
        ("mobilenetv2", [3, 16, 16]),
        ("densenet-small", [3, 8, 8]),
        ("lenet5", [1, 16, 16]),
    ] {
        let spec = dptrain::model::load(name).unwrap();
        check_within(name, &spec, input, 10, 4, 8e-2, 8);
    }
}
