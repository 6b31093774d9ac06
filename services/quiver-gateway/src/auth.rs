//! API keys: each key grants read, write (implies read) or admin (implies all).
//! Keys are compared in constant time. With no keys configured, auth is off.

use constant_time_eq::constant_time_eq;

/// What a request needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
    Admin,
}

impl Access {
    /// Returns the lowercase name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Admin => "admin",
        }
    }
}

/// The configured keys.
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: Vec<(Vec<u8>, Access)>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a key.
        write!(formatter, "ApiKeys({} keys)", self.keys.len())
    }
}

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// No key, or an unknown key.
    Unauthenticated,
    /// A known key without the needed access.
    PermissionDenied(Access),
}

impl ApiKeys {
    /// Returns the keys from comma-separated lists per access level.
    pub fn new(read: &[String], write: &[String], admin: &[String]) -> Self {
        let mut keys = Vec::new();
        for (list, access) in [
            (read, Access::Read),
            (write, Access::Write),
            (admin, Access::Admin),
        ] {
            for key in list
                .iter()
                .map(|key| key.trim())
                .filter(|key| !key.is_empty())
            {
                keys.push((key.as_bytes().to_vec(), access));
            }
        }
        ApiKeys { keys }
    }

    /// Tells whether auth is on.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Checks a presented key against the access a request needs.
    pub fn check(&self, presented: Option<&str>, needed: Access) -> Result<(), Denied> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(presented) = presented else {
            return Err(Denied::Unauthenticated);
        };
        // Compare against every key (no early exit) so timing reveals nothing.
        let mut granted: Option<Access> = None;
        for (key, access) in &self.keys {
            if constant_time_eq(key, presented.as_bytes()) {
                granted = granted.max(Some(*access));
            }
        }
        match granted {
            None => Err(Denied::Unauthenticated),
            Some(access) if access >= needed => Ok(()),
            Some(_) => Err(Denied::PermissionDenied(needed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_grant_their_level_and_below() {
        let keys = ApiKeys::new(&["r".into()], &["w".into()], &["a".into()]);
        assert_eq!(keys.check(Some("r"), Access::Read), Ok(()));
        assert_eq!(
            keys.check(Some("r"), Access::Write),
            Err(Denied::PermissionDenied(Access::Write))
        );
        assert_eq!(keys.check(Some("w"), Access::Read), Ok(()));
        assert_eq!(
            keys.check(Some("w"), Access::Admin),
            Err(Denied::PermissionDenied(Access::Admin))
        );
        assert_eq!(keys.check(Some("a"), Access::Admin), Ok(()));
        assert_eq!(
            keys.check(Some("x"), Access::Read),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(keys.check(None, Access::Read), Err(Denied::Unauthenticated));
        assert_eq!(ApiKeys::default().check(None, Access::Admin), Ok(()));
        assert!(!format!("{keys:?}").contains('w'), "keys never printed");
    }
}
