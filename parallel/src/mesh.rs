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
    devices: Vec<Device>,
    shape: Vec<usize>,
    names: Vec<String>,
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
        Ok(DeviceMesh { devices, shape: shape.to_vec(), names: names.iter().map(|s| s.to_string()).collect() })
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
        DeviceMesh::new(self.devices, shape, names)
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether the mesh has no devices (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The devices in rank order.
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
        format!("{} ({}): {}", dims.join(" x "), self.names.join(" x "), devs.join(", "))
    }
}
