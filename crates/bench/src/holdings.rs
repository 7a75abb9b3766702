//! `ccm-bench holdings`: what finding a forked worker's NVIDIA nodes costs (issue 40), the product's way against the
//! earlier one, side by side in one run (alternating rounds, so both see the same process and page cache).

use std::time::Instant;

use serde::Serialize;

use crate::error::BenchError;

#[derive(Debug, Serialize)]
pub struct HoldingsRound {
    /// `/proc/PID/maps` read and parsed.
    pub maps_ms: f64,
    /// `ccm_process::claims::holdings` (one `stat` per mapped file, and the descriptors).
    pub holdings_ms: f64,
    /// One `stat` per file mapping, as before (the descriptors not included).
    pub stat_per_mapping_ms: f64,
    /// `holdings` given no mappings: its descriptors' part alone.
    pub descriptors_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct HoldingsReport {
    pub pid: u32,
    pub mappings: usize,
    pub file_mappings: usize,
    pub mapped_files: usize,
    pub nvidia_mappings: usize,
    pub nvidia_descriptors: usize,
    pub rounds: Vec<HoldingsRound>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub fn run(pid: u32, rounds: usize) -> Result<HoldingsReport, BenchError> {
    let devices = ccm_process::claims::nvidia_devices().unwrap_or_default();
    let maps = ccm_process::read_maps(pid)?;
    let files: Vec<_> = maps.iter().filter(|m| m.inode != 0 && m.path.starts_with('/')).collect();
    let mapped_files = files.iter().map(|m| (m.dev, m.inode)).collect::<std::collections::BTreeSet<_>>().len();
    let held = ccm_process::claims::holdings(pid, &maps, &devices)?;
    let mut report = HoldingsReport {
        pid,
        mappings: maps.len(),
        file_mappings: files.len(),
        mapped_files,
        nvidia_mappings: held.mappings.len(),
        nvidia_descriptors: held.fds.len(),
        rounds: Vec::new(),
    };
    for _ in 0..rounds {
        let t = Instant::now();
        let maps = ccm_process::read_maps(pid)?;
        let maps_ms = ms(t);
        let t = Instant::now();
        ccm_process::claims::holdings(pid, &maps, &devices)?;
        let holdings_ms = ms(t);
        let t = Instant::now();
        for m in maps.iter().filter(|m| m.inode != 0 && m.path.starts_with('/')) {
            let _ = std::fs::metadata(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
        }
        let stat_per_mapping_ms = ms(t);
        let t = Instant::now();
        ccm_process::claims::holdings(pid, &[], &devices)?;
        report.rounds.push(HoldingsRound { maps_ms, holdings_ms, stat_per_mapping_ms, descriptors_ms: ms(t) });
    }
    Ok(report)
}
