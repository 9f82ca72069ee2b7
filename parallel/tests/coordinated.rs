//! The coordinated optimizer's agreements, on hand-made gradients: the global norm counts split
//! parts once each and replicated variables once, a non-finite gradient on one rank skips the
//! step everywhere, and the schedule advances together. Also the vocabulary-parallel loss
//! against the plain one, value and gradient.

use std::collections::HashSet;
use std::sync::Arc;
use weft_core::collectives::gather_from_parallel;
use weft_core::{Collectives, Device, GradStore, Result, Tensor, Var};
use weft_nn::optim::{LearningRate, Optimizer, Sgd};
use weft_nn::tp::vocab_parallel_cross_entropy;
use weft_parallel::{CoordinatedOptimizer, InHost};

/// Run `f` on `n` ranks of one in-host group; every rank must succeed.
fn on_ranks<T: Send>(n: usize, f: impl Fn(usize, Arc<dyn Collectives>) -> Result<T> + Sync) -> Vec<T> {
    InHost::run(n, |r, c| f(r, Arc::new(c.clone()))).into_iter().map(|o| o.unwrap()).collect()
}

/// Rank r holds split weight `w` (one entry) and replicated `b`; returns both after one step.
fn step(clip: f32, split_grads: [f32; 2], rep_grad: f32) -> Vec<(f32, f32, u64, u64)> {
    on_ranks(2, |r, comm| {
        let single = Arc::new(weft_core::SingleRank);
        let sgd = Sgd::new(LearningRate::Constant(1.0)).clip_global_norm(clip);
        let split: HashSet<String> = ["w".to_string()].into();
        let mut opt = CoordinatedOptimizer::new(Box::new(sgd), comm, single, split);
        let w = Var::new(Tensor::zeros(&[1], &Device::Cpu)?)?;
        let b = Var::new(Tensor::zeros(&[1], &Device::Cpu)?)?;
        let mut g = GradStore::default();
        g.insert(w.as_tensor(), Tensor::from_vec(vec![split_grads[r]], &[1], &Device::Cpu)?);
        g.insert(b.as_tensor(), Tensor::from_vec(vec![rep_grad], &[1], &Device::Cpu)?);
        opt.apply(&[("w".into(), w.clone()), ("b".into(), b.clone())], &g)?;
        Ok((w.to_vec::<f32>()?[0], b.to_vec::<f32>()?[0], opt.skipped_steps(), opt.iterations()))
    })
}

#[test]
fn the_global_norm_counts_split_parts_and_replicated_variables_once() {
    // |g|^2 = 3^2 + 4^2 (w, split over two ranks) + 12^2 (b, held by both) = 169: norm 13.
    // Clipping to 1.3 scales every gradient by 0.1 on both ranks.
    let out = step(1.3, [3.0, 4.0], 12.0);
    for (r, (w, b, skipped, it)) in out.into_iter().enumerate() {
        let want_w = -0.1 * [3.0, 4.0][r];
        assert!((w - want_w).abs() < 1e-6, "rank {r}: w = {w}, want {want_w}");
        assert!((b + 1.2).abs() < 1e-6, "rank {r}: b = {b}");
        assert_eq!((skipped, it), (0, 1));
    }
}

#[test]
fn a_non_finite_gradient_on_one_rank_skips_the_step_on_every_rank() {
    let out = step(100.0, [1.0, f32::NAN], 1.0);
    for (r, (w, b, skipped, it)) in out.into_iter().enumerate() {
        assert_eq!((w, b), (0.0, 0.0), "rank {r} changed its weights");
        assert_eq!((skipped, it), (1, 0), "rank {r}: the step must be skipped and not counted");
    }
}

#[test]
fn vocabulary_parallel_cross_entropy_equals_the_plain_one() {
    // 3 rows of 10 classes split 4, 3, 3; labels on every rank's part.
    let logits = Tensor::rand(-3.0, 3.0, &[3, 10], 7, &Device::Cpu).unwrap();
    let labels = Tensor::from_vec(vec![0u32, 5, 9], &[3], &Device::Cpu).unwrap();
    let full = Var::new(logits.clone()).unwrap();
    let want = Tensor::cross_entropy(full.as_tensor(), &labels).unwrap();
    let want_grad = want.backward().unwrap().get(full.as_tensor()).unwrap().to_vec::<f32>().unwrap();
    let want = want.to_scalar::<f32>().unwrap();
    let sizes = [4usize, 3, 3];
    let got = on_ranks(3, |r, comm| {
        let start: usize = sizes[..r].iter().sum();
        let part = Var::new(logits.narrow(1, start, sizes[r])?)?;
        let loss = vocab_parallel_cross_entropy(part.as_tensor(), &labels, &sizes, &comm)?;
        let g = loss.backward()?.get(part.as_tensor()).cloned().expect("a gradient");
        let g = gather_from_parallel(&g, comm.clone(), 1, &sizes)?;
        Ok((loss.to_scalar::<f32>()?, g.to_vec::<f32>()?))
    });
    for (loss, grad) in got {
        assert!((loss - want).abs() < 1e-5, "loss {loss}, want {want}");
        for (a, b) in grad.iter().zip(&want_grad) {
            assert!((a - b).abs() < 1e-6, "gradient {a}, want {b}");
        }
    }
}

#[test]
fn a_label_past_the_vocabulary_is_an_error_on_split_logits_too() {
    let logits = Tensor::zeros(&[2, 6], &Device::Cpu).unwrap();
    let labels = Tensor::from_vec(vec![1u32, 6], &[2], &Device::Cpu).unwrap();
    let errs: Vec<bool> = InHost::run(2, |r, c| {
        let comm: Arc<dyn Collectives> = Arc::new(c.clone());
        vocab_parallel_cross_entropy(&logits.narrow(1, 3 * r, 3)?, &labels, &[3, 3], &comm)?.to_scalar::<f32>()
    })
    .iter()
    .map(Result::is_err)
    .collect();
    assert!(errs.iter().all(|&e| e), "every rank must see the bad label: {errs:?}");
}
