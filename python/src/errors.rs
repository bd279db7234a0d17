//! The exceptions: one base class, `mdrelay.Error`, and a subclass per kind of the client
//! library's error, each instance carrying `kind` (the Rust error's kind, in snake case) and
//! `message`.

use mdrelay_client::ErrorKind;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyType;

create_exception!(mdrelay, Error, PyException, "Base class of every error this package raises.");
create_exception!(mdrelay, WrongKeyError, Error, "The publisher encrypts with another key.");
create_exception!(mdrelay, ProtectionMismatchError, Error, "The publisher protects its frames otherwise.");
create_exception!(mdrelay, VersionError, Error, "The publisher speaks a protocol version this library does not.");
create_exception!(mdrelay, RefusedError, Error, "The publisher refused the subscription.");
create_exception!(mdrelay, NotAPublisherError, Error, "The peer is not an mdrelay publisher.");
create_exception!(mdrelay, UnreachableError, Error, "The publisher could not be reached.");
create_exception!(mdrelay, AddrInUseError, Error, "Another socket holds the local address.");
create_exception!(mdrelay, BindError, Error, "A local address could not be bound or a group joined.");
create_exception!(mdrelay, ConfigError, Error, "A setting is out of range or does not fit the transport.");
create_exception!(mdrelay, EndedError, Error, "The stream ended for a reason another connection would not mend.");
create_exception!(mdrelay, TransportIoError, Error, "The system failed (a socket option, the runtime).");
create_exception!(mdrelay, CaptureError, Error, "A capture file could not be read.");
create_exception!(mdrelay, IdleTimeoutError, Error, "Nothing arrived within the subscriber's idle_timeout.");

/// The exception class and kind name of a client error kind.
fn class_of(py: Python<'_>, kind: ErrorKind) -> (Bound<'_, PyType>, &'static str) {
    match kind {
        ErrorKind::WrongKey => (py.get_type::<WrongKeyError>(), "wrong_key"),
        ErrorKind::ProtectionMismatch => (py.get_type::<ProtectionMismatchError>(), "protection_mismatch"),
        ErrorKind::Version => (py.get_type::<VersionError>(), "version"),
        ErrorKind::Refused => (py.get_type::<RefusedError>(), "refused"),
        ErrorKind::NotAPublisher => (py.get_type::<NotAPublisherError>(), "not_a_publisher"),
        ErrorKind::Unreachable => (py.get_type::<UnreachableError>(), "unreachable"),
        ErrorKind::AddrInUse => (py.get_type::<AddrInUseError>(), "addr_in_use"),
        ErrorKind::Bind => (py.get_type::<BindError>(), "bind"),
        ErrorKind::Config => (py.get_type::<ConfigError>(), "config"),
        ErrorKind::Ended => (py.get_type::<EndedError>(), "ended"),
        ErrorKind::Io => (py.get_type::<TransportIoError>(), "io"),
        // The kind is non-exhaustive: a kind added later is still an mdrelay.Error.
        _ => (py.get_type::<Error>(), "other"),
    }
}

/// An exception of `class`, with `kind` and `message` set on it.
pub fn raise(py: Python<'_>, class: Bound<'_, PyType>, kind: &str, message: String) -> PyErr {
    let err = PyErr::from_type(class, message.clone());
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail short of memory exhaustion;
    // the exception is raised either way.
    let _ = value.setattr("kind", kind);
    let _ = value.setattr("message", message);
    err
}

/// The Python exception of a client library error.
pub fn from_client(py: Python<'_>, error: &mdrelay_client::Error) -> PyErr {
    let (class, kind) = class_of(py, error.kind());
    let err = raise(py, class, kind, error.to_string());
    let _ = err.value(py).setattr("setting", error.setting());
    err
}

/// A configuration error raised before the client library was asked (a bad argument type or
/// combination).
pub fn config(py: Python<'_>, setting: &str, message: impl Into<String>) -> PyErr {
    let message = format!("{setting}: {}", message.into());
    let err = raise(py, py.get_type::<ConfigError>(), "config", message);
    let _ = err.value(py).setattr("setting", setting);
    err
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("WrongKeyError", py.get_type::<WrongKeyError>())?;
    m.add("ProtectionMismatchError", py.get_type::<ProtectionMismatchError>())?;
    m.add("VersionError", py.get_type::<VersionError>())?;
    m.add("RefusedError", py.get_type::<RefusedError>())?;
    m.add("NotAPublisherError", py.get_type::<NotAPublisherError>())?;
    m.add("UnreachableError", py.get_type::<UnreachableError>())?;
    m.add("AddrInUseError", py.get_type::<AddrInUseError>())?;
    m.add("BindError", py.get_type::<BindError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("EndedError", py.get_type::<EndedError>())?;
    m.add("TransportIoError", py.get_type::<TransportIoError>())?;
    m.add("CaptureError", py.get_type::<CaptureError>())?;
    m.add("IdleTimeoutError", py.get_type::<IdleTimeoutError>())?;
    Ok(())
}
