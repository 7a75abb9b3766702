//! The resource manager's ioctl interface on `/dev/nvidiactl`: escape numbers, object classes,
//! control commands and their parameter structs, as the open kernel modules' public headers define
//! them (`nv-ioctl.h`, `nv_escape.h`, `nvos.h`, `cl0000.h`, `cl0080.h`, `cl2080.h`,
//! `ctrl0000gpu.h`, `ctrl2080gpu.h`); written for this crate, every size and offset asserted below.
//! Public sources give the same numbers and layouts for driver branches 535, 580, 595 and 610;
//! GPU-FACTS.md measured them on 580.159.04 (`shared/reference/rm_pidinfo.c`).
//!
//! Nothing here comes from a process being dumped: the numbers are constants of this build, the
//! structs are filled by this crate and by the kernel driver only.

use std::mem::{offset_of, size_of};

use libc::c_ulong;

/// The NVIDIA character devices' major number (`NV_MAJOR_DEVICE_NUMBER`): `/dev/nvidiaN` is minor N,
/// `/dev/nvidiactl` minor 255.
pub const NVIDIA_MAJOR: u32 = 195;
pub const CTL_MINOR: u32 = 255;

/// `NV_IOCTL_MAGIC`.
const MAGIC: c_ulong = b'F' as c_ulong;
/// `NV_ESC_RM_FREE`, `NV_ESC_RM_CONTROL`, `NV_ESC_RM_ALLOC` (`nv_escape.h`).
pub const ESC_RM_FREE: u8 = 0x29;
pub const ESC_RM_CONTROL: u8 = 0x2A;
pub const ESC_RM_ALLOC: u8 = 0x2B;
/// `NV_ESC_CARD_INFO` and `NV_ESC_CHECK_VERSION_STR` (`NV_IOCTL_BASE` 200 + 0 and + 10).
pub const ESC_CARD_INFO: u8 = 200;
pub const ESC_CHECK_VERSION_STR: u8 = 210;

/// `_IOWR('F', nr, size)`: the request number of an escape whose argument is `size` bytes.
pub const fn iowr(nr: u8, size: usize) -> c_ulong {
    // Every argument struct is far below the 14-bit size field (asserted below), so the cast keeps it.
    #[allow(clippy::cast_possible_truncation)]
    let size = size as c_ulong;
    (3 << 30) | (size << 16) | (MAGIC << 8) | nr as c_ulong
}

/// Object classes: the client (`NV01_ROOT`), a GPU device (`NV01_DEVICE_0`) and its subdevice
/// (`NV20_SUBDEVICE_0`).
pub const CLASS_ROOT: u32 = 0x0000;
pub const CLASS_DEVICE: u32 = 0x0080;
pub const CLASS_SUBDEVICE: u32 = 0x2080;

/// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`: the GPUs the driver has attached (initialised); a GPU
/// nobody attached holds no process's memory.
pub const CTRL_GPU_GET_ATTACHED_IDS: u32 = 0x0000_0201;
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`: a GPU id's device and subdevice instance.
pub const CTRL_GPU_GET_ID_INFO_V2: u32 = 0x0000_0205;
/// `NV2080_CTRL_CMD_GPU_GET_PID_INFO`: what each asked pid holds on the subdevice's GPU.
pub const CTRL_GPU_GET_PID_INFO: u32 = 0x2080_018E;

/// `NV2080_CTRL_CMD_FB_GET_INFO_V2`: framebuffer facts of the subdevice's GPU.
pub const CTRL_FB_GET_INFO_V2: u32 = 0x2080_1303;
/// `NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE` and `_TOTAL_RAM_SIZE` (KiB).
pub const FB_INFO_INDEX_HEAP_FREE: u32 = 0x16;
pub const FB_INFO_INDEX_TOTAL_RAM_SIZE: u32 = 0x08;
/// The list lengths of `NV2080_CTRL_FB_GET_INFO_V2_PARAMS` in the public headers, newest first; the driver
/// takes only its own (580.159.04: 0x80, measured by tests/gpu/rm_fbinfo.c).
pub const FB_INFO_LIST_SIZES: &[usize] = &[0x80, 0x39, 0x36];
/// `NV_ERR_INVALID_PARAM_STRUCT`: the answer to a parameter size that is not the driver's.
pub const RM_INVALID_PARAM_STRUCT: RmStatus = RmStatus(0x3A);

/// `NV_RM_API_VERSION_CMD_STRICT`: the version string must equal the module's.
pub const VERSION_CMD_STRICT: u32 = 0;
/// `NV_RM_API_VERSION_REPLY_RECOGNIZED`.
pub const VERSION_REPLY_RECOGNIZED: u32 = 1;

/// `NV0000_CTRL_GPU_MAX_ATTACHED_GPUS` and `NV0000_CTRL_GPU_INVALID_ID`.
pub const MAX_ATTACHED_GPUS: usize = 32;
pub const INVALID_GPU_ID: u32 = 0xffff_ffff;
/// `NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT`.
pub const PID_INFO_MAX: usize = 200;
/// `NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE`.
pub const PID_INFO_INDEX_VIDEO_MEMORY: u32 = 0;
/// Card entries asked for at once (the driver fills as many as the buffer holds; 32 GPUs is more
/// than any node has, and the driver's own limit).
pub const CARDS_MAX: usize = 32;

/// `nv_ioctl_rm_api_version_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ApiVersion {
    pub cmd: u32,
    pub reply: u32,
    pub version: [u8; 64],
}

