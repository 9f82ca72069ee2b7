//! all-MiniLM-L6-v2 split over several devices: the plan (word embeddings by vocabulary, attention
//! by heads, the MLP column then row), embeddings equal to the numpy reference over 2 and 3 Cpu
//! devices, and fine-tuning with a classification head equal to one device.

use std::path::PathBuf;
use weft_core::{DType, Device, Tensor};
use weft_nn::layers::Dense;
use weft_nn::models::bert::{BertConfig, bert_encoder, bert_importer};
use weft_nn::optim::AdamW;
use weft_nn::tokenizer::WordPiece;
use weft_nn::{Functional, Inputs, Loss, Model};
use weft_parallel::{AutoConfig, DeviceMesh, PlanInput, ShardedModel};

fn minilm() -> BertConfig {
    BertConfig::all_minilm_l6_v2()
}

fn specs(batch: usize, t: usize) -> Vec<PlanInput> {
    vec![
        PlanInput::new("input_ids", &[batch, t], DType::U32),
        PlanInput::new("attention_mask", &[batch, t], DType::F32),
        PlanInput::new("token_type_ids", &[batch, t], DType::U32),
    ]
}

/// The model files, as in nn's tests: `None` with a note off CI, a failure under `CI=true`.
fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("WEFT_MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/models/all-MiniLM-L6-v2"));
    if dir.join("model.safetensors").exists() {
        return Some(dir);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true but all-MiniLM-L6-v2 is not in {} (run scripts/fetch_minilm.sh)", dir.display());
    }
    eprintln!("note: skipping, all-MiniLM-L6-v2 not found in {}", dir.display());
    None
}

