//! The simulated driver state of one process: enumeration, the cached PCI objects, contexts,
//! "device memory", the checkpoint state machine and the restore thread.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ccm_sim_common::cuda::*;
use ccm_sim_common::pidns::{self, ProcKey};
use ccm_sim_common::protocol::{self, Op, Response};
use ccm_sim_common::registry::Registration;
use ccm_sim_common::{cuda_ordinals, process_view, Faults, SimConfig, SimError, SimGpu, SimUuid, StateDir};

/// Size of the heap object that caches one device's PCI location, and where the six words sit in
/// it. The real driver's object is bigger and holds a revision word after the six; so does this one.
const PCI_OBJECT_SIZE: usize = 0x100;
const PCI_OBJECT_WORDS_AT: usize = 0x30;
/// Per-GPU table in an anonymous mapping, with the real driver's stride and offsets: UUID at +0,
/// the six words at +36, the revision at +60.
const TABLE_STRIDE: usize = 0x150;
const TABLE_WORDS_AT: usize = 36;
/// A second anonymous copy (the real driver has several); stride and offset are arbitrary.
const MIRROR_STRIDE: usize = 0x80;
const MIRROR_WORDS_AT: usize = 0x10;
const PCI_REVISION: u32 = 0xa1;
/// Streams of the custom-storage regions: `STREAM_BASE + ordinal` (the primary context of that ordinal).
pub const STREAM_BASE: usize = 0x57e0_0000;

/// Device pointers: allocation `h` owns `[BASE + h * STRIDE, BASE + h * STRIDE + size)`.
const DPTR_BASE: u64 = 1 << 44;
const DPTR_STRIDE: u64 = 1 << 36;

/// Environment variable (target side): print what the double does on stderr.
const ENV_TRACE: &str = "CCM_SIM_TRACE";

pub struct Driver {
    pub state_dir: StateDir,
    /// getpid() at cuInit: the pid in this process's own pid namespace (for messages).
    pub pid: i32,
    /// `STATE/reg-<id>`. Its `id` field, in this (leaked, never moved) struct, is the word a controller
    /// reads through `/proc/PID/mem` to recognise this process after CRIU moved it to a new pid namespace.
    registration: Registration,
    /// `registration.id_text()`: the owner part of the allocation files.
    owner: String,
    /// The key `STATE/proc-<key>` this process is indexed under now; the restore thread follows changes.
    key: Mutex<Option<ProcKey>>,
    /// `Inner::state`, readable without the lock: controllers read it through `/proc/PID/mem` (`state-at`), so
    /// `cuCheckpointProcessGetState` answers what this process's memory says, also after CRIU restored it from
    /// a dump taken before later transitions rewrote the `state` file.
    state_word: AtomicI32,
    /// One per GPU this process's driver enumerated (its container view), in enumeration order.
    slots: Vec<Slot>,
    /// CUDA ordinal → slot (after `CUDA_VISIBLE_DEVICES`).
    pub ordinals: Vec<usize>,
    inner: Mutex<Inner>,
    unlocked: Condvar,
    trace: bool,
}

struct Slot {
    /// Address of the malloc'd object whose words answer `cuDeviceGetPCIBusId`.
    pci_object: usize,
}

pub struct Inner {
    state: i32,
    /// The GPU set of the machine this process runs on: read at `cuInit`, and again at each driver
    /// restore (a process restored on another node runs on that node's GPUs; a test switches nodes by
    /// rewriting the GPU set file between dump and restore).
    config: SimConfig,
    /// Slot → index into `config.gpus`: the GPU the slot runs on now (a restore changes it).
    current: Vec<usize>,
    allocations: BTreeMap<u64, Allocation>,
    next_handle: u64,
    /// Open stand-ins of `/dev/nvidiaN` while the process holds the GPUs.
    node_fds: Vec<OwnedFd>,
    /// Device contents moved into host memory by a checkpoint, per allocation handle.
    saved: BTreeMap<u64, HostCopy>,
    /// A custom-storage operation (CUDA 13.4) in progress, or a checkpoint whose device memory went to the
    /// caller's storage (nothing in `saved`).
    custom: Option<Custom>,
    /// Device memory of another process mapped into this one by a custom-storage operation this process called:
    /// handle → (slot, region file, size). Its device pointers resolve like allocations.
    mapped: BTreeMap<u64, (usize, std::path::PathBuf, u64)>,
}

