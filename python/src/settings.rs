//! Python's keyword arguments as the client library's `Settings`: the one mapping between the
//! two, so a keyword is a settings field under the same name, type and unit, and an error names
//! the keyword.

use crate::errors;
use mdrelay_client::Settings;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::time::Duration;

/// A number of seconds given to a keyword (None: not given); an error names the keyword.
pub(crate) fn seconds(py: Python<'_>, value: Option<f64>, setting: &str) -> PyResult<Option<Duration>> {
    value
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .map_err(|_| errors::config(py, setting, format!("{s} is not a number of seconds (0 or more)")))
        })
        .transpose()
}

/// The client library's settings from keyword arguments: each value as JSON (a path-like value
/// as its path, None as not given), then read as `Settings` reads a file, so the names, types,
/// units and defaults are the library's own. An error names the keyword.
pub(crate) fn client_settings(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Settings> {
    let mut map = serde_json::Map::new();
    for (key, value) in kwargs.into_iter().flatten() {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        let json = keyword_json(&value).map_err(|why| errors::config(py, &key, why))?;
        map.insert(key, json);
    }
    serde_json::from_value(serde_json::Value::Object(map.clone())).map_err(|error| {
        // The settings are flat: the first keyword that fails on its own is the one to name.
        let culprit = map.iter().find(|(key, value)| {
            let one = serde_json::Map::from_iter([((*key).clone(), (*value).clone())]);
            serde_json::from_value::<Settings>(serde_json::Value::Object(one)).is_err()
        });
        let keyword = culprit.map_or("settings", |(key, _)| key.as_str());
        errors::config(py, keyword, error.to_string())
    })
}

/// A keyword argument's value as JSON: bool, int, float, str, a path-like object's path, or a
/// list or tuple of those.
fn keyword_json(value: &Bound<'_, PyAny>) -> Result<serde_json::Value, String> {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
    if value.is_instance_of::<PyBool>() {
        return Ok(serde_json::Value::Bool(value.extract::<bool>().map_err(|e| e.to_string())?));
    }
    if value.is_instance_of::<PyInt>() {
        return match value.extract::<i64>() {
            Ok(n) => Ok(n.into()),
            Err(_) => Err(format!("{value} is out of range")),
        };
    }
    if value.is_instance_of::<PyFloat>() {
        let f: f64 = value.extract().map_err(|e: PyErr| e.to_string())?;
        return serde_json::Number::from_f64(f).map(serde_json::Value::Number).ok_or(format!("{f} is not a number"));
    }
    if value.is_instance_of::<PyString>() {
        return Ok(serde_json::Value::String(value.extract().map_err(|e: PyErr| e.to_string())?));
    }
    if let Ok(path) = value.extract::<std::path::PathBuf>() {
        return Ok(serde_json::Value::String(path.to_string_lossy().into_owned()));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        return value
            .try_iter()
            .map_err(|e| e.to_string())?
            .map(|item| keyword_json(&item.map_err(|e| e.to_string())?))
            .collect();
    }
    Err(format!(
        "a value of type {} is not a setting's",
        value.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
    ))
}
