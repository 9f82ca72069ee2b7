//! A BERT WordPiece tokenizer read from a Hugging Face `tokenizer.json`: BERT's normaliser
//! (clean-up, spaces around CJK characters, accents stripped, lower case), its pre-tokenizer
//! (split on white space and punctuation), WordPiece (longest match first, `##` continuations),
//! `[CLS] .. [SEP]` around each text, and batches padded to the longest text.
//!
//! Written here rather than taken from the `tokenizers` crate, which compiles several times
//! longer than all of weft-nn; only the WordPiece model is read, and anything else in the file
//! is an `Err` naming it. The tests compare it with the `tokenizers` package's output.

use std::collections::HashMap;
use std::path::Path;
use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};
use weft_core::{Device, Error, Result, Tensor};

/// A WordPiece tokenizer.
///
/// ```no_run
/// use weft_nn::tokenizer::WordPiece;
/// let tok = WordPiece::from_file("all-MiniLM-L6-v2/tokenizer.json")?;
/// let batch = tok.encode_batch(&["A man is eating food.", "Hi"], &weft_core::Device::Cpu)?;
/// assert_eq!(batch.input_ids.dims(), &[2, 8]); // [CLS] a man is eating food . [SEP]
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct WordPiece {
    vocab: HashMap<String, u32>,
    /// Special tokens matched in the raw text before normalisation, longest first.
    added: Vec<(String, u32)>,
    unk: u32,
    cls: u32,
    sep: u32,
    pad: u32,
    prefix: String,
    max_word_chars: usize,
    lowercase: bool,
    strip_accents: bool,
    chinese: bool,
    clean: bool,
    max_len: usize,
}

/// Token ids of a batch, padded to its longest text: `input_ids` (u32), `attention_mask` (f32,
/// 1 for tokens, 0 for padding) and `token_type_ids` (u32), each `[batch, longest]`.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Token ids.
    pub input_ids: Tensor,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Tensor,
    /// The segment of each token (0 for single texts).
    pub token_type_ids: Tensor,
}

