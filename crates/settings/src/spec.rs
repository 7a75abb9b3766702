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

use ccm_identity::claims::{DevNumber, DevType, NvidiaNode};
use ccm_identity::gpu::{GpuIdentity, GpuUuid, PciAddress};
use ccm_identity::text;

/// The GPUs a restored container was given, and where that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenGpus {
    pub uuids: Vec<GpuUuid>,
    /// For the log: `linux.devices /dev/nvidia0, /dev/nvidia3` or `NVIDIA_VISIBLE_DEVICES=...`.
    pub source: String,
}

/// Why a runtime's spec cannot say which GPUs the container is given. The restore is refused: a
/// guess ("all GPUs") could put the container on GPUs another tenant was given.
///
/// Every value from the spec a message echoes is escaped and shortened ([`text::shown`]):
/// the spec is another tenant's, and it reaches a terminal and CRIU's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "is not an OCI runtime spec the plugin can read ({0}): fix the spec, or name the container's GPUs with \
         CRIU_CUDA_MIGRATE_USABLE_GPUS"
    )]
    Malformed(String),
    #[error(
        "gives NVIDIA_VISIBLE_DEVICES twice with different values (\"{first}\", then \"{second}\"): keep one, or name \
         the container's GPUs with CRIU_CUDA_MIGRATE_USABLE_GPUS"
    )]
    Twice { first: String, second: String },
    #[error(
        "says NVIDIA_VISIBLE_DEVICES=\"{value}\", and `{item}` is {why}: write GPU UUIDs, NVML indices (0 to {last}), PCI \
         bus ids, `all`, `none` or `void`, or name the container's GPUs with CRIU_CUDA_MIGRATE_USABLE_GPUS"
    )]
    VisibleDevices { value: String, item: String, why: String, last: String },
}

#[derive(Debug, Deserialize)]
struct Spec {
    #[serde(rename = "ociVersion")]
    oci_version: String,
    process: Option<SpecProcess>,
    linux: Option<SpecLinux>,
    #[serde(default)]
    mounts: Vec<SpecMount>,
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
    resources: Option<SpecResources>,
}

#[derive(Debug, Deserialize)]
struct SpecResources {
    #[serde(default)]
    devices: Vec<SpecDeviceRule>,
}

/// One `linux.resources.devices` rule: the devices cgroup's allow or deny list entry.
#[derive(Debug, Deserialize)]
struct SpecDeviceRule {
    allow: bool,
    #[serde(rename = "type")]
    kind: Option<String>,
    major: Option<i64>,
    minor: Option<i64>,
    access: Option<String>,
}

impl SpecDeviceRule {
    fn matches(&self, n: DevNumber) -> bool {
        let kind = match self.kind.as_deref() {
            None | Some("a") => true,
            Some("c") => n.kind == DevType::Char,
            Some("b") => n.kind == DevType::Block,
            Some(_) => false,
        };
        // An absent or negative number is the wildcard (`*`).
        let number = |want: Option<i64>, have: u32| want.is_none_or(|w| w < 0 || w == i64::from(have));
        kind && number(self.major, n.major) && number(self.minor, n.minor)
    }
}

