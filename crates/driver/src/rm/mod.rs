//! The NVIDIA kernel driver's resource manager (RM), asked about the video memory of processes.
//!
//! For each process and GPU the RM keeps three sums of the memory objects the process's clients
//! hold (`NV2080_CTRL_CMD_GPU_GET_PID_INFO`): private, shared and owned (the process allocated it;
//! every CUDA allocation counts here, since the driver dups its own objects), and **shared and
//! duped: memory the process dup'd from another process's allocation**, which is what importing
//! CUDA IPC memory (`cuIpcOpenMemHandle`, `cuMemImportFromShareableHandle`) does. Measured on driver
//! 580.159.04 (GPU-FACTS.md, "The resource manager sees CUDA IPC importers"): every importer showed
//! its imported size as duped, no single process did. Driver 580 checkpoints an importer but cannot
//! restore it, so this is what lets a dump refuse such a tree before anything is checkpointed.
//!
//! The client: the version check against `/proc/driver/nvidia/version`, the card list, a client
//! object, per attached GPU a device and subdevice object (with `/dev/nvidiaN` held open, which
//! the driver requires), the control, and the client freed (which frees everything under it).
//! `/dev/nvidiactl` and `/dev/nvidiaN` are opened relative to `/dev` without following a link and
//! must be character devices of the NVIDIA major and the expected minor. Every ioctl's failure and
//! every RM status is a typed [`RmError`]; [`video_memory_within`] bounds the whole query by a
//! deadline (a wedged driver must not hold a dump).
//!
//! This is driver contact: it runs in the driver agent (and the command-line tool), never in CRIU's
//! process.

pub mod abi;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use ccm_identity::PciAddress;
use rustix::fs::{FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};

pub use abi::RmStatus;

/// Where the loaded module says its version.
pub const VERSION_FILE: &str = "/proc/driver/nvidia/version";
/// Largest read of the version file (it is a few hundred bytes).
const VERSION_FILE_MAX: usize = 4096;

/// Why the RM could not be asked. The dump then goes on without the importer check and says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RmError {
    #[error("{path} cannot be opened ({why}): no NVIDIA kernel driver, or CRIU runs where it does not see it")]
    Open { path: String, why: String },
    #[error("{path} is not the NVIDIA driver's device ({what}); refusing to send it ioctls")]
    NotNvidiaDevice {
        path: String,
        #[source]
        what: NotNvidiaNode,
    },
    #[error("{VERSION_FILE}: {0}")]
    Version(String),
    #[error(
        "the kernel module refused this client's version {ours} (it is {driver}): {VERSION_FILE} and the loaded \
         module disagree"
    )]
    VersionMismatch { ours: String, driver: String },
    #[error("ioctl {call} failed: {errno}")]
    Ioctl { call: &'static str, errno: String },
    #[error("{call} answered {status}")]
    Status { call: &'static str, status: RmStatus },
    #[error("GPU id {gpu_id:#x} is attached but has no card entry")]
    UnknownGpu { gpu_id: u32 },
    #[error("no answer within {} ms (the query runs on; nothing waits for it)", .0.as_millis())]
    Deadline(Duration),
    #[error("the query's thread could not start: {0}")]
    Thread(String),
}

/// One process's video memory on one GPU, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VideoMemory {
    pub private: u64,
    pub shared_owned: u64,
    /// Memory dup'd from another process's allocation: imported through CUDA IPC.
    pub shared_duped: u64,
}

impl VideoMemory {
    pub fn total(&self) -> u64 {
        self.private.saturating_add(self.shared_owned).saturating_add(self.shared_duped)
    }
}

/// What the RM said of one asked pid on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidMemory {
    pub pid: u32,
    /// The RM's answer for this pid (`NV_OK`, or why it has none).
    pub status: RmStatus,
    pub memory: VideoMemory,
}

/// One attached GPU's answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPidMemory {
    pub pci: PciAddress,
    pub minor: u32,
    pub pids: Vec<PidMemory>,
}

/// The whole answer: every attached GPU, every asked pid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PidMemoryReport {
    pub driver_version: String,
    pub gpus: Vec<GpuPidMemory>,
    /// How long the query took, from the version file to the freed client.
    pub seconds: f64,
}

