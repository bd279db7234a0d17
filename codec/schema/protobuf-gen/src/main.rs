//! Generates the prost types of `codec/schema/marketdata.proto`.
//!
//! Usage: `mdrelay-protobuf-gen SCHEMA_DIR SCHEMA OUT_DIR` (what `codec/schema/gen-protobuf.sh`
//! passes). Writes `OUT_DIR/mdrelay.v1.rs`, one file per proto package.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [schema_dir, schema, out_dir] = args.as_slice() else {
        eprintln!("usage: mdrelay-protobuf-gen SCHEMA_DIR SCHEMA OUT_DIR");
        return ExitCode::from(2);
    };
    let protoc = match protoc_bin_vendored::protoc_bin_path() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("error: no vendored protoc for this platform: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc).out_dir(out_dir);
    match config.compile_protos(&[schema_dir.join(schema)], &[schema_dir]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
