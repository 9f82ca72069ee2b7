//! A checkpoint saved in parts (an index and part files): it loads whole, and every way its
//! files can be wrong (mixed saves, a missing part, parts that leave a gap or overlap, a
//! damaged index) is an `Err` naming the file or tensor, never a silently different weight.

use std::path::Path;
use weft_core::{Device, Tensor};
use weft_nn::checkpoint::{self, Index, IndexPart, SHARD_ID_META, part_key};

/// A [3, 4] tensor `w` cut along axis 1 at `cuts` (each part in a file of its own, of save
/// `id`), a [2] tensor `b` whole in the first file; the index at `dir/ckpt`.
fn save(dir: &Path, id: &str, cuts: &[(usize, usize)]) -> Index {
    let path = dir.join("ckpt");
    let w: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut index = Index::new(id, &[("weft.step", "5".into())]);
    for (p, &(start, len)) in cuts.iter().enumerate() {
        let file = Index::part_file_name(&path, id, p, cuts.len());
        let part: Vec<f32> = (0..3).flat_map(|r| w[r * 4 + start..r * 4 + start + len].to_vec()).collect();
        let key = part_key("w", 1, start);
        let mut tensors = vec![(key.clone(), Tensor::from_vec(part, &[3, len], &Device::Cpu).unwrap())];
        if p == 0 {
            tensors.push(("b".into(), Tensor::from_vec(vec![7.0, 8.0], &[2], &Device::Cpu).unwrap()));
            index.add_part("b", &[2], IndexPart { file: file.clone(), key: "b".into(), axis: 0, start: 0 });
        }
        checkpoint::save_with_metadata(dir.join(&file), &tensors, &[(SHARD_ID_META, id.into())]).unwrap();
        index.add_part("w", &[3, 4], IndexPart { file, key, axis: 1, start });
    }
    index.write(&path).unwrap();
    index
}

fn load_err(dir: &Path) -> String {
    match checkpoint::load_with_metadata(dir.join("ckpt")) {
        Ok(_) => panic!("a broken checkpoint loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parts_load_whole_with_their_metadata() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), "s1", &[(0, 1), (1, 3)]);
    let (file, meta) = checkpoint::load_with_metadata(dir.path().join("ckpt")).unwrap();
    assert_eq!(file["w"], (vec![3, 4], (0..12).map(|i| i as f32).collect::<Vec<_>>()));
    assert_eq!(file["b"].1, vec![7.0, 8.0]);
    assert_eq!(meta["weft.step"], "5");
}

#[test]
fn a_part_file_of_another_save_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = save(dir.path(), "s1", &[(0, 2), (2, 2)]);
    // The second save's part 1 lands under the first save's file name (as if files were copied
    // between two saves): its metadata still says which save it belongs to.
    save(dir.path(), "s2", &[(0, 2), (2, 2)]);
    let second_part = Index::part_file_name(&dir.path().join("ckpt"), "s2", 1, 2);
    let first_part = Index::part_file_name(&dir.path().join("ckpt"), "s1", 1, 2);
    std::fs::copy(dir.path().join(second_part), dir.path().join(&first_part)).unwrap();
    first.write(&dir.path().join("ckpt")).unwrap();
    let e = load_err(dir.path());
    assert!(e.contains(&first_part) && e.contains("s2"), "{e}");
}

#[test]
fn a_missing_part_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), "s1", &[(0, 2), (2, 2)]);
    let gone = Index::part_file_name(&dir.path().join("ckpt"), "s1", 1, 2);
    std::fs::remove_file(dir.path().join(&gone)).unwrap();
    let e = load_err(dir.path());
    assert!(e.contains(&gone), "{e}");
}

#[test]
fn parts_that_leave_a_gap_or_overlap_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), "gap", &[(0, 1), (2, 2)]);
    assert!(load_err(dir.path()).contains("tensor w"), "a gap");
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), "over", &[(0, 3), (2, 2)]);
    assert!(load_err(dir.path()).contains("tensor w"), "an overlap");
}

#[test]
fn a_damaged_index_is_an_error_not_a_safetensors_read() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), "s1", &[(0, 2), (2, 2)]);
    let path = dir.path().join("ckpt");
    let text = std::fs::read_to_string(&path).unwrap().replace("\"shape\"", "\"shap\"");
    std::fs::write(&path, text).unwrap();
    assert!(load_err(dir.path()).contains("damaged checkpoint index"));
}
