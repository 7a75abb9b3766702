//! The restored container's `/dev` as the plugin edits it, on real mount namespaces: a child in
//! its own mount namespace with a tmpfs on /dev (what CRIU restores for a runc container), and the
//! hostile layouts a tenant can make, each of which must leave every file outside the container's
//! own `/dev` as it was (a sentinel tree on the "host" side is hashed before and after).

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ccm_process::container::{container_dev, create_gpu_node, remove_gpu_node, DevView, ForeignDev};

mod common;
use common::{is_root, KillOnDrop as Container};

/// Runs `script` in a new mount namespace (private propagation) and returns it with the pid of the
/// process the script finally `exec`s, once `ready` (a path in the host's view) exists.
fn start(script: &str, ready: &Path) -> Option<(Container, u32)> {
    if !is_root() {
        eprintln!("######## container_dev: needs root (mount namespaces); skipped ########");
        return None;
    }
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--fork", "--kill-child", "sh", "-ec"])
        .arg(script)
        .stdin(Stdio::null())
        .spawn()
        .expect("unshare");
    let c = Container(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", c.0.id())).unwrap_or_default();
        if let Some(pid) = kids.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if ready.exists() && comm.trim() == "sleep" {
                return Some((c, pid));
            }
        }
        assert!(Instant::now() < deadline, "the namespace never got ready");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A scratch directory that stands for the host: a tmpfs mounted in the test's own namespace, with
/// sentinel files and a "host" GPU node, unmounted at the end.
struct HostSide(PathBuf);

impl HostSide {
    fn new(name: &str) -> HostSide {
        let dir = std::env::temp_dir().join(format!("ccm-hostside-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=755", "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap()
            .success());
        std::fs::write(dir.join("secret"), b"host secret").unwrap();
        std::fs::set_permissions(dir.join("secret"), std::fs::Permissions::from_mode(0o4751)).unwrap();
        std::os::unix::fs::chown(dir.join("secret"), Some(1234), Some(4321)).unwrap();
        mknod(&dir.join("nvidia0"), 0o666, 0);
        HostSide(dir)
    }

    /// Every entry's name, type, mode, owner, device number and content.
    fn hash(&self) -> String {
        let mut out = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(&self.0).unwrap().flatten().map(|e| e.file_name()).collect();
        names.sort();
        for n in names {
            let p = self.0.join(&n);
            let m = std::fs::symlink_metadata(&p).unwrap();
            let body = if m.is_file() { std::fs::read(&p).unwrap() } else { Vec::new() };
            out.push(format!("{n:?} {:o} {}:{} {} {:?}", m.mode(), m.uid(), m.gid(), m.rdev(), body));
        }
        out.join("\n")
    }
}

impl Drop for HostSide {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mknod(path: &Path, mode: u32, minor: u32) {
    let st = Command::new("mknod")
        .arg("-m")
        .arg(format!("{mode:o}"))
        .arg(path)
        .args(["c", "195"])
        .arg(minor.to_string())
        .status();
    assert!(st.unwrap().success(), "mknod {}", path.display());
}

/// A root for `chroot`: the host's /usr bound in (for `sleep`), and `dev` made by `dev_setup` (shell).
fn chroot_script(root: &Path, dev_setup: &str, ready: &Path) -> String {
    format!(
        "R={r}; mkdir -p $R/usr $R/proc; mount --rbind /usr $R/usr; \
         for d in bin lib lib64 sbin; do [ -e /$d ] && ln -sfn usr/$d $R/$d; done; {dev_setup}; \
         touch {ready}; exec chroot $R /usr/bin/sleep 60",
        r = root.display(),
        ready = ready.display()
    )
}

#[test]
fn a_container_dev_gets_the_new_gpu_node_and_loses_the_old_one() {
    let ready = std::env::temp_dir().join(format!("ccm-devready-own-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let script = format!(
        "mount -t tmpfs -o mode=755 tmpfs /dev && mknod -m 620 /dev/nvidia0 c 195 0 && mknod /dev/nvidiactl c 195 255 \
         && touch {} && exec sleep 60",
        ready.display()
    );
    let Some((_container, pid)) = start(&script, &ready) else { return };
    let DevView::Own(dev) = container_dev(pid).unwrap() else { panic!("a tmpfs /dev in another mount namespace") };
    assert_eq!(dev.gpu_minors, vec![0], "nvidiactl is no GPU");
    create_gpu_node(&dev, 3).unwrap();
    remove_gpu_node(&dev, 0).unwrap();
    let node = std::fs::symlink_metadata(format!("/proc/{pid}/root/dev/nvidia3")).unwrap();
    assert!(node.file_type().is_char_device());
    assert_eq!(node.permissions().mode() & 0o7777, 0o620, "the mode of the node it replaces");
    assert_eq!(nix::sys::stat::minor(node.rdev()), 3);
    assert!(!Path::new(&format!("/proc/{pid}/root/dev/nvidia0")).exists());
    let DevView::Own(dev) = container_dev(pid).unwrap() else { panic!() };
    assert_eq!(dev.gpu_minors, vec![3]);
    // Only an NVIDIA GPU node is removed.
    assert!(remove_gpu_node(&dev, 7).is_err());
    let _ = std::fs::remove_file(&ready);
}

#[test]
fn a_dev_that_is_a_link_out_of_the_root_is_left_alone() {
    let host = HostSide::new("dev-link");
    let before = host.hash();
    let t = tempfile::tempdir().unwrap();
    let ready = t.path().join("ready");
    // The container's /dev is a link to an absolute path: resolved from CRIU's side, it would land on
    // the host's directory of that name.
    let setup = format!("mkdir -p $R/{h}; ln -s {h} $R/dev", h = host.0.display());
    let Some((_c, pid)) = start(&chroot_script(&t.path().join("root"), &setup, &ready), &ready) else { return };
    match container_dev(pid).unwrap() {
        DevView::Foreign { why: ForeignDev::Symlink { target }, .. } => assert_eq!(Path::new(&target), host.0),
        other => panic!("{other:?}"),
    }
    assert_eq!(host.hash(), before, "nothing on the host side changed");
}

#[test]
fn the_hosts_dev_in_another_namespace_is_left_alone() {
    let host = HostSide::new("hostdev");
    let before = host.hash();
    let t = tempfile::tempdir().unwrap();
    let ready = t.path().join("ready");
    // A service with its own mount namespace and the host's /dev: here the test's own /dev, and a
    // host directory bind-mounted over it (`-v /dev:/dev`, a hostPath /dev).
    for (what, script) in [
        ("the host's /dev itself", format!("touch {}; exec sleep 60", ready.display())),
        (
            "a host tmpfs bound on /dev",
            format!("mount --bind {} /dev; touch {}; exec sleep 60", host.0.display(), ready.display()),
        ),
    ] {
        let _ = std::fs::remove_file(&ready);
        let Some((_c, pid)) = start(&script, &ready) else { return };
        match container_dev(pid).unwrap() {
            DevView::Foreign { why: ForeignDev::SharedWithHost { .. } | ForeignDev::NotTmpfs { .. }, .. } => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(host.hash(), before, "nothing on the host side changed");
}

#[test]
fn a_dev_that_is_no_tmpfs_of_its_own_is_left_alone() {
    let t = tempfile::tempdir().unwrap();
    let ready = t.path().join("ready");
    // A directory of the container's root file system, no mount.
    let setup = "mkdir -p $R/dev; mknod $R/dev/nvidia0 c 195 0";
    let Some((_c, pid)) = start(&chroot_script(&t.path().join("root"), setup, &ready), &ready) else { return };
    match container_dev(pid).unwrap() {
        DevView::Foreign { why: ForeignDev::NotAMount, gpu_minors } => assert_eq!(gpu_minors, vec![0]),
        other => panic!("{other:?}"),
    }
    assert!(t.path().join("root/dev/nvidia0").exists());
}

#[test]
fn a_gpu_node_that_is_a_link_to_a_host_file_is_neither_copied_nor_removed() {
    let host = HostSide::new("node-link");
    let before = host.hash();
    let ready = std::env::temp_dir().join(format!("ccm-devready-nodelink-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let script = format!(
        "mount -t tmpfs -o mode=755 tmpfs /dev && ln -s {}/secret /dev/nvidia0 && touch {} && exec sleep 60",
        host.0.display(),
        ready.display()
    );
    let Some((_c, pid)) = start(&script, &ready) else { return };
    let DevView::Own(dev) = container_dev(pid).unwrap() else { panic!("its own tmpfs") };
    assert!(dev.gpu_minors.is_empty(), "a link is no GPU node");
    assert_eq!(dev.impostors, vec![("nvidia0".to_string(), "a symbolic link")]);
    let e = remove_gpu_node(&dev, 0).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    create_gpu_node(&dev, 1).unwrap();
    let node = std::fs::symlink_metadata(format!("/proc/{pid}/root/dev/nvidia1")).unwrap();
    assert!(node.file_type().is_char_device());
    assert_ne!(node.permissions().mode() & 0o7777, 0o4751, "the host file's mode was not copied");
    assert_ne!(node.uid(), 1234, "nor its owner");
    // The link itself is still there, and the host file unchanged.
    assert!(std::fs::symlink_metadata(format!("/proc/{pid}/root/dev/nvidia0")).unwrap().file_type().is_symlink());
    assert_eq!(host.hash(), before, "nothing on the host side changed");
    let _ = std::fs::remove_file(&ready);
}

/// The root of `pid` as a restored task sees its own `/` (CRIU calls RESTORE_EXT_FILE in the task).
fn root_of(pid: u32) -> std::fs::File {
    std::fs::File::open(format!("/proc/{pid}/root")).unwrap()
}

/// A descriptor held on `/dev/nvidia0` at dump that the restore moves onto GPU 1: `want` stands for the restoring
/// node's number of `/dev/nvidia1` (here `/dev/zero`'s, char 1:5, which any test machine can open).
fn reopen_moved(pid: u32) -> Result<(std::os::fd::OwnedFd, bool), ccm_process::claims::ReopenError> {
    use ccm_identity::claims::{DevNumber, DevType, NvidiaNode};
    use std::os::fd::AsFd;
    let want = DevNumber { kind: DevType::Char, major: 1, minor: 5 };
    let host = ccm_process::container::own_mounts().unwrap();
    let root = root_of(pid);
    ccm_process::claims::reopen_moved_gpu_node_in(
        root.as_fd(),
        pid,
        (NvidiaNode::Gpu(1), NvidiaNode::Gpu(0)),
        want,
        libc::O_RDWR,
        None,
        &host,
    )
}

#[test]
fn a_moved_gpus_node_is_added_to_the_tasks_own_dev_with_the_held_nodes_mode_then_reopened() {
    let ready = std::env::temp_dir().join(format!("ccm-devready-moved-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    // CRIU's copy of the dumped /dev: the held GPU's node (a stand-in number, mode 620, group 44) and no nvidia1.
    let script = format!(
        "mount -t tmpfs -o mode=755 tmpfs /dev && mknod -m 620 /dev/nvidia0 c 1 3 && chown 0:44 /dev/nvidia0 \
         && touch {} && exec sleep 60",
        ready.display()
    );
    let Some((_c, pid)) = start(&script, &ready) else { return };
    let (fd, added) = reopen_moved(pid).unwrap();
    assert!(added, "the node was missing, so it was added");
    let node = std::fs::symlink_metadata(format!("/proc/{pid}/root/dev/nvidia1")).unwrap();
    assert!(node.file_type().is_char_device());
    assert_eq!((nix::sys::stat::major(node.rdev()), nix::sys::stat::minor(node.rdev())), (1, 5));
    assert_eq!(node.permissions().mode() & 0o7777, 0o620, "the held node's mode");
    assert_eq!((node.uid(), node.gid()), (0, 44), "the held node's owner");
    let opened = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).unwrap();
    assert_eq!(opened.rdev(), node.rdev(), "the descriptor is of the added node");
    // Another task of the tree finds it there: opened, not added again.
    let (_fd, added) = reopen_moved(pid).unwrap();
    assert!(!added);
    let _ = std::fs::remove_file(&ready);
}

#[test]
fn a_moved_gpus_node_is_never_added_to_a_dev_the_host_shares_or_behind_a_link() {
    let host = HostSide::new("moved");
    let before = host.hash();
    let t = tempfile::tempdir().unwrap();
    let ready = t.path().join("ready");
    for (what, script, says) in [
        (
            "a host tmpfs bound on /dev",
            format!("mount --bind {} /dev; touch {}; exec sleep 60", host.0.display(), ready.display()),
            "the host also has mounted",
        ),
        (
            "a /dev that is a link to the host's directory",
            chroot_script(
                &t.path().join("root"),
                &format!("mkdir -p $R/{h}; ln -s {h} $R/dev", h = host.0.display()),
                &ready,
            ),
            "a /dev that is a link is refused",
        ),
        (
            "a /dev of the container's root file system",
            chroot_script(&t.path().join("root2"), "mkdir -p $R/dev; mknod $R/dev/nvidia0 c 1 3", &ready),
            "no mount of its own",
        ),
    ] {
        let _ = std::fs::remove_file(&ready);
        let Some((_c, pid)) = start(&script, &ready) else { return };
        // Refused: a link before any node is looked for, the others when the node is found missing.
        let e = reopen_moved(pid).unwrap_err();
        assert!(e.to_string().contains(says), "{what}: {e}");
        if !what.contains("link") {
            assert!(matches!(e, ccm_process::claims::ReopenError::NotAdded { .. }), "{what}: {e}");
            assert!(e.to_string().contains("/dev/nvidia1 is not in the restored task's /dev"), "{what}: {e}");
        }
    }
    assert!(!t.path().join("root2/dev/nvidia1").exists(), "nothing added to the root file system");
    assert_eq!(host.hash(), before, "nothing on the host side changed");
}
