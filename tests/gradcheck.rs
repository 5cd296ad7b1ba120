//! Numerical gradient checks for every layer and custom op, and block-wise backward == full
//! backward, bit for bit.

use candle_core::{Device, Tensor, Var};
use dptrain::models;
use dptrain::nn::{BasicBlock, BatchNorm2d, Conv2d, Layer, Linear, MaxPool2d, Relu};
use dptrain::ops::{self, ConvGeometry};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn randn(shape: &[usize], rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..shape.iter().product())
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect()
}

/// Checks d(sum(f() * probe))/dv from autodiff against central differences, for every `Var`
/// in `vars`; `f` reads the vars itself, and each is perturbed in place.
fn check(name: &str, vars: &[Var], f: &dyn Fn() -> candle_core::Result<Tensor>) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let out = f().unwrap();
    let probe = Tensor::from_vec(randn(out.dims(), &mut rng), out.dims(), &Device::Cpu).unwrap();
    let grads = (&out * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let p = probe.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scalar = || -> f64 {
        let o = f()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        o.iter().zip(&p).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    for (i, v) in vars.iter().enumerate() {
        let analytic = grads
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no grad for input {i}"));
        let analytic = analytic.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let base = v
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let set = |data: Vec<f32>| {
            v.set(&Tensor::from_vec(data, v.dims(), &Device::Cpu).unwrap())
                .unwrap()
        };
        // Check a spread of coordinates (all of them for small tensors).
        let step = (base.len() / 40).max(1);
        for j in (0..base.len()).step_by(step) {
            let eps = 1e-3f32;
            let mut moved = base.clone();
            moved[j] = base[j] + eps;
            set(moved.clone());
            let up = scalar();
            moved[j] = base[j] - eps;
            set(moved);
            let down = scalar();
            set(base.clone());
            let numeric = (up - down) / (2.0 * eps as f64);
            let a = analytic[j] as f64;
            let tol = 2e-2 * (1.0 + a.abs().max(numeric.abs()));
            assert!(
                (a - numeric).abs() <= tol,
                "{name}: input {i} element {j}: autodiff {a} vs numeric {numeric}"
            );
        }
    }
}

/// Largest elementwise |a - b|.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>())
        .unwrap()
}

fn var(shape: &[usize], seed: u64) -> Var {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Var::from_vec(randn(shape, &mut rng), shape, &Device::Cpu).unwrap()
}

#[test]
fn conv2d_op_matches_numerical_gradient_across_strides_and_padding() {
    for &(n, c, h, w, o, k, stride, padding) in &[
        (2, 1, 6, 6, 3, 3, 1, 0),
        (2, 2, 7, 5, 3, 3, 1, 1),
        (3, 3, 8, 8, 2, 3, 2, 1),
        (2, 2, 9, 9, 4, 5, 2, 2),
        (5, 2, 5, 5, 3, 1, 2, 0),
        (1, 2, 4, 4, 2, 1, 1, 0),
    ] {
        let x = var(&[n, c, h, w], 1);
        let wt = var(&[o, c, k, k], 2);
        let b = var(&[o], 3);
        let geom = ConvGeometry { stride, padding };
        let name = format!("conv2d n{n} c{c} {h}x{w} o{o} k{k} s{stride} p{padding}");
        // Forward against candle's reference convolution.
        let ours = ops::conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), geom, true).unwrap();
        let reference = x
            .as_tensor()
            .conv2d(wt.as_tensor(), padding, stride, 1, 1)
            .unwrap()
            .broadcast_add(&b.as_tensor().reshape((1, o, 1, 1)).unwrap())
            .unwrap();
        let diff = max_abs_diff(&ours, &reference);
        assert!(diff < 1e-4, "{name}: forward differs from candle by {diff}");
        check(&name, &[x.clone(), wt.clone(), b.clone()], &|| {
            ops::conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), geom, true)
        });
    }
}

#[test]
fn conv2d_without_input_grad_still_gives_weight_grads() {
    let x = var(&[2, 1, 6, 6], 1);
    let wt = var(&[3, 1, 3, 3], 2);
    let b = var(&[3], 3);
    let y = ops::conv2d(
        x.as_tensor(),
        wt.as_tensor(),
        b.as_tensor(),
        ConvGeometry {
            stride: 1,
            padding: 1,
        },
        false,
    )
    .unwrap();
    let grads = y.sum_all().unwrap().backward().unwrap();
    assert!(
        grads.get(x.as_tensor()).is_none(),
        "input gradient computed although not asked for"
    );
    assert!(grads.get(wt.as_tensor()).is_some() && grads.get(b.as_tensor()).is_some());
}

