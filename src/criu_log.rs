//! A `log` backend that writes into CRIU's own log through `print_on_level`.
//!
//! CRIU exports `print_on_level` (it is linked with `-rdynamic`); we resolve it with `dlsym` at
//! run time and never link against CRIU. One call per message, always through `"%s"` so a `%`
//! in a message cannot be read as a format directive, and always ending in a newline. Nothing
//! goes to stderr: runc hands the container's stdio to `criu swrk`.

use std::ffi::{c_char, c_uint, CString};
use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The prefix of every line the plugin logs.
pub const PREFIX: &str = "criu-cuda-migrate: ";

type PrintOnLevel = unsafe extern "C" fn(c_uint, *const c_char, ...);

// CRIU's levels (criu/include/log.h): LOG_MSG=0 goes to stdout, so it is never used here.
const CRIU_LOG_ERROR: c_uint = 1;
const CRIU_LOG_WARN: c_uint = 2;
const CRIU_LOG_INFO: c_uint = 3;
const CRIU_LOG_DEBUG: c_uint = 4;

struct CriuLogger {
    print: Option<PrintOnLevel>,
}

static LOGGER: OnceLock<CriuLogger> = OnceLock::new();

fn resolve_print_on_level() -> Option<PrintOnLevel> {
    // SAFETY: CRIU declares `void print_on_level(unsigned int loglevel, const char *format, ...)`,
    // which is exactly `PrintOnLevel`.
    unsafe { crate::host::criu_function::<PrintOnLevel>(c"print_on_level") }
}

/// Installs the logger once; later calls are no-ops. Returns whether CRIU's log was found.
pub fn install() -> bool {
    let logger = LOGGER.get_or_init(|| CriuLogger { print: resolve_print_on_level() });
    // Ignore "already set": a host that embeds several Rust libraries may have set one.
    let _ = log::set_logger(logger);
    log::set_max_level(LevelFilter::Debug);
    logger.print.is_some()
}

fn criu_level(level: Level) -> c_uint {
    match level {
        Level::Error => CRIU_LOG_ERROR,
        Level::Warn => CRIU_LOG_WARN,
        Level::Info => CRIU_LOG_INFO,
        Level::Debug | Level::Trace => CRIU_LOG_DEBUG,
    }
}

/// One CRIU log line per message line: CRIU prefixes each call with a timestamp, so a
/// multi-line message (a table) is split and every line carries the plugin's prefix. Error lines
/// also carry `Error: `, the word CRIU's own error lines start with, so `grep Error restore.log`
/// finds ours too (CRIU ignores RESUME_DEVICES_LATE failures and still exits 0).
///
/// Every other control character (CR, ESC, BEL, C1) and every Unicode format character (a bidi
/// override, a zero-width space, U+2028) is escaped here, whatever the message: a value from a
/// spec, an image or a process that a message forgot to escape still cannot forge a line of the
/// log or redraw a terminal that shows it.
fn format_lines(msg: &str, level: Level) -> Vec<CString> {
    let marker = if level == Level::Error { "Error: " } else { "" };
    msg.lines()
        .map(|l| {
            let l = ccm_identity::text::escaped(l);
            let mut s = String::with_capacity(PREFIX.len() + marker.len() + l.len() + 1);
            s.push_str(PREFIX);
            s.push_str(marker);
            s.push_str(&l);
            s.push('\n');
            // NUL is a control character: escaped above, so the line is a valid C string.
            CString::new(s).unwrap_or_default()
        })
        .collect()
}

impl Log for CriuLogger {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        self.print.is_some()
    }

    fn log(&self, record: &Record<'_>) {
        let Some(print) = self.print else { return };
        let msg = record.args().to_string();
        // CRIU formats every message in one static buffer: two of our threads (the parallel
        // checkpoint, restore and rollback workers log) must never be inside print_on_level at
        // once. CRIU's own thread does not log while ours run: it is waiting in our hook.
        static PRINTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = PRINTING.lock().unwrap_or_else(|p| p.into_inner());
        for line in format_lines(&msg, record.level()) {
            // SAFETY: `print` is CRIU's print_on_level; "%s" consumes exactly one C string,
            // which `line` keeps alive for the duration of the call.
            unsafe { print(criu_level(record.level()), c"%s".as_ptr(), line.as_ptr()) };
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prefixed_and_terminated() {
        let l = format_lines("a\nb 100%", Level::Info);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].to_str().unwrap(), "criu-cuda-migrate: a\n");
        assert_eq!(l[1].to_str().unwrap(), "criu-cuda-migrate: b 100%\n");
        assert_eq!(format_lines("nul\0x", Level::Warn)[0].to_str().unwrap(), "criu-cuda-migrate: nul\\0x\n");
        assert_eq!(format_lines("bad", Level::Error)[0].to_str().unwrap(), "criu-cuda-migrate: Error: bad\n");
    }

    #[test]
    fn control_and_bidi_characters_never_reach_the_log_raw() {
        // A value that tries to draw "restore passed" over the error line in a terminal, and one
        // that reverses the rest of its line.
        let msg = "pid 7: NVIDIA_VISIBLE_DEVICES=x\r\u{1b}[2K\u{1b}[1Arestore passed\u{7}\u{9b}2J is no GPU\n\
                   spec says \u{202e}dessap\u{2066}\u{200b}\u{2028}\u{feff}";
        let lines = format_lines(msg, Level::Error);
        assert_eq!(lines.len(), 2);
        for l in &lines {
            let t = l.to_str().unwrap();
            let body = t.strip_suffix('\n').unwrap();
            assert!(!ccm_identity::text::has_unsafe(body), "{t:?}");
            assert!(body.starts_with("criu-cuda-migrate: Error: "), "{t:?}");
        }
        assert_eq!(
            lines[0].to_str().unwrap(),
            "criu-cuda-migrate: Error: pid 7: NVIDIA_VISIBLE_DEVICES=x\\r\\u{1b}[2K\\u{1b}[1Arestore passed\\u{7}\\u{9b}2J \
             is no GPU\n"
        );
        assert!(lines[1].to_str().unwrap().contains("\\u{202e}dessap\\u{2066}\\u{200b}\\u{2028}\\u{feff}"));
    }
}
