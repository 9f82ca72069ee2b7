//! Importing foreign safetensors files: renames, transposes, reshapes, integer tensors, strict
//! and lenient modes, the report, and an import that fails changing nothing.

mod common;

use weft_core::{Device, Tensor};
use weft_nn::import::{Importer, Mode, Transform};
use weft_nn::layers::Dense;
use weft_nn::{Model, Sequential};

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A PyTorch-style two-layer MLP: `fc1` 3 -> 4 and `fc2` 4 -> 2, weights `[out, in]`, plus an
/// int64 buffer.
fn torch_file(dir: &std::path::Path) -> (std::path::PathBuf, Vec<f32>, Vec<f32>) {
    let w1: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect(); // [4, 3]
    let w2: Vec<f32> = (0..8).map(|i| 1.0 - i as f32 * 0.2).collect(); // [2, 4]
    let ids: Vec<u8> = (0..4i64).flat_map(|i| i.to_le_bytes()).collect();
    let file = common::raw_safetensors(&[
        ("net.fc1.weight", "F32", vec![4, 3], f32s(&w1)),
        ("net.fc1.bias", "F32", vec![4], f32s(&[0.1, 0.2, 0.3, 0.4])),
        ("net.fc2.weight", "F32", vec![2, 4], f32s(&w2)),
        ("net.fc2.bias", "F32", vec![2], f32s(&[-0.5, 0.5])),
        ("net.position_ids", "I64", vec![1, 4], ids),
    ]);
    let path = dir.join("torch.safetensors");
    std::fs::write(&path, file).unwrap();
    (path, w1, w2)
}

fn model() -> Model {
    let m = Model::new(Sequential::new().add(Dense::new(4).named("fc1")).add(Dense::new(2).named("fc2")), &Device::Cpu);
    m.build(&[3]).unwrap();
    m
}

fn importer() -> Importer {
    Importer::new()
        .rule("net.*.weight", "sequential/*/kernel")
        .rule("net.*.bias", "sequential/*/bias")
        .transform("**.weight", Transform::Transpose)
        .skip("**.position_ids")
}

fn weights(m: &Model) -> Vec<Vec<f32>> {
    m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn a_pytorch_mlp_imports_transposed_and_computes_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (path, w1, w2) = torch_file(dir.path());
    let m = model();
    let report = importer().load(&path, &m.variables()).unwrap();
    assert_eq!(report.mapped.len(), 4, "{report}");
    assert_eq!(report.skipped, vec!["net.position_ids".to_string()]);
    assert!(report.missing.is_empty() && report.unused.is_empty(), "{report}");
    // y = x W1^T + b1, then W2: compare with the PyTorch formula on the host.
    let x = [0.5f32, -1.0, 2.0];
    let h: Vec<f32> =
        (0..4).map(|o| (0..3).map(|i| x[i] * w1[o * 3 + i]).sum::<f32>() + [0.1, 0.2, 0.3, 0.4][o]).collect();
    let y: Vec<f32> = (0..2).map(|o| (0..4).map(|i| h[i] * w2[o * 4 + i]).sum::<f32>() + [-0.5, 0.5][o]).collect();
    let got = m.predict(Tensor::from_vec(x.to_vec(), &[1, 3], &Device::Cpu).unwrap(), 1).unwrap();
    for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&y) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    let text = report.to_string();
    assert!(text.contains("net.fc1.weight -> sequential/fc1/kernel (transpose)"), "{text}");
}

#[test]
fn strict_mode_refuses_missing_and_unused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _, _) = torch_file(dir.path());
    let m = model();
    let before = weights(&m);
    // Without the skip, the int64 buffer is unused; without the bias rule, biases are missing.
    let imp = Importer::new().rule("net.*.weight", "sequential/*/kernel").transform("**.weight", Transform::Transpose);
    let err = imp.load(&path, &m.variables()).unwrap_err().to_string();
    for want in
        ["no tensor for the variable sequential/fc1/bias", "net.position_ids maps to no variable", "nothing was loaded"]
    {
        assert!(err.contains(want), "{want} missing from {err}");
    }
    assert_eq!(weights(&m), before);
}

#[test]
fn lenient_mode_loads_what_maps_and_reports_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (path, w1, _) = torch_file(dir.path());
    let m = model();
    let before = weights(&m);
    let imp = Importer::new()
        .rule("net.fc1.weight", "sequential/fc1/kernel")
        .transform("**.weight", Transform::Transpose)
        .mode(Mode::Lenient);
    let report = imp.load(&path, &m.variables()).unwrap();
    assert_eq!(report.mapped.len(), 1);
    assert_eq!(report.missing.len(), 3, "{report}");
    assert_eq!(report.unused.len(), 4, "{report}");
    let after = weights(&m);
    // fc1's kernel is W1 transposed; the other variables are untouched.
    let w1t: Vec<f32> = (0..12).map(|i| w1[(i % 4) * 3 + i / 4]).collect();
    assert_eq!(after[0], w1t);
    assert_eq!(after[1..], before[1..]);
}

