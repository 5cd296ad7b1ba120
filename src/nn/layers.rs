//! The layers our models are made of. Each one is small: forward, its parameters, its cost.
//!
//! Convolution and max-pool go through [`crate::ops`] (the device seam); everything else is
//! plain candle, whose autodiff produces the gradients.

use super::{Buffer, Param};
use crate::ops::{self, ConvEpilogue, ConvGeometry};
use candle_core::{Device, Result, Tensor, Var};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, Mutex};

/// One layer of a network.
pub trait Layer: Send + Sync {
    /// Forward pass; `train` selects batch statistics (BatchNorm) over running ones.
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor>;
    /// Trainable parameters.
    fn params(&self) -> Vec<Param> {
        Vec::new()
    }
    /// Non-trainable state.
    fn buffers(&self) -> Vec<Buffer> {
        Vec::new()
    }
    /// Multiply-accumulates for one sample with the given input shape, and the output shape.
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>);
}

/// PyTorch's default initialisation for conv and linear layers: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
/// for weights and biases alike (kaiming_uniform with a = sqrt(5)).
fn uniform_param(
    name: String,
    shape: &[usize],
    fan_in: usize,
    rng: &mut ChaCha8Rng,
    dev: &Device,
) -> Result<Param> {
    let bound = 1.0 / (fan_in as f32).sqrt();
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.gen_range(-bound..bound)).collect();
    Ok(Param {
        name,
        var: Var::from_vec(data, shape, dev)?,
    })
}

fn const_param(name: String, shape: &[usize], value: f32, dev: &Device) -> Result<Param> {
    let t = Tensor::full(value, shape, dev)?;
    Ok(Param {
        name,
        var: Var::from_tensor(&t)?,
    })
}

/// 2-D convolution with bias, square kernel, optionally followed by a fused ReLU and max-pool.
pub struct Conv2d {
    weight: Param,
    bias: Param,
    geom: ConvGeometry,
    input_grad: bool,
    epilogue: ConvEpilogue,
}

impl Conv2d {
    /// Makes a conv layer `in_c -> out_c` with a `k x k` kernel. `input_grad: false` for the
    /// first layer of a network, whose input gradient nobody needs.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        in_c: usize,
        out_c: usize,
        k: usize,
        stride: usize,
        padding: usize,
        input_grad: bool,
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self> {
        let fan_in = in_c * k * k;
        Ok(Self {
            weight: uniform_param(
                format!("{name}.weight"),
                &[out_c, in_c, k, k],
                fan_in,
                rng,
                dev,
            )?,
            bias: uniform_param(format!("{name}.bias"), &[out_c], fan_in, rng, dev)?,
            geom: ConvGeometry { stride, padding },
            input_grad,
            epilogue: ConvEpilogue::default(),
        })
    }

    /// The same layer with a ReLU applied to its output, fused into the convolution op: one
    /// layer instead of `Conv2d` + [`Relu`], with the same parameters and names and the same
    /// function, but a nearly free ReLU (see [`ops::conv2d_fused`]).
    pub fn with_relu(mut self) -> Self {
        self.epilogue.relu = true;
        self
    }

    /// The same layer followed by a `k x k`, stride-`k` max-pool (after the ReLU, if any), fused
    /// into the convolution op: replaces a following [`MaxPool2d`] layer with `kernel == stride`
    /// (see [`ops::conv2d_fused`]).
    pub fn with_max_pool(mut self, k: usize) -> Self {
        self.epilogue.pool = Some(k);
        self
    }
}

impl Layer for Conv2d {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        ops::conv2d_fused(
            x,
            self.weight.var.as_tensor(),
            self.bias.var.as_tensor(),
            self.geom,
            self.input_grad,
            self.epilogue,
        )
    }
    fn params(&self) -> Vec<Param> {
        vec![self.weight.clone(), self.bias.clone()]
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        let d = self.weight.var.dims();
        let (o, c, k) = (d[0], d[1], d[2]);
        let oh = (input[1] + 2 * self.geom.padding - k) / self.geom.stride + 1;
        let ow = (input[2] + 2 * self.geom.padding - k) / self.geom.stride + 1;
        let out = match self.epilogue.pool {
            Some(p) => vec![o, oh / p, ow / p],
            None => vec![o, oh, ow],
        };
        ((o * c * k * k * oh * ow) as u64, out)
    }
}

