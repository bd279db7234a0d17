//! Sets `MDRELAY_VERSION`, the `--version` string with the git commit (see mdrelay-buildinfo).

fn main() {
    mdrelay_buildinfo::emit();
}
