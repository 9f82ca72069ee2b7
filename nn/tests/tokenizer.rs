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
