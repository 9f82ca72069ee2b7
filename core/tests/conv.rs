//! Convolution and pooling: the Cpu (im2col + gemm, or windows read in place) against a direct f64 loop written from the
//! definition, and the GPU kernels against the Cpu, forward and both gradients, on random
//! geometries (odd sizes, strides, dilations, every padding) and non-contiguous inputs.

mod common;

use common::{assert_close, gpu, vals};
use proptest::prelude::*;
use weft_core::conv::{Padding, Window2d};
use weft_core::ops::UnaryOp;
use weft_core::{Device, Result, Tensor, Var};

/// A geometry drawn by proptest.
#[derive(Debug, Clone, Copy)]
struct Case {
    batch: usize,
    hw: [usize; 2],
    c_in: usize,
    c_out: usize,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilation: [usize; 2],
    padding: Padding,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    cases([1..4, 1..10, 1..10, 1..6, 1..6], 1..4)
}

/// Geometries wide enough for weft's kernel to read the windows where they lie (on CPUs where it
/// runs; wide enough too for it to take the product of the unrolled windows).
fn wide_case() -> impl Strategy<Value = Case> {
    cases([1..4, 4..14, 4..14, 8..40, 32..100], 2..4).prop_filter("work enough", |c| {
        let g = c.geometry();
        g.batch * g.output[0] * g.output[1] * c.c_out * c.kernel[0] * c.kernel[1] * c.c_in >= 1 << 18
    })
}

/// Geometries whose batch, height, width, input and output channels come from `dims`, window
/// sides from `side`, any strides and dilations of 1 or 2, every padding; the window fits.
fn cases(dims: [std::ops::Range<usize>; 5], side: std::ops::Range<usize>) -> impl Strategy<Value = Case> {
    let pad = prop::sample::select(vec![Padding::Valid, Padding::Same, Padding::Causal]);
    let [batch, h, w, c_in, c_out] = dims;
    ((batch, h, w, c_in, c_out), (side.clone(), side, 1usize..3, 1usize..3, 1usize..3, 1usize..3), (pad, 0u64..1000))
        .prop_map(|((batch, h, w, c_in, c_out), (kh, kw, sh, sw, dh, dw), (padding, seed))| Case {
            batch,
            hw: [h, w],
            c_in,
            c_out,
            kernel: [kh, kw],
            strides: [sh, sw],
            dilation: [dh, dw],
            padding,
            seed,
        })
        .prop_filter("the window fits with valid padding", |c| {
            Window2d::new("t", &[c.batch, c.hw[0], c.hw[1], c.c_in], c.kernel, c.strides, c.dilation, c.padding).is_ok()
        })
}

impl Case {
    fn geometry(&self) -> Window2d {
        let x = [self.batch, self.hw[0], self.hw[1], self.c_in];
        Window2d::new("t", &x, self.kernel, self.strides, self.dilation, self.padding).unwrap()
    }
    fn x(&self, dev: &Device) -> Tensor {
        Tensor::rand(-1.0, 1.0, &[self.batch, self.hw[0], self.hw[1], self.c_in], self.seed, dev).unwrap()
    }
    fn kernel(&self, dev: &Device) -> Tensor {
        let [kh, kw] = self.kernel;
        Tensor::rand(-1.0, 1.0, &[kh, kw, self.c_in, self.c_out], self.seed + 1, dev).unwrap()
    }
}

