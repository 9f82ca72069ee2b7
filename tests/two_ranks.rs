//! The two-rank f/g example runs as a test: it returns `Err` unless each of its three runs
//! (with f and g, without g, without f) comes out as its text says.

#[path = "../examples/two_ranks.rs"]
mod two_ranks;

#[test]
fn the_two_rank_example_shows_what_f_and_g_do() {
    two_ranks::main().unwrap();
}
