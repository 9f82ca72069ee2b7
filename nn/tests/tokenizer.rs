//! The WordPiece tokenizer against the `tokenizers` package on texts that exercise every part of
//! BERT's tokenizer (`data/minilm/tokens.json`, from `scripts/tokens_reference.py`).

mod common;

use weft_core::Device;
use weft_nn::tokenizer::WordPiece;

#[test]
fn wordpiece_matches_the_reference_tokenizer() {
    let Some(dir) = common::minilm_dir() else { return };
    let tok = WordPiece::from_file(dir.join("tokenizer.json")).unwrap();
    let fx = common::fixture("tokens.json");
    let texts = fx["texts"].as_array().unwrap();
    for (text, ids) in texts.iter().zip(fx["ids"].as_array().unwrap()) {
        let want: Vec<u32> = ids.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(text.as_str().unwrap()), want, "text {text}");
    }
}

#[test]
fn a_batch_is_padded_with_a_mask() {
    let Some(dir) = common::minilm_dir() else { return };
    let tok = WordPiece::from_file(dir.join("tokenizer.json")).unwrap();
    let b = tok.encode_batch(&["A man is eating food.", "Hi"], &Device::Cpu).unwrap();
    assert_eq!(b.input_ids.dims(), &[2, 8]);
    assert_eq!(b.input_ids.to_vec::<u32>().unwrap()[8..], [101, 7632, 102, 0, 0, 0, 0, 0]);
    assert_eq!(b.attention_mask.to_vec::<f32>().unwrap()[8..], [1., 1., 1., 0., 0., 0., 0., 0.]);
    assert_eq!(b.token_type_ids.to_vec::<u32>().unwrap(), vec![0; 16]);
    assert!(tok.encode_batch(&[], &Device::Cpu).is_err());
}

#[test]
fn a_file_that_is_not_wordpiece_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, r#"{"model": {"type": "BPE", "vocab": {}}}"#).unwrap();
    let err = WordPiece::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("BPE") && err.contains("WordPiece"), "{err}");
}

/// A tokenizer.json with a tiny vocabulary and the given normalizer and extras.
fn tiny(dir: &std::path::Path, normalizer: &str, extra: &str) -> std::path::PathBuf {
    let path = dir.join("tiny.json");
    let vocab = r###"{"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "cafe": 4, "Café": 5, "ab": 6, "##c": 7, "οδος": 8, "οδοσ": 9}"###;
    let text = format!(
        r#"{{"model": {{"type": "WordPiece", "unk_token": "[UNK]", "vocab": {vocab}}}, "normalizer": {normalizer}{extra}}}"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn no_normalizer_means_no_normalization_and_lower_case_is_per_character() {
    let dir = tempfile::tempdir().unwrap();
    let raw = WordPiece::from_file(tiny(dir.path(), "null", "")).unwrap();
    assert_eq!(raw.encode("Café abc"), vec![2, 5, 6, 7, 3]);
    let bert = WordPiece::from_file(tiny(dir.path(), r#"{"type": "BertNormalizer", "lowercase": true}"#, "")).unwrap();
    assert_eq!(bert.encode("Café"), vec![2, 4, 3]);
    // Σ lower-cases to σ one character at a time (no final-sigma rule), as Hugging Face does.
    assert_eq!(bert.encode("ΟΔΟΣ"), vec![2, 9, 3]);
}

#[test]
fn unsupported_parts_and_empty_added_tokens_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let bad_pre = tiny(dir.path(), "null", r#", "pre_tokenizer": {"type": "WhitespaceSplit"}"#);
    let err = WordPiece::from_file(bad_pre).unwrap_err().to_string();
    assert!(err.contains("WhitespaceSplit"), "{err}");
    let empty = tiny(dir.path(), "null", r#", "added_tokens": [{"id": 6, "content": ""}]"#);
    assert_eq!(WordPiece::from_file(empty).unwrap().encode("ab"), vec![2, 6, 3]);
}
