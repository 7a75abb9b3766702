//! Link settings of the NVML TEST DOUBLE.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    // Handles given out point into this library's data: keep it mapped after a dlclose().
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
