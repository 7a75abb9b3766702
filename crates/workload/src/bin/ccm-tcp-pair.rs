//! `ccm-tcp-pair OUT`: one process holding an established TCP connection with itself on
//! 127.0.0.1, for the tests of `--tcp-established` restores (tests/container/podman-tcp-flow.sh).
//! Every 100 ms it sends the next number on one end, reads it on the other, and writes
//! `TCP <number>` to OUT (a fresh file renamed into place). A restore that brought the connection
//! back keeps the numbers going; any socket error ends it with status 1 and the error. A test tool,
//! never packaged.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: ccm-tcp-pair OUT\n\nHolds an established TCP connection with itself on 127.0.0.1 and writes `TCP <n>` to OUT\nevery 100 ms, until a socket error or a signal ends it (a test tool).";

fn main() -> ExitCode {
    let arg = std::env::args_os().nth(1);
    if matches!(arg.as_deref().and_then(|a| a.to_str()), Some("--help" | "-h")) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    // An option is no file name: `ccm-tcp-pair --verbose` must not write a file of that name.
    let Some(out) = arg.filter(|a| !a.to_string_lossy().starts_with('-')).map(std::path::PathBuf::from) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match run(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccm-tcp-pair: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(out: &std::path::Path) -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    let mut server = BufReader::new(server);
    let tmp = out.with_extension("tmp");
    let mut line = String::new();
    for n in 1u64.. {
        writeln!(client, "{n}")?;
        line.clear();
        if server.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("the connection was closed"));
        }
        std::fs::write(&tmp, format!("TCP {}\n", line.trim()))?;
        std::fs::rename(&tmp, out)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