/// `f` on a thread of its own, answered within `deadline`: a driver that does not answer leaves that thread
/// waiting in its ioctl, and the caller goes on with [`RmError::Deadline`].
fn within<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> Result<T, RmError> + Send + 'static,
) -> Result<T, RmError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ccm-rm-query".into())
        .spawn(move || {
            // The receiver may have given up: then nobody needs the answer.
            let _ = tx.send(f());
        })
        .map_err(|e| RmError::Thread(e.to_string()))?;
    rx.recv_timeout(deadline).unwrap_or(Err(RmError::Deadline(deadline)))
}

/// [`video_memory`] within `deadline`.
pub fn video_memory_within(pids: &[u32], deadline: Duration) -> Result<PidMemoryReport, RmError> {
    let pids = pids.to_vec();
    within(deadline, move || video_memory(&pids))
}

/// Asks the RM what each of `pids` (pids of this process's pid namespace) holds on every attached GPU.
pub fn video_memory(pids: &[u32]) -> Result<PidMemoryReport, RmError> {
    let started = Instant::now();
    let session = Session::open()?;
    let gpus = session.each_gpu(|client, subdevice| {
        let mut answers = Vec::with_capacity(pids.len());
        for chunk in pids.chunks(abi::PID_INFO_MAX) {
            answers.extend(client.pid_info(subdevice, chunk)?);
        }
        Ok(answers)
    })?;
    let gpus = gpus.into_iter().map(|(pci, minor, pids)| GpuPidMemory { pci, minor, pids }).collect();
    Ok(PidMemoryReport { driver_version: session.version, gpus, seconds: started.elapsed().as_secs_f64() })
}

/// [`video_memory`] asked `rounds` times on one client: every GPU's objects made and freed again each time. On a
/// one-GPU machine this is the shape of a multi-GPU node's query (the handles of one client must differ for
/// every object it holds); `ccm-bench rm-repeat` runs it on the GPU machine.
pub fn video_memory_repeated(pids: &[u32], rounds: usize) -> Result<Vec<PidMemoryReport>, RmError> {
    let session = Session::open()?;
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let gpus = session
            .each_gpu(|client, subdevice| client.pid_info(subdevice, &pids[..pids.len().min(abi::PID_INFO_MAX)]))?;
        let gpus = gpus.into_iter().map(|(pci, minor, pids)| GpuPidMemory { pci, minor, pids }).collect();
        out.push(PidMemoryReport {
            driver_version: session.version.clone(),
            gpus,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    Ok(out)
}

/// One attached GPU's memory as the RM's heap has it (`NV2080_CTRL_CMD_FB_GET_INFO_V2`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFramebuffer {
    pub pci: PciAddress,
    pub minor: u32,
    /// `HEAP_FREE`: what allocations can still take (measured on 580.159.04: NVML's `free`, to the KiB).
    pub free: u64,
    /// `TOTAL_RAM_SIZE` (NVML's `total`).
    pub total: u64,
}

/// Every attached GPU's free and total memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FramebufferReport {
    pub driver_version: String,
    pub gpus: Vec<GpuFramebuffer>,
    pub seconds: f64,
}

/// [`framebuffer`] within `deadline`.
pub fn framebuffer_within(deadline: Duration) -> Result<FramebufferReport, RmError> {
    within(deadline, framebuffer)
}

/// Every attached GPU's free and total memory, from the RM's heap: about 1 ms, where NVML's start and first
/// memory query take 15-20 ms (measured: docs/BENCHMARKS.md).
pub fn framebuffer() -> Result<FramebufferReport, RmError> {
    let started = Instant::now();
    let session = Session::open()?;
    let gpus = session.each_gpu(|client, subdevice| client.fb_info(subdevice))?;
    let gpus = gpus.into_iter().map(|(pci, minor, (free, total))| GpuFramebuffer { pci, minor, free, total }).collect();
    Ok(FramebufferReport { driver_version: session.version, gpus, seconds: started.elapsed().as_secs_f64() })
}

/// The handshake every query starts with: the version check on `/dev/nvidiactl`, the card list and a client.
struct Session {
    version: String,
    dev: OwnedFd,
    cards: Vec<abi::CardInfo>,
    client: Client,
}

impl Session {
    fn open() -> Result<Session, RmError> {
        let version = read_version()?;
        let dev = open_dev_dir()?;
        let ctl = open_nvidia_node(&dev, "nvidiactl", abi::CTL_MINOR)?;
        check_version(ctl.as_fd(), &version)?;
        let cards = card_info(ctl.as_fd())?;
        let client = Client::new(ctl)?;
        Ok(Session { version, dev, cards, client })
    }

