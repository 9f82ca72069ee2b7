//! The in-host communicator: every collective on even and uneven shards, and failures that
//! reach every rank promptly instead of hanging.

use std::time::{Duration, Instant};
use weft_core::{Collectives, Device, Error, ReduceKind, Result, Tensor};
use weft_nn::layers::Dense;
use weft_nn::optim::Sgd;
use weft_nn::{Activation, Loss, Sequential};
use weft_parallel::{AutoConfig, DeviceMesh, InHost, ShardedModel};

/// Run `f(rank, comm)` on `n` threads.
fn on_ranks<T: Send>(n: usize, f: impl Fn(usize, &InHost) -> Result<T> + Sync) -> Vec<Result<T>> {
    InHost::run(n, f)
}

fn vals(t: Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn all_reduce_sums_means_and_maxes() {
    let out = on_ranks(3, |r, c| {
        let x = Tensor::from_vec(vec![r as f32, 10.0 * r as f32, -(r as f32)], &[3], &Device::Cpu)?;
        Ok((
            vals(c.all_reduce(&x, ReduceKind::Sum)?),
            vals(c.all_reduce(&x, ReduceKind::Mean)?),
            vals(c.all_reduce(&x, ReduceKind::Max)?),
        ))
    });
    for o in out {
        let (s, m, x) = o.unwrap();
        assert_eq!(s, vec![3.0, 30.0, -3.0]);
        assert_eq!(m, vec![1.0, 10.0, -1.0]);
        assert_eq!(x, vec![2.0, 20.0, 0.0]);
    }
}

/// Long tensors, summed in many chunks over the Cpu's threads on two and three ranks, and a
/// gather of many rows: every element lands where it belongs.
#[test]
fn long_tensors_reduce_and_gather_element_by_element() {
    let len = 3 * (1 << 14) + 5;
    let value = |r: usize, i: usize| ((i * 7 + r * 13) % 101) as f32 - 50.0;
    for n in [2usize, 3] {
        let out = on_ranks(n, |r, c| {
            let x = Tensor::from_vec((0..len).map(|i| value(r, i)).collect(), &[len], &Device::Cpu)?;
            let rows = Tensor::from_vec((0..len / 7 * 7).map(|i| value(r, i)).collect(), &[len / 7, 7], &Device::Cpu)?;
            Ok((
                vals(c.all_reduce(&x, ReduceKind::Sum)?),
                vals(c.all_reduce(&x, ReduceKind::Mean)?),
                vals(c.all_reduce(&x, ReduceKind::Max)?),
                vals(c.all_gather(&rows, 1)?),
            ))
        });
        for o in out {
            let (s, m, x, g) = o.unwrap();
            for i in 0..len {
                let want: f32 = (0..n).map(|r| value(r, i)).sum();
                assert_eq!(s[i], want, "{n} ranks: sum at {i}");
                assert_eq!(m[i], want * (1.0 / n as f32), "{n} ranks: mean at {i}");
                assert_eq!(x[i], (0..n).map(|r| value(r, i)).fold(f32::MIN, f32::max), "{n} ranks: max at {i}");
            }
            let width = 7 * n;
            for (e, got) in g.iter().enumerate() {
                let (row, col) = (e / width, e % width);
                assert_eq!(*got, value(col / 7, row * 7 + col % 7), "{n} ranks: gathered ({row}, {col})");
            }
        }
    }
}

#[test]
fn all_gather_joins_uneven_parts_in_rank_order() {
    // 10 columns over 3 ranks: 4, 3, 3.
    let sizes = [4usize, 3, 3];
    let out = on_ranks(3, |r, c| {
        let start: usize = sizes[..r].iter().sum();
        let data: Vec<f32> = (0..2).flat_map(|row| (0..sizes[r]).map(move |j| (row * 10 + start + j) as f32)).collect();
        let x = Tensor::from_vec(data, &[2, sizes[r]], &Device::Cpu)?;
        let g = c.all_gather(&x, 1)?;
        Ok((g.dims().to_vec(), vals(g)))
    });
    for o in out {
        let (dims, v) = o.unwrap();
        assert_eq!(dims, vec![2, 10]);
        assert_eq!(v, (0..20).map(|i| i as f32).collect::<Vec<_>>());
    }
}

#[test]
fn reduce_scatter_and_broadcast() {
    let out = on_ranks(3, |r, c| {
        let x = Tensor::from_vec((0..7).map(|i| (i + r) as f32).collect(), &[7, 1], &Device::Cpu)?;
        let part = c.reduce_scatter(&x, 0, &[3, 2, 2], ReduceKind::Sum)?;
        let b = c.broadcast(&Tensor::full(r as f32, &[2], &Device::Cpu)?, 2)?;
        c.barrier()?;
        Ok((vals(part), vals(b)))
    });
    let want = [vec![3.0, 6.0, 9.0], vec![12.0, 15.0], vec![18.0, 21.0]];
    for (r, o) in out.into_iter().enumerate() {
        let (part, b) = o.unwrap();
        assert_eq!(part, want[r]);
        assert_eq!(b, vec![2.0, 2.0]);
    }
}

#[test]
fn collectives_on_gpu_devices_match_the_host() {
    let Some(devs) = gpus(2) else { return };
    let out = on_ranks(2, |r, c| {
        let x = Tensor::rand(-1.0, 1.0, &[5, 3], r as u64, &devs[r])?;
        let y = c.all_reduce(&x, ReduceKind::Sum)?;
        assert!(y.device() == &devs[r]);
        Ok(vals(y))
    });
    let a = vals(Tensor::rand(-1.0, 1.0, &[5, 3], 0, &Device::Cpu).unwrap());
    let b = vals(Tensor::rand(-1.0, 1.0, &[5, 3], 1, &Device::Cpu).unwrap());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    for o in out {
        assert_eq!(o.unwrap(), want);
    }
}

fn gpus(n: usize) -> Option<Vec<Device>> {
    match DeviceMesh::virtual_gpus(n) {
        Ok(m) => Some(m.devices().to_vec()),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI=true but no GPU adapter: {e}"),
        Err(e) => {
            eprintln!("note: skipping a GPU test, no adapter: {e}");
            None
        }
    }
}

#[test]
fn a_rank_that_fails_stops_every_rank_within_a_second() {
    let start = Instant::now();
    let out = on_ranks(4, |r, c| {
        let x = Tensor::ones(&[4], &Device::Cpu)?;
        c.all_reduce(&x, ReduceKind::Sum)?;
        if r == 2 {
            return Err(Error::Msg("rank 2 ran out of patience".into()));
        }
        // The others wait in the next collective for a rank that never comes.
        c.all_reduce(&x, ReduceKind::Sum)?;
        Ok(())
    });
    assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
    for (r, o) in out.into_iter().enumerate() {
        let e = o.unwrap_err().to_string();
        assert!(e.contains("rank 2 ran out of patience"), "rank {r}: {e}");
    }
}

#[test]
fn a_rank_that_returns_without_joining_a_collective_fails_the_others_in_bounded_time() {
    let start = Instant::now();
    let out = on_ranks(3, |r, c| {
        let x = Tensor::ones(&[4], &Device::Cpu)?;
        c.all_reduce(&x, ReduceKind::Sum)?;
        if r == 1 {
            return Ok(()); // returns Ok, skipping the collective below
        }
        c.all_reduce(&x, ReduceKind::Sum)?;
        Ok(())
    });
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    // Every rank gets an Err: the one that left early finished a computation that failed.
    let e = out[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("rank 1 finished, but rank 0 failed"), "{e}");
    for r in [0, 2] {
        let e = out[r].as_ref().unwrap_err().to_string();
        assert!(e.contains("returned without joining"), "rank {r}: {e}");
    }
}

#[test]
fn mismatched_collectives_are_an_error_not_a_deadlock() {
    let out = on_ranks(2, |r, c| {
        let x = Tensor::ones(&[4], &Device::Cpu)?;
        if r == 0 { c.all_reduce(&x, ReduceKind::Sum).map(drop) } else { c.all_gather(&x, 0).map(drop) }
    });
    let msgs: Vec<String> = out.into_iter().map(|o| o.unwrap_err().to_string()).collect();
    assert!(msgs.iter().any(|m| m.contains("all_gather") && m.contains("all_reduce")), "{msgs:?}");
}

#[test]
fn a_rank_that_errs_or_panics_mid_step_fails_the_whole_sharded_model_promptly() {
    let net = || Sequential::new().add(Dense::new(32).activation(Activation::Relu)).add(Dense::new(4));
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 3, 1).unwrap();
    let x = Tensor::rand(-1.0, 1.0, &[8, 6], 0, &Device::Cpu).unwrap();
    let y = Tensor::zeros(&[8, 4], &Device::Cpu).unwrap();
    for panics in [false, true] {
        let mut model = ShardedModel::new(net, &DeviceMesh::cpus(3).unwrap(), &plan).unwrap();
        model.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
        let start = Instant::now();
        let res = model.run(|r, m| {
            if r == 1 {
                // Mid-step: after the forward pass's first collective has run on every rank.
                m.call(&x)?;
                if panics {
                    panic!("rank 1 broke");
                }
                return Err(Error::Msg("rank 1 broke".into()));
            }
            m.call(&x)?;
            m.train_on_batch(&x, &y)
        });
        assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
        let e = res.unwrap_err().to_string();
        assert!(e.contains("rank 1") && e.contains("broke"), "{e}");
        // No rank had updated its weights: the model carries on, its ranks in step.
        model.train_on_batch(&x, &y).unwrap();
        let steps: Vec<u64> = model.ranks().iter().map(|m| m.optimizer().unwrap().iterations()).collect();
        assert_eq!(steps, vec![1, 1, 1]);
    }
}

