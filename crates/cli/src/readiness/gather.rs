//! The thin I/O layer of `node --check`: reads the node's files relative to a root directory
//! (`/`, or the hidden `--root DIR` of the tests), through `ccm_process::dir::Dir` (no link
//! followed below the root, every read capped), runs the few commands with a deadline and capped
//! output, and asks the driver. What it finds goes into [`Facts`] unjudged.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ccm_driver::cuda::LoadError;
use ccm_driver::nvml::NvmlFailure;
use ccm_process::dir::{Dir, EntryKind, FileError};

use super::eval::{self, CmdFact, Facts, FileFact, Listing, NvmlFacts, ProbeError};

/// Largest configuration file read (CRIU's, containerd's, CRI-O's).
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Largest CDI spec read (nvidia-ctk writes a few tens of KiB for 8 GPUs).
const MAX_CDI_BYTES: u64 = 4 << 20;
/// Most CDI spec files and CRI-O drop-ins read per directory.
const MAX_FILES_PER_DIR: usize = 64;
/// Most output kept of one command.
const MAX_OUTPUT_BYTES: u64 = 64 << 10;
/// How long a command may take (`criu check` takes about a second).
const COMMAND_DEADLINE: Duration = Duration::from_secs(20);
/// How long NVML's init and GPU list, and libcuda's load, may take (an init of 8 GPUs without
/// persistence mode takes seconds; one that never returns is a stuck driver).
const DRIVER_DEADLINE: Duration = Duration::from_secs(30);

/// Where the commands are looked for on the real root besides `$PATH` (sudo's and root's usual
/// directories: iptables-restore lives in /usr/sbin, which a user's PATH may lack).
const SYSTEM_BIN_DIRS: [&str; 6] = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// The node's root: `/`, or a directory standing for it.
pub struct Root {
    dir: Dir,
    path: PathBuf,
    /// Whether it is the real `/` (commands from `$PATH`) or a stand-in (commands from its own bin
    /// directories only).
    real: bool,
    /// How long a command may run.
    deadline: Duration,
}

impl Root {
    pub fn open(path: &Path, deadlines: Deadlines) -> Result<Root, FileError> {
        let real = path == Path::new("/");
        Ok(Root { dir: Dir::open(path)?, path: path.to_path_buf(), real, deadline: deadlines.command })
    }

