//! Every WGSL kernel parses and validates with naga, the shader compiler inside wgpu.

use naga::valid::{Capabilities, ValidationFlags, Validator};

#[test]
fn every_kernel_validates_with_naga() {
    let names = weft_shaders::all_kernels();
    assert!(names.len() > 40, "expected every kernel variant, got {}", names.len());
    let mut failures = Vec::new();
    for name in &names {
        let src = weft_shaders::source(name).expect("listed kernels have a source");
        assert!(!src.contains("{{"), "{name}: a template placeholder was left unfilled");
        let module = match naga::front::wgsl::parse_str(&src) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: parse: {}", e.emit_to_string(&src)));
                continue;
            }
        };
        let mut v = Validator::new(ValidationFlags::all(), Capabilities::all());
        if let Err(e) = v.validate(&module) {
            failures.push(format!("{name}: validate: {}", e.emit_to_string(&src)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_file_opens_with_a_comment_on_its_algorithm() {
    for (name, src) in [
        ("common", weft_shaders::COMMON),
        ("unary", weft_shaders::UNARY),
        ("binary", weft_shaders::BINARY),
        ("where", weft_shaders::WHERE),
        ("copy", weft_shaders::COPY),
        ("concat", weft_shaders::CONCAT),
        ("cross_entropy", weft_shaders::CROSS_ENTROPY),
        ("cross_entropy_grad", weft_shaders::CROSS_ENTROPY_GRAD),
        ("fill", weft_shaders::FILL),
        ("cast", weft_shaders::CAST),
        ("rand", weft_shaders::RAND),
        ("reduce", weft_shaders::REDUCE),
        ("softmax", weft_shaders::SOFTMAX),
        ("row_max_sum", weft_shaders::ROW_MAX_SUM),
        ("row_tree", weft_shaders::ROW_TREE),
        ("softmax_grad", weft_shaders::SOFTMAX_GRAD),
        ("layer_norm", weft_shaders::LAYER_NORM),
        ("layer_norm_grad", weft_shaders::LAYER_NORM_GRAD),
        ("row_stats", weft_shaders::ROW_STATS),
        ("gru_cell", weft_shaders::GRU_CELL),
        ("gru_cell_grad", weft_shaders::GRU_CELL_GRAD),
        ("gru_gates", weft_shaders::GRU_GATES),
        ("lstm_cell", weft_shaders::LSTM_CELL),
        ("lstm_cell_grad", weft_shaders::LSTM_CELL_GRAD),
        ("lstm_gates", weft_shaders::LSTM_GATES),
        ("matmul", weft_shaders::MATMUL),
        ("matmul_direct", weft_shaders::MATMUL_DIRECT),
        ("matmul_vec4", weft_shaders::MATMUL_VEC4),
        ("index", weft_shaders::INDEX),
        ("index_add", weft_shaders::INDEX_ADD),
        ("index_check", weft_shaders::INDEX_CHECK),
        ("fma_peak", weft_shaders::FMA_PEAK),
        ("adam", weft_shaders::ADAM),
    ] {
        let head: Vec<&str> = src.lines().take_while(|l| l.starts_with("//")).collect();
        assert!(head.len() >= 3, "{name}.wgsl must open with a comment on its algorithm");
    }
}

#[test]
fn unknown_kernels_are_none() {
    assert!(weft_shaders::source("unary/nope").is_none());
    assert!(weft_shaders::source("bogus").is_none());
}
