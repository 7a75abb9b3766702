//! `ccm-sample-workload`: a CUDA process that holds known data on chosen GPUs and reports its
//! own device identity when asked, for criu-cuda-migrate's demo and GPU tests.
//!
//! Protocol in `--dir D` (every file opened and closed at once; the process holds no fd into
//! D, so CRIU can dump it at any time between rounds):
//! - `D/ready` (its pid) once the data is on the devices;
//! - for round k = 1..=R: waits for `D/go<k>`, writes `D/report<k>.json`, then `D/done<k>`;
//! - exits after round R.
//!
//! `--report-now` prints one report on stdout and exits (a quick identity check).

// The app-side calls into libcuda (`app`) and the closing of inherited descriptors (`fds`) are FFI;
// nothing else here may use `unsafe`.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod app;
#[allow(unsafe_code)]
mod fds;
mod files;
#[allow(unsafe_code)]
mod forked;
mod pattern;
mod props;
mod report;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::app::{AppError, CudaApp};
use clap::Parser;

use crate::report::Held;

#[derive(Debug, Parser)]
#[command(
    name = "ccm-sample-workload",
    version,
    about = "Sample CUDA workload: holds a known pattern on GPUs and reports its device identity"
)]
struct Args {
    /// Control directory for ready / go<k> / report<k>.json / done<k> (required unless --report-now).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// MiB of device memory to allocate and fill on each listed ordinal (0: none).
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// CUDA ordinals (of this process's view) that hold data, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    devices: Vec<u32>,
    /// Number of go/report rounds before exiting.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Print one report as JSON on stdout and exit.
    #[arg(long)]
    report_now: bool,
    /// Keep a cudaDeviceProp copy per device, as the CUDA runtime and frameworks do, plus a decoy
    /// the plugin must not touch; reports say what they hold.
    #[arg(long)]
    device_props: bool,
    /// Fork a child after cuInit (a DataLoader worker's shape): it inherits this process's descriptors,
    /// makes no CUDA call, waits for `D/child-exit` and exits with 7; reports give its exit code.
    #[arg(long)]
    forked_child: bool,
    /// Device nodes the forked child opens and keeps (comma-separated paths).
    #[arg(long, value_delimiter = ',', requires = "forked_child")]
    child_open: Vec<PathBuf>,
    /// A device node the forked child maps, shared and read-only: PATH:BYTES.
    #[arg(long, requires = "forked_child")]
    child_map: Option<String>,
    /// How many such children (a rank's DataLoader workers): each holds the same; the reports give the first's exit
    /// code, and every one must exit 7.
    #[arg(long, default_value_t = 1, requires = "forked_child")]
    forked_children: u32,
    /// A device node this process maps, shared and read-only: PATH:BYTES (the test doubles' stand-in of
    /// `/dev/nvidia-uvm` for managed memory, which the plugin refuses before the lock).
    #[arg(long)]
    map: Option<String>,
}

