//! The build's hint when CRIU's plugin header is missing names the root this build looks in: the default trixie
//! root, or the one CCM_TRIXIE_ROOT points at, with the `tests/criu-root.sh prepare` line that makes that one.

include!("../hint.rs");

#[test]
fn the_hint_names_the_default_root_when_ccm_trixie_root_is_unset() {
    let hint = howto(None, None);
    assert!(hint.contains("run `sudo bash tests/criu-root.sh prepare` once"), "{hint}");
    assert!(hint.contains("into /var/cache/criu-cuda-migrate/trixie, where this build looks"), "{hint}");
}

#[test]
fn the_hint_names_the_root_ccm_trixie_root_points_at() {
    let hint = howto(None, Some("/srv/roots/trixie"));
    assert!(
        hint.contains("run `sudo CCM_TRIXIE_ROOT=/srv/roots/trixie bash tests/criu-root.sh prepare` once"),
        "{hint}"
    );
    assert!(hint.contains("into /srv/roots/trixie, where this build looks"), "{hint}");
    assert!(!hint.contains("/var/cache/criu-cuda-migrate"), "the default root is named: {hint}");
}

#[test]
fn the_hint_names_criu_include_dir_when_it_is_set() {
    let hint = howto(Some("/opt/criu/include"), Some("/srv/roots/trixie"));
    assert!(hint.starts_with("CRIU_INCLUDE_DIR=/opt/criu/include is where this build looks"), "{hint}");
    assert!(!hint.contains("criu-root.sh prepare"), "{hint}");
}
