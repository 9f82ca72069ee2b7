//! einsum: parse an equation such as `abc,cd->abd` or `bqhd,bkhd->bhqk` and lower it to the ops
//! that already exist. Each pair of operands becomes one strided batched matmul: shared letters
//! that survive are batch axes, shared letters that do not are contracted, the rest are rows or
//! columns. The operands are only permuted (views) and reshaped (views when strides allow), so
//! the Keras EinsumDense and attention forms reach the matmul kernel without copies. Letters that
//! appear in one operand only are summed first; a repeated letter (`ii`) takes the diagonal.

use crate::{Error, Result, Tensor};
use std::collections::HashMap;

fn err(eq: &str, msg: impl std::fmt::Display) -> Error {
    Error::invalid("einsum", format!("{eq:?}: {msg}"))
}

/// A tensor with one letter per axis.
#[derive(Clone)]
struct Labeled {
    t: Tensor,
    letters: Vec<char>,
}

impl Tensor {
    /// Einstein summation over one or more operands.
    ///
    /// ```
    /// # use weft_core::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::rand(-1.0, 1.0, &[2, 3, 4], 0, &dev)?;
    /// let w = Tensor::rand(-1.0, 1.0, &[4, 5], 1, &dev)?;
    /// let y = Tensor::einsum("abc,cd->abd", &[&x, &w])?;
    /// assert_eq!(y.dims(), &[2, 3, 5]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l.to_string(), Some(r.to_string())),
            None => (eq.clone(), None),
        };
        let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
        if inputs.len() != operands.len() {
            return Err(err(equation, format!("names {} operands but {} were given", inputs.len(), operands.len())));
        }
        if eq.contains('.') {
            return Err(err(equation, "ellipsis (...) is not supported; name every axis"));
        }
        let mut sizes: HashMap<char, usize> = HashMap::new();
        for (letters, t) in inputs.iter().zip(operands) {
            if letters.iter().any(|c| !c.is_ascii_alphabetic()) {
                return Err(err(equation, "axis names must be letters"));
            }
            if letters.len() != t.rank() {
                return Err(err(equation, format!("{} letters for an operand of shape {:?}", letters.len(), t.dims())));
            }
            for (c, &d) in letters.iter().zip(t.dims()) {
                if let Some(&prev) = sizes.get(c) {
                    if prev != d {
                        return Err(err(equation, format!("axis '{c}' has sizes {prev} and {d}")));
                    }
                } else {
                    sizes.insert(*c, d);
                }
            }
        }
        // Implicit output: letters used once, in alphabetical order (NumPy's rule).
        let output: Vec<char> = match rhs {
            Some(r) => r.chars().collect(),
            None => {
                let mut once: Vec<char> = sizes
                    .keys()
                    .copied()
                    .filter(|c| inputs.iter().map(|l| l.iter().filter(|x| *x == c).count()).sum::<usize>() == 1)
                    .collect();
                once.sort_unstable();
                once
            }
        };
        for c in &output {
            if !sizes.contains_key(c) {
                return Err(err(equation, format!("output axis '{c}' appears in no operand")));
            }
            if output.iter().filter(|x| *x == c).count() > 1 {
                return Err(err(equation, format!("output axis '{c}' is repeated")));
            }
        }
        let mut ops: Vec<Labeled> = Vec::new();
        for (letters, t) in inputs.into_iter().zip(operands) {
            ops.push(diagonals(Labeled { t: (*t).clone(), letters })?);
        }
        // Fold left: contract the running result with the next operand, keeping the letters that
        // later operands or the output still need.
        let mut rest = ops.into_iter();
        let mut acc = rest.next().ok_or_else(|| err(equation, "no operands"))?;
        let rest: Vec<Labeled> = rest.collect();
        for (i, next) in rest.iter().enumerate() {
            let later: Vec<char> =
                rest[i + 1..].iter().flat_map(|o| o.letters.clone()).chain(output.iter().copied()).collect();
            let a = sum_unneeded(acc, &[later.clone(), next.letters.clone()].concat())?;
            let b = sum_unneeded(next.clone(), &[later.clone(), a.letters.clone()].concat())?;
            acc = contract(a, b, &later)?;
        }
        let acc = sum_unneeded(acc, &output)?;
        let perm: Vec<usize> =
            output.iter().map(|c| acc.letters.iter().position(|x| x == c).unwrap_or(usize::MAX)).collect();
        if perm.contains(&usize::MAX) || perm.len() != acc.letters.len() {
            return Err(err(equation, "internal: output letters do not match the contraction"));
        }
        acc.t.permute(&perm)
    }
}

