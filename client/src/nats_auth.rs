//! How a NATS client proves who it is: one checked value for the subscriber, the publisher's
//! output and its NATS upstream, from the same four settings everywhere.

use std::fmt;
use std::path::PathBuf;

/// The credentials a NATS connection presents, checked: none, a `.creds` file, an nkey seed's
/// file, or a user with the file holding its password (the choices natscli offers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials.
    #[default]
    None,
    /// A `.creds` file (a JWT and an nkey seed), the `creds_file` setting.
    Creds(PathBuf),
    /// A file holding an nkey seed, the `nkey_file` setting.
    Nkey(PathBuf),
    /// A user (the `user` setting) and the file holding its password (`password_file`; the
    /// white space around the password is trimmed).
    UserPassword(String, PathBuf),
}

/// One of the settings of a NATS connection, as errors name it; each program spells it its own
/// way around the same key (`nats.creds_file` in the publisher's file, `--nats-creds-file` on
/// the subscriber's command line, [`Builder::nats_creds_file`](crate::Builder) in Rust).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NatsSetting {
    /// The server URLs.
    Servers,
    /// The credentials as a whole: a server asked for some and none were given.
    Credentials,
    /// A `.creds` file.
    CredsFile,
    /// An nkey seed's file.
    NkeyFile,
    /// A user name.
    User,
    /// A password's file.
    PasswordFile,
    /// CA certificates to check the servers' TLS certificates with.
    TlsCaFile,
}

impl NatsSetting {
    /// The setting's key, without a section or prefix: `creds_file`, `tls_ca_file`, ...
    pub fn key(self) -> &'static str {
        match self {
            NatsSetting::Servers => "servers",
            NatsSetting::Credentials => "credentials",
            NatsSetting::CredsFile => "creds_file",
            NatsSetting::NkeyFile => "nkey_file",
            NatsSetting::User => "user",
            NatsSetting::PasswordFile => "password_file",
            NatsSetting::TlsCaFile => "tls_ca_file",
        }
    }
}

impl fmt::Display for NatsSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// A NATS setting that cannot be used: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSettingError {
    /// The setting at fault.
    pub setting: NatsSetting,
    /// What is wrong with it.
    pub reason: String,
}

impl NatsSettingError {
    pub(crate) fn new(setting: NatsSetting, reason: impl Into<String>) -> NatsSettingError {
        NatsSettingError { setting, reason: reason.into() }
    }
}

impl fmt::Display for NatsSettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.reason)
    }
}

impl std::error::Error for NatsSettingError {}

impl NatsAuth {
    /// The credentials the four settings give: none of them, or exactly one kind (`user` and
    /// `password_file` together); otherwise the setting at fault.
    pub fn from_settings(
        creds_file: Option<PathBuf>,
        nkey_file: Option<PathBuf>,
        user: Option<String>,
        password_file: Option<PathBuf>,
    ) -> Result<NatsAuth, NatsSettingError> {
        Ok(match (creds_file, nkey_file, user, password_file) {
            (None, None, None, None) => NatsAuth::None,
            (Some(creds), None, None, None) => NatsAuth::Creds(creds),
            (None, Some(nkey), None, None) => NatsAuth::Nkey(nkey),
            (None, None, Some(user), Some(password)) => NatsAuth::UserPassword(user, password),
            (None, None, Some(_), None) => {
                return Err(NatsSettingError::new(NatsSetting::User, "a user needs the file holding its password too"));
            }
            (None, None, None, Some(_)) => {
                return Err(NatsSettingError::new(NatsSetting::PasswordFile, "a password's file needs its user too"));
            }
            _ => {
                return Err(NatsSettingError::new(
                    NatsSetting::CredsFile,
                    "give one kind of credentials: a .creds file, an nkey seed's file, or a user with a password's file",
                ));
            }
        })
    }

    /// The four settings that give these credentials, in the order
    /// [`NatsAuth::from_settings`] takes them.
    #[allow(clippy::type_complexity)] // The four settings, as from_settings takes them.
    pub fn to_settings(&self) -> (Option<PathBuf>, Option<PathBuf>, Option<String>, Option<PathBuf>) {
        match self {
            NatsAuth::None => (None, None, None, None),
            NatsAuth::Creds(path) => (Some(path.clone()), None, None, None),
            NatsAuth::Nkey(path) => (None, Some(path.clone()), None, None),
            NatsAuth::UserPassword(user, path) => (None, None, Some(user.clone()), Some(path.clone())),
        }
    }

    /// The setting a server's refusal of these credentials points at (`None`: none given).
    pub fn setting(&self) -> Option<NatsSetting> {
        match self {
            NatsAuth::None => None,
            NatsAuth::Creds(_) => Some(NatsSetting::CredsFile),
            NatsAuth::Nkey(_) => Some(NatsSetting::NkeyFile),
            NatsAuth::UserPassword(..) => Some(NatsSetting::PasswordFile),
        }
    }
}

