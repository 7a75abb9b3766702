//! Member names: the path rules, and what a name says a member is.

use ccm_identity::image::{is_image_file_name, is_report_file_name};

use std::fmt;

/// The longest member name printed in a message, in characters; a PAX path may be 1 MiB long.
const SHOWN_NAME_CHARS: usize = 256;

/// What a member is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `checkpoint/cuda-migrate-<pid>.img`: kept.
    Image,
    /// `checkpoint/cuda-migrate-restore-<pid>.txt`: kept.
    Report,
    /// `spec.dump` at the top: kept.
    Spec,
    /// `checkpoint/inventory.img`: noted, not kept.
    Inventory,
    /// `checkpoint/` itself or anything else below it.
    InCheckpoint,
    /// CRIU's `dump.log`, at the top (the kubelet's archive) or in `checkpoint/` (the flag says
    /// which): its first lines name the dumping CRIU's version. Read in part, never refused.
    DumpLog { in_checkpoint: bool },
    /// `oci-layout` at the top (an OCI image layout in a tar: an `oci-archive`): kept.
    OciLayout,
    /// `index.json` at the top (the same): kept.
    OciIndex,
    /// `blobs/<algorithm>/<name>` (the same): where it lies is noted, its data is not read.
    Blob,
    /// `checkpoint/cuda-migrate-devices.img`: what the dump claimed of forked processes' NVIDIA nodes.
    Claims,
    /// `checkpoint/cuda-migrate-pages-<pid>.img`: a process's staging pages (issue 47); its size is noted, its
    /// data not read.
    PageFile,
    /// Everything else (`config.dump`, `rootfs-diff.tar`, ...).
    Other,
}

impl Role {
    /// Whether a member of this role must be a plain, unique regular file: the ones whose bytes or
    /// presence the tool reports on. A link there could make the report describe another file than
    /// the one a restore reads.
    pub(crate) fn is_recognized(self) -> bool {
        matches!(
            self,
            Role::Image
                | Role::Report
                | Role::Claims
                | Role::PageFile
                | Role::Spec
                | Role::Inventory
                | Role::OciLayout
                | Role::OciIndex
                | Role::Blob
        )
    }

    pub(crate) fn in_checkpoint(self) -> bool {
        matches!(
            self,
            Role::Image
                | Role::Report
                | Role::Claims
                | Role::PageFile
                | Role::Inventory
                | Role::InCheckpoint
                | Role::DumpLog { in_checkpoint: true }
        )
    }
}

/// The prefix of an OCI (AUFS) whiteout's name: `.wh.NAME` deletes `NAME` from the layers below when a layer is
/// applied (containerd's `archive.Apply`, which the CRI restore uses for a checkpoint archive and for an image's
/// layer), and `.wh..wh..opq` empties its directory.
pub(crate) const WHITEOUT: &[u8] = b".wh.";

/// Linux's PATH_MAX: every member name and link target is shorter (a path is shorter, with room for its NUL).
pub const PATH_MAX: usize = 4096;

/// The components of a member name with `.` and empty ones dropped (`./checkpoint//x` is
/// `checkpoint/x`, as every extractor sees it), or the rule it breaks.
pub(crate) fn components(raw: &[u8]) -> Result<Vec<&[u8]>, PathRule> {
    if raw.len() >= PATH_MAX {
        return Err(PathRule::TooLong { len: raw.len() });
    }
    if raw.first() == Some(&b'/') {
        return Err(PathRule::Absolute);
    }
    let mut out = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(PathRule::ParentDir),
            part => out.push(part),
        }
    }
    Ok(out)
}

/// What the (rule-abiding) components name. `is_dir` tells `checkpoint/` the directory from a file
/// that happens to be called `checkpoint`.
pub(crate) fn role(components: &[&[u8]], is_dir: bool) -> Role {
    match components {
        [b"checkpoint"] if is_dir => Role::InCheckpoint,
        [b"checkpoint", file] => {
            let Ok(file) = std::str::from_utf8(file) else { return Role::InCheckpoint };
            if is_image_file_name(file).is_some() {
                Role::Image
            } else if is_report_file_name(file).is_some() {
                Role::Report
            } else if file == ccm_identity::claims::CLAIMS_FILE_NAME {
                Role::Claims
            } else if ccm_identity::staging::is_page_file_name(file).is_some() {
                Role::PageFile
            } else if file == "inventory.img" {
                Role::Inventory
            } else if file == "dump.log" && !is_dir {
                Role::DumpLog { in_checkpoint: true }
            } else {
                Role::InCheckpoint
            }
        }
        [b"checkpoint", _, ..] => Role::InCheckpoint,
        [b"spec.dump"] => Role::Spec,
        [b"dump.log"] if !is_dir => Role::DumpLog { in_checkpoint: false },
        // A directory under these names too: `index.json/` after `index.json` would be a second `index.json`
        // to an extractor (a directory replacing the file), so it is held to the rules of the file's name.
        [b"oci-layout"] => Role::OciLayout,
        [b"index.json"] => Role::OciIndex,
        [b"blobs", _, _] => Role::Blob,
        _ => Role::Other,
    }
}