/// Take the diagonal for each repeated letter: multiply by an identity mask, sum one copy away.
fn diagonals(mut x: Labeled) -> Result<Labeled> {
    while let Some((i, j)) = (0..x.letters.len())
        .flat_map(|i| (i + 1..x.letters.len()).map(move |j| (i, j)))
        .find(|&(i, j)| x.letters[i] == x.letters[j])
    {
        let n = x.t.dims()[i];
        let eye: Vec<f32> = (0..n * n).map(|k| if k / n == k % n { 1.0 } else { 0.0 }).collect();
        let mut shape = vec![1; x.t.rank()];
        shape[i] = n;
        shape[j] = n;
        let eye = Tensor::from_vec(eye, &[n, n], x.t.device())?.reshape(&shape)?;
        x.t = x.t.mul(&eye)?.sum(&[j as isize], false)?;
        x.letters.remove(j);
    }
    Ok(x)
}

/// Sum away axes whose letters are not in `needed`.
fn sum_unneeded(x: Labeled, needed: &[char]) -> Result<Labeled> {
    let axes: Vec<isize> =
        (0..x.letters.len()).filter(|&i| !needed.contains(&x.letters[i])).map(|i| i as isize).collect();
    if axes.is_empty() {
        return Ok(x);
    }
    let letters = x.letters.iter().copied().filter(|c| needed.contains(c)).collect();
    Ok(Labeled { t: x.t.sum(&axes, false)?, letters })
}

/// One batched matmul: `[batch.., a_only.., shared..] @ [batch.., shared.., b_only..]`.
///
/// The result's axes are the batch letters in `keep`'s order, then the rows, then the columns:
/// the operands are taken in the order that makes them `keep`'s order where they can be, so a
/// result that is the output (`keep` is the output's letters in the last contraction) comes out
/// contiguous, not as a permuted view that every later op reads element by element (attention's
/// `bhqk` scores from `bqhd,bkhd`: the query's rows must come first).
fn contract(a: Labeled, b: Labeled, keep: &[char]) -> Result<Labeled> {
    let at = |c: &char| keep.iter().position(|x| x == c).unwrap_or(usize::MAX);
    let first = |l: &Labeled, other: &Labeled| {
        l.letters.iter().filter(|c| !other.letters.contains(c)).map(at).min().unwrap_or(usize::MAX)
    };
    // (Only when both have columns of their own: a lone vector stays on its side.)
    let (fa, fb) = (first(&a, &b), first(&b, &a));
    let (a, b) = if fb < fa && fa != usize::MAX { (b, a) } else { (a, b) };
    let in_b = |c: &char| b.letters.contains(c);
    let mut batch: Vec<char> = a.letters.iter().copied().filter(|c| in_b(c) && keep.contains(c)).collect();
    batch.sort_by_key(at);
    let shared: Vec<char> = a.letters.iter().copied().filter(|c| in_b(c) && !keep.contains(c)).collect();
    let a_only: Vec<char> = a.letters.iter().copied().filter(|c| !in_b(c)).collect();
    let b_only: Vec<char> = b.letters.iter().copied().filter(|c| !a.letters.contains(c)).collect();
    let pos = |l: &Labeled, cs: &[char]| -> Vec<usize> {
        cs.iter().map(|c| l.letters.iter().position(|x| x == c).unwrap()).collect()
    };
    let size = |l: &Labeled, cs: &[char]| -> usize { pos(l, cs).iter().map(|&i| l.t.dims()[i]).product() };
    let bdims: Vec<usize> = pos(&a, &batch).iter().map(|&i| a.t.dims()[i]).collect();
    let (m, k, n) = (size(&a, &a_only), size(&a, &shared), size(&b, &b_only));
    let ap = a.t.permute(&[pos(&a, &batch), pos(&a, &a_only), pos(&a, &shared)].concat())?;
    let bp = b.t.permute(&[pos(&b, &batch), pos(&b, &shared), pos(&b, &b_only)].concat())?;
    let a3 = ap.reshape(&[bdims.clone(), vec![m, k]].concat())?;
    let b3 = bp.reshape(&[bdims.clone(), vec![k, n]].concat())?;
    let c = a3.matmul(&b3)?;
    let out_dims: Vec<usize> = bdims
        .iter()
        .copied()
        .chain(pos(&a, &a_only).iter().map(|&i| a.t.dims()[i]))
        .chain(pos(&b, &b_only).iter().map(|&i| b.t.dims()[i]))
        .collect();
    Ok(Labeled { t: c.reshape(&out_dims)?, letters: [batch, a_only, b_only].concat() })
}