    /// `ask` of every attached GPU's subdevice, with the GPU's PCI location and minor.
    fn each_gpu<T>(
        &self,
        mut ask: impl FnMut(&Client, u32) -> Result<T, RmError>,
    ) -> Result<Vec<(PciAddress, u32, T)>, RmError> {
        let mut out = Vec::new();
        for gpu_id in self.client.attached_gpu_ids()? {
            let card = self.cards.iter().find(|c| c.gpu_id == gpu_id).ok_or(RmError::UnknownGpu { gpu_id })?;
            let ids = self.client.id_info(gpu_id)?;
            // Held open while the device object exists: the driver allocates a device only for a
            // process that has its node open.
            let _gpu_node = open_nvidia_node(&self.dev, &format!("nvidia{}", card.minor_number), card.minor_number)?;
            let objects = self.client.subdevice(ids)?;
            let answer = ask(&self.client, objects.subdevice)?;
            // The objects go before the GPU's node closes, and before the next GPU's are made.
            drop(objects);
            let pci = PciAddress {
                domain: card.domain,
                bus: card.bus.into(),
                device: card.slot.into(),
                function: card.function.into(),
            };
            out.push((pci, card.minor_number, answer));
        }
        Ok(out)
    }
}

/// The loaded module's version, from the first line of `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...`).
fn read_version() -> Result<String, RmError> {
    let fd = rustix::fs::open(VERSION_FILE, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| RmError::Version(format!("cannot open it: {e}; is the NVIDIA kernel driver loaded?")))?;
    let mut buf = vec![0u8; VERSION_FILE_MAX];
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RmError::Version(format!("cannot read it: {e}"))),
        }
    }
    buf.truncate(len);
    parse_version(&String::from_utf8_lossy(&buf)).ok_or_else(|| RmError::Version("names no driver version".into()))
}

/// The first word of the first line made of digits and dots only, with a dot (`580.159.04`).
pub fn parse_version(text: &str) -> Option<String> {
    text.lines().next()?.split_whitespace().find_map(|w| {
        let is_version = w.len() < 64
            && w.starts_with(|c: char| c.is_ascii_digit())
            && w.contains('.')
            && w.chars().all(|c| c.is_ascii_digit() || c == '.');
        is_version.then(|| w.to_string())
    })
}

fn open_dev_dir() -> Result<OwnedFd, RmError> {
    rustix::fs::open("/dev", OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| RmError::Open { path: "/dev".into(), why: e.to_string() })
}

/// Opens `/dev/NAME` for ioctls: no link followed, and it must be the NVIDIA character device of `minor`.
fn open_nvidia_node(dev: &OwnedFd, name: &str, minor: u32) -> Result<OwnedFd, RmError> {
    let path = format!("/dev/{name}");
    let fd = rustix::fs::openat(
        dev,
        name,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RmError::Open { path: path.clone(), why: e.to_string() })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| RmError::Open { path: path.clone(), why: e.to_string() })?;
    check_node(FileType::from_raw_mode(st.st_mode), st.st_rdev, minor)
        .map_err(|what| RmError::NotNvidiaDevice { path, what })?;
    Ok(fd)
}

/// What a node that is not the NVIDIA character device of the expected minor is instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotNvidiaNode {
    #[error("a {kind:?}, not a character device")]
    NotCharacterDevice { kind: FileType },
    #[error("device {major}:{minor}, where the NVIDIA driver's is {}:{wanted_minor}", abi::NVIDIA_MAJOR)]
    OtherDevice { major: u32, minor: u32, wanted_minor: u32 },
}

/// Whether a node is the NVIDIA character device of `minor`; what it is otherwise.
pub fn check_node(kind: FileType, rdev: u64, minor: u32) -> Result<(), NotNvidiaNode> {
    if kind != FileType::CharacterDevice {
        return Err(NotNvidiaNode::NotCharacterDevice { kind });
    }
    let (major_seen, minor_seen) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    if (major_seen, minor_seen) != (abi::NVIDIA_MAJOR, minor) {
        return Err(NotNvidiaNode::OtherDevice { major: major_seen, minor: minor_seen, wanted_minor: minor });
    }
    Ok(())
}