fn fixture() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/minilm/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The reference sentences as a batch, and a one-device model with the checkpoint imported.
fn batch_and_model(dir: &std::path::Path) -> (Inputs, Model, Vec<Vec<f64>>) {
    let fx = fixture();
    let texts: Vec<&str> = fx["sentences"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    let tok = WordPiece::from_file(dir.join("tokenizer.json")).unwrap();
    let b = tok.encode_batch(&texts, &Device::Cpu).unwrap();
    let x = Inputs::from([
        ("input_ids", b.input_ids),
        ("attention_mask", b.attention_mask),
        ("token_type_ids", b.token_type_ids),
    ]);
    let one = Model::new(bert_encoder("minilm", &minilm(), true).unwrap(), &Device::Cpu);
    one.call(x.narrow(0, 1).unwrap()).unwrap();
    bert_importer("minilm").load(dir.join("model.safetensors"), &one.variables()).unwrap();
    let want = fx["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
        .collect();
    (x, one, want)
}

#[test]
fn the_minilm_plan_splits_vocabulary_heads_and_mlp() {
    let net = bert_encoder("minilm", &minilm(), true).unwrap();
    let plan = AutoConfig::new().plan_inputs(&net, &specs(8, 32), 3, 1).unwrap();
    let style = |path: &str| plan.layers.iter().find(|l| l.path == path).map(|l| l.style.name().to_string());
    assert_eq!(style("minilm/word_embeddings").as_deref(), Some("vocab"));
    let heads = plan.layers.iter().find(|l| l.path == "minilm/layer_0/attention/query").unwrap();
    assert_eq!(format!("{:?}", heads.style), "Column { sizes: [4, 4, 4], gather: false }");
    assert_eq!(style("minilm/layer_0/attention/attention_output").as_deref(), Some("row"));
    assert_eq!(style("minilm/layer_5/mlp/up").as_deref(), Some("column"));
    assert_eq!(style("minilm/layer_5/mlp/down").as_deref(), Some("row"));
    insta::assert_snapshot!("minilm_plan_3_devices", plan.to_string());
}

#[test]
fn minilm_split_over_2_and_3_devices_matches_the_reference() {
    let Some(dir) = model_dir() else { return };
    let (x, one, want) = batch_and_model(&dir);
    let state = one.whole_state(false).unwrap();
    let t = x.get("input_ids").unwrap().dims()[1];
    for n in [2, 3] {
        let net = || bert_encoder("minilm", &minilm(), true).unwrap();
        let mut sharded =
            ShardedModel::auto_inputs(net, &DeviceMesh::cpus(n).unwrap(), &specs(8, t), &AutoConfig::new()).unwrap();
        sharded.set_state(&state).unwrap();
        let got = sharded.predict(&x, 8).unwrap();
        let got: Vec<f32> = got.to_vec().unwrap();
        for (i, w) in want.iter().enumerate() {
            let g = &got[i * 384..(i + 1) * 384];
            let dot: f64 = g.iter().zip(w).map(|(a, b)| *a as f64 * b).sum();
            let norm = g.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
            let max = g.iter().zip(w).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
            eprintln!("{n} devices: sentence {i}: cosine {:.9}, max abs diff {max:.2e}", dot / norm);
            assert!(dot / norm >= 0.99999 && max <= 1e-5, "{n} devices, sentence {i}: {max}");
        }
    }
}

/// The encoder's token vectors, mean-pooled, then a 3-way classifier.
fn classifier() -> Functional {
    // The encoder is itself a functional model: it nests like any layer.
    let mut f = Functional::new("classifier");
    let ids = f.input("input_ids");
    let keep = f.input("attention_mask");
    let types = f.input("token_type_ids");
    let enc = f.apply(bert_encoder("minilm", &minilm(), true).unwrap(), &[ids, keep, types]);
    let out = f.apply(Dense::new(3).named("head"), &[enc]);
    f.output(out).unwrap()
}

#[test]
fn fine_tuning_minilm_split_over_2_and_3_devices_equals_one_device() {
    let Some(dir) = model_dir() else { return };
    let (x, _, _) = batch_and_model(&dir);
    let t = x.get("input_ids").unwrap().dims()[1];
    let one = Model::new(classifier(), &Device::Cpu);
    one.call(x.narrow(0, 1).unwrap()).unwrap();
    let enc: Vec<(String, weft_core::Var)> = one
        .variables()
        .into_iter()
        .filter_map(|(p, v)| p.strip_prefix("classifier/").map(|q| (q.to_string(), v)))
        .filter(|(p, _)| p.starts_with("minilm/"))
        .collect();
    bert_importer("minilm").load(dir.join("model.safetensors"), &enc).unwrap();
    let start = one.whole_state(false).unwrap();
    let labels = Tensor::from_vec(vec![0f32, 0., 1., 2., 0., 1., 2., 1.], &[8], &Device::Cpu).unwrap();
    let opt = || AdamW::new(2e-4);
    let loss = Loss::SparseCategoricalCrossentropy { from_logits: true };
    // Fresh batches each step: rotations of the 8 sentences, 4 at a time.
    let batch = |s: usize| -> (Inputs, Tensor) {
        let ids: Vec<u32> = (0..4).map(|i| ((s * 3 + i) % 8) as u32).collect();
        let sel = Tensor::from_vec(ids, &[4], &Device::Cpu).unwrap();
        (x.index_select(&sel).unwrap(), labels.index_select(&sel, 0).unwrap())
    };
    let mut reference = Model::new(classifier(), &Device::Cpu);
    reference.compile(opt(), loss.clone(), &[]).unwrap();
    reference.call(x.narrow(0, 1).unwrap()).unwrap();
    for ((_, v), (_, w)) in reference.variables().iter().zip(&start) {
        v.set(w).unwrap();
    }
    let steps = 20;
    let want: Vec<f32> = (0..steps)
        .map(|s| {
            let (bx, by) = batch(s);
            reference.train_on_batch(bx, &by).unwrap()
        })
        .collect();
    let want_state = reference.whole_state(false).unwrap();
    for n in [2, 3] {
        let mut sharded =
            ShardedModel::auto_inputs(classifier, &DeviceMesh::cpus(n).unwrap(), &specs(4, t), &AutoConfig::new())
                .unwrap();
        sharded.set_state(&start).unwrap();
        sharded.compile(opt(), loss.clone(), &[]).unwrap();
        for (s, w) in want.iter().enumerate() {
            let (bx, by) = batch(s);
            let l = sharded.train_on_batch(bx, &by).unwrap();
            assert!((l - w).abs() <= 1e-4 * w.abs().max(1.0), "{n} devices, step {s}: loss {l} vs {w}");
        }
        let got = sharded.full_state().unwrap();
        let mut worst = (0f32, String::new());
        for (p, w) in &want_state {
            if p.ends_with("attention/key/bias") {
                // Softmax ignores a key bias: its true gradient is 0 and AdamW turns rounding
                // noise into steps of up to lr each (verify calls these zero_gradient). Bounded
                // by what 20 such steps can add up to.
                let (g, w) =
                    (got.iter().find(|(q, _)| q == p).unwrap().1.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
                let d = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(d <= steps as f32 * 2e-4, "{n} devices: {p} moved {d} apart");
                continue;
            }
            let g =
                got.iter().find(|(q, _)| q == p).unwrap_or_else(|| panic!("{p} missing")).1.to_vec::<f32>().unwrap();
            let w = w.to_vec::<f32>().unwrap();
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            let d = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / scale;
            if d > worst.0 {
                worst = (d, p.clone());
            }
        }
        eprintln!("{n} devices: worst weight difference {:.2e} ({})", worst.0, worst.1);
        assert!(worst.0 < 1e-4, "{n} devices: {} differs by {:.2e} of its largest value", worst.1, worst.0);
    }
}
