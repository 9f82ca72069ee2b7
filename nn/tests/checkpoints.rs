//! save_weights / load_weights: exact round trips, every mismatch reported, f16/bf16 files,
//! truncated files, and a failed save that leaves the previous checkpoint intact.

mod common;

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
    m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    let x = Tensor::rand(-1.0, 1.0, &[16, 3], seed, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 2], seed + 1, &Device::Cpu).unwrap();
    m.fit(&x, &y, FitOptions { epochs: 2, batch_size: 4, seed, verbose: false, ..Default::default() }).unwrap();
    m
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
    assert_eq!(temporaries(dir.path()), 0, "the temporary file is renamed away");
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
    let raw = common::raw_safetensors(&[
        ("sequential/dense/kernel", "F32", vec![3, 4], k),
        ("stray", "F32", vec![1], vec![0; 4]),
    ]);
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
    let raw = common::raw_safetensors(&[
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

    // Make a save fail at the rename: its target is a directory that holds a file. The
    // directory and its file are intact, and no temporary file is left behind.
    let target = dir.path().join("taken");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"keep").unwrap();
    assert!(trained(3).save_weights(&target).is_err());
    assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"keep");
    assert_eq!(temporaries(dir.path()), 0);
    assert_eq!(std::fs::read(&path).unwrap(), good, "the previous checkpoint is intact");
    let b = trained(4);
    b.load_weights(&path).unwrap();
}

fn temporaries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
        .count()
}

#[test]
fn a_flipped_bit_is_an_err_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    trained(1).save_weights(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    // Flip one bit in every position of the data section in turn (a sample of them).
    for at in (8 + header..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[at] ^= 1 << (at % 8);
        let flipped = dir.path().join("flipped.safetensors");
        std::fs::write(&flipped, &bad).unwrap();
        let m = model(4).tap_build();
        let before: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
        let err = m.load_weights(&flipped).unwrap_err().to_string();
        assert!(err.contains("checksum") && err.contains("sequential/dense"), "{err}");
        let after: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
        assert_eq!(before, after);
    }
}

#[test]
fn concurrent_saves_to_one_path_both_succeed_and_leave_a_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let (a, b) = (trained(1), trained(2));
    // What save_weights writes, saved from two threads at once (a Model is Send, not Sync).
    let (sa, sb) = (a.whole_state(false).unwrap(), b.whole_state(false).unwrap());
    std::thread::scope(|s| {
        let ha = s.spawn(|| (0..20).try_for_each(|_| weft_nn::checkpoint::save(&path, &sa)));
        let hb = s.spawn(|| (0..20).try_for_each(|_| weft_nn::checkpoint::save(&path, &sb)));
        ha.join().unwrap().unwrap();
        hb.join().unwrap().unwrap();
    });
    let m = model(4).tap_build();
    m.load_weights(&path).unwrap();
    let got: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
    let of = |x: &Model| -> Vec<Vec<f32>> { x.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect() };
    assert!(got == of(&a) || got == of(&b), "the file is one of the two saves");
    assert_eq!(temporaries(dir.path()), 0);
}

#[test]
fn an_impossible_step_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("ok.safetensors");
    let mut m = trained(1);
    m.save_checkpoint(&good).unwrap();
    let mut file = weft_nn::checkpoint::load(&good).unwrap();
    for bad in [3e9f32, -1.0, 2.5, f32::NAN] {
        file.insert("optimizer/iterations".into(), (vec![1], vec![bad]));
        let tensors: Vec<(String, Tensor)> = file
            .iter()
            .map(|(k, (shape, v))| (k.clone(), Tensor::from_slice(v, shape, &Device::Cpu).unwrap()))
            .collect();
        let path = dir.path().join("bad.safetensors");
        weft_nn::checkpoint::save(&path, &tensors).unwrap();
        let before = m.optimizer().unwrap().iterations();
        let err = m.load_checkpoint(&path).unwrap_err().to_string();
        assert!(err.contains("optimizer/iterations"), "{err}");
        assert_eq!(m.optimizer().unwrap().iterations(), before);
    }
}

#[test]
fn a_resumed_run_draws_the_dropout_masks_it_would_have_drawn() {
    use weft_nn::layers::Dropout;
    let net =
        || Sequential::new().add(Dense::new(8).activation(Activation::Relu)).add(Dropout::new(0.5)).add(Dense::new(2));
    let x = Tensor::rand(-1.0, 1.0, &[8, 3], 3, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[8, 2], 4, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let mut a = Model::new(net(), &Device::Cpu);
    a.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    for _ in 0..3 {
        a.train_on_batch(&x, &y).unwrap();
    }
    a.save_checkpoint(&path).unwrap();
    let mut b = Model::new(net(), &Device::Cpu);
    b.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    b.build(&[3]).unwrap();
    b.load_checkpoint(&path).unwrap();
    assert_eq!(b.step_counter(), 3);
    for _ in 0..2 {
        assert_eq!(a.train_on_batch(&x, &y).unwrap(), b.train_on_batch(&x, &y).unwrap());
    }
    for ((p, va), (_, vb)) in a.variables().iter().zip(b.variables()) {
        assert_eq!(va.to_vec::<f32>().unwrap(), vb.to_vec::<f32>().unwrap(), "{p}");
    }
}