/// One ioctl on an NVIDIA node whose argument is `arg`.
///
/// # Safety
/// `arg` must be the argument struct of escape `nr` (its size is the request's) and every pointer
/// inside it must point at memory valid for the driver to read and write for the length recorded
/// next to it, until this returns.
unsafe fn ioctl<T>(fd: BorrowedFd<'_>, nr: u8, call: &'static str, arg: &mut T) -> Result<(), RmError> {
    let request = abi::iowr(nr, std::mem::size_of::<T>());
    // SAFETY: `fd` is open for the whole call; `arg` is an exclusively borrowed, initialised
    // `#[repr(C)]` struct of exactly the size the request encodes, so the driver's copy in and out
    // stays inside it; the pointers inside it are the caller's promise (this function's contract).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, std::ptr::from_mut(arg)) };
    if rc < 0 {
        return Err(RmError::Ioctl { call, errno: std::io::Error::last_os_error().to_string() });
    }
    Ok(())
}

/// The strict version check every file descriptor must pass before the RM answers on it.
fn check_version(ctl: BorrowedFd<'_>, version: &str) -> Result<(), RmError> {
    let mut v = abi::ApiVersion { cmd: abi::VERSION_CMD_STRICT, reply: 0, version: [0; 64] };
    let bytes = version.as_bytes();
    // parse_version keeps it under 64 bytes; the last byte stays the string's end.
    let n = bytes.len().min(v.version.len() - 1);
    v.version[..n].copy_from_slice(&bytes[..n]);
    // SAFETY: ApiVersion is the argument of NV_ESC_CHECK_VERSION_STR and holds no pointer.
    let sent = unsafe { ioctl(ctl, abi::ESC_CHECK_VERSION_STR, "NV_ESC_CHECK_VERSION_STR", &mut v) };
    if sent.is_err() || v.reply != abi::VERSION_REPLY_RECOGNIZED {
        // On a mismatch the module writes its own version back.
        let end = v.version.iter().position(|b| *b == 0).unwrap_or(v.version.len());
        let driver = String::from_utf8_lossy(&v.version[..end]).into_owned();
        return Err(RmError::VersionMismatch { ours: version.to_string(), driver });
    }
    Ok(())
}

fn card_info(ctl: BorrowedFd<'_>) -> Result<Vec<abi::CardInfo>, RmError> {
    let mut cards = [abi::CardInfo::default(); abi::CARDS_MAX];
    // SAFETY: an array of nv_ioctl_card_info_t is NV_ESC_CARD_INFO's argument (the driver fills as
    // many entries as its size holds); it holds no pointer.
    unsafe { ioctl(ctl, abi::ESC_CARD_INFO, "NV_ESC_CARD_INFO", &mut cards)? };
    Ok(cards.into_iter().filter(|c| c.valid != 0).collect())
}

/// Handles this client gives its device and subdevice objects (the client's own comes from the RM).
/// The RM's object handles are the client's to choose, and must be unique within the client (a handle
/// allocated twice is refused with status 0x19, measured). Objects of this client take handles from here,
/// counting up: never derived from a GPU id, whose low byte is the PCI device number, 00 for every GPU of
/// the usual bare-metal layout (one GPU per bus: 0000:18:00.0, 0000:2a:00.0, ...).
#[derive(Debug)]
struct ObjectHandles {
    next: u32,
}

const OBJECT_HANDLE_BASE: u32 = 0xcc3d_0100;

impl ObjectHandles {
    fn new() -> ObjectHandles {
        ObjectHandles { next: OBJECT_HANDLE_BASE }
    }

    /// Two fresh handles: a device's and its subdevice's.
    fn next_pair(&mut self) -> (u32, u32) {
        let device = self.next;
        // 0xcc3d_0100 + 2 per GPU query: a few thousand queries per client would be needed to wrap into
        // another range, and a client lives for one query of every GPU.
        self.next = self.next.wrapping_add(2);
        (device, device.wrapping_add(1))
    }
}

/// An RM client on `/dev/nvidiactl`; freed (with every object under it) when dropped.
struct Client {
    ctl: OwnedFd,
    handle: u32,
    handles: std::cell::RefCell<ObjectHandles>,
}

/// A GPU's device and subdevice objects of a client, freed when dropped (the subdevice with its device).
struct GpuObjects<'c> {
    client: &'c Client,
    device: u32,
    subdevice: u32,
}

