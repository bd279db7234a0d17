//! Records where this build of the harness lives (`<target>/<profile>`), for programs that run
//! from elsewhere, such as doctests, which rustdoc builds in a temporary directory.

fn main() {
    // OUT_DIR is `<target>/<profile>/build/mdrelay-harness-<hash>/out`.
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    let profile = std::path::Path::new(&out).ancestors().nth(3).expect("OUT_DIR is under the profile directory");
    println!("cargo:rustc-env=MDRELAY_HARNESS_PROFILE_DIR={}", profile.display());
    println!("cargo:rerun-if-changed=build.rs");
}