/// Why a step of a custom-storage operation of the double failed (the call answers CUDA_ERROR_OPERATING_SYSTEM).
#[derive(Debug, thiserror::Error)]
enum CustomStorageError {
    #[error("device memory {handle}: {source}")]
    Allocation { handle: u64, source: std::io::Error },
    #[error("its region {slot}: {source}")]
    Region { slot: usize, source: std::io::Error },
    #[error("its region list: {0}")]
    Regions(#[from] SimError),
    #[error("an allocation of an ordinal it does not have")]
    Ordinal,
    /// The device node stand-ins.
    #[error(transparent)]
    Nodes(#[from] NodesError),
}

/// Why the device node stand-ins could not be opened ([`Driver::open_nodes`]).
#[derive(Debug, thiserror::Error)]
enum NodesError {
    #[error("cannot create {}: {source}", dir.display())]
    Dir { dir: std::path::PathBuf, source: std::io::Error },
    #[error("cannot open the device node stand-in {}: {source}", path.display())]
    Open { path: std::path::PathBuf, source: std::io::Error },
}

/// Where a custom-storage operation (CUDA 13.4) stands on the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Custom {
    Checkpointing,
    /// CHECKPOINTED, the device memory in the caller's storage only.
    Stored,
    Restoring,
}

#[derive(Clone, Copy)]
struct Allocation {
    ordinal: usize,
    size: u64,
}

static DRIVER: OnceLock<Result<&'static Driver, i32>> = OnceLock::new();

/// `cuInit`: the first call builds the driver state; later calls return the same answer.
pub fn init() -> Result<&'static Driver, i32> {
    *DRIVER.get_or_init(|| match Driver::start() {
        Ok(d) => Ok(d),
        Err(e) => {
            eprintln!("cuda-test-double: cuInit failed: {e}");
            Err(CUDA_ERROR_NO_DEVICE)
        }
    })
}

/// The driver if `cuInit` succeeded, else `CUDA_ERROR_NOT_INITIALIZED`.
pub fn get() -> Result<&'static Driver, i32> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

#[derive(Debug)]
enum StartError {
    Sim(SimError),
    NoDevice(&'static str),
    Nodes(NodesError),
    Os(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Sim(e) => write!(f, "{e}"),
            StartError::NoDevice(why) => write!(f, "no device: {why}"),
            StartError::Nodes(e) => write!(f, "{e}"),
            StartError::Os(why) => write!(f, "{why}"),
        }
    }
}

impl From<SimError> for StartError {
    fn from(e: SimError) -> Self {
        StartError::Sim(e)
    }
}

impl Driver {
    fn start() -> Result<&'static Driver, StartError> {
        let config = SimConfig::from_env()?;
        let state_dir = StateDir::from_env()?;
        let view = process_view(&config)?;
        if view.is_empty() {
            return Err(StartError::NoDevice("the GPU set is empty"));
        }
        let uuids: Vec<SimUuid> = view.iter().map(|&g| config.gpus[g].uuid).collect();
        let ordinals = cuda_ordinals(&uuids, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
        if ordinals.is_empty() {
            return Err(StartError::NoDevice("CUDA_VISIBLE_DEVICES names no GPU of the set"));
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };

        // Like the real driver, every enumerated GPU gets its cached PCI words, whatever
        // CUDA_VISIBLE_DEVICES says: a heap object, a table entry and a mirror entry.
        let mut slots = Vec::with_capacity(view.len());
        let table = anonymous_map(TABLE_STRIDE * view.len())?;
        let mirror = anonymous_map(MIRROR_STRIDE * view.len())?;
        for (i, &g) in view.iter().enumerate() {
            let gpu = &config.gpus[g];
            let words = gpu.pci_words();
            // SAFETY: a fresh malloc of PCI_OBJECT_SIZE bytes; checked for NULL before use. It is
            // never freed: the driver's objects live as long as the process.
            let object = unsafe { libc::calloc(1, PCI_OBJECT_SIZE) }.cast::<u8>();
            if object.is_null() {
                return Err(StartError::Os("out of host memory for the device objects".into()));
            }
            // SAFETY: object, table and mirror are writable allocations large enough for the
            // offsets written (checked by the constants: 0x30 + 28 < 0x100, 36 + 28 < 0x150, ...).
            unsafe {
                write_words(object.add(PCI_OBJECT_WORDS_AT), &words);
                let entry = table.add(TABLE_STRIDE * i);
                std::ptr::copy_nonoverlapping(gpu.uuid.0.as_ptr(), entry, 16);
                write_words(entry.add(TABLE_WORDS_AT), &words);
                write_words(mirror.add(MIRROR_STRIDE * i + MIRROR_WORDS_AT), &words);
            }
            slots.push(Slot { pci_object: object as usize });
        }

        let trace = std::env::var_os(ENV_TRACE).is_some_and(|v| v != "0");
        let registration = Registration::new(&state_dir, random_id()?);
        let driver = Driver {
            owner: registration.id_text(),
            registration,
            key: Mutex::new(None),
            state_word: AtomicI32::new(STATE_RUNNING),
            inner: Mutex::new(Inner {
                state: STATE_RUNNING,
                config,
                current: view.clone(),
                allocations: BTreeMap::new(),
                next_handle: 1,
                node_fds: Vec::new(),
                saved: BTreeMap::new(),
                custom: None,
                mapped: BTreeMap::new(),
            }),
            state_dir,
            pid,
            slots,
            ordinals,
            unlocked: Condvar::new(),
            trace,
        };
        {
            let mut inner = driver.lock_inner();
            driver.open_nodes(&mut inner).map_err(StartError::Nodes)?;
        }
        let driver: &'static Driver = Box::leak(Box::new(driver));
        driver.register()?;
        Ok(driver)
    }

