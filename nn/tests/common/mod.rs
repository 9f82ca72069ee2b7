//! Shared by nn test binaries: where the all-MiniLM-L6-v2 files are, and safetensors files
//! written by hand.
#![allow(dead_code)]

use std::path::PathBuf;

/// The directory holding all-MiniLM-L6-v2 (`scripts/fetch_minilm.sh` puts it in
/// `target/models/all-MiniLM-L6-v2`; `WEFT_MINILM_DIR` overrides). `None` with a note when it is
/// absent on a user's machine; under `CI=true` (where `.ci/run` fetches it) absence is a failure.
pub fn minilm_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("WEFT_MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/models/all-MiniLM-L6-v2"));
    if dir.join("model.safetensors").exists() && dir.join("tokenizer.json").exists() {
        return Some(dir);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true but all-MiniLM-L6-v2 is not in {} (run scripts/fetch_minilm.sh)", dir.display());
    }
    eprintln!("note: skipping, all-MiniLM-L6-v2 not found in {} (run scripts/fetch_minilm.sh)", dir.display());
    None
}

/// A JSON fixture from `data/minilm/`.
pub fn fixture(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/minilm").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

/// A safetensors file as PyTorch would write it: (name, dtype, shape, little-endian bytes).
pub fn raw_safetensors(entries: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header += &format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            dims.join(","),
            data.len(),
            data.len() + bytes.len()
        );
        data.extend_from_slice(bytes);
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

/// The best GPU adapter; `None` with a note on a user's machine without one, a failure under
/// `CI=true` (where `.ci/run` installs lavapipe).
pub fn gpu() -> Option<weft_core::Device> {
    match weft_core::Device::best_gpu() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI=true but no GPU adapter: {e}"),
        Err(e) => {
            eprintln!("note: skipping the GPU case, no adapter: {e}");
            None
        }
    }
}
