//! One open GPU device: its queue, pipeline cache, buffer pool and the batch of recorded work.
//!
//! Kernels are not submitted one by one. `dispatch` records a pipeline, a bind group and a grid;
//! every `FLUSH_EVERY` dispatches, when the batch's info arena fills, and before every read-back,
//! the batch is replayed into one command encoder and one compute pass and submitted. A recorded dispatch holds its buffers, so
//! a tensor dropped before the batch runs cannot have its buffer reused too early. The batch's
//! `info` words share one buffer, written as the batch is submitted (`info_arena.rs`).
//!
//! Index kernels record bad indices in fault slots of their own (see `fault.rs`); every read-back
//! settles the outstanding slots and fails only when the storage it reads depends on a faulted one.

use super::fault::{FaultSlot, SLOT_BYTES, Seen};
use super::info_arena::InfoArena;
use super::pool::{self, MemoryStats, Pool, PooledBuffer};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Dispatches recorded before a submit.
const FLUSH_EVERY: usize = 64;

/// Fault slots left outstanding before a dispatch settles them (a sync): bounds their memory in
/// a program that never reads anything back.
const MAX_OUTSTANDING: usize = 1024;

/// Workgroups of a one-dimensional kernel: 262,144 invocations fill the largest GPUs, and few
/// workgroups keep lavapipe's per-workgroup cost (it runs them as CPU tasks) negligible.
pub(super) const MAX_1D_GROUPS: usize = 1024;

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

/// Work recorded but not yet submitted, and fault slots whose dispatches were recorded but not
/// yet settled by a read-back. One lock guards both, so a read-back settles exactly the slots of
/// the dispatches it submits (or submitted earlier).
#[derive(Default)]
struct Pending {
    recorded: Vec<Recorded>,
    /// The recorded dispatches' `info` words, written when they are submitted.
    arena: Option<InfoArena>,
    outstanding: Vec<Arc<FaultSlot>>,
    activity: Activity,
}

/// How often the host has waited for a device and how much work it recorded: what shows that a
/// training step records all its work before it reads anything back (see
/// [`GpuContext::activity`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Dispatches recorded since the device was opened.
    pub dispatches: u64,
    /// Times the host waited for the device: every read-back and every `synchronize`.
    pub waits: u64,
    /// Dispatches recorded after the last wait (work the device has not been waited for).
    pub since_last_wait: u64,
    /// Batches of recorded work submitted: every `FLUSH_EVERY` (64) dispatches, whenever a
    /// batch's info arena fills, and at every wait that finds work recorded.
    pub submits: u64,
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
    /// Compiled kernels by name, then entry point (looked up without building a key string).
    pipelines: Mutex<HashMap<String, HashMap<String, Arc<Kernel>>>>,
    pool: Pool,
    pending: Mutex<Pending>,
    errors: Arc<Mutex<Vec<String>>>,
    /// A matmul variant forced on this device (tests, benchmarks); `None`: the autotuner's choice.
    matmul: Mutex<Option<super::matmul::MatmulVariant>>,
    /// See [`GpuContext::parallel_width`] (counted once: the thread count is a system call).
    parallel_width: AtomicUsize,
}

/// [`GpuContext::parallel_width`] of an adapter of this type.
fn parallel_width(device_type: wgpu::DeviceType) -> usize {
    if device_type != wgpu::DeviceType::Cpu {
        return HARDWARE_WIDTH;
    }
    let threads = std::env::var("LP_NUM_THREADS").ok().and_then(|t| t.trim().parse::<usize>().ok());
    threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1)
}

