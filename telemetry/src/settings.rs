//! A configuration laid from its sources and read as an operator reads it:
//! - [`Layered`]: the settings of a file, then of the flags and environment variables given,
//!   each value remembering where it came from, read into the program's settings struct with
//!   errors naming the setting and its origin (as figment layers its providers);
//! - [`annotated`]: the resolved configuration as TOML, every setting written out, each value
//!   followed by where it came from (a file and line, a flag, an environment variable, or the
//!   default). What both programs' `--check` prints, and what a reload compares.

use crate::config_file::{Reading, read_text, toml_error_message};
use anyhow::{Result, anyhow, bail};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// A setting's earlier name, still read in files, flags and environment variables alike: the
/// value is laid under the name it has now (multiplied by `scale`, for an earlier name in
/// another unit), and its origin says so.
#[derive(Debug, Clone, Copy)]
pub struct EarlierName {
    /// The earlier name (a dotted key for a setting that was in a section).
    pub earlier: &'static str,
    /// The name it has now.
    pub now: &'static str,
    /// What a number under the earlier name is multiplied by (1.0: the same unit).
    pub scale: f64,
}

/// Settings laid from their sources, each value with where it came from: a file's line, a flag,
/// an environment variable. Lay the lowest source first ([`Layered::from_file`]), then the
/// higher ones over it ([`Layered::lay`]); [`Layered::extract`] reads the result into a struct
/// whose `Default` holds the defaults.
#[derive(Debug, Clone, Default)]
pub struct Layered {
    table: toml::Table,
    origins: BTreeMap<String, String>,
}

impl Layered {
    /// The settings of the configuration file `path` (read as [`read_text`] reads it), earlier
    /// names laid under their names of now.
    pub fn from_file(path: &Path, reading: Reading, earlier: &[EarlierName]) -> Result<Layered> {
        Layered::from_text(path, &read_text(path, reading)?, earlier)
    }

