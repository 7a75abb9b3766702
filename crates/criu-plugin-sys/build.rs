//! Generates the raw plugin ABI from CRIU's installed header. No hand-copied header: if the
//! header is missing or too old, the build stops and says how to install the right one.

use std::env;
use std::path::{Path, PathBuf};

const HOWTO: &str = "install CRIU 4.x's plugin header: `apt-get install libcriu-dev` on Debian trixie or newer, \
or run `tests/criu-root.sh prepare` (it debootstraps a trixie root with libcriu-dev) and build with \
CRIU_INCLUDE_DIR=/var/cache/criu-cuda-migrate/trixie/usr/include";

fn candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = env::var("CRIU_INCLUDE_DIR") {
        dirs.push(PathBuf::from(d));
        return dirs;
    }
    dirs.push(PathBuf::from("/usr/include"));
    let root = env::var("CCM_TRIXIE_ROOT").unwrap_or_else(|_| "/var/cache/criu-cuda-migrate/trixie".to_string());
    dirs.push(Path::new(&root).join("usr/include"));
    dirs
}

fn main() {
    println!("cargo:rerun-if-env-changed=CRIU_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=CCM_TRIXIE_ROOT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let wrapper = manifest.join("../../wrapper.h");
    println!("cargo:rerun-if-changed={}", wrapper.display());

    let include = candidates().into_iter().find(|d| d.join("criu/criu-plugin.h").is_file()).unwrap_or_else(|| {
        panic!("criu-plugin-sys: criu/criu-plugin.h not found (looked in {:?}); {HOWTO}", candidates())
    });
    let header = include.join("criu/criu-plugin.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header).expect("read criu-plugin.h");
    if !text.contains("CR_PLUGIN_HOOK__CHECKPOINT_DEVICES") {
        panic!(
            "criu-plugin-sys: {} has no CR_PLUGIN_HOOK__CHECKPOINT_DEVICES: it is older than CRIU 4.0; {HOWTO}",
            header.display()
        );
    }
    println!("cargo:include={}", include.display());

    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("cr_plugin_desc_t")
        .allowlist_type("cr_plugin_stage")
        .allowlist_type("cr_plugin_hook_t")
        .allowlist_var("CRIU_PLUGIN_.*")
        .allowlist_var("CR_PLUGIN_.*")
        .allowlist_function("criu_get_image_dir")
        .rustified_non_exhaustive_enum("cr_plugin_stage")
        .constified_enum_module("cr_plugin_hook_t")
        .layout_tests(true)
        .derive_debug(true)
        .generate()
        .unwrap_or_else(|e| panic!("criu-plugin-sys: bindgen failed on {}: {e}; {HOWTO}", header.display()));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(&out).expect("write bindings");
}