    /// The directory at `abs` (an absolute path, `/etc/criu`) below the root, each component opened
    /// without following a link. `..` and empty components are refused.
    fn open_dir(&self, abs: &str) -> Result<Dir, FileError> {
        let mut d: Option<Dir> = None;
        for c in abs.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if c == ".." {
                return Err(FileError::BadName { dir: PathBuf::from(abs), name: "..".into() });
            }
            d = Some(d.as_ref().unwrap_or(&self.dir).open_dir(c)?);
        }
        let d = match d {
            Some(d) => d,
            None => Dir::open(&self.path)?,
        };
        Ok(d.named(PathBuf::from(abs)))
    }

    fn read(&self, dir: &str, name: &str, limit: u64) -> FileFact {
        match self.open_dir(dir).and_then(|d| d.read_file(name, limit)) {
            Ok(b) => FileFact::Text(String::from_utf8_lossy(&b).into_owned()),
            Err(FileError::Missing { .. }) => FileFact::Absent,
            Err(e) => FileFact::Unreadable(e.to_string()),
        }
    }

    /// The regular files of `dir` whose names pass `keep`, sorted, at most [`MAX_FILES_PER_DIR`].
    /// A directory that is a link (or under one) is skipped without a word when `quiet_link`.
    fn files(&self, dir: &str, keep: impl Fn(&str) -> bool, limit: u64, quiet_link: bool) -> Vec<(String, FileFact)> {
        let d = match self.open_dir(dir) {
            Ok(d) => d,
            Err(FileError::Missing { .. }) => return Vec::new(),
            Err(FileError::Symlink { .. }) if quiet_link => return Vec::new(),
            Err(e) => return vec![(dir.to_string(), FileFact::Unreadable(e.to_string()))],
        };
        let mut names: Vec<String> = match d.names() {
            Ok(n) => n.into_iter().filter_map(|n| n.into_string().ok()).filter(|n| keep(n)).collect(),
            Err(e) => return vec![(dir.to_string(), FileFact::Unreadable(e.to_string()))],
        };
        names.sort();
        let more = names.len().saturating_sub(MAX_FILES_PER_DIR);
        names.truncate(MAX_FILES_PER_DIR);
        let mut out: Vec<(String, FileFact)> = names
            .into_iter()
            .map(|n| {
                let fact = match d.read_file(&n, limit) {
                    Ok(b) => FileFact::Text(String::from_utf8_lossy(&b).into_owned()),
                    Err(e) => FileFact::Unreadable(e.to_string()),
                };
                (format!("{dir}/{n}"), fact)
            })
            .collect();
        if more > 0 {
            out.push((dir.to_string(), FileFact::Unreadable(format!("{more} more file(s) not read"))));
        }
        out
    }

    fn list(&self, abs: &str) -> Listing {
        if !abs.starts_with('/') {
            return Listing::Unreadable("not an absolute path".into());
        }
        match self.open_dir(abs).and_then(|d| d.names()) {
            Ok(n) => Listing::Names(n.into_iter().filter_map(|n| n.into_string().ok()).collect()),
            Err(FileError::Missing { .. }) => Listing::Missing,
            Err(e) => Listing::Unreadable(e.to_string()),
        }
    }

    /// A command: on the real root from `$PATH` and the system's bin directories; on a stand-in
    /// root from its own bin directories only.
    fn command(&self, name: &str) -> Option<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if self.real {
            dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
            dirs.extend(SYSTEM_BIN_DIRS.iter().map(PathBuf::from));
        } else {
            dirs.extend(SYSTEM_BIN_DIRS.iter().map(|d| self.path.join(d.trim_start_matches('/'))));
        }
        // The check runs what it finds, as root: only a file nobody else can change or swap, found by the walk
        // of ccm_driver::libfile (fd-relative, no link of another user followed). One that others could change is
        // named on stderr and taken as absent, and the search goes on.
        dirs.into_iter().filter(|d| d.is_absolute()).map(|d| d.join(name)).find(|p| {
            use std::os::unix::fs::PermissionsExt;
            let Some(text) = p.to_str() else { return false };
            match ccm_driver::libfile::check_runnable(text) {
                Ok(()) => std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0),
                Err(_) if std::fs::symlink_metadata(p).is_err() => false,
                Err(why) => {
                    eprintln!("warning: {}: not run: {why}", p.display());
                    false
                }
            }
        })
    }

    fn run(&self, name: &str, args: &[&str]) -> CmdFact {
        match self.command(name) {
            None => CmdFact::NotFound,
            Some(p) => run_command(&p, args, self.deadline),
        }
    }
}

