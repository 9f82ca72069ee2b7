//! Where tensors live: a GPU (through wgpu), the Cpu reference backend, or Meta (shapes only).

use crate::gpu::{self, GpuContext, MemoryStats};
use crate::{Error, Result};
use std::sync::{Arc, OnceLock};

/// A device tensors are created on. Cheap to clone; two clones of one GPU device compare equal.
#[derive(Clone)]
pub enum Device {
    /// The plain-Rust reference backend (rayon): the test oracle and the fallback.
    Cpu,
    /// One wgpu device on one adapter.
    Gpu(Arc<GpuContext>),
    /// Shapes only: no data, no allocation. For tracing and planning models of any size.
    Meta,
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) | (Device::Meta, Device::Meta) => true,
            (Device::Gpu(a), Device::Gpu(b)) => a.ordinal == b.ordinal,
            _ => false,
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// What `devices()` reports about one adapter.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// The `N` of `gpu:N` and `WEFT_DEVICE=gpu:N`.
    pub index: usize,
    /// The adapter's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Vulkan, Metal, Dx12 or Gl.
    pub backend: String,
    /// DiscreteGpu, IntegratedGpu, Cpu (a software adapter) ...
    pub device_type: String,
    /// True for software adapters such as lavapipe.
    pub is_software: bool,
    /// Whether f16 kernels are available.
    pub shader_f16: bool,
    /// Largest buffer a kernel can bind, in bytes.
    pub max_storage_binding: u64,
    /// Workgroups per grid dimension.
    pub max_workgroups_per_dim: u32,
    /// Workgroup memory, in bytes.
    pub max_workgroup_storage: u32,
}

/// Every adapter wgpu finds, with the limits and features weft cares about.
///
/// ```
/// for a in weft_core::devices() {
///     println!("gpu:{} {} ({})", a.index, a.name, a.backend);
/// }
/// ```
pub fn devices() -> Vec<AdapterSummary> {
    gpu::adapters()
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let info = a.get_info();
            let limits = a.limits();
            AdapterSummary {
                index,
                name: info.name.clone(),
                backend: format!("{:?}", info.backend),
                device_type: format!("{:?}", info.device_type),
                is_software: info.device_type == wgpu::DeviceType::Cpu,
                shader_f16: a.features().contains(wgpu::Features::SHADER_F16),
                max_storage_binding: limits.max_storage_buffer_binding_size,
                max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
                max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            }
        })
        .collect()
}

/// Rank adapters for `Device::default()`: hardware before software, discrete before integrated,
/// native APIs before GL.
fn best_adapter(allow_software: bool) -> Option<usize> {
    devices()
        .into_iter()
        .filter(|a| allow_software || !a.is_software)
        .min_by_key(|a| {
            let kind = match a.device_type.as_str() {
                "DiscreteGpu" => 0,
                "IntegratedGpu" => 1,
                "VirtualGpu" => 2,
                "Cpu" => 4,
                _ => 3,
            };
            (kind, a.backend == "Gl", a.index)
        })
        .map(|a| a.index)
}

impl Device {
    /// Open a new device on adapter `index` (see [`devices`]). Every call opens another device,
    /// so several "virtual GPUs" can share one adapter.
    pub fn gpu(index: usize) -> Result<Device> {
        Ok(Device::Gpu(gpu::open(index)?))
    }

    /// A new device on the best adapter, software ones (lavapipe) included.
    pub fn best_gpu() -> Result<Device> {
        let i = best_adapter(true).ok_or_else(|| Error::NoAdapter("wgpu found no adapter".into()))?;
        Device::gpu(i)
    }

    /// Parse `cpu`, `meta`, `gpu` (best adapter) or `gpu:N`.
    pub fn parse(s: &str) -> Result<Device> {
        match s.trim() {
            "cpu" => Ok(Device::Cpu),
            "meta" => Ok(Device::Meta),
            "gpu" => Device::best_gpu(),
            other => match other.strip_prefix("gpu:").and_then(|n| n.parse().ok()) {
                Some(n) => Device::gpu(n),
                None => Err(Error::invalid("Device::parse", format!("{other:?} is not cpu, gpu, gpu:N or meta"))),
            },
        }
    }