impl Drop for GpuObjects<'_> {
    fn drop(&mut self) {
        self.client.free(self.client.handle, self.device);
    }
}

impl Client {
    fn new(ctl: OwnedFd) -> Result<Client, RmError> {
        let mut name = [0u8; 100];
        let tag = b"criu-cuda-migrate";
        name[..tag.len()].copy_from_slice(tag);
        let mut params =
            abi::ClientAllocParams { client: 0, process_id: std::process::id(), process_name: name, os_pid_info: 0 };
        let handle = alloc(ctl.as_fd(), 0, 0, 0, abi::CLASS_ROOT, &mut params, "client")?;
        Ok(Client { ctl, handle, handles: std::cell::RefCell::new(ObjectHandles::new()) })
    }

    fn control<P>(&self, object: u32, cmd: u32, call: &'static str, params: &mut P) -> Result<(), RmError> {
        self.control_sized(object, cmd, call, params, param_size::<P>())
    }

    fn attached_gpu_ids(&self) -> Result<Vec<u32>, RmError> {
        let mut ids = abi::AttachedIds { gpu_ids: [abi::INVALID_GPU_ID; abi::MAX_ATTACHED_GPUS] };
        self.control(self.handle, abi::CTRL_GPU_GET_ATTACHED_IDS, "NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS", &mut ids)?;
        Ok(ids.gpu_ids.into_iter().take_while(|id| *id != abi::INVALID_GPU_ID).collect())
    }

    fn id_info(&self, gpu_id: u32) -> Result<abi::IdInfoV2, RmError> {
        let mut info = abi::IdInfoV2 { gpu_id, ..Default::default() };
        self.control(self.handle, abi::CTRL_GPU_GET_ID_INFO_V2, "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2", &mut info)?;
        Ok(info)
    }

    /// A device and a subdevice object for the GPU, under handles no other object of this client has
    /// ([`ObjectHandles`]); freed (the device, and the subdevice with it) when the guard drops.
    fn subdevice(&self, ids: abi::IdInfoV2) -> Result<GpuObjects<'_>, RmError> {
        let (device_handle, subdevice_handle) = self.handles.borrow_mut().next_pair();
        let mut device = abi::DeviceAllocParams { device_id: ids.device_instance, ..Default::default() };
        let d =
            alloc(self.ctl.as_fd(), self.handle, self.handle, device_handle, abi::CLASS_DEVICE, &mut device, "device")?;
        // The guard owns the device from here: a failed subdevice allocation frees it too. (Its fields are Copy:
        // building the result with `..objects` copied them and freed the device at this scope's end, so every
        // query met NV_ERR_OBJECT_NOT_FOUND; measured on the H200.)
        let mut objects = GpuObjects { client: self, device: d, subdevice: 0 };
        let mut sub = abi::SubdeviceAllocParams { subdevice_id: ids.subdevice_instance };
        objects.subdevice =
            alloc(self.ctl.as_fd(), self.handle, d, subdevice_handle, abi::CLASS_SUBDEVICE, &mut sub, "subdevice")?;
        Ok(objects)
    }

    /// Frees one object of this client (with everything under it).
    fn free(&self, parent: u32, object: u32) {
        let mut f = abi::Free { root: self.handle, parent, object, status: 0 };
        // SAFETY: NVOS00 is NV_ESC_RM_FREE's argument and holds no pointer. A failure leaks the object only
        // until the client is freed, which frees everything under it.
        let _ = unsafe { ioctl(self.ctl.as_fd(), abi::ESC_RM_FREE, "NV_ESC_RM_FREE", &mut f) };
    }

    fn pid_info(&self, subdevice: u32, pids: &[u32]) -> Result<Vec<PidMemory>, RmError> {
        let mut q = Box::<abi::GetPidInfo>::default();
        let count = pids.len().min(abi::PID_INFO_MAX);
        for (slot, pid) in q.list.iter_mut().zip(pids) {
            slot.pid = *pid;
            slot.index = abi::PID_INFO_INDEX_VIDEO_MEMORY;
        }
        // At most PID_INFO_MAX (200).
        q.count = u32::try_from(count).unwrap_or(0);
        if q.count == 0 {
            return Ok(Vec::new());
        }
        self.control(subdevice, abi::CTRL_GPU_GET_PID_INFO, "NV2080_CTRL_CMD_GPU_GET_PID_INFO", &mut *q)?;
        Ok(q.list[..count]
            .iter()
            .map(|e| PidMemory {
                pid: e.pid,
                status: RmStatus(e.result),
                memory: VideoMemory {
                    private: e.data.private,
                    shared_owned: e.data.shared_owned,
                    shared_duped: e.data.shared_duped,
                },
            })
            .collect())
    }
}

