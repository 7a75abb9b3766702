//! `criu-cuda-migrate node --check`: is this node ready for GPU checkpoint/restore? One line per
//! thing that must be right (the plugin in the libdir of each CRIU caller, CRIU's version and
//! `criu check`, the driver and its checkpoint API, persistence mode, the container runtimes'
//! restore settings, CRIU's network lock, CDI specs), each with a verdict (ok, WARN, FAIL) and,
//! when not ok, the fix. Exit 0 when nothing failed (ready), 1 when something did.
//!
//! `eval` judges facts without any I/O (unit-tested per wrong setting); `gather` reads them.

pub mod eval;
pub mod gather;
pub mod nfd;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::Failure;
use eval::{Line, Verdict};

/// The flags of `node`.
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// Check everything GPU checkpoint/restore needs on this node (the plugin in each CRIU caller's libdir,
    /// CRIU, the driver's checkpoint API, persistence mode, containerd's and CRI-O's restore settings, CRIU's
    /// network lock, CDI specs): one line per check with ok / WARN / FAIL and the fix; exit 0 when ready, 1 when
    /// a check failed.
    #[arg(long)]
    pub check: bool,
    /// Read the node's files below DIR instead of `/`, and its commands from DIR's bin directories (tests).
    #[arg(long, value_name = "DIR", hide = true, requires = "check")]
    pub root: Option<PathBuf>,
    /// How long each command and the driver's answers may take, in seconds, instead of 20 s a command and 30 s
    /// the driver (tests).
    #[arg(long, value_name = "SECONDS", hide = true, requires = "check", value_parser = clap::value_parser!(u64).range(1..=600))]
    pub deadline: Option<u64>,
    /// Also write the verdict as a Node Feature Discovery feature file `criu-cuda-migrate` into DIR, NFD's
    /// features.d (default /etc/kubernetes/node-feature-discovery/features.d): labels
    /// criu-cuda-migrate.feature.node.kubernetes.io/{ready,driver-branch,criu-version,cri-restore}, written whole
    /// (temporary file and rename); exit 2 when it cannot be written.
    #[arg(long, value_name = "DIR", requires = "check")]
    pub nfd_dir: Option<PathBuf>,
}

/// Runs the check and prints it; a node that is not ready is a refusal (exit 1).
pub fn run(args: &NodeArgs, json: bool) -> Result<(), Failure> {
    let root_path = args.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    let deadlines = match args.deadline {
        Some(s) => gather::Deadlines { command: Duration::from_secs(s), driver: Duration::from_secs(s) },
        None => gather::Deadlines::default(),
    };
    let root = gather::Root::open(&root_path, deadlines).map_err(|e| Failure::Input(format!("--root: {e}")))?;
    let facts = gather::gather(&root, deadlines);
    let lines = eval::evaluate(&facts);
    let ready = eval::ready(&lines);
    // The feature file before any output, so that a failed write is the one outcome printed.
    let nfd = match &args.nfd_dir {
        Some(dir) => {
            let labels = nfd::labels(&facts, &lines);
            let path = nfd::write(dir, &nfd::feature_file(&labels))
                .map_err(|e| Failure::Input(format!("--nfd-dir {}: {e}", dir.display())))?;
            Some((path, labels))
        }
        None => None,
    };
    let count = |v: Verdict| lines.iter().filter(|l| l.verdict == v).count();
    let (oks, warns, fails) = (count(Verdict::Ok), count(Verdict::Warn), count(Verdict::Fail));
    if json {
        let mut doc = serde_json::json!({
            "ok": ready,
            "ready": ready,
            "root": root_path.display().to_string(),
            "counts": {"ok": oks, "warn": warns, "fail": fails},
            "checks": lines,
        });
        if let Some((path, labels)) = &nfd {
            let labels: serde_json::Map<String, serde_json::Value> = labels
                .iter()
                .map(|(n, v)| (format!("{}{n}", nfd::LABEL_PREFIX), serde_json::Value::String(v.clone())))
                .collect();
            doc["nfd"] = serde_json::json!({"file": path.display().to_string(), "labels": labels});
        }
        println!("{doc}");
        if !ready {
            // The one document is out: not ready only sets the exit code (as `recover --json`).
            let _ = std::io::stdout().flush();
            std::process::exit(1);
        }
        return Ok(());
    }
    print!("{}", render(&lines));
    if let Some((path, labels)) = &nfd {
        let shown: Vec<String> = labels.iter().map(|(n, v)| format!("{n}={v}")).collect();
        println!("NFD feature file {} written: {} ({})", path.display(), shown.join(", "), nfd::LABEL_PREFIX);
    }
    if ready {
        println!("node ready for GPU checkpoint/restore: {oks} ok, {warns} warning(s)");
        Ok(())
    } else {
        println!("node NOT ready: {fails} check(s) failed, {warns} warning(s), {oks} ok");
        Err(Failure::Refused(format!("{fails} check(s) failed (the FAIL lines above say what to fix)")))
    }
}

/// The lines as a table: verdict, check, what was found, and the fix under it.
pub fn render(lines: &[Line]) -> String {
    let width = lines.iter().map(|l| l.check.len()).max().unwrap_or(0);
    let mut s = String::new();
    for l in lines {
        s.push_str(&format!("{:<4}  {:<width$}  {}\n", l.verdict.word(), l.check, l.found));
        if let Some(fix) = &l.fix {
            s.push_str(&format!("{:<4}  {:<width$}  fix: {fix}\n", "", ""));
        }
    }
    s
}

#[cfg(test)]
mod tests;
