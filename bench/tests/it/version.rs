//! `mdrelay-bench --version`: the workspace version and the git commit built, as git itself says.

#[test]
fn version_prints_the_name_the_workspace_version_and_the_commit_built() {
    mdrelay_harness::version::assert_version(
        std::path::Path::new(env!("CARGO_BIN_EXE_mdrelay-bench")),
        "mdrelay-bench",
    );
}
