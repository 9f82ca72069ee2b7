//! The Meta device (shapes only) and tracing with layer scopes.

use weft_core::{Device, Error, Tensor, trace};

#[test]
fn meta_tensors_have_shapes_and_no_data() {
    // A 7B-sized weight costs nothing on Meta.
    let w = Tensor::zeros(&[32_000, 4096], &Device::Meta).unwrap();
    let x = Tensor::zeros(&[8, 128, 4096], &Device::Meta).unwrap();
    let y = x.matmul(&w.t().unwrap()).unwrap().softmax(-1).unwrap();
    assert_eq!(y.dims(), &[8, 128, 32_000]);
    assert!(matches!(y.to_vec::<f32>(), Err(Error::MetaData { .. })));
    // Shape errors are still caught.
    assert!(x.matmul(&w).is_err());
}

/// The Meta device has no arithmetic rate to measure: an `Err` that says so, not a figure.
#[test]
fn meta_has_no_fma_ceiling() {
    let err = Device::Meta.fma_peak().unwrap_err().to_string();
    assert!(err.contains("fma_peak") && err.contains("meta"), "{err}");
}

#[test]
fn tracing_records_ops_with_their_scope_paths() {
    let dev = Device::Meta;
    let x = Tensor::zeros(&[4, 8], &dev).unwrap();
    let w1 = Tensor::zeros(&[8, 16], &dev).unwrap();
    let w2 = Tensor::zeros(&[16, 8], &dev).unwrap();
    let (_, nodes) = trace::trace(|| {
        let _block = trace::scope("block_0");
        let h = {
            let _s = trace::scope("mlp/up");
            x.matmul(&w1)?.gelu()?
        };
        let _s = trace::scope("mlp/down");
        h.matmul(&w2)
    })
    .unwrap();
    let summary: Vec<(String, String, Vec<usize>)> =
        nodes.iter().map(|n| (n.kind.clone(), n.scope.clone(), n.shape.clone())).collect();
    assert_eq!(
        summary,
        vec![
            ("matmul".into(), "block_0/mlp/up".into(), vec![4, 16]),
            ("unary/gelu_tanh".into(), "block_0/mlp/up".into(), vec![4, 16]),
            ("matmul".into(), "block_0/mlp/down".into(), vec![4, 8]),
        ]
    );
    // Inputs link the graph: the second matmul reads the gelu's output.
    assert_eq!(nodes[2].inputs[0], nodes[1].id);
    assert_eq!(trace::current_scope(), "");
}

#[test]
fn tracing_is_off_outside_trace() {
    let x = Tensor::zeros(&[2], &Device::Meta).unwrap();
    let (_, inner) = trace::trace(|| x.exp()).unwrap();
    assert_eq!(inner.len(), 1);
    let (_, none) = trace::trace(|| Ok(())).unwrap();
    assert!(none.is_empty());
}