/// y, dx and dk of the definition, in f64, for `sum(y * w)` with weights `w` shaped like y.
fn reference(x: &[f32], k: &[f32], w: &[f32], g: &Window2d, c_out: usize) -> [Vec<f32>; 3] {
    let [h, wd] = g.input;
    let c = g.channels;
    let [oh_n, ow_n] = g.output;
    let mut y = vec![0f64; g.batch * oh_n * ow_n * c_out];
    let mut dx = vec![0f64; x.len()];
    let mut dk = vec![0f64; k.len()];
    for n in 0..g.batch {
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                for co in 0..c_out {
                    let yi = ((n * oh_n + oh) * ow_n + ow) * c_out + co;
                    for ky in 0..g.kernel[0] {
                        let iy = (oh * g.strides[0] + ky * g.dilation[0]) as isize - g.pad[0] as isize;
                        for kx in 0..g.kernel[1] {
                            let ix = (ow * g.strides[1] + kx * g.dilation[1]) as isize - g.pad[1] as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                continue;
                            }
                            for ci in 0..c {
                                let xi = ((n * h + iy as usize) * wd + ix as usize) * c + ci;
                                let ki = ((ky * g.kernel[1] + kx) * c + ci) * c_out + co;
                                y[yi] += x[xi] as f64 * k[ki] as f64;
                                dx[xi] += w[yi] as f64 * k[ki] as f64;
                                dk[ki] += w[yi] as f64 * x[xi] as f64;
                            }
                        }
                    }
                }
            }
        }
    }
    [y, dx, dk].map(|v| v.into_iter().map(|a| a as f32).collect())
}

/// y, dx and dk of `sum(conv(x, k) * w)` through weft on `dev`; `x` is read through a transposed
/// view when `strided`.
fn run_conv(c: &Case, w: &[f32], strided: bool, dev: &Device) -> Result<[Vec<f32>; 3]> {
    let x = if strided {
        // The same values, laid out [batch, w, h, c] and viewed back as [batch, h, w, c].
        let t = c.x(&Device::Cpu).transpose(1, 2)?.contiguous()?;
        Tensor::from_slice(&vals(&t), t.dims(), dev)?.transpose(1, 2)?
    } else {
        c.x(dev)
    };
    let (xv, kv) = (Var::new(x.clone())?, Var::new(c.kernel(dev))?);
    let y = xv.as_tensor().conv2d(kv.as_tensor(), c.strides, c.dilation, c.padding)?;
    let wt = Tensor::from_slice(w, y.dims(), dev)?;
    let grads = y.mul(&wt)?.sum_all()?.backward()?;
    Ok([vals(&y), vals(grads.get(&xv).unwrap()), vals(grads.get(&kv).unwrap())])
}

/// y, dx and dk on the Cpu within `tol` of the definition's.
fn matches_definition(c: &Case, strided: bool, tol: f32) {
    let w = weights(c);
    let want = reference(&vals(&c.x(&Device::Cpu)), &vals(&c.kernel(&Device::Cpu)), &w, &c.geometry(), c.c_out);
    let got = run_conv(c, &w, strided, &Device::Cpu).unwrap();
    for (name, (g, wt)) in ["y", "dx", "dkernel"].iter().zip(got.iter().zip(&want)) {
        assert_close(g, wt, tol, &format!("{name} of {c:?}"));
    }
}

fn weights(c: &Case) -> Vec<f32> {
    let g = c.geometry();
    let n = g.output_dims(c.c_out).iter().product();
    vals(&Tensor::rand(0.5, 1.5, &[n], c.seed + 2, &Device::Cpu).unwrap())
}

