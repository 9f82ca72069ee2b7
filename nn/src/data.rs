//! Data helpers: CSV loading and seeded splits.

use weft_core::{Error, Result};

/// Rows of numbers from a CSV file (no header, comma-separated): the values row-major, with the
/// row and column counts. A ragged row or a field that is not a number is an `Err` naming its line.
pub fn read_csv(path: impl AsRef<std::path::Path>) -> Result<(Vec<f32>, usize, usize)> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Msg(format!("reading {}: {e}", path.display())))?;
    let mut values = Vec::new();
    let (mut rows, mut cols) = (0, 0);
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let before = values.len();
        for field in line.split(',') {
            let v = field
                .trim()
                .parse::<f32>()
                .map_err(|_| Error::Msg(format!("{}:{}: {field:?} is not a number", path.display(), i + 1)))?;
            values.push(v);
        }
        let n = values.len() - before;
        if rows == 0 {
            cols = n;
        } else if n != cols {
            return Err(Error::Msg(format!("{}:{}: {n} fields, but the first row has {cols}", path.display(), i + 1)));
        }
        rows += 1;
    }
    Ok((values, rows, cols))
}

/// A seeded shuffle of `0..n` cut into (first `1 - test_fraction`, last `test_fraction`).
pub fn train_test_split(n: usize, test_fraction: f32, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let key = weft_core::rng::seed_key(seed);
    for i in (1..n).rev() {
        let j = ((weft_core::rng::uniform(key, i as u32) * (i + 1) as f32) as usize).min(i);
        order.swap(i, j);
    }
    let test = ((n as f32) * test_fraction).round() as usize;
    let train = order.split_off(n - test);
    (order, train)
}