/// Fully connected layer `y = x W^T + b`.
pub struct Linear {
    weight: Param,
    bias: Param,
}

impl Linear {
    /// Makes a linear layer `in_f -> out_f`.
    pub fn new(
        name: &str,
        in_f: usize,
        out_f: usize,
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self> {
        Ok(Self {
            weight: uniform_param(format!("{name}.weight"), &[out_f, in_f], in_f, rng, dev)?,
            bias: uniform_param(format!("{name}.bias"), &[out_f], in_f, rng, dev)?,
        })
    }
}

impl Layer for Linear {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        ops::linear(x, self.weight.var.as_tensor(), self.bias.var.as_tensor())
    }
    fn params(&self) -> Vec<Param> {
        vec![self.weight.clone(), self.bias.clone()]
    }
    fn macs(&self, _input: &[usize]) -> (u64, Vec<usize>) {
        let d = self.weight.var.dims();
        ((d[0] * d[1]) as u64, vec![d[0]])
    }
}

/// Rectified linear unit.
pub struct Relu;

impl Layer for Relu {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        x.relu()
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        (0, input.to_vec())
    }
}

/// Max-pooling with a square window.
pub struct MaxPool2d {
    /// Window size.
    pub kernel: usize,
    /// Step between windows.
    pub stride: usize,
}

impl Layer for MaxPool2d {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        ops::max_pool2d(x, self.kernel, self.stride)
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        let oh = (input[1] - self.kernel) / self.stride + 1;
        let ow = (input[2] - self.kernel) / self.stride + 1;
        (0, vec![input[0], oh, ow])
    }
}

/// Flattens (N, C, H, W) to (N, C*H*W).
pub struct Flatten;

impl Layer for Flatten {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        x.flatten_from(1)
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        (0, vec![input.iter().product()])
    }
}

/// Global average pooling: (N, C, H, W) to (N, C).
pub struct GlobalAvgPool;

impl Layer for GlobalAvgPool {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        x.mean((2, 3))
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        (0, vec![input[0]])
    }
}

/// Batch normalisation over (N, H, W) per channel, with running statistics for evaluation.
pub struct BatchNorm2d {
    gamma: Param,
    beta: Param,
    running_mean: Buffer,
    running_var: Buffer,
    momentum: f64,
    eps: f64,
}

impl BatchNorm2d {
    /// Makes a BatchNorm layer over `c` channels (PyTorch defaults: momentum 0.1, eps 1e-5).
    pub fn new(name: &str, c: usize, dev: &Device) -> Result<Self> {
        let buf = |suffix: &str, v: f32| -> Result<Buffer> {
            Ok(Buffer {
                name: format!("{name}.{suffix}"),
                value: Arc::new(Mutex::new(Tensor::full(v, (1, c, 1, 1), dev)?)),
            })
        };
        Ok(Self {
            gamma: const_param(format!("{name}.weight"), &[c], 1.0, dev)?,
            beta: const_param(format!("{name}.bias"), &[c], 0.0, dev)?,
            running_mean: buf("running_mean", 0.0)?,
            running_var: buf("running_var", 1.0)?,
            momentum: 0.1,
            eps: 1e-5,
        })
    }
}

/// Locks a buffer even if another thread panicked while holding it (the value is still whole:
/// it is replaced, never mutated in place).
fn lock(m: &Mutex<Tensor>) -> std::sync::MutexGuard<'_, Tensor> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn channel_mean(x: &Tensor) -> Result<Tensor> {
    x.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)
}

