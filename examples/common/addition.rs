//! The 3-digit addition task the tiny_gpt examples learn: `123+456=0579`, operands and sum
//! zero-padded so every line is 12 characters, one pair in ten held out for grading.

/// The alphabet: digits, `+` and `=`.
pub const CHARS: &str = "0123456789+=";

/// Character ids of a line.
pub fn encode(s: &str) -> Vec<u32> {
    s.chars().map(|c| CHARS.find(c).expect("a digit, + or =") as u32).collect()
}

/// Pair `i` (`a = i / 1000`, `b = i % 1000`) as text: `123+456=0579`.
pub fn sample(i: u32) -> String {
    let (a, b) = (i / 1000, i % 1000);
    format!("{a:03}+{b:03}={:04}", a + b)
}

/// One pair in ten, picked by a hash (so every digit pattern appears in both sets), is held out.
pub fn held_out(i: u32) -> bool {
    weft::core::rng::pcg_hash(i ^ 0x5eed).is_multiple_of(10)
}
