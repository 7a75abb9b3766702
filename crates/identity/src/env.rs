//! Environ rewrite plans: make the GPU lists in a restored process's environment name the GPUs it
//! now runs on.
//!
//! A process started with `CUDA_VISIBLE_DEVICES=GPU-<old>` passes that string to every child and
//! every framework that reads it again (PyTorch maps it through NVML, for instance); after a
//! remapped restore it names a GPU the process no longer has. The environ block sits in the
//! process's stack mapping with no room to grow, so edits are made in place and never change a
//! length: UUID text is fixed length; an index form is rewritten only when the new index has as
//! many digits, and otherwise reported as a warning. Only `CUDA_VISIBLE_DEVICES` and
//! `NVIDIA_VISIBLE_DEVICES` are touched.
//!
//! Index forms are read as NVML indices (`nvidia-smi` order) of the dump node and rewritten as
//! NVML indices of this node. CUDA orders indices by `CUDA_DEVICE_ORDER`; on nodes of identical
//! GPUs both orders follow the PCI bus order.

use std::fmt;

use crate::gpu::{GpuIdentity, GpuUuid};
use crate::map::DeviceMap;

/// The variables whose values name GPUs and are rewritten.
pub const GPU_LIST_VARS: [&str; 2] = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"];

/// Length of a GPU UUID in its canonical text form (`GPU-` and 36 characters).
const UUID_TEXT_LEN: usize = 40;

/// Replace `old` at `offset` of the environ block with `new` (same length).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EnvEdit {
    /// Byte offset from the start of the environ block (`/proc/PID/environ`, `env_start`).
    pub offset: usize,
    /// The bytes that must be there; the writer checks them before writing.
    pub old: Vec<u8>,
    /// The bytes to write; always as long as `old`.
    pub new: Vec<u8>,
}

/// A GPU reference that could not be rewritten in place, left as it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EnvWarning {
    pub variable: String,
    /// The item of the comma-separated list.
    pub item: String,
    pub reason: String,
}

impl fmt::Display for EnvWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} item `{}` left unchanged: {}", self.variable, self.item, self.reason)
    }
}

/// The edits to make and the references left alone.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct EnvPlan {
    pub edits: Vec<EnvEdit>,
    pub warnings: Vec<EnvWarning>,
}

impl EnvPlan {
    /// Applies the edits to a copy of the environ block. Returns `false` and changes nothing
    /// when any edit's `old` bytes are not where the plan expects them (the block changed).
    pub fn apply_to(&self, block: &mut [u8]) -> bool {
        let fits = self.edits.iter().all(|e| {
            e.old.len() == e.new.len()
                && e.offset.checked_add(e.old.len()).and_then(|end| block.get(e.offset..end)) == Some(&e.old[..])
        });
        if !fits {
            return false;
        }
        for e in &self.edits {
            block[e.offset..e.offset + e.new.len()].copy_from_slice(&e.new);
        }
        true
    }
}

/// Plans the in-place edits of the environ block `environ` (NUL-separated `KEY=VALUE`).
///
/// `old_gpus` are the dump node's GPUs (the image's `node_gpus`), `new_gpus` this node's, both in
/// NVML index order; they resolve index forms and UUID prefixes.
pub fn plan_env_edits(environ: &[u8], map: &DeviceMap, old_gpus: &[GpuIdentity], new_gpus: &[GpuIdentity]) -> EnvPlan {
    let mut plan = EnvPlan::default();
    let mut entry_start = 0usize;
    for entry in environ.split(|&b| b == 0) {
        let this_start = entry_start;
        entry_start += entry.len() + 1;
        let Some(eq) = entry.iter().position(|&b| b == b'=') else { continue };
        let Some(&variable) = GPU_LIST_VARS.iter().find(|v| v.as_bytes() == &entry[..eq]) else { continue };
        let value_start = this_start + eq + 1;
        let value = &entry[eq + 1..];
        let mut item_start = value_start;
        for raw in value.split(|&b| b == b',') {
            let raw_start = item_start;
            item_start += raw.len() + 1;
            let lead = raw.iter().take_while(|b| b.is_ascii_whitespace()).count();
            let trail = raw.iter().rev().take_while(|b| b.is_ascii_whitespace()).count();
            if lead == raw.len() {
                continue;
            }
            let item = &raw[lead..raw.len() - trail];
            plan_item(variable, raw_start + lead, item, map, old_gpus, new_gpus, &mut plan);
        }
    }
    plan
}

