//! With a single rayon thread the Cpu ops run their serial loops on the calling thread; the
//! results are the same bits as with several threads (the work is cut by the shapes, never by
//! the thread count).

use weft_core::conv::Padding;
use weft_core::optim_ops::AdamStep;
use weft_core::{Device, Tensor};

/// Ops large enough to take their parallel paths: elementwise over long rows and many short
/// rows, row ops, reductions with many outputs and with a few long runs, column sums, and a
/// transposing copy.
fn run_all() -> Vec<Vec<f32>> {
    let dev = Device::Cpu;
    let x = Tensor::rand(-2.0, 2.0, &[300, 1030], 1, &dev).unwrap();
    let row = Tensor::rand(-1.0, 1.0, &[1030], 2, &dev).unwrap();
    let col = Tensor::rand(-1.0, 1.0, &[300, 1], 3, &dev).unwrap();
    let gamma = Tensor::rand(0.5, 1.5, &[1030], 4, &dev).unwrap();
    let beta = Tensor::rand(-0.5, 0.5, &[1030], 5, &dev).unwrap();
    let long = Tensor::rand(-1.0, 1.0, &[1 << 20], 6, &dev).unwrap();
    // 64 outputs whose runs each span three reduction pieces (2^16 each).
    let wide = Tensor::rand(-1.0, 1.0, &[64, (1 << 17) + 77], 7, &dev).unwrap();
    // Convolution (im2col), its input gradient (col2im), pooling and its gradient, and Adam.
    let img = Tensor::rand(-1.0, 1.0, &[4, 20, 20, 8], 8, &dev).unwrap();
    let ker = weft_core::Var::new(Tensor::rand(-1.0, 1.0, &[3, 3, 8, 16], 9, &dev).unwrap()).unwrap();
    let imgv = weft_core::Var::new(img.clone()).unwrap();
    let conv = imgv.conv2d(&ker, [1, 1], [1, 1], Padding::Same).unwrap();
    let pooled = conv.max_pool2d([2, 2], [2, 2], Padding::Valid).unwrap();
    let grads = pooled.sum_all().unwrap().backward().unwrap();
    let w = Tensor::rand(-1.0, 1.0, &[1 << 17], 10, &dev).unwrap();
    let step = AdamStep { lr_t: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: 1.0 };
    let (w2, m2, v2) = w.adam_step(&long.narrow(0, 0, 1 << 17).unwrap(), &w, &w.abs().unwrap(), step).unwrap();
    let outs = [
        conv.detach(),
        pooled.detach(),
        grads.get(&imgv).unwrap().clone(),
        grads.get(&ker).unwrap().clone(),
        w2,
        m2,
        v2,
        x.exp().unwrap(),
        x.add(&row).unwrap().mul(&col).unwrap(),
        x.t().unwrap().gelu_erf().unwrap(),
        x.softmax(-1).unwrap(),
        x.log_softmax(-1).unwrap(),
        x.layer_norm(&gamma, &beta, 1e-5).unwrap(),
        x.sum(&[-1], false).unwrap(),
        x.max(&[-1], false).unwrap(),
        x.sum(&[0], false).unwrap(),
        x.t().unwrap().contiguous().unwrap(),
        long.sum_all().unwrap(),
        long.reshape(&[4, 1 << 18]).unwrap().sum(&[-1], false).unwrap(),
        wide.sum(&[-1], false).unwrap(),
    ];
    outs.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn one_thread_gives_the_bits_of_several() {
    let several = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap().install(run_all);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| {
        assert_eq!(rayon::current_num_threads(), 1);
        run_all()
    });
    for (i, (a, b)) in one.iter().zip(&several).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "op #{i} differs between one thread and three");
    }
}