/// Max or average pooling of `x` (`[n, h, w, c]`) from the definition, with `sum(y * w)`'s dx.
fn pool_reference(x: &[f32], w: &[f32], g: &Window2d, max: bool) -> [Vec<f32>; 2] {
    let [h, wd] = g.input;
    let c = g.channels;
    let [oh_n, ow_n] = g.output;
    let mut y = vec![0f32; g.batch * oh_n * ow_n * c];
    let mut dx = vec![0f32; x.len()];
    for n in 0..g.batch {
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                for ch in 0..c {
                    let mut taps = Vec::new();
                    for ky in 0..g.kernel[0] {
                        for kx in 0..g.kernel[1] {
                            let iy = (oh * g.strides[0] + ky) as isize - g.pad[0] as isize;
                            let ix = (ow * g.strides[1] + kx) as isize - g.pad[1] as isize;
                            if iy >= 0 && ix >= 0 && iy < h as isize && ix < wd as isize {
                                taps.push(((n * h + iy as usize) * wd + ix as usize) * c + ch);
                            }
                        }
                    }
                    let yi = ((n * oh_n + oh) * ow_n + ow) * c + ch;
                    if max {
                        let best = taps.iter().copied().fold(taps[0], |b, t| if x[t] > x[b] { t } else { b });
                        y[yi] = x[best];
                        dx[best] += w[yi];
                    } else {
                        y[yi] = taps.iter().map(|&t| x[t]).sum::<f32>() / taps.len() as f32;
                        taps.iter().for_each(|&t| dx[t] += w[yi] / taps.len() as f32);
                    }
                }
            }
        }
    }
    [y, dx]
}

fn run_pool(c: &Case, max: bool, dev: &Device) -> Result<[Vec<f32>; 2]> {
    let xv = Var::new(c.x(dev))?;
    let pad = if c.padding == Padding::Causal { Padding::Same } else { c.padding };
    let x = xv.as_tensor();
    let y = if max { x.max_pool2d(c.kernel, c.strides, pad)? } else { x.avg_pool2d(c.kernel, c.strides, pad)? };
    let w = Tensor::rand(0.5, 1.5, y.dims(), c.seed + 3, dev)?;
    let grads = y.mul(&w)?.sum_all()?.backward()?;
    Ok([vals(&y), vals(grads.get(&xv).unwrap())])
}

fn pool_case(c: &Case) -> Option<Window2d> {
    let pad = if c.padding == Padding::Causal { Padding::Same } else { c.padding };
    Window2d::new("t", &[c.batch, c.hw[0], c.hw[1], c.c_in], c.kernel, c.strides, [1, 1], pad).ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn cpu_convolution_matches_its_definition(c in case(), strided in any::<bool>()) {
        matches_definition(&c, strided, 1e-5);
    }

    /// Convolutions whose windows the Cpu reads in place (not unrolled): sums of up to 400 terms
    /// near 1 in f32 (dx over 99 channels x 6 taps was seen 1.1e-5 off).
    #[test]
    fn wide_cpu_convolutions_match_their_definition(c in wide_case(), strided in any::<bool>()) {
        matches_definition(&c, strided, 1e-4);
    }

    #[test]
    fn cpu_pooling_matches_its_definition(c in prop_oneof![case(), wide_case()], max in any::<bool>()) {
        let Some(g) = pool_case(&c) else { return Ok(()) };
        let got = run_pool(&c, max, &Device::Cpu).unwrap();
        let x = vals(&c.x(&Device::Cpu));
        let w = vals(&Tensor::rand(0.5, 1.5, &g.output_dims(c.c_in), c.seed + 3, &Device::Cpu).unwrap());
        let want = pool_reference(&x, &w, &g, max);
        for (name, (gt, wt)) in ["y", "dx"].iter().zip(got.iter().zip(&want)) {
            assert_close(gt, wt, 1e-6, &format!("{name} of {} pooling {c:?}", if max { "max" } else { "avg" }));
        }
    }

    #[test]
    fn gpu_convolution_and_pooling_match_cpu(c in case(), strided in any::<bool>()) {
        let Some(dev) = gpu() else { return Ok(()) };
        let w = weights(&c);
        let (want, got) = (run_conv(&c, &w, strided, &Device::Cpu).unwrap(), run_conv(&c, &w, strided, &dev).unwrap());
        for (name, (g, wt)) in ["y", "dx", "dkernel"].iter().zip(got.iter().zip(&want)) {
            assert_close(g, wt, 1e-5, &format!("GPU {name} of {c:?}"));
        }
        if pool_case(&c).is_some() {
            for max in [true, false] {
                let (want, got) = (run_pool(&c, max, &Device::Cpu).unwrap(), run_pool(&c, max, &dev).unwrap());
                for (name, (g, wt)) in ["y", "dx"].iter().zip(got.iter().zip(&want)) {
                    assert_close(g, wt, 1e-6, &format!("GPU {name} of pooling (max {max}) {c:?}"));
                }
            }
        }
    }
}

