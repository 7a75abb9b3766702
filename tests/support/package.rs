//! The Debian package and writable copies of the trixie roots, shared by `tests/package_install.rs` and
//! `tests/container_runtime.rs`: both install the package as a user does, into a copy (the cached roots are never
//! modified).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use super::{repo_root, CriuRoot};

/// The package file: `CCM_DEB` if set, else built once for this test binary by `packaging/build-deb.sh`.
pub fn deb() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        if let Some(path) = std::env::var_os("CCM_DEB") {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "CCM_DEB={} is not a file", path.display());
            return path;
        }
        let script = repo_root().join("packaging/build-deb.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        assert!(out.status.success(), "{} failed ({}); its messages are above", script.display(), out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(path.is_file(), "build-deb.sh did not print the path of a .deb as its last line: {stdout:?}");
        path
    })
}

pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", describe_output(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn describe_output(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Which cached root a copy is made of.
#[derive(Clone, Copy)]
pub enum RootKind {
    /// `tests/criu-root.sh path`: CRIU and its header.
    Criu,
    /// `tests/criu-root.sh runtimes-path` (made by `prepare-runtimes` if missing): plus Podman, containerd, runc,
    /// crun.
    Runtimes,
}

/// A writable copy of a cached trixie root, deleted on drop.
pub struct RootCopy {
    dir: tempfile::TempDir,
}

impl RootCopy {
    pub fn of(root: &CriuRoot, kind: RootKind) -> Self {
        let script = repo_root().join("tests/criu-root.sh");
        // The script names the cached roots (it honours CCM_TRIXIE_ROOT and CCM_RUNTIMES_ROOT).
        let located = run_ok(Command::new("bash").arg(&script).arg("path"));
        assert!(root.plugin_header().starts_with(located.trim()), "criu-root.sh path disagrees with the located root");
        let source = match kind {
            RootKind::Criu => PathBuf::from(located.trim()),
            RootKind::Runtimes => {
                // Idempotent: a complete runtimes root is reused (CI caches it next to the CRIU root).
                let out = Command::new("bash")
                    .arg(&script)
                    .arg("prepare-runtimes")
                    .stdin(Stdio::null())
                    .stderr(Stdio::inherit())
                    .output()
                    .expect("run tests/criu-root.sh prepare-runtimes");
                assert!(out.status.success(), "tests/criu-root.sh prepare-runtimes failed: {}", describe_output(&out));
                PathBuf::from(run_ok(Command::new("bash").arg(&script).arg("runtimes-path")).trim())
            }
        };
        let parent = std::env::var_os("CCM_PACKAGE_TEST_TMP").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::Builder::new().prefix("ccm-package-root-").tempdir_in(parent).expect("temporary directory");
        let copy = dir.path().join("trixie");
        let out = Command::new("cp")
            .args(["-a", "--reflink=auto"])
            .arg(&source)
            .arg(&copy)
            .stdin(Stdio::null())
            .output()
            .expect("run cp");
        assert!(
            out.status.success(),
            "cp -a {} {} failed: {}",
            source.display(),
            copy.display(),
            describe_output(&out)
        );
        Self { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("trixie")
    }

    /// A file of the copy, by its path inside the root.
    pub fn file(&self, inside: &str) -> PathBuf {
        self.path().join(inside.trim_start_matches('/'))
    }
}