#[test]
fn bad_meshes_and_plans_are_errors() {
    let net = || Sequential::new().add(Dense::new(8));
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[2, 4], 2, 1).unwrap();
    let e = ShardedModel::new(net, &DeviceMesh::cpus(3).unwrap(), &plan).err().unwrap().to_string();
    assert!(e.contains("1 data x 2 model") && e.contains("1 x 3"), "{e}");
    let e = DeviceMesh::new(vec![Device::Cpu; 3], &[2, 2], &["data", "model"]).unwrap_err().to_string();
    assert!(e.contains("3 devices"), "{e}");
    let other = || Sequential::new().add(Dense::new(6));
    let e = ShardedModel::new(other, &DeviceMesh::cpus(2).unwrap(), &plan).err().unwrap().to_string();
    assert!(e.contains("sequential/dense/kernel"), "{e}");
}

#[test]
fn a_rank_that_panics_outside_any_collective_stops_the_others() {
    let start = Instant::now();
    let out = InHost::run(3, |r, c| {
        if r == 0 {
            panic!("rank 0 broke before its first collective");
        }
        c.all_reduce(&Tensor::ones(&[2], &Device::Cpu)?, ReduceKind::Sum).map(drop)
    });
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(out.iter().all(|o| o.is_err()));
}

#[test]
fn a_batch_the_data_axis_cannot_split_is_refused_before_training() {
    let net = || Sequential::new().add(Dense::new(4));
    let mesh = DeviceMesh::cpus(2).unwrap().reshape(&[2, 1], &["data", "model"]).unwrap();
    let plan = AutoConfig::new().plan(&net(), &[4, 3], 1, 2).unwrap();
    let mut model = ShardedModel::new(net, &mesh, &plan).unwrap();
    model.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    let x = Tensor::zeros(&[33, 3], &Device::Cpu).unwrap();
    let y = Tensor::zeros(&[33, 4], &Device::Cpu).unwrap();
    let opts = weft_nn::FitOptions { batch_size: 32, verbose: false, ..Default::default() };
    let e = model.fit(&x, &y, opts).unwrap_err().to_string();
    assert!(e.contains("last batch") && e.contains("1 samples"), "{e}");
    let steps: Vec<u64> = model.ranks().iter().map(|m| m.optimizer().unwrap().iterations()).collect();
    assert_eq!(steps, vec![0, 0], "nothing trained");
}
