//! Masks: padding masks flow from an embedding through attention to pooling, so a padded batch
//! equals each sequence run alone; cross-attention; causal and padding masks combined.

use weft_core::{Device, Tensor};
use weft_nn::layers::{AttentionMasks, Embedding, GlobalAveragePooling1D, MultiHeadAttention, UnitNormalization};
use weft_nn::{Ctx, Layer};

/// ids `[b, t]` (0 = padding) -> embedding (mask_zero) -> self-attention -> masked mean -> unit length.
fn encode(emb: &Embedding, mha: &MultiHeadAttention, ids: &Tensor) -> Tensor {
    let ctx = &mut Ctx::inference();
    let h = emb.call_with(std::slice::from_ref(ids), &[None], ctx).unwrap();
    let mask = emb.output_mask(std::slice::from_ref(ids), &[None], &h).unwrap();
    let a = mha.call_with(std::slice::from_ref(&h), std::slice::from_ref(&mask), ctx).unwrap();
    let had = mask.is_some();
    let mask = mha.output_mask(&[h], &[mask], &a).unwrap();
    assert_eq!(mask.is_some(), had, "attention passes the query's mask on");
    let pooled = GlobalAveragePooling1D::new().call_with(&[a], &[mask], ctx).unwrap();
    UnitNormalization::new().call(&pooled, ctx).unwrap()
}

#[test]
fn a_padded_batch_equals_each_sequence_alone() {
    let emb = Embedding::new(20, 8).mask_zero(true);
    let mha = MultiHeadAttention::new(2, 4);
    let seqs: [&[u32]; 3] = [&[5, 3, 9, 2, 7], &[4, 11], &[1, 2, 3]];
    let t = 5;
    let mut padded = Vec::new();
    for s in seqs {
        padded.extend_from_slice(s);
        padded.extend(std::iter::repeat_n(0, t - s.len()));
    }
    let batch = encode(&emb, &mha, &Tensor::from_vec(padded, &[3, t], &Device::Cpu).unwrap());
    let batch = batch.to_vec::<f32>().unwrap();
    for (i, s) in seqs.iter().enumerate() {
        let alone = encode(&emb, &mha, &Tensor::from_vec(s.to_vec(), &[1, s.len()], &Device::Cpu).unwrap());
        let alone = alone.to_vec::<f32>().unwrap();
        for (j, (a, b)) in alone.iter().zip(&batch[i * 8..(i + 1) * 8]).enumerate() {
            assert!((a - b).abs() < 1e-5, "sequence {i}, feature {j}: alone {a}, padded {b}");
        }
    }
    // Without the mask the padded sequences come out different: the check above can fail.
    let unmasked = Embedding::new(20, 8);
    let ctx = &mut Ctx::inference();
    let ids = Tensor::from_vec(vec![4u32, 11, 0, 0, 0], &[1, 5], &Device::Cpu).unwrap();
    let h = unmasked.call(&ids, ctx).unwrap();
    let pooled = GlobalAveragePooling1D::new().call(&mha.call(&h, ctx).unwrap(), ctx).unwrap();
    let alone = encode(&unmasked, &mha, &Tensor::from_vec(vec![4u32, 11], &[1, 2], &Device::Cpu).unwrap());
    let pooled = UnitNormalization::new().call(&pooled, ctx).unwrap().to_vec::<f32>().unwrap();
    let diff = pooled.iter().zip(alone.to_vec::<f32>().unwrap()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff > 1e-3, "padding without a mask should change the result ({diff})");
}

