//! Architecture descriptions: a model as blocks of (parameter sizes, forward MACs per sample),
//! computed from layer shapes, for FLOPs-derived profiles of models we cannot train here.
//!
//! AlexNet, VGG-16, ResNet-50 and Inception-v3 follow torchvision's definitions (224x224 input,
//! 299x299 for Inception-v3; 1000 classes). Every figure is computed by walking the layer shapes
//! with a tiny builder, never typed in, so a wrong layer shows up as a wrong parameter count in
//! the tests. Our own models (lenet5, vgg-small, resnet20) are built with [`crate::models::build`]
//! and described with [`crate::nn::Block::flops`] and their parameters, so the two kinds of
//! description count MACs the same way (convolutions and fully connected layers; BatchNorm as one
//! MAC per element).

use candle_core::Device;

/// One block of an architecture: the unit of gradient readiness, as in [`crate::nn::Block`].
#[derive(Debug, Clone, PartialEq)]
pub struct ArchBlock {
    /// Block name.
    pub name: String,
    /// Element count of each parameter tensor, in layer order.
    pub param_sizes: Vec<usize>,
    /// Forward multiply-accumulates of one sample.
    pub macs: u64,
}

impl ArchBlock {
    /// Parameters in the block.
    pub fn params(&self) -> usize {
        self.param_sizes.iter().sum()
    }
}

/// A model as a list of blocks in forward order.
#[derive(Debug, Clone, PartialEq)]
pub struct Arch {
    /// Model name.
    pub name: String,
    /// Input shape of one sample (C, H, W).
    pub input: [usize; 3],
    /// Blocks in forward order.
    pub blocks: Vec<ArchBlock>,
}

impl Arch {
    /// Total parameters.
    pub fn params(&self) -> usize {
        self.blocks.iter().map(|b| b.params()).sum()
    }

    /// Total forward MACs of one sample.
    pub fn macs(&self) -> u64 {
        self.blocks.iter().map(|b| b.macs).sum()
    }
}

/// Names accepted by [`describe`].
pub const ARCH_NAMES: [&str; 8] = [
    "lenet5",
    "vgg-small",
    "resnet20",
    "alexnet",
    "vgg16",
    "resnet50",
    "inception-v3",
    "inception-v3-noaux",
];

/// Describes architecture `name` (one of [`ARCH_NAMES`]). Inception-v3 includes the auxiliary
/// classifier (it is trained, so its gradients travel); `inception-v3-noaux` leaves it out.
pub fn describe(name: &str) -> Result<Arch, String> {
    match name {
        "lenet5" | "vgg-small" | "resnet20" => own_model(name),
        "alexnet" => Ok(alexnet()),
        "vgg16" | "vgg-16" => Ok(vgg16()),
        "resnet50" | "resnet-50" => Ok(resnet50()),
        "inception-v3" | "inception_v3" => Ok(inception_v3(true)),
        "inception-v3-noaux" => Ok(inception_v3(false)),
        other => Err(format!(
            "unknown architecture '{other}': choose one of {}",
            ARCH_NAMES.join(", ")
        )),
    }
}

/// The reference input shape of one of our models (as `bench overlap` trains them).
pub fn own_input(model: &str) -> [usize; 3] {
    crate::bench::replica::reference_input(model)
}

fn own_model(name: &str) -> Result<Arch, String> {
    let input = own_input(name);
    let net = crate::models::build(name, input, 10, 1, &Device::Cpu).map_err(|e| e.to_string())?;
    let mut shape = input.to_vec();
    let blocks = net
        .blocks
        .iter()
        .map(|b| {
            let (macs, out) = b.flops(&shape);
            shape = out;
            ArchBlock {
                name: b.name.clone(),
                param_sizes: b.params().iter().map(|p| p.numel()).collect(),
                macs,
            }
        })
        .collect();
    Ok(Arch {
        name: name.to_string(),
        input,
        blocks,
    })
}

/// Activation shape (C, H, W).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    c: usize,
    h: usize,
    w: usize,
}

/// Walks layer shapes, accumulating the current block's parameters and MACs.
struct Builder {
    blocks: Vec<ArchBlock>,
    params: Vec<usize>,
    macs: u64,
}