fn plan_item(
    variable: &str,
    offset: usize,
    item: &[u8],
    map: &DeviceMap,
    old_gpus: &[GpuIdentity],
    new_gpus: &[GpuIdentity],
    plan: &mut EnvPlan,
) {
    let text = String::from_utf8_lossy(item).into_owned();
    let mut warn = |reason: String| {
        plan.warnings.push(EnvWarning { variable: variable.to_string(), item: text.clone(), reason });
    };
    let mut edit = |new: String| {
        plan.edits.push(EnvEdit { offset, old: item.to_vec(), new: new.into_bytes() });
    };
    let lower = text.to_ascii_lowercase();
    if matches!(lower.as_str(), "all" | "none" | "void") {
        return;
    }
    if lower.starts_with("mig-") {
        warn("MIG devices are not remapped by criu-cuda-migrate".into());
        return;
    }
    if let Some(rest) = lower.strip_prefix("gpu-") {
        let full: Option<GpuUuid> = text.parse().ok();
        match full {
            Some(old) if item.len() == UUID_TEXT_LEN => {
                if let Some(new) = map.new_for(&old) {
                    if new != old {
                        edit(new.to_string());
                    }
                } else if !new_gpus.iter().any(|g| g.uuid == old) {
                    warn("names a GPU the process did not enumerate and this node lacks".into());
                }
            }
            Some(_) => warn("UUID in a non-canonical form; write it as nvidia-smi -L prints it".into()),
            None => plan_prefix(&text, &lower, rest.len(), map, new_gpus, &mut edit, &mut warn),
        }
        return;
    }
    if !item.is_empty() && item.iter().all(u8::is_ascii_digit) {
        let Ok(index) = text.parse::<usize>() else {
            warn("index out of range".into());
            return;
        };
        // CUDA stops at the first index it does not know; such an item names nothing to remap.
        let Some(old) = old_gpus.get(index) else { return };
        let Some(new) = map.new_for(&old.uuid) else { return };
        if new == old.uuid {
            return;
        }
        let Some(new_index) = new_gpus.iter().position(|g| g.uuid == new) else {
            warn(format!("its GPU moves to {new}, which has no index on this node"));
            return;
        };
        let new_text = new_index.to_string();
        if new_text.len() == item.len() {
            edit(new_text);
        } else {
            warn(format!(
                "its GPU is now index {new_index} ({new}), which does not fit in place; use UUIDs in {variable} to let restores rewrite it"
            ));
        }
        return;
    }
    warn("not a GPU UUID or index".into());
}

