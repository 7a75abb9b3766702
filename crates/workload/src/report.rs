//! One round's identity and data report: what this process's libcuda and NVML say about every
//! ordinal it sees, and whether the device data and contexts survived.

use std::ffi::OsStr;
use std::time::Instant;

use crate::app::{CudaApp, DeviceBuffer};
use ccm_identity::PciAddress;
use serde::Serialize;

use crate::pattern;

/// Bytes per device-to-host copy while checking data: bounds the host memory the check needs
/// (a large host buffer would also be dumped by CRIU with the process).
const CHECK_CHUNK_BYTES: usize = 64 << 20;
/// Size of the scratch allocation that proves a context still does new work.
const SCRATCH_WORDS: usize = 1024;
const SCRATCH_WORD: u32 = 0x600D_C0DE;

/// The data a workload holds on one ordinal.
pub struct Held {
    pub ordinal: u32,
    pub buffer: DeviceBuffer,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub pid: u32,
    pub round: u32,
    pub driver_version: Option<i32>,
    pub device_count: Option<u32>,
    /// Every ordinal this process sees.
    pub devices: Vec<OrdinalReport>,
    /// `agree` for every ordinal.
    pub all_agree: bool,
    /// `consistent` for every ordinal.
    pub all_consistent: bool,
    /// `data_ok` and `ctx_works` for every ordinal that holds data.
    pub all_data_ok: bool,
    pub all_ctx_ok: bool,
    pub nvml_error: Option<String>,
    pub errors: Vec<String>,
    pub check_seconds: f64,
    /// `--device-props`: what the runtime-style property copies hold now.
    pub device_props: Option<crate::props::PropsReport>,
    /// `--forked-child`: the child and its exit code once it exited.
    pub forked_child: Option<ForkedChild>,
}

#[derive(Debug, Serialize)]
pub struct ForkedChild {
    pub pid: u32,
    pub exit_code: Option<i32>,
}

#[derive(Debug, Default, Serialize)]
pub struct OrdinalReport {
    pub ordinal: u32,
    pub name: Option<String>,
    pub total_mem: Option<u64>,
    /// `cuDeviceGetPCIBusId` as the driver wrote it (the value that goes stale).
    pub cuda_bus_id: Option<String>,
    pub attr_domain: Option<u32>,
    pub attr_bus: Option<u32>,
    pub attr_device: Option<u32>,
    /// The PCI attributes name the same location as `cuda_bus_id`.
    pub attrs_match_bus_id: bool,
    /// `cuDeviceGetUuid_v2`.
    pub uuid: Option<String>,
    /// NVML's handle for `cuda_bus_id` → its UUID, or the NVML error text ("NVML error: Not Found").
    pub nvml_uuid_by_bus: String,
    /// NVML's handle for `uuid` → its PCI bus id, or the NVML error text.
    pub nvml_bus_by_uuid: String,
    /// NVML's GPU at `cuda_bus_id` is the GPU CUDA names by `uuid`.
    pub agree: bool,
    /// `agree`, the attributes match the bus id, and NVML places `uuid` at `cuda_bus_id`.
    pub consistent: bool,
    /// This process allocated and filled memory on this ordinal.
    pub holds_data: bool,
    /// The device data still holds the pattern (None: no data held here).
    pub data_ok: Option<bool>,
    pub bad_words: Option<u64>,
    pub data_bytes: Option<u64>,
    /// `cuCtxGetDevice` after making this ordinal's context current.
    pub ctx_device: Option<i32>,
    /// The context allocates, writes, reads back and synchronises (None: no context here).
    pub ctx_works: Option<bool>,
    pub errors: Vec<String>,
}

/// NVML for one report, loaded from `$CRIU_CUDA_MIGRATE_LIBNVML` or `libnvidia-ml.so.1`.
///
/// It is dropped (nvmlShutdown) before the report returns: an open NVML session holds fds of
/// `/dev/nvidia*`, which CRIU could not dump.
fn open_nvml() -> Result<nvml_wrapper::Nvml, String> {
    let lib = std::env::var(ccm_settings::LIBNVML.env).unwrap_or_else(|_| "libnvidia-ml.so.1".to_string());
    nvml_wrapper::Nvml::builder()
        .lib_path(OsStr::new(&lib))
        .init()
        .map_err(|e| format!("cannot initialise NVML from {lib}: {e}"))
}

fn nvml_error_text(e: &nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::NotFound => "NVML error: Not Found".to_string(),
        other => format!("NVML error: {other}"),
    }
}

pub fn build(app: &CudaApp, held: &[Held], round: u32) -> Report {
    let started = Instant::now();
    let mut errors = Vec::new();
    let driver_version = app.libcuda().driver_version().map_err(|e| errors.push(e.to_string())).ok();
    let device_count = app.device_count().map_err(|e| errors.push(e.to_string())).ok();
    let (nvml, nvml_error) = match open_nvml() {
        Ok(n) => (Some(n), None),
        Err(e) => (None, Some(e)),
    };
    let devices: Vec<OrdinalReport> = (0..device_count.unwrap_or(0))
        .map(|ordinal| ordinal_report(app, nvml.as_ref(), held.iter().find(|h| h.ordinal == ordinal), ordinal))
        .collect();
    drop(nvml);
    let holding = || devices.iter().filter(|d| d.holds_data);
    let missing: Vec<u32> =
        held.iter().map(|h| h.ordinal).filter(|o| !devices.iter().any(|d| d.ordinal == *o)).collect();
    if !missing.is_empty() {
        errors.push(format!("ordinals {missing:?} hold data but the driver no longer lists them"));
    }
    Report {
        pid: std::process::id(),
        round,
        driver_version,
        device_count,
        all_agree: !devices.is_empty() && devices.iter().all(|d| d.agree),
        all_consistent: !devices.is_empty() && devices.iter().all(|d| d.consistent),
        all_data_ok: missing.is_empty() && holding().all(|d| d.data_ok == Some(true)),
        all_ctx_ok: missing.is_empty() && holding().all(|d| d.ctx_works == Some(true)),
        devices,
        nvml_error,
        errors,
        check_seconds: started.elapsed().as_secs_f64(),
        device_props: None,
        forked_child: None,
    }
}