/// Asserts that `got` and `want`, two computations of the same function of `vars`, agree in
/// value (bitwise) and in the gradient of `sum(out * probe)` for every var (to 1e-5).
fn assert_same_function(name: &str, got: &Tensor, want: &Tensor, vars: &[&Var], seed: u64) {
    let to_vec = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(got.dims(), want.dims(), "{name}: shape");
    assert_eq!(to_vec(got), to_vec(want), "{name}: forward");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let probe = Tensor::from_vec(randn(got.dims(), &mut rng), got.dims(), &Device::Cpu).unwrap();
    let grads = |y: &Tensor| (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let (gg, gw) = (grads(got), grads(want));
    for (i, v) in vars.iter().enumerate() {
        let a = to_vec(gg.get(v.as_tensor()).unwrap());
        let r = to_vec(gw.get(v.as_tensor()).unwrap());
        for (j, (a, r)) in a.iter().zip(&r).enumerate() {
            assert!(
                (a - r).abs() <= 1e-5 * (1.0 + r.abs()),
                "{name}: input {i} element {j}: {a} vs {r}"
            );
        }
    }
}

#[test]
fn conv2d_relu_matches_conv_then_relu_and_numerical_gradient() {
    // n = 5 and 9 leave a partial backward chunk; stride 2 takes the generic paths.
    for &(n, c, h, w, o, k, stride, padding) in &[
        (5, 2, 7, 6, 3, 3, 1, 1),
        (2, 3, 8, 8, 4, 5, 1, 0),
        (3, 3, 8, 8, 2, 3, 2, 1),
        (9, 1, 5, 5, 2, 1, 1, 0),
    ] {
        let x = var(&[n, c, h, w], 21);
        let wt = var(&[o, c, k, k], 22);
        let b = var(&[o], 23);
        let geom = ConvGeometry { stride, padding };
        let name = format!("conv2d_relu n{n} c{c} {h}x{w} o{o} k{k} s{stride} p{padding}");
        let fused = || ops::conv2d_relu(x.as_tensor(), wt.as_tensor(), b.as_tensor(), geom, true);
        let unfused =
            || ops::conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), geom, true)?.relu();
        // Same function and same gradients as the separate ReLU (which only differs at exactly
        // zero, where it passes the gradient and the fused one, like PyTorch, does not).
        assert_same_function(
            &name,
            &fused().unwrap(),
            &unfused().unwrap(),
            &[&x, &wt, &b],
            24,
        );
        check(&name, &[x.clone(), wt.clone(), b.clone()], &fused);
    }
}

#[test]
fn conv2d_with_fused_relu_and_pool_matches_separate_ops_and_numerical_gradient() {
    // Odd output sizes leave a row and column outside every window (floor mode); n = 5 leaves a
    // partial backward chunk; stride 2 and pad 0 take the col2im input-gradient route.
    for &(n, c, h, w, o, k, stride, padding, pool, relu) in &[
        (5, 2, 7, 7, 3, 3, 1, 1, 2, true),
        (2, 3, 9, 8, 4, 5, 1, 0, 2, true),
        (3, 2, 9, 9, 2, 3, 2, 1, 2, false),
        (2, 2, 6, 6, 3, 3, 1, 1, 3, true),
    ] {
        let x = var(&[n, c, h, w], 41);
        let wt = var(&[o, c, k, k], 42);
        let b = var(&[o], 43);
        let geom = ConvGeometry { stride, padding };
        let name = format!(
            "conv2d+relu({relu})+pool{pool} n{n} c{c} {h}x{w} o{o} k{k} s{stride} p{padding}"
        );
        let epilogue = ops::ConvEpilogue {
            relu,
            pool: Some(pool),
        };
        let fused = || {
            ops::conv2d_fused(
                x.as_tensor(),
                wt.as_tensor(),
                b.as_tensor(),
                geom,
                true,
                epilogue,
            )
        };
        let separate = || {
            let y = ops::conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), geom, true)?;
            let y = if relu { y.relu()? } else { y };
            ops::max_pool2d(&y, pool, pool)
        };
        assert_same_function(
            &name,
            &fused().unwrap(),
            &separate().unwrap(),
            &[&x, &wt, &b],
            44,
        );
        check(&name, &[x.clone(), wt.clone(), b.clone()], &fused);
    }
}

/// Runs forward and backward of `f(x, w, b)` on a rayon pool of `threads` threads and returns
/// the output and the three gradients, flattened.
fn conv_pass_on_threads(
    threads: usize,
    f: &(dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor> + Sync),
    shapes: [&[usize]; 3],
) -> Vec<Vec<f32>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let (x, wt, b) = (var(shapes[0], 31), var(shapes[1], 32), var(shapes[2], 33));
        let y = f(x.as_tensor(), wt.as_tensor(), b.as_tensor()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(34);
        let probe = Tensor::from_vec(randn(y.dims(), &mut rng), y.dims(), &Device::Cpu).unwrap();
        let grads = (&y * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut out = vec![flat(&y)];
        out.extend([&x, &wt, &b].map(|v| flat(grads.get(v.as_tensor()).unwrap())));
        out
    })
}

