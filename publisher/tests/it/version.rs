//! `mdrelay-pub --version`: the workspace version and the git commit built, as git itself says.

#[test]
fn version_prints_the_name_the_workspace_version_and_the_commit_built() {
    let _shared = mdrelay_harness::shared();
    mdrelay_harness::version::assert_version(&mdrelay_harness::publisher_bin(), "mdrelay-pub");
}
