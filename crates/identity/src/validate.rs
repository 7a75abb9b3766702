//! Validation rules applied after the rewrite and before the process is unlocked.
//!
//! A GPU passes when every site's six words, read back from the process, are the new GPU's
//! signature, and NVML, asked for the PCI location those words name, answers with the new GPU's
//! UUID. The second rule is what NCCL relies on: a location that resolves to another GPU (same
//! node) or to nothing (`nvmlDeviceGetHandleByPciBusId() failed: Not Found`, containers) is the
//! bug this project fixes.

use std::fmt;

use crate::gpu::{GpuIdentity, GpuUuid, PciAddress, PciSignature};
use crate::table;

/// What the engine observed for one pair of the map.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuObservation {
    pub old: GpuUuid,
    pub new: GpuUuid,
    /// The six words read back at every site of the GPU.
    pub words_in_process: Vec<PciSignature>,
    /// NVML's handle by the PCI location the words name: its UUID, or `None` for Not Found.
    pub nvml_uuid_at_new_pci: Option<GpuUuid>,
}

/// The outcome of validating one GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Verdict {
    Ok,
    /// What disagrees, in words for the log and the report.
    Mismatch(String),
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ok => f.write_str("ok"),
            Verdict::Mismatch(why) => write!(f, "MISMATCH: {why}"),
        }
    }
}

/// Validates one GPU against the restore node's record of the new GPU.
///
/// An empty `words_in_process` skips the first rule: it is what a GPU whose signature did not
/// change looks like (another GPU at the same PCI location with the same ids, typically an
/// identical node), where nothing was rewritten and the words the process holds already name the
/// new location. [`crate::pattern::plan_rewrites`] refuses a changed signature without sites, so
/// no stale GPU reaches here with no words. The NVML rule then checks the new GPU's own location.
pub fn validate_gpu(obs: &GpuObservation, new_gpu: &GpuIdentity) -> Verdict {
    if obs.new != new_gpu.uuid {
        return Verdict::Mismatch(format!(
            "observation is for {} but was checked against {}; the engine paired the wrong records",
            obs.new, new_gpu.uuid
        ));
    }
    let expected = new_gpu.signature();
    for (i, words) in obs.words_in_process.iter().enumerate() {
        if *words != expected {
            return Verdict::Mismatch(format!(
                "site {i} of {} holds {} ({}), not {} ({}) of the new GPU {}",
                obs.old,
                words.pci(),
                describe_words(words),
                expected.pci(),
                describe_words(&expected),
                obs.new
            ));
        }
    }
    // All words agree (or there are none and the process's words were already right), so the
    // location the process reports is the new GPU's.
    let named = expected.pci();
    match obs.nvml_uuid_at_new_pci {
        None => Verdict::Mismatch(format!(
            "NVML finds no GPU at {} (the location the process reports); NCCL would fail with Not Found",
            named.to_nvml_string()
        )),
        Some(found) if found != obs.new => Verdict::Mismatch(format!(
            "NVML resolves {} (the location the process reports) to {found}, not to the new GPU {}",
            named.to_nvml_string(),
            obs.new
        )),
        Some(_) => Verdict::Ok,
    }
}

fn describe_words(words: &PciSignature) -> String {
    format!("device id {:#010x}, subsystem {:#010x}", words.pci_device_id, words.pci_subsystem_id)
}

/// One row of the reconcile report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportRow {
    /// The process's CUDA ordinal of the GPU, when known (enumerated-but-unused GPUs have none).
    pub ordinal: Option<u32>,
    pub old: GpuUuid,
    pub old_pci: Option<PciAddress>,
    pub new: GpuUuid,
    pub new_pci: Option<PciAddress>,
    pub sites_rewritten: usize,
    /// `ok`, a mismatch, or why the GPU was not validated.
    pub validation: String,
    /// Whether this row counts as passed.
    pub ok: bool,
}

impl ReportRow {
    /// A row from a verdict.
    pub fn from_verdict(
        ordinal: Option<u32>,
        old: &GpuIdentity,
        new: &GpuIdentity,
        sites_rewritten: usize,
        verdict: &Verdict,
    ) -> Self {
        ReportRow {
            ordinal,
            old: old.uuid,
            old_pci: Some(old.pci),
            new: new.uuid,
            new_pci: Some(new.pci),
            sites_rewritten,
            validation: verdict.to_string(),
            ok: verdict.is_ok(),
        }
    }
}

/// The reconcile report of one restored process.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ReconcileReport {
    pub rows: Vec<ReportRow>,
}

impl ReconcileReport {
    /// A table: ordinal, old GPU and bus, new GPU and bus, sites rewritten, validation.
    pub fn render_table(&self) -> String {
        let pci = |p: &Option<PciAddress>| p.map_or_else(|| "?".to_string(), |p| p.to_string());
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.ordinal.map_or_else(|| "-".to_string(), |o| o.to_string()),
                    r.old.to_string(),
                    pci(&r.old_pci),
                    "->".to_string(),
                    r.new.to_string(),
                    pci(&r.new_pci),
                    r.sites_rewritten.to_string(),
                    r.validation.clone(),
                ]
            })
            .collect();
        table::render(
            &["ordinal", "dump GPU", "dump PCI", "", "restore GPU", "restore PCI", "sites rewritten", "validation"],
            &rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::{h200, uuid};

    fn obs(old: u8, new: &GpuIdentity, words: Vec<PciSignature>, nvml: Option<GpuUuid>) -> GpuObservation {
        GpuObservation { old: uuid(old), new: new.uuid, words_in_process: words, nvml_uuid_at_new_pci: nvml }
    }

    #[test]
    fn rules() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let good = obs(0, &g1, vec![g1.signature(); 4], Some(g1.uuid));
        assert_eq!(validate_gpu(&good, &g1), Verdict::Ok);

        // One stale site.
        let stale = obs(0, &g1, vec![g1.signature(), g0.signature()], Some(g1.uuid));
        let v = validate_gpu(&stale, &g1);
        assert!(matches!(&v, Verdict::Mismatch(t) if t.contains("site 1") && t.contains("0000:00:06.0")), "{v}");

        // NVML resolves the location to the other GPU, or to nothing.
        let other = obs(0, &g1, vec![g1.signature()], Some(g0.uuid));
        assert!(matches!(validate_gpu(&other, &g1), Verdict::Mismatch(t) if t.contains("resolves")));
        let missing = obs(0, &g1, vec![g1.signature()], None);
        assert!(matches!(validate_gpu(&missing, &g1), Verdict::Mismatch(t) if t.contains("Not Found")));

        // No words read back (nothing needed rewriting): only the NVML rule applies.
        assert!(validate_gpu(&obs(0, &g1, vec![], Some(g1.uuid)), &g1).is_ok());
        assert!(!validate_gpu(&obs(0, &g1, vec![], Some(g0.uuid)), &g1).is_ok());
        // The wrong GPU record.
        assert!(!validate_gpu(&good, &g0).is_ok());
    }

    #[test]
    fn report_table() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let report = ReconcileReport {
            rows: vec![
                ReportRow::from_verdict(Some(0), &g0, &g1, 4, &Verdict::Ok),
                ReportRow::from_verdict(None, &g1, &g0, 4, &Verdict::Mismatch("x".into())),
            ],
        };
        assert!(!report.rows.iter().all(|r| r.ok));
        let text = report.render_table();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].starts_with("0 ") && lines[1].ends_with("ok"), "{text}");
        assert!(lines[2].starts_with("- ") && lines[2].ends_with("MISMATCH: x"), "{text}");
    }
}
