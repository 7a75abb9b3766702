//! Link settings for the plugin `cdylib`.
//!
//! CRIU `dlopen`s every `*.so` of its plugin directory and looks up `CR_PLUGIN_DESC`. The plugin
//! resolves CRIU's own functions (`print_on_level`, `criu_get_image_dir`, ...) at run time with
//! `dlsym`, so nothing here links against CRIU. The soname names the plugin in `ldd`/`/proc/PID/maps`.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,criu_cuda_migrate.so");
    // Keep the plugin mapped after CRIU dlclose()s it: worker threads and thread-local
    // destructors of the Rust runtime must never find their code unmapped.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
