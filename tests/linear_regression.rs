//! End to end through the `weft` crate: fit y = 3x - 2 by gradient descent with autograd, on the
//! Cpu and on a GPU (lavapipe in CI), and check both learn the line and agree with each other.

use weft::prelude::*;

fn fit(dev: &Device) -> Result<(f32, f32, f32)> {
    let x = Tensor::rand(-1.0, 1.0, &[64, 1], 1, dev)?;
    let y = x.affine(3.0, -2.0)?;
    let w = Var::new(Tensor::zeros(&[1, 1], dev)?)?;
    let b = Var::new(Tensor::zeros(&[1], dev)?)?;
    let mut loss = f32::INFINITY;
    for _ in 0..200 {
        let pred = x.matmul(&w)?.add(&b)?;
        let l = pred.sub(&y)?.square()?.mean_all()?;
        let grads = l.backward()?;
        no_grad(|| -> Result<()> {
            for v in [&w, &b] {
                let g = grads.get(v).expect("every variable gets a gradient");
                v.set(&v.as_tensor().sub(&g.mul_scalar(0.3)?)?)?;
            }
            Ok(())
        })?;
        loss = l.to_scalar::<f32>()?;
    }
    Ok((w.to_vec::<f32>()?[0], b.to_vec::<f32>()?[0], loss))
}

#[test]
fn a_line_is_learned_on_every_device() {
    let (w, b, loss) = fit(&Device::Cpu).unwrap();
    assert!((w - 3.0).abs() < 1e-3 && (b + 2.0).abs() < 1e-3 && loss < 1e-6, "cpu: w {w} b {b} loss {loss}");
    let gpu = match Device::best_gpu() {
        Ok(d) => d,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("note: skipping the GPU half, no adapter: {e}");
            return;
        }
        Err(e) => panic!("CI=true but no GPU adapter: {e}"),
    };
    let (wg, bg, _) = fit(&gpu).unwrap();
    assert!((wg - w).abs() < 1e-4 && (bg - b).abs() < 1e-4, "gpu {wg} {bg} vs cpu {w} {b}");
}
