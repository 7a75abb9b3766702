//! Link settings of the libcuda TEST DOUBLE.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The name the real driver library carries, so the dynamic loader treats a copy or symlink
    // named libcuda.so.1 as that library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // The restore thread runs code of this library for the life of the process: it must never be
    // unmapped by a dlclose().
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