/// A NATS setting at fault, named by its builder method.
pub(crate) fn nats_config(e: NatsSettingError) -> crate::Error {
    let method = match e.setting {
        NatsSetting::Servers | NatsSetting::Credentials => "nats",
        NatsSetting::CredsFile => "nats_creds_file",
        NatsSetting::NkeyFile => "nats_nkey_file",
        NatsSetting::User => "nats_user",
        NatsSetting::PasswordFile => "nats_password_file",
        NatsSetting::TlsCaFile => "nats_tls_ca_file",
    };
    crate::Error::config(method, e.reason)
}

/// async-nats's connection options presenting `auth` and, with `tls_ca_file`, requiring TLS
/// checked against those CA certificates (PEM). The files are read here: one that cannot be is
/// an error naming its setting.
#[cfg(feature = "nats")]
pub async fn connect_options(
    auth: &NatsAuth,
    tls_ca_file: Option<&std::path::Path>,
) -> Result<async_nats::ConnectOptions, NatsSettingError> {
    let options = async_nats::ConnectOptions::new();
    let mut options = match auth {
        NatsAuth::None => options,
        NatsAuth::Creds(path) => options.credentials_file(path).await.map_err(|e| {
            NatsSettingError::new(NatsSetting::CredsFile, format!("cannot read {}: {e}", path.display()))
        })?,
        NatsAuth::Nkey(path) => options.nkey(secret(NatsSetting::NkeyFile, path)?),
        NatsAuth::UserPassword(user, path) => {
            options.user_and_password(user.clone(), secret(NatsSetting::PasswordFile, path)?)
        }
    };
    if let Some(ca) = tls_ca_file {
        if !ca.is_file() {
            return Err(NatsSettingError::new(NatsSetting::TlsCaFile, format!("{} is not a file", ca.display())));
        }
        options = options.add_root_certificates(ca.to_path_buf()).require_tls(true);
    }
    Ok(options)
}

/// What a connection that failed says of the settings: the setting at fault and why (the
/// credentials the server refused, or [`NatsSetting::Credentials`] when it asked for some and
/// none were given; the TLS that failed), or `None` when it says nothing of them (servers out of
/// reach, or names that do not resolve yet), which may be worth trying again.
#[cfg(feature = "nats")]
pub fn connect_error(error: &async_nats::ConnectError, auth: &NatsAuth) -> Option<NatsSettingError> {
    use async_nats::ConnectErrorKind as Kind;
    match error.kind() {
        Kind::Authentication | Kind::AuthorizationViolation => Some(match auth.setting() {
            Some(setting) => {
                NatsSettingError::new(setting, format!("the NATS server refused the credentials: {error}"))
            }
            None => NatsSettingError::new(
                NatsSetting::Credentials,
                format!("the NATS server asks for credentials and none were given: {error}"),
            ),
        }),
        Kind::Tls => {
            Some(NatsSettingError::new(NatsSetting::TlsCaFile, format!("TLS with the NATS server failed: {error}")))
        }
        _ => None,
    }
}

/// A secret from a file, the white space around it trimmed.
#[cfg(feature = "nats")]
fn secret(setting: NatsSetting, path: &std::path::Path) -> Result<String, NatsSettingError> {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_string())
        .map_err(|e| NatsSettingError::new(setting, format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_or_exactly_one_kind_of_credentials_and_the_setting_at_fault_otherwise() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(NatsAuth::from_settings(None, None, None, None), Ok(NatsAuth::None));
        assert_eq!(NatsAuth::from_settings(p("a.creds"), None, None, None), Ok(NatsAuth::Creds("a.creds".into())));
        assert_eq!(NatsAuth::from_settings(None, p("seed"), None, None), Ok(NatsAuth::Nkey("seed".into())));
        let user = NatsAuth::from_settings(None, None, Some("feed".into()), p("pw"));
        assert_eq!(user, Ok(NatsAuth::UserPassword("feed".into(), "pw".into())));
        let fault = |r: Result<NatsAuth, NatsSettingError>| r.unwrap_err().setting;
        assert_eq!(fault(NatsAuth::from_settings(None, None, Some("feed".into()), None)), NatsSetting::User);
        assert_eq!(fault(NatsAuth::from_settings(None, None, None, p("pw"))), NatsSetting::PasswordFile);
        assert_eq!(fault(NatsAuth::from_settings(p("a.creds"), p("seed"), None, None)), NatsSetting::CredsFile);
        for auth in [NatsAuth::None, NatsAuth::Creds("c".into()), NatsAuth::Nkey("n".into()), user.unwrap()] {
            let (c, n, u, pw) = auth.to_settings();
            assert_eq!(NatsAuth::from_settings(c, n, u, pw), Ok(auth.clone()), "the settings give it back");
        }
    }
}
