//! all-MiniLM-L6-v2 imported from its Hugging Face checkpoint and run as a weft functional model
//! matches a float64 numpy reference (`data/minilm/reference.json`, from
//! `scripts/minilm_reference.py`): cosine >= 0.99999 and max abs difference <= 1e-5 per sentence,
//! for 8 sentences of different lengths padded in one batch.

mod common;

use weft_core::Device;
use weft_nn::models::bert::{BertConfig, bert_encoder, bert_importer};
use weft_nn::tokenizer::WordPiece;
use weft_nn::{Inputs, Model};

fn embed(dir: &std::path::Path, device: &Device) -> (Vec<Vec<f32>>, Vec<Vec<f64>>) {
    let cfg = BertConfig::from_file(dir.join("config.json")).unwrap();
    let model = Model::new(bert_encoder("minilm", &cfg, true).unwrap(), device);
    let tok = WordPiece::from_file(dir.join("tokenizer.json")).unwrap();
    let fx = common::fixture("reference.json");
    let texts: Vec<&str> = fx["sentences"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    let batch = tok.encode_batch(&texts, device).unwrap();
    // The same ids as the reference's tokenizer, padded the same way.
    let want_ids: Vec<u32> = fx["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32))
        .collect();
    assert_eq!(batch.input_ids.to_vec::<u32>().unwrap(), want_ids);
    let x = Inputs::from([
        ("input_ids", batch.input_ids),
        ("attention_mask", batch.attention_mask),
        ("token_type_ids", batch.token_type_ids),
    ]);
    model.call(x.narrow(0, 1).unwrap()).unwrap(); // build the variables
    let report = bert_importer("minilm").load(dir.join("model.safetensors"), &model.variables()).unwrap();
    assert_eq!(report.skipped, ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"], "{report}");
    assert!(report.missing.is_empty() && report.unused.is_empty(), "{report}");
    let got = model.predict(&x, 8).unwrap();
    let rows = got.dims()[0];
    let got: Vec<Vec<f32>> = got.to_vec::<f32>().unwrap().chunks(got.dims()[1]).map(<[f32]>::to_vec).collect();
    let want: Vec<Vec<f64>> = fx["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
        .collect();
    assert_eq!(rows, want.len());
    (got, want)
}

fn check(got: &[Vec<f32>], want: &[Vec<f64>], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let dot: f64 = g.iter().zip(w).map(|(a, b)| *a as f64 * b).sum();
        let (ng, nw) =
            (g.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt(), w.iter().map(|b| b * b).sum::<f64>().sqrt());
        let cos = dot / (ng * nw);
        let max = g.iter().zip(w).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        eprintln!("{what}: sentence {i}: cosine {cos:.9}, max abs diff {max:.2e}");
        assert!(cos >= 0.99999 && max <= 1e-5, "{what}: sentence {i}: cosine {cos}, max abs diff {max}");
    }
}

#[test]
fn minilm_matches_the_numpy_reference_on_the_cpu() {
    let Some(dir) = common::minilm_dir() else { return };
    let (got, want) = embed(&dir, &Device::Cpu);
    check(&got, &want, "cpu");
}

#[test]
fn minilm_matches_the_numpy_reference_on_a_gpu() {
    let Some(dir) = common::minilm_dir() else { return };
    let dev = match Device::best_gpu() {
        Ok(d) => d,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI=true but no GPU adapter: {e}"),
        Err(e) => return eprintln!("note: skipping, no GPU adapter: {e}"),
    };
    let (got, want) = embed(&dir, &dev);
    check(&got, &want, "gpu");
}

#[test]
fn the_built_in_minilm_sizes_are_its_config_file() {
    let Some(dir) = common::minilm_dir() else { return };
    assert_eq!(BertConfig::from_file(dir.join("config.json")).unwrap(), BertConfig::all_minilm_l6_v2());
}
