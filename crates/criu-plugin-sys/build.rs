//! Generates the raw plugin ABI from CRIU's installed header. No hand-copied header: if the
//! header is missing or too old, the build stops and says how to install the right one.

// A build script: cargo always sets CARGO_MANIFEST_DIR and OUT_DIR, and a bindings file that cannot
// be written is the build's own failure, with the panic's message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::env;
use std::path::{Path, PathBuf};

// howto(), trixie_root(): the fix the build names, shared with tests/build_hint.rs.
include!("hint.rs");

/// Ends the build with one line that names the fix: a missing header is the newcomer's first build,
/// not a bug, so no panic and no backtrace.
fn stop(msg: String) -> ! {
    let (include_dir, root) = (env::var("CRIU_INCLUDE_DIR").ok(), env::var("CCM_TRIXIE_ROOT").ok());
    eprintln!("error: criu-plugin-sys: {msg}; {}", howto(include_dir.as_deref(), root.as_deref()));
    std::process::exit(1)
}

fn candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = env::var("CRIU_INCLUDE_DIR") {
        dirs.push(PathBuf::from(d));
        return dirs;
    }
    dirs.push(PathBuf::from("/usr/include"));
    let root = env::var("CCM_TRIXIE_ROOT").ok();
    dirs.push(Path::new(trixie_root(root.as_deref())).join("usr/include"));
    dirs
}

fn main() {
    println!("cargo:rerun-if-env-changed=CRIU_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=CCM_TRIXIE_ROOT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let wrapper = manifest.join("../../wrapper.h");
    println!("cargo:rerun-if-changed={}", wrapper.display());

    let include = candidates().into_iter().find(|d| d.join("criu/criu-plugin.h").is_file()).unwrap_or_else(|| {
        let looked: Vec<String> = candidates().iter().map(|d| d.display().to_string()).collect();
        stop(format!("CRIU's plugin header criu/criu-plugin.h was not found (looked in {})", looked.join(", ")))
    });
    let header = include.join("criu/criu-plugin.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text =
        std::fs::read_to_string(&header).unwrap_or_else(|e| stop(format!("cannot read {}: {e}", header.display())));
    if !text.contains("CR_PLUGIN_HOOK__CHECKPOINT_DEVICES") {
        stop(format!("{} has no CR_PLUGIN_HOOK__CHECKPOINT_DEVICES: it is older than CRIU 4.0", header.display()));
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
        .unwrap_or_else(|e| stop(format!("bindgen failed on {}: {e}", header.display())));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(&out).expect("write bindings");
}