#[derive(Debug, thiserror::Error)]
enum WorkloadError {
    #[error(transparent)]
    Cuda(#[from] AppError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--dir is required unless --report-now is given")]
    NoDir,
    #[error("--devices lists ordinal {0} twice; list each ordinal once")]
    DuplicateOrdinal(u32),
    #[error("--mib {0} is too large for this host's address space; use a smaller size")]
    TooLarge(usize),
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
    #[error("--child-map {0}: write PATH:BYTES")]
    ChildMap(String),
    #[error("--map {0}: write PATH:BYTES")]
    Map(String),
}

/// `PATH:BYTES`.
fn path_bytes(m: &str) -> Option<(PathBuf, usize)> {
    let (path, bytes) = m.rsplit_once(':')?;
    Some((PathBuf::from(path), bytes.parse().ok()?))
}

fn main() -> ExitCode {
    crate::fds::close_inherited_fds();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccm-sample-workload: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Progress lines go to stderr, so stdout carries only `--report-now`'s JSON.
fn say(msg: std::fmt::Arguments<'_>) {
    let mut out = std::io::stderr().lock();
    // A closed stderr must not kill the workload; the files in --dir are the real protocol.
    let _ = writeln!(out, "ccm-sample-workload[{}]: {msg}", std::process::id());
    let _ = out.flush();
}

fn run(args: &Args) -> Result<(), WorkloadError> {
    for (i, o) in args.devices.iter().enumerate() {
        if args.devices[..i].contains(o) {
            return Err(WorkloadError::DuplicateOrdinal(*o));
        }
    }
    let bytes = args.mib.checked_mul(1 << 20).ok_or(WorkloadError::TooLarge(args.mib))?;
    let app = CudaApp::load_and_init()?;
    let held = if bytes == 0 { Vec::new() } else { allocate_and_fill(&app, &args.devices, bytes)? };
    let props = if args.device_props { Some(props::PropCache::fill(&app)?) } else { None };

    if args.report_now {
        let mut report = report::build(&app, &held, 0);
        report.device_props = props.as_ref().map(|p| p.report(&app));
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let dir = args.dir.as_deref().ok_or(WorkloadError::NoDir)?;
    let io = |what, path: PathBuf| move |source| WorkloadError::Io { what, path, source };
    let pid = std::process::id();
    if let Some(m) = &args.map {
        let (path, bytes) = path_bytes(m).ok_or_else(|| WorkloadError::Map(m.clone()))?;
        forked::map_node(&path, bytes).map_err(io("cannot map", path.clone()))?;
    }
    let mut extra_children: Vec<u32> = Vec::new();
    let child = if args.forked_child {
        let map = match &args.child_map {
            None => None,
            Some(m) => Some(path_bytes(m).ok_or_else(|| WorkloadError::ChildMap(m.clone()))?),
        };
        let holds = forked::ChildHolds { open: args.child_open.clone(), map };
        let mut children = Vec::new();
        for _ in 0..args.forked_children.max(1) {
            let _ = std::fs::remove_file(dir.join("forked"));
            let child = forked::fork_child(dir, &holds).map_err(io("cannot fork a child in", dir.to_path_buf()))?;
            files::wait_for(dir, "forked");
            children.push(child);
        }
        say(format_args!("forked {} child(ren) {children:?} (no CUDA call in them)", children.len()));
        // The first child's pid stays in D/forked (what the tests read); the others are reaped with it.
        files::write_atomic(dir, "forked", format!("{}\n", children[0]).as_bytes())
            .map_err(io("cannot write", dir.join("forked")))?;
        extra_children = children.split_off(1);
        Some(children[0])
    } else {
        None
    };
    files::write_atomic(dir, "ready", format!("{pid}\n").as_bytes()).map_err(io("cannot write", dir.join("ready")))?;
    say(format_args!("ready: {} MiB on ordinals {:?}", args.mib, args.devices));

    for round in 1..=args.rounds {
        files::wait_for(dir, &format!("go{round}"));
        let mut report = report::build(&app, &held, round);
        report.device_props = props.as_ref().map(|p| p.report(&app));
        if let Some(c) = child {
            // Told to exit: give it the moment it takes to see the file.
            let told = dir.join("child-exit").exists();
            let mut status = forked::child_status(c, false);
            for _ in 0..100 {
                if status.is_some() || !told {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                status = forked::child_status(c, false);
            }
            // The other children: every one must have exited 7 too once told (else the first's code says which).
            if status == Some(forked::CHILD_EXIT_CODE) {
                for &e in &extra_children {
                    let mut st = forked::child_status(e, false);
                    for _ in 0..100 {
                        if st.is_some() {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        st = forked::child_status(e, false);
                    }
                    if st != Some(forked::CHILD_EXIT_CODE) {
                        status = Some(st.unwrap_or(-1));
                        break;
                    }
                }
            }
            report.forked_child = Some(report::ForkedChild { pid: c, exit_code: status });
        }
        say(format_args!(
            "round {round}: all_agree={} all_consistent={} all_data_ok={} all_ctx_ok={} ({:.3} s)",
            report.all_agree, report.all_consistent, report.all_data_ok, report.all_ctx_ok, report.check_seconds
        ));
        let name = format!("report{round}.json");
        let json = serde_json::to_vec_pretty(&report)?;
        files::write_atomic(dir, &name, &json).map_err(io("cannot write", dir.join(&name)))?;
        let name = format!("done{round}");
        files::write_atomic(dir, &name, b"").map_err(io("cannot write", dir.join(&name)))?;
    }
    say(format_args!("finished {} rounds", args.rounds));
    Ok(())
}

/// Allocates `bytes` on each ordinal's primary context and writes the ordinal's pattern.
fn allocate_and_fill(app: &CudaApp, ordinals: &[u32], bytes: usize) -> Result<Vec<Held>, WorkloadError> {
    let mut held = Vec::with_capacity(ordinals.len());
    for &ordinal in ordinals {
        let started = Instant::now();
        let dev = app.device(ordinal)?;
        let ctx = app.primary_context(dev)?;
        let buffer = app.alloc(ctx, bytes)?;
        buffer.fill_u32(0, bytes / 4, pattern::fill_word(ordinal))?;
        let mut block = 0;
        while block * pattern::BLOCK_BYTES < bytes {
            let at = block * pattern::BLOCK_BYTES;
            let stamp = pattern::stamp_bytes(ordinal, block);
            let len = stamp.len().min(bytes - at);
            buffer.write(at, &stamp[..len])?;
            block += 1;
        }
        app.synchronize()?;
        say(format_args!("ordinal {ordinal}: {bytes} bytes filled in {:.3} s", started.elapsed().as_secs_f64()));
        held.push(Held { ordinal, buffer });
    }
    Ok(held)
}