impl WordPiece {
    /// Read a `tokenizer.json` whose model is WordPiece.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bad = |what: String| Error::Msg(format!("{}: {what}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let model = &json["model"];
        if model["type"] != "WordPiece" {
            return Err(bad(format!("the model is {}, not WordPiece", model["type"])));
        }
        let vocab: HashMap<String, u32> = model["vocab"]
            .as_object()
            .ok_or_else(|| bad("model.vocab is not a map".into()))?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)))
            .collect();
        let id = |tok: &str| vocab.get(tok).copied().ok_or_else(|| bad(format!("the vocabulary has no {tok}")));
        let norm = &json["normalizer"];
        if !norm.is_null() && norm["type"] != "BertNormalizer" {
            return Err(bad(format!("normalizer {} is not supported (BertNormalizer is)", norm["type"])));
        }
        // No normaliser: no clean-up, no CJK spacing, no accent stripping, no lower case.
        let flag = |k: &str, default: bool| !norm.is_null() && norm[k].as_bool().unwrap_or(default);
        let lowercase = flag("lowercase", true);
        let pre = &json["pre_tokenizer"];
        if !pre.is_null() && pre["type"] != "BertPreTokenizer" {
            return Err(bad(format!("pre_tokenizer {} is not supported (BertPreTokenizer is)", pre["type"])));
        }
        let post = &json["post_processor"];
        let cls_sep = |v: &serde_json::Value| {
            v.as_array().is_some_and(|a| {
                let ids: Vec<&str> = a
                    .iter()
                    .map(|p| p["SpecialToken"]["id"].as_str().or(p["Sequence"]["id"].as_str()).unwrap_or("?"))
                    .collect();
                ids == ["[CLS]", "A", "[SEP]"]
            })
        };
        let post_ok = post.is_null()
            || post["type"] == "BertProcessing"
            || (post["type"] == "TemplateProcessing" && cls_sep(&post["single"]));
        if !post_ok {
            return Err(bad(format!(
                "post_processor {} is not `[CLS] text [SEP]`, the only one supported",
                post["type"]
            )));
        }
        let mut added: Vec<(String, u32)> = json["added_tokens"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| Some((t["content"].as_str()?.to_string(), u32::try_from(t["id"].as_u64()?).ok()?)))
                    .filter(|(s, _)| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        added.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        Ok(WordPiece {
            unk: id(model["unk_token"].as_str().unwrap_or("[UNK]"))?,
            cls: id("[CLS]")?,
            sep: id("[SEP]")?,
            pad: id(json["padding"]["pad_token"].as_str().unwrap_or("[PAD]"))?,
            prefix: model["continuing_subword_prefix"].as_str().unwrap_or("##").to_string(),
            max_word_chars: model["max_input_chars_per_word"].as_u64().unwrap_or(100) as usize,
            lowercase,
            // BERT strips accents when it lower-cases, unless told otherwise.
            strip_accents: !norm.is_null() && norm["strip_accents"].as_bool().unwrap_or(lowercase),
            chinese: flag("handle_chinese_chars", true),
            clean: flag("clean_text", true),
            max_len: json["truncation"]["max_length"].as_u64().unwrap_or(512) as usize,
            vocab,
            added,
        })
    }

    /// The ids of one text, `[CLS] .. [SEP]`, cut to the model's maximum length.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![self.cls];
        for (piece, special) in self.split_added(text) {
            match special {
                Some(id) => ids.push(id),
                None => {
                    for word in pre_tokenize(&self.normalize(piece)) {
                        self.word_piece(&word, &mut ids);
                    }
                }
            }
        }
        ids.truncate(self.max_len.saturating_sub(1).max(1));
        ids.push(self.sep);
        ids
    }

    /// Several texts as one batch, padded to the longest, on `device`.
    pub fn encode_batch(&self, texts: &[&str], device: &Device) -> Result<Encoded> {
        if texts.is_empty() {
            return Err(Error::invalid("WordPiece::encode_batch", "no texts were given"));
        }
        let all: Vec<Vec<u32>> = texts.iter().map(|t| self.encode(t)).collect();
        let t = all.iter().map(Vec::len).max().unwrap_or(0);
        let (mut ids, mut mask) = (Vec::with_capacity(all.len() * t), Vec::with_capacity(all.len() * t));
        for e in &all {
            ids.extend(e.iter().copied().chain(std::iter::repeat_n(self.pad, t - e.len())));
            mask.extend((0..t).map(|i| if i < e.len() { 1f32 } else { 0.0 }));
        }
        let shape = [all.len(), t];
        Ok(Encoded {
            input_ids: Tensor::from_vec(ids, &shape, device)?,
            attention_mask: Tensor::from_vec(mask, &shape, device)?,
            token_type_ids: Tensor::zeros(&shape, device)?.to_dtype(weft_core::DType::U32)?,
        })
    }

    /// The text cut into pieces, special tokens (as written in the raw text) apart.
    fn split_added<'t>(&self, text: &'t str) -> Vec<(&'t str, Option<u32>)> {
        let mut out = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < text.len() {
            if let Some((tok, id)) = self.added.iter().find(|(tok, _)| text[i..].starts_with(tok.as_str())) {
                out.push((&text[start..i], None));
                out.push((&text[i..i + tok.len()], Some(*id)));
                i += tok.len();
                start = i;
            } else {
                i += text[i..].chars().next().map_or(1, char::len_utf8);
            }
        }
        out.push((&text[start..], None));
        out
    }

    /// BERT's normaliser.
    fn normalize(&self, text: &str) -> String {
        let mut s = String::with_capacity(text.len());
        for c in text.chars() {
            if self.clean && (c == '\0' || c == '\u{fffd}' || is_control(c)) {
                continue;
            }
            let c = if self.clean && is_whitespace(c) { ' ' } else { c };
            if self.chinese && is_chinese(c) {
                s.push(' ');
                s.push(c);
                s.push(' ');
            } else {
                s.push(c);
            }
        }
        if self.strip_accents {
            s = s.nfd().filter(|c| c.general_category() != GeneralCategory::NonspacingMark).collect();
        }
        // One character at a time, as Hugging Face does (no final-sigma rule of str::to_lowercase).
        if self.lowercase { s.chars().flat_map(char::to_lowercase).collect() } else { s }
    }

    /// Longest-match-first WordPiece of one word; a word with a piece not in the vocabulary is `[UNK]`.
    fn word_piece(&self, word: &str, ids: &mut Vec<u32>) {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        if chars.len() > self.max_word_chars {
            ids.push(self.unk);
            return;
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < chars.len() {
            let mut end = chars.len();
            let mut found = None;
            while start < end {
                let (a, b) = (chars[start].0, chars.get(end).map_or(word.len(), |c| c.0));
                let sub = if start > 0 { format!("{}{}", self.prefix, &word[a..b]) } else { word[a..b].to_string() };
                if let Some(&id) = self.vocab.get(&sub) {
                    found = Some(id);
                    break;
                }
                end -= 1;
            }
            match found {
                Some(id) => pieces.push(id),
                None => {
                    ids.push(self.unk);
                    return;
                }
            }
            start = end;
        }
        ids.extend(pieces);
    }
}

/// BERT's pre-tokenizer: split on white space (dropped) and around each punctuation character.
fn pre_tokenize(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_whitespace() {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
        } else if c.is_ascii_punctuation() || c.general_category_group() == GeneralCategoryGroup::Punctuation {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            words.push(c.to_string());
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' ') || c.is_whitespace()
}

fn is_control(c: char) -> bool {
    if matches!(c, '\t' | '\n' | '\r') {
        return false;
    }
    matches!(
        c.general_category(),
        GeneralCategory::Control | GeneralCategory::Format | GeneralCategory::Unassigned | GeneralCategory::PrivateUse
    )
}

fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}
