//! save_weights / load_weights: exact round trips, every mismatch reported, f16/bf16 files,
//! truncated files, and a failed save that leaves the previous checkpoint intact.

use weft_core::{Device, Tensor};
use weft_nn::layers::Dense;
use weft_nn::optim::Sgd;
use weft_nn::{Activation, FitOptions, Loss, Model, Sequential};

fn model(units: usize) -> Model {
    let net = Sequential::new().add(Dense::new(units).activation(Activation::Tanh)).add(Dense::new(2));
    Model::new(net, &Device::Cpu)
}

fn trained(seed: u64) -> Model {
    let mut m = model(4);
    m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]);
    let x = Tensor::rand(-1.0, 1.0, &[16, 3], seed, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 2], seed + 1, &Device::Cpu).unwrap();
    m.fit(&x, &y, FitOptions { epochs: 2, batch_size: 4, seed, verbose: false, ..Default::default() }).unwrap();
    m
}

/// A safetensors file written by hand: 8-byte little-endian header length, JSON header, data.
fn raw_safetensors(entries: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in entries.iter().enumerate() {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        if i > 0 {
            header.push(',');
        }
        header += &format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            dims.join(","),
            data.len(),
            data.len() + bytes.len()
        );
        data.extend_from_slice(bytes);
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

#[test]
fn save_then_load_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let a = trained(1);
    a.save_weights(&path).unwrap();
    let b = trained(99);
    b.load_weights(&path).unwrap();
    for ((pa, va), (pb, vb)) in a.variables().iter().zip(b.variables()) {
        assert_eq!(pa, &pb);
        assert_eq!(va.to_vec::<f32>().unwrap(), vb.to_vec::<f32>().unwrap(), "{pa}");
    }
    let x = Tensor::rand(-1.0, 1.0, &[5, 3], 5, &Device::Cpu).unwrap();
    assert_eq!(a.predict(&x, 2).unwrap().to_vec::<f32>().unwrap(), b.predict(&x, 2).unwrap().to_vec::<f32>().unwrap());
    assert!(!dir.path().join("w.safetensors.tmp").exists(), "the temporary file is renamed away");
}

#[test]
fn every_mismatch_is_listed_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    trained(1).save_weights(&path).unwrap();
    let other = model(5); // a hidden layer of 5 units: both kernels and the first bias differ in shape
    other.build(&[3]).unwrap();
    let before: Vec<Vec<f32>> = other.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
    let err = other.load_weights(&path).unwrap_err().to_string();
    for want in [
        "sequential/dense/kernel",
        "[3, 4]",
        "[3, 5]",
        "sequential/dense/bias",
        "sequential/dense_1/kernel",
        "[4, 2]",
        "[5, 2]",
    ] {
        assert!(err.contains(want), "{want} missing from: {err}");
    }
    let after: Vec<Vec<f32>> = other.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
    assert_eq!(before, after, "a failed load changes nothing");

    // A file without one variable and with an extra one.
    let k = vec![0u8; 3 * 4 * 4];
    let raw =
        raw_safetensors(&[("sequential/dense/kernel", "F32", vec![3, 4], k), ("stray", "F32", vec![1], vec![0; 4])]);
    std::fs::write(&path, raw).unwrap();
    let err = model(4).tap_build().load_weights(&path).unwrap_err().to_string();
    assert!(
        err.contains("missing from the file: sequential/dense/bias") && err.contains("not in the model: stray"),
        "{err}"
    );
}

trait TapBuild {
    fn tap_build(self) -> Self;
}
impl TapBuild for Model {
    fn tap_build(self) -> Self {
        self.build(&[3]).unwrap();
        self
    }
}

#[test]
fn f16_and_bf16_files_load_as_f32() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("half.safetensors");
    let vals: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let f16: Vec<u8> = vals.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    let bf16: Vec<u8> = vals[..4].iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    let k2: Vec<u8> = vals[..8].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    let raw = raw_safetensors(&[
        ("sequential/dense/kernel", "F16", vec![3, 4], f16),
        ("sequential/dense/bias", "BF16", vec![4], bf16),
        ("sequential/dense_1/kernel", "F16", vec![4, 2], k2),
        ("sequential/dense_1/bias", "F32", vec![2], [0.5f32, -0.5].iter().flat_map(|v| v.to_le_bytes()).collect()),
    ]);
    std::fs::write(&path, raw).unwrap();
    let m = model(4).tap_build();
    m.load_weights(&path).unwrap();
    let vars = m.variables();
    assert_eq!(vars[0].1.to_vec::<f32>().unwrap(), vals); // these values are exact in f16
    assert_eq!(vars[1].1.to_vec::<f32>().unwrap(), vals[..4].to_vec());
    assert_eq!(vars[3].1.to_vec::<f32>().unwrap(), vec![0.5, -0.5]);
}

#[test]
fn a_truncated_file_is_an_err_and_a_failed_save_keeps_the_old_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let a = trained(1);
    a.save_weights(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &good[..good.len() - 10]).unwrap();
    let err = trained(2).load_weights(&cut).unwrap_err().to_string();
    assert!(err.contains("cut.safetensors"), "{err}");

    // Make the save fail: its temporary path is taken by a directory.
    std::fs::create_dir(dir.path().join("w.safetensors.tmp")).unwrap();
    assert!(trained(3).save_weights(&path).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), good, "the previous checkpoint is intact");
    let b = trained(4);
    b.load_weights(&path).unwrap();
}
