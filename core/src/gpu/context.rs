//! One open GPU device: its queue, pipeline cache, buffer pool and the batch of recorded work.
//!
//! Kernels are not submitted one by one. `dispatch` records a pipeline, a bind group and a grid;
//! every `FLUSH_EVERY` dispatches, and before every read-back, the batch is replayed into one
//! command encoder and one compute pass and submitted. A recorded dispatch holds its buffers, so
//! a tensor dropped before the batch runs cannot have its buffer reused too early.

use super::pool::{self, MemoryStats, Pool, PooledBuffer};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Dispatches recorded before a submit.
const FLUSH_EVERY: usize = 64;

/// Workgroups of a one-dimensional kernel: 262,144 invocations fill the largest GPUs, and few
/// workgroups keep lavapipe's per-workgroup cost (it runs them as CPU tasks) negligible.
const MAX_1D_GROUPS: usize = 1024;

/// A compiled kernel entry point and its bind group layout, fetched once rather than per dispatch.
struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

struct Recorded {
    kernel: Arc<Kernel>,
    bind_group: wgpu::BindGroup,
    groups: [u32; 3],
    _hold: Vec<Arc<PooledBuffer>>,
}

/// An open device on one adapter. Several may be open on the same adapter ("virtual devices").
pub struct GpuContext {
    pub(crate) ordinal: usize,
    pub(crate) adapter_index: usize,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    pub(crate) features: wgpu::Features,
    pipelines: Mutex<HashMap<String, Arc<Kernel>>>,
    pool: Pool,
    pending: Mutex<Vec<Recorded>>,
    /// Raised by index kernels on an out-of-range index; checked at every read-back.
    pub(crate) fault: Arc<PooledBuffer>,
    errors: Arc<Mutex<Vec<String>>>,
    /// A matmul variant forced on this device (tests, benchmarks); `None`: the autotuner's choice.
    matmul: Mutex<Option<super::matmul::MatmulVariant>>,
}

static ORDINALS: AtomicUsize = AtomicUsize::new(0);