/// `nv_ioctl_card_info_t`, its `nv_pci_info_t` laid out in place (same offsets).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CardInfo {
    pub valid: u8,
    pub domain: u32,
    pub bus: u8,
    pub slot: u8,
    pub function: u8,
    pub vendor_id: u16,
    pub device_id: u16,
    pub gpu_id: u32,
    pub interrupt_line: u16,
    pub reg_address: u64,
    pub reg_size: u64,
    pub fb_address: u64,
    pub fb_size: u64,
    pub minor_number: u32,
    pub dev_name: [u8; 10],
}

/// `NVOS21_PARAMETERS` (`NV_ESC_RM_ALLOC`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Alloc {
    pub root: u32,
    pub parent: u32,
    pub object: u32,
    pub class: u32,
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// `NVOS54_PARAMETERS` (`NV_ESC_RM_CONTROL`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Control {
    pub client: u32,
    pub object: u32,
    pub cmd: u32,
    pub flags: u32,
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// `NVOS00_PARAMETERS` (`NV_ESC_RM_FREE`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Free {
    pub root: u32,
    pub parent: u32,
    pub object: u32,
    pub status: u32,
}

/// `NV0000_ALLOC_PARAMETERS`: the client, named after this process.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ClientAllocParams {
    pub client: u32,
    pub process_id: u32,
    pub process_name: [u8; 100],
    pub os_pid_info: u64,
}

/// `NV0080_ALLOC_PARAMETERS`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct DeviceAllocParams {
    pub device_id: u32,
    pub client_share: u32,
    pub target_client: u32,
    pub target_device: u32,
    pub flags: u32,
    pub va_space_size: u64,
    pub va_start_internal: u64,
    pub va_limit_internal: u64,
    pub va_mode: u32,
}

/// `NV2080_ALLOC_PARAMETERS`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct SubdeviceAllocParams {
    pub subdevice_id: u32,
}

/// `NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AttachedIds {
    pub gpu_ids: [u32; MAX_ATTACHED_GPUS],
}

/// `NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IdInfoV2 {
    pub gpu_id: u32,
    pub gpu_flags: u32,
    pub device_instance: u32,
    pub subdevice_instance: u32,
    pub sli_status: u32,
    pub board_id: u32,
    pub gpu_instance: u32,
    pub numa_id: i32,
}

/// `NV2080_CTRL_GPU_PID_INFO_VIDEO_MEMORY_USAGE_DATA` (bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct VideoMemoryUsage {
    pub private: u64,
    pub shared_owned: u64,
    pub shared_duped: u64,
    pub protected_private: u64,
    pub protected_shared_owned: u64,
    pub protected_shared_duped: u64,
}

