//! The backend seam, proved by a second backend: every kernel a layer calls, and whole
//! networks forward and backward, agree between the CPU backend (`backend::default_kernels`)
//! and a plain-loops reference (`reference.rs`) within a float tolerance, on small random
//! inputs. Covers convolutions with groups, depthwise, dilation, stride, padding and
//! rectangular kernels, batch norm in training and evaluation, max/average/global pooling,
//! linear layers, activations fused and alone, residual adds, concatenation, dropout,
//! flatten, the input transpose and the loss, each with and without accumulation.

mod reference;

use dptrain::backend::{
    default_kernels, sum_order, Act, ConvAlgo, ConvGeom, DropoutMask, Kernels, PoolGeom,
};
use dptrain::model::{Conv2d, Graph, Linear, ModelBuilder, Pool, Units, INPUT};
use dptrain::nn::{FlatGrads, Mode, Net, NetConfig, StepInfo};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reference::Reference;
use std::sync::Arc;

/// `len` values uniform in [-1, 1), from `seed`.
fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Asserts `got` (the CPU's) and `want` (the reference's) agree: each element within `tol`
/// of the other, relative to the larger of 1 and the largest value of `want`.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: element {i} of {}: CPU {g}, reference {w} (tolerance {})",
            got.len(),
            tol * scale
        );
    }
}

/// Runs `f` on the CPU backend and on the reference, and checks that every buffer it returns
/// agrees.
fn agree(what: &str, tol: f32, mut f: impl FnMut(&mut dyn Kernels) -> Vec<Vec<f32>>) {
    let mut cpu = default_kernels();
    cpu.set_batch_chunk(sum_order::BATCH_CHUNK);
    cpu.set_conv_algo(ConvAlgo::Direct);
    let got = f(&mut *cpu);
    let want = f(&mut Reference);
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("{what}, buffer {k}"), g, w, tol);
    }
}

/// A convolution's geometry, its output size derived as PyTorch does.
#[allow(clippy::too_many_arguments)]
fn conv(
    c: usize,
    hw: [usize; 2],
    o: usize,
    k: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
) -> ConvGeom {
    let out = |len: usize, i: usize| (len + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) / stride[i] + 1;
    ConvGeom {
        c,
        h: hw[0],
        w: hw[1],
        o,
        oh: out(hw[0], 0),
        ow: out(hw[1], 1),
        kh: k[0],
        kw: k[1],
        sh: stride[0],
        sw: stride[1],
        ph: pad[0],
        pw: pad[1],
        dh: dil[0],
        dw: dil[1],
        groups,
    }
}

/// A pooling window's geometry.
fn pool(c: usize, hw: [usize; 2], k: [usize; 2], stride: [usize; 2], pad: [usize; 2]) -> PoolGeom {
    let out = |len: usize, i: usize| (len + 2 * pad[i] - k[i]) / stride[i] + 1;
    PoolGeom {
        c,
        h: hw[0],
        w: hw[1],
        oh: out(hw[0], 0),
        ow: out(hw[1], 1),
        kh: k[0],
        kw: k[1],
        sh: stride[0],
        sw: stride[1],
        ph: pad[0],
        pw: pad[1],
    }
}

const ACTS: [Act; 3] = [Act::None, Act::Relu, Act::Relu6];

