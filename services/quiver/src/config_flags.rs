//! Flags set in the configuration file. Every top-level key of `--config FILE`
//! that names a flag of the role (`data_dir = "/data"` for `--data-dir`,
//! `cache_size = "10GiB"` for `--cache-size`) is applied as that flag's
//! `QUIVER_*` variable when the variable is not set, before the command line is
//! parsed — so flags win over variables, which win over the file, as for every
//! other key. Tables (`[indexer]`, …) are the file's own sections; a top-level
//! key that is neither is refused by the file's parser.

use std::ffi::{OsStr, OsString};

use clap::CommandFactory;

use crate::Cli;

/// The role named on the command line and the config file it gives
/// (`--config FILE`, `--config=FILE`, or `QUIVER_CONFIG`), if any.
fn role_and_config(args: &[OsString]) -> Option<(String, OsString)> {
    let position = args
        .iter()
        .skip(1)
        .position(|arg| !arg.to_string_lossy().starts_with('-'))?
        + 1;
    let role = args[position].to_string_lossy().into_owned();
    let mut rest = args[position + 1..].iter();
    let mut config = None;
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        if text == "--config" {
            config = rest.next().cloned();
        } else if let Some(value) = text.strip_prefix("--config=") {
            config = Some(OsString::from(value));
        }
    }
    let config = config.or_else(|| std::env::var_os("QUIVER_CONFIG"))?;
    Some((role, config))
}

/// The flags of `role` a config file may set: (key, variable), e.g.
/// (`data_dir`, `QUIVER_DATA_DIR`).
pub(crate) fn file_flags(role: &str) -> Vec<(String, OsString)> {
    let command = Cli::command();
    let Some(role) = command.find_subcommand(role) else {
        return Vec::new();
    };
    role.get_arguments()
        .filter(|arg| arg.get_id() != "config")
        .filter_map(|arg| {
            let key = arg.get_long()?.replace('-', "_");
            Some((key, arg.get_env()?.to_os_string()))
        })
        .collect()
}

/// A key's value as the flag takes it: text as it is, numbers and booleans
/// written out, a list joined by commas. Tables are sections, not flags.
pub(crate) fn flag_value(value: &toml::Value) -> Option<String> {
    Some(match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Integer(number) => number.to_string(),
        toml::Value::Float(number) => number.to_string(),
        toml::Value::Boolean(flag) => flag.to_string(),
        toml::Value::Array(values) => values
            .iter()
            .map(flag_value)
            .collect::<Option<Vec<_>>>()?
            .join(","),
        toml::Value::Datetime(_) | toml::Value::Table(_) => return None,
    })
}

/// Sets the variables of the flags the config file gives (see the module
/// documentation) and returns their keys. Runs before any other thread
/// starts. A file that cannot be read or parsed is left alone here: reading it
/// for the role reports why.
pub(crate) fn apply_file_flags() -> Vec<String> {
    let mut applied = Vec::new();
    let args: Vec<OsString> = std::env::args_os().collect();
    let Some((role, config)) = role_and_config(&args) else {
        return applied;
    };
    let Ok(text) = std::fs::read_to_string(&config) else {
        return applied;
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return applied;
    };
    for (key, variable) in file_flags(&role) {
        let Some(value) = table.get(&key).and_then(flag_value) else {
            continue;
        };
        if std::env::var_os(&variable).is_none() {
            // SAFETY: called at the top of `main`, before the runtime or any
            // other thread exists, so nothing reads the environment meanwhile.
            unsafe { std::env::set_var(&variable, OsStr::new(&value)) };
            applied.push(key);
        }
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_role_and_its_config_file_are_found_in_either_form() {
        for form in [
            args(&[
                "quiver",
                "standalone",
                "--config",
                "q.toml",
                "--data-dir",
                "d",
            ]),
            args(&["quiver", "standalone", "--data-dir", "d", "--config=q.toml"]),
        ] {
            let (role, config) = role_and_config(&form).unwrap();
            assert_eq!(role, "standalone");
            assert_eq!(config, OsString::from("q.toml"));
        }
    }

    #[test]
    fn every_flag_with_a_variable_is_a_file_key_of_its_role() {
        let standalone = file_flags("standalone");
        for (key, variable) in [
            ("data_dir", "QUIVER_DATA_DIR"),
            ("grpc_listen", "QUIVER_GRPC_LISTEN"),
            ("cache_size", "QUIVER_CACHE_SIZE"),
            ("http_listen", "QUIVER_HTTP_LISTEN"),
        ] {
            assert!(
                standalone.contains(&(key.to_string(), OsString::from(variable))),
                "{key} in {standalone:?}"
            );
        }
        assert!(!standalone.iter().any(|(key, _)| key == "config"));
        let searcher = file_flags("searcher");
        assert!(searcher.iter().any(|(key, _)| key == "meta"));
        assert!(searcher.iter().any(|(key, _)| key == "cache_dir"));
        assert!(file_flags("no-such-role").is_empty());
    }

    #[test]
    fn values_are_written_as_the_flags_take_them() {
        let table: toml::Table =
            "a = \"10GiB\"\nb = 3\nc = true\nd = [\"x:1\", \"y:2\"]\n[e]\nf = 1\n"
                .parse()
                .unwrap();
        assert_eq!(flag_value(&table["a"]).as_deref(), Some("10GiB"));
        assert_eq!(flag_value(&table["b"]).as_deref(), Some("3"));
        assert_eq!(flag_value(&table["c"]).as_deref(), Some("true"));
        assert_eq!(flag_value(&table["d"]).as_deref(), Some("x:1,y:2"));
        assert_eq!(flag_value(&table["e"]), None);
    }
}
