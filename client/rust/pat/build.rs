//! This crate's tests and examples load libpat from where pat-sys linked it (DEP_PAT_LIB_DIR,
//! from pat-sys's `links = "pat"`): an rpath, so neither LD_LIBRARY_PATH nor an installed
//! libpat is needed. A crate depending on `pat` does the same in its own build script, or
//! relies on an installed libpat.
fn main() {
    if let Some(dir) = std::env::var_os("DEP_PAT_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
}
