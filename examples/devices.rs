//! Lists every adapter wgpu finds, with the limits and features weft uses, and which device
//! `Device::default()` picks. `cargo run --release --example devices`

use weft::prelude::*;

fn main() -> Result<()> {
    let all = devices();
    if all.is_empty() {
        println!("no GPU adapter found (install a GPU driver, or `apt-get install mesa-vulkan-drivers` for lavapipe)");
    }
    for a in &all {
        println!(
            "gpu:{}  {}  [{} / {}{}]",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            if a.is_software { ", software" } else { "" }
        );
        println!("        shader-f16: {}", a.shader_f16);
        println!("        largest storage binding: {} MiB", a.max_storage_binding >> 20);
        println!("        workgroups per dimension: {}", a.max_workgroups_per_dim);
        println!("        workgroup memory: {} KiB", a.max_workgroup_storage >> 10);
    }
    let dev = Device::default();
    println!("default device: {}", dev.describe());
    // A small computation on it, read back, to show the device works.
    let x = Tensor::arange(0.0, 6.0, 1.0, &dev)?.reshape(&[2, 3])?;
    let y = x.matmul(&x.t()?)?;
    println!("[[0,1,2],[3,4,5]] @ its transpose on {} = {:?}", dev.describe(), y.to_vec::<f32>()?);
    Ok(())
}
