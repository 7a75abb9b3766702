//! Strings from files the plugin does not control (images, specs, another process's maps), as
//! they may be printed: a control character in them could forge a line of CRIU's log or move a
//! terminal's cursor, so none is ever printed raw.

/// Whether `s` holds a control character (C0, DEL or C1).
pub fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// `s` with every control character written as an escape (`\n`, `\u{1b}`); everything else,
/// non-ASCII letters included, as it is.
pub fn escaped(s: &str) -> String {
    if !has_control(s) {
        return s.to_string();
    }
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
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
}