#[test]
fn a_wrong_shape_fails_a_lenient_import_without_changing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _, _) = torch_file(dir.path());
    let m = model();
    let before = weights(&m);
    // No transpose: fc1's weight is [4, 3], the kernel [3, 4].
    let imp = Importer::new()
        .rule("net.*.weight", "sequential/*/kernel")
        .rule("net.*.bias", "sequential/*/bias")
        .mode(Mode::Lenient);
    let err = imp.load(&path, &m.variables()).unwrap_err().to_string();
    assert!(err.contains("net.fc1.weight") && err.contains("[4, 3]") && err.contains("[3, 4]"), "{err}");
    assert_eq!(weights(&m), before);
}

#[test]
fn reshape_to_fit_splits_heads() {
    use weft_nn::layers::EinsumDense;
    let dir = tempfile::tempdir().unwrap();
    // A [out = 2 heads * 3, in = 4] projection into an EinsumDense kernel [4, 2, 3].
    let w: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let path = dir.path().join("q.safetensors");
    std::fs::write(&path, common::raw_safetensors(&[("q.weight", "F32", vec![6, 4], f32s(&w))])).unwrap();
    let m = Model::new(Sequential::new().add(EinsumDense::new("abc,cde->abde", &[0, 2, 3]).named("q")), &Device::Cpu);
    m.build(&[5, 4]).unwrap();
    let imp = Importer::new()
        .rule("q.weight", "sequential/q/kernel")
        .transform("**.weight", Transform::Transpose)
        .reshape_to_fit(true);
    let report = imp.load(&path, &m.variables()).unwrap();
    assert!(report.mapped[0].3, "reshaped");
    let k = m.variables()[0].1.to_vec::<f32>().unwrap();
    // kernel[c, d, e] = W[d * 3 + e, c]
    for c in 0..4 {
        for d in 0..2 {
            for e in 0..3 {
                assert_eq!(k[c * 6 + d * 3 + e], w[(d * 3 + e) * 4 + c]);
            }
        }
    }
}

/// A PyTorch `Conv2d` weight `[out, in, kh, kw]` imports into a `Conv2D` kernel
/// `[kh, kw, in, out]`, and the layer computes PyTorch's cross-correlation with it.
#[test]
fn a_pytorch_convolution_imports_with_its_axes_moved() {
    use weft_nn::layers::Conv2D;
    let (o, i, kh, kw) = (2usize, 3usize, 2usize, 3usize);
    let w: Vec<f32> = (0..o * i * kh * kw).map(|v| ((v * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let b = [0.25f32, -0.75];
    let file = common::raw_safetensors(&[
        ("conv.weight", "F32", vec![o, i, kh, kw], f32s(&w)),
        ("conv.bias", "F32", vec![o], f32s(&b)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conv.safetensors");
    std::fs::write(&path, file).unwrap();
    let m = Model::new(Sequential::new().add(Conv2D::new(o, [kh, kw]).named("conv")), &Device::Cpu);
    m.build(&[4, 5, i]).unwrap();
    let imp = Importer::new()
        .rule("conv.weight", "sequential/conv/kernel")
        .rule("conv.bias", "sequential/conv/bias")
        .transform("conv.weight", Transform::ConvKernel);
    let report = imp.load(&path, &m.variables()).unwrap();
    assert_eq!(report.mapped.len(), 2, "{report}");
    let x = Tensor::rand(-1.0, 1.0, &[1, 4, 5, i], 3, &Device::Cpu).unwrap();
    let xv = x.to_vec::<f32>().unwrap();
    let y = m.predict(&x, 1).unwrap().to_vec::<f32>().unwrap();
    let (oh_n, ow_n) = (4 - kh + 1, 5 - kw + 1);
    for oh in 0..oh_n {
        for ow in 0..ow_n {
            for oc in 0..o {
                let mut want = b[oc];
                for ic in 0..i {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            want += w[((oc * i + ic) * kh + ky) * kw + kx] * xv[((oh + ky) * 5 + ow + kx) * i + ic];
                        }
                    }
                }
                let got = y[(oh * ow_n + ow) * o + oc];
                assert!((got - want).abs() < 1e-5, "y[{oh}, {ow}, {oc}]: {got} against PyTorch's {want}");
            }
        }
    }
    // A weight of too few axes is refused with its name, and nothing is set.
    let flat = common::raw_safetensors(&[("conv.weight", "F32", vec![o, i], f32s(&w[..o * i]))]);
    std::fs::write(&path, flat).unwrap();
    let err = imp.load(&path, &m.variables()).unwrap_err().to_string();
    assert!(err.contains("conv.weight") && err.contains("3 or more axes"), "{err}");
}
