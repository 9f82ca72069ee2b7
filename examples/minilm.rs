//! Sentence embeddings with all-MiniLM-L6-v2, imported from its Hugging Face checkpoint.
//!
//! ```sh
//! bash scripts/fetch_minilm.sh            # puts the model in target/models/all-MiniLM-L6-v2
//! cargo run --release --example minilm -- --model target/models/all-MiniLM-L6-v2 \
//!     [--devices N] [--gpu] [--out FILE.json] [SENTENCE...]
//! ```
//!
//! Tokenizes the sentences (WordPiece, padded into one batch), builds the BERT encoder as a
//! functional model, imports the checkpoint with the name-mapping rules of
//! `weft::nn::models::bert`, prints the import report and a cosine-similarity table, and with
//! `--out` writes `{"sentences": [...], "embeddings": [[...]]}`. With `--devices N` the encoder
//! runs as a `ShardedModel` over N devices (Cpu devices, or virtual devices on the GPU adapter
//! with `--gpu`) and the plan is printed first: word embeddings split by vocabulary, attention
//! by heads, the MLP column then row.

use weft::nn::models::bert::{BertConfig, bert_encoder, bert_importer};
use weft::nn::tokenizer::WordPiece;
use weft::nn::{Inputs, Model};
use weft::parallel::{AutoConfig, DeviceMesh, PlanInput, ShardedModel};
use weft::prelude::*;

const DEFAULT: [&str; 5] = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "The cat sits outside",
    "A man is playing guitar.",
];

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut model_dir, mut out, mut gpu, mut devices, mut sentences) = (None, None, false, 1usize, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => model_dir = args.next(),
            "--out" => out = args.next(),
            "--gpu" => gpu = true,
            "--devices" => {
                devices = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| Error::Msg("--devices takes a number of devices, at least 1".into()))?;
            }
            _ => sentences.push(a),
        }
    }
    let dir = std::path::PathBuf::from(model_dir.unwrap_or_else(|| "target/models/all-MiniLM-L6-v2".into()));
    if sentences.is_empty() {
        sentences = DEFAULT.iter().map(|s| s.to_string()).collect();
    }
    let device = if gpu { Device::best_gpu()? } else { Device::Cpu };
    println!("device: {}", device.describe());

    let cfg = BertConfig::from_file(dir.join("config.json"))?;
    let tok = WordPiece::from_file(dir.join("tokenizer.json"))?;
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let batch = tok.encode_batch(&texts, &device)?;
    let x = Inputs::from([
        ("input_ids", batch.input_ids),
        ("attention_mask", batch.attention_mask),
        ("token_type_ids", batch.token_type_ids),
    ]);
    let model = Model::new(bert_encoder("minilm", &cfg, true)?, &device);
    model.call(&x.narrow(0, 1)?)?; // build the variables before importing into them
    let report = bert_importer("minilm").load(dir.join("model.safetensors"), &model.variables())?;
    println!(
        "imported {} tensors ({} skipped, {} missing, {} unused)",
        report.mapped.len(),
        report.skipped.len(),
        report.missing.len(),
        report.unused.len()
    );

    let start = std::time::Instant::now();
    let emb = if devices > 1 {
        let mesh = if gpu { DeviceMesh::virtual_gpus(devices)? } else { DeviceMesh::cpus(devices)? };
        let t = x.get("input_ids").map_or(0, |t| t.dims()[1]);
        let specs = [
            PlanInput::new("input_ids", &[texts.len(), t], DType::U32),
            PlanInput::new("attention_mask", &[texts.len(), t], DType::F32),
            PlanInput::new("token_type_ids", &[texts.len(), t], DType::U32),
        ];
        let net = || bert_encoder("minilm", &cfg, true);
        let mut sharded =
            ShardedModel::auto_inputs(|| net().expect("built once above"), &mesh, &specs, &AutoConfig::new())?;
        println!("\n{}", sharded.plan());
        // The imported weights, whole, handed to the ranks: each keeps its part.
        sharded.set_state(&model.whole_state(false)?)?;
        sharded.predict(&x, 32)?
    } else {
        model.predict(&x, 32)?
    };
    println!("embedded {} sentences in {:.1} ms", texts.len(), start.elapsed().as_secs_f64() * 1e3);
    let width = emb.dims()[1];
    let rows: Vec<Vec<f32>> = emb.to_vec::<f32>()?.chunks(width).map(<[f32]>::to_vec).collect();

    println!("\ncosine similarity");
    for (i, a) in rows.iter().enumerate() {
        let line: Vec<String> =
            rows.iter().map(|b| format!("{:6.3}", a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>())).collect();
        println!("{} [{i}] {}", line.join(" "), texts[i]);
    }
    if let Some(path) = out {
        let json = serde_json_like(&texts, &rows);
        std::fs::write(&path, json).map_err(|e| Error::Msg(format!("writing {path}: {e}")))?;
        println!("\nwrote {path}");
    }
    Ok(())
}

/// `{"sentences": [...], "embeddings": [[...]]}` (written by hand: the example needs no JSON crate).
fn serde_json_like(texts: &[&str], rows: &[Vec<f32>]) -> String {
    let quote = |s: &str| {
        let mut q = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => q += "\\\"",
                '\\' => q += "\\\\",
                c if (c as u32) < 0x20 => q += &format!("\\u{:04x}", c as u32),
                c => q.push(c),
            }
        }
        q + "\""
    };
    let sentences: Vec<String> = texts.iter().map(|t| quote(t)).collect();
    let emb: Vec<String> = rows
        .iter()
        .map(|r| format!("[{}]", r.iter().map(|v| format!("{v:e}")).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("{{\"sentences\": [{}], \"embeddings\": [\n{}\n]}}\n", sentences.join(", "), emb.join(",\n"))
}