    /// The settings of `text`, the configuration file `path` (named in origins and errors).
    pub fn from_text(path: &Path, text: &str, earlier: &[EarlierName]) -> Result<Layered> {
        let origins = file_origins(path, text);
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            // TOML's integers are signed 64-bit: a larger one is refused naming its setting.
            let span = e.span().filter(|_| e.message().contains("too large")).unwrap_or_default();
            let at = file_line(path, text, span.start);
            match origins.iter().find(|(_, origin)| !span.is_empty() && **origin == at) {
                Some((key, origin)) => {
                    anyhow!(
                        "{key} ({origin}): {} is out of range: a setting is at most {}",
                        text.get(span).unwrap_or_default(),
                        i64::MAX
                    )
                }
                None => anyhow!("{}: {}", path.display(), toml_error_message(&e)),
            }
        })?;
        let mut layer = Layered { table, origins };
        layer.rename(earlier)?;
        Ok(layer)
    }

    /// The settings of the flags `given` (on the command line or in the environment), as the
    /// `serde` names of `Args`' fields give them: each flag is parsed again alone, so that every
    /// value is tied to the flag or variable that gave it. A flag sets what its parse changes
    /// from a parse of no flag at all, and its own setting even when given its default value
    /// (`--profile default`): fields that always have a value (a default, a switch that is off)
    /// are not set by every other flag. Earlier names are laid under their names of now.
    pub fn from_flags<Args>(given: &[GivenFlag], earlier: &[EarlierName]) -> Result<Layered>
    where
        Args: clap::Args + clap::FromArgMatches + serde::Serialize,
    {
        // No environment here: what came from it is in `given` already.
        let command = Args::augment_args(clap::Command::new("flags")).mut_args(|arg| arg.env(None::<&str>));
        let parse = |argv: Vec<String>| {
            let matches = command.clone().try_get_matches_from(argv).ok()?;
            Args::from_arg_matches(&matches).ok()
        };
        let none = parse(vec!["flags".into()]).and_then(|none| toml::Table::try_from(&none).ok()).unwrap_or_default();
        let mut layer = Layered::default();
        for flag in given {
            let mut argv = vec!["flags".to_string()];
            match flag.values.is_empty() {
                true => argv.push(format!("--{}", flag.long)),
                false => argv.extend(flag.values.iter().map(|value| format!("--{}={value}", flag.long))),
            }
            let Some(alone) = parse(argv) else { continue };
            let own = command.get_arguments().find(|arg| arg.get_long() == Some(&flag.long)).map(|arg| arg.get_id());
            let own = own.map(|id| id.as_str().to_string()).unwrap_or_default();
            let settings = toml::Table::try_from(&alone).map_err(|_| {
                // TOML's integers are signed 64-bit: a larger one is refused naming its setting.
                let json = serde_json::to_value(&alone).unwrap_or_default();
                let key = json.as_object().and_then(|fields| {
                    fields.iter().find(|(_, v)| v.as_u64().is_some() && v.as_i64().is_none()).map(|(k, _)| k.clone())
                });
                let key = key.unwrap_or_else(|| flag.long.replace('-', "_"));
                let values = flag.values.join(",");
                anyhow!("{key} ({}): {values} is out of range: a setting is at most {}", flag.origin, i64::MAX)
            })?;
            for (key, value) in settings {
                if none.get(&key) != Some(&value) || key.replace('.', "_") == own {
                    layer.set(&key, value, &flag.origin);
                }
            }
        }
        layer.rename(earlier)?;
        Ok(layer)
    }

    /// The settings of the flags `given`, each laid under its flag's id in `args` (a dotted
    /// key) as a file would write its text: `true` or `false`, a whole number, a number, or else
    /// the text itself (whose setting reads it: a duration, a size, an address). A `FILE` is
    /// always text; a flag given more than once (`--udp A --udp B`) is a list; a switch stands
    /// for a section with its defaults (`--synthetic`). Every value is then read and checked by
    /// the setting's own type, as the file's are, so an error names the setting and its flag.
    pub fn from_flag_texts(given: &[GivenFlag], args: &[clap::Arg]) -> Result<Layered> {
        let mut layer = Layered::default();
        for flag in given {
            let Some(arg) = args.iter().find(|arg| arg.get_long() == Some(flag.long.as_str())) else { continue };
            let key = arg.get_id().as_str();
            let path = arg.get_value_names().is_some_and(|names| names.iter().any(|name| name.as_str() == "FILE"));
            let value = |text: &String| match path {
                true => Ok(toml::Value::String(text.clone())),
                false => value_of_text(text).map_err(|at_most| {
                    anyhow!("{key} ({}): {text} is out of range: a setting is at most {at_most}", flag.origin)
                }),
            };
            let value = match (flag.values.as_slice(), arg.get_action()) {
                ([], _) => toml::Value::Table(toml::Table::new()),
                (values, clap::ArgAction::Append) => {
                    toml::Value::Array(values.iter().map(value).collect::<Result<_>>()?)
                }
                ([.., last], _) => value(last)?,
            };
            layer.set(key, value, &flag.origin);
        }
        Ok(layer)
    }

    /// Lays `over` over these settings: its values replace theirs, key by key.
    pub fn lay(&mut self, over: Layered) {
        for (key, value) in settings(&over.table) {
            let origin = over.origins.get(&key).cloned().unwrap_or_default();
            self.set(&key, value.clone(), &origin);
        }
    }

    /// Sets the setting at the dotted `key`, which came from `origin`.
    pub fn set(&mut self, key: &str, value: toml::Value, origin: &str) {
        let path: Vec<&str> = key.split('.').collect();
        let Some((last, parents)) = path.split_last() else { return };
        let mut table = &mut self.table;
        for part in parents {
            let entry = table.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            let toml::Value::Table(inner) = entry else { return };
            table = inner;
        }
        match (table.get_mut(*last), value) {
            // A section set where one is already keeps what that one holds (`--synthetic` over
            // a file's `[source.synthetic]`).
            (Some(toml::Value::Table(existing)), toml::Value::Table(given)) => existing.extend(given),
            (_, value) => {
                table.insert(last.to_string(), value);
            }
        }
        self.origins.insert(key.to_string(), origin.to_string());
    }

    /// Records `origin` for the dotted `key` unless it has one (a default that comes from another
    /// setting: "line A's, pub.toml, line 9").
    pub fn origin_or(&mut self, key: &str, origin: &str) {
        self.origins.entry(key.to_string()).or_insert_with(|| origin.to_string());
    }

    /// Takes the setting (or section) at the dotted `key` out, if it is set.
    pub fn remove(&mut self, key: &str) -> Option<toml::Value> {
        let (parents, last) = key.rsplit_once('.').map_or((None, key), |(p, l)| (Some(p), l));
        let mut table = &mut self.table;
        for part in parents.into_iter().flat_map(|p| p.split('.')) {
            table = table.get_mut(part)?.as_table_mut()?;
        }
        let value = table.remove(last)?;
        let inner = format!("{key}.");
        self.origins.retain(|k, _| k != key && !k.starts_with(&inner));
        Some(value)
    }

    /// The dotted keys of the settings set, with their origins.
    pub fn set_keys(&self) -> impl Iterator<Item = &str> {
        self.origins.keys().map(String::as_str)
    }

    /// The setting at the dotted `key`, if it is set.
    pub fn get(&self, key: &str) -> Option<&toml::Value> {
        let mut parts = key.split('.');
        let mut value = self.table.get(parts.next()?)?;
        for part in parts {
            value = value.as_table()?.get(part)?;
        }
        Some(value)
    }

    /// The top-level keys set.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.table.keys().map(String::as_str)
    }

    /// Where the setting at the dotted `key` came from; none for a default.
    pub fn origin(&self, key: &str) -> Option<&str> {
        self.origins.get(key).map(String::as_str)
    }

    /// Every origin, by dotted key.
    pub fn origins(&self) -> &BTreeMap<String, String> {
        &self.origins
    }

    /// The setting as errors name it: `key (origin)`, or `key` for a default.
    pub fn name(&self, key: &str) -> String {
        match self.origin(key) {
            Some(origin) => format!("{key} ({origin})"),
            None => key.to_string(),
        }
    }

    /// The settings whose top-level key is one of `keys`, read into `T`; an error names the
    /// setting at fault and its origin (`report_interval (sub.toml, line 2): ...`).
    pub fn extract<T: DeserializeOwned>(&self, keys: &[&str]) -> Result<T> {
        let only = |wanted: &dyn Fn(&str) -> bool| -> toml::Table {
            self.table.iter().filter(|(key, _)| wanted(key)).map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let error = match T::deserialize(toml::Value::Table(only(&|key| keys.contains(&key)))) {
            Ok(settings) => return Ok(settings),
            Err(error) => error,
        };
        // The setting at fault: the first that fails alone (within a section, the first key).
        for (key, value) in settings(&self.table) {
            let top = key.split('.').next().unwrap_or_default();
            if !keys.contains(&top) {
                continue;
            }
            let mut alone = Layered::default();
            alone.set(&key, value.clone(), "");
            if let Err(e) = T::deserialize(toml::Value::Table(alone.table)) {
                let message = e.message().trim_end();
                // Alone, a key of a section with a required key (a group, an address) lacks it.
                if message.starts_with("missing field") {
                    continue;
                }
                match crate::config_file::did_you_mean(message) {
                    Some(near) => bail!("{}: {message}\ndid you mean `{near}`?", self.name(&key)),
                    None => bail!("{}: {message}", self.name(&key)),
                }
            }
        }
        Err(error.into())
    }

    /// Refuses a top-level key that is not one of `known`, naming it, its origin and the known
    /// key nearest to it.
    pub fn refuse_unknown(&self, known: &[&str]) -> Result<()> {
        let Some(key) = self.keys().find(|key| !known.contains(key)) else { return Ok(()) };
        let near = crate::config_file::nearest(key, known.iter().copied());
        let hint = near.map(|near| format!("; did you mean `{near}`?")).unwrap_or_default();
        let origin = self.origins.iter().find(|(k, _)| k.split('.').next() == Some(key)).map(|(_, o)| o);
        let name = match origin {
            Some(origin) => format!("{key} ({origin})"),
            None => key.to_string(),
        };
        bail!("{name}: unknown setting{hint}")
    }

    /// Lays each earlier name's value under the name it has now; one setting under both names
    /// is refused, naming the one to keep.
    fn rename(&mut self, earlier: &[EarlierName]) -> Result<()> {
        for name in earlier {
            let Some(origin) = self.origin(name.earlier).map(str::to_string) else { continue };
            if self.get(name.now).is_some() {
                bail!(
                    "{} and {}: the same setting twice ({} is its earlier name): keep {}",
                    self.name(name.now),
                    self.name(name.earlier),
                    name.earlier,
                    name.now
                );
            }
            let Some(mut value) = self.remove(name.earlier) else { continue };
            if name.scale != 1.0 {
                value = match value {
                    toml::Value::Integer(n) => toml::Value::Float(n as f64 * name.scale),
                    toml::Value::Float(f) => toml::Value::Float(f * name.scale),
                    other => other,
                };
            }
            // A section left empty by the move (`[protection]`) is no setting of its own.
            if let Some((section, _)) = name.earlier.rsplit_once('.')
                && self.get(section).and_then(toml::Value::as_table).is_some_and(toml::Table::is_empty)
            {
                self.remove(section);
            }
            let origin = format!("{origin}, under its earlier name {} (now {})", name.earlier, name.now);
            self.set(name.now, value, &origin);
        }
        Ok(())
    }
}