#[test]
fn conv2d_forward_and_backward_are_bitwise_equal_on_1_and_2_threads() {
    // Batch 10: two full backward chunks and a partial one, so the chunk partial sums matter.
    let geom = ConvGeometry {
        stride: 1,
        padding: 1,
    };
    let plain = |x: &Tensor, w: &Tensor, b: &Tensor| ops::conv2d(x, w, b, geom, true);
    let fused = |x: &Tensor, w: &Tensor, b: &Tensor| ops::conv2d_relu(x, w, b, geom, true);
    let pooled = |x: &Tensor, w: &Tensor, b: &Tensor| {
        let epilogue = ops::ConvEpilogue {
            relu: true,
            pool: Some(2),
        };
        ops::conv2d_fused(x, w, b, geom, true, epilogue)
    };
    let strided = |x: &Tensor, w: &Tensor, b: &Tensor| {
        ops::conv2d_relu(
            x,
            w,
            b,
            ConvGeometry {
                stride: 2,
                padding: 1,
            },
            true,
        )
    };
    let shapes: [&[usize]; 3] = [&[10, 8, 12, 12], &[16, 8, 3, 3], &[16]];
    type ConvFn<'a> = &'a (dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor> + Sync);
    for (name, f) in [
        ("conv2d", &plain as ConvFn),
        ("conv2d_relu", &fused),
        ("strided", &strided),
        ("conv2d+relu+pool", &pooled),
    ] {
        let one = conv_pass_on_threads(1, f, shapes);
        let two = conv_pass_on_threads(2, f, shapes);
        for (what, (a, b)) in ["output", "input grad", "weight grad", "bias grad"]
            .iter()
            .zip(one.iter().zip(&two))
        {
            let same =
                a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{name}: {what} differs between 1 and 2 threads");
        }
    }
}

#[test]
fn max_pool_matches_numerical_gradient_including_overlapping_windows() {
    for &(h, w, k, s) in &[
        (4, 4, 2, 2),
        (5, 7, 2, 2),
        (7, 7, 3, 2),
        (6, 6, 3, 3),
        (5, 5, 2, 1),
    ] {
        // Distinct values at least 0.05 apart, so no +-eps step changes which element wins.
        let n = 2 * 3 * h * w;
        let mut vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.05 - n as f32 * 0.025).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for i in (1..n).rev() {
            vals.swap(i, rng.gen_range(0..=i));
        }
        let x = Var::from_vec(vals, (2, 3, h, w), &Device::Cpu).unwrap();
        check(
            &format!("max_pool k{k} s{s} {h}x{w}"),
            std::slice::from_ref(&x),
            &|| ops::max_pool2d(x.as_tensor(), k, s),
        );
    }
}

#[test]
fn linear_op_matches_candle_matmul() {
    let (x, w, b) = (var(&[9, 7], 1), var(&[5, 7], 2), var(&[5], 3));
    let ours = ops::linear(x.as_tensor(), w.as_tensor(), b.as_tensor()).unwrap();
    let candle = x
        .as_tensor()
        .matmul(&w.as_tensor().t().unwrap())
        .unwrap()
        .broadcast_add(b.as_tensor())
        .unwrap();
    let diff = max_abs_diff(&ours, &candle);
    assert!(diff < 1e-5, "linear forward differs from candle by {diff}");
}

