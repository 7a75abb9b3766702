//! The one way the command writes to its terminal: every `println!` and `eprintln!` of this crate
//! (the macros below shadow the standard ones for every module declared after this one) and every
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

/// `println!` through [`safe`].
macro_rules! println {
    () => { ::std::println!() };
    ($($arg:tt)*) => { ::std::println!("{}", $crate::out::safe(&::std::format!($($arg)*))) };
}

/// `eprintln!` through [`safe`].
macro_rules! eprintln {
    () => { ::std::eprintln!() };
    ($($arg:tt)*) => { ::std::eprintln!("{}", $crate::out::safe(&::std::format!($($arg)*))) };
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