/// A member name for messages: lossy UTF-8, control characters escaped, long names cut.
pub(crate) fn shown(raw: &[u8]) -> String {
    let lossy = String::from_utf8_lossy(raw);
    let mut chars = lossy.chars();
    let head: String = chars.by_ref().take(SHOWN_NAME_CHARS).collect();
    let cut = chars.next().is_some();
    let mut out = ccm_identity::text::escaped(&head);
    if cut {
        out.push_str("...");
    }
    out
}

/// The path rules every member name must pass, even one that is skipped: an archive with such a name
/// is hostile or broken, and restoring it with another tool would write outside its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRule {
    /// Starts with `/`.
    Absolute,
    /// Has a `..` component.
    ParentDir,
    /// Is [`PATH_MAX`] bytes long or longer: no file of Linux has such a path.
    TooLong { len: usize },
}

impl fmt::Display for PathRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathRule::Absolute => {
                f.write_str("it is an absolute path (a checkpoint archive holds relative paths only)")
            }
            PathRule::ParentDir => {
                f.write_str("it has a `..` component (a path that climbs out of the archive's root)")
            }
            PathRule::TooLong { len } => {
                write!(f, "it is {len} bytes long, and a path on Linux is shorter than PATH_MAX ({} bytes)", PATH_MAX)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role_of(name: &str, is_dir: bool) -> Role {
        role(&components(name.as_bytes()).unwrap(), is_dir)
    }

    #[test]
    fn dot_and_empty_components_are_dropped() {
        let c = components(b"./checkpoint//./cuda-migrate-5.img").unwrap();
        assert_eq!(c, [&b"checkpoint"[..], b"cuda-migrate-5.img"]);
        assert!(components(b"./").unwrap().is_empty());
    }

    #[test]
    fn absolute_and_parent_components_are_refused() {
        assert_eq!(components(b"/abs/path"), Err(PathRule::Absolute));
        assert_eq!(components(b"../etc/passwd"), Err(PathRule::ParentDir));
        assert_eq!(components(b"checkpoint/../../x"), Err(PathRule::ParentDir));
        assert_eq!(components(b"a/.."), Err(PathRule::ParentDir));
        // `..` inside a component is just a name.
        assert!(components(b"a/..b/c..").is_ok());
        assert_eq!(components(&[b'a'; PATH_MAX]), Err(PathRule::TooLong { len: PATH_MAX }));
        assert!(components(&[b'a'; PATH_MAX - 1]).is_ok());
    }

    #[test]
    fn roles_follow_the_names_the_plugin_writes() {
        assert_eq!(role_of("checkpoint/cuda-migrate-5.img", false), Role::Image);
        assert_eq!(role_of("./checkpoint/cuda-migrate-5.img", false), Role::Image);
        assert_eq!(role_of("checkpoint/cuda-migrate-05.img", false), Role::InCheckpoint);
        assert_eq!(role_of("checkpoint/cuda-migrate-restore-5.txt", false), Role::Report);
        assert_eq!(role_of("checkpoint/inventory.img", false), Role::Inventory);
        assert_eq!(role_of("checkpoint/pages-1.img", false), Role::InCheckpoint);
        assert_eq!(role_of("checkpoint/sub/cuda-migrate-5.img", false), Role::InCheckpoint);
        assert_eq!(role_of("checkpoint", true), Role::InCheckpoint);
        assert_eq!(role_of("checkpoint", false), Role::Other);
        assert_eq!(role_of("spec.dump", false), Role::Spec);
        assert_eq!(role_of("checkpoint/cuda-migrate-devices.img", false), Role::Claims);
        assert_eq!(role_of("checkpoint/cuda-migrate-pages-7.img", false), Role::PageFile);
        assert_eq!(role_of("./spec.dump", false), Role::Spec);
        assert_eq!(role_of("x/spec.dump", false), Role::Other);
        assert_eq!(role_of("cuda-migrate-5.img", false), Role::Other);
        assert_eq!(role_of("dump.log", false), Role::DumpLog { in_checkpoint: false });
        assert_eq!(role_of("checkpoint/dump.log", false), Role::DumpLog { in_checkpoint: true });
        assert_eq!(role_of("./oci-layout", false), Role::OciLayout);
        assert_eq!(role_of("index.json", false), Role::OciIndex);
        assert_eq!(role_of("blobs/sha256/ab", false), Role::Blob);
        assert_eq!(role_of("blobs/sha256", true), Role::Other);
        assert_eq!(role_of("index.json", true), Role::OciIndex);
        assert_eq!(role_of("blobs/sha256/ab", true), Role::Blob);
        assert_eq!(role_of("checkpoint/index.json", false), Role::InCheckpoint);
    }

    #[test]
    fn shown_names_are_escaped_and_cut() {
        assert_eq!(shown(b"a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(shown(b"\xff/x"), "\u{fffd}/x");
        let long = shown(&[b'a'; 1000]);
        assert_eq!(long.len(), SHOWN_NAME_CHARS + 3);
        assert!(long.ends_with("..."));
    }
}