/// Runs `prog` with no input and `LC_ALL=C`, keeping at most [`MAX_OUTPUT_BYTES`] of its stdout
/// and of its stderr; killed at the deadline (its status is then `None`).
///
/// It runs in a process group of its own, and the whole group is killed once the command has
/// exited or at the deadline: a command's children (a helper it forked, one that ignores the
/// end of its parent) end with it instead of outliving the check. The group is killed while the
/// command is still unreaped (seen exited through `WNOWAIT`), so its pid, which is the group's id,
/// cannot have been reused by then. A child that made a session or group of its own
/// (`setsid`) has left the group and is beyond this.
pub fn run_command(prog: &Path, args: &[&str], deadline: Duration) -> CmdFact {
    use std::os::unix::process::CommandExt;
    let mut child = match Command::new(prog)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return CmdFact::Failed(format!("{}: {e}", prog.display())),
    };
    // Readers on threads of their own: a child that leaves a grandchild holding its pipes open must
    // not hold the check; the readers are left behind then, the process exits without them.
    let (tx, rx) = mpsc::channel();
    for (i, pipe) in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .enumerate()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let mut p = p.take(MAX_OUTPUT_BYTES);
                let _ = p.read_to_end(&mut buf);
                // Drain the rest unkept, so the child never blocks on a full pipe.
                let _ = std::io::copy(&mut p.into_inner(), &mut std::io::sink());
            }
            let _ = tx.send((i, buf));
        });
    }
    drop(tx);
    let group = rustix::process::Pid::from_child(&child);
    let kill_group = || {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    };
    let start = Instant::now();
    let exited = rustix::process::WaitIdOptions::EXITED
        | rustix::process::WaitIdOptions::NOHANG
        | rustix::process::WaitIdOptions::NOWAIT;
    let (status, timed_out) = loop {
        match rustix::process::waitid(rustix::process::WaitId::Pid(group), exited) {
            Ok(Some(_)) => {
                kill_group();
                break (child.wait().ok().and_then(|s| s.code()), false);
            }
            Ok(None) if start.elapsed() >= deadline => {
                kill_group();
                let _ = child.wait();
                break (None, true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                kill_group();
                let _ = child.wait();
                return CmdFact::Failed(format!("waiting for {}: {e}", prog.display()));
            }
        }
    };
    let mut parts = [Vec::new(), Vec::new()];
    let until = Instant::now() + Duration::from_secs(1);
    for _ in 0..2 {
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok((i, b)) => parts[i] = b,
            Err(_) => break,
        }
    }
    let mut output = String::from_utf8_lossy(&parts[0]).into_owned();
    if !parts[1].is_empty() {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&String::from_utf8_lossy(&parts[1]));
    }
    if timed_out {
        output.push_str(&format!("\n(killed after {} s)", deadline.as_secs()));
    }
    CmdFact::Ran { status, output }
}

fn is_root() -> bool {
    ccm_process::tree::effective_uid() == 0
}

/// The driver as the command-line tool sees it: NVML and libcuda loaded in this process (the
/// libraries `CRIU_CUDA_MIGRATE_LIBNVML` / `_LIBCUDA` name, else the loader's), as `node` does.
type DriverFacts = (Result<NvmlFacts, ProbeError>, Result<String, ProbeError>);

fn nvml_facts() -> Result<NvmlFacts, NvmlFailure> {
    let libs = ccm_engine::Config::driver_libs_in_env();
    let n = ccm_driver::nvml::Nvml::init(libs.libnvml.as_deref())?;
    let gpus = n.gpus()?;
    Ok(NvmlFacts { driver_version: n.driver_version().unwrap_or_default(), gpus })
}

fn checkpoint_api_fact() -> Result<String, LoadError> {
    let libs = ccm_engine::Config::driver_libs_in_env();
    let lib = ccm_driver::Libcuda::load(libs.libcuda.as_deref())?;
    ccm_driver::checkpoint::CheckpointApi::new(&lib)?;
    Ok(lib.path().to_string())
}

/// The driver's answers, asked on threads of their own as soon as the check starts (as `recover`
/// does): an NVML whose init never returns, or a library whose load hangs, cannot hold the check,
/// which takes what came by the deadline and names what did not. A thread still stuck in the
/// driver is left behind; the process's exit ends it.
pub struct DriverProbe {
    nvml: mpsc::Receiver<Result<NvmlFacts, NvmlFailure>>,
    api: mpsc::Receiver<Result<String, LoadError>>,
    until: Instant,
    deadline: Duration,
}

impl DriverProbe {
    pub fn start(deadline: Duration) -> DriverProbe {
        let (nvml_tx, nvml) = mpsc::channel();
        let (api_tx, api) = mpsc::channel();
        // A thread that cannot start drops its sender: its answer reads as none.
        let _ = std::thread::Builder::new().name("nvml".into()).spawn(move || {
            let _ = nvml_tx.send(nvml_facts());
        });
        let _ = std::thread::Builder::new().name("libcuda".into()).spawn(move || {
            let _ = api_tx.send(checkpoint_api_fact());
        });
        DriverProbe { nvml, api, until: Instant::now() + deadline, deadline }
    }

