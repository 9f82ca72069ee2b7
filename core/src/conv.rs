//! The geometry of a window sliding over the two spatial axes of channels-last input
//! (`[batch, height, width, channels]`, Keras' default): where each output reads, for
//! convolution and pooling alike, with Keras' padding rules. A 1-D window is the same with a
//! height of 1.
//!
//! ```
//! use weft_core::conv::{Padding, Window2d};
//! // 28x28 input, 3x3 kernel, stride 2, "same": the output is ceil(28 / 2) = 14 wide.
//! let g = Window2d::new("conv2d", &[8, 28, 28, 3], [3, 3], [2, 2], [1, 1], Padding::Same)?;
//! assert_eq!((g.output, g.pad), ([14, 14], [0, 0]));
//! # Ok::<(), weft_core::Error>(())
//! ```

use crate::{Error, Result};

/// How the input is padded (Keras' `padding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Padding {
    /// No padding: only windows that fit inside the input.
    #[default]
    Valid,
    /// Pad so the output is `ceil(input / stride)` long, the odd padding element after the
    /// input (as Keras and TensorFlow).
    Same,
    /// Pad before the input only, so output `t` sees inputs up to `t` (Keras' `Conv1D`
    /// `causal`).
    Causal,
}

impl Padding {
    /// Keras' name: `valid`, `same` or `causal`.
    pub fn from_name(name: &str) -> Result<Padding> {
        match name.to_ascii_lowercase().as_str() {
            "valid" => Ok(Padding::Valid),
            "same" => Ok(Padding::Same),
            "causal" => Ok(Padding::Causal),
            other => Err(Error::invalid("padding", format!("unknown padding {other:?}: valid, same or causal"))),
        }
    }
}

/// One window op's geometry: sizes in (height, width) order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window2d {
    /// Samples.
    pub batch: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Input channels.
    pub channels: usize,
    /// Window (kernel or pool) height and width.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub strides: [usize; 2],
    /// Step between a window's taps (1: adjacent).
    pub dilation: [usize; 2],
    /// Padding before the input (top, left); what pads after follows from the output size.
    pub pad: [usize; 2],
    /// Output height and width.
    pub output: [usize; 2],
}

impl Window2d {
    /// The geometry of a window over `input` (`[batch, height, width, channels]`); `op` names
    /// the caller in errors.
    pub fn new(
        op: &'static str,
        input: &[usize],
        kernel: [usize; 2],
        strides: [usize; 2],
        dilation: [usize; 2],
        padding: Padding,
    ) -> Result<Window2d> {
        let &[batch, h, w, channels] = input else {
            return Err(Error::invalid(op, format!("input must be [batch, height, width, channels], got {input:?}")));
        };
        if h == 0 || w == 0 || channels == 0 {
            return Err(Error::invalid(op, format!("input {input:?} has an empty axis")));
        }
        for (what, v) in [("kernel", kernel), ("strides", strides), ("dilation", dilation)] {
            if v.contains(&0) {
                return Err(Error::invalid(op, format!("{what} must be at least 1, got {v:?}")));
            }
        }
        let (mut pad, mut output) = ([0; 2], [0; 2]);
        for (a, size) in [h, w].into_iter().enumerate() {
            let reach = (kernel[a] - 1).checked_mul(dilation[a]).and_then(|r| r.checked_add(1)).ok_or_else(|| {
                Error::invalid(op, format!("a window of {kernel:?} dilated by {dilation:?} is too large"))
            })?;
            let (p, o) = match padding {
                Padding::Valid if size < reach => {
                    return Err(Error::invalid(
                        op,
                        format!(
                            "input {input:?} is smaller than the window ({reach} along axis {}) with valid padding",
                            a + 1
                        ),
                    ));
                }
                Padding::Valid => (0, (size - reach) / strides[a] + 1),
                Padding::Same => {
                    let o = size.div_ceil(strides[a]);
                    (((o - 1) * strides[a] + reach).saturating_sub(size) / 2, o)
                }
                Padding::Causal => (reach - 1, (size - 1) / strides[a] + 1),
            };
            (pad[a], output[a]) = (p, o);
        }
        if output.contains(&0) {
            return Err(Error::invalid(op, format!("input {input:?} has an empty spatial axis")));
        }
        Ok(Window2d { batch, input: [h, w], channels, kernel, strides, dilation, pad, output })
    }