/// `NV2080_CTRL_GPU_PID_INFO`: the asked pid and index in, the result status and data out.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct PidInfo {
    pub pid: u32,
    pub index: u32,
    pub result: u32,
    pub data: VideoMemoryUsage,
    /// `NV2080_CTRL_SMC_SUBSCRIPTION_INFO`.
    pub compute_instance_id: u32,
    pub gpu_instance_id: u32,
}

/// `NV2080_CTRL_GPU_GET_PID_INFO_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GetPidInfo {
    pub count: u32,
    pub list: [PidInfo; PID_INFO_MAX],
}

/// `NV2080_CTRL_FB_INFO`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct FbInfo {
    pub index: u32,
    pub data: u32,
}

/// `NV2080_CTRL_FB_GET_INFO_V2_PARAMS` at the longest known list; sent with the size of the driver's own
/// ([`fb_info_v2_size`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FbInfoV2 {
    pub count: u32,
    pub list: [FbInfo; 0x80],
}

impl Default for FbInfoV2 {
    fn default() -> Self {
        FbInfoV2 { count: 0, list: [FbInfo::default(); 0x80] }
    }
}

/// The parameter size of `NV2080_CTRL_FB_GET_INFO_V2_PARAMS` with a list of `entries`.
pub const fn fb_info_v2_size(entries: usize) -> u32 {
    // At most 0x80 entries of 8 bytes and the count: 1028 bytes, which u32 holds.
    #[allow(clippy::cast_possible_truncation)]
    let size = (4 + 8 * entries) as u32;
    size
}

impl Default for GetPidInfo {
    fn default() -> Self {
        GetPidInfo { count: 0, list: [PidInfo::default(); PID_INFO_MAX] }
    }
}

// The layouts the kernel driver reads and writes, as measured on 580.159.04 (GPU-FACTS.md) and
// given by the public headers: a wrong size is refused by the driver at best and corrupts this
// process's memory at worst, so the build checks every one.
const _: () = {
    assert!(size_of::<ApiVersion>() == 72);
    assert!(offset_of!(ApiVersion, version) == 8);
    assert!(size_of::<CardInfo>() == 72);
    assert!(offset_of!(CardInfo, domain) == 4);
    assert!(offset_of!(CardInfo, bus) == 8);
    assert!(offset_of!(CardInfo, function) == 10);
    assert!(offset_of!(CardInfo, vendor_id) == 12);
    assert!(offset_of!(CardInfo, gpu_id) == 16);
    assert!(offset_of!(CardInfo, reg_address) == 24);
    assert!(offset_of!(CardInfo, fb_size) == 48);
    assert!(offset_of!(CardInfo, minor_number) == 56);
    assert!(offset_of!(CardInfo, dev_name) == 60);
    assert!(size_of::<Alloc>() == 32);
    assert!(offset_of!(Alloc, params) == 16);
    assert!(offset_of!(Alloc, status) == 28);
    assert!(size_of::<Control>() == 32);
    assert!(offset_of!(Control, params) == 16);
    assert!(offset_of!(Control, status) == 28);
    assert!(size_of::<Free>() == 16);
    assert!(size_of::<ClientAllocParams>() == 120);
    assert!(offset_of!(ClientAllocParams, os_pid_info) == 112);
    assert!(size_of::<DeviceAllocParams>() == 56);
    assert!(offset_of!(DeviceAllocParams, va_space_size) == 24);
    assert!(offset_of!(DeviceAllocParams, va_mode) == 48);
    assert!(size_of::<SubdeviceAllocParams>() == 4);
    assert!(size_of::<AttachedIds>() == 128);
    assert!(size_of::<IdInfoV2>() == 32);
    assert!(size_of::<VideoMemoryUsage>() == 48);
    assert!(size_of::<PidInfo>() == 72);
    assert!(offset_of!(PidInfo, result) == 8);
    assert!(offset_of!(PidInfo, data) == 16);
    assert!(offset_of!(PidInfo, compute_instance_id) == 64);
    assert!(size_of::<GetPidInfo>() == 14408);
    assert!(offset_of!(GetPidInfo, list) == 8);
    assert!(size_of::<FbInfo>() == 8);
    assert!(size_of::<FbInfoV2>() == 4 + 8 * 0x80);
    assert!(offset_of!(FbInfoV2, list) == 4);
    assert!(fb_info_v2_size(0x80) == 1028 && fb_info_v2_size(0x36) == 436);
    // The ioctl arguments themselves must fit the request's 14-bit size field.
    assert!(size_of::<[CardInfo; CARDS_MAX]>() < 1 << 14);
    assert!(size_of::<ApiVersion>() < 1 << 14);
};

