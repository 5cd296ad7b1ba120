//! `conv2d`: a convolution, with a following ReLU/ReLU6 fused in (then `act` is set).

use super::init_uniform;
use crate::backend::{Act, ConvGeom};
use crate::nn::layer::{Backward, BackwardPart, Forward, Layer, TensorInfo, TensorLayout};
use rand_chacha::ChaCha8Rng;

/// A convolution layer.
pub struct Conv {
    /// Geometry.
    pub geom: ConvGeom,
    /// Whether it has a bias.
    pub bias: bool,
    /// Fused activation.
    pub act: Act,
}

impl Layer for Conv {
    fn param_tensors(&self) -> Vec<TensorInfo> {
        let g = &self.geom;
        let mut t = vec![TensorInfo {
            suffix: "weight",
            offset: 0,
            len: g.weight_len(),
            torch_shape: vec![g.o, g.cg(), g.kh, g.kw],
            layout: TensorLayout::Hwio {
                kh: g.kh,
                kw: g.kw,
                cg: g.cg(),
                o: g.o,
            },
        }];
        if self.bias {
            t.push(TensorInfo::plain("bias", g.weight_len(), vec![g.o]));
        }
        t
    }

    fn init(&self, params: &mut [f32], _state: &mut [f32], rng: &mut ChaCha8Rng) {
        let g = &self.geom;
        init_uniform(&self.param_tensors(), params, g.kkc(), rng);
    }

    fn forward(&mut self, cx: Forward<'_>) {
        let wl = self.geom.weight_len();
        let (w, b) = cx.params.split_at(wl);
        let bias = self.bias.then_some(b);
        cx.k.conv2d_forward(&self.geom, cx.n, cx.inputs[0], w, bias, self.act, cx.out);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        let w = &cx.params[..self.geom.weight_len()];
        if cx.part != BackwardPart::InputsOnly {
            // Masked once: an InputsOnly call gets the gradient the ParamsOnly call masked.
            cx.k.act_mask(self.act, cx.out, cx.dout);
        }
        // A ParamsOnly call gets no input gradient to write (the net passes none).
        let dx = cx.dinputs[0].as_mut().map(|(d, acc)| (&mut **d, *acc));
        if cx.part == BackwardPart::InputsOnly {
            if let Some((dx, acc)) = dx {
                cx.k.conv2d_input_grad(&self.geom, cx.n, w, cx.dout, dx, acc);
            }
            return;
        }
        cx.k.conv2d_backward(
            &self.geom,
            cx.n,
            cx.inputs[0],
            w,
            cx.dout,
            cx.dparams,
            self.bias,
            dx,
        );
    }

    fn splits_backward(&self) -> bool {
        true
    }
}