#[test]
fn cross_attention_matches_the_formula_and_ignores_masked_values() {
    let mha = MultiHeadAttention::new(1, 3).use_bias(false);
    let ctx = &mut Ctx::inference();
    let q = Tensor::rand(-1.0, 1.0, &[2, 4, 5], 1, &Device::Cpu).unwrap();
    let v = Tensor::rand(-1.0, 1.0, &[2, 3, 6], 2, &Device::Cpu).unwrap();
    let keep = Tensor::from_vec(vec![1f32, 1., 0., 1., 0., 1.], &[2, 3], &Device::Cpu).unwrap();
    let masks = AttentionMasks { attention: Some(&keep), ..Default::default() };
    let (out, probs) = mha.attend(&q, &v, None, masks, ctx).unwrap();
    assert_eq!(out.dims(), &[2, 4, 5]);
    let p = probs.to_vec::<f32>().unwrap(); // [2, 1, 4, 3]
    for b in 0..2 {
        for i in 0..4 {
            let row = &p[(b * 4 + i) * 3..(b * 4 + i + 1) * 3];
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            let masked = if b == 0 { 2 } else { 1 };
            assert!(row[masked] < 1e-7, "batch {b}, query {i}: {row:?}");
        }
    }
    // The formula, by hand: softmax(q Wq (v Wk)^T / sqrt(3), masked) v Wv Wo.
    let w: Vec<Tensor> = mha.variables().into_iter().map(|(_, v)| v.as_tensor().clone()).collect();
    let (wq, wk, wv, wo) = (
        w[0].reshape(&[5, 3]).unwrap(),
        w[1].reshape(&[6, 3]).unwrap(),
        w[2].reshape(&[6, 3]).unwrap(),
        w[3].reshape(&[3, 5]).unwrap(),
    );
    let qh = q.matmul(&wq).unwrap().mul_scalar(1.0 / 3f32.sqrt()).unwrap();
    let kh = v.matmul(&wk).unwrap();
    let s = qh.matmul(&kh.transpose(1, 2).unwrap()).unwrap();
    let neg = keep.cmp_scalar(weft_core::ops::BinaryOp::Eq, 0.0).unwrap().unsqueeze(1).unwrap();
    let s = s.masked_fill(&neg, -1e9).unwrap().softmax(-1).unwrap();
    let want = s.matmul(&v.matmul(&wv).unwrap()).unwrap().matmul(&wo).unwrap();
    for (a, b) in out.to_vec::<f32>().unwrap().iter().zip(want.to_vec::<f32>().unwrap()) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn causal_and_padding_masks_combine() {
    let mha = MultiHeadAttention::new(2, 2).causal(true);
    let x = Tensor::rand(-1.0, 1.0, &[1, 4, 4], 3, &Device::Cpu).unwrap();
    let keep = Tensor::from_vec(vec![1f32, 0., 1., 1.], &[1, 4], &Device::Cpu).unwrap();
    let masks = AttentionMasks { value: Some(&keep), ..Default::default() };
    let (_, probs) = mha.attend(&x, &x, None, masks, &mut Ctx::inference()).unwrap();
    let p = probs.to_vec::<f32>().unwrap();
    for h in 0..2 {
        for i in 0..4 {
            for j in 0..4 {
                let v = p[(h * 4 + i) * 4 + j];
                if j > i || j == 1 {
                    assert!(v < 1e-7, "head {h}, query {i} sees key {j}: {v}");
                }
            }
        }
    }
}

#[test]
fn a_mask_of_the_wrong_shape_is_an_err_naming_the_layer() {
    let mha = MultiHeadAttention::new(2, 2).named("attn");
    let x = Tensor::rand(-1.0, 1.0, &[2, 4, 4], 3, &Device::Cpu).unwrap();
    let keep = Tensor::ones(&[2, 5], &Device::Cpu).unwrap();
    let masks = AttentionMasks { attention: Some(&keep), ..Default::default() };
    let err = mha.attend(&x, &x, None, masks, &mut Ctx::inference()).unwrap_err().to_string();
    assert!(err.contains("attn") && err.contains("[2, 5]"), "{err}");
}

#[test]
fn concatenate_keeps_a_position_any_input_keeps_as_keras_does() {
    use weft_nn::layers::Concatenate;
    let a = Tensor::ones(&[1, 3, 2], &Device::Cpu).unwrap();
    let b = Tensor::ones(&[1, 3, 4], &Device::Cpu).unwrap();
    let keep = Tensor::from_vec(vec![1f32, 0., 1.], &[1, 3], &Device::Cpu).unwrap();
    let cat = Concatenate::new(-1);
    let out = cat.call_with(&[a.clone(), b.clone()], &[Some(keep.clone()), None], &mut Ctx::inference()).unwrap();
    // Along the features an unmasked input keeps every step.
    let m = cat.output_mask(&[a.clone(), b.clone()], &[Some(keep.clone()), None], &out).unwrap().unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), vec![1., 1., 1.]);
    // Along time the masks join.
    let t = Concatenate::new(1);
    let out = t.call_with(&[a.clone(), a.clone()], &[Some(keep.clone()), None], &mut Ctx::inference()).unwrap();
    let m = t.output_mask(&[a.clone(), a], &[Some(keep), None], &out).unwrap().unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), vec![1., 0., 1., 1., 1., 1.]);
}