/// Output size of a window of `k` with `stride` and `pad` over `n` (floor mode).
fn out_size(n: usize, k: usize, stride: usize, pad: usize) -> usize {
    (n + 2 * pad - k) / stride + 1
}

impl Builder {
    fn new() -> Self {
        Self {
            blocks: Vec::new(),
            params: Vec::new(),
            macs: 0,
        }
    }

    /// Closes the current block under `name`.
    fn block(&mut self, name: impl Into<String>) {
        self.blocks.push(ArchBlock {
            name: name.into(),
            param_sizes: std::mem::take(&mut self.params),
            macs: std::mem::take(&mut self.macs),
        });
    }

    /// A `kh x kw` convolution to `out` channels, with a bias, or without one and followed by
    /// BatchNorm (`bn`), as torchvision's models use them.
    #[allow(clippy::too_many_arguments)]
    fn conv_full(
        &mut self,
        x: Shape,
        out: usize,
        (kh, kw): (usize, usize),
        stride: usize,
        (ph, pw): (usize, usize),
        bn: bool,
    ) -> Shape {
        let y = Shape {
            c: out,
            h: out_size(x.h, kh, stride, ph),
            w: out_size(x.w, kw, stride, pw),
        };
        self.params.push(out * x.c * kh * kw);
        self.macs += (out * x.c * kh * kw * y.h * y.w) as u64;
        if bn {
            self.params.extend([out, out]);
            self.macs += (y.c * y.h * y.w) as u64;
        } else {
            self.params.push(out);
        }
        y
    }

    /// Square conv with bias (AlexNet, VGG).
    fn conv(&mut self, x: Shape, out: usize, k: usize, stride: usize, pad: usize) -> Shape {
        self.conv_full(x, out, (k, k), stride, (pad, pad), false)
    }

    /// Conv without bias + BatchNorm (ResNet, Inception's BasicConv2d).
    fn conv_bn(
        &mut self,
        x: Shape,
        out: usize,
        k: (usize, usize),
        stride: usize,
        pad: (usize, usize),
    ) -> Shape {
        self.conv_full(x, out, k, stride, pad, true)
    }

    /// Max or average pooling (no parameters, MACs not counted).
    fn pool(&self, x: Shape, k: usize, stride: usize, pad: usize) -> Shape {
        Shape {
            c: x.c,
            h: out_size(x.h, k, stride, pad),
            w: out_size(x.w, k, stride, pad),
        }
    }

    /// Fully connected layer with bias.
    fn fc(&mut self, inputs: usize, out: usize) -> usize {
        self.params.extend([out * inputs, out]);
        self.macs += (out * inputs) as u64;
        out
    }

    fn finish(self, name: &str, input: [usize; 3]) -> Arch {
        debug_assert!(self.params.is_empty() && self.macs == 0, "unclosed block");
        Arch {
            name: name.to_string(),
            input,
            blocks: self.blocks,
        }
    }
}

const IMAGENET: usize = 1000;

fn alexnet() -> Arch {
    // torchvision's single-GPU variant (64/192/384/256/256 channels, no groups).
    let mut b = Builder::new();
    let x = Shape {
        c: 3,
        h: 224,
        w: 224,
    };
    let x = b.conv(x, 64, 11, 4, 2);
    b.block("conv1");
    let x = b.pool(x, 3, 2, 0);
    let x = b.conv(x, 192, 5, 1, 2);
    b.block("conv2");
    let x = b.pool(x, 3, 2, 0);
    let x = b.conv(x, 384, 3, 1, 1);
    b.block("conv3");
    let x = b.conv(x, 256, 3, 1, 1);
    b.block("conv4");
    let x = b.conv(x, 256, 3, 1, 1);
    b.block("conv5");
    let x = b.pool(x, 3, 2, 0);
    let f = b.fc(x.c * x.h * x.w, 4096);
    b.block("fc6");
    let f = b.fc(f, 4096);
    b.block("fc7");
    b.fc(f, IMAGENET);
    b.block("fc8");
    b.finish("alexnet", [3, 224, 224])
}

