//! `ccm-bench`: the measuring side of criu-cuda-migrate's benchmark (`bench/run-gpu.sh` drives it
//! on the GPU machine; `docs/BENCHMARKS.md` describes the method).
//!
//! - `floor --pid P[,P2...]`: the driver floor, a minimal controller in one process: `cuInit`,
//!   then lock, checkpoint, restore, unlock of every pid, each call timed.
//! - `per-action --pid P[,P2...]`: the per-action tool path of CRIU's own CUDA plugin, one fresh
//!   process (`ccm-bench action ...`: start, `cuInit`, one call) per action.
//! - `action A --pid P`: one such child.
//!
//! Every command prints one JSON object on stdout and exits non-zero with the reason on stderr.
//! `CRIU_CUDA_MIGRATE_LIBCUDA` names another libcuda (the test double) as for the plugin.

#![forbid(unsafe_code)]

mod error;
mod floor;
mod holdings;
mod per_action;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::error::BenchError;
use crate::per_action::Action;

#[derive(Debug, Parser)]
#[command(name = "ccm-bench", version, about = "Times the CUDA checkpoint API: driver floor and per-action tool path")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Driver floor: one cuInit, then lock, checkpoint, restore, unlock of every pid (checkpoint
    /// and restore of several pids in parallel threads, like the plugin), each call timed.
    Floor {
        /// Pids of RUNNING CUDA processes, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        pid: Vec<i32>,
        /// Full sequences to run (the process is RUNNING again after each).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
        /// cuCheckpointProcessLock's timeout.
        #[arg(long, default_value_t = 10_000)]
        lock_timeout_ms: u32,
    },
    /// The per-action tool path: a fresh `ccm-bench action` process (start + cuInit + one call) for
    /// every call CRIU's CUDA plugin makes, pid after pid.
    PerAction {
        #[arg(long, value_delimiter = ',', required = true)]
        pid: Vec<i32>,
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
        #[arg(long, default_value_t = 10_000)]
        lock_timeout_ms: u32,
    },
    /// The kernel driver's resource manager asked about `pid` several times on ONE client: every GPU's device
    /// and subdevice objects made and freed each time (issue 41 part 1: a multi-GPU node's handles, on any
    /// machine). Prints every answer.
    RmRepeat {
        #[arg(long, value_delimiter = ',', required = true)]
        pid: Vec<u32>,
        #[arg(long, default_value_t = 2)]
        rounds: usize,
    },
    /// What a forked worker's record costs at dump (issue 40): `pid`'s maps read, then its NVIDIA nodes found the
    /// product's way (`ccm_process::claims::holdings`: one `stat` per mapped file) and, side by side, the earlier
    /// way (one `stat` per file mapping), `rounds` times each, alternating. Prints every round's times.
    Holdings {
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// One action in this fresh process (what `per-action` starts).
    Action {
        #[arg(value_enum)]
        action: Action,
        #[arg(long)]
        pid: i32,
        #[arg(long, default_value_t = 10_000)]
        lock_timeout_ms: u32,
    },
}

fn print_json<T: Serialize>(v: &T) -> Result<(), BenchError> {
    println!("{}", serde_json::to_string(v)?);
    Ok(())
}

fn run(cli: Cli) -> Result<(), BenchError> {
    match cli.command {
        Cmd::Floor { pid, repeats, lock_timeout_ms } => {
            let c = floor::Controller::start(lock_timeout_ms)?;
            print_json(&c.run(&pid, repeats)?)
        }
        Cmd::PerAction { pid, repeats, lock_timeout_ms } => {
            print_json(&per_action::run(&pid, repeats, lock_timeout_ms)?)
        }
        Cmd::RmRepeat { pid, rounds } => {
            print_json(&ccm_driver::rm::video_memory_repeated(&pid, rounds).map_err(|e| BenchError::Rm(e.to_string()))?)
        }
        Cmd::Holdings { pid, rounds } => print_json(&holdings::run(pid, rounds)?),
        Cmd::Action { action, pid, lock_timeout_ms } => {
            print_json(&per_action::run_action(action, pid, lock_timeout_ms)?)
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccm-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
