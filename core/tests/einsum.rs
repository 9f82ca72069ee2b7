//! einsum on the Cpu against the definition (a sum over every assignment of the letters), on
//! random sizes, for every kind of letter (batch, contracted, row, column, summed alone,
//! repeated) and output orders that are and are not the contraction's natural one; and the
//! attention forms give a contiguous result (not a permuted view that later ops read element by
//! element).

mod common;

use common::assert_close;
use proptest::prelude::*;
use std::collections::HashMap;
use weft_core::{Device, Tensor};

/// The equations checked: the Keras EinsumDense and attention forms, transposed outputs, three
/// operands, a letter summed within one operand, a diagonal, a vector on either side.
const EQUATIONS: [&str; 14] = [
    "abc,cd->abd",
    "abc,cde->abde",
    "abcd,cde->abe",
    "aecd,abcd->acbe",
    "acbe,aecd->abcd",
    "bqhd,bkhd->bhqk",
    "bhqk,bkhd->bqhd",
    "ab,bc->ca",
    "ab,cb->ac",
    "abc,abd->adc",
    "ab,bc,cd->ad",
    "abc,cd->ad",
    "ii,ij->j",
    "c,cd->d",
];

/// `equation` by its definition, in f64: for every assignment of the letters, the product of
/// the operands' elements added to the output element the output letters name.
fn by_definition(equation: &str, operands: &[(Vec<f32>, Vec<usize>)]) -> (Vec<f32>, Vec<usize>) {
    let (lhs, out) = equation.split_once("->").unwrap();
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let out: Vec<char> = out.chars().collect();
    let mut sizes = HashMap::new();
    for (letters, (_, dims)) in inputs.iter().zip(operands) {
        for (c, &d) in letters.iter().zip(dims) {
            sizes.insert(*c, d);
        }
    }
    let letters: Vec<char> = sizes.keys().copied().collect();
    let out_dims: Vec<usize> = out.iter().map(|c| sizes[c]).collect();
    let mut result = vec![0f64; out_dims.iter().product()];
    let total: usize = letters.iter().map(|c| sizes[c]).product();
    let index = |ls: &[char], dims: &[usize], value: &HashMap<char, usize>| {
        ls.iter().zip(dims).fold(0, |i, (c, &d)| i * d + value[c])
    };
    for flat in 0..total {
        let mut rest = flat;
        let mut value = HashMap::new();
        for c in &letters {
            value.insert(*c, rest % sizes[c]);
            rest /= sizes[c];
        }
        let product: f64 =
            inputs.iter().zip(operands).map(|(ls, (data, dims))| data[index(ls, dims, &value)] as f64).product();
        result[index(&out, &out_dims, &value)] += product;
    }
    (result.into_iter().map(|v| v as f32).collect(), out_dims)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Every equation on random sizes (1 to 5 per letter) and values: the definition's values
    /// and shape.
    #[test]
    fn einsum_is_its_definition(pick in 0usize..EQUATIONS.len(), sizes in prop::collection::vec(1usize..6, 8), seed in 0u64..1000) {
        let equation = EQUATIONS[pick];
        let lhs = equation.split_once("->").unwrap().0;
        let size_of = |c: char| sizes[(c as usize - 'a' as usize) % sizes.len()];
        let operands: Vec<(Vec<f32>, Vec<usize>)> = lhs
            .split(',')
            .enumerate()
            .map(|(i, s)| {
                let dims: Vec<usize> = s.chars().map(size_of).collect();
                let t = Tensor::rand(-1.0, 1.0, &dims, seed + i as u64, &Device::Cpu).unwrap();
                (t.to_vec::<f32>().unwrap(), dims)
            })
            .collect();
        let tensors: Vec<Tensor> =
            operands.iter().map(|(v, d)| Tensor::from_slice(v, d, &Device::Cpu).unwrap()).collect();
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let got = Tensor::einsum(equation, &refs).unwrap();
        let (want, dims) = by_definition(equation, &operands);
        prop_assert_eq!(got.dims(), &dims[..], "{}", equation);
        assert_close(&got.to_vec::<f32>().unwrap(), &want, 1e-5, &format!("{equation} with sizes {sizes:?}"));
    }
}

/// Attention's scores and weighted sums, and the Keras forms of them, come out of their product
/// contiguous: the operands are taken in the order that writes the output's order.
#[test]
fn attention_forms_come_out_contiguous() {
    let dev = Device::Cpu;
    let q = Tensor::rand(-1.0, 1.0, &[2, 5, 3, 4], 1, &dev).unwrap(); // [b, q, h, d]
    let k = Tensor::rand(-1.0, 1.0, &[2, 6, 3, 4], 2, &dev).unwrap(); // [b, k, h, d]
    let scores = Tensor::einsum("bqhd,bkhd->bhqk", &[&q, &k]).unwrap();
    assert_eq!(scores.dims(), &[2, 3, 5, 6]);
    assert!(scores.is_contiguous(), "bqhd,bkhd->bhqk gave strides {:?}", scores.layout().strides());
    // Keras' MultiHeadAttention names the key first.
    let keras = Tensor::einsum("aecd,abcd->acbe", &[&k, &q]).unwrap();
    assert!(keras.is_contiguous(), "aecd,abcd->acbe gave strides {:?}", keras.layout().strides());
    assert_eq!(keras.to_vec::<f32>().unwrap(), scores.to_vec::<f32>().unwrap());
}
