//! Links libpat.so from PAT_LIB_DIR, by default the source tree's build/lib (what `make` builds,
//! three directories up). The directory goes to the dependents as DEP_PAT_LIB_DIR (the `pat`
//! crate's build script makes it its binaries' rpath) and into this crate's own tests' rpath.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=PAT_LIB_DIR");
    let dir = match env::var_os("PAT_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
            .join("../../../build/lib"),
    };
    let dir = match dir.canonicalize() {
        Ok(d) if d.join("libpat.so").exists() => d,
        _ => panic!(
            "no libpat.so in {}: run `make` in the patd source tree, or set PAT_LIB_DIR to the \
             directory of an installed libpat (make install: /usr/local/lib)",
            dir.display()
        ),
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=pat");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:lib_dir={}", dir.display());
}