/// A UUID prefix (`GPU-8a3b…`, as CUDA accepts): rewritten to the same-length prefix of the new
/// UUID when the old prefix names exactly one mapped GPU and the new prefix exactly one GPU here.
fn plan_prefix(
    original: &str,
    lower: &str,
    hex_len: usize,
    map: &DeviceMap,
    new_gpus: &[GpuIdentity],
    edit: &mut dyn FnMut(String),
    warn: &mut dyn FnMut(String),
) {
    if hex_len == 0 {
        warn("empty UUID prefix".into());
        return;
    }
    let matches: Vec<_> =
        map.pairs.iter().filter(|p| p.old.to_string().to_ascii_lowercase().starts_with(lower)).collect();
    let [pair] = matches.as_slice() else {
        if matches.len() > 1 {
            warn("UUID prefix matches several GPUs of the process".into());
        }
        return;
    };
    if pair.old == pair.new {
        return;
    }
    let new_text = pair.new.to_string();
    let Some(new_prefix) = new_text.get(..lower.len()) else {
        warn("UUID prefix is longer than a UUID".into());
        return;
    };
    let new_lower = new_prefix.to_ascii_lowercase();
    let here = new_gpus.iter().filter(|g| g.uuid.to_string().to_ascii_lowercase().starts_with(&new_lower)).count();
    if here == 1 {
        // Keep the item's own spelling of the `GPU-` tag; the hex digits are NVML's lower case.
        edit(format!("{}{}", &original[..4], &new_prefix[4..]));
    } else {
        warn(format!("the prefix of the same length of {} is not unique on this node", pair.new));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::{h200, uuid};
    use proptest::prelude::*;

    fn block(vars: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for v in vars {
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }

    fn applied(environ: &[u8], plan: &EnvPlan) -> String {
        let mut copy = environ.to_vec();
        assert!(plan.apply_to(&mut copy));
        String::from_utf8(copy).unwrap().replace('\0', "\n")
    }

    #[test]
    fn swaps_uuids_in_both_variables_only() {
        let node = vec![h200(0, 6), h200(1, 7)];
        let (a, b) = (uuid(0).to_string(), uuid(1).to_string());
        let environ = block(&[
            "PATH=/usr/bin",
            &format!("CUDA_VISIBLE_DEVICES={a}, {b}"),
            &format!("NVIDIA_VISIBLE_DEVICES={b}"),
            &format!("MY_GPU={a}"),
            &format!("XCUDA_VISIBLE_DEVICES={a}"),
        ]);
        let map = DeviceMap::explicit(&[(uuid(0), uuid(1)), (uuid(1), uuid(0))]);
        let plan = plan_env_edits(&environ, &map, &node, &node);
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
        assert_eq!(plan.edits.len(), 3);
        let text = applied(&environ, &plan);
        assert!(text.contains(&format!("CUDA_VISIBLE_DEVICES={b}, {a}\n")), "{text}");
        assert!(text.contains(&format!("NVIDIA_VISIBLE_DEVICES={a}\n")), "{text}");
        assert!(text.contains(&format!("MY_GPU={a}\n")), "{text}");
        assert!(text.contains(&format!("XCUDA_VISIBLE_DEVICES={a}\n")), "{text}");
    }

    #[test]
    fn identity_map_plans_nothing() {
        let node = vec![h200(0, 6), h200(1, 7)];
        let environ = block(&[&format!("CUDA_VISIBLE_DEVICES={},1", uuid(0))]);
        let plan =
            plan_env_edits(&environ, &DeviceMap::explicit(&[(uuid(0), uuid(0)), (uuid(1), uuid(1))]), &node, &node);
        assert_eq!(plan, EnvPlan::default());
    }

    #[test]
    fn index_forms() {
        let node: Vec<GpuIdentity> = (0u8..12).map(|i| h200(i, 6 + u32::from(i))).collect();
        let environ = block(&["CUDA_VISIBLE_DEVICES=0,1,2", "NVIDIA_VISIBLE_DEVICES=all"]);
        let map = DeviceMap::explicit(&[(uuid(0), uuid(1)), (uuid(1), uuid(0)), (uuid(2), uuid(11))]);
        let plan = plan_env_edits(&environ, &map, &node, &node);
        assert_eq!(applied(&environ, &plan), "CUDA_VISIBLE_DEVICES=1,0,2\nNVIDIA_VISIBLE_DEVICES=all\n");
        assert_eq!(plan.warnings.len(), 1);
        assert!(plan.warnings[0].to_string().contains("index 11"), "{}", plan.warnings[0]);
    }

    #[test]
    fn prefixes_and_oddities() {
        let mut kept = h200(1, 7);
        kept.uuid.0[0] = 0xc0;
        let node = vec![h200(0, 6), kept.clone()];
        let mut other = h200(2, 8);
        other.uuid.0[0] = 0xb0;
        let new_node = vec![other.clone(), kept.clone()];
        let map = DeviceMap::explicit(&[(uuid(0), other.uuid), (kept.uuid, kept.uuid)]);
        // "GPU-a0" names one GPU of the process and "GPU-b0" one GPU here.
        let environ = block(&["CUDA_VISIBLE_DEVICES=GPU-a0", "NVIDIA_VISIBLE_DEVICES=gpu-c0,MIG-1/2/3,bogus"]);
        let plan = plan_env_edits(&environ, &map, &node, &new_node);
        assert_eq!(plan.edits.len(), 1);
        assert_eq!(
            applied(&environ, &plan),
            "CUDA_VISIBLE_DEVICES=GPU-b0\nNVIDIA_VISIBLE_DEVICES=gpu-c0,MIG-1/2/3,bogus\n"
        );
        let reasons: Vec<String> = plan.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");

        // Ambiguous prefix on the dump side; non-canonical full UUID.
        let map = DeviceMap::explicit(&[(uuid(0), uuid(1)), (uuid(1), uuid(0))]);
        let dashless = uuid(0).to_string().replace('-', "").replacen("GPU", "GPU-", 1);
        let environ = block(&[&format!("CUDA_VISIBLE_DEVICES=GPU-a0,{dashless}")]);
        let two = vec![h200(0, 6), h200(1, 7)];
        let plan = plan_env_edits(&environ, &map, &two, &two);
        assert!(plan.edits.is_empty());
        assert_eq!(plan.warnings.len(), 2, "{:?}", plan.warnings);
    }

    #[test]
    fn apply_refuses_a_changed_block() {
        let node = vec![h200(0, 6), h200(1, 7)];
        let environ = block(&[&format!("CUDA_VISIBLE_DEVICES={}", uuid(0))]);
        let plan = plan_env_edits(&environ, &DeviceMap::explicit(&[(uuid(0), uuid(1))]), &node, &node);
        let mut other = environ.clone();
        other[30] ^= 1;
        let before = other.clone();
        assert!(!plan.apply_to(&mut other));
        assert_eq!(other, before);
        assert!(!plan.apply_to(&mut environ[..10].to_vec()));
    }

    proptest! {
        #[test]
        fn prop_edits_keep_lengths_and_touch_only_gpu_lists(
            environ in prop::collection::vec(prop_oneof![Just(0u8), Just(b','), Just(b'='), any::<u8>()], 0..300),
            prefix in prop_oneof![Just("CUDA_VISIBLE_DEVICES="), Just("NVIDIA_VISIBLE_DEVICES="), Just("OTHER=")],
        ) {
            let node: Vec<GpuIdentity> = (0u8..4).map(|i| h200(i, 6 + u32::from(i))).collect();
            let map = DeviceMap::explicit(&[(uuid(0), uuid(3)), (uuid(3), uuid(0)), (uuid(1), uuid(2)), (uuid(2), uuid(1))]);
            let mut block = prefix.as_bytes().to_vec();
            block.extend_from_slice(&environ);
            let plan = plan_env_edits(&block, &map, &node, &node);
            for e in &plan.edits {
                prop_assert_eq!(e.old.len(), e.new.len());
                prop_assert_eq!(&block[e.offset..e.offset + e.old.len()], &e.old[..]);
                // The edit lies inside a GPU list variable's value.
                let entry_start = block[..e.offset].iter().rposition(|&b| b == 0).map_or(0, |p| p + 1);
                let entry = &block[entry_start..e.offset];
                let in_gpu_list = GPU_LIST_VARS.iter().any(|var| entry.starts_with(format!("{var}=").as_bytes()));
                prop_assert!(in_gpu_list);
            }
            let mut copy = block.clone();
            prop_assert!(plan.apply_to(&mut copy));
            prop_assert_eq!(copy.len(), block.len());
        }
    }
}