/// Enough samples that the Cpu builds its columns in several chunks: the result is still the
/// definition's, and a 1x1 kernel (whose columns are the input itself) is too.
#[test]
fn chunked_and_pointwise_convolutions_match_their_definition() {
    for (batch, kernel) in [(40, [3, 3]), (3, [1, 1])] {
        let c = Case {
            batch,
            hw: [32, 32],
            c_in: 12,
            c_out: 4,
            kernel,
            strides: [1, 1],
            dilation: [1, 1],
            padding: Padding::Same,
            seed: 5,
        };
        let w = weights(&c);
        let want = reference(&vals(&c.x(&Device::Cpu)), &vals(&c.kernel(&Device::Cpu)), &w, &c.geometry(), c.c_out);
        let got = run_conv(&c, &w, false, &Device::Cpu).unwrap();
        for (name, (g, wt)) in ["y", "dx", "dkernel"].iter().zip(got.iter().zip(&want)) {
            assert_close(g, wt, 1e-4, &format!("{name} of {c:?}"));
        }
    }
}

#[test]
fn one_dimensional_forms_are_the_two_dimensional_ones_over_a_row() {
    let x = Tensor::rand(-1.0, 1.0, &[2, 9, 3], 1, &Device::Cpu).unwrap();
    let k = Tensor::rand(-1.0, 1.0, &[3, 3, 5], 2, &Device::Cpu).unwrap();
    let y = x.conv1d(&k, 1, 2, Padding::Causal).unwrap();
    assert_eq!(y.dims(), &[2, 9, 5]);
    // Causal: output t sees inputs up to t only, so changing the last step changes only the last output.
    let mut xv = vals(&x);
    xv[8 * 3] += 1.0;
    let y2 = Tensor::from_slice(&xv, &[2, 9, 3], &Device::Cpu).unwrap().conv1d(&k, 1, 2, Padding::Causal).unwrap();
    let (a, b) = (vals(&y), vals(&y2));
    assert_eq!(a[..8 * 5], b[..8 * 5]);
    assert_ne!(a[8 * 5..9 * 5], b[8 * 5..9 * 5]);
    let p = x.max_pool1d(2, 2, Padding::Valid).unwrap();
    assert_eq!(p.dims(), &[2, 4, 3]);
    assert_eq!(vals(&p)[0], vals(&x)[0].max(vals(&x)[3]));
}

#[test]
fn bad_shapes_are_errs_that_name_them() {
    let x = Tensor::ones(&[2, 5, 5, 3], &Device::Cpu).unwrap();
    let k = Tensor::ones(&[3, 3, 4, 2], &Device::Cpu).unwrap();
    let e = x.conv2d(&k, [1, 1], [1, 1], Padding::Valid).unwrap_err().to_string();
    assert!(e.contains("[2, 5, 5, 3]") && e.contains("[3, 3, 4, 2]"), "{e}");
    let k = Tensor::ones(&[7, 7, 3, 2], &Device::Cpu).unwrap();
    let e = x.conv2d(&k, [1, 1], [1, 1], Padding::Valid).unwrap_err().to_string();
    assert!(e.contains("smaller than the window"), "{e}");
    let e = x.max_pool2d([2, 2], [0, 1], Padding::Valid).unwrap_err().to_string();
    assert!(e.contains("strides"), "{e}");
    let e = x.avg_pool2d([2, 2], [2, 2], Padding::Causal).unwrap_err().to_string();
    assert!(e.contains("causal"), "{e}");
    let e = Tensor::ones(&[5, 3], &Device::Cpu).unwrap().max_pool1d(2, 2, Padding::Valid).unwrap_err().to_string();
    assert!(e.contains("[5, 3]"), "{e}");
}

