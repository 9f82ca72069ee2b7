//! Recurrent layers in models: a padded batch behind an embedding's mask equals each sequence
//! run alone; a functional model of an embedding and an LSTM learns a task that needs memory;
//! bad input is an `Err` naming the layer. (Values against Keras are in keras_conformance.rs.)

use weft_core::{Device, Tensor};
use weft_nn::layers::{Dense, Embedding, GRU, LSTM, SimpleRNN};
use weft_nn::optim::Adam;
use weft_nn::{Activation, Ctx, FitOptions, Functional, Layer, Loss, Metric, Model};

/// ids -> embedding (mask_zero) -> the recurrent layer, its mask followed.
fn encode(emb: &Embedding, rnn: &dyn Layer, ids: &Tensor) -> Vec<f32> {
    let ctx = &mut Ctx::inference();
    let h = emb.call_with(std::slice::from_ref(ids), &[None], ctx).unwrap();
    let mask = emb.output_mask(std::slice::from_ref(ids), &[None], &h).unwrap();
    rnn.call_with(&[h], &[mask], ctx).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn a_padded_batch_equals_each_sequence_alone() {
    let emb = Embedding::new(20, 4).mask_zero(true);
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(SimpleRNN::new(3)),
        Box::new(GRU::new(3)),
        Box::new(LSTM::new(3)),
        Box::new(GRU::new(3).reset_after(false)),
    ];
    let seqs: [&[u32]; 3] = [&[5, 3, 9, 2, 7], &[4, 11], &[1, 2, 3]];
    let t = 5;
    let mut padded = Vec::new();
    for s in seqs {
        padded.extend_from_slice(s);
        padded.extend(std::iter::repeat_n(0, t - s.len()));
    }
    let padded = Tensor::from_vec(padded, &[3, t], &Device::Cpu).unwrap();
    for rnn in &layers {
        let batch = encode(&emb, rnn.as_ref(), &padded);
        for (i, s) in seqs.iter().enumerate() {
            let alone = encode(&emb, rnn.as_ref(), &Tensor::from_vec(s.to_vec(), &[1, s.len()], &Device::Cpu).unwrap());
            for (a, b) in alone.iter().zip(&batch[i * 3..(i + 1) * 3]) {
                assert!((a - b).abs() < 1e-5, "{}: sequence {i}: alone {alone:?}, padded {batch:?}", rnn.kind());
            }
        }
    }
}

