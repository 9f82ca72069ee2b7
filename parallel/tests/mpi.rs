//! The MPI communicator across real processes: `examples/mpi_check.rs` run under `mpirun` with
//! 2 and 4 processes (oversubscribed on loopback). Needs the `mpi` feature and Open MPI's
//! `mpirun` (Debian: openmpi-bin); `.ci/run` installs both and runs
//! `cargo test --workspace --features weft-parallel/mpi --test mpi`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The example binary, built once (with the features this test was built with, so nothing else
/// rebuilds) next to this test's own directory.
fn example() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "--workspace", "--features", "weft-parallel/mpi", "--example", "mpi_check"])
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building examples/mpi_check failed");
            let exe = std::env::current_exe().unwrap();
            exe.parent().unwrap().parent().unwrap().join("examples").join("mpi_check")
        })
        .clone()
}

/// Run `mpi_check MODE` on `n` processes; (exit status, stdout + stderr, elapsed). Killed after `limit`.
fn mpirun(n: usize, mode: &str, limit: Duration) -> (Option<i32>, String, Duration) {
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", &n.to_string()])
        .arg(example())
        .arg(mode)
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun (Open MPI's openmpi-bin) must be installed for the mpi feature's tests");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = t.elapsed();
    let mut text = String::new();
    use std::io::Read;
    child.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut text).unwrap();
    (status, text, elapsed)
}

fn all_ok(n: usize, mode: &str) {
    let (status, text, _) = mpirun(n, mode, Duration::from_secs(120));
    assert_eq!(status, Some(0), "mpirun -np {n} mpi_check {mode}:\n{text}");
    for p in 0..n {
        assert!(text.contains(&format!("process {p}: {mode} ok")), "process {p} did not finish {mode}:\n{text}");
    }
}

#[test]
fn every_collective_on_2_and_4_processes() {
    all_ok(2, "collectives");
    all_ok(4, "collectives");
}

#[test]
fn a_failing_process_gives_every_process_its_reason() {
    all_ok(2, "fail");
    all_ok(4, "fail");
}

#[test]
fn mismatched_calls_and_shapes_are_refused_on_every_process() {
    all_ok(3, "mismatch");
}

#[test]
fn a_killed_process_ends_the_job_within_30_seconds() {
    let (status, text, elapsed) = mpirun(3, "kill", Duration::from_secs(60));
    assert!(status.is_some(), "mpirun still ran after 60 s:\n{text}");
    assert_ne!(status, Some(0), "the job reported success:\n{text}");
    assert!(elapsed < Duration::from_secs(30), "the job took {elapsed:?} to end:\n{text}");
}