#[test]
fn empty_axes_and_huge_windows_are_errs_not_panics() {
    let dev = Device::Cpu;
    let e = Tensor::zeros(&[1, 4, 4, 0], &dev).unwrap().max_pool2d([2, 2], [2, 2], Padding::Valid).unwrap_err();
    assert!(e.to_string().contains("empty axis"), "{e}");
    let e = Tensor::zeros(&[1, 0, 5, 1], &dev).unwrap().avg_pool2d([2, 2], [1, 1], Padding::Same).unwrap_err();
    assert!(e.to_string().contains("empty axis"), "{e}");
    let x = Tensor::zeros(&[1, 4, 4, 2], &dev).unwrap();
    let e = x.conv2d(&Tensor::zeros(&[1, 1, 2, 0], &dev).unwrap(), [1, 1], [1, 1], Padding::Valid).unwrap_err();
    assert!(e.to_string().contains("c_out > 0"), "{e}");
    let e = x.conv2d(&Tensor::zeros(&[2, 2, 2, 1], &dev).unwrap(), [1, 1], [usize::MAX, 1], Padding::Same).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
}

/// Max pooling over many channels (the Cpu compares eight channels at a time, the rest one by
/// one): ties go to a window's first tap, a NaN to its first NaN (the value is NaN and the
/// gradient goes to that tap), on the Cpu and on a GPU, for overlapping and padded windows.
#[test]
fn max_pooling_over_many_channels_keeps_ties_and_nans() {
    let (n, h, w, c) = (2, 5, 6, 19);
    // A coarse grid of values, so windows tie often; NaNs here and there.
    let mut x: Vec<f32> = (0..n * h * w * c).map(|i| ((i * 7919) % 5) as f32).collect();
    for i in [3, 40, 41, 59, 200, 333, 334, 1000] {
        x[i] = f32::NAN;
    }
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for (kernel, strides, pad) in [([2, 2], [2, 2], Padding::Valid), ([3, 3], [1, 1], Padding::Same)] {
        let g = Window2d::new("t", &[n, h, w, c], kernel, strides, [1, 1], pad).unwrap();
        let [oh_n, ow_n] = g.output;
        // The definition: taps in window order; a later tap wins when it is larger or NaN,
        // unless a NaN already won.
        let mut want_y = vec![0f32; n * oh_n * ow_n * c];
        let mut want_dx = vec![0f32; x.len()];
        let wts: Vec<f32> = (0..want_y.len()).map(|i| 1.0 + (i % 13) as f32).collect();
        for s in 0..n {
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    for ch in 0..c {
                        let mut best: Option<usize> = None;
                        for ky in 0..kernel[0] {
                            for kx in 0..kernel[1] {
                                let iy = (oh * strides[0] + ky) as isize - g.pad[0] as isize;
                                let ix = (ow * strides[1] + kx) as isize - g.pad[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let t = ((s * h + iy as usize) * w + ix as usize) * c + ch;
                                best = match best {
                                    Some(b) if x[b].is_nan() || !(x[t] > x[b] || x[t].is_nan()) => Some(b),
                                    _ => Some(t),
                                };
                            }
                        }
                        let yi = ((s * oh_n + oh) * ow_n + ow) * c + ch;
                        let b = best.unwrap();
                        want_y[yi] = x[b];
                        want_dx[b] += wts[yi];
                    }
                }
            }
        }
        for dev in &devices {
            let xv = Var::new(Tensor::from_slice(&x, &[n, h, w, c], dev).unwrap()).unwrap();
            let y = xv.as_tensor().max_pool2d(kernel, strides, pad).unwrap();
            let wt = Tensor::from_slice(&wts, y.dims(), dev).unwrap();
            let grads = y.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
            let (got_y, got_dx) = (vals(&y), vals(grads.get(&xv).unwrap()));
            let at = format!("{kernel:?} {pad:?} on {}", dev.describe());
            for (i, (a, b)) in got_y.iter().zip(&want_y).enumerate() {
                assert!(a == b || (a.is_nan() && b.is_nan()), "y[{i}] {a} vs {b} ({at})");
            }
            for (i, (a, b)) in got_dx.iter().zip(&want_dx).enumerate() {
                assert!(a == b || (a.is_nan() && b.is_nan()), "dx[{i}] {a} vs {b} ({at})");
            }
        }
    }
}