/// Whether the first token comes back at the end: only a layer that carries state can tell.
#[test]
fn an_lstm_learns_to_remember_the_first_token() {
    let (n, t) = (256, 6);
    let ids = Tensor::rand(1.0, 4.999, &[n, t], 3, &Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    let ids: Vec<u32> = ids.iter().map(|v| *v as u32).collect();
    let labels: Vec<u32> = ids.chunks(t).map(|r| u32::from(r[0] == r[t - 1])).collect();
    let x = Tensor::from_vec(ids, &[n, t], &Device::Cpu).unwrap();
    let y = Tensor::from_vec(labels, &[n], &Device::Cpu).unwrap();
    let mut f = Functional::new("remember");
    let ids = f.input("ids");
    let h = f.apply(Embedding::new(5, 8), &[ids]);
    let h = f.apply(LSTM::new(16), &[h]);
    let out = f.apply(Dense::new(2), &[h]);
    let mut m = Model::new(f.output(out).unwrap(), &Device::Cpu);
    m.compile(Adam::new(0.02), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[Metric::Accuracy]).unwrap();
    let opts = FitOptions { epochs: 40, batch_size: 32, verbose: false, ..Default::default() };
    let h = m.fit(&x, &y, opts).unwrap();
    let acc = *h.metrics["accuracy"].last().unwrap();
    assert!(acc > 0.95, "accuracy {acc} (losses {:?})", h.loss);
}

#[test]
fn bad_input_is_an_err_naming_the_layer() {
    let ctx = &mut Ctx::inference();
    let lstm = LSTM::new(3).named("lstm");
    let e = lstm.call(&Tensor::ones(&[2, 3], &Device::Cpu).unwrap(), ctx).unwrap_err().to_string();
    assert!(e.contains("lstm") && e.contains("[2, 3]"), "{e}");
    lstm.call(&Tensor::ones(&[2, 4, 3], &Device::Cpu).unwrap(), ctx).unwrap();
    let e = lstm.call(&Tensor::ones(&[2, 4, 5], &Device::Cpu).unwrap(), ctx).unwrap_err().to_string();
    assert!(e.contains("lstm") && e.contains("[2, 4, 5]"), "{e}");
    let gru = GRU::new(2).named("gru");
    let x = Tensor::ones(&[2, 4, 3], &Device::Cpu).unwrap();
    let e = gru.call_with(&[x], &[Some(Tensor::ones(&[2, 3], &Device::Cpu).unwrap())], ctx).unwrap_err().to_string();
    assert!(e.contains("gru") && e.contains("mask"), "{e}");
}

/// Dropout on the inputs and the state acts only while training, draws the same masks for the
/// same step, and fresh ones the next.
#[test]
fn dropout_acts_while_training_only() {
    let x = Tensor::rand(-1.0, 1.0, &[4, 6, 3], 5, &Device::Cpu).unwrap();
    let lstm = LSTM::new(5).dropout(0.5).recurrent_dropout(0.5).return_sequences(true);
    let run = |ctx: &mut Ctx| lstm.call(&x, ctx).unwrap().to_vec::<f32>().unwrap();
    let inference = run(&mut Ctx::inference());
    assert_eq!(inference, run(&mut Ctx::inference()));
    let mut ctx = Ctx::training(3);
    let first = run(&mut ctx);
    assert_ne!(first, inference);
    assert_eq!(first, run(&mut ctx.clone()));
    ctx.step += 1;
    assert_ne!(first, run(&mut ctx));
    let e = LSTM::new(2).dropout(1.0).named("d").call(&x, &mut Ctx::training(0)).unwrap_err().to_string();
    assert!(e.contains("dropout") && e.contains("d:"), "{e}");
}

/// Bidirectional names its halves after the layer (`forward_encoder`), or its kind when it has
/// no name; an input of no steps is an `Err` naming the layer.
#[test]
fn bidirectional_names_and_empty_sequences() {
    use weft_nn::layers::Bidirectional;
    let ctx = &mut Ctx::inference();
    let x = Tensor::ones(&[2, 3, 4], &Device::Cpu).unwrap();
    let named = Bidirectional::new(GRU::new(2).named("encoder"));
    named.call(&x, ctx).unwrap();
    let paths: Vec<String> = named.variables().into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths[0], "forward_encoder/kernel");
    assert_eq!(paths[3], "backward_encoder/kernel");
    let e = Bidirectional::new(LSTM::new(2).return_sequences(true))
        .named("bi")
        .call(&Tensor::ones(&[2, 0, 4], &Device::Cpu).unwrap(), ctx)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bi/forward_lstm") && e.contains("[2, 0, 4]"), "{e}");
}

/// An LSTM step by step from tensor ops, with the layer's own variables and activations.
fn lstm_by_hand(layer: &dyn Layer, x: &Tensor, act: Activation, ract: Activation) -> Tensor {
    let vars: Vec<Tensor> = layer.variables().into_iter().map(|(_, v)| v.as_tensor().clone()).collect();
    let (kernel, recurrent, bias) = (&vars[0], &vars[1], &vars[2]);
    let (b, steps, u) = (x.dims()[0], x.dims()[1], recurrent.dims()[0]);
    let mut h = Tensor::zeros(&[b, u], x.device()).unwrap();
    let mut c = h.clone();
    for t in 0..steps {
        let xt = x.narrow(1, t, 1).unwrap().squeeze(1).unwrap();
        let z = xt.matmul(kernel).unwrap().add(bias).unwrap().add(&h.matmul(recurrent).unwrap()).unwrap();
        let gate = |k: usize, a: Activation| a.apply(&z.narrow(1, k * u, u).unwrap()).unwrap();
        let (i, f, g, o) = (gate(0, ract), gate(1, ract), gate(2, act), gate(3, ract));
        c = f.mul(&c).unwrap().add(&i.mul(&g).unwrap()).unwrap();
        h = o.mul(&act.apply(&c).unwrap()).unwrap();
    }
    h
}

