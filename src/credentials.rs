//! Where a destination's credentials are: the names of environment variables, never the
//! secrets (the engine's config and the scenario are files on disk; the secrets reach the
//! engine and the reader through the environment). A leaf.

/// Environment variable names for one destination's credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// Kafka: the SASL mechanism (with username and password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_mechanism: Option<String>,
    /// PostgreSQL: a connection string (`postgres://user:password@host:5432/db`), which
    /// carries the user, password and database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsn_env: Option<String>,
}

/// Credentials read from the environment, for one connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    pub username: Option<String>,
    pub password: Option<String>,
    pub sasl_mechanism: Option<String>,
    pub dsn: Option<String>,
}

impl Secrets {
    /// The user name and password, when both are given.
    pub fn login(&self) -> Option<(&str, &str)> {
        Some((self.username.as_deref()?, self.password.as_deref()?))
    }
}

impl Credentials {
    pub fn is_empty(&self) -> bool {
        *self == Credentials::default()
    }

    /// Reads the variables; the error names the first one that is not set.
    pub fn read(&self) -> Result<Secrets, String> {
        let get = |field: &str, name: &Option<String>| -> Result<Option<String>, String> {
            match name {
                None => Ok(None),
                Some(n) => std::env::var(n).map(Some).map_err(|_| {
                    format!(
                        "environment variable `{n}` (destination.{field}) is not set; export it before the drill"
                    )
                }),
            }
        };
        Ok(Secrets {
            username: get("credentials.username_env", &self.username_env)?,
            password: get("credentials.password_env", &self.password_env)?,
            sasl_mechanism: self.sasl_mechanism.clone(),
            dsn: get("dsn_env", &self.dsn_env)?,
        })
    }
}