fn vgg16() -> Arch {
    let mut b = Builder::new();
    let mut x = Shape {
        c: 3,
        h: 224,
        w: 224,
    };
    let stages: [&[usize]; 5] = [
        &[64, 64],
        &[128, 128],
        &[256, 256, 256],
        &[512, 512, 512],
        &[512, 512, 512],
    ];
    for (s, convs) in stages.iter().enumerate() {
        for (i, &c) in convs.iter().enumerate() {
            x = b.conv(x, c, 3, 1, 1);
            b.block(format!("conv{}_{}", s + 1, i + 1));
        }
        x = b.pool(x, 2, 2, 0);
    }
    let f = b.fc(x.c * x.h * x.w, 4096);
    b.block("fc6");
    let f = b.fc(f, 4096);
    b.block("fc7");
    b.fc(f, IMAGENET);
    b.block("fc8");
    b.finish("vgg16", [3, 224, 224])
}

fn resnet50() -> Arch {
    // torchvision v1.5: the stride sits on the 3x3 conv of the bottleneck.
    let mut b = Builder::new();
    let x = Shape {
        c: 3,
        h: 224,
        w: 224,
    };
    let x = b.conv_bn(x, 64, (7, 7), 2, (3, 3));
    b.block("stem");
    let mut x = b.pool(x, 3, 2, 1);
    for (stage, (width, n)) in [(64, 3), (128, 4), (256, 6), (512, 3)]
        .into_iter()
        .enumerate()
    {
        for i in 0..n {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            let out = width * 4;
            let y = b.conv_bn(x, width, (1, 1), 1, (0, 0));
            let y = b.conv_bn(y, width, (3, 3), stride, (1, 1));
            let y = b.conv_bn(y, out, (1, 1), 1, (0, 0));
            if i == 0 {
                b.conv_bn(x, out, (1, 1), stride, (0, 0));
            }
            b.block(format!("layer{}.{i}", stage + 1));
            x = y;
        }
    }
    b.fc(x.c, IMAGENET);
    b.block("fc");
    b.finish("resnet50", [3, 224, 224])
}

/// Concatenates branch outputs along channels (same spatial size).
fn cat(parts: &[Shape]) -> Shape {
    debug_assert!(parts
        .windows(2)
        .all(|p| (p[0].h, p[0].w) == (p[1].h, p[1].w)));
    Shape {
        c: parts.iter().map(|p| p.c).sum(),
        ..parts[0]
    }
}