    /// Publishes this process to controllers: starts the restore thread, writes its tid and indexes the
    /// registration under this process's key.
    fn register(&'static self) -> Result<(), StartError> {
        let reg = &self.registration;
        let dir = reg.dir();
        std::fs::create_dir_all(dir)
            .map_err(|e| StartError::Os(format!("cannot create {}: {e}; check CCM_SIM_STATE_DIR", dir.display())))?;
        let id_at = &reg.id as *const u64 as usize;
        ccm_sim_common::write_atomic(&reg.id_at(), format!("{id_at:x}").as_bytes())?;
        let state_at = self.state_word.as_ptr() as usize;
        ccm_sim_common::write_atomic(&reg.state_at(), format!("{state_at:x}").as_bytes())?;
        self.write_state_file(STATE_RUNNING);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cuda-restore".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tx.send(unsafe { libc::gettid() });
                self.serve_forever();
            })
            .map_err(|e| StartError::Os(format!("cannot start the restore thread: {e}")))?;
        let tid = rx.recv().map_err(|_| StartError::Os("the restore thread died at start".into()))?;
        ccm_sim_common::write_atomic(&reg.tid(), tid.to_string().as_bytes())?;
        // Last: once indexed, controllers take the process for a CUDA process.
        self.follow_key();
        if self.lock_key().is_none() {
            return Err(StartError::Os(
                "cannot read this process's pid namespace (/proc/self/ns/pid); mount /proc in its pid namespace".into(),
            ));
        }
        // SAFETY: registering a plain extern "C" function; the library is never unloaded (-z nodelete).
        unsafe { libc::atexit(unregister_at_exit) };
        Ok(())
    }

    fn lock_key(&self) -> MutexGuard<'_, Option<ProcKey>> {
        self.key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `STATE/proc-<key>` pointing here when this process's key changed (CRIU restored it into a new
    /// pid namespace). A controller may have re-pointed it already (registry.rs); doing it again is harmless.
    fn follow_key(&self) {
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let now = match pidns::own_key() {
            Ok(k) => k,
            Err(e) => {
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!("cuda-test-double[{}]: cannot read /proc/self/ns/pid: {e}", self.pid);
                }
                return;
            }
        };
        let mut key = self.lock_key();
        if *key == Some(now) {
            return;
        }
        if let Err(e) = self.state_dir.point_index(&now, &self.registration) {
            eprintln!("cuda-test-double[{}]: cannot register under {now}: {e}", self.pid);
            return;
        }
        if let Some(old) = key.replace(now) {
            self.state_dir.unpoint_index(&old, &self.registration);
            self.trace(format_args!("pid namespace changed: registered under {now} (was {old})"));
        }
    }

    fn trace(&self, what: std::fmt::Arguments<'_>) {
        if self.trace {
            eprintln!("cuda-test-double[{}]: {what}", self.pid);
        }
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock is caught at the C boundary; the state stays usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Entry of every app-side call: like the real driver, calls block while the process is
    /// LOCKED or CHECKPOINTED and go on once it is unlocked.
    pub fn enter(&self) -> MutexGuard<'_, Inner> {
        let guard = self.lock_inner();
        self.unlocked.wait_while(guard, |i| i.state != STATE_RUNNING).unwrap_or_else(|p| p.into_inner())
    }

    pub fn device_count(&self) -> usize {
        self.ordinals.len()
    }

    /// The slot of a CUDA ordinal.
    pub fn slot_of(&self, ordinal: i32) -> Result<usize, i32> {
        usize::try_from(ordinal).ok().and_then(|o| self.ordinals.get(o).copied()).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The six PCI words of a CUDA ordinal, read from its heap object (not from the GPU set: an
    /// outside rewrite of the object changes the answer, a remapped restore does not).
    pub fn cached_pci_words(&self, ordinal: i32) -> Result<[u32; 6], i32> {
        let slot = self.slot_of(ordinal)?;
        let object = self.slots[slot].pci_object as *const u8;
        let mut words = [0u32; 6];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: the object was allocated in start() with PCI_OBJECT_SIZE bytes and is never
            // freed; volatile because another process may rewrite it through /proc/PID/mem.
            *w = unsafe { std::ptr::read_volatile(object.add(PCI_OBJECT_WORDS_AT + 4 * i).cast::<u32>()) };
        }
        Ok(words)
    }

    /// The GPU an ordinal runs on now (an index into `inner.config.gpus`).
    pub fn current_gpu(&self, inner: &Inner, ordinal: i32) -> Result<usize, i32> {
        Ok(inner.current[self.slot_of(ordinal)?])
    }

    /// The GPU an ordinal runs on now, as the GPU set of its machine describes it.
    pub fn current<'a>(&self, inner: &'a Inner, ordinal: i32) -> Result<&'a SimGpu, i32> {
        Ok(&inner.config.gpus[self.current_gpu(inner, ordinal)?])
    }

    fn open_nodes(&self, inner: &mut Inner) -> Result<(), NodesError> {
        let dev = self.state_dir.dev_dir();
        std::fs::create_dir_all(&dev).map_err(|source| NodesError::Dir { dir: dev.clone(), source })?;
        inner.node_fds.clear();
        for &slot in &self.ordinals {
            let minor = inner.config.gpus[inner.current[slot]].minor;
            let path = self.state_dir.dev_node(minor);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|source| NodesError::Open { path: path.clone(), source })?;
            inner.node_fds.push(OwnedFd::from(file));
        }
        Ok(())
    }

    fn write_state_file(&self, state: i32) {
        self.state_word.store(state, Ordering::SeqCst);
        let path = self.registration.state();
        if let Err(e) = ccm_sim_common::write_atomic(&path, state.to_string().as_bytes()) {
            eprintln!("cuda-test-double: {e}");
        }
    }

    // ---- device memory -------------------------------------------------------------------

    fn allocation_path(&self, inner: &Inner, handle: u64, a: &Allocation) -> Result<std::path::PathBuf, i32> {
        let gpu = self.current_gpu(inner, a.ordinal as i32)?;
        Ok(self.state_dir.allocation(&inner.config.gpus[gpu].uuid, &self.owner, handle))
    }

    pub fn mem_alloc(&self, inner: &mut Inner, ordinal: usize, size: u64) -> Result<u64, i32> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if size > DPTR_STRIDE {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let gpu = &inner.config.gpus[self.current_gpu(inner, ordinal as i32)?];
        if self.state_dir.used_bytes(&gpu.uuid).saturating_add(size) > gpu.memory_total {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let handle = inner.next_handle;
        inner.next_handle += 1;
        let a = Allocation { ordinal, size };
        let path = self.allocation_path(inner, handle, &a)?;
        let created = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| File::create(&path))
            .and_then(|f| f.set_len(size));
        if let Err(e) = created {
            eprintln!("cuda-test-double: cannot create device memory file {}: {e}", path.display());
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        inner.allocations.insert(handle, a);
        self.trace(format_args!("alloc {size} bytes on ordinal {ordinal} -> {}", path.display()));
        Ok(DPTR_BASE + handle * DPTR_STRIDE)
    }

    pub fn mem_free(&self, inner: &mut Inner, dptr: u64) -> Result<(), i32> {
        let (handle, offset, _) = self.resolve(inner, dptr, 0)?;
        if offset != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = inner.allocations[&handle];
        let path = self.allocation_path(inner, handle, &a)?;
        let _ = std::fs::remove_file(path);
        inner.allocations.remove(&handle);
        Ok(())
    }

    /// The allocation holding `[dptr, dptr + len)`: handle, offset, allocation.
    fn resolve(&self, inner: &Inner, dptr: u64, len: u64) -> Result<(u64, u64, Allocation), i32> {
        let handle = dptr.checked_sub(DPTR_BASE).ok_or(CUDA_ERROR_INVALID_VALUE)? / DPTR_STRIDE;
        let a = match inner.mapped.get(&handle) {
            // Another process's device memory, mapped by a custom-storage operation: on its slot, of its size.
            Some(&(slot, _, size)) => {
                let ordinal = self.ordinals.iter().position(|s| *s == slot).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                Allocation { ordinal, size }
            }
            None => *inner.allocations.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?,
        };
        let offset = dptr - DPTR_BASE - handle * DPTR_STRIDE;
        if offset.checked_add(len).is_none_or(|end| end > a.size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok((handle, offset, a))
    }

    /// Opens the allocation's file for one operation; it is closed when the operation ends, so
    /// the process never holds a descriptor to "device memory".
    fn open_allocation(&self, inner: &Inner, handle: u64, a: &Allocation) -> Result<File, i32> {
        let path = match inner.mapped.get(&handle) {
            Some((_, region, _)) => region.clone(),
            None => self.allocation_path(inner, handle, a)?,
        };
        OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
            eprintln!("cuda-test-double: device memory file {} is gone: {e}", path.display());
            CUDA_ERROR_UNKNOWN
        })
    }

    pub fn memset_d32(&self, inner: &Inner, dptr: u64, value: u32, count: u64) -> Result<(), i32> {
        let len = count.checked_mul(4).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (handle, offset, a) = self.resolve(inner, dptr, len)?;
        let file = self.open_allocation(inner, handle, &a)?;
        let chunk: Vec<u8> = value.to_ne_bytes().iter().copied().cycle().take(1 << 20).collect();
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            file.write_all_at(&chunk[..n], offset + done).map_err(|_| CUDA_ERROR_UNKNOWN)?;
            done += n as u64;
        }
        Ok(())
    }

    pub fn copy_to_host(&self, inner: &Inner, dst: &mut [u8], dptr: u64) -> Result<(), i32> {
        let (handle, offset, a) = self.resolve(inner, dptr, dst.len() as u64)?;
        let file = self.open_allocation(inner, handle, &a)?;
        file.read_exact_at(dst, offset).map_err(|_| CUDA_ERROR_UNKNOWN)
    }

    pub fn copy_from_host(&self, inner: &Inner, dptr: u64, src: &[u8]) -> Result<(), i32> {
        let (handle, offset, a) = self.resolve(inner, dptr, src.len() as u64)?;
        let file = self.open_allocation(inner, handle, &a)?;
        file.write_all_at(src, offset).map_err(|_| CUDA_ERROR_UNKNOWN)
    }

    // ---- the restore thread and the checkpoint state machine -----------------------------

    fn serve_forever(&'static self) -> ! {
        loop {
            std::thread::sleep(protocol::POLL_INTERVAL);
            self.follow_key();
            if !self.registration.request().exists() {
                continue;
            }
            if Faults::current(Some(&self.state_dir)).restore_thread_stall {
                continue;
            }
            let Some(request) = protocol::take_request(&self.registration) else { continue };
            let request = match request {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cuda-test-double: ignoring a request: {e}");
                    continue;
                }
            };
            let result = std::panic::catch_unwind(|| self.serve(&request.op)).unwrap_or(CUDA_ERROR_UNKNOWN);
            self.trace(format_args!("{} -> {result}", request.op.name()));
            if let Err(e) = protocol::answer(&self.registration, &Response { id: request.id, result }) {
                eprintln!("cuda-test-double: cannot answer the controller: {e}");
            }
        }
    }

    /// One checkpoint operation on this process. Runs on the restore thread.
    pub fn serve(&self, op: &Op) -> i32 {
        let faults = Faults::current(Some(&self.state_dir));
        for knob in &faults.unknown {
            eprintln!("cuda-test-double: unknown fault knob `{knob}` ignored; see docs/TEST-DOUBLES.md");
        }
        match op {
            Op::Lock { timeout_ms } => self.lock(*timeout_ms, faults.lock_timeout),
            Op::Checkpoint => self.checkpoint(faults.checkpoint_fail),
            Op::Restore { pairs } => {
                if let Some(ms) = faults.restore_slow_ms {
                    // A restore of much device memory: time for a test to kill CRIU in the middle.
                    std::thread::sleep(Duration::from_millis(ms));
                }
                self.restore(pairs.as_deref(), faults.restore_fail)
            }
            Op::Unlock => self.unlock(faults.unlock_fail),
            Op::CheckpointCustom => self.checkpoint_custom(faults.checkpoint_fail),
            Op::RestoreCustom { pairs } => self.restore_custom(pairs.as_deref(), faults.restore_fail),
            Op::Complete => self.complete(),
        }
    }

    // ---- custom storage (CUDA 13.4): the caller copies the device memory itself --------------

    /// The allocations of GPU slot `slot`, in handle order: each one's place in the slot's region is the sum of
    /// the sizes before it.
    fn slot_allocations(&self, inner: &Inner, slot: usize) -> Vec<(u64, Allocation)> {
        inner
            .allocations
            .iter()
            .filter(|(_, a)| self.ordinals.get(a.ordinal) == Some(&slot))
            .map(|(h, a)| (*h, *a))
            .collect()
    }

    /// Writes the region list the caller maps: one line per slot, `UUID SIZE PATH`.
    fn write_regions(&self, inner: &Inner) -> Result<(), CustomStorageError> {
        let mut text = String::new();
        for slot in 0..inner.current.len() {
            let size: u64 = self.slot_allocations(inner, slot).iter().map(|(_, a)| a.size).sum();
            let uuid = &inner.config.gpus[inner.current[slot]].uuid;
            text.push_str(&format!("{uuid} {size} {}\n", self.registration.custom_region(slot).display()));
        }
        Ok(ccm_sim_common::write_atomic(&self.registration.custom_regions(), text.as_bytes())?)
    }

    fn set_state(&self, inner: &mut Inner, state: i32) {
        inner.state = state;
        self.write_state_file(state);
    }

    /// Every step of a custom-storage operation is file I/O; a failure answers CUDA_ERROR_OPERATING_SYSTEM and the
    /// process stays in the state it was in.
    fn failed(step: &str, e: CustomStorageError) -> i32 {
        eprintln!("cuda-test-double: {step}: {e}");
        CUDA_ERROR_OPERATING_SYSTEM
    }

    /// `cuCheckpointProcessCheckpoint` with custom storage: each slot's allocations laid end to end in its region
    /// file (the mapping the real driver makes in the caller); CHECKPOINTING until the caller completes.
    fn checkpoint_custom(&self, forced_failure: Option<i32>) -> i32 {
        let mut inner = self.lock_inner();
        if inner.state != STATE_LOCKED {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        if let Some(code) = forced_failure {
            return code;
        }
        if let Err(e) = self.lay_out_regions(&inner) {
            return Self::failed("custom checkpoint", e);
        }
        inner.custom = Some(Custom::Checkpointing);
        self.set_state(&mut inner, STATE_CHECKPOINTING);
        CUDA_SUCCESS
    }

    fn lay_out_regions(&self, inner: &Inner) -> Result<(), CustomStorageError> {
        for slot in 0..inner.current.len() {
            let mut region = Vec::new();
            for (handle, a) in self.slot_allocations(inner, slot) {
                let path = self.allocation_path(inner, handle, &a).map_err(|_| CustomStorageError::Ordinal)?;
                let bytes = std::fs::read(path).map_err(|source| CustomStorageError::Allocation { handle, source })?;
                region.extend_from_slice(&bytes);
            }
            std::fs::write(self.registration.custom_region(slot), &region)
                .map_err(|source| CustomStorageError::Region { slot, source })?;
        }
        self.write_regions(inner)
    }

    /// `cuCheckpointProcessRestore` with custom storage: empty regions of each slot's size, which the caller fills,
    /// on the GPUs the map names; RESTORING until the caller completes.
    fn restore_custom(&self, pairs: Option<&[(SimUuid, SimUuid)]>, forced_failure: Option<i32>) -> i32 {
        let mut inner = self.lock_inner();
        if inner.state != STATE_CHECKPOINTED || inner.custom != Some(Custom::Stored) {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        if let Some(code) = forced_failure {
            return code;
        }
        let node = SimConfig::from_env().unwrap_or_else(|_| inner.config.clone());
        let next = match self.plan_restore(&inner, &node, pairs) {
            Ok(n) => n,
            Err(code) => return code,
        };
        // A slot's region is as large as its allocations, on whichever GPU: made before the move, so that a
        // failure leaves the process CHECKPOINTED on its old GPUs.
        let made = (0..inner.current.len()).try_for_each(|slot| {
            let size: u64 = self.slot_allocations(&inner, slot).iter().map(|(_, a)| a.size).sum();
            File::create(self.registration.custom_region(slot))
                .and_then(|f| f.set_len(size))
                .map_err(|source| CustomStorageError::Region { slot, source })
        });
        if let Err(e) = made {
            return Self::failed("custom restore", e);
        }
        inner.current = next;
        inner.config = node;
        if let Err(e) = self.write_regions(&inner) {
            return Self::failed("custom restore", e);
        }
        inner.custom = Some(Custom::Restoring);
        self.set_state(&mut inner, STATE_RESTORING);
        CUDA_SUCCESS
    }

    /// `cuCheckpointOperationComplete`: a checkpoint drops the device memory (CHECKPOINTED, in the caller's storage
    /// only); a restore cuts the filled regions back into allocations (LOCKED).
    fn complete(&self) -> i32 {
        let mut inner = self.lock_inner();
        match inner.custom {
            Some(Custom::Checkpointing) => {
                for (handle, a) in inner.allocations.clone() {
                    if let Ok(path) = self.allocation_path(&inner, handle, &a) {
                        let _ = std::fs::remove_file(path);
                    }
                }
                inner.node_fds.clear();
                inner.custom = Some(Custom::Stored);
                self.set_state(&mut inner, STATE_CHECKPOINTED);
            }
            Some(Custom::Restoring) => {
                if let Err(e) = self.cut_regions(&mut inner) {
                    return Self::failed("custom restore's completion", e);
                }
                inner.custom = None;
                self.set_state(&mut inner, STATE_LOCKED);
            }
            _ => return CUDA_ERROR_ILLEGAL_STATE,
        }
        for slot in 0..inner.current.len() {
            let _ = std::fs::remove_file(self.registration.custom_region(slot));
        }
        let _ = std::fs::remove_file(self.registration.custom_regions());
        CUDA_SUCCESS
    }

    /// The filled regions cut back into the allocations, on the GPUs the restore moved them to; the nodes opened.
    fn cut_regions(&self, inner: &mut Inner) -> Result<(), CustomStorageError> {
        for slot in 0..inner.current.len() {
            let region = std::fs::read(self.registration.custom_region(slot))
                .map_err(|source| CustomStorageError::Region { slot, source })?;
            let mut at = 0usize;
            for (handle, a) in self.slot_allocations(inner, slot) {
                let end = at + a.size as usize;
                let path = self.allocation_path(inner, handle, &a).map_err(|_| CustomStorageError::Ordinal)?;
                path.parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::write(&path, region.get(at..end).unwrap_or_default()))
                    .map_err(|source| CustomStorageError::Allocation { handle, source })?;
                at = end;
            }
        }
        Ok(self.open_nodes(inner)?)
    }

    /// Maps another process's region (a custom-storage operation this process called) at a device pointer of
    /// this process's `ordinal`.
    pub fn map_region(
        &self,
        inner: &mut Inner,
        ordinal: usize,
        path: std::path::PathBuf,
        size: u64,
    ) -> Result<u64, i32> {
        let slot = *self.ordinals.get(ordinal).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let handle = inner.next_handle;
        inner.next_handle += 1;
        inner.mapped.insert(handle, (slot, path, size));
        Ok(DPTR_BASE + handle * DPTR_STRIDE)
    }

    /// Undoes [`Self::map_region`].
    pub fn unmap_region(&self, inner: &mut Inner, dptr: u64) {
        if let Some(h) = dptr.checked_sub(DPTR_BASE).map(|d| d / DPTR_STRIDE) {
            inner.mapped.remove(&h);
        }
    }

    /// The CUDA ordinal this process sees GPU `uuid` as, now.
    pub fn ordinal_of(&self, inner: &Inner, uuid: &SimUuid) -> Option<usize> {
        (0..self.ordinals.len()).find(|&o| inner.config.gpus[inner.current[self.ordinals[o]]].uuid == *uuid)
    }

    fn lock(&self, timeout_ms: u32, forced_timeout: bool) -> i32 {
        // 0 means "no timeout" in the driver's API.
        let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(u64::from(timeout_ms)));
        if forced_timeout {
            std::thread::sleep(Duration::from_millis(u64::from(timeout_ms.min(60_000))));
            return CUDA_ERROR_NOT_READY;
        }
        // Waiting for the mutex is waiting for the app's calls in flight to finish.
        let mut inner = loop {
            match self.inner.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return CUDA_ERROR_NOT_READY;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        if inner.state != STATE_RUNNING {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        inner.state = STATE_LOCKED;
        self.write_state_file(STATE_LOCKED);
        CUDA_SUCCESS
    }

    fn checkpoint(&self, forced_failure: Option<i32>) -> i32 {
        let mut inner = self.lock_inner();
        if inner.state != STATE_LOCKED {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        if let Some(code) = forced_failure {
            return code;
        }
        // Copy every allocation into this process's host memory first; delete the device files
        // only when all copies succeeded, so a failure leaves the process LOCKED and intact.
        let mut saved = BTreeMap::new();
        let handles: Vec<(u64, Allocation)> = inner.allocations.iter().map(|(h, a)| (*h, *a)).collect();
        for (handle, a) in &handles {
            let mut buffer = match HostCopy::new(a.size as usize) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("cuda-test-double: checkpoint cannot map host memory for allocation {handle}: {e}");
                    return CUDA_ERROR_OPERATING_SYSTEM;
                }
            };
            let read = self
                .allocation_path(&inner, *handle, a)
                .map_err(|_| std::io::Error::other("bad ordinal"))
                .and_then(File::open)
                .and_then(|f| f.read_exact_at(buffer.bytes_mut(), 0));
            if let Err(e) = read {
                eprintln!("cuda-test-double: checkpoint cannot read device memory {handle}: {e}");
                return CUDA_ERROR_OPERATING_SYSTEM;
            }
            saved.insert(*handle, buffer);
        }
        for (handle, a) in &handles {
            if let Ok(path) = self.allocation_path(&inner, *handle, a) {
                let _ = std::fs::remove_file(path);
            }
        }
        inner.saved = saved;
        // The real driver holds no /dev/nvidia* descriptor once checkpointed.
        inner.node_fds.clear();
        inner.state = STATE_CHECKPOINTED;
        self.write_state_file(STATE_CHECKPOINTED);
        CUDA_SUCCESS
    }

    /// The new GPU (an index into `node.gpus`, the GPU set of the machine the process is restored
    /// on) of every slot under `pairs`, or `CUDA_ERROR_INVALID_VALUE` if the map does not cover every
    /// enumerated GPU with distinct GPUs of the same chip. Without pairs every GPU must be there again.
    fn plan_restore(
        &self,
        inner: &Inner,
        node: &SimConfig,
        pairs: Option<&[(SimUuid, SimUuid)]>,
    ) -> Result<Vec<usize>, i32> {
        let mut next = Vec::with_capacity(inner.current.len());
        for &old in &inner.current {
            let old_gpu = &inner.config.gpus[old];
            let new_uuid = match pairs.filter(|p| !p.is_empty()) {
                // Not measured: what the real driver answers for a restore without pairs on a machine
                // that lacks one of the process's GPUs.
                None => old_gpu.uuid,
                Some(pairs) => {
                    let mut matching = pairs.iter().filter(|(o, _)| *o == old_gpu.uuid);
                    let (_, new_uuid) = matching.next().ok_or(CUDA_ERROR_INVALID_VALUE)?;
                    if matching.next().is_some() {
                        return Err(CUDA_ERROR_INVALID_VALUE);
                    }
                    *new_uuid
                }
            };
            let new = node.gpu_by_uuid(&new_uuid).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if node.gpus[new].pci_device_id != old_gpu.pci_device_id || next.contains(&new) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            next.push(new);
        }
        Ok(next)
    }

    fn restore(&self, pairs: Option<&[(SimUuid, SimUuid)]>, forced_failure: Option<i32>) -> i32 {
        let mut inner = self.lock_inner();
        if inner.state != STATE_CHECKPOINTED {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        if inner.custom == Some(Custom::Stored) {
            // Not measured on a real driver: what it answers for a restore from host memory that holds nothing.
            eprintln!(
                "cuda-test-double: restore from host memory, but the checkpoint went to the caller's custom storage"
            );
            return CUDA_ERROR_INVALID_VALUE;
        }
        if let Some(code) = forced_failure {
            return code;
        }
        // The machine the process is restored on: the GPU set file as it is now.
        let node = match SimConfig::from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cuda-test-double: restore cannot read the GPU set ({e}); keeping the one of cuInit");
                inner.config.clone()
            }
        };
        let next = match self.plan_restore(&inner, &node, pairs) {
            Ok(n) => n,
            Err(code) => {
                self.trace(format_args!("restore refused the device map (stays CHECKPOINTED)"));
                return code;
            }
        };
        let previous = (std::mem::replace(&mut inner.current, next), std::mem::replace(&mut inner.config, node));
        let mut written = Vec::new();
        for (handle, a) in inner.allocations.clone() {
            let Some(bytes) = inner.saved.get(&handle) else { continue };
            let path = match self.allocation_path(&inner, handle, &a) {
                Ok(p) => p,
                Err(code) => return self.undo_restore(&mut inner, previous, &written, code),
            };
            let result = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&path, bytes.bytes()));
            if let Err(e) = result {
                eprintln!("cuda-test-double: restore cannot write device memory {}: {e}", path.display());
                return self.undo_restore(&mut inner, previous, &written, CUDA_ERROR_OPERATING_SYSTEM);
            }
            written.push(path);
        }
        if let Err(e) = self.open_nodes(&mut inner) {
            eprintln!("cuda-test-double: {e}");
            return self.undo_restore(&mut inner, previous, &written, CUDA_ERROR_OPERATING_SYSTEM);
        }
        inner.saved.clear();
        inner.state = STATE_LOCKED;
        self.write_state_file(STATE_LOCKED);
        CUDA_SUCCESS
    }

    fn undo_restore(
        &self,
        inner: &mut Inner,
        previous: (Vec<usize>, SimConfig),
        written: &[std::path::PathBuf],
        code: i32,
    ) -> i32 {
        for p in written {
            let _ = std::fs::remove_file(p);
        }
        inner.node_fds.clear();
        (inner.current, inner.config) = previous;
        code
    }

    fn unlock(&self, forced_failure: Option<i32>) -> i32 {
        let mut inner = self.lock_inner();
        if inner.state != STATE_LOCKED {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        if let Some(code) = forced_failure {
            return code;
        }
        inner.state = STATE_RUNNING;
        self.write_state_file(STATE_RUNNING);
        self.unlocked.notify_all();
        CUDA_SUCCESS
    }
}

