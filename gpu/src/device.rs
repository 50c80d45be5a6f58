//! The wgpu side: adapter and device, resident filter chunks, the compute pipeline, and
//! double-buffered batches (upload of batch n+1 is queued before batch n is read back).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::GpuError;
use crate::cpu::{CpuSubset, check_shape};

const WORKGROUP: u32 = 256;
const MAX_GROUPS_X: u32 = 65_535;
const PARAMS_BYTES: u64 = 32;

/// Settings of the GPU matcher.
#[derive(Debug, Clone, Copy)]
pub struct GpuOptions {
    /// Most conjunctions per resident chunk; `None`: as many as one storage binding holds.
    pub max_chunk_conjunctions: Option<usize>,
    /// Candidate pairs the output buffer holds at first (it grows on overflow).
    pub initial_capacity: usize,
    /// Most objects per batch (larger batches are split).
    pub max_batch_objects: usize,
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions {
            max_chunk_conjunctions: None,
            initial_capacity: 1 << 16,
            max_batch_objects: 1024,
        }
    }
}

/// Which adapter runs the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub name: String,
    pub backend: String,
    pub device_type: String,
}

/// Time spent per phase, summed over batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuTimings {
    pub batches: u64,
    pub upload_seconds: f64,
    pub dispatch_seconds: f64,
    pub readback_seconds: f64,
    pub overflow_reruns: u64,
}

#[derive(Debug)]
struct Chunk {
    first: usize,
    len: usize,
    filters: wgpu::Buffer,
}

#[derive(Debug)]
struct Slot {
    objects: wgpu::Buffer,
    count_pairs: wgpu::Buffer,
    readback: wgpu::Buffer,
    params: Vec<wgpu::Buffer>,
    groups: Vec<wgpu::BindGroup>,
    capacity: usize,
    /// The batch submitted through this slot and not yet read: (index, objects).
    pending: Option<(usize, usize)>,
}

/// Resident filters and the subset kernel on one GPU.
#[derive(Debug)]
pub struct GpuMatcher {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    info: GpuInfo,
    opts: GpuOptions,
    n: usize,
    words: usize,
    chunks: Vec<Chunk>,
    slots: Vec<Slot>,
    host: CpuSubset,
    error: Arc<Mutex<Option<String>>>,
    lost: Arc<AtomicBool>,
    timings: GpuTimings,
}

fn u32_words(words: usize) -> usize {
    2 * words
}

impl GpuMatcher {
    /// Opens the default adapter and uploads a word-major table of `n` filters of `words`
    /// 64-bit words.
    pub fn new(
        filters: &[u64],
        n: usize,
        words: usize,
        opts: GpuOptions,
    ) -> Result<GpuMatcher, GpuError> {
        check_shape(filters, n, words)?;
        pollster::block_on(Self::open(filters, n, words, opts))
    }