/// Whether the devices cgroup a runtime sets up from this spec lets the container open `number` for reading and
/// writing: the `linux.resources.devices` rules in order, the last one that matches deciding, from "denied" (as runc
/// and crun apply them); a node `linux.devices` gives is allowed. Only for a spec that gives GPU nodes in
/// `linux.devices` (CDI, the device plugin with CDI):
/// under the legacy NVIDIA hook the spec names none, and the hook allows the GPUs' nodes in the cgroup itself when
/// the container starts. `None`: no such spec, no device rules (the runtime's defaults decide), or unreadable.
pub fn spec_allows_device(spec_json: &str, number: DevNumber) -> Option<bool> {
    let spec: Spec = serde_json::from_str(spec_json).ok()?;
    let linux = spec.linux?;
    if !linux.devices.iter().any(|d| nvidia_minor_of_path(&d.path).is_some()) {
        return None;
    }
    // A node the spec gives is the container's, whatever the rules say (a runtime may allow its linux.devices
    // itself, without a rule for each).
    if linux.devices.iter().any(|d| d.number() == Some(number)) {
        return Some(true);
    }
    let rules = linux.resources.map(|r| r.devices).unwrap_or_default();
    if rules.is_empty() {
        return None;
    }
    let mut allowed = false;
    for r in rules.iter().filter(|r| r.matches(number)) {
        let access = r.access.as_deref().unwrap_or("rwm");
        if r.allow && access.contains('r') && access.contains('w') {
            allowed = true;
        } else if !r.allow && (access.contains('r') || access.contains('w')) {
            allowed = false;
        }
    }
    Some(allowed)
}

#[derive(Debug, Deserialize)]
struct SpecDevice {
    path: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    major: Option<i64>,
    minor: Option<i64>,
}

impl SpecDevice {
    /// The device number the entry names, when it names one completely.
    fn number(&self) -> Option<DevNumber> {
        let kind = match self.kind.as_deref()? {
            "c" | "u" => DevType::Char,
            "b" => DevType::Block,
            _ => return None,
        };
        let major = u32::try_from(self.major?).ok()?;
        let minor = u32::try_from(self.minor?).ok()?;
        Some(DevNumber { kind, major, minor })
    }
}

#[derive(Debug, Deserialize)]
struct SpecMount {
    destination: String,
}

/// The directory of the NVIDIA toolkit's volume-mount form: `NVIDIA_VISIBLE_DEVICES` names it,
/// and one (empty) mount per device id below it says which GPUs.
pub const VOLUME_MOUNT_DEVICES: &str = "/var/run/nvidia-container-devices";

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
/// `NVIDIA_VISIBLE_DEVICES` of `process.env`, which the legacy NVIDIA runtime hook turns into
/// device nodes, with the NVIDIA Container Toolkit's meanings: `all`; `none`, `void` and empty
/// (no GPU); NVML indices; GPU UUIDs or their unique prefixes; PCI bus ids; the volume-mount form.
/// MIG devices are refused (the driver cannot checkpoint them), and so is anything the toolkit
/// does not define.
///
/// `Ok(None)`: the spec says nothing about GPUs (the caller keeps its default). `Err`: the spec
/// cannot be read, or names GPUs the plugin cannot map; the restore is refused.
pub fn gpus_given_by_spec(spec_json: &str, node_gpus: &[GpuIdentity]) -> Result<Option<GivenGpus>, SpecError> {
    gpus_given_by_spec_with_stand_ins(spec_json, node_gpus, &[])
}