/// Every setting of `table` by dotted key: its values that are not tables, and its empty tables
/// (a section whose presence is the setting, such as `[source.synthetic]`).
fn settings(table: &toml::Table) -> Vec<(String, &toml::Value)> {
    let mut out = Vec::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) if !inner.is_empty() => {
                out.extend(settings(inner).into_iter().map(|(k, v)| (format!("{key}.{k}"), v)))
            }
            other => out.push((key.clone(), other)),
        }
    }
    out
}

/// The names of the fields of `T`, a struct deriving `Deserialize` without `flatten`: the keys
/// a section of a configuration file may hold.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error, Visitor};
    /// A deserializer that only records the fields a struct asks for.
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

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
                // A switch its variable turned off (`MDRELAY_SUB_CRC=false`) sets nothing.
                false if matches.try_get_one::<bool>(id).ok().flatten() == Some(&false) => continue,
                false => Vec::new(),
            };
            given.push(GivenFlag { long: long.to_string(), origin, values });
        }
        given
    }
}

/// A flag's text as a file would hold the value: a boolean, a whole number, a number (`inf` and
/// `NaN` too, for the setting's range to refuse), or else the text; a whole number beyond TOML's
/// integers is the error, with the largest there is.
fn value_of_text(text: &str) -> std::result::Result<toml::Value, i64> {
    let trimmed = text.trim();
    if let Ok(whole) = trimmed.parse::<i64>() {
        return Ok(toml::Value::Integer(whole));
    }
    if trimmed.parse::<u128>().is_ok() {
        return Err(i64::MAX);
    }
    if let Ok(number) = trimmed.parse::<f64>() {
        return Ok(toml::Value::Float(number));
    }
    Ok(match trimmed {
        "true" | "false" => toml::Value::Boolean(trimmed == "true"),
        _ => toml::Value::String(text.to_string()),
    })
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
    fn flag_texts_are_laid_as_a_file_writes_them_under_their_ids() {
        let args = [
            clap::Arg::new("pacing.rate").long("rate"),
            clap::Arg::new("pacing.loops").long("loops"),
            clap::Arg::new("tcp.listen").long("tcp"),
            clap::Arg::new("tcp.snapshots").long("snapshots"),
            clap::Arg::new("source.capture").long("capture").value_name("FILE"),
            clap::Arg::new("udp.destinations").long("udp").action(clap::ArgAction::Append),
            clap::Arg::new("source.synthetic").long("synthetic").action(clap::ArgAction::SetTrue),
        ];
        let given = |long: &str, values: &[&str]| GivenFlag {
            long: long.to_string(),
            origin: format!("--{long}"),
            values: values.iter().map(|v| v.to_string()).collect(),
        };
        let layer = Layered::from_flag_texts(
            &[
                given("rate", &["1e-19"]),
                given("loops", &["3"]),
                given("tcp", &["127.0.0.1:9100"]),
                given("snapshots", &["false"]),
                given("capture", &["2026"]),
                given("udp", &["127.0.0.1:1", "127.0.0.1:2"]),
                given("synthetic", &[]),
            ],
            &args,
        )
        .unwrap();
        assert_eq!(layer.get("pacing.rate"), Some(&toml::Value::Float(1e-19)));
        assert_eq!(layer.get("pacing.loops"), Some(&toml::Value::Integer(3)));
        assert_eq!(layer.get("tcp.listen"), Some(&toml::Value::from("127.0.0.1:9100")));
        assert_eq!(layer.get("tcp.snapshots"), Some(&toml::Value::Boolean(false)));
        // A file named like a number is still a file.
        assert_eq!(layer.get("source.capture"), Some(&toml::Value::from("2026")));
        let both = toml::Value::Array(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]);
        assert_eq!(layer.get("udp.destinations"), Some(&both));
        assert_eq!(layer.get("source.synthetic"), Some(&toml::Value::Table(toml::Table::new())));
        assert_eq!(layer.origin("udp.destinations"), Some("--udp"));

        // Values a setting's range refuses reach it; a number beyond TOML's integers is named here.
        for (text, value) in [("inf", toml::Value::Float(f64::INFINITY)), ("-1", toml::Value::Integer(-1))] {
            let layer = Layered::from_flag_texts(&[given("rate", &[text])], &args).unwrap();
            assert_eq!(layer.get("pacing.rate"), Some(&value), "{text}");
        }
        let nan = Layered::from_flag_texts(&[given("rate", &["NaN"])], &args).unwrap();
        assert!(nan.get("pacing.rate").and_then(toml::Value::as_float).is_some_and(f64::is_nan));
        let error = Layered::from_flag_texts(&[given("loops", &["18446744073709551615"])], &args).unwrap_err();
        assert_eq!(
            error.to_string(),
            "pacing.loops (--loops): 18446744073709551615 is out of range: a setting is at most 9223372036854775807"
        );
    }

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
