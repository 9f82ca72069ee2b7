//! Pooling over windows (MaxPooling1D/2D, AveragePooling1D/2D) and over the whole of the spatial
//! axes (GlobalAveragePooling2D, GlobalMaxPooling1D/2D), channels-last, as in Keras. Each acts on
//! every channel alone, so a tensor split by channels pools split as it comes.

use crate::{Ctx, Layer, SplitRule};
use weft_core::conv::Padding;
use weft_core::{Error, Result, Tensor, Var, trace};

/// The parts every pooling layer shares: name, kind, no variables, no mask carried on.
macro_rules! pooling_layer {
    ($t:ident, $kind:literal) => {
        impl $t {
            /// Give the layer a name.
            pub fn named(mut self, name: &str) -> Self {
                self.name = name.to_string();
                self
            }
        }
        impl Layer for $t {
            fn call(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
                let _scope = crate::scope::enter(self);
                self.forward(x).map_err(|e| Error::invalid($kind, format!("{}: {e}", trace::current_scope())))
            }
            fn name(&self) -> &str {
                &self.name
            }
            fn set_name(&mut self, name: String) {
                self.name = name;
            }
            fn kind(&self) -> &'static str {
                $kind
            }
            fn variables(&self) -> Vec<(String, Var)> {
                Vec::new()
            }
            fn output_mask(&self, _: &[Tensor], _: &[Option<Tensor>], _: &Tensor) -> Result<Option<Tensor>> {
                Ok(None)
            }
            fn split_rule(&self) -> SplitRule {
                SplitRule::Pointwise
            }
        }
    };
}

/// Windows of a pooling layer, in (height, width) order.
struct Windows {
    pool: [usize; 2],
    strides: [usize; 2],
    padding: Padding,
}

/// Windowed pooling layers: `new(pool_size)` (strides default to the pool size, as in Keras),
/// `strides`, `padding`.
macro_rules! windowed {
    ($t:ident, $kind:literal, $window:ty, $to2:expr, $doc:literal, $forward:expr) => {
        #[doc = $doc]
        pub struct $t {
            name: String,
            w: Windows,
        }
        impl $t {
            /// Windows of `pool_size`, stepped by the same, no padding.
            pub fn new(pool_size: $window) -> Self {
                let p = $to2(pool_size);
                $t { name: String::new(), w: Windows { pool: p, strides: p, padding: Padding::Valid } }
            }
            /// Step between windows.
            pub fn strides(mut self, s: $window) -> Self {
                self.w.strides = $to2(s);
                self
            }
            /// `Valid` (default) or `Same`.
            pub fn padding(mut self, p: Padding) -> Self {
                self.w.padding = p;
                self
            }
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let f: fn(&Tensor, &Windows) -> Result<Tensor> = $forward;
                f(x, &self.w)
            }
        }
        pooling_layer!($t, $kind);
    };
}

windowed!(
    MaxPooling2D,
    "MaxPooling2D",
    [usize; 2],
    |v: [usize; 2]| v,
    "The largest value of each window of `[batch, h, w, c]`.\n\n```\nuse weft_core::{Device, Tensor};\nuse weft_nn::{layers::MaxPooling2D, Ctx, Layer};\nlet y = MaxPooling2D::new([2, 2]).call(&Tensor::ones(&[1, 4, 6, 3], &Device::Cpu)?, &mut Ctx::inference())?;\nassert_eq!(y.dims(), &[1, 2, 3, 3]);\n# Ok::<(), weft_core::Error>(())\n```",
    |x, w| x.max_pool2d(w.pool, w.strides, w.padding)
);
windowed!(
    AveragePooling2D,
    "AveragePooling2D",
    [usize; 2],
    |v: [usize; 2]| v,
    "The mean of each window of `[batch, h, w, c]` (with `Same` padding, of its taps inside the input).",
    |x, w| x.avg_pool2d(w.pool, w.strides, w.padding)
);
windowed!(
    MaxPooling1D,
    "MaxPooling1D",
    usize,
    |v: usize| [1, v],
    "The largest value of each window of `[batch, steps, c]`.",
    |x, w| x.max_pool1d(w.pool[1], w.strides[1], w.padding)
);
windowed!(
    AveragePooling1D,
    "AveragePooling1D",
    usize,
    |v: usize| [1, v],
    "The mean of each window of `[batch, steps, c]`.",
    |x, w| x.avg_pool1d(w.pool[1], w.strides[1], w.padding)
);

/// Global pooling: the spatial axes reduced away, `keepdims` keeping them as size 1.
macro_rules! global {
    ($t:ident, $kind:literal, $rank:literal, $doc:literal, $reduce:ident) => {
        #[doc = $doc]
        #[derive(Default)]
        pub struct $t {
            name: String,
            keepdims: bool,
        }
        impl $t {
            /// A pooling layer that drops the spatial axes.
            pub fn new() -> Self {
                Self::default()
            }
            /// Keep the spatial axes as size 1 (Keras' `keepdims`).
            pub fn keepdims(mut self, on: bool) -> Self {
                self.keepdims = on;
                self
            }
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                if x.rank() != $rank {
                    return Err(Error::invalid(
                        $kind,
                        format!("expects {} axes (channels last), got shape {:?}", $rank, x.dims()),
                    ));
                }
                let axes: Vec<isize> = (1..$rank - 1).collect();
                x.$reduce(&axes, self.keepdims)
            }
        }
        pooling_layer!($t, $kind);
    };
}

global!(
    GlobalAveragePooling2D,
    "GlobalAveragePooling2D",
    4,
    "The mean over height and width: `[batch, h, w, c]` to `[batch, c]`.\n\n```\nuse weft_core::{Device, Tensor};\nuse weft_nn::{layers::GlobalAveragePooling2D, Ctx, Layer};\nlet y = GlobalAveragePooling2D::new().call(&Tensor::ones(&[2, 3, 3, 4], &Device::Cpu)?, &mut Ctx::inference())?;\nassert_eq!(y.dims(), &[2, 4]);\n# Ok::<(), weft_core::Error>(())\n```",
    mean
);
global!(
    GlobalMaxPooling2D,
    "GlobalMaxPooling2D",
    4,
    "The largest value over height and width: `[batch, h, w, c]` to `[batch, c]`.",
    max
);
global!(
    GlobalMaxPooling1D,
    "GlobalMaxPooling1D",
    3,
    "The largest value over time: `[batch, steps, c]` to `[batch, c]`.",
    max
);