    async fn open(
        filters: &[u64],
        n: usize,
        words: usize,
        opts: GpuOptions,
    ) -> Result<GpuMatcher, GpuError> {
        let instance = wgpu::Instance::default();
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let ai = adapter.get_info();
        let info = GpuInfo {
            name: ai.name.clone(),
            backend: format!("{:?}", ai.backend),
            device_type: format!("{:?}", ai.device_type),
        };
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("dissem subset match"),
                required_features: wgpu::Features::empty(),
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&error);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| e.to_string());
            }
        }));
        let lost = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&lost);
        device.set_device_lost_callback(move |_, msg| {
            tracing::warn!("GPU device lost: {msg}");
            flag.store(true, Ordering::SeqCst);
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("subset.wgsl"),
            source: wgpu::ShaderSource::Wgsl(include_str!("subset.wgsl").into()),
        });
        let entry = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("subset layout"),
            entries: &[
                entry(0, wgpu::BufferBindingType::Uniform),
                entry(1, wgpu::BufferBindingType::Storage { read_only: true }),
                entry(2, wgpu::BufferBindingType::Storage { read_only: true }),
                entry(3, wgpu::BufferBindingType::Storage { read_only: false }),
                entry(4, wgpu::BufferBindingType::Storage { read_only: false }),
            ],
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("subset pipeline layout"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("subset pipeline"),
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        // chunking: one storage binding per chunk, and at most 65535 x 65535 workgroups
        let w32 = u32_words(words);
        let binding = (limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size);
        let per_chunk_limit = (binding / (w32 as u64 * 4)).max(1) as usize;
        let cap = opts
            .max_chunk_conjunctions
            .unwrap_or(usize::MAX)
            .min(per_chunk_limit)
            .max(1);
        let host = CpuSubset::new(filters, n, words)?;
        let mut me = GpuMatcher {
            device,
            queue,
            pipeline,
            layout,
            info,
            opts,
            n,
            words,
            chunks: Vec::new(),
            slots: Vec::new(),
            host,
            error,
            lost,
            timings: GpuTimings::default(),
        };
        let mut first = 0;
        while first < n || (n == 0 && me.chunks.is_empty()) {
            let len = (n - first).min(cap);
            let buf = me.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("filters"),
                size: ((len.max(1) * w32) as u64) * 4,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut bytes = Vec::with_capacity(len * w32 * 4);
            for w in 0..words {
                for half in 0..2 {
                    for i in first..first + len {
                        let v = (filters[w * n + i] >> (32 * half)) as u32;
                        bytes.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            if !bytes.is_empty() {
                me.queue.write_buffer(&buf, 0, &bytes);
            }
            me.chunks.push(Chunk {
                first,
                len,
                filters: buf,
            });
            first += len;
            if n == 0 {
                break;
            }
        }
        for _ in 0..2 {
            let slot = me.new_slot(opts.initial_capacity.max(1));
            me.slots.push(slot);
        }
        me.check()?;
        Ok(me)
    }

    fn new_slot(&self, capacity: usize) -> Slot {
        let w32 = u32_words(self.words);
        let objects = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("objects"),
            size: (self.opts.max_batch_objects.max(1) * w32 * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // one buffer: the counter in the first 256 bytes (aligned), then the pairs
        let bytes = 256 + (capacity as u64) * 8;
        let count_pairs = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("count and pairs"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let readback = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut params = Vec::new();
        let mut groups = Vec::new();
        for c in &self.chunks {
            let p = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params"),
                size: PARAMS_BYTES,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let g = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("subset bind group"),
                layout: &self.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: p.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: c.filters.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: objects.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 3,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &count_pairs,
                            offset: 0,
                            size: std::num::NonZeroU64::new(4),
                        }),
                    },
                    wgpu::BindGroupEntry {
                        binding: 4,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &count_pairs,
                            offset: 256,
                            size: std::num::NonZeroU64::new((capacity as u64) * 8),
                        }),
                    },
                ],
            });
            params.push(p);
            groups.push(g);
        }
        Slot {
            objects,
            count_pairs,
            readback,
            params,
            groups,
            capacity,
            pending: None,
        }
    }

    /// The adapter in use.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// Number of resident chunks (more than one when the table exceeds a binding).
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Time spent so far, per phase.
    pub fn timings(&self) -> GpuTimings {
        self.timings
    }

    /// A CPU matcher over the same table (for falling back).
    pub fn to_cpu(&self) -> CpuSubset {
        self.host.clone()
    }

    fn check(&self) -> Result<(), GpuError> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(GpuError::Lost("device lost".into()));
        }
        if let Ok(e) = self.error.lock()
            && let Some(msg) = e.as_ref()
        {
            return Err(GpuError::Lost(msg.clone()));
        }
        Ok(())
    }

    /// Replaces one conjunction's filter in place: `2 * words` small writes, no re-upload.
    pub fn update(&mut self, i: usize, filter: &[u64]) -> Result<(), GpuError> {
        self.host.update(i, filter)?;
        let Some(chunk) = self
            .chunks
            .iter()
            .find(|c| i >= c.first && i < c.first + c.len)
        else {
            return Err(GpuError::Shape(format!("conjunction {i} out of range")));
        };
        let local = (i - chunk.first) as u64;
        for (w, &v) in filter.iter().enumerate() {
            for half in 0..2u64 {
                let row = 2 * w as u64 + half;
                let off = (row * chunk.len as u64 + local) * 4;
                let word = (v >> (32 * half)) as u32;
                self.queue
                    .write_buffer(&chunk.filters, off, &word.to_le_bytes());
            }
        }
        self.check()
    }

    fn submit(&mut self, slot: usize, objects: &[u64], batch: usize) -> Result<(), GpuError> {
        let t = Instant::now();
        let w32 = u32_words(self.words);
        let n_obj = objects.len() / self.words;
        let mut bytes = Vec::with_capacity(n_obj * w32 * 4);
        for &v in objects {
            bytes.extend_from_slice(&(v as u32).to_le_bytes());
            bytes.extend_from_slice(&((v >> 32) as u32).to_le_bytes());
        }
        let s = &self.slots[slot];
        if !bytes.is_empty() {
            self.queue.write_buffer(&s.objects, 0, &bytes);
        }
        for (c, p) in self.chunks.iter().zip(&s.params) {
            let vals = [
                c.len as u32,
                c.first as u32,
                n_obj as u32,
                w32 as u32,
                s.capacity as u32,
                0,
                0,
                0,
            ];
            let mut pb = Vec::with_capacity(32);
            for v in vals {
                pb.extend_from_slice(&v.to_le_bytes());
            }
            self.queue.write_buffer(p, 0, &pb);
        }
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("subset batch"),
            });
        enc.clear_buffer(&s.count_pairs, 0, Some(256));
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("subset pass"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            for (c, g) in self.chunks.iter().zip(&s.groups) {
                if c.len == 0 {
                    continue;
                }
                let groups = (c.len as u32).div_ceil(WORKGROUP);
                let x = groups.min(MAX_GROUPS_X);
                let y = groups.div_ceil(x);
                pass.set_bind_group(0, g, &[]);
                pass.dispatch_workgroups(x, y, 1);
            }
        }
        let bytes = 256 + s.capacity as u64 * 8;
        enc.copy_buffer_to_buffer(&s.count_pairs, 0, &s.readback, 0, bytes);
        self.queue.submit([enc.finish()]);
        self.slots[slot].pending = Some((batch, n_obj));
        self.timings.upload_seconds += t.elapsed().as_secs_f64();
        self.check()
    }

    /// Waits for a slot's batch and reads its pairs; `None` if it overflowed (the capacity is
    /// then grown and the caller resubmits).
    fn collect(&mut self, slot: usize) -> Result<Option<Vec<(u32, u32)>>, GpuError> {
        let t = Instant::now();
        let s = &self.slots[slot];
        let (tx, rx) = std::sync::mpsc::channel();
        let slice = s.readback.slice(..);
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        let t_mapped = Instant::now();
        self.timings.dispatch_seconds += (t_mapped - t).as_secs_f64();
        rx.recv()
            .map_err(|e| GpuError::Lost(e.to_string()))?
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        let mut pairs = Vec::new();
        let count;
        {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Lost(e.to_string()))?;
            let data: &[u8] = &view;
            count = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
            if count <= s.capacity {
                pairs.reserve(count);
                for k in 0..count {
                    let o = 256 + 8 * k;
                    let obj = u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
                    let conj =
                        u32::from_le_bytes([data[o + 4], data[o + 5], data[o + 6], data[o + 7]]);
                    pairs.push((obj, conj));
                }
            }
        }
        s.readback.unmap();
        self.slots[slot].pending = None;
        self.timings.readback_seconds += t_mapped.elapsed().as_secs_f64();
        self.check()?;
        if count > self.slots[slot].capacity {
            // overflow: grow to fit and let the caller run the batch again
            self.timings.overflow_reruns += 1;
            let cap = count.next_power_of_two();
            self.slots[slot] = self.new_slot(cap);
            return Ok(None);
        }
        pairs.sort_unstable();
        Ok(Some(pairs))
    }

    /// Candidate pairs for each batch of object filters (`words` per object), pipelined:
    /// batch n+1 is uploaded and dispatched before batch n is read back. Batches larger than
    /// `max_batch_objects` are split and merged transparently.
    pub fn candidates(&mut self, batches: &[&[u64]]) -> Result<Vec<Vec<(u32, u32)>>, GpuError> {
        self.check()?;
        let w = self.words;
        // split oversized batches into parts, remembering the object offset of each part
        let mut parts: Vec<(usize, usize, &[u64])> = Vec::new(); // (batch, first object, objs)
        for (b, objs) in batches.iter().enumerate() {
            if objs.len() % w != 0 {
                return Err(GpuError::Shape(format!(
                    "batch {b}: {} words is not a whole number of filters",
                    objs.len()
                )));
            }
            let per = self.opts.max_batch_objects.max(1) * w;
            if objs.is_empty() {
                continue;
            }
            for (k, part) in objs.chunks(per).enumerate() {
                parts.push((b, k * self.opts.max_batch_objects.max(1), part));
            }
        }
        let mut out: Vec<Vec<(u32, u32)>> = vec![Vec::new(); batches.len()];
        let store = |out: &mut Vec<Vec<(u32, u32)>>, p: usize, pairs: Vec<(u32, u32)>| {
            let (b, first, _) = parts[p];
            out[b].extend(pairs.into_iter().map(|(o, c)| (o + first as u32, c)));
        };
        for p in 0..parts.len() {
            let slot = p % 2;
            self.submit(slot, parts[p].2, p)?;
            self.timings.batches += 1;
            if p > 0 {
                let prev = (p - 1) % 2;
                loop {
                    match self.collect(prev)? {
                        Some(pairs) => {
                            store(&mut out, p - 1, pairs);
                            break;
                        }
                        None => self.submit(prev, parts[p - 1].2, p - 1)?,
                    }
                }
            }
        }
        if let Some(last) = parts.len().checked_sub(1) {
            let slot = last % 2;
            loop {
                match self.collect(slot)? {
                    Some(pairs) => {
                        store(&mut out, last, pairs);
                        break;
                    }
                    None => self.submit(slot, parts[last].2, last)?,
                }
            }
        }
        for o in &mut out {
            o.sort_unstable();
        }
        Ok(out)
    }

    /// Number of conjunctions resident.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether no conjunction is resident.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}
