//! The workload's control files in `--dir`. Every access opens, writes or checks, and closes:
//! the process must hold no fd into the directory when CRIU dumps it, and a reader must never
//! see a half-written file (write to a temporary name, then rename).

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::Duration;

/// How often a wait looks for its trigger file.
pub const POLL: Duration = Duration::from_millis(20);

/// Writes `dir/name` atomically (temporary file in the same directory, then rename).
pub fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> std::io::Result<PathBuf> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Waits (without limit: the test script decides how long to wait and kills us) until
/// `dir/name` exists.
pub fn wait_for(dir: &Path, name: &str) {
    let path = dir.join(name);
    while !path.exists() {
        sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = write_atomic(d.path(), "ready", b"42\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"42\n");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ready")]);
        wait_for(d.path(), "ready");
    }
}
