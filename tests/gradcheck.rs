//! Numerical gradient checks for every layer and custom op, and block-wise backward == full
//! backward, bit for bit.

use candle_core::{Device, Tensor, Var};
use dptrain::models;
use dptrain::nn::{BatchNorm2d, BasicBlock, Conv2d, Layer, Linear, MaxPool2d, Relu};
use dptrain::ops::{self, ConvGeometry};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn randn(shape: &[usize], rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..shape.iter().product()).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Checks d(sum(f() * probe))/dv from autodiff against central differences, for every `Var`
/// in `vars`; `f` reads the vars itself, and each is perturbed in place.
fn check(name: &str, vars: &[Var], f: &dyn Fn() -> candle_core::Result<Tensor>) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let out = f().unwrap();
    let probe = Tensor::from_vec(randn(out.dims(), &mut rng), out.dims(), &Device::Cpu).unwrap();
    let grads = (&out * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let p = probe.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scalar = || -> f64 {
        let o = f().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        o.iter().zip(&p).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    for (i, v) in vars.iter().enumerate() {
        let analytic = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("{name}: no grad for input {i}"));
        let analytic = analytic.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let base = v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let set = |data: Vec<f32>| v.set(&Tensor::from_vec(data, v.dims(), &Device::Cpu).unwrap()).unwrap();
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
            assert!((a - numeric).abs() <= tol, "{name}: input {i} element {j}: autodiff {a} vs numeric {numeric}");
        }
    }
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
        let diff = (ours - reference).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-4, "{name}: forward differs from candle by {diff}");
        check(&name, &[x.clone(), wt.clone(), b.clone()], &|| ops::conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), geom, true));
    }
}

#[test]
fn conv2d_without_input_grad_still_gives_weight_grads() {
    let x = var(&[2, 1, 6, 6], 1);
    let wt = var(&[3, 1, 3, 3], 2);
    let b = var(&[3], 3);
    let y = ops::conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), ConvGeometry { stride: 1, padding: 1 }, false).unwrap();
    let grads = y.sum_all().unwrap().backward().unwrap();
    assert!(grads.get(x.as_tensor()).is_none(), "input gradient computed although not asked for");
    assert!(grads.get(wt.as_tensor()).is_some() && grads.get(b.as_tensor()).is_some());
}

#[test]
fn max_pool_matches_numerical_gradient_including_overlapping_windows() {
    for &(h, w, k, s) in &[(4, 4, 2, 2), (5, 7, 2, 2), (7, 7, 3, 2), (6, 6, 3, 3), (5, 5, 2, 1)] {
        // Distinct values at least 0.05 apart, so no +-eps step changes which element wins.
        let n = 2 * 3 * h * w;
        let mut vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.05 - n as f32 * 0.025).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for i in (1..n).rev() {
            vals.swap(i, rng.gen_range(0..=i));
        }
        let x = Var::from_vec(vals, (2, 3, h, w), &Device::Cpu).unwrap();
        check(&format!("max_pool k{k} s{s} {h}x{w}"), &[x.clone()], &|| ops::max_pool2d(x.as_tensor(), k, s));
    }
}

#[test]
fn max_pool_gives_whole_gradient_to_the_maximum() {
    // The candle 0.11 bug this op replaces: a 2x2 window's gradient was split into quarters.
    let x = Var::from_vec(vec![1.0f32, 4.0, 2.0, 3.0], (1, 1, 2, 2), &Device::Cpu).unwrap();
    let y = ops::max_pool2d(x.as_tensor(), 2, 2).unwrap();
    let g = y.sum_all().unwrap().backward().unwrap();
    let g = g.get(x.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
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
    check_layer("conv2d layer", &Conv2d::new("c", 2, 3, 3, 1, 1, true, &mut rng, &dev).unwrap(), &[2, 2, 5, 5]);
    check_layer("linear", &Linear::new("l", 6, 4, &mut rng, &dev).unwrap(), &[3, 6]);
    check_layer("relu", &Relu, &[2, 3, 4, 4]);
    check_layer("maxpool layer", &MaxPool2d { kernel: 2, stride: 2 }, &[2, 2, 4, 4]);
    check_layer("batchnorm", &BatchNorm2d::new("bn", 3, &dev).unwrap(), &[4, 3, 3, 3]);
    check_layer("basic block (identity)", &BasicBlock::new("b", 2, 2, 1, &mut rng, &dev).unwrap(), &[2, 2, 4, 4]);
    check_layer("basic block (projection)", &BasicBlock::new("p", 2, 4, 2, &mut rng, &dev).unwrap(), &[2, 2, 6, 6]);
}

#[test]
fn blockwise_backward_equals_full_backward_bit_for_bit() {
    let dev = Device::Cpu;
    for (model, input) in [("lenet5", [1, 28, 28]), ("vgg-small", [3, 32, 32]), ("resnet20", [3, 16, 16])] {
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
        assert_eq!(loss.to_scalar::<f32>().unwrap().to_bits(), loss2.to_scalar::<f32>().unwrap().to_bits());
        let mut order = Vec::new();
        net.backward(&fp, &loss2, |k, grads| {
            order.push(k);
            for p in net.blocks[k].params() {
                let a = full.get(p.var.as_tensor()).unwrap().flatten_all()?.to_vec1::<f32>()?;
                let b = grads.get(p.var.as_tensor()).unwrap().flatten_all()?.to_vec1::<f32>()?;
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{model}: {} differs between full and block-wise backward", p.name);
            }
            Ok(())
        })
        .unwrap();
        let expected: Vec<usize> = (0..net.blocks.len()).rev().collect();
        assert_eq!(order, expected, "{model}: blocks must come last first");
    }
}