#[test]
fn max_pool_gives_whole_gradient_to_the_maximum() {
    // The candle 0.11 bug this op replaces: a 2x2 window's gradient was split into quarters.
    let x = Var::from_vec(vec![1.0f32, 4.0, 2.0, 3.0], (1, 1, 2, 2), &Device::Cpu).unwrap();
    let y = ops::max_pool2d(x.as_tensor(), 2, 2).unwrap();
    let g = y.sum_all().unwrap().backward().unwrap();
    let g = g
        .get(x.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(g, vec![0.0, 1.0, 0.0, 0.0]);
}

fn check_layer(name: &str, layer: &dyn Layer, input: &[usize]) {
    let x = var(input, 5);
    let mut vars = vec![x.clone()];
    vars.extend(layer.params().iter().map(|p| p.var.clone()));
    check(name, &vars, &|| layer.forward(x.as_tensor(), true));
}

#[test]
fn every_layer_matches_numerical_gradient() {
    let dev = Device::Cpu;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    check_layer(
        "conv2d layer",
        &Conv2d::new("c", 2, 3, 3, 1, 1, true, &mut rng, &dev).unwrap(),
        &[2, 2, 5, 5],
    );
    check_layer(
        "linear",
        &Linear::new("l", 6, 4, &mut rng, &dev).unwrap(),
        &[3, 6],
    );
    check_layer("relu", &Relu, &[2, 3, 4, 4]);
    check_layer(
        "maxpool layer",
        &MaxPool2d {
            kernel: 2,
            stride: 2,
        },
        &[2, 2, 4, 4],
    );
    check_layer(
        "batchnorm",
        &BatchNorm2d::new("bn", 3, &dev).unwrap(),
        &[4, 3, 3, 3],
    );
    check_layer(
        "basic block (identity)",
        &BasicBlock::new("b", 2, 2, 1, &mut rng, &dev).unwrap(),
        &[2, 2, 4, 4],
    );
    check_layer(
        "basic block (projection)",
        &BasicBlock::new("p", 2, 4, 2, &mut rng, &dev).unwrap(),
        &[2, 2, 6, 6],
    );
    check_layer(
        "linear (three batch chunks, the last one short)",
        &Linear::new("l9", 5, 3, &mut ChaCha8Rng::seed_from_u64(9), &dev).unwrap(),
        &[9, 5],
    );
}

#[test]
fn conv2d_layer_with_fused_relu_equals_conv2d_then_relu() {
    // Compared with the two-layer composition rather than numerically: with PyTorch's init many
    // outputs sit within a finite-difference step of the ReLU's kink, where central differences
    // are meaningless. (The fused op itself is checked numerically above.)
    let dev = Device::Cpu;
    let make = || {
        Conv2d::new(
            "c",
            2,
            3,
            3,
            1,
            1,
            true,
            &mut ChaCha8Rng::seed_from_u64(3),
            &dev,
        )
        .unwrap()
    };
    let (fused, plain) = (make().with_relu(), make());
    let names = |l: &Conv2d| {
        l.params()
            .iter()
            .map(|p| p.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&fused),
        names(&plain),
        "parameter names must not change"
    );
    let x = var(&[5, 2, 5, 5], 5);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let probe = Tensor::from_vec(randn(&[5, 3, 5, 5], &mut rng), (5, 3, 5, 5), &dev).unwrap();
    let yf = fused.forward(x.as_tensor(), true).unwrap();
    let yp = Relu
        .forward(&plain.forward(x.as_tensor(), true).unwrap(), true)
        .unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(flat(&yf), flat(&yp));
    let gf = (&yf * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gp = (&yp * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let pairs = [(x.as_tensor().clone(), x.as_tensor().clone())]
        .into_iter()
        .chain(
            fused
                .params()
                .into_iter()
                .zip(plain.params())
                .map(|(a, b)| (a.var.as_tensor().clone(), b.var.as_tensor().clone())),
        );
    for (i, (a, b)) in pairs.enumerate() {
        let (a, b) = (flat(gf.get(&a).unwrap()), flat(gp.get(&b).unwrap()));
        for (j, (a, b)) in a.iter().zip(&b).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "input {i} element {j}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn blockwise_backward_equals_full_backward_bit_for_bit() {
    let dev = Device::Cpu;
    for (model, input) in [
        ("lenet5", [1, 28, 28]),
        ("vgg-small", [3, 32, 32]),
        ("resnet20", [3, 16, 16]),
    ] {
        let net = models::build(model, input, 10, 42, &dev).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let shape = [4, input[0], input[1], input[2]];
        let x = Tensor::from_vec(randn(&shape, &mut rng), &shape[..], &dev).unwrap();
        let labels = Tensor::new(&[1u32, 7, 3, 0], &dev).unwrap();
        // Full backward. BatchNorm updates its running statistics in forward, but those do not
        // feed training-mode outputs, so both passes see the same function.
        let logits = net.forward_uncut(&x, true).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &labels).unwrap();
        let full = loss.backward().unwrap();
        // Block-wise backward.
        let fp = net.forward(&x, true).unwrap();
        let loss2 = candle_nn::loss::cross_entropy(fp.logits(), &labels).unwrap();
        assert_eq!(
            loss.to_scalar::<f32>().unwrap().to_bits(),
            loss2.to_scalar::<f32>().unwrap().to_bits()
        );
        let mut order = Vec::new();
        net.backward(&fp, &loss2, |k, grads| {
            order.push(k);
            for p in net.blocks[k].params() {
                let a = full
                    .get(p.var.as_tensor())
                    .unwrap()
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let b = grads
                    .get(p.var.as_tensor())
                    .unwrap()
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{model}: {} differs between full and block-wise backward",
                    p.name
                );
            }
            Ok(())
        })
        .unwrap();
        let expected: Vec<usize> = (0..net.blocks.len()).rev().collect();
        assert_eq!(order, expected, "{model}: blocks must come last first");
    }
}