impl GpuContext {
    /// Open a device on `adapter`, asking for everything it offers that weft uses.
    pub(crate) fn open(adapter: &wgpu::Adapter, adapter_index: usize) -> Result<Self> {
        let features = adapter.features() & wgpu::Features::SHADER_F16;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("weft"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Gpu(format!("could not open a device on {}: {e}", adapter.get_info().name)))?;
        // Errors the GPU reports asynchronously are kept and returned at the next read-back,
        // instead of wgpu's default of panicking.
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(e.to_string());
        }));
        let fault_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("weft fault flag"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(GpuContext {
            ordinal: ORDINALS.fetch_add(1, Ordering::Relaxed),
            adapter_index,
            info: adapter.get_info(),
            device,
            queue,
            limits,
            features,
            pipelines: Mutex::default(),
            pool: Pool::default(),
            pending: Mutex::default(),
            fault: Arc::new(pool::unpooled(fault_buf, 16)),
            errors,
            matmul: Mutex::default(),
        })
    }

    /// The largest buffer a kernel can bind.
    pub(crate) fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// A buffer of at least `bytes` from the pool, or a new one.
    pub(crate) fn alloc(&self, bytes: u64) -> Result<Arc<PooledBuffer>> {
        let cap = self.max_binding();
        if bytes > cap {
            return Err(Error::TooLarge { bytes, limit: cap, what: "largest storage buffer binding" });
        }
        let size = pool::bucket(bytes, cap);
        let reused = self.pool.lock().unwrap_or_else(|p| p.into_inner()).take(size);
        let buffer = match reused {
            Some(b) => b,
            None => match self.create(size) {
                Ok(b) => b,
                Err(_) => {
                    // Give the pooled buffers back to the driver and try once more.
                    self.pool.lock().unwrap_or_else(|p| p.into_inner()).trim();
                    self.create(size)?
                }
            },
        };
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).lend(size, bytes);
        Ok(Arc::new(pool::loan(&self.pool, buffer, size, bytes)))
    }

    fn create(&self, size: u64) -> Result<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            None => Ok(buffer),
            Some(_) => Err(Error::OutOfMemory { bytes: size, device: self.describe() }),
        }
    }

    /// Upload host bytes into a new buffer.
    pub(crate) fn upload(&self, bytes: &[u8]) -> Result<Arc<PooledBuffer>> {
        let buf = self.alloc(bytes.len() as u64)?;
        // write_buffer needs a multiple of 4 bytes.
        if bytes.len().is_multiple_of(4) {
            self.queue.write_buffer(&buf.buffer, 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(&buf.buffer, 0, &padded);
        }
        Ok(buf)
    }

    /// The compiled pipeline of a kernel's entry point, compiling it on first use.
    fn pipeline(&self, kernel: &str, entry: &str) -> Result<Arc<Kernel>> {
        let key = format!("{kernel}#{entry}");
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let src = weft_shaders::source(kernel).ok_or_else(|| Error::Gpu(format!("no kernel named {kernel}")))?;
        if src.starts_with("enable f16") && !self.features.contains(wgpu::Features::SHADER_F16) {
            return Err(Error::Gpu(format!(
                "kernel {kernel} needs the adapter feature shader-f16, which {} lacks",
                self.info.name
            )));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(kernel),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&key),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("kernel {key} failed to compile: {e}")));
        }
        let layout = pipeline.get_bind_group_layout(0);
        let p = Arc::new(Kernel { pipeline, layout });
        self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).insert(key, p.clone());
        Ok(p)
    }

    /// Record one dispatch of `kernel`'s `entry` with `info` at binding 0 and `buffers` at 1, 2, ...
    pub(crate) fn dispatch(
        &self,
        kernel: &str,
        entry: &str,
        info: &[u32],
        buffers: &[&Arc<PooledBuffer>],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let max = self.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::Gpu(format!(
                "{kernel}: grid {groups:?} exceeds the adapter's {max} workgroups per dimension"
            )));
        }
        let pipeline = self.pipeline(kernel, entry)?;
        let info_buf = self.upload(bytemuck::cast_slice(info))?;
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: info_buf.buffer.as_entire_binding() }];
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.buffer.as_entire_binding() });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.layout,
            entries: &entries,
        });
        let mut hold: Vec<Arc<PooledBuffer>> = buffers.iter().map(|b| Arc::clone(b)).collect();
        hold.push(info_buf);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push(Recorded { kernel: pipeline, bind_group, groups, _hold: hold });
        if pending.len() >= FLUSH_EVERY {
            let batch = self.submit_locked(&mut pending, |_| ());
            drop(pending);
            drop(batch);
        }
        Ok(())
    }

    /// The grid of a one-dimensional kernel over `n` elements: 256-wide workgroups, at most
    /// `MAX_1D_GROUPS` of them; the kernels loop over the rest (`grid_size` in common.wgsl).
    pub(crate) fn grid_1d(&self, n: usize) -> [u32; 3] {
        self.grid_for(n.div_ceil(256).min(MAX_1D_GROUPS))
    }

    /// A grid of `groups` workgroups, spread over x and y when x alone would exceed the limit.
    pub(crate) fn grid_for(&self, groups: usize) -> [u32; 3] {
        let max = self.limits.max_compute_workgroups_per_dimension as usize;
        if groups <= max { [groups as u32, 1, 1] } else { [max as u32, groups.div_ceil(max) as u32, 1] }
    }

    fn replay(encoder: &mut wgpu::CommandEncoder, batch: &[Recorded]) {
        if batch.is_empty() {
            return;
        }
        let mut pass = encoder.begin_compute_pass(&Default::default());
        for r in batch {
            pass.set_pipeline(&r.kernel.pipeline);
            pass.set_bind_group(0, &r.bind_group, &[]);
            pass.dispatch_workgroups(r.groups[0], r.groups[1], r.groups[2]);
        }
    }

    /// Replay the recorded batch, then `extra` commands, into one encoder and submit it, all while
    /// the caller holds the `pending` lock: submits from several threads then reach the queue in
    /// the order their work was recorded (a read-back can never overtake the dispatches it reads).
    /// Returns the batch, whose buffers go back to the pool when the caller drops it.
    fn submit_locked(
        &self,
        pending: &mut Vec<Recorded>,
        extra: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Vec<Recorded> {
        let batch = std::mem::take(pending);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        Self::replay(&mut encoder, &batch);
        extra(&mut encoder);
        self.queue.submit([encoder.finish()]);
        batch
    }

    /// Submit everything recorded so far.
    pub fn flush(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() {
            return;
        }
        let batch = self.submit_locked(&mut pending, |_| ());
        drop(pending);
        drop(batch);
    }

    /// Wait for all submitted work and return any error the GPU reported.
    pub fn synchronize(&self) -> Result<()> {
        self.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for {}: {e}", self.describe())))?;
        self.take_errors()
    }

    fn take_errors(&self) -> Result<()> {
        let mut errs = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        if msg.to_lowercase().contains("out of memory") {
            return Err(Error::OutOfMemory { bytes: 0, device: format!("{} ({msg})", self.describe()) });
        }
        Err(Error::Gpu(msg))
    }

    /// Read `len` bytes at byte `offset` of a buffer: submits the batch, copies into a staging
    /// buffer, waits, and checks the fault flag and the error log.
    pub(crate) fn read(&self, buf: &PooledBuffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        let start = offset & !3;
        let end = (offset + len).div_ceil(4) * 4;
        let size = (end - start).max(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("weft read-back"),
            size: size + 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let batch = self.submit_locked(&mut pending, |encoder| {
            if end > start {
                encoder.copy_buffer_to_buffer(&buf.buffer, start, &staging, 0, end - start);
            }
            encoder.copy_buffer_to_buffer(&self.fault.buffer, 0, &staging, size, 16);
            encoder.clear_buffer(&self.fault.buffer, 0, None);
        });
        drop(pending);
        drop(batch);
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for {}: {e}", self.describe())))?;
        self.take_errors()?;
        rx.recv()
            .map_err(|_| Error::Gpu("read-back was dropped".into()))?
            .map_err(|e| Error::Gpu(format!("mapping a read-back buffer: {e}")))?;
        let view = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("read-back: {e}")))?;
        let fault = u32::from_le_bytes(view[size as usize..size as usize + 4].try_into().unwrap());
        let lo = (offset - start) as usize;
        let out = view[lo..lo + len as usize].to_vec();
        drop(view);
        staging.unmap();
        if fault != 0 {
            return Err(Error::invalid(
                "index",
                "an index_select, gather, index_add or scatter_add on this device got an index past the end of its axis",
            ));
        }
        Ok(out)
    }

    /// Index of the adapter this device was opened on (the `N` of `gpu:N`).
    pub fn adapter_index(&self) -> usize {
        self.adapter_index
    }

    /// Use the matmul kernel named `kernel` (see `MATMUL_VARIANTS`) on this device instead of the
    /// autotuner's choice; for tests and benchmarks.
    pub fn force_matmul(&self, kernel: &str) -> Result<()> {
        let v = super::matmul::MATMUL_VARIANTS.iter().find(|v| v.kernel == kernel);
        let v = v.ok_or_else(|| Error::invalid("force_matmul", format!("no matmul kernel named {kernel}")))?;
        *self.matmul.lock().unwrap_or_else(|p| p.into_inner()) = Some(*v);
        Ok(())
    }

    pub(crate) fn forced_matmul(&self) -> Option<super::matmul::MatmulVariant> {
        *self.matmul.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current memory figures of this device.
    pub fn memory_stats(&self) -> MemoryStats {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).stats
    }

    /// Release pooled buffers to the driver.
    pub fn trim(&self) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).trim();
    }

    /// e.g. `gpu:0 (llvmpipe (LLVM 15.0.6, 256 bits), Vulkan, Cpu)`.
    pub fn describe(&self) -> String {
        format!("gpu:{} ({}, {:?}, {:?})", self.adapter_index, self.info.name, self.info.backend, self.info.device_type)
    }
}
