//! The guide in `docs/` cannot drift from the code: every block it quotes from a source file
//! (marked `<!-- verbatim: PATH -->` on the line before the block) must appear in that file as
//! it stands (indentation aside), and every `rust` block runs as a doctest (see `guide` in `src/lib.rs`).

use std::path::Path;

/// (chapter, line, path, block) for every quoted block.
fn quoted_blocks() -> Vec<(String, usize, String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut chapters: Vec<_> = std::fs::read_dir(root.join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    chapters.sort();
    for ch in chapters.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let text = std::fs::read_to_string(ch).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(path) = line.trim().strip_prefix("<!-- verbatim:").and_then(|r| r.strip_suffix("-->")) else {
                continue;
            };
            assert!(
                lines.get(i + 1).is_some_and(|l| l.starts_with("```")),
                "{}:{}: no block after",
                ch.display(),
                i + 1
            );
            let body: Vec<&str> = lines[i + 2..].iter().take_while(|l| !l.starts_with("```")).copied().collect();
            let name = ch.file_name().unwrap().to_string_lossy().to_string();
            out.push((name, i + 1, path.trim().to_string(), body.join("\n")));
        }
    }
    out
}

#[test]
fn quoted_code_is_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let blocks = quoted_blocks();
    assert!(blocks.len() >= 3, "the guide quotes at least the launcher, the kernel and the grid");
    for (chapter, line, path, body) in blocks {
        let source =
            std::fs::read_to_string(root.join(&path)).unwrap_or_else(|e| panic!("{chapter}:{line}: {path}: {e}"));
        // Line by line, indentation aside (a quote may drop the enclosing function's).
        let want: Vec<&str> = body.lines().map(str::trim).collect();
        let have: Vec<&str> = source.lines().map(str::trim).collect();
        assert!(
            !want.is_empty() && have.windows(want.len()).any(|w| w == want.as_slice()),
            "{chapter}:{line} quotes {path}, but the file no longer has these lines:\n{body}"
        );
    }
}
