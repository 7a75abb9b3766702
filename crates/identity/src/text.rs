//! Strings from files the plugin does not control (images, specs, another process's maps), as
//! they may be printed: a control character in them could forge a line of CRIU's log or move a
//! terminal's cursor, and a Unicode format character (a bidi override such as U+202E, a
//! zero-width space, the line separator U+2028) could make a line read as something else; so
//! none is ever printed raw. A value echoed in a message is also shortened ([`shown`]): a
//! megabyte on one line hides the message around it.

/// Whether `s` holds a control character (C0, DEL or C1).
pub fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Whether `c` must not reach a terminal or a log raw: a control character (C0, DEL, C1), a
/// Unicode format character (general category Cf: bidi embeddings, overrides and isolates,
/// zero-width characters, the byte order mark, tags) or a line or paragraph separator (U+2028,
/// U+2029), which some viewers break lines at.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c as u32,
            0x00AD
                | 0x0600..=0x0605
                | 0x061C
                | 0x06DD
                | 0x070F
                | 0x0890..=0x0891
                | 0x08E2
                | 0x180E
                | 0x200B..=0x200F
                | 0x2028..=0x202E
                | 0x2060..=0x2064
                | 0x2066..=0x206F
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0x110BD
                | 0x110CD
                | 0x13430..=0x1343F
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0001
                | 0xE0020..=0xE007F
        )
}

/// Whether `s` holds any character [`needs_escape`] names.
pub fn has_unsafe(s: &str) -> bool {
    s.chars().any(needs_escape)
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\0' => out.push_str("\\0"),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// `s` with every character [`needs_escape`] names written as an escape (`\n`, `\u{1b}`,
/// `\u{202e}`); everything else, non-ASCII letters included, as it is.
pub fn escaped(s: &str) -> String {
    if !has_unsafe(s) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out
}

/// As [`escaped`], but line feeds stay line breaks: for output made of several lines (a table, a
/// report), where each line is then safe on its own.
pub fn escaped_lines(s: &str) -> String {
    if !s.contains(|c: char| c != '\n' && needs_escape(c)) {
        return s.to_string();
    }
    s.split('\n').map(escaped).collect::<Vec<_>>().join("\n")
}

/// The most characters of a foreign value a message echoes: enough for any real device list or
/// path, short enough that the message around it stays readable.
pub const MAX_SHOWN_CHARS: usize = 200;

/// A foreign value as a message echoes it: [`escaped`], and cut after [`MAX_SHOWN_CHARS`]
/// characters with `…` and the whole value's length in bytes.
pub fn shown(s: &str) -> String {
    if s.chars().count() <= MAX_SHOWN_CHARS {
        return escaped(s);
    }
    let head: String = s.chars().take(MAX_SHOWN_CHARS).collect();
    format!("{}… ({} bytes in all)", escaped(&head), s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        assert_eq!(escaped("node-1 ü"), "node-1 ü");
        assert_eq!(escaped("a\nb\rc\u{1b}[2J\u{7f}\u{85}"), "a\\nb\\rc\\u{1b}[2J\\u{7f}\\u{85}");
        assert!(has_control("x\ty") && !has_control("x y"));
    }

    #[test]
    fn bidi_and_format_characters_are_escaped() {
        // A right-to-left override makes "passed" of "dessap"; a zero-width space and a line
        // separator hide in a value; a tag character is invisible.
        assert_eq!(escaped("a\u{202e}dessap"), "a\\u{202e}dessap");
        assert_eq!(escaped("GPU-\u{200b}0,\u{2028}x\u{feff}"), "GPU-\\u{200b}0,\\u{2028}x\\u{feff}");
        assert_eq!(escaped("\u{2066}\u{e0041}"), "\\u{2066}\\u{e0041}");
        assert!(has_unsafe("\u{200f}") && !has_control("\u{200f}"));
        // Letters of any script are not format characters.
        assert_eq!(escaped("ägypten-ノード-عقدة"), "ägypten-ノード-عقدة");
    }

    #[test]
    fn escaped_lines_keeps_line_feeds_only() {
        assert_eq!(escaped_lines("a\nb\r\u{1b}[1A\n"), "a\nb\\r\\u{1b}[1A\n");
        assert_eq!(escaped_lines("plain\ntable\n"), "plain\ntable\n");
    }

    #[test]
    fn long_values_are_shortened_with_their_length() {
        let long = "0,".repeat(1 << 19);
        let s = shown(&long);
        assert!(s.chars().count() < MAX_SHOWN_CHARS + 40, "{}", s.len());
        assert!(s.ends_with(&format!("… ({} bytes in all)", long.len())), "{s}");
        assert_eq!(shown("GPU-1"), "GPU-1");
        assert_eq!(shown("\u{1b}"), "\\u{1b}");
    }
}
