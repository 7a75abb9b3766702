//! Shared by every package's `tests/help.rs`: a workspace binary asked for `--help` answers with
//! its usage on stdout and exit 0, quickly, and creates no file (issue 31: `ccm-tcp-pair --help`
//! wrote a file named `--help` and ran until killed).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `--help` may take.
const LIMIT: Duration = Duration::from_secs(5);

/// A fresh empty directory under the system's temp dir, removed at drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("ccm-help-{}-{tag}-{}", std::process::id(), nanos()));
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Runs `bin args...` in an empty directory; asserts exit 0 within [`LIMIT`], `usage_word` (case-insensitive)
/// in stdout, nothing created in the directory. Returns stdout.
pub fn assert_help(bin: &Path, args: &[&str], usage_word: &str) -> String {
    let name = bin.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = Scratch::new(&name);
    let out_file = dir.0.with_extension("out");
    let err_file = dir.0.with_extension("err");
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).expect("stdout file"))
        .stderr(std::fs::File::create(&err_file).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{name} {}` still ran after {LIMIT:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    let _ = std::fs::remove_file(&err_file);
    assert_eq!(status.code(), Some(0), "`{name} {}` exit status; stdout {stdout:?} stderr {stderr:?}", args.join(" "));
    assert!(
        stdout.to_lowercase().contains(&usage_word.to_lowercase()),
        "`{name} {}` printed no usage ({usage_word:?}) on stdout: {stdout:?} (stderr {stderr:?})",
        args.join(" ")
    );
    let left: Vec<_> = std::fs::read_dir(&dir.0).expect("list scratch").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "`{name} {}` created {left:?} in its working directory", args.join(" "));
    stdout
}