    /// The output shape for `channels` output channels.
    pub fn output_dims(&self, channels: usize) -> [usize; 4] {
        [self.batch, self.output[0], self.output[1], channels]
    }

    /// The input row (or column, `axis` 1) that output position `o` reads at tap `k`, if it lies
    /// inside the input (outside it is padding).
    #[inline(always)]
    pub fn source(&self, axis: usize, o: usize, k: usize) -> Option<usize> {
        (o * self.strides[axis] + k * self.dilation[axis]).checked_sub(self.pad[axis]).filter(|&i| i < self.input[axis])
    }

    /// The output position whose tap `k` reads input position `i` along `axis`, if any.
    #[inline(always)]
    pub fn reader(&self, axis: usize, i: usize, k: usize) -> Option<usize> {
        let t = (i + self.pad[axis]).checked_sub(k * self.dilation[axis])?;
        (t % self.strides[axis] == 0 && t / self.strides[axis] < self.output[axis]).then_some(t / self.strides[axis])
    }

    /// The numbers the WGSL kernels read (`info`): batch, h, w, channels, kh, kw, sh, sw, dh,
    /// dw, pad top, pad left, out h, out w.
    pub fn info(&self) -> Vec<u32> {
        [
            self.batch,
            self.input[0],
            self.input[1],
            self.channels,
            self.kernel[0],
            self.kernel[1],
            self.strides[0],
            self.strides[1],
            self.dilation[0],
            self.dilation[1],
            self.pad[0],
            self.pad[1],
            self.output[0],
            self.output[1],
        ]
        .iter()
        .map(|&v| v as u32)
        .collect()
    }
}

/// Which of a convolution's three products a kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPass {
    /// `y` from `x` and the kernel.
    Forward,
    /// `dx` from `dy` and the kernel.
    InputGrad,
    /// `dkernel` from `x` and `dy`.
    KernelGrad,
}

impl ConvPass {
    /// The WGSL entry point.
    pub fn entry(self) -> &'static str {
        match self {
            ConvPass::Forward => "forward",
            ConvPass::InputGrad => "input_grad",
            ConvPass::KernelGrad => "kernel_grad",
        }
    }
}

/// What a pooling window computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// The largest value (NaN if any is NaN); its gradient goes to the first largest.
    Max,
    /// The mean of the window's taps inside the input (padding is not counted, as in Keras).
    Avg,
}

impl PoolKind {
    /// Kernel name.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Max => "max",
            PoolKind::Avg => "avg",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_padding_matches_keras_sizes() {
        // 5 wide, kernel 3, stride 2: out 3, total padding 2, one before.
        let g = Window2d::new("t", &[1, 5, 5, 1], [3, 3], [2, 2], [1, 1], Padding::Same).unwrap();
        assert_eq!((g.output, g.pad), ([3, 3], [1, 1]));
        // 6 wide, kernel 2, stride 1: total padding 1, after the input.
        let g = Window2d::new("t", &[1, 6, 6, 1], [2, 2], [1, 1], [1, 1], Padding::Same).unwrap();
        assert_eq!((g.output, g.pad), ([6, 6], [0, 0]));
        let g = Window2d::new("t", &[1, 1, 7, 1], [1, 3], [1, 1], [1, 2], Padding::Causal).unwrap();
        assert_eq!((g.output, g.pad), ([1, 7], [0, 4]));
        assert!(Window2d::new("t", &[1, 2, 2, 1], [3, 3], [1, 1], [1, 1], Padding::Valid).is_err());
    }

    #[test]
    fn source_and_reader_are_inverse() {
        let g = Window2d::new("t", &[1, 9, 9, 1], [3, 3], [2, 2], [2, 2], Padding::Same).unwrap();
        for o in 0..g.output[0] {
            for k in 0..3 {
                if let Some(i) = g.source(0, o, k) {
                    assert_eq!(g.reader(0, i, k), Some(o));
                }
            }
        }
    }
}