/// An RM status (`NV_STATUS`, `nvstatuscodes.h`): the ones this client can meet are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RmStatus(pub u32);

impl RmStatus {
    pub const OK: RmStatus = RmStatus(0);

    /// The status's name and the driver's text for it, where this build knows it.
    pub fn describe(self) -> Option<(&'static str, &'static str)> {
        Some(match self.0 {
            0x00 => ("NV_OK", "success"),
            0x0F => ("NV_ERR_GPU_IS_LOST", "GPU lost from the bus"),
            0x1A => ("NV_ERR_INSUFFICIENT_RESOURCES", "ran out of a critical resource, other than memory"),
            0x1B => ("NV_ERR_INSUFFICIENT_PERMISSIONS", "the requester does not have sufficient permissions"),
            0x1F => ("NV_ERR_INVALID_ARGUMENT", "invalid argument to call"),
            0x22 => ("NV_ERR_INVALID_CLASS", "given class-id not valid"),
            0x23 => ("NV_ERR_INVALID_CLIENT", "given client not valid"),
            0x24 => ("NV_ERR_INVALID_COMMAND", "command passed is not valid"),
            0x26 => ("NV_ERR_INVALID_DEVICE", "current device is not valid"),
            0x2F => ("NV_ERR_INVALID_LOCK_STATE", "requested lock state not valid"),
            0x33 => ("NV_ERR_INVALID_OBJECT_HANDLE", "object handle is not valid"),
            0x36 => ("NV_ERR_INVALID_OBJECT_PARENT", "object parent is not valid"),
            0x3A => ("NV_ERR_INVALID_PARAM_STRUCT", "invalid structure parameter"),
            0x51 => ("NV_ERR_NO_MEMORY", "out of memory"),
            0x55 => ("NV_ERR_NOT_READY", "not ready"),
            0x56 => ("NV_ERR_NOT_SUPPORTED", "call not supported"),
            0x57 => ("NV_ERR_OBJECT_NOT_FOUND", "requested object not found"),
            0x59 => ("NV_ERR_OPERATING_SYSTEM", "generic operating system error"),
            0x5E => ("NV_ERR_PID_NOT_FOUND", "process-id not found"),
            0x65 => ("NV_ERR_TIMEOUT", "call timed out"),
            0xFFFF => ("NV_ERR_GENERIC", "generic error"),
            _ => return None,
        })
    }
}

impl std::fmt::Display for RmStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.describe() {
            Some((name, text)) => write!(f, "{name} ({:#x}): {text}", self.0),
            None => write!(f, "RM status {:#x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_are_the_measured_ones() {
        // The requests rm_pidinfo.c sent on 580.159.04.
        assert_eq!(iowr(ESC_RM_CONTROL, size_of::<Control>()), 0xC020_462A);
        assert_eq!(iowr(ESC_RM_ALLOC, size_of::<Alloc>()), 0xC020_462B);
        assert_eq!(iowr(ESC_RM_FREE, size_of::<Free>()), 0xC010_4629);
        assert_eq!(iowr(ESC_CHECK_VERSION_STR, size_of::<ApiVersion>()), 0xC048_46D2);
        assert_eq!(iowr(ESC_CARD_INFO, size_of::<[CardInfo; CARDS_MAX]>()), 0xC900_46C8);
    }

    #[test]
    fn statuses_are_named_or_shown_as_numbers() {
        assert_eq!(
            RmStatus(0x1B).to_string(),
            "NV_ERR_INSUFFICIENT_PERMISSIONS (0x1b): the requester does not have sufficient permissions"
        );
        assert_eq!(RmStatus(0x1234).to_string(), "RM status 0x1234");
        assert_eq!(RmStatus::OK.describe().map(|d| d.0), Some("NV_OK"));
    }
}