impl Layer for BatchNorm2d {
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let c = x.dim(1)?;
        let gamma = self.gamma.var.as_tensor().reshape((1, c, 1, 1))?;
        let beta = self.beta.var.as_tensor().reshape((1, c, 1, 1))?;
        let (mean, var) = if train {
            let mean = channel_mean(x)?;
            let centred = x.broadcast_sub(&mean)?;
            let var = channel_mean(&centred.sqr()?)?;
            let n = (x.elem_count() / c) as f64;
            let unbiased = var.detach().affine(n / (n - 1.0).max(1.0), 0.0)?;
            let m = self.momentum;
            let mut rm = lock(&self.running_mean.value);
            *rm = rm
                .affine(1.0 - m, 0.0)?
                .add(&mean.detach().affine(m, 0.0)?)?;
            let mut rv = lock(&self.running_var.value);
            *rv = rv.affine(1.0 - m, 0.0)?.add(&unbiased.affine(m, 0.0)?)?;
            (mean, var)
        } else {
            (
                lock(&self.running_mean.value).clone(),
                lock(&self.running_var.value).clone(),
            )
        };
        let inv_std = (var + self.eps)?.sqrt()?.recip()?;
        x.broadcast_sub(&mean)?
            .broadcast_mul(&inv_std.broadcast_mul(&gamma)?)?
            .broadcast_add(&beta)
    }
    fn params(&self) -> Vec<Param> {
        vec![self.gamma.clone(), self.beta.clone()]
    }
    fn buffers(&self) -> Vec<Buffer> {
        vec![self.running_mean.clone(), self.running_var.clone()]
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        (input.iter().product::<usize>() as u64, input.to_vec())
    }
}

/// ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN plus a shortcut, then ReLU. The shortcut is
/// the identity, or a strided 1x1 conv + BN where the shape changes (He et al.'s option B).
pub struct BasicBlock {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    shortcut: Option<(Conv2d, BatchNorm2d)>,
}

impl BasicBlock {
    /// Makes a basic block `in_c -> out_c` whose first conv has `stride`.
    pub fn new(
        name: &str,
        in_c: usize,
        out_c: usize,
        stride: usize,
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self> {
        let shortcut = if stride != 1 || in_c != out_c {
            Some((
                Conv2d::new(
                    &format!("{name}.shortcut.conv"),
                    in_c,
                    out_c,
                    1,
                    stride,
                    0,
                    true,
                    rng,
                    dev,
                )?,
                BatchNorm2d::new(&format!("{name}.shortcut.bn"), out_c, dev)?,
            ))
        } else {
            None
        };
        Ok(Self {
            conv1: Conv2d::new(
                &format!("{name}.conv1"),
                in_c,
                out_c,
                3,
                stride,
                1,
                true,
                rng,
                dev,
            )?,
            bn1: BatchNorm2d::new(&format!("{name}.bn1"), out_c, dev)?,
            conv2: Conv2d::new(
                &format!("{name}.conv2"),
                out_c,
                out_c,
                3,
                1,
                1,
                true,
                rng,
                dev,
            )?,
            bn2: BatchNorm2d::new(&format!("{name}.bn2"), out_c, dev)?,
            shortcut,
        })
    }
}

impl Layer for BasicBlock {
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let y = self
            .bn1
            .forward(&self.conv1.forward(x, train)?, train)?
            .relu()?;
        let y = self.bn2.forward(&self.conv2.forward(&y, train)?, train)?;
        let s = match &self.shortcut {
            Some((conv, bn)) => bn.forward(&conv.forward(x, train)?, train)?,
            None => x.clone(),
        };
        (y + s)?.relu()
    }
    fn params(&self) -> Vec<Param> {
        let mut p = [
            self.conv1.params(),
            self.bn1.params(),
            self.conv2.params(),
            self.bn2.params(),
        ]
        .concat();
        if let Some((c, b)) = &self.shortcut {
            p.extend(c.params());
            p.extend(b.params());
        }
        p
    }
    fn buffers(&self) -> Vec<Buffer> {
        let mut b = [self.bn1.buffers(), self.bn2.buffers()].concat();
        if let Some((_, bn)) = &self.shortcut {
            b.extend(bn.buffers());
        }
        b
    }
    fn macs(&self, input: &[usize]) -> (u64, Vec<usize>) {
        let (f1, s1) = self.conv1.macs(input);
        let (f2, s2) = self.conv2.macs(&s1);
        let f3 = self.shortcut.as_ref().map_or(0, |(c, _)| c.macs(input).0);
        (f1 + f2 + f3, s2)
    }
}