/// [`gpus_given_by_spec`] where exact device numbers stand for NVIDIA nodes: the test doubles' stand-ins
/// (`CCM_TEST_DOUBLE_NVIDIA_DEVICES`: a loop block device as `/dev/nvidiaN`, which a process can hold open). A
/// `linux.devices` entry named `/dev/nvidiaN` whose number stands for a GPU's node is that GPU's, of any type.
pub fn gpus_given_by_spec_with_stand_ins(
    spec_json: &str,
    node_gpus: &[GpuIdentity],
    stand_ins: &[(DevNumber, NvidiaNode)],
) -> Result<Option<GivenGpus>, SpecError> {
    let spec: Spec = serde_json::from_str(spec_json).map_err(|e| SpecError::Malformed(text::shown(&e.to_string())))?;
    if spec.oci_version.trim().is_empty() {
        return Err(SpecError::Malformed("its ociVersion is empty".into()));
    }
    let mut nodes: Vec<(String, u32)> = Vec::new();
    for d in spec.linux.iter().flat_map(|l| &l.devices) {
        let stand_in = d.number().and_then(|n| {
            stand_ins.iter().find_map(|(s, node)| match node {
                NvidiaNode::Gpu(g) if *s == n => Some(*g),
                _ => None,
            })
        });
        if stand_in.is_none() && d.kind.as_deref().is_some_and(|k| k != "c") {
            continue;
        }
        if let Some(m) = nvidia_minor_of_path(&d.path) {
            // The node's own minor decides which GPU it is; the path's number is only a name.
            let minor = match (stand_in, d.minor) {
                (Some(g), _) => g,
                (None, None) => m,
                (None, Some(v)) => u32::try_from(v).map_err(|_| {
                    SpecError::Malformed(format!("linux.devices {} has minor {v}", text::shown(&d.path)))
                })?,
            };
            nodes.push((d.path.clone(), minor));
        }
    }
    if !nodes.is_empty() {
        let uuids: Vec<GpuUuid> =
            node_gpus.iter().filter(|g| nodes.iter().any(|(_, m)| *m == g.minor)).map(|g| g.uuid).collect();
        let source = format!(
            "linux.devices {}",
            nodes.iter().map(|(p, m)| format!("{} (minor {m})", text::shown(p))).collect::<Vec<_>>().join(", ")
        );
        return Ok(Some(GivenGpus { uuids, source }));
    }
    let mut value: Option<&str> = None;
    for e in spec.process.iter().flat_map(|p| &p.env) {
        if let Some(v) = e.strip_prefix("NVIDIA_VISIBLE_DEVICES=") {
            match value {
                Some(first) if first != v => {
                    return Err(SpecError::Twice { first: text::shown(first), second: text::shown(v) })
                }
                _ => value = Some(v),
            }
        }
    }
    let Some(value) = value else { return Ok(None) };
    let ids: Vec<String> = if value.trim() == VOLUME_MOUNT_DEVICES {
        let prefix = format!("{VOLUME_MOUNT_DEVICES}/");
        spec.mounts.iter().filter_map(|m| m.destination.strip_prefix(&prefix)).map(str::to_string).collect()
    } else {
        value.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
    };
    let source = format!("process.env NVIDIA_VISIBLE_DEVICES={}", text::shown(value));
    let uuids = visible_devices(value, &ids, node_gpus)?;
    Ok(Some(GivenGpus { uuids, source }))
}