fn ordinal_report(
    app: &CudaApp,
    nvml: Option<&nvml_wrapper::Nvml>,
    held: Option<&Held>,
    ordinal: u32,
) -> OrdinalReport {
    let mut r = OrdinalReport { ordinal, ..Default::default() };
    let dev = match app.device(ordinal) {
        Ok(d) => d,
        Err(e) => {
            r.errors.push(e.to_string());
            return r;
        }
    };
    let mut note = |e: crate::app::AppError| r.errors.push(e.to_string());
    let name = app.device_name(dev).map_err(&mut note).ok();
    let total_mem = app.device_total_mem(dev).map_err(&mut note).ok();
    let bus_text = app.device_pci_bus_id_text(dev).map_err(&mut note).ok();
    let attrs = app.device_pci_attributes(dev).map_err(&mut note).ok();
    let uuid = app.device_uuid(dev).map_err(&mut note).ok().map(|u| u.to_string());
    r.name = name;
    r.total_mem = total_mem;
    if let Some(a) = attrs {
        r.attr_domain = Some(a.domain);
        r.attr_bus = Some(a.bus);
        r.attr_device = Some(a.device);
    }
    let bus = bus_text.as_deref().and_then(PciAddress::parse);
    r.attrs_match_bus_id =
        matches!((attrs, bus), (Some(a), Some(b)) if a.to_address() == PciAddress { function: 0, ..b });
    r.cuda_bus_id = bus_text;

    let mut nvml_bus_matches = false;
    match nvml {
        None => {
            r.nvml_uuid_by_bus = "NVML unavailable".to_string();
            r.nvml_bus_by_uuid = "NVML unavailable".to_string();
        }
        Some(nvml) => {
            r.nvml_uuid_by_bus = match &r.cuda_bus_id {
                None => "no CUDA bus id".to_string(),
                Some(b) => match nvml.device_by_pci_bus_id(b.as_str()).and_then(|d| d.uuid()) {
                    Ok(u) => u,
                    Err(e) => nvml_error_text(&e),
                },
            };
            r.nvml_bus_by_uuid = match &uuid {
                None => "no CUDA uuid".to_string(),
                Some(u) => match nvml.device_by_uuid(u.as_str()).and_then(|d| d.pci_info()) {
                    Ok(p) => {
                        nvml_bus_matches =
                            PciAddress::parse(&p.bus_id).is_some() && PciAddress::parse(&p.bus_id) == bus;
                        p.bus_id
                    }
                    Err(e) => nvml_error_text(&e),
                },
            };
        }
    }
    r.agree = matches!(&uuid, Some(u) if r.nvml_uuid_by_bus.eq_ignore_ascii_case(u));
    r.consistent = r.agree && r.attrs_match_bus_id && nvml_bus_matches;
    r.uuid = uuid;

    if let Some(h) = held {
        r.holds_data = true;
        r.data_bytes = Some(h.buffer.len() as u64);
        match check_data(h) {
            Ok(bad) => {
                r.bad_words = Some(bad);
                r.data_ok = Some(bad == 0);
            }
            Err(e) => {
                r.errors.push(e.to_string());
                r.data_ok = Some(false);
            }
        }
        let (device, works) = check_context(app, h);
        r.ctx_device = device.as_ref().ok().copied();
        r.ctx_works = Some(works.is_ok() && device.as_ref().is_ok_and(|d| *d == dev.raw()));
        r.errors.extend([device.err(), works.err()].into_iter().flatten());
    }
    r
}

/// Reads the whole buffer back in chunks and counts words that differ from the pattern.
pub fn check_data(h: &Held) -> Result<u64, crate::app::AppError> {
    let total = h.buffer.len();
    let mut chunk = vec![0u8; CHECK_CHUNK_BYTES.min(total)];
    let mut bad = 0;
    let mut offset = 0;
    while offset < total {
        let len = CHECK_CHUNK_BYTES.min(total - offset);
        h.buffer.read(offset, &mut chunk[..len])?;
        bad += pattern::count_bad_words(h.ordinal, offset / 4, &chunk[..len]);
        offset += len;
    }
    Ok(bad)
}

/// The context's device, and whether it allocates, fills, reads back and synchronises.
fn check_context(app: &CudaApp, h: &Held) -> (Result<i32, String>, Result<(), String>) {
    let device = app
        .set_current(h.buffer.context())
        .and_then(|()| app.current_device())
        .map(|d| d.raw())
        .map_err(|e| e.to_string());
    let works = (|| -> Result<bool, crate::app::AppError> {
        let scratch = app.alloc(h.buffer.context(), SCRATCH_WORDS * 4)?;
        scratch.fill_u32(0, SCRATCH_WORDS, SCRATCH_WORD)?;
        let mut back = vec![0u8; SCRATCH_WORDS * 4];
        scratch.read(0, &mut back)?;
        app.synchronize()?;
        Ok(back.chunks_exact(4).all(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]) == SCRATCH_WORD))
    })();
    let works = match works {
        Ok(true) => Ok(()),
        Ok(false) => Err("a fresh allocation did not read back what cuMemsetD32 wrote".to_string()),
        Err(e) => Err(e.to_string()),
    };
    (device, works)
}