/// A GRU (reset after) step by step from tensor ops, with the layer's own variables.
fn gru_by_hand(layer: &dyn Layer, x: &Tensor, act: Activation, ract: Activation) -> Tensor {
    let vars: Vec<Tensor> = layer.variables().into_iter().map(|(_, v)| v.as_tensor().clone()).collect();
    let (kernel, recurrent, bias) = (&vars[0], &vars[1], &vars[2]);
    let (b, steps, u) = (x.dims()[0], x.dims()[1], recurrent.dims()[0]);
    let (ib, rb) =
        (bias.narrow(0, 0, 1).unwrap().squeeze(0).unwrap(), bias.narrow(0, 1, 1).unwrap().squeeze(0).unwrap());
    let mut h = Tensor::zeros(&[b, u], x.device()).unwrap();
    for t in 0..steps {
        let xt = x.narrow(1, t, 1).unwrap().squeeze(1).unwrap().matmul(kernel).unwrap().add(&ib).unwrap();
        let hr = h.matmul(recurrent).unwrap().add(&rb).unwrap();
        let gate = |v: &Tensor, k: usize| v.narrow(1, k * u, u).unwrap();
        let z = ract.apply(&gate(&xt, 0).add(&gate(&hr, 0)).unwrap()).unwrap();
        let r = ract.apply(&gate(&xt, 1).add(&gate(&hr, 1)).unwrap()).unwrap();
        let hh = act.apply(&gate(&xt, 2).add(&r.mul(&gate(&hr, 2)).unwrap()).unwrap()).unwrap();
        h = hh.add(&z.mul(&h.sub(&hh).unwrap()).unwrap()).unwrap();
    }
    h
}

/// A layer's step-by-step definition: the layer (for its variables), the input, the activations.
type ByHand = fn(&dyn Layer, &Tensor, Activation, Activation) -> Tensor;

/// `layer` (made with these activations) against its step-by-step definition `by_hand`: outputs
/// and the input's gradient.
fn follows(make: impl Fn(Activation, Activation) -> Box<dyn Layer>, by_hand: ByHand) {
    let x0 = Tensor::rand(-1.0, 1.0, &[2, 4, 5], 3, &Device::Cpu).unwrap();
    for (act, ract) in [(Activation::Tanh, Activation::Sigmoid), (Activation::Relu, Activation::HardSigmoid)] {
        let layer = make(act, ract);
        let x = weft_core::Var::new(x0.clone()).unwrap();
        let y = layer.call(x.as_tensor(), &mut Ctx::inference()).unwrap();
        let x2 = weft_core::Var::new(x0.clone()).unwrap();
        let want = by_hand(layer.as_ref(), x2.as_tensor(), act, ract);
        let what = format!("{} {act:?}/{ract:?}", layer.kind());
        let (got, w) = (y.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        assert!(got.iter().zip(&w).all(|(a, b)| (a - b).abs() < 1e-5), "{what}: {got:?} vs {w:?}");
        let dx = y.sum_all().unwrap().backward().unwrap().get(&x).unwrap().to_vec::<f32>().unwrap();
        let dw = want.sum_all().unwrap().backward().unwrap().get(&x2).unwrap().to_vec::<f32>().unwrap();
        assert!(dx.iter().zip(&dw).all(|(a, b)| (a - b).abs() < 1e-5), "{what}: dx {dx:?} vs {dw:?}");
    }
}

/// An LSTM's and a GRU's one-op steps (Keras' default activations) and their tensor-op steps
/// (any others) follow the definition: the fused paths against an independent loop, and the
/// others keep a test of their own.
#[test]
fn recurrent_layers_follow_their_definition_with_any_activations() {
    follows(|a, r| Box::new(LSTM::new(3).activation(a).recurrent_activation(r)), lstm_by_hand);
    follows(|a, r| Box::new(GRU::new(3).activation(a).recurrent_activation(r)), gru_by_hand);
}
