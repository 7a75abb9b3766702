//! `node --check --nfd-dir DIR`: the verdict as a Node Feature Discovery feature file, so that a
//! scheduler can place GPU restores on ready nodes.
//!
//! NFD's worker (`local` source) reads every file of its `features.d` directory
//! (`/etc/kubernetes/node-feature-discovery/features.d/` by default) whose name does not begin with
//! a dot, one `name=value` a line, `#` lines ignored, a file over 65536 bytes ignored whole
//! (`source/local/local.go`: `MaxFeatureFileSize`). The file is written under a temporary dot-name
//! (which NFD skips) and renamed over `criu-cuda-migrate`, relative to the directory's descriptor,
//! so that NFD reads the old file or the new one, never half of one, and a link planted at the name is
//! replaced, never written through.
//!
//! The labels live under `criu-cuda-migrate.feature.node.kubernetes.io/`: a sub-namespace of
//! `feature.node.kubernetes.io`, which nfd-master accepts with its default settings in every
//! release (its label validation allows `kubernetes.io` names only there and under
//! `profile.node.kubernetes.io`); a master run with `-deny-label-ns` covering it needs
//! `-extra-label-ns=criu-cuda-migrate.feature.node.kubernetes.io` (docs/USER-GUIDE.md, 7.4).

use std::path::{Component, Path, PathBuf};

use ccm_process::dir::{Dir, FileError};

use super::eval::{self, CmdFact, Facts, Line, Verdict};

/// The namespace of every label.
pub const LABEL_PREFIX: &str = "criu-cuda-migrate.feature.node.kubernetes.io/";
/// The file's name in NFD's directory (no leading dot: NFD skips those).
pub const FILE_NAME: &str = "criu-cuda-migrate";
/// NFD ignores a feature file larger than this (`MaxFeatureFileSize`).
pub const NFD_MAX_FILE_BYTES: usize = 65536;
/// NFD's directory for local feature files, as its worker is deployed by default.
pub const NFD_DEFAULT_DIR: &str = "/etc/kubernetes/node-feature-discovery/features.d";

/// Whether `v` is a Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_` and
/// `.` inside (`k8s.io/apimachinery` `IsValidLabelValue`), which nfd-master requires.
pub fn valid_label_value(v: &str) -> bool {
    let bytes = v.as_bytes();
    let inner_ok = bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    v.is_empty() || (v.len() <= 63 && inner_ok && ends_ok(bytes.first()) && ends_ok(bytes.last()))
}

/// The labels of this node's verdict, name (without the prefix) and value, in a fixed order:
/// `ready` always; `driver-branch`, `criu-version` and `cri-restore` when the check could tell.
pub fn labels(facts: &Facts, lines: &[Line]) -> Vec<(&'static str, String)> {
    let mut out = vec![("ready", eval::ready(lines).to_string())];
    if let Ok(n) = &facts.nvml {
        if let Some(branch) = n.driver_version.split('.').next().and_then(|m| m.trim().parse::<u32>().ok()) {
            out.push(("driver-branch", branch.to_string()));
        }
    }
    if let CmdFact::Ran { status: Some(0), output } = &facts.criu_version {
        let v = output
            .lines()
            .find(|l| l.trim_start().starts_with("Version:"))
            .and_then(eval::parse_version)
            .or_else(|| eval::parse_version(output));
        if let Some((a, b, c)) = v {
            out.push(("criu-version", format!("{a}.{b}.{c}")));
        }
    }
    // Restore through CRI: on only when every CRI runtime installed restores through it (the check's
    // line for it is ok); off when one does not; no label without a CRI runtime.
    let cri: Vec<&Line> = lines.iter().filter(|l| l.check == "containerd" || l.check == "cri-o").collect();
    if !cri.is_empty() {
        let on = cri.iter().all(|l| l.verdict == Verdict::Ok);
        out.push(("cri-restore", if on { "on" } else { "off" }.to_string()));
    }
    // Every value is built from numbers and fixed words; one that is no label value is left out.
    out.retain(|(_, v)| valid_label_value(v));
    out
}

/// The feature file's text: a comment, then one `prefix/name=value` a line.
pub fn feature_file(labels: &[(&'static str, String)]) -> String {
    let mut s = String::from("# criu-cuda-migrate node --check; rewritten whole at every check, do not edit\n");
    for (name, value) in labels {
        s.push_str(&format!("{LABEL_PREFIX}{name}={value}\n"));
    }
    s
}

/// Why the feature file was not written.
#[derive(Debug)]
pub enum NfdError {
    /// The directory or the write.
    File(FileError),
    /// The text is over NFD's size limit (it is a few hundred bytes: a bug).
    TooLarge { bytes: usize },
}

impl std::fmt::Display for NfdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NfdError::File(e) => write!(
                f,
                "{e}; name NFD's feature directory by its real path, every component a directory (no link is \
                 followed), e.g. {NFD_DEFAULT_DIR}"
            ),
            NfdError::TooLarge { bytes } => {
                write!(f, "the feature file would be {bytes} bytes, over NFD's {NFD_MAX_FILE_BYTES}; nothing written")
            }
        }
    }
}

impl std::error::Error for NfdError {}

impl From<FileError> for NfdError {
    fn from(e: FileError) -> NfdError {
        NfdError::File(e)
    }
}

/// Opens `dir` from `/` one component at a time, following no link (a relative path is taken from
/// the working directory, `..` is refused).
fn open_dir_no_follow(dir: &Path) -> Result<(Dir, PathBuf), FileError> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| FileError::Io { action: "find", path: dir.to_path_buf(), source })?
            .join(dir)
    };
    let mut d = Dir::open(Path::new("/"))?;
    for c in abs.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => {
                let name = name.to_str().ok_or_else(|| FileError::BadName {
                    dir: abs.clone(),
                    name: name.to_string_lossy().into_owned(),
                })?;
                d = d.open_dir(name)?;
            }
            Component::ParentDir | Component::Prefix(_) => {
                return Err(FileError::BadName { dir: abs.clone(), name: "..".into() });
            }
        }
    }
    Ok((d.named(abs.clone()), abs))
}

/// Writes the feature file into `dir` (temporary dot-file, then rename), mode 0644; returns its path.
pub fn write(dir: &Path, text: &str) -> Result<PathBuf, NfdError> {
    if text.len() > NFD_MAX_FILE_BYTES {
        return Err(NfdError::TooLarge { bytes: text.len() });
    }
    let (d, abs) = open_dir_no_follow(dir)?;
    d.write_file(FILE_NAME, text.as_bytes(), 0o644)?;
    Ok(abs.join(FILE_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_follow_kubernetes_rules() {
        for ok in ["", "true", "580", "4.1.1", "a-b_c.d"] {
            assert!(valid_label_value(ok), "{ok}");
        }
        for bad in ["-x", "x-", "4.1.1 ", "a/b", "é", &"x".repeat(64)] {
            assert!(!valid_label_value(bad), "{bad}");
        }
    }

    #[test]
    fn the_file_is_name_value_lines_under_the_prefix() {
        let text = feature_file(&[("ready", "true".into()), ("criu-version", "4.1.1".into())]);
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "criu-cuda-migrate.feature.node.kubernetes.io/ready=true",
                "criu-cuda-migrate.feature.node.kubernetes.io/criu-version=4.1.1"
            ]
        );
        // The prefix is a DNS subdomain of at most 253 characters and each name at most 63 (a qualified name).
        assert!(LABEL_PREFIX.len() - 1 <= 253 && LABEL_PREFIX.ends_with(".feature.node.kubernetes.io/"));
    }
}
