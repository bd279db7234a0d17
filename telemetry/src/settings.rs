//! The resolved configuration as an operator reads it: TOML, every setting written out, each
//! value followed by where it came from (a file and line, a flag, an environment variable, or
//! the default). What both programs' `--check` prints, and what a reload compares.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// A flag as the user gave it, for naming where a setting came from.
#[derive(Debug, Clone, Default)]
pub struct GivenFlag {
    /// Its long name, without dashes.
    pub long: String,
    /// Where it was given: `--rate` or the environment variable's name.
    pub origin: String,
    /// Its values as written; none for a switch.
    pub values: Vec<String>,
}

impl GivenFlag {
    /// The flags of `command` given in `matches`, on the command line or in the environment.
    pub fn all(command: &clap::Command, matches: &clap::ArgMatches) -> Vec<GivenFlag> {
        use clap::parser::ValueSource;
        let mut given = Vec::new();
        for arg in command.get_arguments() {
            let (id, Some(long)) = (arg.get_id().as_str(), arg.get_long()) else { continue };
            let origin = match matches.value_source(id) {
                Some(ValueSource::CommandLine) => format!("--{long}"),
                Some(ValueSource::EnvVariable) => match arg.get_env() {
                    Some(var) => var.to_string_lossy().into_owned(),
                    None => format!("--{long}"),
                },
                _ => continue,
            };
            let values = match arg.get_action().takes_values() {
                true => matches
                    .get_raw(id)
                    .map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect())
                    .unwrap_or_default(),
                false => Vec::new(),
            };
            given.push(GivenFlag { long: long.to_string(), origin, values });
        }
        given
    }
}

/// The dotted key of every value in `table` that is not itself a table (`pacing.rate`), with it.
pub fn leaves(table: &toml::Table) -> BTreeMap<String, &toml::Value> {
    let mut out = BTreeMap::new();
    collect(table, "", &mut out);
    out
}

fn collect<'a>(table: &'a toml::Table, prefix: &str, out: &mut BTreeMap<String, &'a toml::Value>) {
    for (key, value) in table {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) => collect(inner, &path, out),
            other => {
                out.insert(path, other);
            }
        }
    }
}

/// The keys whose values differ between `old` and `new`, or that only one of them has.
pub fn changed_keys(old: &toml::Table, new: &toml::Table) -> Vec<String> {
    let (old, new) = (leaves(old), leaves(new));
    let mut keys: Vec<String> = old.keys().chain(new.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    keys.retain(|key| old.get(key) != new.get(key));
    keys
}

/// Where each key of a configuration file's text was written: `"FILE, line N"`, by dotted key.
/// A text that does not parse gives none (its error is reported where it is read).
pub fn file_origins(path: &Path, text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(document) = toml::de::DeTable::parse(text) {
        spans(document.get_ref(), "", text, path, &mut out);
    }
    out
}

/// Where byte `offset` of a configuration file's `text` is, as origins name it: `"FILE, line N"`.
pub fn file_line(path: &Path, text: &str, offset: usize) -> String {
    let line = text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1;
    format!("{}, line {line}", path.display())
}

fn spans(table: &toml::de::DeTable<'_>, prefix: &str, text: &str, path: &Path, out: &mut BTreeMap<String, String>) {
    for (key, value) in table {
        let name = if prefix.is_empty() { key.get_ref().to_string() } else { format!("{prefix}.{}", key.get_ref()) };
        match value.get_ref() {
            toml::de::DeValue::Table(inner) => spans(inner, &name, text, path, out),
            _ => {
                out.insert(name, file_line(path, text, key.span().start));
            }
        }
    }
}

/// `table` as TOML, each value followed by `# ORIGIN` (`origin(key)`, else "default"), under a
/// first line naming what it is.
pub fn annotated(title: &str, table: &toml::Table, origin: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {title}");
    let _ = writeln!(out, "# Each value is followed by where it came from; this text is a valid configuration file.");
    write_table(&mut out, table, "", origin);
    out
}

fn write_table(out: &mut String, table: &toml::Table, prefix: &str, origin: &dyn Fn(&str) -> Option<String>) {
    let path = |key: &str| if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") };
    let mut wrote = false;
    for (key, value) in table.iter().filter(|(_, v)| !v.is_table()) {
        if !wrote && !prefix.is_empty() {
            let _ = writeln!(out, "\n[{prefix}]");
        }
        wrote = true;
        let from = origin(&path(key)).unwrap_or_else(|| "default".into());
        let _ = writeln!(out, "{} = {value}  # {from}", toml_key(key));
    }
    for (key, value) in table {
        if let toml::Value::Table(inner) = value {
            let inner_prefix = path(&toml_key(key));
            if inner.is_empty() {
                // A section whose presence is the setting (e.g. `[tcp]` with every default).
                let _ = writeln!(out, "\n[{inner_prefix}]");
            }
            write_table(out, inner, &inner_prefix, origin);
        }
    }
}

/// A key as TOML writes it: bare when it can be.
fn toml_key(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        key.to_string()
    } else {
        toml::Value::String(key.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotated_text_reads_back_as_the_same_table_with_each_origin() {
        let text = "format = \"sbe\"\n[pacing]\nrate = 5.0\n[source.synthetic]\nseed = 3\n";
        let table: toml::Table = toml::from_str(text).unwrap();
        let origins = file_origins(Path::new("pub.toml"), text);
        assert_eq!(origins["pacing.rate"], "pub.toml, line 3");
        assert_eq!(origins["source.synthetic.seed"], "pub.toml, line 5");
        let printed = annotated("test", &table, &|key| origins.get(key).cloned());
        assert!(printed.contains("rate = 5.0  # pub.toml, line 3"), "{printed}");
        assert!(printed.contains("[source.synthetic]\nseed = 3  # pub.toml, line 5"), "{printed}");
        assert_eq!(toml::from_str::<toml::Table>(&printed).unwrap(), table);
        let mut other = table.clone();
        other["pacing"].as_table_mut().unwrap().insert("rate".into(), toml::Value::Float(6.0));
        assert_eq!(changed_keys(&table, &other), ["pacing.rate"]);
    }
}
