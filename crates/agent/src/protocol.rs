//! What the plugin and its driver agent say to each other: one JSON document per frame, a frame
//! being a 4-byte little-endian length and the document. Requests carry an id; the agent answers
//! each in its own thread, so replies may come back in any order and carry the same id.

use std::io::{Read, Write};

use ccm_driver::nvml::GpuMemory;
use ccm_driver::rm::{FramebufferReport, PidMemoryReport};
use ccm_driver::CudaError;
use ccm_identity::{GpuIdentity, GpuUuid, PciAddress};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Largest frame either side accepts (a node with hundreds of GPUs stays far below).
pub const MAX_FRAME: usize = 4 << 20;

/// One driver or NVML call for the agent to make.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Call {
    /// Wait until libcuda is loaded (dlopen and `cuDriverGetVersion`, no `cuInit`).
    Driver,
    /// Wait until NVML has listed the node's GPUs too.
    Node,
    /// Wait for the agent's `cuInit(0)` (started as soon as libcuda was loaded).
    CuInit,
    RestoreThreadId {
        pid: i32,
    },
    State {
        pid: i32,
    },
    Lock {
        pid: i32,
        timeout_ms: u32,
    },
    Checkpoint {
        pid: i32,
    },
    Restore {
        pid: i32,
        pairs: Vec<(GpuUuid, GpuUuid)>,
    },
    Unlock {
        pid: i32,
    },
    /// NVML's `nvmlDeviceGetHandleByPciBusId_v2`, answered with the UUID found there.
    UuidAtPci {
        pci: PciAddress,
    },
    /// NVML's free memory and compute processes of every GPU, now.
    DeviceMemory,
    /// The kernel driver's resource manager: what each pid holds on every attached GPU, its memory
    /// dup'd from other processes (CUDA IPC imports) included; answered within `deadline_ms`.
    VideoMemory {
        pids: Vec<u32>,
        deadline_ms: u64,
    },
    /// The kernel driver's resource manager: every attached GPU's free and total memory (its heap), answered
    /// within `deadline_ms`.
    Framebuffer {
        deadline_ms: u64,
    },
    /// The plugin wrote `pid`'s staging pages to the page file at `page_file` (an absolute path in CRIU's mount
    /// namespace, which this agent shares) and released them in the task: should CRIU go away, this agent fills
    /// them back from there before it puts the process back (it never restores a process whose pages are not back).
    StagingReleased {
        pid: i32,
        page_file: String,
        table: ccm_identity::staging::StagingTable,
    },
    /// CUDA 13.4's custom storage: checkpoints the LOCKED `pid` with its device memory handed to this agent, which
    /// copies it into `page_file` (an absolute path in CRIU's mount namespace, of an empty regular file the plugin
    /// made) chunk by chunk (CRC32 each, all-zero chunks left out as holes), syncs it and completes the operation:
    /// the process is CHECKPOINTED and holds no device memory. Answered with the table
    /// ([`Answer::DriverStorage`]).
    CheckpointToStorage {
        pid: i32,
        page_file: String,
    },
    /// The restore from custom storage of the CHECKPOINTED `pid` onto the GPUs `pairs` name (empty: the same ones),
    /// its regions filled from `page_file` by `storage` (every chunk checked), then completed: the process is LOCKED.
    RestoreFromStorage {
        pid: i32,
        pairs: Vec<(GpuUuid, GpuUuid)>,
        page_file: String,
        storage: ccm_identity::staging::DriverStorage,
    },
    /// A dump that succeeded: CRIU now ends the processes this agent checkpointed. The agent stays until CRIU is gone
    /// and then puts back any of them that is still running and neither exiting nor being killed: CRIU resumes the
    /// tasks instead when its post-dump action script fails, after its exit hook was told the dump succeeded. A later
    /// [`Call::Exit`] is ignored.
    HandOver,
    /// The plugin is done: exit without touching any process.
    Exit,
}

impl Call {
    /// The call's name for messages: the driver function it makes.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Driver => "the load of libcuda",
            Call::Node => "NVML's GPU list",
            Call::CuInit => "cuInit",
            Call::RestoreThreadId { .. } => "cuCheckpointProcessGetRestoreThreadId",
            Call::State { .. } => "cuCheckpointProcessGetState",
            Call::Lock { .. } => "cuCheckpointProcessLock",
            Call::Checkpoint { .. } => "cuCheckpointProcessCheckpoint",
            Call::Restore { .. } => "cuCheckpointProcessRestore",
            Call::Unlock { .. } => "cuCheckpointProcessUnlock",
            Call::UuidAtPci { .. } => "nvmlDeviceGetHandleByPciBusId",
            Call::DeviceMemory => "NVML's memory query",
            Call::VideoMemory { .. } => "the resource manager's process memory query",
            Call::Framebuffer { .. } => "the resource manager's free memory query",
            Call::StagingReleased { .. } => "the record of released staging pages",
            Call::CheckpointToStorage { .. } => "cuCheckpointProcessCheckpoint to custom storage",
            Call::HandOver => "the hand-over of the dumped processes to CRIU",
            Call::RestoreFromStorage { .. } => "cuCheckpointProcessRestore from custom storage",
            Call::Exit => "exit",
        }
    }

    /// The process the call acts on.
    pub fn pid(&self) -> Option<i32> {
        match self {
            Call::RestoreThreadId { pid }
            | Call::State { pid }
            | Call::Lock { pid, .. }
            | Call::Checkpoint { pid }
            | Call::Restore { pid, .. }
            | Call::CheckpointToStorage { pid, .. }
            | Call::RestoreFromStorage { pid, .. }
            | Call::Unlock { pid } => Some(*pid),
            _ => None,
        }
    }
}

