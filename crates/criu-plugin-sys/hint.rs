// The fix the build names when it finds no usable CRIU plugin header. Included by build.rs and by
// tests/build_hint.rs, so the text the build prints is the text the test reads.

/// Where the build looks for the Debian trixie root when CCM_TRIXIE_ROOT is not set (tests/criu-root.sh's default).
const DEFAULT_TRIXIE_ROOT: &str = "/var/cache/criu-cuda-migrate/trixie";

/// The trixie root the build looks in: CCM_TRIXIE_ROOT, else the default.
fn trixie_root(ccm_trixie_root: Option<&str>) -> &str {
    ccm_trixie_root.unwrap_or(DEFAULT_TRIXIE_ROOT)
}

/// What to do, for the directories the build looked in: it names the root this build reads (a CCM_TRIXIE_ROOT
/// elsewhere is the one `tests/criu-root.sh prepare` must make), or the CRIU_INCLUDE_DIR it was told to use.
fn howto(criu_include_dir: Option<&str>, ccm_trixie_root: Option<&str>) -> String {
    if let Some(dir) = criu_include_dir {
        return format!(
            "CRIU_INCLUDE_DIR={dir} is where this build looks, and only there: point it at a directory holding \
             criu/criu-plugin.h (CRIU 4.x's, as libcriu-dev installs it), or unset it to use the Debian trixie root"
        );
    }
    let root = trixie_root(ccm_trixie_root);
    let prepare = match ccm_trixie_root {
        Some(r) => format!("sudo CCM_TRIXIE_ROOT={r} bash tests/criu-root.sh prepare"),
        None => "sudo bash tests/criu-root.sh prepare".to_string(),
    };
    format!(
        "run `{prepare}` once (it debootstraps a Debian trixie root with libcriu-dev into {root}, where this build \
         looks), or install CRIU 4.x's header (`apt-get install libcriu-dev` on Debian trixie or newer), or point \
         CRIU_INCLUDE_DIR at a directory holding criu/criu-plugin.h"
    )
}
