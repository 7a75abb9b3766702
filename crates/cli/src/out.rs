//! The one way the command writes to its terminal: every `println!`, `print!` and `eprintln!` of this
//! crate (the macros below shadow the standard ones for every module declared after this one) and every
//! log line go through [`safe`], so a value from a checkpoint, an archive, a bundle's spec or a
//! process that a message forgot to escape still cannot move a terminal's cursor, forge a line
//! (`\r`, ESC, BEL, C1) or reverse one (U+202E and the other format characters).
//!
//! Line feeds stay (tables and reports are several lines). Under `--json` the escapes are JSON's
//! own (`\u202e`): serde writes no raw control character, and a format character can only be
//! inside a string there, so the document stays valid and decodes to the original value.

use std::sync::atomic::{AtomicBool, Ordering};

use ccm_identity::text;

static JSON: AtomicBool = AtomicBool::new(false);

/// Whether the output is JSON (`--json`): decides the form of the escapes.
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// `s` as it may be printed: see the module's text.
pub fn safe(s: &str) -> String {
    if JSON.load(Ordering::Relaxed) {
        json_safe(s)
    } else {
        text::escaped_lines(s)
    }
}

fn json_safe(s: &str) -> String {
    if !s.contains(|c: char| c != '\n' && text::needs_escape(c)) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c != '\n' && text::needs_escape(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Log lines (`RUST_LOG`) through the same escaping.
pub fn init_logger() {
    use std::io::Write;
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|buf, record| {
            writeln!(buf, "[{} {}] {}", record.level(), record.target(), safe(&record.args().to_string()))
        })
        .init();
}

/// The exit status of a command whose standard output was closed under it (`inspect ... | head`): what a shell
/// reports for tar, cat or grep there, which die of SIGPIPE (128 + 13).
pub const CLOSED_STDOUT_STATUS: i32 = 141;

/// Writes `s` (through [`safe`]) to standard output. A reader that went away (`| head`) ends the command at once,
/// quietly, with [`CLOSED_STDOUT_STATUS`], as the tools that die of SIGPIPE end (Rust ignores SIGPIPE, so the
/// write fails with EPIPE, and `std::println!` would panic); any other write error is said on stderr (exit 2).
pub fn print(s: &str, newline: bool) {
    use std::io::Write;
    let text = safe(s);
    let mut out = std::io::stdout().lock();
    let written = if newline { writeln!(out, "{text}") } else { write!(out, "{text}").and_then(|()| out.flush()) };
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(CLOSED_STDOUT_STATUS);
        }
        let _ = writeln!(std::io::stderr(), "criu-cuda-migrate: cannot write to standard output: {e}");
        std::process::exit(2);
    }
}

/// Writes `s` (through [`safe`]) to standard error, if it can: a closed stderr loses the message, it does not
/// end the command.
pub fn eprint(s: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{}", safe(s));
}

/// `println!` through [`safe`] and [`print`].
macro_rules! println {
    () => { $crate::out::print("", true) };
    ($($arg:tt)*) => { $crate::out::print(&::std::format!($($arg)*), true) };
}

/// `print!` through [`safe`] and [`print`].
macro_rules! print {
    ($($arg:tt)*) => { $crate::out::print(&::std::format!($($arg)*), false) };
}

/// `eprintln!` through [`safe`] and [`eprint`].
macro_rules! eprintln {
    () => { $crate::out::eprint("") };
    ($($arg:tt)*) => { $crate::out::eprint(&::std::format!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_forms() {
        let forged = "a\r\u{1b}[1Apreflight passed\u{7}\n\u{202e}x\u{e0041}";
        assert_eq!(text::escaped_lines(forged), "a\\r\\u{1b}[1Apreflight passed\\u{7}\n\\u{202e}x\\u{e0041}");
        let doc = serde_json::json!({"error": forged}).to_string();
        let safe_doc = json_safe(&doc);
        assert!(!text::has_unsafe(&safe_doc), "{safe_doc}");
        let back: serde_json::Value = serde_json::from_str(&safe_doc).expect("still JSON");
        assert_eq!(back["error"], forged);
    }
}
