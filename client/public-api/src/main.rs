//! `mdrelay-client-public-api RUSTDOC_JSON`: prints the crate's public API, one item a line.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: mdrelay-client-public-api RUSTDOC_JSON");
        return ExitCode::from(2);
    };
    match public_api::Builder::from_rustdoc_json(&path).build() {
        Ok(api) => {
            for item in api.items() {
                println!("{item}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mdrelay-client-public-api: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