/// The GPUs a list of `NVIDIA_VISIBLE_DEVICES` ids names.
fn visible_devices(value: &str, ids: &[String], node_gpus: &[GpuIdentity]) -> Result<Vec<GpuUuid>, SpecError> {
    let refuse = |item: &str, why: String| SpecError::VisibleDevices {
        value: text::shown(value),
        item: text::shown(item),
        why,
        last: node_gpus.len().checked_sub(1).map(|n| n.to_string()).unwrap_or_else(|| "none".into()),
    };
    if ids.iter().any(|i| i.eq_ignore_ascii_case("all")) {
        return Ok(node_gpus.iter().map(|g| g.uuid).collect());
    }
    let mut out: Vec<GpuUuid> = Vec::new();
    for item in ids {
        let lower = item.to_ascii_lowercase();
        if lower == "none" || lower == "void" {
            // The toolkit's words for "no GPU" (with or without the driver's libraries).
            continue;
        }
        let found =
            if lower.starts_with("mig-") || (item.contains(':') && item.split(':').all(|p| p.parse::<u32>().is_ok())) {
                return Err(refuse(item, "a MIG device, which the driver's checkpoint does not support".into()));
            } else if lower.starts_with("gpu-") {
                if item.len() <= 4 {
                    return Err(refuse(item, "no UUID (`GPU-` and nothing after it)".into()));
                }
                let matching: Vec<&GpuIdentity> =
                    node_gpus.iter().filter(|g| g.uuid.to_string().to_ascii_lowercase().starts_with(&lower)).collect();
                match matching.as_slice() {
                    [one] => one.uuid,
                    [] => return Err(refuse(item, "no GPU of this node".into())),
                    _ => {
                        return Err(refuse(
                            item,
                            format!("the start of {} GPUs' UUIDs: write the whole UUID", matching.len()),
                        ))
                    }
                }
            } else if let Some(pci) = PciAddress::parse(item) {
                match node_gpus.iter().find(|g| g.pci == pci) {
                    Some(g) => g.uuid,
                    None => return Err(refuse(item, "the PCI bus id of no GPU of this node".into())),
                }
            } else if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) {
                match item.parse::<usize>().ok().and_then(|i| node_gpus.get(i)) {
                    Some(g) => g.uuid,
                    None => return Err(refuse(item, format!("an index past this node's {} GPU(s)", node_gpus.len()))),
                }
            } else {
                return Err(refuse(item, "no device id the NVIDIA Container Toolkit defines".into()));
            };
        if !out.contains(&found) {
            out.push(found);
        }
    }
    Ok(out)
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
    use ccm_identity::gpu::PciAddress;

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
        let g = gpus_given_by_spec(spec, &node()).unwrap().unwrap();
        assert_eq!(g.uuids, vec![node()[1].uuid, node()[3].uuid]);
        assert!(g.source.contains("/dev/nvidia3 (minor 3)"), "{}", g.source);
    }

    #[test]
    fn a_renamed_node_counts_by_its_minor() {
        let spec =
            r#"{"ociVersion":"1.0.2","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":2}]}}"#;
        assert_eq!(gpus_given_by_spec(spec, &node()).unwrap().unwrap().uuids, vec![node()[2].uuid]);
    }

    #[test]
    fn a_test_doubles_stand_in_node_counts_as_the_gpu_it_stands_for_and_nothing_else_does() {
        // The doubles' loop block devices as /dev/nvidia0 and /dev/nvidia1 (CDI names them by those numbers).
        let spec = r#"{"ociVersion":"1.2.0","linux":{"devices":[
            {"path":"/dev/nvidiactl","type":"c","major":10,"minor":237},
            {"path":"/dev/nvidia1","type":"b","major":7,"minor":4}]}}"#;
        let stand_ins = [
            (DevNumber { kind: DevType::Block, major: 7, minor: 3 }, NvidiaNode::Gpu(0)),
            (DevNumber { kind: DevType::Block, major: 7, minor: 4 }, NvidiaNode::Gpu(1)),
            (DevNumber { kind: DevType::Char, major: 10, minor: 237 }, NvidiaNode::Control),
        ];
        let g = gpus_given_by_spec_with_stand_ins(spec, &node(), &stand_ins).unwrap().unwrap();
        assert_eq!(g.uuids, vec![node()[1].uuid]);
        // Without the stand-ins a block device is no GPU node: the spec says nothing about GPUs.
        assert!(gpus_given_by_spec(spec, &node()).unwrap().is_none());
    }

    #[test]
    fn the_devices_cgroup_rules_decide_which_nodes_the_container_may_open() {
        // Podman's and runc's shape: everything denied, then the default nodes, then the CDI device.
        let spec = r#"{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}],
            "resources":{"devices":[
            {"allow":false,"access":"rwm"},
            {"allow":true,"type":"c","major":1,"minor":3,"access":"rwm"},
            {"allow":true,"type":"c","major":195,"minor":0,"access":"rwm"},
            {"allow":true,"type":"c","major":195,"minor":255,"access":"rw"},
            {"allow":true,"type":"b","major":7,"minor":-1,"access":"rwm"}]}}}"#;
        let chr = |major, minor| DevNumber { kind: DevType::Char, major, minor };
        assert_eq!(spec_allows_device(spec, chr(195, 0)), Some(true));
        assert_eq!(spec_allows_device(spec, chr(195, 1)), Some(false), "another GPU's node");
        assert_eq!(spec_allows_device(spec, DevNumber { kind: DevType::Block, major: 7, minor: 9 }), Some(true));
        // A node linux.devices gives is allowed without a rule of its own.
        let given = r#"{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0},
            {"path":"/dev/nvidia2","type":"c","major":195,"minor":2}],"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}"#;
        assert_eq!(spec_allows_device(given, chr(195, 2)), Some(true));
        assert_eq!(spec_allows_device(given, chr(195, 1)), Some(false));
        // A privileged container allows every device; a later deny wins over an earlier allow.
        let gpu0 = r#""devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]"#;
        let all = format!(
            r#"{{"ociVersion":"1.2.0","linux":{{{gpu0},"resources":{{"devices":[{{"allow":true,"access":"rwm"}}]}}}}}}"#
        );
        let all = all.as_str();
        assert_eq!(spec_allows_device(all, chr(195, 7)), Some(true));
        let denied = format!(
            r#"{{"ociVersion":"1.2.0","linux":{{{gpu0},"resources":{{"devices":[{{"allow":true,"access":"rwm"}},
            {{"allow":false,"type":"c","major":195,"access":"rwm"}}]}}}}}}"#
        );
        let denied = denied.as_str();
        assert_eq!(spec_allows_device(denied, chr(195, 1)), Some(false));
        // Read-only access is no use to a GPU node; no rules: the runtime's defaults, unknown here.
        let ro = format!(
            r#"{{"ociVersion":"1.2.0","linux":{{{gpu0},"resources":{{"devices":[{{"allow":true,"type":"c","access":"r"}}]}}}}}}"#
        );
        let ro = ro.as_str();
        assert_eq!(spec_allows_device(ro, chr(195, 1)), Some(false));
        assert_eq!(spec_allows_device(r#"{"ociVersion":"1.2.0","linux":{}}"#, chr(195, 1)), None);
        // The legacy NVIDIA hook's spec names no GPU node: the hook allows them itself; not judged here.
        let legacy = r#"{"ociVersion":"1.2.0","linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}"#;
        assert_eq!(spec_allows_device(legacy, chr(195, 1)), None);
        assert_eq!(spec_allows_device("not json", chr(195, 1)), None);
    }

    #[test]
    fn the_legacy_environment_is_read_without_device_nodes() {
        let u = node()[2].uuid.to_string();
        let spec = format!(
            r#"{{"ociVersion":"1.0.2","process":{{"env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES={},0"]}},"linux":{{"devices":[]}}}}"#,
            &u[..12]
        );
        let g = gpus_given_by_spec(&spec, &node()).unwrap().unwrap();
        assert_eq!(g.uuids, vec![node()[2].uuid, node()[0].uuid]);
        let all = r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]}}"#;
        assert_eq!(gpus_given_by_spec(all, &node()).unwrap().unwrap().uuids.len(), 4);
        let pci = r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0000:08:00.0"]}}"#;
        assert_eq!(gpus_given_by_spec(pci, &node()).unwrap().unwrap().uuids, vec![node()[2].uuid]);
        let volumes = r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]},
            "mounts":[{"destination":"/var/run/nvidia-container-devices/3"},{"destination":"/proc"}]}"#;
        assert_eq!(gpus_given_by_spec(volumes, &node()).unwrap().unwrap().uuids, vec![node()[3].uuid]);
    }

    #[test]
    fn none_and_void_give_no_gpu() {
        for v in ["none", "void", "", "VOID"] {
            let spec = format!(r#"{{"ociVersion":"1.0.2","process":{{"env":["NVIDIA_VISIBLE_DEVICES={v}"]}}}}"#);
            let g = gpus_given_by_spec(&spec, &node()).unwrap().unwrap();
            assert!(g.uuids.is_empty(), "{v}: {g:?}");
        }
    }

    #[test]
    fn no_gpu_statement_means_no_opinion() {
        let node = node();
        for text in [
            r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin"]},"linux":{"devices":[{"path":"/dev/fuse","type":"c","major":10,"minor":229}]}}"#,
            r#"{"ociVersion":"1.0.2"}"#,
        ] {
            assert_eq!(gpus_given_by_spec(text, &node), Ok(None), "{text}");
        }
    }

    #[test]
    fn what_cannot_be_mapped_is_refused_naming_the_value() {
        let node = node();
        let env = |v: &str| format!(r#"{{"ociVersion":"1.0.2","process":{{"env":["NVIDIA_VISIBLE_DEVICES={v}"]}}}}"#);
        for (v, why) in [
            ("GPU-", "nothing after it"),
            ("GPU-0", "start of 4 GPUs"),
            ("GPU-ff", "no GPU of this node"),
            ("MIG-4f2c8a5e-0000-0000-0000-000000000000", "MIG"),
            ("0:1", "MIG"),
            ("99", "index past this node's 4 GPU(s)"),
            ("0,garbage", "no device id"),
            ("0000:66:00.0", "PCI bus id of no GPU"),
        ] {
            let e = gpus_given_by_spec(&env(v), &node).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("CRIU_CUDA_MIGRATE_USABLE_GPUS"), "{v}: {e}");
        }
        for text in [
            r#"{"not":"a spec"}"#,
            "garbage",
            r#"{"ociVersion":"1.0.2","linux":{},"linux":{}}"#,
            r#"{"ociVersion":"1.0.2","linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":"1"}]}}"#,
            r#"{"ociVersion":"1.0.2","linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":-1}]}}"#,
        ] {
            let e = gpus_given_by_spec(text, &node).unwrap_err();
            assert!(matches!(e, SpecError::Malformed(_)), "{text}: {e}");
        }
        let twice =
            r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_VISIBLE_DEVICES=1"]}}"#;
        assert!(matches!(gpus_given_by_spec(twice, &node), Err(SpecError::Twice { .. })));
        let same_twice =
            r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=1","NVIDIA_VISIBLE_DEVICES=1"]}}"#;
        assert_eq!(gpus_given_by_spec(same_twice, &node).unwrap().unwrap().uuids, vec![node[1].uuid]);
    }

    #[test]
    fn refused_values_are_escaped_and_shortened() {
        let node = node();
        let env = |v: &str| {
            serde_json::json!({"ociVersion": "1.0.2", "process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={v}")]}})
                .to_string()
        };
        // A terminal's cursor moved over the error, a bidi override, a line separator.
        let forged = "x\u{1b}[1A\r\u{1b}[2Kpreflight passed\u{7}\u{202e}\u{2028}";
        let e = gpus_given_by_spec(&env(forged), &node).unwrap_err().to_string();
        assert!(!text::has_unsafe(&e), "{e:?}");
        assert!(e.contains("\\u{1b}[1A\\r") && e.contains("\\u{202e}\\u{2028}"), "{e}");
        // A megabyte of ids: the message echoes the start and the length, not the megabyte.
        let huge = format!("{}garbage", "0,".repeat(1 << 19));
        let e = gpus_given_by_spec(&env(&huge), &node).unwrap_err().to_string();
        assert!(e.len() < 2000 && e.contains(&format!("({} bytes in all)", huge.len())), "{}", e.len());
        let twice = serde_json::json!({"ociVersion": "1.0.2", "process": {"env": [
            "NVIDIA_VISIBLE_DEVICES=0", format!("NVIDIA_VISIBLE_DEVICES={huge}\u{1b}")]}})
        .to_string();
        let e = gpus_given_by_spec(&twice, &node).unwrap_err().to_string();
        assert!(e.len() < 2000 && !text::has_unsafe(&e), "{}", e.len());
        // serde's own message quotes the spec's text: escaped and shortened too.
        let bad = format!(
            r#"{{"ociVersion":"1.0.2","linux":{{"devices":[{{"path":"/dev/nvidia1","minor":"{}\u001b"}}]}}}}"#,
            "9".repeat(1 << 20)
        );
        let e = gpus_given_by_spec(&bad, &node).unwrap_err().to_string();
        assert!(e.len() < 2000 && !text::has_unsafe(&e), "{}: {e:.300}", e.len());
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
