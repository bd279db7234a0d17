//! The `mdrelay` Python package's native module: `mdrelay-client` as typed Python events and
//! Apache Arrow record batches.

/// Sets `$dict[name] = $from.name` for each field `name` given, in that order: the fields of a
/// Rust value as a Python dict's items under the fields' own names.
macro_rules! set_fields {
    ($dict:expr, $from:expr, $($field:ident),+ $(,)?) => {
        $($dict.set_item(stringify!($field), $from.$field)?;)+
    };
}

mod capture;
mod errors;
mod messages;
mod settings;
mod subscriber;
mod tables;

use pyo3::prelude::*;

/// The native module; `mdrelay/__init__.py` re-exports it.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    messages::register(m)?;
    m.add_class::<subscriber::Subscriber>()?;
    m.add_class::<subscriber::BatchIterator>()?;
    m.add_class::<capture::CaptureBatches>()?;
    m.add_function(wrap_pyfunction!(capture::read_capture, m)?)?;
    m.add_function(wrap_pyfunction!(capture::schema, m)?)?;
    m.add("MESSAGE_TYPES", subscriber::labels(m.py())?)?;
    Ok(())
}