impl Client {
    /// The subdevice's heap free and total RAM (bytes). The control embeds a list whose length differs between
    /// driver branches (`NV2080_CTRL_FB_INFO_MAX_LIST_SIZE`: 0x80 on 580.159.04, 0x39 and 0x36 in older public
    /// headers) and the RM refuses a parameter size that is not its own: each known size is tried, newest first.
    fn fb_info(&self, subdevice: u32) -> Result<(u64, u64), RmError> {
        let mut last = RmStatus::OK;
        for &entries in abi::FB_INFO_LIST_SIZES {
            let mut q = abi::FbInfoV2 { count: 2, ..Default::default() };
            q.list[0].index = abi::FB_INFO_INDEX_HEAP_FREE;
            q.list[1].index = abi::FB_INFO_INDEX_TOTAL_RAM_SIZE;
            match self.control_sized(
                subdevice,
                abi::CTRL_FB_GET_INFO_V2,
                "NV2080_CTRL_CMD_FB_GET_INFO_V2",
                &mut q,
                abi::fb_info_v2_size(entries),
            ) {
                Ok(()) => return Ok((u64::from(q.list[0].data) << 10, u64::from(q.list[1].data) << 10)),
                Err(RmError::Status { status, .. }) if status == abi::RM_INVALID_PARAM_STRUCT => last = status,
                Err(e) => return Err(e),
            }
        }
        Err(RmError::Status { call: "NV2080_CTRL_CMD_FB_GET_INFO_V2 (every known list size)", status: last })
    }

    /// [`Client::control`] with a parameter size smaller than `P` (the driver reads and writes only that much).
    fn control_sized<P>(
        &self,
        object: u32,
        cmd: u32,
        call: &'static str,
        params: &mut P,
        size: u32,
    ) -> Result<(), RmError> {
        let size = size.min(param_size::<P>());
        let mut c = abi::Control {
            client: self.handle,
            object,
            cmd,
            flags: 0,
            params: std::ptr::from_mut(params) as u64,
            params_size: size,
            status: 0,
        };
        // SAFETY: NVOS54 is NV_ESC_RM_CONTROL's argument; its params pointer is `params`, exclusively borrowed
        // for this call, and the size beside it is at most `P`'s (clamped above).
        unsafe { ioctl(self.ctl.as_fd(), abi::ESC_RM_CONTROL, call, &mut c)? };
        status_ok(call, c.status)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut f = abi::Free { root: self.handle, parent: 0, object: self.handle, status: 0 };
        // SAFETY: NVOS00 is NV_ESC_RM_FREE's argument and holds no pointer. Freeing the client frees
        // its devices and subdevices; closing `ctl` right after would too, so a failure here leaks nothing.
        let _ = unsafe { ioctl(self.ctl.as_fd(), abi::ESC_RM_FREE, "NV_ESC_RM_FREE", &mut f) };
    }
}

/// The size of a parameter struct, for the RM's size field (all are a few KiB at most).
fn param_size<P>() -> u32 {
    u32::try_from(std::mem::size_of::<P>()).unwrap_or(u32::MAX)
}

fn status_ok(call: &'static str, status: u32) -> Result<(), RmError> {
    match RmStatus(status) {
        RmStatus::OK => Ok(()),
        status => Err(RmError::Status { call, status }),
    }
}