/// Masks of ones mask nothing: the output and the scores are those without a mask, bit for bit,
/// and on the Cpu the scores are not filled at all (no `where` op recorded); a single 0 is.
#[test]
fn masks_of_ones_change_nothing_and_fill_nothing() {
    let dev = Device::Cpu;
    let mha = MultiHeadAttention::new(2, 4);
    let x = Tensor::rand(-1.0, 1.0, &[2, 5, 8], 4, &dev).unwrap();
    let bits = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let run = |masks: AttentionMasks<'_>| {
        let ((out, probs), nodes) =
            weft_core::trace::trace(|| mha.attend(&x, &x, None, masks, &mut Ctx::inference())).unwrap();
        (bits(&out), bits(&probs), nodes.iter().any(|n| n.kind.starts_with("where")))
    };
    let plain = run(AttentionMasks::default());
    let (ones, full) = (Tensor::ones(&[2, 5], &dev).unwrap(), Tensor::ones(&[2, 5, 5], &dev).unwrap());
    let padding = AttentionMasks { query: Some(&ones), value: Some(&ones), ..Default::default() };
    let attention = AttentionMasks { attention: Some(&full), ..Default::default() };
    for (what, masks) in [("padding", padding), ("attention", attention)] {
        let (out, probs, filled) = run(masks);
        assert_eq!(out, plain.0, "{what}: output");
        assert_eq!(probs, plain.1, "{what}: scores");
        assert!(!filled, "{what}: masks of ones filled the scores");
    }
    let mut keep = vec![1f32; 10];
    keep[3] = 0.0;
    let one_zero = Tensor::from_vec(keep, &[2, 5], &dev).unwrap();
    let zero = run(AttentionMasks { value: Some(&one_zero), ..Default::default() });
    assert!(zero.2 && zero.1 != plain.1, "a mask with a 0 left unapplied");
    // Beside a mask with a 0, a mask of ones changes nothing either.
    let both = run(AttentionMasks { query: Some(&ones), value: Some(&one_zero), ..Default::default() });
    assert_eq!((both.0, both.1), (zero.0, zero.1), "a mask of ones beside one with a 0");
    // The causal mask is applied whatever the others hold.
    let causal = MultiHeadAttention::new(2, 4).causal(true);
    let run_causal = |masks: AttentionMasks<'_>| {
        let (out, probs) = causal.attend(&x, &x, None, masks, &mut Ctx::inference()).unwrap();
        (bits(&out), bits(&probs))
    };
    let alone = run_causal(AttentionMasks::default());
    let padding = AttentionMasks { query: Some(&ones), value: Some(&ones), ..Default::default() };
    assert_eq!(run_causal(padding), alone, "causal with masks of ones");
    // probs [2, 2, 5, 5]: no query sees a later key.
    let p: Vec<f32> = alone.1.iter().map(|b| f32::from_bits(*b)).collect();
    assert!(
        p.chunks(5).enumerate().all(|(r, row)| row[r % 5 + 1..].iter().all(|v| *v < 1e-7)),
        "the causal mask left unapplied"
    );
}
