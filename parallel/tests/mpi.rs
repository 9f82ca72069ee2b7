//! The MPI communicator across real processes: `examples/mpi_check.rs` run under `mpirun` with
//! 2 and 4 processes (oversubscribed on loopback). Needs the `mpi` feature and Open MPI's
//! `mpirun` (Debian: openmpi-bin); `.ci/run` installs both and runs
//! `cargo test --workspace --features weft/mpi --test mpi`.

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
                .args([
                    "build",
                    "--workspace",
                    "--features",
                    "weft/mpi",
                    "--example",
                    "mpi_check",
                    "--example",
                    "tensor_parallel",
                ])
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
    run_example(n, example(), mode, limit)
}

/// A fresh, empty directory for one `mpirun`'s session files. Open MPI makes its per-user session
/// directory under `TMPDIR` with a check-then-mkdir that two jobs started at once can both lose
/// ("mkdir ... File exists", the job never starts); the tests run their jobs concurrently, so each
/// gets its own. Short, since Open MPI's socket paths under it are limited to about 100 bytes.
fn session_dir() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir =
        std::env::temp_dir().join(format!("weft-mpi-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory for mpirun's session files");
    dir
}

fn run_example(n: usize, exe: PathBuf, mode: &str, limit: Duration) -> (Option<i32>, String, Duration) {
    let tmp = session_dir();
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", &n.to_string()])
        .arg(exe)
        .args(mode.split(' '))
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("TMPDIR", &tmp)
        .env("OMPI_MCA_orte_tmpdir_base", &tmp)
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
    let _ = std::fs::remove_dir_all(&tmp);
    (status, text, elapsed)
}

fn all_ok(n: usize, mode: &str) {
    let (status, text, _) = mpirun(n, mode, Duration::from_secs(120));
    assert_eq!(status, Some(0), "mpirun -np {n} mpi_check {mode}:\n{text}");
    for p in 0..n {
        let first = mode.split(' ').next().unwrap_or(mode);
        assert!(text.contains(&format!("process {p}: {first} ok")), "process {p} did not finish {mode}:\n{text}");
    }
}

#[test]
fn every_collective_on_2_and_4_processes() {
    all_ok(2, "collectives");
    all_ok(4, "collectives");
    // Groups of 2 ranks in each process (an in-host group and an MPI communicator per position).
    all_ok(2, "hier");
    all_ok(3, "hier");
}

#[test]
fn a_failing_process_gives_every_process_its_reason() {
    all_ok(2, "fail");
    all_ok(4, "fail");
    all_ok(2, "fail_train");
}

#[test]
fn mismatched_calls_and_shapes_are_refused_on_every_process() {
    all_ok(3, "mismatch");
    all_ok(2, "bad_layouts");
}

/// Errors one process finds alone (a plan for another mesh, a checkpoint only it cannot read, a
/// ragged batch, a refused communicator call) and a process that returns early: every process
/// gets `Err` and the job ends, within the bound.
#[test]
fn an_error_on_one_process_alone_reaches_every_process() {
    for (n, mode) in [(2, "local_errors"), (3, "local_errors"), (2, "early_exit"), (2, "exit_while_waiting")] {
        let (status, text, elapsed) = mpirun(n, mode, Duration::from_secs(90));
        assert_eq!(status, Some(0), "mpirun -np {n} mpi_check {mode} (after {elapsed:?}):\n{text}");
        for p in 0..n {
            assert!(text.contains(&format!("process {p}: {mode} ok")), "process {p} did not finish {mode}:\n{text}");
        }
    }
}

#[test]
fn a_killed_process_ends_the_job_within_30_seconds() {
    let (status, text, elapsed) = mpirun(3, "kill", Duration::from_secs(60));
    assert!(status.is_some(), "mpirun still ran after 60 s:\n{text}");
    assert_ne!(status, Some(0), "the job reported success:\n{text}");
    assert!(elapsed < Duration::from_secs(30), "the job took {elapsed:?} to end:\n{text}");
}

#[test]
fn a_language_model_sharded_over_processes_trains_as_on_one_device() {
    all_ok(2, "train model");
    all_ok(2, "train data");
    all_ok(2, "train 2x2");
    // One axis over 2 processes of 2 devices: each group has 2 ranks in each process.
    all_ok(2, "train model4");
    all_ok(2, "train data4");
}

#[test]
fn a_checkpoint_from_processes_loads_into_one_device_and_another_layout() {
    all_ok(2, "checkpoint");
    all_ok(2, "checkpoint 2");
}

/// `mpirun -np 2 tensor_parallel --mpi`: the README's example, its model axis across two
/// processes; its closing `verify` must find sharded and one-device training equal.
#[test]
fn the_tensor_parallel_example_runs_over_two_processes() {
    let exe = example().parent().unwrap().join("tensor_parallel");
    let (status, text, _) = run_example(2, exe, "--mpi --cpu --steps 10", Duration::from_secs(300));
    assert_eq!(status, Some(0), "{text}");
    assert!(text.contains("over 2 processes, 1 devices each"), "{text}");
    let worst: f32 = text
        .lines()
        .find_map(|l| l.strip_prefix("largest relative difference: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no verify report:\n{text}"));
    assert!(worst < 1e-4, "sharded over processes differs from one device by {worst}:\n{text}");
}