    fn wait<T, E>(
        &self,
        rx: &mpsc::Receiver<Result<T, E>>,
        what: &'static str,
        failed: impl FnOnce(E) -> ProbeError,
    ) -> Result<T, ProbeError> {
        match rx.recv_timeout(self.until.saturating_duration_since(Instant::now())) {
            Ok(r) => r.map_err(failed),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ProbeError::Stuck { what, deadline: self.deadline }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(ProbeError::NoAnswer { what }),
        }
    }

    /// What the driver answered by the deadline.
    pub fn facts(&self) -> DriverFacts {
        (
            self.wait(&self.nvml, "nvmlInit and the GPU list", ProbeError::Nvml),
            self.wait(&self.api, "loading libcuda", ProbeError::Libcuda),
        )
    }
}

/// How long the check waits for each command and for the driver.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    pub command: Duration,
    pub driver: Duration,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines { command: COMMAND_DEADLINE, driver: DRIVER_DEADLINE }
    }
}

/// Everything `node --check` looks at on the node under `root`.
pub fn gather(root: &Root, deadlines: Deadlines) -> Facts {
    // The driver first, on its own threads, so its time runs beside the commands'.
    let driver = DriverProbe::start(deadlines.driver);
    let mut criu_conf = BTreeMap::new();
    for name in eval::CRIU_CONF_FILES {
        criu_conf.insert(name.to_string(), root.read("/etc/criu", name, MAX_CONFIG_BYTES));
    }
    let runc = root.command("runc").is_some();
    let crun = root.command("crun").is_some();
    let package_plugin = match root.open_dir(eval::PACKAGE_LIBDIR).and_then(|d| d.kind_of(eval::PACKAGE_PLUGIN)) {
        Ok(k) => Ok(k == Some(EntryKind::Regular)),
        Err(FileError::Missing { .. }) => Ok(false),
        Err(e) => Err(e),
    };
    let libdirs =
        eval::libdirs_to_list(&criu_conf, runc, crun).into_iter().map(|d| (d.clone(), root.list(&d))).collect();
    let criu_version = root.run("criu", &["--version"]);
    let criu_check = match criu_version {
        CmdFact::NotFound => CmdFact::NotFound,
        _ => root.run("criu", &["check"]),
    };
    let persistence = root.run("nvidia-smi", &["--query-gpu=uuid,persistence_mode", "--format=csv,noheader"]);
    let containerd = root.command("containerd").map(|p| {
        (
            run_command(&p, &["--version"], deadlines.command),
            root.read("/etc/containerd", "config.toml", MAX_CONFIG_BYTES),
        )
    });
    let crio = root.command("crio").map(|p| {
        let mut files =
            vec![("/etc/crio/crio.conf".to_string(), root.read("/etc/crio", "crio.conf", MAX_CONFIG_BYTES))];
        files.extend(root.files("/etc/crio/crio.conf.d", |n| n.ends_with(".conf"), MAX_CONFIG_BYTES, false));
        (run_command(&p, &["--version"], deadlines.command), files)
    });
    let mut cdi = Vec::new();
    let spec = |n: &str| n.ends_with(".yaml") || n.ends_with(".yml") || n.ends_with(".json");
    // /var/run is a link to /run on current systems: both names are tried, a link refused quietly.
    for dir in ["/etc/cdi", "/run/cdi", "/var/run/cdi"] {
        cdi.extend(root.files(dir, spec, MAX_CDI_BYTES, dir == "/var/run/cdi"));
    }
    let (nvml, checkpoint_api) = driver.facts();
    Facts {
        is_root: is_root(),
        criu_conf,
        runc,
        crun,
        package_plugin,
        libdirs,
        criu_version,
        criu_check,
        nvml,
        checkpoint_api,
        persistence,
        containerd,
        crio,
        iptables_restore: root.command("iptables-restore").is_some(),
        ip6tables_restore: root.command("ip6tables-restore").is_some(),
        nft: root.command("nft").is_some(),
        cdi,
    }
}
