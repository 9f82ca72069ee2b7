//! `DeviceMesh`: the devices of a sharded model, arranged on named axes.

use weft_core::{Device, Error, Result};

/// Devices on named axes, in row-major order: on a `[2, 2]` mesh named `("data", "model")`,
/// rank 3 is data 1, model 1. The `model` axis splits weights; the `data` axis splits batches.
/// An axis a mesh does not name has size 1.
///
/// ```
/// use weft_core::Device;
/// use weft_parallel::DeviceMesh;
/// let mesh = DeviceMesh::new(vec![Device::Cpu; 4], &[2, 2], &["data", "model"])?;
/// assert_eq!((mesh.size("data"), mesh.size("model"), mesh.len()), (2, 2, 4));
/// assert_eq!(mesh.coords(3), (1, 1));
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct DeviceMesh {
    /// This process's devices: all of them, unless the mesh spans processes.
    devices: Vec<Device>,
    shape: Vec<usize>,
    names: Vec<String>,
    /// The processes a mesh spans (feature `mpi`): process p holds ranks p * L .. (p + 1) * L.
    #[cfg(feature = "mpi")]
    procs: Option<crate::mpi::Procs>,
}

impl DeviceMesh {
    /// `devices` laid out as `shape` (row-major), each axis named. Devices may be GPUs, Cpus or a mix.
    pub fn new(devices: Vec<Device>, shape: &[usize], names: &[&str]) -> Result<Self> {
        if shape.len() != names.len() || shape.iter().product::<usize>() != devices.len() || devices.is_empty() {
            return Err(Error::invalid(
                "DeviceMesh::new",
                format!("{} devices do not fill a mesh of shape {shape:?} with axes {names:?}", devices.len()),
            ));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(Error::invalid("DeviceMesh::new", format!("axis name {n:?} is used twice in {names:?}")));
            }
        }
        if let Some(d) = devices.iter().find(|d| matches!(d, Device::Meta)) {
            return Err(Error::invalid(
                "DeviceMesh::new",
                format!("{} holds no data and cannot be in a mesh", d.describe()),
            ));
        }
        Ok(DeviceMesh {
            devices,
            shape: shape.to_vec(),
            names: names.iter().map(|s| s.to_string()).collect(),
            #[cfg(feature = "mpi")]
            procs: None,
        })
    }

    /// A mesh over the devices of every process of an MPI job: each process passes its own
    /// `local` devices (the same number everywhere), and process p holds ranks p * L to
    /// (p + 1) * L - 1 in row-major order, so on a `("data", "model")` mesh with L dividing the
    /// model axis, the model axis stays inside a host and the data axis crosses hosts (Megatron's
    /// layout). Every process must call this together; processes that disagree on the shape or
    /// the device count get `Err` naming what differs.
    ///
    /// A group of ranks (one model or data group) may lie inside one process (an in-host group),
    /// have one rank in each of its processes (an MPI communicator), or k ranks in each (an
    /// in-host group per process and an MPI communicator per position: a model axis wider than
    /// a host). A mesh with a group spread unevenly over its processes is refused, naming it.
    #[cfg(feature = "mpi")]
    pub fn across_processes(
        procs: &crate::mpi::Procs,
        local: Vec<Device>,
        shape: &[usize],
        names: &[&str],
    ) -> Result<Self> {
        let l = local.len();
        let total: usize = shape.iter().product();
        let digest = shape.iter().fold(shape.len() as u64, |h, &d| h.wrapping_mul(1_000_003) ^ d as u64);
        procs.agree(
            "DeviceMesh::across_processes",
            &[
                ("devices per process", l as u64),
                ("the mesh shape", digest),
                ("the axis names", crate::mpi::digest_text(&names.join("\u{0}"))),
            ],
        )?;
        if l == 0 || l * procs.size() != total {
            return Err(Error::invalid(
                "DeviceMesh::across_processes",
                format!(
                    "{} processes of {l} devices each do not fill a mesh of shape {shape:?} with axes {names:?}",
                    procs.size()
                ),
            ));
        }
        let full = DeviceMesh::new(vec![local[0].clone(); total], shape, names)?;
        let mesh = DeviceMesh { devices: local, procs: Some(procs.clone()), ..full };
        for kind in ["model", "data"] {
            for g in 0..total {
                mesh.group_place(kind, g)?;
            }
        }
        Ok(mesh)
    }

    /// The processes the mesh spans, if it spans several.
    #[cfg(feature = "mpi")]
    pub fn procs(&self) -> Option<&crate::mpi::Procs> {
        self.procs.as_ref()
    }

    /// Where the `kind` ("model" or "data") group of rank `g` lies: `Ok(None)` inside one
    /// process, `Ok(Some(k))` with k ranks in each of its processes, the i-th of each at the same
    /// local index (one MPI communicator per position; with k > 1, an in-host group in each
    /// process too). Any other group is refused.
    #[cfg(feature = "mpi")]
    pub(crate) fn group_place(&self, kind: &str, g: usize) -> Result<Option<usize>> {
        let l = self.devices.len();
        let members = self.group(kind, g);
        let procs: Vec<usize> = members.iter().map(|m| m / l).collect();
        if procs.iter().all(|&p| p == procs[0]) {
            return Ok(None);
        }
        // Ranks come in process order, so a regular group is runs of k from distinct processes.
        let k = procs.iter().take_while(|&&p| p == procs[0]).count();
        let runs: Vec<&[usize]> = members.chunks(k).collect();
        let regular = members.len().is_multiple_of(k)
            && runs.iter().all(|r| r.iter().all(|m| m / l == r[0] / l))
            && runs.windows(2).all(|w| w[0][0] / l != w[1][0] / l)
            && runs.iter().all(|r| r.iter().zip(runs[0]).all(|(a, b)| a % l == b % l));
        if regular {
            return Ok(Some(k));
        }
        Err(Error::invalid(
            "DeviceMesh::across_processes",
            format!(
                "the {kind} group of ranks {members:?} lies on processes {procs:?} ({l} devices each): a group must lie inside one process, or have the same number of ranks in each of its processes at the same local indices; make the devices per process divide the model axis, or the model axis divide them"
            ),
        ))
    }

    /// The ranks of the `kind` ("model" or "data") group that rank `g` belongs to, in group order.
    pub(crate) fn group(&self, kind: &str, g: usize) -> Vec<usize> {
        let (m, d) = (self.size("model"), self.size("data"));
        let (di, mi) = self.coords(g);
        if kind == "model" { (0..m).map(|j| di * m + j).collect() } else { (0..d).map(|i| i * m + mi).collect() }
    }

    /// This process's ranks: (rank in the mesh, device).
    pub fn local_ranks(&self) -> Vec<(usize, Device)> {
        let first = self.process() * self.devices.len();
        self.devices.iter().cloned().enumerate().map(|(i, d)| (first + i, d)).collect()
    }

    /// This process's index among the processes the mesh spans (0 for a mesh in one process).
    pub fn process(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(p) = &self.procs {
            return p.rank();
        }
        0
    }

    /// One device per GPU adapter, on one `model` axis. wgpu lists an adapter once per backend
    /// (Vulkan and GL, say): adapters of the native backends (Vulkan, Metal, DX12) are taken, and
    /// a GL adapter only when no native one has its name. Software adapters (lavapipe) are left
    /// out when there is hardware.
    pub fn gpus() -> Result<Self> {
        let all = weft_core::devices();
        let hardware = all.iter().any(|a| !a.is_software);
        let keep = |a: &&weft_core::AdapterSummary| !hardware || !a.is_software;
        let native: Vec<&weft_core::AdapterSummary> = all.iter().filter(|a| a.backend != "Gl").filter(keep).collect();
        let gl =
            all.iter().filter(|a| a.backend == "Gl").filter(keep).filter(|a| !native.iter().any(|n| n.name == a.name));
        let chosen: Vec<&weft_core::AdapterSummary> = native.iter().copied().chain(gl).collect();
        if chosen.is_empty() {
            return Err(Error::NoAdapter("DeviceMesh::gpus: wgpu found no adapter".into()));
        }
        let devices = chosen.iter().map(|a| Device::gpu(a.index)).collect::<Result<Vec<_>>>()?;
        let n = devices.len();
        DeviceMesh::new(devices, &[n], &["model"])
    }

    /// `n` devices opened on the best adapter (each its own queue and memory pool): how several
    /// GPUs are tested on a machine with one.
    pub fn virtual_gpus(n: usize) -> Result<Self> {
        let devices = (0..n).map(|_| Device::best_gpu()).collect::<Result<Vec<_>>>()?;
        DeviceMesh::new(devices, &[n], &["model"])
    }

    /// `n` Cpu devices on one `model` axis (each rank computes on the host).
    pub fn cpus(n: usize) -> Result<Self> {
        DeviceMesh::new(vec![Device::Cpu; n], &[n], &["model"])
    }

    /// The same devices laid out on another shape.
    pub fn reshape(self, shape: &[usize], names: &[&str]) -> Result<Self> {
        #[cfg(feature = "mpi")]
        if let Some(p) = &self.procs {
            return DeviceMesh::across_processes(p, self.devices, shape, names);
        }
        DeviceMesh::new(self.devices, shape, names)
    }

    /// Number of ranks (devices), over every process the mesh spans.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the mesh has no devices (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The devices in rank order: this process's, when the mesh spans processes.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The mesh's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The axis names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Size of the axis `name` (1 when the mesh has no such axis).
    pub fn size(&self, name: &str) -> usize {
        self.names.iter().position(|n| n == name).map_or(1, |i| self.shape[i])
    }

    /// (data index, model index) of `rank`.
    pub fn coords(&self, rank: usize) -> (usize, usize) {
        let m = self.size("model");
        (rank / m % self.size("data"), rank % m)
    }

    /// One line: `2 x 2 (data x model): gpu:0 llvmpipe, ...`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        let devs: Vec<String> = self.devices.iter().map(|d| d.describe()).collect();
        #[cfg(feature = "mpi")]
        if let Some(p) = &self.procs {
            return format!(
                "{} ({}) over {} processes, {} devices each; process {}: {}",
                dims.join(" x "),
                self.names.join(" x "),
                p.size(),
                self.devices.len(),
                p.rank(),
                devs.join(", ")
            );
        }
        format!("{} ({}): {}", dims.join(" x "), self.names.join(" x "), devs.join(", "))
    }
}
