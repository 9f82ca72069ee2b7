//! Errors that name what was wrong: dtypes in `Var::set`, devices that cannot be told apart,
//! device names that do not parse or name no adapter.

mod common;

use weft_core::{DType, Device, Tensor, Var};

#[test]
fn var_set_with_another_dtype_names_both_dtypes() {
    let v = Var::new(Tensor::zeros(&[2], &Device::Cpu).unwrap()).unwrap();
    let u = Tensor::from_vec(vec![1u32, 2], &[2], &Device::Cpu).unwrap();
    let err = v.set(&u).unwrap_err().to_string();
    assert!(err.contains("F32") && err.contains("U32"), "{err}");
    assert_eq!(v.dtype(), DType::F32);
}

#[test]
fn bad_device_names_are_errors_naming_them() {
    for bad in ["banana", "gpu:99", "gpu:x", "cuda"] {
        let err = Device::parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed")).to_string();
        assert!(err.contains(bad.trim_start_matches("gpu:")) || err.contains("99"), "{bad}: {err}");
    }
    assert!(matches!(Device::parse("cpu"), Ok(Device::Cpu)));
}

#[test]
fn two_devices_on_one_adapter_are_described_apart() {
    let Some(g) = common::gpu() else { return };
    let Device::Gpu(c) = &g else { unreachable!() };
    let other = Device::gpu(c.adapter_index()).unwrap();
    assert_ne!(g.describe(), other.describe());
    let a = Tensor::ones(&[2], &g).unwrap();
    let b = Tensor::ones(&[2], &other).unwrap();
    let err = a.add(&b).unwrap_err().to_string();
    assert!(err.contains(&g.describe()) && err.contains(&other.describe()), "{err}");
}