fn inception_v3(aux: bool) -> Arch {
    let mut b = Builder::new();
    let sq = |k: usize| (k, k);
    let x = Shape {
        c: 3,
        h: 299,
        w: 299,
    };
    let x = b.conv_bn(x, 32, sq(3), 2, sq(0));
    b.block("Conv2d_1a_3x3");
    let x = b.conv_bn(x, 32, sq(3), 1, sq(0));
    b.block("Conv2d_2a_3x3");
    let x = b.conv_bn(x, 64, sq(3), 1, sq(1));
    b.block("Conv2d_2b_3x3");
    let x = b.pool(x, 3, 2, 0);
    let x = b.conv_bn(x, 80, sq(1), 1, sq(0));
    b.block("Conv2d_3b_1x1");
    let x = b.conv_bn(x, 192, sq(3), 1, sq(0));
    b.block("Conv2d_4a_3x3");
    let mut x = b.pool(x, 3, 2, 0);

    // InceptionA
    for (name, pool_features) in [("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)] {
        let b1 = b.conv_bn(x, 64, sq(1), 1, sq(0));
        let b5 = b.conv_bn(x, 48, sq(1), 1, sq(0));
        let b5 = b.conv_bn(b5, 64, sq(5), 1, sq(2));
        let b3 = b.conv_bn(x, 64, sq(1), 1, sq(0));
        let b3 = b.conv_bn(b3, 96, sq(3), 1, sq(1));
        let b3 = b.conv_bn(b3, 96, sq(3), 1, sq(1));
        let bp = b.pool(x, 3, 1, 1);
        let bp = b.conv_bn(bp, pool_features, sq(1), 1, sq(0));
        x = cat(&[b1, b5, b3, bp]);
        b.block(name);
    }
    // InceptionB
    {
        let b3 = b.conv_bn(x, 384, sq(3), 2, sq(0));
        let bd = b.conv_bn(x, 64, sq(1), 1, sq(0));
        let bd = b.conv_bn(bd, 96, sq(3), 1, sq(1));
        let bd = b.conv_bn(bd, 96, sq(3), 2, sq(0));
        let bp = b.pool(x, 3, 2, 0);
        x = cat(&[b3, bd, bp]);
        b.block("Mixed_6a");
    }
    // InceptionC
    for (name, c7) in [
        ("Mixed_6b", 128),
        ("Mixed_6c", 160),
        ("Mixed_6d", 160),
        ("Mixed_6e", 192),
    ] {
        let b1 = b.conv_bn(x, 192, sq(1), 1, sq(0));
        let b7 = b.conv_bn(x, c7, sq(1), 1, sq(0));
        let b7 = b.conv_bn(b7, c7, (1, 7), 1, (0, 3));
        let b7 = b.conv_bn(b7, 192, (7, 1), 1, (3, 0));
        let bd = b.conv_bn(x, c7, sq(1), 1, sq(0));
        let bd = b.conv_bn(bd, c7, (7, 1), 1, (3, 0));
        let bd = b.conv_bn(bd, c7, (1, 7), 1, (0, 3));
        let bd = b.conv_bn(bd, c7, (7, 1), 1, (3, 0));
        let bd = b.conv_bn(bd, 192, (1, 7), 1, (0, 3));
        let bp = b.pool(x, 3, 1, 1);
        let bp = b.conv_bn(bp, 192, sq(1), 1, sq(0));
        x = cat(&[b1, b7, bd, bp]);
        b.block(name);
    }
    if aux {
        // Branches off Mixed_6e; listed here so its gradients are ready about when backward
        // passes the point it joins.
        let a = b.pool(x, 5, 3, 0);
        let a = b.conv_bn(a, 128, sq(1), 1, sq(0));
        let a = b.conv_bn(a, 768, sq(5), 1, sq(0));
        b.fc(a.c, IMAGENET);
        b.block("AuxLogits");
    }
    // InceptionD
    {
        let b3 = b.conv_bn(x, 192, sq(1), 1, sq(0));
        let b3 = b.conv_bn(b3, 320, sq(3), 2, sq(0));
        let b7 = b.conv_bn(x, 192, sq(1), 1, sq(0));
        let b7 = b.conv_bn(b7, 192, (1, 7), 1, (0, 3));
        let b7 = b.conv_bn(b7, 192, (7, 1), 1, (3, 0));
        let b7 = b.conv_bn(b7, 192, sq(3), 2, sq(0));
        let bp = b.pool(x, 3, 2, 0);
        x = cat(&[b3, b7, bp]);
        b.block("Mixed_7a");
    }
    // InceptionE
    for name in ["Mixed_7b", "Mixed_7c"] {
        let b1 = b.conv_bn(x, 320, sq(1), 1, sq(0));
        let b3 = b.conv_bn(x, 384, sq(1), 1, sq(0));
        let b3a = b.conv_bn(b3, 384, (1, 3), 1, (0, 1));
        let b3b = b.conv_bn(b3, 384, (3, 1), 1, (1, 0));
        let bd = b.conv_bn(x, 448, sq(1), 1, sq(0));
        let bd = b.conv_bn(bd, 384, sq(3), 1, sq(1));
        let bda = b.conv_bn(bd, 384, (1, 3), 1, (0, 1));
        let bdb = b.conv_bn(bd, 384, (3, 1), 1, (1, 0));
        let bp = b.pool(x, 3, 1, 1);
        let bp = b.conv_bn(bp, 192, sq(1), 1, sq(0));
        x = cat(&[b1, b3a, b3b, bda, bdb, bp]);
        b.block(name);
    }
    b.fc(x.c, IMAGENET);
    b.block("fc");
    let name = if aux {
        "inception-v3"
    } else {
        "inception-v3-noaux"
    };
    b.finish(name, [3, 299, 299])
}
