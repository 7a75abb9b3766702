//! What a container runtime gave the container being restored: its GPUs, read from the
//! runtime's OCI spec (`config.json` of `runc restore --bundle DIR`, `crun restore --bundle DIR`),
//! and the device nodes its restored `/dev` must hold.
//!
//! Why the spec: on a node, a pod owns only the GPUs its device plugin allocated; the kubelet
//! writes them into the new container's spec (CDI puts `/dev/nvidiaN` into `linux.devices`, the
//! legacy NVIDIA hook reads `NVIDIA_VISIBLE_DEVICES` from `process.env`). The spec is there before
//! CRIU restores anything, so the preflight can choose the map and refuse a restore the given GPUs
//! cannot serve. The other candidates come too late or say the wrong thing: the devices cgroup is
//! set up by the runtime only after CRIU has forked the tree (and is an eBPF program on cgroup
//! v2), and the restored `/dev` is CRIU's copy of the DUMPED container's `/dev` (measured on the
//! GPU machine: a device only the restore bundle has is absent after `runc restore`).

use serde::Deserialize;

use crate::gpu::{GpuIdentity, GpuUuid};

/// The GPUs a restored container was given, and where that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenGpus {
    pub uuids: Vec<GpuUuid>,
    /// For the log: `linux.devices /dev/nvidia0, /dev/nvidia3` or `NVIDIA_VISIBLE_DEVICES=...`.
    pub source: String,
}

#[derive(Debug, Deserialize)]
struct Spec {
    #[serde(rename = "ociVersion")]
    oci_version: Option<String>,
    process: Option<SpecProcess>,
    linux: Option<SpecLinux>,
}

#[derive(Debug, Deserialize)]
struct SpecProcess {
    #[serde(default)]
    env: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct SpecLinux {
    #[serde(default)]
    devices: Vec<SpecDevice>,
}

#[derive(Debug, Deserialize)]
struct SpecDevice {
    path: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    minor: Option<i64>,
}

/// The minor N of a path naming a GPU node `.../dev/nvidiaN` (N: digits only), else `None`.
///
/// Any directory before `dev/` is accepted: a path seen through another mount namespace (a
/// container's `/dev`) or a test double's stand-in directory. `nvidiactl`, `nvidia-uvm`,
/// `nvidia-modeset` and `nvidia-caps/...` are not GPUs.
pub fn nvidia_minor_of_path(path: &str) -> Option<u32> {
    let (dir, name) = path.rsplit_once('/')?;
    if !(dir == "/dev" || dir.ends_with("/dev")) {
        return None;
    }
    let n = name.strip_prefix("nvidia")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Reads the GPUs an OCI spec gives its container, as GPUs of this node.
///
/// `linux.devices` first: the `/dev/nvidiaN` nodes the runtime creates, which the devices cgroup
/// allows (CDI, the NVIDIA device plugin with CDI, a hand-written bundle). Without any, the
/// `NVIDIA_VISIBLE_DEVICES` of `process.env` (UUIDs, UUID prefixes, NVML indices, `all`), which
/// the legacy NVIDIA runtime hook turns into device nodes. `None` when the text is no OCI spec
/// or names no GPU either way: the caller then keeps its default.
pub fn gpus_given_by_spec(spec_json: &str, node_gpus: &[GpuIdentity]) -> Option<GivenGpus> {
    let spec: Spec = serde_json::from_str(spec_json).ok()?;
    spec.oci_version.as_ref()?;
    let mut nodes: Vec<(String, u32)> = Vec::new();
    for d in spec.linux.iter().flat_map(|l| &l.devices) {
        if d.kind.as_deref().is_some_and(|k| k != "c") {
            continue;
        }
        if let Some(m) = nvidia_minor_of_path(&d.path) {
            // The node's own minor decides which GPU it is; the path's number is only a name.
            let minor = d.minor.and_then(|v| u32::try_from(v).ok()).unwrap_or(m);
            nodes.push((d.path.clone(), minor));
        }
    }
    if !nodes.is_empty() {
        let uuids: Vec<GpuUuid> =
            node_gpus.iter().filter(|g| nodes.iter().any(|(_, m)| *m == g.minor)).map(|g| g.uuid).collect();
        let source = format!(
            "linux.devices {}",
            nodes.iter().map(|(p, m)| format!("{p} (minor {m})")).collect::<Vec<_>>().join(", ")
        );
        return Some(GivenGpus { uuids, source });
    }
    let env = spec.process.as_ref()?.env.iter().find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))?;
    let value = env.trim();
    let source = format!("process.env NVIDIA_VISIBLE_DEVICES={value}");
    let uuids = match value {
        "all" => node_gpus.iter().map(|g| g.uuid).collect(),
        "" | "none" | "void" => return None,
        list => {
            let mut out = Vec::new();
            for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let found = if item.starts_with("GPU-") {
                    node_gpus.iter().find(|g| g.uuid.to_string().starts_with(item))
                } else {
                    item.parse::<usize>().ok().and_then(|i| node_gpus.get(i))
                };
                if let Some(g) = found {
                    if !out.contains(&g.uuid) {
                        out.push(g.uuid);
                    }
                }
            }
            out
        }
    };
    Some(GivenGpus { uuids, source })
}

/// One change to a restored container's `/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEdit {
    /// `mknod /dev/nvidia<minor>` (the new GPU's node, missing from the dumped `/dev`).
    Create { minor: u32 },
    /// `unlink /dev/nvidia<minor>` (an old GPU's node the container is no longer given).
    Remove { minor: u32 },
}

