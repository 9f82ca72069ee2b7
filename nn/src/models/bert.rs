//! A BERT encoder built from weft's layers as a functional model, the importer that maps a
//! Hugging Face BERT checkpoint onto it, and its configuration read from `config.json`.
//!
//! The graph: word + token-type embeddings, learned positions, LayerNorm; the attention mask
//! attached to the sequence; `layers` post-norm transformer blocks (exact GELU); then, for a
//! sentence embedder (all-MiniLM-L6-v2), mean pooling over the real tokens and L2 normalisation.

use crate::import::{Importer, Transform};
use crate::layers::{
    Add, Embedding, GlobalAveragePooling1D, LayerNormalization, PositionEmbedding, TransformerBlock, UnitNormalization,
};
use crate::{Activation, Functional};
use std::path::Path;
use weft_core::{Error, Result};

/// The sizes of a BERT model (the fields of a Hugging Face `config.json` that matter here).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of every token vector.
    pub hidden_size: usize,
    /// Transformer blocks.
    pub num_hidden_layers: usize,
    /// Attention heads (hidden_size / heads each).
    pub num_attention_heads: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// Token types (segments).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
}

impl BertConfig {
    /// all-MiniLM-L6-v2's sizes (what its `config.json` holds), for planning and benchmarks
    /// without the files.
    pub fn all_minilm_l6_v2() -> Self {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 12,
            intermediate_size: 1536,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
        }
    }

    /// Read `config.json`; an `Err` names a missing field or an activation other than GELU.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Msg(format!("reading {}: {e}", path.display())))?;
        let j: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Msg(format!("{}: not JSON: {e}", path.display())))?;
        let n = |k: &str| {
            j[k].as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| Error::Msg(format!("{}: {k} is missing or not a whole number", path.display())))
        };
        if j["hidden_act"].as_str().is_some_and(|a| a != "gelu") {
            return Err(Error::Msg(format!(
                "{}: hidden_act {} is not supported (gelu is)",
                path.display(),
                j["hidden_act"]
            )));
        }
        let cfg = BertConfig {
            vocab_size: n("vocab_size")?,
            hidden_size: n("hidden_size")?,
            num_hidden_layers: n("num_hidden_layers")?,
            num_attention_heads: n("num_attention_heads")?,
            intermediate_size: n("intermediate_size")?,
            max_position_embeddings: n("max_position_embeddings")?,
            type_vocab_size: n("type_vocab_size")?,
            layer_norm_eps: j["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32,
        };
        if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
            return Err(Error::Msg(format!(
                "{}: hidden_size {} does not split into {} heads",
                path.display(),
                cfg.hidden_size,
                cfg.num_attention_heads
            )));
        }
        Ok(cfg)
    }
}

/// The encoder as a functional model named `name` with inputs `input_ids`, `attention_mask` and
/// `token_type_ids`; with `sentence_head`, mean pooling and L2 normalisation on top (output
/// `[batch, hidden]`), else the token vectors `[batch, time, hidden]`.
pub fn bert_encoder(name: &str, cfg: &BertConfig, sentence_head: bool) -> Result<Functional> {
    let mut g = Functional::new(name);
    let ids = g.input("input_ids");
    let keep = g.input("attention_mask");
    let types = g.input("token_type_ids");
    let words = g.apply(Embedding::new(cfg.vocab_size, cfg.hidden_size).named("word_embeddings"), &[ids]);
    let segs = g.apply(Embedding::new(cfg.type_vocab_size, cfg.hidden_size).named("token_type_embeddings"), &[types]);
    let h = g.apply(Add::new().named("embeddings_sum"), &[words, segs]);
    let h = g.apply(PositionEmbedding::new(cfg.max_position_embeddings).named("position_embeddings"), &[h]);
    let h = g.apply(LayerNormalization::new().epsilon(cfg.layer_norm_eps).named("embeddings_norm"), &[h]);
    let mut h = g.mask(h, keep);
    let heads = cfg.num_attention_heads;
    for i in 0..cfg.num_hidden_layers {
        let block = TransformerBlock::new(heads, cfg.hidden_size / heads, cfg.intermediate_size)
            .post_norm(true)
            .epsilon(cfg.layer_norm_eps)
            .activation(Activation::Gelu)
            .named(&format!("layer_{i}"));
        h = g.apply(block, &[h]);
    }
    if sentence_head {
        h = g.apply(GlobalAveragePooling1D::new().named("mean_pooling"), &[h]);
        h = g.apply(UnitNormalization::new().named("l2_normalize"), &[h]);
    }
    g.output(h)
}

/// The rules that load a Hugging Face BERT checkpoint (`BertModel`'s names, with or without a
/// `bert.` prefix) into [`bert_encoder`]`(name, ..)`: `Linear` weights transposed, query, key,
/// value and attention-output tensors reshaped into heads, `position_ids` and the pooler skipped.
pub fn bert_importer(name: &str) -> Importer {
    let mut imp = Importer::new().skip("**.position_ids").skip("pooler.**").skip("bert.pooler.**").reshape_to_fit(true);
    for prefix in ["", "bert."] {
        let r = |from: &str, to: &str| (format!("{prefix}{from}"), format!("{name}/{to}"));
        let rules = [
            r("embeddings.word_embeddings.weight", "word_embeddings/embeddings"),
            r("embeddings.position_embeddings.weight", "position_embeddings/embeddings"),
            r("embeddings.token_type_embeddings.weight", "token_type_embeddings/embeddings"),
            r("embeddings.LayerNorm.weight", "embeddings_norm/gamma"),
            r("embeddings.LayerNorm.bias", "embeddings_norm/beta"),
            r("encoder.layer.*.attention.self.*.weight", "layer_*/attention/*/kernel"),
            r("encoder.layer.*.attention.self.*.bias", "layer_*/attention/*/bias"),
            r("encoder.layer.*.attention.output.dense.weight", "layer_*/attention/attention_output/kernel"),
            r("encoder.layer.*.attention.output.dense.bias", "layer_*/attention/attention_output/bias"),
            r("encoder.layer.*.attention.output.LayerNorm.weight", "layer_*/ln_1/gamma"),
            r("encoder.layer.*.attention.output.LayerNorm.bias", "layer_*/ln_1/beta"),
            r("encoder.layer.*.intermediate.dense.weight", "layer_*/mlp/up/kernel"),
            r("encoder.layer.*.intermediate.dense.bias", "layer_*/mlp/up/bias"),
            r("encoder.layer.*.output.dense.weight", "layer_*/mlp/down/kernel"),
            r("encoder.layer.*.output.dense.bias", "layer_*/mlp/down/bias"),
            r("encoder.layer.*.output.LayerNorm.weight", "layer_*/ln_2/gamma"),
            r("encoder.layer.*.output.LayerNorm.bias", "layer_*/ln_2/beta"),
        ];
        for (from, to) in rules {
            imp = imp.rule(&from, &to);
        }
        // PyTorch's Linear stores [out, in]; weft's kernels are [in, out].
        imp = imp
            .transform(&format!("{prefix}encoder.layer.*.attention.self.*.weight"), Transform::Transpose)
            .transform(&format!("{prefix}encoder.layer.*.**.dense.weight"), Transform::Transpose);
    }
    imp
}