/// `NV_ESC_RM_ALLOC` of an object of `class` under `parent`; its handle (the RM's when `object` is 0).
fn alloc<P>(
    ctl: BorrowedFd<'_>,
    root: u32,
    parent: u32,
    object: u32,
    class: u32,
    params: &mut P,
    what: &'static str,
) -> Result<u32, RmError> {
    let call = match what {
        "client" => "NV_ESC_RM_ALLOC (client)",
        "device" => "NV_ESC_RM_ALLOC (device)",
        _ => "NV_ESC_RM_ALLOC (subdevice)",
    };
    let mut a = abi::Alloc {
        root,
        parent,
        object,
        class,
        params: std::ptr::from_mut(params) as u64,
        params_size: param_size::<P>(),
        status: 0,
    };
    // SAFETY: NVOS21 is NV_ESC_RM_ALLOC's argument; its params pointer is `params`, exclusively
    // borrowed for this call, of the size recorded beside it.
    unsafe { ioctl(ctl, abi::ESC_RM_ALLOC, call, &mut a)? };
    status_ok(call, a.status)?;
    Ok(a.object)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RM's gpu id: `(domain << 16) | (bus << 8) | device`.
    fn gpu_id(bus: u32) -> u32 {
        bus << 8
    }

    #[test]
    fn every_object_of_a_client_gets_its_own_handle_on_a_bare_metal_layout_and_when_asked_twice() {
        // DGX-style: one GPU per bus, each at device 00, so every gpu id has the same low byte (the scheme of
        // 2f503ee, `BASE | (gpu_id & 0xff)`, gave all eight GPUs the same device handle: 0x19 from the second on).
        let dgx: Vec<u32> = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb].into_iter().map(gpu_id).collect();
        assert!(dgx.iter().all(|id| id & 0xff == 0), "the layout's ids share their low byte");
        let mut h = ObjectHandles::new();
        let mut seen = std::collections::BTreeSet::new();
        // Two queries of every GPU on one client (the one-GPU machine's shape of the collision is the same GPU
        // twice): every device and subdevice handle differs from every other, and from the client's own.
        for _round in 0..2 {
            for _gpu in &dgx {
                let (d, s) = h.next_pair();
                assert!(seen.insert(d) && seen.insert(s), "handle reused: {d:#x} or {s:#x}");
            }
        }
        assert_eq!(seen.len(), 32);
        assert!(seen.iter().all(|&x| x >> 16 == 0xcc3d), "handles stay in the plugin's range");
    }

    #[test]
    fn the_version_is_read_from_the_first_line_of_either_driver_flavour() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  \
                    (dvs-builder@U22-I3-AF03-09-1)  Sun Oct 12 06:00:00 UTC 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(parse_version(open).as_deref(), Some("580.159.04"));
        let closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n";
        assert_eq!(parse_version(closed).as_deref(), Some("535.183.01"));
        assert_eq!(parse_version("NVRM version: none here\n580.1\n"), None);
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version(&format!("v {}.1", "9".repeat(80))), None);
    }

    #[test]
    fn only_the_nvidia_character_device_of_the_minor_is_taken() {
        let nv = |minor| rustix::fs::makedev(abi::NVIDIA_MAJOR, minor);
        assert_eq!(check_node(FileType::CharacterDevice, nv(255), abi::CTL_MINOR), Ok(()));
        assert!(check_node(FileType::CharacterDevice, nv(0), abi::CTL_MINOR)
            .unwrap_err()
            .to_string()
            .contains("195:0"));
        assert!(check_node(FileType::CharacterDevice, rustix::fs::makedev(1, 3), 0)
            .unwrap_err()
            .to_string()
            .contains("1:3"));
        assert!(check_node(FileType::RegularFile, nv(0), 0)
            .unwrap_err()
            .to_string()
            .contains("not a character device"));
        assert!(check_node(FileType::Symlink, nv(0), 0).is_err());
    }

    #[test]
    fn a_node_without_the_driver_is_an_open_error_not_a_panic() {
        // On machines without the NVIDIA driver (CI) the query ends at the version file or /dev/nvidiactl.
        if std::path::Path::new(VERSION_FILE).exists() {
            return;
        }
        let e = video_memory(&[1]).unwrap_err();
        assert!(matches!(e, RmError::Version(_)), "{e}");
        assert!(e.to_string().contains("NVIDIA kernel driver"), "{e}");
    }

    #[test]
    fn a_query_past_its_deadline_answers_deadline() {
        let e = video_memory_within(&[1], Duration::ZERO);
        // Either the query lost the race (no driver here answers within zero time) or it failed fast.
        assert!(e.is_err());
    }

    #[test]
    fn memory_sums_do_not_overflow() {
        let m = VideoMemory { private: u64::MAX, shared_owned: 1, shared_duped: 1 };
        assert_eq!(m.total(), u64::MAX);
    }
}