/// y, dx, dk and dbias of `sum(op(conv(x, k) + bias) * w)` on `dev`, fused or as the
/// convolution followed by `add_unary`, as bits.
fn conv_add_unary(c: &Case, op: UnaryOp, fused: bool, dev: &Device) -> [Vec<u32>; 4] {
    let (xv, kv) = (Var::new(c.x(dev)).unwrap(), Var::new(c.kernel(dev)).unwrap());
    let bv = Var::new(Tensor::rand(-0.5, 0.5, &[c.c_out], c.seed + 5, dev).unwrap()).unwrap();
    let (x, k, b) = (xv.as_tensor(), kv.as_tensor(), bv.as_tensor());
    let y = if fused {
        x.conv2d_add_unary(k, b, op, c.strides, c.dilation, c.padding).unwrap()
    } else {
        x.conv2d(k, c.strides, c.dilation, c.padding).unwrap().add_unary(b, op).unwrap()
    };
    let w = Tensor::from_slice(&weights(c), y.dims(), dev).unwrap();
    let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let bits = |t: &Tensor| vals(t).iter().map(|v| v.to_bits()).collect();
    [bits(&y), bits(grads.get(&xv).unwrap()), bits(grads.get(&kv).unwrap()), bits(grads.get(&bv).unwrap())]
}

/// [`conv_add_unary`]'s values and gradients with the input (`x_var` false) or the kernel as a
/// plain tensor, which takes no part in the gradient (data fed to a first layer; a frozen
/// kernel): the other's gradient, the output and the bias's, as bits; `None` where the store
/// holds no gradient.
fn conv_add_unary_with(c: &Case, op: UnaryOp, x_var: bool, dev: &Device) -> [Option<Vec<u32>>; 4] {
    let (x, k) = (c.x(dev), c.kernel(dev));
    let (xv, kv) = (Var::new(x.clone()).unwrap(), Var::new(k.clone()).unwrap());
    let bv = Var::new(Tensor::rand(-0.5, 0.5, &[c.c_out], c.seed + 5, dev).unwrap()).unwrap();
    let (x, k) = if x_var { (xv.as_tensor().clone(), k) } else { (x, kv.as_tensor().clone()) };
    let y = x.conv2d_add_unary(&k, bv.as_tensor(), op, c.strides, c.dilation, c.padding).unwrap();
    let w = Tensor::from_slice(&weights(c), y.dims(), dev).unwrap();
    let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let bits = |t: &Tensor| vals(t).iter().map(|v| v.to_bits()).collect();
    [Some(bits(&y)), grads.get(&xv).map(bits), grads.get(&kv).map(bits), grads.get(&bv).map(bits)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// A convolution whose input or kernel takes no part in the gradient (its backward skips
    /// that one's gradient): the other gradients are the bits of the case where both are
    /// variables, on narrow and wide geometries.
    #[test]
    fn a_convolution_of_data_or_by_a_frozen_kernel_keeps_the_other_gradients(
            c in prop_oneof![case(), wide_case()], x_var: bool) {
        let d = Device::Cpu;
        let both = conv_add_unary(&c, UnaryOp::Relu, true, &d);
        let one = conv_add_unary_with(&c, UnaryOp::Relu, x_var, &d);
        let (kept, dropped) = if x_var { (1, 2) } else { (2, 1) };
        prop_assert!(one[dropped].is_none(), "{c:?}: a gradient for the plain tensor");
        for i in [0, kept, 3] {
            prop_assert!(one[i].as_ref() == Some(&both[i]), "{c:?}: value {i} differs (x a var: {x_var})");
        }
    }
}

const EPILOGUES: [UnaryOp; 5] = [UnaryOp::Relu, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Identity, UnaryOp::GeluTanh];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// A convolution with its bias and activation applied to the output blocks while in cache
    /// gives the values and gradients (input, kernel, bias) of the convolution then `add_unary`,
    /// bit for bit, on the Cpu; on a GPU (which runs the two) the Cpu's values.
    #[test]
    fn conv_with_bias_and_activation_is_the_conv_then_add_unary(c in case(), pick in 0usize..5) {
        let op = EPILOGUES[pick];
        let names = ["y", "dx", "dkernel", "dbias"];
        let want = conv_add_unary(&c, op, false, &Device::Cpu);
        let got = conv_add_unary(&c, op, true, &Device::Cpu);
        for (name, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
            prop_assert_eq!(g, w, "{} of {:?} {:?}", name, op, c);
        }
        if let Some(dev) = gpu() {
            let on_gpu = conv_add_unary(&c, op, true, &dev);
            for (name, (g, w)) in names.iter().zip(on_gpu.iter().zip(&want)) {
                let f = |v: &[u32]| v.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>();
                assert_close(&f(g), &f(w), 1e-5, &format!("GPU {name} of {op:?} {c:?}"));
            }
        }
    }
}