    /// The device `WEFT_DEVICE` names (`cpu`, `gpu`, `gpu:N`, `meta`), or, when it is unset, what
    /// [`Device::default`] picks. A value that does not parse or names an adapter that cannot be
    /// opened (`gpu:99`, `banana`) is an `Err` naming it, never a silent fall-back.
    ///
    /// ```
    /// // With WEFT_DEVICE unset this is Device::default().
    /// let dev = weft_core::Device::from_env()?;
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn from_env() -> Result<Device> {
        match std::env::var("WEFT_DEVICE") {
            Ok(s) => Device::parse(&s).map_err(|e| Error::invalid("WEFT_DEVICE", format!("WEFT_DEVICE={s}: {e}"))),
            Err(_) => Ok(Device::default()),
        }
    }

    /// The device programs use unless told otherwise: `WEFT_DEVICE` if set (`cpu`, `gpu`, `gpu:N`),
    /// else the best hardware GPU adapter, else Cpu. Software adapters are used only when asked
    /// for. Opened once per process; the choice is printed to stderr once. A `WEFT_DEVICE` that
    /// cannot be honoured falls back to the Cpu with a line on stderr; [`Device::from_env`] makes
    /// it an `Err` instead, which is what the examples use.
    ///
    /// ```
    /// let dev = weft_core::Device::default();
    /// println!("running on {dev:?}");
    /// ```
    #[allow(clippy::should_implement_trait)]
    pub fn default() -> Device {
        static DEFAULT: OnceLock<Device> = OnceLock::new();
        DEFAULT
            .get_or_init(|| {
                let (dev, why) = match std::env::var("WEFT_DEVICE") {
                    Ok(s) => match Device::parse(&s) {
                        Ok(d) => (d, format!("WEFT_DEVICE={s}")),
                        Err(e) => (Device::Cpu, format!("WEFT_DEVICE={s} failed ({e}); falling back")),
                    },
                    Err(_) => match best_adapter(false).map(Device::gpu) {
                        Some(Ok(d)) => (d, "best hardware adapter".into()),
                        Some(Err(e)) => (Device::Cpu, format!("the GPU failed to open ({e})")),
                        None => (Device::Cpu, "no hardware GPU adapter; set WEFT_DEVICE=gpu for a software one".into()),
                    },
                };
                eprintln!("weft: using {} ({why})", dev.describe());
                dev
            })
            .clone()
    }

    /// A short description, e.g. `cpu` or `gpu:0 (llvmpipe ..., Vulkan, Cpu)`.
    pub fn describe(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Meta => "meta".into(),
            Device::Gpu(c) => c.describe(),
        }
    }

    /// The device's arithmetic ceiling in FLOP/s, measured now: on a GPU a kernel of
    /// independent multiply-adds ([`gpu::fma_peak`]), on the Cpu the same at the vector width
    /// weft's product kernel uses, on as many threads at once as the Cpu ops work on (this one
    /// and others it starts; best of 6 windows of 50 ms). Benchmarks report products as a share
    /// of it. Like any Cpu op it sizes itself by rayon's pool: a program that calls
    /// [`set_num_threads`](crate::set_num_threads) calls it first. `Err` on [`Device::Meta`],
    /// which computes nothing.
    ///
    /// ```no_run
    /// use weft_core::Device;
    /// let peak = Device::Cpu.fma_peak()?;
    /// println!("{:.0} GFLOP/s", peak / 1e9);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn fma_peak(&self) -> Result<f64> {
        match self {
            Device::Cpu => {
                Ok(crate::cpu::fma_peak(rayon::current_num_threads(), 6, std::time::Duration::from_millis(50)))
            }
            Device::Gpu(ctx) => gpu::fma_peak(ctx),
            Device::Meta => {
                Err(Error::invalid("fma_peak", "the meta device computes nothing: it has no arithmetic rate"))
            }
        }
    }

    /// Whether this is a GPU device.
    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Gpu(_))
    }

    /// Memory figures of a GPU device (zero for Cpu and Meta).
    pub fn memory_stats(&self) -> MemoryStats {
        match self {
            Device::Gpu(c) => c.memory_stats(),
            _ => MemoryStats::default(),
        }
    }

    /// Wait for all queued work; returns any error the GPU reported.
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Device::Gpu(c) => c.synchronize(),
            _ => Ok(()),
        }
    }

    /// Whether f16 tensors can be computed on (always true on Cpu).
    pub fn supports_f16(&self) -> bool {
        match self {
            Device::Gpu(c) => c.features.contains(wgpu::Features::SHADER_F16),
            _ => true,
        }
    }
}