/// Removes this process's registration when it exits normally. A process killed by CRIU's dump
/// keeps it: the restored process has the same registration id and restore thread and needs it again.
/// Its device memory goes away too, as the real driver frees a process's memory at exit.
extern "C" fn unregister_at_exit() {
    if let Some(Ok(d)) = DRIVER.get() {
        // try_lock: a thread may have exited the process while holding the lock; then the files stay.
        if let Ok(inner) = d.inner.try_lock() {
            for (handle, a) in &inner.allocations {
                if let Ok(path) = d.allocation_path(&inner, *handle, a) {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        if let Ok(Some(key)) = d.key.try_lock().map(|k| *k) {
            d.state_dir.unpoint_index(&key, &d.registration);
        }
        let _ = std::fs::remove_dir_all(d.registration.dir());
    }
}

/// 64 random bits for a registration id (never 0).
fn random_id() -> Result<u64, StartError> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into the buffer it is given.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(StartError::Os(format!("getrandom failed: {}", std::io::Error::last_os_error())));
    }
    Ok(u64::from_ne_bytes(bytes).max(1))
}

/// A checkpoint's host copy of one allocation, in an anonymous mapping of its own, as the real driver
/// adds mappings for it: never in the malloc heap, where a freed copy would stay after the restore
/// (glibc keeps large freed chunks once its mmap threshold has grown) and every later dump's scan of
/// the heap would read it.
struct HostCopy {
    at: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone and only reached through it (under the driver's lock).
unsafe impl Send for HostCopy {}

impl HostCopy {
    fn new(len: usize) -> Result<HostCopy, String> {
        let at = anonymous_map(len).map_err(|e| e.to_string())?;
        Ok(HostCopy { at, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `at` is a live private mapping of at least `len` readable bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made (anonymous_map maps at least one byte); no slice of it
        // outlives `self`.
        unsafe { libc::munmap(self.at.cast(), self.len.max(1)) };
    }
}

fn anonymous_map(len: usize) -> Result<*mut u8, StartError> {
    // SAFETY: a private anonymous mapping at an address of the kernel's choice; the result is
    // checked for MAP_FAILED. It lives as long as the process, like the driver's own tables.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(StartError::Os(format!("mmap of {len} bytes failed: {}", std::io::Error::last_os_error())));
    }
    Ok(p.cast::<u8>())
}

/// Writes the six PCI words and the revision word at `at`.
///
/// # Safety
/// `at` must be valid for writes of 28 bytes.
unsafe fn write_words(at: *mut u8, words: &[u32; 6]) {
    for (i, w) in words.iter().chain(std::iter::once(&PCI_REVISION)).enumerate() {
        // SAFETY: guaranteed by the caller; unaligned writes are allowed for any offset.
        unsafe { std::ptr::write_unaligned(at.add(4 * i).cast::<u32>(), *w) };
    }
}