/// A 3x3 "same" convolution of unit strides over `batch` inputs of `hw` pixels.
fn same_3x3(batch: usize, hw: [usize; 2], c_in: usize, c_out: usize, seed: u64) -> Case {
    let (kernel, strides, dilation, padding) = ([3, 3], [1, 1], [1, 1], Padding::Same);
    Case { batch, hw, c_in, c_out, kernel, strides, dilation, padding, seed }
}

/// The fused form over several blocks of output rows, over the 1x1 kernel whose columns are the
/// input itself, and in one dimension: the convolution then `add_unary`, bit for bit.
#[test]
fn conv_with_bias_and_activation_over_blocks_pointwise_and_1d() {
    let big = same_3x3(8, [16, 16], 8, 5, 3);
    let pointwise = Case { kernel: [1, 1], padding: Padding::Valid, ..big };
    // Windows read in place (weft's kernel over 40 output channels).
    let wide = Case { c_out: 40, strides: [2, 1], ..big };
    for c in [big, pointwise, wide] {
        for op in EPILOGUES {
            assert_eq!(
                conv_add_unary(&c, op, true, &Device::Cpu),
                conv_add_unary(&c, op, false, &Device::Cpu),
                "{op:?} {c:?}"
            );
        }
    }
    let d = Device::Cpu;
    let x = Tensor::rand(-1.0, 1.0, &[3, 11, 4], 1, &d).unwrap();
    let k = Tensor::rand(-1.0, 1.0, &[3, 4, 6], 2, &d).unwrap();
    let b = Tensor::rand(-1.0, 1.0, &[6], 3, &d).unwrap();
    let fused = x.conv1d_add_unary(&k, &b, UnaryOp::Relu, 2, 1, Padding::Causal).unwrap();
    let two = x.conv1d(&k, 2, 1, Padding::Causal).unwrap().add_unary(&b, UnaryOp::Relu).unwrap();
    assert_eq!(fused.dims(), two.dims());
    assert_eq!(vals(&fused), vals(&two));
    // A bias that is a view of a larger tensor (one layer's row of a stacked [2, c_out]).
    let stacked = Tensor::rand(-1.0, 1.0, &[2, 6], 4, &d).unwrap();
    let first = stacked.narrow(0, 0, 1).unwrap().squeeze(0).unwrap();
    let fused = x.conv1d_add_unary(&k, &first, UnaryOp::Relu, 1, 1, Padding::Same).unwrap();
    let two = x.conv1d(&k, 1, 1, Padding::Same).unwrap().add_unary(&first, UnaryOp::Relu).unwrap();
    assert_eq!(vals(&fused), vals(&two), "a bias viewed from a larger tensor");
    let bad = Tensor::zeros(&[5], &d).unwrap();
    let e = x.conv1d_add_unary(&k, &bad, UnaryOp::Relu, 1, 1, Padding::Valid).unwrap_err().to_string();
    assert!(e.contains("[6]") && e.contains("[5]"), "{e}");
}