/// The driver libraries the agent loads: the settings' paths (`CRIU_CUDA_MIGRATE_LIBCUDA`,
/// `_LIBNVML` or their plugin options), `None` for the dynamic loader's search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverLibs {
    pub libcuda: Option<String>,
    pub libnvml: Option<String>,
}

/// libcuda as the agent loaded it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriverInfo {
    pub agent_pid: u32,
    pub libcuda_path: String,
    pub cuda_driver_version: i32,
    pub load_seconds: f64,
    /// Whether the driver offers custom storage (CUDA 13.4, driver r615: `cuCheckpointOperationComplete`).
    #[serde(default)]
    pub custom_storage: bool,
}

/// The node as NVML lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub driver: DriverInfo,
    /// `Err` with NVML's message when NVML is unavailable (the caller decides whether that is fatal).
    pub nvml: Result<NvmlInfo, NvmlUnavailable>,
}

/// Why NVML is unavailable in the agent: its start's failure (`ccm_driver::nvml::NvmlFailure`), as text, which is
/// what crosses the socket (a bare string on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{0}")]
pub struct NvmlUnavailable(pub String);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NvmlInfo {
    pub driver_version: String,
    /// Every GPU NVML sees, NVML index order.
    pub gpus: Vec<GpuIdentity>,
    /// Why the GPU list is empty, when it is.
    pub gpus_error: Option<String>,
    pub seconds: f64,
}

/// `cuInit` in the agent: how long it took there, and when it ended relative to the request.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CuInitInfo {
    pub seconds: f64,
    /// How long the request waited for it (0 when it had ended before).
    pub waited_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Answer {
    Driver(DriverInfo),
    Node(NodeInfo),
    CuInit(CuInitInfo),
    Done,
    Tid(i32),
    State(i32),
    Uuid(Option<GpuUuid>),
    DeviceMemory(Vec<GpuMemory>),
    VideoMemory(PidMemoryReport),
    Framebuffer(FramebufferReport),
    DriverStorage(ccm_identity::staging::DriverStorage),
}

/// A failure as it crosses the socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireError {
    /// A driver call's failure: its `CUresult` and the driver's texts (the call is the request's).
    Cuda {
        code: i32,
        name: String,
        description: String,
    },
    NoDriver(String),
    Nvml(String),
    /// The resource manager could not be asked (`ccm_driver::rm::RmError`'s text).
    Rm(String),
    Agent(String),
}

impl WireError {
    pub fn from_cuda(e: &CudaError) -> WireError {
        WireError::Cuda { code: e.code.raw(), name: e.name.clone(), description: e.description.clone() }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub call: Call,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    pub id: u64,
    pub result: Result<Answer, WireError>,
}

/// Writes one frame. The caller serialises writers.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {} bytes is over {MAX_FRAME}", body.len())));
    }
    // At most MAX_FRAME (checked above), which fits the u32 length word.
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)
}

/// Reads one frame; `Ok(None)` at a clean end of stream (the peer is gone).
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {len} bytes is over {MAX_FRAME}")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map(Some).map_err(std::io::Error::other)
}

/// Takes one whole frame off the front of `buf`; `Ok(None)` while `buf` holds less than a frame.
pub fn take_frame<T: DeserializeOwned>(buf: &mut Vec<u8>) -> std::io::Result<Option<T>> {
    let Some(len) = buf.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize) else {
        return Ok(None);
    };
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {len} bytes is over {MAX_FRAME}")));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[4..4 + len]).map_err(std::io::Error::other);
    buf.drain(..4 + len);
    msg.map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request { id: 7, call: Call::Lock { pid: 42, timeout_ms: 10_000 } }).unwrap();
        write_frame(&mut buf, &Reply { id: 7, result: Err(WireError::Agent("x".into())) }).unwrap();
        let mut r = &buf[..];
        let req: Request = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(req.id, 7);
        assert!(matches!(req.call, Call::Lock { pid: 42, timeout_ms: 10_000 }));
        let rep: Reply = read_frame(&mut r).unwrap().unwrap();
        assert!(matches!(rep.result, Err(WireError::Agent(_))));
        assert!(read_frame::<Reply>(&mut r).unwrap().is_none());
    }

    #[test]
    fn frames_are_taken_whole_from_partial_reads() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &Reply { id: 1, result: Ok(Answer::Done) }).unwrap();
        write_frame(&mut wire, &Reply { id: 2, result: Ok(Answer::Tid(9)) }).unwrap();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for b in wire {
            buf.push(b);
            while let Some(r) = take_frame::<Reply>(&mut buf).unwrap() {
                got.push(r.id);
            }
        }
        assert_eq!(got, vec![1, 2]);
        assert!(buf.is_empty());
        let mut huge = (u32::try_from(MAX_FRAME).unwrap() + 1).to_le_bytes().to_vec();
        assert!(take_frame::<Reply>(&mut huge).is_err());
    }

    #[test]
    fn an_oversized_frame_is_refused() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&(u32::try_from(MAX_FRAME).unwrap() + 1).to_le_bytes());
        assert!(read_frame::<Reply>(&mut &buf[..]).is_err());
    }
}