/// [`GpuContext::parallel_width`] of a hardware GPU: about as many workgroups as today's large
/// GPUs have compute units (an H100 has 132), several rounds for small ones.
pub const HARDWARE_WIDTH: usize = 128;

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
            errors,
            matmul: Mutex::default(),
            parallel_width: AtomicUsize::new(parallel_width(adapter.get_info().device_type)),
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
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).get(kernel).and_then(|e| e.get(entry))
        {
            return Ok(p.clone());
        }
        let key = format!("{kernel}#{entry}");
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
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        pipelines.entry(kernel.to_string()).or_default().insert(entry.to_string(), p.clone());
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
        self.record(kernel, entry, info, buffers, groups, None)
    }

    /// Record a dispatch that writes `slot` (bound among `buffers`) when it meets a bad index; the
    /// slot becomes outstanding with it, to be settled by the next read-back.
    pub(crate) fn dispatch_faulting(
        &self,
        kernel: &str,
        entry: &str,
        info: &[u32],
        buffers: &[&Arc<PooledBuffer>],
        groups: [u32; 3],
        slot: &Arc<FaultSlot>,
    ) -> Result<()> {
        self.record(kernel, entry, info, buffers, groups, Some(slot))
    }

    fn record(
        &self,
        kernel: &str,
        entry: &str,
        info: &[u32],
        buffers: &[&Arc<PooledBuffer>],
        groups: [u32; 3],
        slot: Option<&Arc<FaultSlot>>,
    ) -> Result<()> {
        if groups.contains(&0) {
            // Nothing runs, so nothing can fault.
            if let Some(s) = slot {
                s.settle(&Seen::Clean, None);
            }
            return Ok(());
        }
        let max = self.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::Gpu(format!(
                "{kernel}: grid {groups:?} exceeds the adapter's {max} workgroups per dimension"
            )));
        }
        let pipeline = self.pipeline(kernel, entry)?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let (info_buf, (offset, size)) = self.place_info(&mut pending, kernel, info)?;
        let binding = wgpu::BufferBinding { buffer: &info_buf.buffer, offset, size: std::num::NonZeroU64::new(size) };
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: wgpu::BindingResource::Buffer(binding) }];
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.buffer.as_entire_binding() });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.layout,
            entries: &entries,
        });
        let mut hold: Vec<Arc<PooledBuffer>> = Vec::with_capacity(buffers.len() + 1);
        hold.extend(buffers.iter().map(|b| Arc::clone(b)));
        hold.push(info_buf);
        pending.recorded.push(Recorded { kernel: pipeline, bind_group, groups, _hold: hold });
        pending.activity.dispatches += 1;
        pending.activity.since_last_wait += 1;
        let mut settle_now = false;
        if let Some(s) = slot {
            pending.outstanding.push(s.clone());
            settle_now = pending.outstanding.len() >= MAX_OUTSTANDING;
        }
        if pending.recorded.len() >= FLUSH_EVERY {
            let batch = self.submit_locked(&mut pending, |_| ());
            drop(pending);
            drop(batch);
        } else {
            drop(pending);
        }
        if settle_now {
            self.settle_faults(None, &[])?;
        }
        Ok(())
    }

    /// Places `info` in the batch's arena: its buffer, and the offset and size to bind. A batch
    /// whose arena is full is submitted first, and a new arena started.
    fn place_info(&self, pending: &mut Pending, kernel: &str, info: &[u32]) -> Result<(Arc<PooledBuffer>, (u64, u64))> {
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment);
        if let Some(arena) = pending.arena.as_mut()
            && let Some(at) = arena.place(info, align)
        {
            return Ok((arena.buf.clone(), at));
        }
        if pending.arena.is_some() {
            drop(self.submit_locked(pending, |_| ()));
        }
        let mut arena = InfoArena::new(self.alloc(InfoArena::bytes_for(info))?);
        let at = arena
            .place(info, align)
            .ok_or_else(|| Error::Gpu(format!("{kernel}: {} info words fit no arena", info.len())))?;
        let buf = arena.buf.clone();
        pending.arena = Some(arena);
        Ok((buf, at))
    }

    /// The grid of a one-dimensional kernel over `n` elements: 256-wide workgroups, at most
    /// `MAX_1D_GROUPS` of them; the kernels loop over the rest (`grid_size` in common.wgsl).
    pub(crate) fn grid_1d(&self, n: usize) -> [u32; 3] {
        self.grid_for(n.div_ceil(256).min(MAX_1D_GROUPS))
    }

    /// Whether the adapter is a CPU running the shaders (lavapipe): workgroups are CPU tasks and
    /// a barrier switches between invocations, so some kernels pick other entry points there.
    pub(crate) fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The workgroups this adapter runs at once, as weft reckons it: on an adapter that runs on
    /// the CPU its threads, one a core (for lavapipe, unless `LP_NUM_THREADS` says otherwise); on a GPU
    /// [`HARDWARE_WIDTH`], since wgpu does not tell how many compute units it has. A product
    /// whose output is fewer tiles than this cuts its K into slices (see `matmul.rs`).
    ///
    /// ```no_run
    /// # fn main() -> weft_core::Result<()> {
    /// let dev = weft_core::Device::gpu(0)?;
    /// if let weft_core::Device::Gpu(ctx) = &dev {
    ///     assert!(ctx.parallel_width() >= 1);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn parallel_width(&self) -> usize {
        self.parallel_width.load(Ordering::Relaxed)
    }

    /// Reckon this device `width` workgroups wide (at least 1) from now on; for tests, which
    /// split products on lavapipe as on an adapter of that many cores.
    pub fn force_parallel_width(&self, width: usize) {
        self.parallel_width.store(width.max(1), Ordering::Relaxed);
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
    /// The batch's info words are written first. Returns the batch, whose buffers go back to
    /// the pool when the caller drops it.
    fn submit_locked(&self, pending: &mut Pending, extra: impl FnOnce(&mut wgpu::CommandEncoder)) -> Vec<Recorded> {
        let batch = std::mem::take(&mut pending.recorded);
        if !batch.is_empty() {
            pending.activity.submits += 1;
        }
        if let Some(arena) = pending.arena.take() {
            arena.write(&self.queue);
        }
        let mut encoder = self.device.create_command_encoder(&Default::default());
        Self::replay(&mut encoder, &batch);
        extra(&mut encoder);
        self.queue.submit([encoder.finish()]);
        batch
    }

    /// Submit everything recorded so far.
    pub fn flush(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.recorded.is_empty() {
            return;
        }
        let batch = self.submit_locked(&mut pending, |_| ());
        drop(pending);
        drop(batch);
    }

    /// Wait for all submitted work and return any error the GPU reported. Index faults are
    /// settled too, but reported only by reading the tensors they spoiled.
    pub fn synchronize(&self) -> Result<()> {
        self.settle_faults(None, &[]).map(|_| ())
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

    /// Read `len` bytes at byte `offset` of a buffer that depends on the fault slots `faults`:
    /// submits the batch, copies into a staging buffer, waits, and checks the error log and the
    /// slots. Fails with the fault of a slot in `faults`; faults of other slots stay with them.
    pub(crate) fn read(&self, buf: &PooledBuffer, offset: u64, len: u64, faults: &[Arc<FaultSlot>]) -> Result<Vec<u8>> {
        self.settle_faults(Some((buf, offset, len)), faults)
    }

    /// Submit everything, copy out `data` (buffer, byte offset, length) and every fault slot not
    /// yet settled (the device's outstanding ones and those in `faults`), wait, settle those
    /// slots, and return the data, or the fault of a slot in `faults`.
    fn settle_faults(&self, data: Option<(&PooledBuffer, u64, u64)>, faults: &[Arc<FaultSlot>]) -> Result<Vec<u8>> {
        let (offset, len) = data.map_or((0, 0), |d| (d.1, d.2));
        let start = offset & !3;
        let end = (offset + len).div_ceil(4) * 4;
        let size = (end - start).max(4);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        // A slot in `faults` may be in another thread's read-back right now: copy it here too
        // (settling twice is harmless, both see the same bytes).
        let mut slots: Vec<(Arc<FaultSlot>, Arc<PooledBuffer>)> = Vec::new();
        for s in std::mem::take(&mut pending.outstanding).into_iter().chain(faults.iter().cloned()) {
            if slots.iter().any(|(t, _)| Arc::ptr_eq(&s, t)) {
                continue;
            }
            if let Some(b) = s.buffer() {
                slots.push((s, b));
            }
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("weft read-back"),
            size: size + SLOT_BYTES * slots.len() as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        pending.activity.waits += 1;
        pending.activity.since_last_wait = 0;
        let batch = self.submit_locked(&mut pending, |encoder| {
            if let Some((buf, ..)) = data
                && end > start
            {
                encoder.copy_buffer_to_buffer(&buf.buffer, start, &staging, 0, end - start);
            }
            for (i, (_, b)) in slots.iter().enumerate() {
                encoder.copy_buffer_to_buffer(&b.buffer, 0, &staging, size + SLOT_BYTES * i as u64, SLOT_BYTES);
            }
        });
        drop(pending);
        drop(batch);
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let waited = self
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for {}: {e}", self.describe())))
            .and_then(|_| self.take_errors())
            .and_then(|_| {
                rx.recv()
                    .map_err(|_| Error::Gpu("read-back was dropped".into()))?
                    .map_err(|e| Error::Gpu(format!("mapping a read-back buffer: {e}")))
            });
        if let Err(e) = waited {
            // The slots stay outstanding for a later read-back.
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.outstanding.extend(slots.into_iter().map(|(s, _)| s));
            return Err(e);
        }
        let view = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("read-back: {e}")))?;
        let lo = (offset - start) as usize;
        let out = view[lo..lo + len as usize].to_vec();
        let seen: Vec<Seen> =
            (0..slots.len()).map(|i| Seen::from_bytes(&view[(size + SLOT_BYTES * i as u64) as usize..])).collect();
        drop(view);
        staging.unmap();
        for ((slot, _), seen) in slots.iter().zip(&seen) {
            // A faulted slot reads back the index at its first bad position: a second, small
            // read-back, on the error path only.
            let first = match *seen {
                Seen::Bad { at, .. } => slot.ids().and_then(|ids| {
                    let b = self.settle_faults(Some((&ids, slot.element_at(at) * 4, 4)), &[]).ok()?;
                    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                }),
                Seen::Clean => None,
            };
            slot.settle(seen, first);
        }
        match faults.iter().find_map(|s| s.error()) {
            Some(e) => Err(e),
            None => Ok(out),
        }
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

    /// Dispatches recorded and waits so far on this device.
    ///
    /// ```no_run
    /// # fn main() -> weft_core::Result<()> {
    /// use weft_core::{Device, Tensor};
    /// let Device::Gpu(gpu) = Device::gpu(0)? else { unreachable!() };
    /// let before = gpu.activity();
    /// let y = Tensor::ones(&[4], &Device::Gpu(gpu.clone()))?.exp()?;
    /// assert!(gpu.activity().since_last_wait > 0); // recorded, not yet waited for
    /// y.to_vec::<f32>()?;
    /// assert_eq!(gpu.activity().waits, before.waits + 1);
    /// # Ok(()) }
    /// ```
    pub fn activity(&self) -> Activity {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).activity
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
        // The device number tells apart several devices opened on one adapter (virtual devices).
        format!(
            "gpu:{} device #{} ({}, {:?}, {:?})",
            self.adapter_index, self.ordinal, self.info.name, self.info.backend, self.info.device_type
        )
    }
}