#[test]
fn convolutions_agree_forward_and_backward() {
    let cases = [
        (
            "3x3 pad 1",
            conv(3, [6, 5], 4, [3, 3], [1, 1], [1, 1], [1, 1], 1),
        ),
        (
            "3x3 stride 2",
            conv(4, [7, 7], 5, [3, 3], [2, 2], [1, 1], [1, 1], 1),
        ),
        (
            // The weight gradient's A (the column matrix, 45 rows read transposed) packed,
            // since 130 outputs make 5 or more B panels, with a short last panel of A.
            "3x3 to 130 channels",
            conv(5, [5, 5], 130, [3, 3], [1, 1], [1, 1], [1, 1], 1),
        ),
        (
            "3x3 dilation 2",
            conv(3, [8, 7], 4, [3, 3], [1, 1], [2, 2], [2, 2], 1),
        ),
        (
            "1x3 rectangular",
            conv(2, [5, 6], 3, [1, 3], [1, 1], [0, 1], [1, 1], 1),
        ),
        (
            "5x5 valid",
            conv(2, [7, 6], 3, [5, 5], [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "1x1 pointwise",
            conv(6, [4, 4], 5, [1, 1], [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "1x1 stride 2",
            conv(6, [5, 5], 4, [1, 1], [2, 2], [0, 0], [1, 1], 1),
        ),
        (
            "groups 2",
            conv(4, [5, 5], 6, [3, 3], [1, 1], [1, 1], [1, 1], 2),
        ),
        (
            "depthwise",
            conv(5, [6, 6], 5, [3, 3], [1, 1], [1, 1], [1, 1], 5),
        ),
        (
            "depthwise x2 stride 2",
            conv(4, [7, 6], 8, [3, 3], [2, 2], [1, 1], [1, 1], 4),
        ),
        (
            "depthwise dilated",
            conv(3, [7, 7], 3, [3, 3], [1, 1], [2, 2], [2, 2], 3),
        ),
    ];
    for (name, g) in cases {
        for (n, bias, a) in [
            (1, true, Act::None),
            (5, false, Act::Relu),
            (9, true, Act::Relu6),
        ] {
            let wl = g.weight_len();
            let x = random(n * g.in_len(), 1);
            let wb = random(wl + g.o, 2);
            let dy0 = random(n * g.out_len(), 3);
            let dx0 = random(n * g.in_len(), 4);
            agree(&format!("conv {name}, batch {n}"), 1e-4, |k| {
                let (w, b) = wb.split_at(wl);
                let mut y = vec![0.0; n * g.out_len()];
                k.conv2d_forward(&g, n, &x, w, bias.then_some(b), a, &mut y);
                let mut dy = dy0.clone();
                k.act_mask(a, &y, &mut dy);
                let mut dwb = vec![0.0; wl + if bias { g.o } else { 0 }];
                let (mut dx, mut dx_acc) = (vec![0.0; dx0.len()], dx0.clone());
                k.conv2d_backward(&g, n, &x, w, &dy, &mut dwb, bias, Some((&mut dx, false)));
                k.conv2d_backward(&g, n, &x, w, &dy, &mut dwb, bias, Some((&mut dx_acc, true)));
                let mut dwb_alone = vec![0.0; dwb.len()];
                k.conv2d_backward(&g, n, &x, w, &dy, &mut dwb_alone, bias, None);
                // The input gradient alone is the same bits as the whole backward's.
                let mut dx_alone = dx0.clone();
                k.conv2d_input_grad(&g, n, w, &dy, &mut dx_alone, true);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&dx_alone), bits(&dx_acc), "conv {name}: dx alone");
                let mut dx_fresh = vec![0.0; dx0.len()];
                k.conv2d_input_grad(&g, n, w, &dy, &mut dx_fresh, false);
                assert_eq!(
                    bits(&dx_fresh),
                    bits(&dx),
                    "conv {name}: dx alone, not added"
                );
                assert_eq!(bits(&dwb_alone), bits(&dwb), "conv {name}: dw alone");
                vec![y, dy, dwb, dx, dx_acc, dwb_alone, dx_alone]
            });
        }
    }
}

#[test]
fn linear_layers_agree_forward_and_backward() {
    for (n, i, o, bias, a) in [
        (1, 7, 3, true, Act::None),
        (6, 20, 9, false, Act::Relu),
        (13, 33, 10, true, Act::Relu6),
    ] {
        let x = random(n * i, 5);
        let wb = random(o * i + o, 6);
        let dy0 = random(n * o, 7);
        let dx0 = random(n * i, 8);
        agree(&format!("linear {i}->{o}, batch {n}"), 1e-4, |k| {
            let (w, b) = wb.split_at(o * i);
            let mut y = vec![0.0; n * o];
            k.linear_forward(n, i, o, &x, w, bias.then_some(b), a, &mut y);
            let mut dy = dy0.clone();
            k.act_mask(a, &y, &mut dy);
            let mut dwb = vec![0.0; o * i + if bias { o } else { 0 }];
            let mut dx = dx0.clone();
            k.linear_backward(n, i, o, &x, w, &dy, &mut dwb, bias, Some((&mut dx, true)));
            vec![y, dy, dwb, dx]
        });
    }
}

#[test]
fn batch_norm_agrees_in_training_evaluation_and_backward() {
    for (rows, c, a) in [(2, 3, Act::None), (37, 5, Act::Relu), (300, 4, Act::Relu6)] {
        // Values away from zero mean and unit variance, so the statistics matter.
        let x: Vec<f32> = random(rows * c, 9).iter().map(|v| 3.0 * v + 0.5).collect();
        let gb: Vec<f32> = random(2 * c, 10).iter().map(|v| v + 0.5).collect();
        let running: Vec<f32> = random(2 * c, 11).iter().map(|v| v.abs() + 0.1).collect();
        let dy0 = random(rows * c, 12);
        let dx0 = random(rows * c, 13);
        agree(&format!("batch norm {rows}x{c}"), 2e-4, |k| {
            let mut y = vec![0.0; rows * c];
            let mut saved = vec![0.0; 3 * c];
            k.batch_norm_forward_train(rows, c, &x, &gb, 1e-5, a, &mut y, &mut saved);
            let mut y_eval = vec![0.0; rows * c];
            k.batch_norm_forward_eval(rows, c, &x, &gb, &running, 1e-5, a, &mut y_eval);
            let mut dy = dy0.clone();
            let mut dgb = vec![0.0; 2 * c];
            let (mut dx, mut dx_acc) = (vec![0.0; rows * c], dx0.clone());
            let mut dy_acc = dy0.clone();
            let mut dgb_acc = vec![0.0; 2 * c];
            let bwd = |k: &mut dyn Kernels,
                       dy: &mut [f32],
                       dgb: &mut [f32],
                       dx: &mut [f32],
                       acc| {
                k.batch_norm_backward(rows, c, &x, &y, dy, &gb, &saved, a, dgb, Some((dx, acc)));
            };
            bwd(k, &mut dy, &mut dgb, &mut dx, false);
            bwd(k, &mut dy_acc, &mut dgb_acc, &mut dx_acc, true);
            vec![y.clone(), saved.clone(), y_eval, dy, dgb, dx, dx_acc]
        });
    }
}

#[test]
fn pooling_agrees_forward_and_backward() {
    let cases = [
        ("2x2 stride 2", pool(3, [6, 6], [2, 2], [2, 2], [0, 0])),
        (
            "3x3 stride 2 pad 1",
            pool(4, [7, 6], [3, 3], [2, 2], [1, 1]),
        ),
        (
            "3x3 stride 1 pad 1",
            pool(2, [5, 5], [3, 3], [1, 1], [1, 1]),
        ),
        ("3x2 stride 1", pool(3, [6, 5], [3, 2], [1, 1], [0, 0])),
        ("3x3 stride 2", pool(5, [9, 9], [3, 3], [2, 2], [0, 0])),
    ];
    for (name, g) in cases {
        let n = 3;
        let x = random(n * g.in_len(), 14);
        let dy = random(n * g.out_len(), 15);
        let dx0 = random(n * g.in_len(), 16);
        agree(&format!("max pool {name}"), 1e-5, |k| {
            let mut y = vec![0.0; n * g.out_len()];
            let mut arg = vec![0u8; y.len()];
            k.max_pool_forward(&g, n, &x, &mut y, &mut arg);
            let (mut dx, mut dx_acc) = (vec![0.0; dx0.len()], dx0.clone());
            k.max_pool_backward(&g, n, &dy, &arg, &mut dx, false);
            k.max_pool_backward(&g, n, &dy, &arg, &mut dx_acc, true);
            vec![y, dx, dx_acc]
        });
        for include_pad in [true, false] {
            agree(
                &format!("avg pool {name}, pad counted {include_pad}"),
                1e-5,
                |k| {
                    let mut y = vec![0.0; n * g.out_len()];
                    k.avg_pool_forward(&g, n, &x, &mut y, include_pad);
                    let (mut dx, mut dx_acc) = (vec![0.0; dx0.len()], dx0.clone());
                    k.avg_pool_backward(&g, n, &dy, &mut dx, false, include_pad);
                    k.avg_pool_backward(&g, n, &dy, &mut dx_acc, true, include_pad);
                    vec![y, dx, dx_acc]
                },
            );
        }
    }
    let (n, p, c) = (3, 7, 5);
    let x = random(n * p * c, 17);
    let dy = random(n * c, 18);
    let dx0 = random(n * p * c, 19);
    agree("global average pool", 1e-5, |k| {
        let mut y = vec![0.0; n * c];
        k.global_avg_pool_forward(n, p, c, &x, &mut y);
        let (mut dx, mut dx_acc) = (vec![0.0; dx0.len()], dx0.clone());
        k.global_avg_pool_backward(n, p, c, &dy, &mut dx, false);
        k.global_avg_pool_backward(n, p, c, &dy, &mut dx_acc, true);
        vec![y, dx, dx_acc]
    });
}

#[test]
fn element_wise_kernels_agree() {
    // Values over [-8, 8), so relu6 clips on both sides.
    let x: Vec<f32> = random(3000, 20).iter().map(|v| 8.0 * v).collect();
    let x2 = random(3000, 21);
    let x3 = random(3000, 22);
    let dy = random(3000, 23);
    let dx0 = random(3000, 24);
    for a in ACTS {
        agree(&format!("activation {a:?}"), 1e-6, |k| {
            let mut y = vec![0.0; x.len()];
            k.act_forward(a, &x, &mut y);
            let (mut dx, mut dx_acc) = (vec![0.0; x.len()], dx0.clone());
            k.act_backward(a, &y, &dy, &mut dx, false);
            k.act_backward(a, &y, &dy, &mut dx_acc, true);
            let mut masked = dy.clone();
            k.act_mask(a, &y, &mut masked);
            let mut sum = vec![0.0; x.len()];
            k.add_forward(a, &[&x, &x2, &x3], &mut sum);
            vec![y, dx, dx_acc, masked, sum]
        });
    }
    agree("copy_grad", 0.0, |k| {
        let (mut dx, mut dx_acc) = (vec![0.0; x.len()], dx0.clone());
        k.copy_grad(&dy, &mut dx, false);
        k.copy_grad(&dy, &mut dx_acc, true);
        vec![dx, dx_acc]
    });
    let m = DropoutMask {
        p: 0.3,
        seed: 17,
        step: 5,
        first_sample: 40,
    };
    agree("dropout", 1e-6, |k| {
        let mut y = vec![0.0; x.len()];
        k.dropout_forward(m, 100, &x, &mut y);
        let (mut dx, mut dx_acc) = (vec![0.0; x.len()], dx0.clone());
        k.dropout_backward(m, 100, &dy, &mut dx, false);
        k.dropout_backward(m, 100, &dy, &mut dx_acc, true);
        vec![y, dx, dx_acc]
    });
}

#[test]
fn layout_kernels_agree() {
    let (rows, widths) = (30, [3usize, 5, 2]);
    let c: usize = widths.iter().sum();
    let xs: Vec<Vec<f32>> = (0..3)
        .map(|i| random(rows * widths[i], 30 + i as u64))
        .collect();
    let dy = random(rows * c, 33);
    let dx0 = random(rows * 5, 34);
    agree("concat", 0.0, |k| {
        let ins: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
        let mut y = vec![0.0; rows * c];
        k.concat_forward(rows, &ins, &widths, &mut y);
        let mut d0 = vec![0.0; rows * 3];
        k.concat_backward(rows, c, 0, 3, &dy, &mut d0, false);
        let mut d1 = dx0.clone();
        k.concat_backward(rows, c, 3, 5, &dy, &mut d1, true);
        vec![y, d0, d1]
    });
    let (n, p, ch) = (3, 6, 4);
    let x = random(n * p * ch, 35);
    let dx0 = random(n * p * ch, 36);
    agree("flatten and the input transpose", 0.0, |k| {
        let mut y = vec![0.0; x.len()];
        k.flatten_forward(n, p, ch, &x, &mut y);
        let (mut dx, mut dx_acc) = (vec![0.0; x.len()], dx0.clone());
        k.flatten_backward(n, p, ch, &x, &mut dx, false);
        k.flatten_backward(n, p, ch, &x, &mut dx_acc, true);
        let mut nhwc = vec![0.0; x.len()];
        k.nchw_to_nhwc(n, ch, p, &x, &mut nhwc);
        let mut gray = vec![0.0; n * p];
        k.nchw_to_nhwc(n, 1, p, &x[..n * p], &mut gray);
        vec![y, dx, dx_acc, nhwc, gray]
    });
}

#[test]
fn the_loss_agrees_with_and_without_label_smoothing() {
    let (n, k) = (7, 10);
    let logits: Vec<f32> = random(n * k, 40).iter().map(|v| 4.0 * v).collect();
    let labels: Vec<u32> = (0..n as u32).map(|i| (i * 3) % k as u32).collect();
    let dx0 = random(n * k, 41);
    for smoothing in [0.0, 0.1] {
        agree(
            &format!("softmax cross-entropy, smoothing {smoothing}"),
            1e-5,
            |kk| {
                let mut probs = vec![0.0; n * k];
                let mut losses = vec![0.0; n];
                let (sum, correct) = kk.softmax_xent_forward(
                    n,
                    k,
                    &logits,
                    &labels,
                    smoothing,
                    &mut probs,
                    &mut losses,
                );
                let mut d = vec![0.0; n * k];
                kk.softmax_xent_backward(n, k, &probs, &labels, smoothing, 0.25, &mut d, false);
                let mut d_acc = dx0.clone();
                kk.softmax_xent_backward(n, k, &probs, &labels, smoothing, 0.25, &mut d_acc, true);
                let losses: Vec<f32> = losses.iter().map(|&l| l as f32).collect();
                vec![probs, losses, vec![sum as f32, correct as f32], d, d_acc]
            },
        );
    }
}

/// Loss and parameter gradients of one training step of `graph` at batch `n` on `kernels`,
/// and the net after it.
fn train_step(graph: &Arc<Graph>, n: usize, kernels: Box<dyn Kernels>) -> (f64, Vec<f32>, Net) {
    let cfg = NetConfig {
        max_batch: n,
        seed: 3,
    };
    let mut net = Net::with_kernels(graph.clone(), cfg, kernels).unwrap();
    // The seam is checked on im2col + GEMM, which the reference computes too; Winograd's
    // agreement with it (a rounding of its own) is tests/winograd.rs's and tests/gradcheck.rs's.
    net.set_conv_algo(ConvAlgo::Direct);
    let x = random(n * graph.input().numel(), 50);
    let y: Vec<u32> = (0..n as u32)
        .map(|i| (i * 7) % graph.classes as u32)
        .collect();
    let step = StepInfo {
        seed: 9,
        step: 2,
        first_sample: 0,
        global_batch: n,
    };
    let loss = net.forward(&x, &y, n, Mode::Train(step)).loss_sum;
    let mut grads = FlatGrads::for_net(&net);
    net.backward(&mut grads, &mut |_| Ok(())).unwrap();
    (loss, grads.data, net)
}

/// The logits of an evaluation forward of `net` (running statistics, no dropout).
fn eval_logits(net: &mut Net, n: usize) -> Vec<f32> {
    let g = net.graph().clone();
    let x = random(n * g.input().numel(), 51);
    net.forward(&x, &vec![0; n], n, Mode::Eval);
    net.logits().to_vec()
}

/// One training step of `graph` on both backends: the same loss, the same gradient in every
/// parameter block, the same running statistics; then the same logits in evaluation.
fn whole_net_agrees(graph: Graph, n: usize, tol: f32) {
    let model = graph.name.clone();
    let graph = Arc::new(graph);
    let (cpu_loss, cpu_grads, mut cpu) = train_step(&graph, n, default_kernels());
    let (ref_loss, ref_grads, mut reference) = train_step(&graph, n, Box::new(Reference));
    assert_eq!(
        cpu.params(),
        reference.params(),
        "{model}: the same initial weights"
    );
    assert!(
        ((cpu_loss - ref_loss) / ref_loss).abs() < 1e-5,
        "{model}: loss {cpu_loss} on the CPU, {ref_loss} on the reference"
    );
    for b in cpu.blocks() {
        let r = b.range.clone();
        assert_close(
            &format!("{model}: gradient of {}", b.name),
            &cpu_grads[r.clone()],
            &ref_grads[r],
            tol,
        );
    }
    assert_close(
        &format!("{model}: state"),
        cpu.state(),
        reference.state(),
        1e-4,
    );
    assert_close(
        &format!("{model}: evaluation logits"),
        &eval_logits(&mut cpu, n),
        &eval_logits(&mut reference, n),
        1e-3,
    );
}

fn builtin(model: &str) -> Graph {
    dptrain::model::reference_graph(model).unwrap()
}

#[test]
fn lenet5_trains_alike_on_both_backends() {
    whole_net_agrees(builtin("lenet5"), 5, 1e-4);
}

#[test]
fn resnet20_trains_alike_on_both_backends() {
    whole_net_agrees(builtin("resnet20"), 3, 1e-3);
}

#[test]
fn densenet_trains_alike_on_both_backends() {
    // Concatenation of many branches.
    whole_net_agrees(builtin("densenet-small"), 2, 1e-4);
}

#[test]
fn mobilenetv2_trains_alike_on_both_backends() {
    // Depthwise convolutions and relu6, 52 convolutions deep. At this batch the network is
    // ill-conditioned: changing its input by one part in a million moves the CPU's own
    // gradients of the first layers by up to 2% (measured), so the bound is that, not float
    // rounding; the layers near the head agree to about 1e-4.
    whole_net_agrees(builtin("mobilenetv2"), 2, 5e-2);
}

#[test]
fn a_net_of_every_layer_type_trains_alike_on_both_backends() {
    // Every layer type, fused and alone: grouped, depthwise and dilated convolutions, batch
    // norm with a fused relu, a residual add with a fused relu6, padded max pooling, a relu on
    // its own, concatenation, average pooling, flatten, dropout, two linear layers.
    let mut m = ModelBuilder::new("every-layer");
    let c1 = m.conv2d("c1", INPUT, Conv2d::new(6, 3).padding(1));
    let b1 = m.batch_norm("b1", &c1);
    let r1 = m.relu(&b1);
    let c2 = m.conv2d("c2", &r1, Conv2d::new(6, 3).padding(1).groups(2));
    let sum = m.add(&[&c2, &r1]);
    let r2 = m.relu6(&sum);
    let p1 = m.max_pool(&r2, Pool::new(3).stride(2).padding(1));
    let dw = m.conv2d(
        "dw",
        &p1,
        Conv2d::new(6, 3).padding(2).dilation(2).depthwise(),
    );
    let r3 = m.relu(&dw);
    let r4 = m.relu(&p1);
    let cat = m.concat(&[&r3, &r4]);
    let ap = m.avg_pool(&cat, Pool::new(2));
    let flat = m.flatten(&ap);
    let fc1 = m.linear("fc1", &flat, Linear::new(16));
    let dropped = m.dropout(&fc1, 0.3);
    m.linear("fc2", &dropped, Linear::new(Units::classes()));
    let graph = Graph::build(&m.build(), [3, 12, 12], 10).unwrap();
    whole_net_agrees(graph, 6, 1e-4);
}