/// The edits that leave a restored container's `/dev` with nodes for its new GPUs and none for
/// the old GPUs it left. `moves` are `(old minor, new minor)` of the device map; `present` are
/// the minors of the `/dev/nvidiaN` nodes the restored `/dev` holds. Nodes of GPUs outside the
/// map are left alone.
pub fn plan_node_edits(moves: &[(u32, u32)], present: &[u32]) -> Vec<NodeEdit> {
    let new: Vec<u32> = moves.iter().map(|(_, n)| *n).collect();
    let mut edits = Vec::new();
    for n in &new {
        if !present.contains(n) && !edits.contains(&NodeEdit::Create { minor: *n }) {
            edits.push(NodeEdit::Create { minor: *n });
        }
    }
    for (old, _) in moves {
        if present.contains(old) && !new.contains(old) && !edits.contains(&NodeEdit::Remove { minor: *old }) {
            edits.push(NodeEdit::Remove { minor: *old });
        }
    }
    edits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::PciAddress;

    fn gpu(i: u8, minor: u32) -> GpuIdentity {
        GpuIdentity {
            uuid: format!("GPU-{i:02x}000000-0000-0000-0000-000000000000").parse().unwrap(),
            pci: PciAddress { domain: 0, bus: 6 + u32::from(i), device: 0, function: 0 },
            pci_device_id: 0x233510de,
            pci_subsystem_id: 0x18bf10de,
            minor,
            name: "NVIDIA H200".into(),
            memory_total: 1 << 30,
        }
    }

    fn node() -> Vec<GpuIdentity> {
        (0..4).map(|i| gpu(i, u32::from(i))).collect()
    }

    #[test]
    fn device_nodes_name_the_given_gpus_by_their_minor() {
        let spec = r#"{"ociVersion":"1.2.0","linux":{"devices":[
            {"path":"/dev/nvidiactl","type":"c","major":195,"minor":255},
            {"path":"/dev/nvidia-uvm","type":"c","major":238,"minor":0},
            {"path":"/dev/nvidia3","type":"c","major":195,"minor":3},
            {"path":"/dev/nvidia1","type":"c","major":195,"minor":1}]}}"#;
        let g = gpus_given_by_spec(spec, &node()).unwrap();
        assert_eq!(g.uuids, vec![node()[1].uuid, node()[3].uuid]);
        assert!(g.source.contains("/dev/nvidia3 (minor 3)"), "{}", g.source);
    }

    #[test]
    fn a_renamed_node_counts_by_its_minor() {
        let spec =
            r#"{"ociVersion":"1.0.2","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":2}]}}"#;
        assert_eq!(gpus_given_by_spec(spec, &node()).unwrap().uuids, vec![node()[2].uuid]);
    }

    #[test]
    fn the_legacy_environment_is_read_without_device_nodes() {
        let u = node()[2].uuid.to_string();
        let spec = format!(
            r#"{{"ociVersion":"1.0.2","process":{{"env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES={},0"]}},"linux":{{"devices":[]}}}}"#,
            &u[..12]
        );
        let g = gpus_given_by_spec(&spec, &node()).unwrap();
        assert_eq!(g.uuids, vec![node()[2].uuid, node()[0].uuid]);
        let all = r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]}}"#;
        assert_eq!(gpus_given_by_spec(all, &node()).unwrap().uuids.len(), 4);
    }

    #[test]
    fn no_gpu_statement_means_no_opinion() {
        let node = node();
        for text in [
            r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}"#,
            r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin"]},"linux":{"devices":[{"path":"/dev/fuse","type":"c","major":10,"minor":229}]}}"#,
            r#"{"not":"a spec"}"#,
            "garbage",
        ] {
            assert_eq!(gpus_given_by_spec(text, &node), None, "{text}");
        }
    }

    #[test]
    fn nvidia_minor_paths() {
        assert_eq!(nvidia_minor_of_path("/dev/nvidia12"), Some(12));
        assert_eq!(nvidia_minor_of_path("/proc/7/root/dev/nvidia3"), Some(3));
        assert_eq!(nvidia_minor_of_path("/dev/nvidia0"), Some(0));
        for p in [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia",
            "/dev/nvidia-caps/nvidia-cap1",
            "/dev/nvidia1x",
            "/tmp/nvidia0",
            "/home/dev2/nvidia0",
            "nvidia0",
            "",
        ] {
            assert_eq!(nvidia_minor_of_path(p), None, "{p}");
        }
    }

    #[test]
    fn node_edits_add_the_new_and_drop_the_left() {
        // Dumped on minor 0, restored onto minor 3: create 3, remove 0.
        assert_eq!(
            plan_node_edits(&[(0, 3)], &[0]),
            vec![NodeEdit::Create { minor: 3 }, NodeEdit::Remove { minor: 0 }]
        );
        // Same minor (the single-GPU machines): nothing to do.
        assert_eq!(plan_node_edits(&[(0, 0)], &[0]), vec![]);
        // A swap keeps both nodes.
        assert_eq!(plan_node_edits(&[(0, 1), (1, 0)], &[0, 1]), vec![]);
        // A node of a GPU outside the map stays; an already present new node is not created twice.
        assert_eq!(plan_node_edits(&[(0, 2)], &[0, 2, 5]), vec![NodeEdit::Remove { minor: 0 }]);
        assert_eq!(plan_node_edits(&[(0, 4), (1, 4)], &[]), vec![NodeEdit::Create { minor: 4 }]);
    }
}
