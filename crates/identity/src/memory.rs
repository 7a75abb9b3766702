//! Device memory: what each process held on each GPU at dump, and whether the GPUs of this node
//! have room for all of it before the restore starts.
//!
//! `cuCheckpointProcessRestore` onto a GPU without room fails part-way, and cuda-checkpoint's
//! users report processes left stuck by it. So the preflight adds up, per target GPU, what every
//! process of the checkpoint will bring there (through the device map) and compares it with the
//! GPU's free memory now.

use crate::gpu::{GpuIdentity, GpuUuid};
use crate::map::DeviceMap;

pub use crate::image::DeviceMemoryUse;

/// One process's share of the restore.
#[derive(Debug, Clone, Copy)]
pub struct ProcessNeed<'a> {
    pub pid: u32,
    /// `None`: not recorded at dump (NVML could not tell: MIG, an older image).
    pub uses: Option<&'a [DeviceMemoryUse]>,
    pub map: &'a DeviceMap,
}

/// What one target GPU must take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetNeed {
    pub gpu: GpuUuid,
    pub need: u64,
    pub free: Option<u64>,
    /// Pids that bring memory there.
    pub pids: Vec<u32>,
}

/// Why the restore would run out of device memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("GPU {gpu} ({name}) has {free} free but the checkpoint's process(es) {pids:?} need {need} there; nothing was restored. Free memory on it (nvidia-smi lists what holds it), restore onto another GPU (CRIU_CUDA_MIGRATE_DEVICE_MAP or CRIU_CUDA_MIGRATE_USABLE_GPUS), or set CRIU_CUDA_MIGRATE_MEMORY_CHECK=off to let the driver try anyway")]
    NotEnough { gpu: GpuUuid, name: String, need: String, free: String, pids: Vec<u32> },
}

/// Adds up what each target GPU must take; `free` is each node GPU's free memory now (`None`
/// where NVML could not tell). Processes without a record are left out (`unknown` lists them).
pub fn targets(processes: &[ProcessNeed<'_>], free: &[(GpuUuid, Option<u64>)]) -> (Vec<TargetNeed>, Vec<u32>) {
    let mut out: Vec<TargetNeed> = Vec::new();
    let mut unknown = Vec::new();
    for p in processes {
        let Some(uses) = p.uses else {
            unknown.push(p.pid);
            continue;
        };
        for u in uses.iter().filter(|u| u.bytes > 0) {
            let target = p.map.new_for(&u.gpu).unwrap_or(u.gpu);
            let at = match out.iter().position(|t| t.gpu == target) {
                Some(i) => i,
                None => {
                    let free = free.iter().find(|(g, _)| *g == target).and_then(|(_, f)| *f);
                    out.push(TargetNeed { gpu: target, need: 0, free, pids: Vec::new() });
                    out.len() - 1
                }
            };
            let entry = &mut out[at];
            entry.need = entry.need.saturating_add(u.bytes);
            if !entry.pids.contains(&p.pid) {
                entry.pids.push(p.pid);
            }
        }
    }
    (out, unknown)
}

/// Refuses the restore when a target GPU's free memory is below what it must take.
pub fn check(targets: &[TargetNeed], node_gpus: &[GpuIdentity]) -> Result<(), MemoryError> {
    for t in targets {
        if let Some(free) = t.free {
            if t.need > free {
                let name = node_gpus.iter().find(|g| g.uuid == t.gpu).map(|g| g.name.clone()).unwrap_or_default();
                return Err(MemoryError::NotEnough {
                    gpu: t.gpu,
                    name,
                    need: describe_bytes(t.need),
                    free: describe_bytes(free),
                    pids: t.pids.clone(),
                });
            }
        }
    }
    Ok(())
}

/// `12.3 GiB (13207024435 bytes)`: exact, and readable.
pub fn describe_bytes(b: u64) -> String {
    format!("{} ({b} bytes)", format_precise(b))
}

/// `12.3 GiB`, `64 MiB`.
pub fn format_precise(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    if b as f64 >= GIB {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{:.0} MiB", b as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::h200;

    const GIB: u64 = 1 << 30;

    #[test]
    fn needs_follow_the_map_and_add_up_per_target() {
        let (a, b) = (h200(0, 6), h200(1, 7));
        let swap = DeviceMap::explicit(&[(a.uuid, b.uuid), (b.uuid, a.uuid)]);
        let p1 = [DeviceMemoryUse { gpu: a.uuid, bytes: 3 * GIB }];
        let p2 = [DeviceMemoryUse { gpu: a.uuid, bytes: 2 * GIB }, DeviceMemoryUse { gpu: b.uuid, bytes: GIB }];
        let procs = [
            ProcessNeed { pid: 1, uses: Some(&p1), map: &swap },
            ProcessNeed { pid: 2, uses: Some(&p2), map: &swap },
            ProcessNeed { pid: 3, uses: None, map: &swap },
        ];
        let free = [(a.uuid, Some(10 * GIB)), (b.uuid, Some(4 * GIB))];
        let (t, unknown) = targets(&procs, &free);
        assert_eq!(unknown, vec![3]);
        assert_eq!(t[0], TargetNeed { gpu: b.uuid, need: 5 * GIB, free: Some(4 * GIB), pids: vec![1, 2] });
        assert_eq!(t[1], TargetNeed { gpu: a.uuid, need: GIB, free: Some(10 * GIB), pids: vec![2] });
        let err = check(&t, &[a.clone(), b.clone()]).unwrap_err().to_string();
        assert!(err.contains(&b.uuid.to_string()) && err.contains("5.0 GiB") && err.contains("4.0 GiB"), "{err}");
        assert!(err.contains("CRIU_CUDA_MIGRATE_MEMORY_CHECK=off"), "names the way out: {err}");
        // Enough room: passes; free unknown: not refused.
        let roomy = [(a.uuid, Some(10 * GIB)), (b.uuid, Some(5 * GIB))];
        assert!(check(&targets(&procs, &roomy).0, &[a.clone(), b.clone()]).is_ok());
        assert!(check(&targets(&procs, &[(a.uuid, None), (b.uuid, None)]).0, &[a, b]).is_ok());
    }

    #[test]
    fn bytes_are_described_exactly() {
        assert_eq!(describe_bytes(3 * GIB / 2), "1.5 GiB (1610612736 bytes)");
        assert_eq!(describe_bytes(600 << 20), "600 MiB (629145600 bytes)");
    }
}