/// A convolution's output concatenated with another tensor: its gradient arrives as the front of
/// the concatenation's (compact, on a longer storage), and gives the gradients of the
/// convolution alone, on the windows read in place and the unrolled paths.
#[test]
fn gradients_through_a_concatenation_are_those_of_the_convolution_alone() {
    let d = Device::Cpu;
    for c in [same_3x3(2, [9, 7], 12, 40, 4), same_3x3(2, [9, 7], 3, 5, 4)] {
        let (xv, kv) = (Var::new(c.x(&d)).unwrap(), Var::new(c.kernel(&d)).unwrap());
        let y = xv.as_tensor().conv2d(kv.as_tensor(), c.strides, c.dilation, c.padding).unwrap();
        let other = Tensor::rand(-1.0, 1.0, y.dims(), 10, &d).unwrap();
        let both = Tensor::concat(&[y.clone(), other], 0).unwrap();
        let w = Tensor::rand(0.5, 1.5, both.dims(), 9, &d).unwrap();
        let grads = both.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let front = w.narrow(0, 0, c.batch).unwrap().contiguous().unwrap();
        let alone = y.mul(&front).unwrap().sum_all().unwrap().backward().unwrap();
        for v in [&xv, &kv] {
            assert_eq!(vals(grads.get(v).unwrap()), vals(alone.get(v).unwrap()), "{c:?}");
        }
    }
}

/// In inference (no gradient recorded) the kernel is packed once per call and kept by its storage
/// from the second call on: the first, second and third calls give the bits of a recorded
/// convolution, over several blocks of rows, a 1x1 kernel, a stride, with and without a bias and
/// activation, and a kernel too narrow to keep.
#[test]
fn inference_keeps_the_kernel_packed_with_the_same_bits() {
    let d = Device::Cpu;
    let big = same_3x3(6, [19, 17], 12, 40, 8);
    let pointwise = Case { kernel: [1, 1], padding: Padding::Valid, c_out: 24, ..big };
    let strided = Case { strides: [2, 2], c_out: 16, ..big };
    let narrow = Case { c_out: 5, ..big };
    for c in [big, pointwise, strided, narrow] {
        let (xv, kv) = (Var::new(c.x(&d)).unwrap(), Var::new(c.kernel(&d)).unwrap());
        let b = Tensor::rand(-0.5, 0.5, &[c.c_out], c.seed + 5, &d).unwrap();
        let (x, k) = (xv.as_tensor(), kv.as_tensor());
        let plain = || x.conv2d(k, c.strides, c.dilation, c.padding);
        let fused = || x.conv2d_add_unary(k, &b, UnaryOp::Relu, c.strides, c.dilation, c.padding);
        for (name, f) in [("conv2d", &plain as &dyn Fn() -> Result<Tensor>), ("conv2d_add_unary", &fused)] {
            let want = vals(&f().unwrap());
            for call in 1..=3 {
                let got = weft_core::no_grad(f).unwrap();
                let same = vals(&got).iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{name} call {call} in inference differs from training on {c:?}");
            }
        }
    }
}
