//! The restored container's `/dev` as the plugin edits it, on a real mount namespace: a child in
//! its own mount namespace with a tmpfs on /dev (what CRIU restores for a runc container).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ccm_process::container::{container_dev, create_gpu_node, remove_gpu_node};

struct Container(Child);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// Starts the namespace and returns it with the pid of its shell (unshare's child).
fn start() -> Option<(Container, u32)> {
    if !is_root() {
        eprintln!("container_dev: needs root (mount namespaces); skipped");
        return None;
    }
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--fork", "--kill-child", "sh", "-c"])
        .arg("mount -t tmpfs -o mode=755 tmpfs /dev && mknod -m 620 /dev/nvidia0 c 1 3 && mknod /dev/nvidiactl c 1 3 && touch /dev/ready && exec sleep 60")
        .stdin(Stdio::null())
        .spawn()
        .expect("unshare");
    let c = Container(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", c.0.id())).unwrap_or_default();
        if let Some(pid) = kids.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            if std::path::Path::new(&format!("/proc/{pid}/root/dev/ready")).exists() {
                return Some((c, pid));
            }
        }
        assert!(Instant::now() < deadline, "the namespace never got its /dev");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_container_dev_gets_the_new_gpu_node_and_loses_the_old_one() {
    let Some((_container, pid)) = start() else { return };
    let dev = container_dev(pid).unwrap().expect("a tmpfs /dev in another mount namespace");
    assert_eq!(dev.gpu_minors, vec![0], "nvidiactl is no GPU");
    create_gpu_node(&dev, 3).unwrap();
    remove_gpu_node(&dev, 0).unwrap();
    let node = std::fs::metadata(format!("/proc/{pid}/root/dev/nvidia3")).unwrap();
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    assert!(node.file_type().is_char_device());
    assert_eq!(node.permissions().mode() & 0o7777, 0o620, "the mode of the node it replaces");
    assert_eq!(nix::sys::stat::minor(node.rdev()), 3);
    assert!(!std::path::Path::new(&format!("/proc/{pid}/root/dev/nvidia0")).exists());
    // The host's /dev was not touched.
    assert!(!std::path::Path::new("/dev/ready").exists());
    assert_eq!(container_dev(pid).unwrap().unwrap().gpu_minors, vec![3]);
}
