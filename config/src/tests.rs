//! Unit tests of the whole crate.

use crate::models::{builtin_models, normalize};
use crate::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// An `env` lookup over fixed pairs.
fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k: &str| map.get(k).cloned()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&p, text).unwrap();
    p
}

fn parse(text: &str) -> Result<Loaded, ConfigError> {
    Config::from_json(text, Path::new("/etc/test.json"))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

// ---------------------------------------------------------------- defaults

#[test]
fn defaults_match_the_spec() {
    let c = Config::default();
    assert_eq!(c.listen, addr("127.0.0.1:8787"));
    assert_eq!(c.data_dir, None);
    assert_eq!(c.anthropic_upstream(), "https://api.anthropic.com");
    assert_eq!(c.openai_upstream(), "https://api.openai.com");
    assert_eq!(c.providers.len(), 2);
    assert!(c.ledger.enabled);
    assert_eq!(c.ledger.line_spec(), LineSpec::Percent(40.0));
    assert_eq!(c.ledger.block_spec(), BlockSpec::PercentOfLine(70.0));
    assert_eq!(c.ledger.merge.model, None);
    assert_eq!(c.retention.days, 7);
    assert_eq!(c.limits.max_body_bytes, 64 * 1024 * 1024);
    assert_eq!(c.limits.connect_timeout_ms, 10_000);
    assert_eq!(c.limits.response_header_timeout_ms, 600_000);
    assert_eq!(c.limits.idle_stream_timeout_ms, 600_000);
    assert_eq!(
        c.limits.connect_timeout(),
        std::time::Duration::from_secs(10)
    );
    assert_eq!(c.writer.queue_capacity, 65_536);
    assert_eq!(c.writer.queue_bytes, 64 << 20);
    assert_eq!(c.writer.batch_max, 512);
    assert_eq!(c.log_filter(), "info");
    assert!(!c.access.allow_remote);
    assert!(c.access.allowed_hosts.is_empty());
    assert_eq!(c.limits.max_connections, 512);
    assert_eq!(c.limits.max_bodies_in_flight_bytes, 128 << 20);
    assert_eq!(
        c.limits.header_read_timeout(),
        std::time::Duration::from_secs(30)
    );
    assert_eq!(
        c.limits.keepalive_timeout(),
        std::time::Duration::from_secs(90)
    );
    assert_eq!(
        c.limits.upstream_pool_idle_timeout(),
        std::time::Duration::from_secs(90)
    );
    c.validate().unwrap();
}

#[test]
fn access_and_the_new_limits_load_and_are_checked() {
    let l = parse(
        r#"{"access":{"allow_remote":true,"allowed_hosts":["build-box"]},
            "limits":{"max_connections":8,"header_read_timeout_ms":500,"body_read_timeout_ms":600,
                      "keepalive_timeout_ms":700,"upstream_pool_idle_timeout_ms":800,
                      "max_bodies_in_flight_bytes":100000000,"max_recorded_response_bytes":1000,
                      "max_decoded_response_bytes":2000}}"#,
    )
    .unwrap();
    let c = &l.config;
    c.validate().unwrap();
    assert!(c.access.allow_remote);
    assert_eq!(c.access.allowed_hosts, ["build-box"]);
    assert_eq!(c.limits.max_connections, 8);
    assert_eq!(c.limits.body_read_timeout_ms, 600);
    assert_eq!(c.limits.max_decoded_response_bytes, 2000);
    for (bad, key) in [
        (
            r#"{"limits":{"max_connections":0}}"#,
            "limits.max_connections",
        ),
        (
            r#"{"limits":{"max_bodies_in_flight_bytes":10}}"#,
            "limits.max_bodies_in_flight_bytes",
        ),
        (
            r#"{"access":{"allowed_hosts":["http://x"]}}"#,
            "access.allowed_hosts",
        ),
        (
            r#"{"access":{"allowed_hosts":["x:80"]}}"#,
            "access.allowed_hosts",
        ),
    ] {
        let e = parse(bad).unwrap().config.validate().unwrap_err();
        assert!(e.to_string().contains(key), "{bad}: {e}");
    }
    assert!(
        parse(r#"{"access":{"allow":true}}"#).is_err(),
        "unknown keys are refused"
    );
}

#[test]
fn empty_and_blank_files_are_the_defaults() {
    assert_eq!(parse("{}").unwrap().config, Config::default());
    let l = parse("  \n").unwrap();
    assert_eq!(l.config, Config::default());
    assert!(l.warnings.is_empty());
    assert_eq!(l.source.as_deref(), Some(Path::new("/etc/test.json")));
}

#[test]
fn load_without_file_or_env_gives_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let l = Config::load(None, &env_of(&[("HOME", home)])).unwrap();
    assert_eq!(l.config, Config::default());
    assert_eq!(l.source, None);
    assert!(l.warnings.is_empty());
}

#[test]
fn every_key_parses() {
    let l = parse(
        r#"{
          "listen": "0.0.0.0:9000",
          "data_dir": "/var/lib/oc",
          "providers": {
            "anthropic": {"upstream": "http://127.0.0.1:7000",
                          "models": [{"id": "claude-x", "context_window": 300000, "max_output": 20000,
                                      "price": {"input": 1, "output": 2, "cache_read": 0.1, "cache_write": 1.25}}]},
            "local": {"upstream": "http://localhost:1234"}
          },
          "ledger": {"enabled": false,
                     "tideline": {"percent": 55, "block": "35%"},
                     "merge": {"model": "claude-haiku-5-5"}},
          "retention": {"days": 0},
          "limits": {"max_body_bytes": 1000, "connect_timeout_ms": 1, "response_header_timeout_ms": 2,
                     "idle_stream_timeout_ms": 3},
          "writer": {"queue_capacity": 10, "batch_max": 5},
          "log": "debug"
        }"#,
    )
    .unwrap();
    let c = &l.config;
    c.validate().unwrap();
    assert_eq!(c.listen, addr("0.0.0.0:9000"));
    assert_eq!(c.data_dir.as_deref(), Some(Path::new("/var/lib/oc")));
    assert_eq!(c.anthropic_upstream(), "http://127.0.0.1:7000");
    assert_eq!(
        c.openai_upstream(),
        "https://api.openai.com",
        "openai kept by default"
    );
    assert_eq!(c.upstream("local"), Some("http://localhost:1234"));
    let m = c.model_config("claude-x").unwrap();
    assert_eq!(m.context_window, Some(300_000));
    assert_eq!(m.max_output, Some(20_000));
    assert!(!c.ledger.enabled);
    assert_eq!(c.ledger.line_spec(), LineSpec::Percent(55.0));
    assert_eq!(c.ledger.block_spec(), BlockSpec::PercentOfLine(35.0));
    assert_eq!(c.ledger.merge.model.as_deref(), Some("claude-haiku-5-5"));
    assert_eq!(c.retention.days, 0);
    assert_eq!(c.limits.max_body_bytes, 1000);
    assert_eq!(c.limits.idle_stream_timeout_ms, 3);
    assert_eq!(c.writer.batch_max, 5);
    assert_eq!(c.log_filter(), "debug");
}

#[test]
fn serialization_round_trips() {
    let mut c = parse(r#"{"ledger":{"tideline":{"tokens":"500k","block":"35%"}},"log":"warn"}"#)
        .unwrap()
        .config;
    c.data_dir = Some("/tmp/x".into());
    let text = serde_json::to_string_pretty(&c).unwrap();
    assert!(
        text.contains("\"35%\""),
        "block written as it is read: {text}"
    );
    assert_eq!(parse(&text).unwrap().config, c);
    let text = serde_json::to_string(&Config::default()).unwrap();
    assert_eq!(parse(&text).unwrap().config, Config::default());
}

// ---------------------------------------------------------------- layering

#[test]
fn the_database_is_sqlite_or_a_postgres_url_from_file_env_or_flag() {
    let c = Config::default();
    assert_eq!(c.ledger.database, "sqlite");
    assert_eq!(c.ledger.postgres_url(), None);
    assert_eq!(c.ledger.lease_ms, 10_000);
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.json",
        r#"{"ledger":{"database":"postgres://oc@db1:5432/ledger","lease_ms":5000}}"#,
    );
    let l = Config::load(Some(&file), &no_env).unwrap();
    assert_eq!(
        l.config.ledger.postgres_url(),
        Some("postgres://oc@db1:5432/ledger")
    );
    assert_eq!(l.config.ledger.lease_ms, 5000);
    let env = env_of(&[("OCEANCODE_DATABASE_URL", "postgresql://oc@db2/ledger")]);
    let mut l = Config::load(Some(&file), &env).unwrap();
    assert_eq!(l.config.ledger.database, "postgresql://oc@db2/ledger");
    l.config.apply(&Overrides {
        database: Some("sqlite".into()),
        ..Overrides::default()
    });
    assert_eq!(l.config.ledger.postgres_url(), None);
    l.config.validate().unwrap();
    // Anything else is refused, naming where it came from.
    let env = env_of(&[("OCEANCODE_DATABASE_URL", "mysql://x")]);
    let err = Config::load(None, &env).unwrap_err().to_string();
    assert!(err.contains("OCEANCODE_DATABASE_URL"), "{err}");
    let err = parse(r#"{"ledger":{"database":"/tmp/x.db"}}"#)
        .and_then(|l| l.config.validate().map(|_| l))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ledger.database"), "{err}");
    let err = parse(r#"{"ledger":{"lease_ms":10}}"#)
        .and_then(|l| l.config.validate().map(|_| l))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ledger.lease_ms"), "{err}");
}

#[test]
fn env_overrides_file_and_flags_override_env() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.json",
        r#"{"listen":"127.0.0.1:1111","ledger":{"tideline":{"percent":50}},"retention":{"days":3},"log":"warn"}"#,
    );
    // File only.
    let l = Config::load(Some(&file), &no_env).unwrap();
    assert_eq!(l.source.as_deref(), Some(file.as_path()));
    assert_eq!(l.config.listen, addr("127.0.0.1:1111"));
    assert_eq!(l.config.ledger.line_spec(), LineSpec::Percent(50.0));
    assert_eq!(l.config.retention.days, 3);

    // Env over file.
    let env = env_of(&[
        ("OCEANCODE_LISTEN", "127.0.0.1:2222"),
        ("OCEANCODE_TIDELINE", "500k"),
        ("OCEANCODE_TIDELINE_BLOCK", "20k"),
        ("OCEANCODE_RETENTION_DAYS", "0"),
        ("OCEANCODE_LOG", "oceancode=trace"),
        ("OCEANCODE_DATA_DIR", "/data/env"),
        ("OCEANCODE_ANTHROPIC_UPSTREAM", "http://127.0.0.1:3333"),
        ("OCEANCODE_OPENAI_UPSTREAM", "https://openai.example.com/v"),
    ]);
    let mut l = Config::load(Some(&file), &env).unwrap();
    let c = &l.config;
    assert_eq!(c.listen, addr("127.0.0.1:2222"));
    assert_eq!(c.ledger.line_spec(), LineSpec::Tokens(500_000));
    assert_eq!(c.ledger.block_spec(), BlockSpec::Tokens(20_000));
    assert_eq!(c.retention.days, 0);
    assert_eq!(c.log_filter(), "oceancode=trace");
    assert_eq!(c.data_dir.as_deref(), Some(Path::new("/data/env")));
    assert_eq!(c.anthropic_upstream(), "http://127.0.0.1:3333");
    assert_eq!(c.openai_upstream(), "https://openai.example.com/v");

    // Flags over env.
    l.config.apply(&Overrides {
        listen: Some(addr("127.0.0.1:4444")),
        data_dir: Some("/data/flag".into()),
        anthropic_upstream: Some("http://[::1]:5555".into()),
        openai_upstream: Some("http://localhost:6666".into()),
        tideline: Some(LineSpec::Percent(30.0)),
        compress: None,
        allow_remote: true,
        recall_tool: true,
        database: None,
        ..Overrides::default()
    });
    let c = &l.config;
    c.validate().unwrap();
    assert!(c.access.allow_remote);
    assert!(c.ledger.recall_tool.enabled);
    assert_eq!(c.listen, addr("127.0.0.1:4444"));
    assert_eq!(c.data_dir.as_deref(), Some(Path::new("/data/flag")));
    assert_eq!(c.anthropic_upstream(), "http://[::1]:5555");
    assert_eq!(c.openai_upstream(), "http://localhost:6666");
    assert_eq!(c.ledger.line_spec(), LineSpec::Percent(30.0));
    assert_eq!(
        c.ledger.tideline.tokens, None,
        "a percent flag clears the env tokens"
    );
    // Untouched keys keep the lower layers.
    assert_eq!(c.retention.days, 0);
}

#[test]
fn empty_overrides_and_empty_env_values_change_nothing() {
    let mut c = Config::default();
    c.apply(&Overrides::default());
    assert_eq!(c, Config::default());
    let env = env_of(&[("OCEANCODE_TIDELINE", ""), ("OCEANCODE_LISTEN", "  ")]);
    c.apply_env(&env).unwrap();
    assert_eq!(c, Config::default());
}

#[test]
fn config_file_discovery_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let home = root.join("home");
    let xdg = root.join("xdg");
    let home_s = home.to_str().unwrap();
    let xdg_s = xdg.to_str().unwrap();
    let home_file = write(
        &home,
        ".config/oceancode-proxy/config.json",
        r#"{"retention":{"days":1}}"#,
    );
    let xdg_file = write(
        &xdg,
        "oceancode-proxy/config.json",
        r#"{"retention":{"days":2}}"#,
    );
    let env_file = write(root, "env.json", r#"{"retention":{"days":3}}"#);
    let arg_file = write(root, "arg.json", r#"{"retention":{"days":4}}"#);
    let env_s = env_file.to_str().unwrap();

    let days = |file: Option<&Path>, env: &dyn Fn(&str) -> Option<String>| {
        let l = Config::load(file, env).unwrap();
        (l.config.retention.days, l.source)
    };
    // $HOME/.config when XDG_CONFIG_HOME is unset.
    assert_eq!(
        days(None, &env_of(&[("HOME", home_s)])),
        (1, Some(home_file))
    );
    // $XDG_CONFIG_HOME wins over $HOME.
    let env = env_of(&[("HOME", home_s), ("XDG_CONFIG_HOME", xdg_s)]);
    assert_eq!(days(None, &env), (2, Some(xdg_file.clone())));
    // A relative XDG_CONFIG_HOME is ignored (XDG spec).
    let env = env_of(&[("HOME", home_s), ("XDG_CONFIG_HOME", "rel/xdg")]);
    assert_eq!(days(None, &env).0, 1);
    // OCEANCODE_CONFIG wins over the default path.
    let env = env_of(&[
        ("HOME", home_s),
        ("XDG_CONFIG_HOME", xdg_s),
        ("OCEANCODE_CONFIG", env_s),
    ]);
    assert_eq!(days(None, &env), (3, Some(env_file.clone())));
    // The argument wins over OCEANCODE_CONFIG.
    assert_eq!(days(Some(&arg_file), &env), (4, Some(arg_file.clone())));
    // A missing default file is simply no file.
    let env = env_of(&[("HOME", root.join("nohome").to_str().unwrap())]);
    assert_eq!(days(None, &env), (7, None));
    assert_eq!(find_config_file(&env), None);
    assert_eq!(
        default_config_path(&env),
        Some(root.join("nohome/.config/oceancode-proxy/config.json"))
    );
}

#[test]
fn a_named_file_that_is_missing_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let env = env_of(&[("OCEANCODE_CONFIG", missing.to_str().unwrap())]);
    let err = Config::load(None, &env).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Read { path, .. } if path == &missing),
        "{err:?}"
    );
    assert!(err.to_string().contains("nope.json"), "{err}");
    let err = Config::load(Some(&missing), &no_env).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
}

#[test]
fn resolve_layers_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.json",
        r#"{"ledger":{"tideline":{"tokens":5000}}}"#,
    );
    let err = Config::resolve(Some(&file), &no_env, &Overrides::default()).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, .. } if key == "ledger.tideline.tokens"),
        "{err:?}"
    );
    // A flag can repair what a lower layer got wrong.
    let o = Overrides {
        tideline: Some(LineSpec::Tokens(300_000)),
        ..Overrides::default()
    };
    let l = Config::resolve(Some(&file), &no_env, &o).unwrap();
    assert_eq!(l.config.ledger.line_spec(), LineSpec::Tokens(300_000));
}

// ---------------------------------------------------------------- env errors

#[test]
fn bad_env_values_name_the_variable() {
    for (var, value) in [
        ("OCEANCODE_LISTEN", "localhost"),
        ("OCEANCODE_TIDELINE", "5k"),
        ("OCEANCODE_TIDELINE", "abc"),
        ("OCEANCODE_TIDELINE", "150%"),
        ("OCEANCODE_TIDELINE_BLOCK", "0"),
        ("OCEANCODE_RETENTION_DAYS", "-1"),
        ("OCEANCODE_ANTHROPIC_UPSTREAM", "http://example.com"),
        ("OCEANCODE_OPENAI_UPSTREAM", "api.openai.com"),
        ("OCEANCODE_CONTEXT_TOKENS", "lots"),
        ("OCEANCODE_CONTEXT_TOKENS", "40%"),
        ("OCEANCODE_CONTEXT_TOKENS", "0"),
    ] {
        let err = Config::load(None, &env_of(&[(var, value)])).unwrap_err();
        match &err {
            ConfigError::Env {
                var: v, value: got, ..
            } => {
                assert_eq!(v, var);
                assert_eq!(got, value);
            }
            other => panic!("{var}={value}: expected an Env error, got {other:?}"),
        }
        assert!(err.to_string().contains(var), "{err}");
    }
}

#[test]
fn env_tideline_zero_means_model_ceiling() {
    let l = Config::load(None, &env_of(&[("OCEANCODE_TIDELINE", "0")])).unwrap();
    assert_eq!(l.config.ledger.line_spec(), LineSpec::Tokens(0));
    l.config.validate().unwrap();
    let l = Config::load(None, &env_of(&[("OCEANCODE_TIDELINE", "40%")])).unwrap();
    assert_eq!(l.config.ledger.line_spec(), LineSpec::Percent(40.0));
}

// ---------------------------------------------------------------- aliases and removed keys

#[test]
fn shelve_and_window_are_aliases_of_tideline() {
    for alias in ["tideline", "shelve", "window"] {
        let text = format!(r#"{{"ledger":{{"{alias}":{{"percent":55,"block":20000}}}}}}"#);
        let c = parse(&text).unwrap().config;
        assert_eq!(c.ledger.line_spec(), LineSpec::Percent(55.0), "{alias}");
        assert_eq!(c.ledger.block_spec(), BlockSpec::Tokens(20_000), "{alias}");
    }
    // Two spellings of the same key are a conflict.
    let err =
        parse(r#"{"ledger":{"tideline":{"percent":50},"window":{"percent":60}}}"#).unwrap_err();
    assert!(err.to_string().contains("duplicate field"), "{err}");
}

#[test]
fn removed_keys_load_with_one_warning() {
    let l = parse(
        r#"{"ledger":{"low":0.3,"profile":"wide",
                      "tideline":{"percent":45,"hard_tokens":900000,"reserve":{"x":1}}}}"#,
    )
    .unwrap();
    assert_eq!(
        l.warnings,
        vec![
            "config: ignoring removed keys ledger.low, ledger.profile, ledger.tideline.reserve, \
              ledger.tideline.hard_tokens (the band geometry was removed; see ledger.tideline)"
                .to_string()
        ]
    );
    // The removed keys have no effect.
    let mut expected = Config::default();
    expected.ledger.tideline.percent = Some(45.0);
    assert_eq!(l.config, expected);

    let l = parse(r#"{"ledger":{"window":{"low":1}}}"#).unwrap();
    assert_eq!(
        l.warnings,
        vec!["config: ignoring removed key ledger.tideline.low (the band geometry was removed; see ledger.tideline)"
            .to_string()]
    );
    let l = parse(r#"{"ledger":{"reserve":null}}"#).unwrap();
    assert_eq!(l.warnings.len(), 1, "even a null value is reported");
    assert!(l.warnings[0].contains("ledger.reserve"));
}

#[test]
fn removed_keys_are_only_accepted_inside_ledger() {
    let err = parse(r#"{"low": 1}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `low`"), "{err}");
    let err = parse(r#"{"retention":{"profile":"x"}}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `profile`"), "{err}");
}

// ---------------------------------------------------------------- unknown keys and parse errors

#[test]
fn an_unknown_key_is_answered_with_the_keys_to_use_not_the_removed_ones() {
    for bad in [
        r#"{"ledger": {"bogus": 1}}"#,
        r#"{"ledger": {"tideline": {"bogus": 1}}}"#,
    ] {
        let e = parse(bad).unwrap_err().to_string();
        assert!(
            e.contains("unknown field `bogus`, expected one of `"),
            "{e}"
        );
        for removed in ["`low`", "`reserve`", "`profile`", "`hard_tokens`"] {
            assert!(!e.contains(removed), "{bad}: {e}");
        }
    }
    let e = parse(r#"{"ledger": {"bogus": 1}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`compress`") && e.contains("`tideline`"), "{e}");
}

#[test]
fn unknown_keys_are_errors_naming_the_key_and_position() {
    let err = parse("{\n  \"ledger\": {\n    \"tidelin\": {}\n  }\n}").unwrap_err();
    match &err {
        ConfigError::Parse {
            path,
            line,
            column,
            message,
        } => {
            assert_eq!(path, Path::new("/etc/test.json"));
            assert_eq!(*line, 3);
            assert!(*column > 0);
            assert!(message.contains("unknown field `tidelin`"), "{message}");
            assert!(
                !message.contains(" at line "),
                "position is not repeated: {message}"
            );
        }
        other => panic!("expected Parse, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(shown.starts_with("config: /etc/test.json:3:"), "{shown}");

    for (text, key) in [
        (r#"{"listn":"127.0.0.1:1"}"#, "listn"),
        (r#"{"providers":{"openai":{"url":"https://x"}}}"#, "url"),
        (
            r#"{"providers":{"openai":{"models":[{"id":"m","window":5}]}}}"#,
            "window",
        ),
        (r#"{"ledger":{"tideline":{"percentage":50}}}"#, "percentage"),
        (r#"{"ledger":{"merge":{"enabled":true}}}"#, "enabled"),
        (r#"{"limits":{"timeout":1}}"#, "timeout"),
        (r#"{"writer":{"threads":1}}"#, "threads"),
    ] {
        let err = parse(text).unwrap_err();
        assert!(
            err.to_string().contains(&format!("unknown field `{key}`")),
            "{text}: {err}"
        );
    }
}

#[test]
fn bad_values_are_parse_errors() {
    for text in [
        r#"{"listen":"localhost:80"}"#,
        r#"{"retention":{"days":"x"}}"#,
        r#"{"retention":{"days":-1}}"#,
        r#"{"ledger":{"tideline":{"tokens":"40%"}}}"#,
        r#"{"ledger":{"tideline":{"tokens":-5}}}"#,
        r#"{"ledger":{"tideline":{"tokens":1.5}}}"#,
        r#"{"ledger":{"tideline":{"tokens":"lots"}}}"#,
        r#"{"ledger":{"tideline":{"block":"0"}}}"#,
        r#"{"ledger":{"tideline":{"block":true}}}"#,
        r#"{"providers":{"openai":{"models":[{"context_window":5}]}}}"#,
        r#"{"ledger": "#,
        r#"[1,2]"#,
    ] {
        let err = parse(text).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{text}: {err:?}");
    }
}

// ---------------------------------------------------------------- tideline keys

#[test]
fn tideline_tokens_and_block_forms() {
    let t = |text: &str| parse(text).unwrap().config.ledger.tideline;
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"tokens":"500k"}}}"#).tokens,
        Some(500_000)
    );
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"tokens":"1.5m"}}}"#).tokens,
        Some(1_500_000)
    );
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"tokens":300000}}}"#).tokens,
        Some(300_000)
    );
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"tokens":3e5}}}"#).tokens,
        Some(300_000)
    );
    assert_eq!(t(r#"{"ledger":{"tideline":{"tokens":null}}}"#).tokens, None);
    // tokens wins over percent.
    let both = t(r#"{"ledger":{"tideline":{"percent":50,"tokens":"500k"}}}"#);
    assert_eq!(both.line_spec(), LineSpec::Tokens(500_000));
    // The documented example.
    let ex = t(r#"{"ledger":{"tideline":{"tokens":"500k","block":20000}}}"#);
    assert_eq!(ex.line_spec(), LineSpec::Tokens(500_000));
    assert_eq!(ex.block_spec(), BlockSpec::Tokens(20_000));
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"block":"20k"}}}"#).block,
        Some(BlockSpec::Tokens(20_000))
    );
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"block":"35%"}}}"#).block,
        Some(BlockSpec::PercentOfLine(35.0))
    );
    assert_eq!(
        t(r#"{"ledger":{"tideline":{"percent":50}}}"#).line_spec(),
        LineSpec::Percent(50.0)
    );
}

#[test]
fn validate_refuses_out_of_range_tideline() {
    let check = |text: &str| parse(text).unwrap().config.validate();
    let key_of = |r: Result<(), ConfigError>| match r {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected Invalid, got {other:?}"),
    };
    // Fixed tokens below 20k are refused, except 0 (the model ceiling).
    assert_eq!(
        key_of(check(r#"{"ledger":{"tideline":{"tokens":19999}}}"#)),
        "ledger.tideline.tokens"
    );
    assert_eq!(
        key_of(check(r#"{"ledger":{"tideline":{"tokens":"5k"}}}"#)),
        "ledger.tideline.tokens"
    );
    check(r#"{"ledger":{"tideline":{"tokens":0}}}"#).unwrap();
    check(r#"{"ledger":{"tideline":{"tokens":20000}}}"#).unwrap();
    assert_eq!(
        key_of(check(r#"{"ledger":{"tideline":{"percent":0}}}"#)),
        "ledger.tideline.percent"
    );
    assert_eq!(
        key_of(check(r#"{"ledger":{"tideline":{"percent":101}}}"#)),
        "ledger.tideline.percent"
    );
    check(r#"{"ledger":{"tideline":{"percent":100}}}"#).unwrap();
    assert_eq!(
        key_of(check(r#"{"ledger":{"tideline":{"block":0}}}"#)),
        "ledger.tideline.block"
    );
    assert_eq!(
        key_of(check(r#"{"ledger":{"merge":{"model":""}}}"#)),
        "ledger.merge.model"
    );
    for bad in ["", "1KEY", "MY-KEY", "KEY NAME"] {
        let text = format!(r#"{{"ledger":{{"merge":{{"model":"m","api_key_env":"{bad}"}}}}}}"#);
        assert_eq!(key_of(check(&text)), "ledger.merge.api_key_env", "{bad:?}");
    }
    check(r#"{"ledger":{"merge":{"model":"m","api_key_env":"MY_MERGE_KEY_2"}}}"#).unwrap();
    assert_eq!(
        key_of(check(r#"{"limits":{"connect_timeout_ms":0}}"#)),
        "limits.connect_timeout_ms"
    );
    assert_eq!(
        key_of(check(r#"{"limits":{"max_body_bytes":0}}"#)),
        "limits.max_body_bytes"
    );
    assert_eq!(
        key_of(check(r#"{"writer":{"queue_capacity":0}}"#)),
        "writer.queue_capacity"
    );
    assert_eq!(
        key_of(check(r#"{"writer":{"queue_bytes":0}}"#)),
        "writer.queue_bytes"
    );
    assert_eq!(
        key_of(check(r#"{"writer":{"queue_capacity":10,"batch_max":11}}"#)),
        "writer.batch_max"
    );
    assert_eq!(key_of(check(r#"{"log":" "}"#)), "log");
    assert_eq!(
        key_of(check(
            r#"{"providers":{"openai":{"models":[{"id":"m","context_window":100,"max_output":100}]}}}"#
        )),
        "providers.openai.models[0].max_output"
    );
    assert_eq!(
        key_of(check(
            r#"{"providers":{"openai":{"models":[{"id":"m","price":{"input":-1,"output":1}}]}}}"#
        )),
        "providers.openai.models[0].price.input"
    );
    assert_eq!(
        key_of(check(r#"{"providers":{"openai":{"models":[{"id":" "}]}}}"#)),
        "providers.openai.models[0].id"
    );
}

// ---------------------------------------------------------------- upstream URLs

#[test]
fn upstream_url_rules() {
    for ok in [
        "https://api.anthropic.com",
        "https://api.openai.com/",
        "https://gateway.example.com:8443/anthropic",
        "HTTPS://API.EXAMPLE.COM",
        "http://127.0.0.1:9000",
        "http://127.8.9.10",
        "http://localhost:1234/prefix",
        "http://LOCALHOST",
        "http://[::1]:8080",
        "https://[2001:db8::1]:443",
    ] {
        assert_eq!(check_upstream_url(ok), Ok(()), "{ok}");
    }
    for (bad, why) in [
        ("http://example.com", "loopback"),
        ("http://10.0.0.1:80", "loopback"),
        ("http://[::2]:80", "loopback"),
        ("http://128.0.0.1", "loopback"),
        ("http://localhost.evil.com", "loopback"),
        ("ftp://example.com", "scheme"),
        ("api.anthropic.com", "https://"),
        ("https://", "no host"),
        ("https://:443", "no host"),
        ("https://user:pw@example.com", "credentials"),
        ("https://example.com?x=1", "query"),
        ("https://example.com/#f", "query"),
        ("https://exa mple.com", "whitespace"),
        ("https://example.com:0", "port"),
        ("https://example.com:http", "port"),
        ("https://example.com:99999", "port"),
        ("https://[::1", "IPv6"),
        ("https://[zz::1]", "IPv6"),
        ("https://ex!ample.com", "invalid host"),
        ("", "empty"),
    ] {
        let err = check_upstream_url(bad).expect_err(bad);
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn validate_checks_upstreams_by_key() {
    let err = parse(r#"{"providers":{"openai":{"upstream":"http://api.example.com"}}}"#)
        .unwrap()
        .config
        .validate()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, message }
            if key == "providers.openai.upstream" && message.contains("loopback")),
        "{err:?}"
    );
    // A provider that is not built in needs an upstream.
    let err = parse(r#"{"providers":{"mine":{"models":[{"id":"m"}]}}}"#)
        .unwrap()
        .config
        .validate()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, .. } if key == "providers.mine.upstream"),
        "{err:?}"
    );
    // Built-in providers keep their default upstream when only models are given.
    let c = parse(
        r#"{"providers":{"anthropic":{"models":[{"id":"claude-x","context_window":150000}]}}}"#,
    )
    .unwrap()
    .config;
    c.validate().unwrap();
    assert_eq!(c.anthropic_upstream(), "https://api.anthropic.com");
    assert_eq!(c.openai_upstream(), "https://api.openai.com");
    // A flag with a bad upstream is caught by validate.
    let mut c = Config::default();
    c.apply(&Overrides {
        anthropic_upstream: Some("http://example.com".into()),
        ..Overrides::default()
    });
    assert!(c.validate().is_err());
}

// ---------------------------------------------------------------- data dir

#[test]
fn data_dir_resolution_order() {
    let full = env_of(&[
        ("OCEANCODE_DATA_DIR", "/env/data"),
        ("XDG_DATA_HOME", "/xdg"),
        ("HOME", "/home/u"),
    ]);
    assert_eq!(
        resolve_data_dir(Some(Path::new("/flag")), &full),
        PathBuf::from("/flag")
    );
    assert_eq!(resolve_data_dir(None, &full), PathBuf::from("/env/data"));
    let xdg = env_of(&[("XDG_DATA_HOME", "/xdg"), ("HOME", "/home/u")]);
    assert_eq!(
        resolve_data_dir(None, &xdg),
        PathBuf::from("/xdg/oceancode-proxy")
    );
    let home = env_of(&[("HOME", "/home/u"), ("XDG_DATA_HOME", "relative")]);
    assert_eq!(
        resolve_data_dir(None, &home),
        PathBuf::from("/home/u/.local/share/oceancode-proxy")
    );
    assert_eq!(
        resolve_data_dir(None, &no_env),
        PathBuf::from("oceancode-proxy")
    );
    assert_eq!(
        resolve_data_dir(Some(Path::new("~/oc")), &home),
        PathBuf::from("/home/u/oc")
    );
}

#[test]
fn config_data_dir_sits_between_env_and_xdg() {
    let env = env_of(&[("XDG_DATA_HOME", "/xdg"), ("HOME", "/home/u")]);
    let l = Config::load(None, &env).unwrap();
    assert_eq!(
        l.config.resolved_data_dir(&env),
        PathBuf::from("/xdg/oceancode-proxy")
    );
    let c = parse(r#"{"data_dir":"~/ledger"}"#).unwrap().config;
    assert_eq!(c.resolved_data_dir(&env), PathBuf::from("/home/u/ledger"));
    let mut c = c;
    c.apply_env(&env_of(&[("OCEANCODE_DATA_DIR", "/env")]))
        .unwrap();
    assert_eq!(c.resolved_data_dir(&env), PathBuf::from("/env"));
}

// ---------------------------------------------------------------- amounts and specs

#[test]
fn amounts_parse() {
    let a = |s: &str| s.parse::<Amount>();
    assert_eq!(a("40%"), Ok(Amount::Percent(40.0)));
    assert_eq!(a(" 12.5 % "), Ok(Amount::Percent(12.5)));
    assert_eq!(a("500k"), Ok(Amount::Tokens(500_000)));
    assert_eq!(a("500K"), Ok(Amount::Tokens(500_000)));
    assert_eq!(a("1.5m"), Ok(Amount::Tokens(1_500_000)));
    assert_eq!(a("20000"), Ok(Amount::Tokens(20_000)));
    assert_eq!(a("0"), Ok(Amount::Tokens(0)));
    assert_eq!(Amount::parse("2M"), Ok(Amount::Tokens(2_000_000)));
    for bad in [
        "", "abc", "0%", "101%", "-5", "-5k", "5x", "%", "k", "inf", "NaN",
    ] {
        assert!(a(bad).is_err(), "{bad:?} should be refused");
    }
    let e = a("abc").unwrap_err();
    assert_eq!(e.input, "abc");
    assert!(e.to_string().contains("abc"));
}

#[test]
fn line_and_block_specs_parse_and_display() {
    assert_eq!("50%".parse::<LineSpec>(), Ok(LineSpec::Percent(50.0)));
    assert_eq!("500k".parse::<LineSpec>(), Ok(LineSpec::Tokens(500_000)));
    assert_eq!("0".parse::<LineSpec>(), Ok(LineSpec::Tokens(0)));
    assert!("19999".parse::<LineSpec>().is_err());
    assert_eq!(LineSpec::Percent(40.0).to_string(), "40%");
    assert_eq!(LineSpec::Tokens(500_000).to_string(), "500000");
    assert_eq!(
        "35%".parse::<BlockSpec>(),
        Ok(BlockSpec::PercentOfLine(35.0))
    );
    assert_eq!("1k".parse::<BlockSpec>(), Ok(BlockSpec::Tokens(1_000)));
    assert!("0".parse::<BlockSpec>().is_err());
    assert_eq!(BlockSpec::PercentOfLine(70.0).to_string(), "70%");
    assert_eq!(BlockSpec::Tokens(20_000).to_string(), "20000");
}

// ---------------------------------------------------------------- models

#[test]
fn normalize_strips_suffixes() {
    let n = |s: &str| normalize(s);
    assert_eq!(n("claude-sonnet-4-5-20250929").base, "claude-sonnet-4-5");
    assert_eq!(n("gpt-4.1-2025-04-14").base, "gpt-4.1");
    assert_eq!(n("claude-sonnet-4-5@20250929").base, "claude-sonnet-4-5");
    assert_eq!(n("Claude-Opus-5-5").base, "claude-opus-5-5");
    assert_eq!(n("anthropic/claude-opus-5-5").base, "claude-opus-5-5");
    assert_eq!(n("claude-3-7-sonnet-latest").base, "claude-3-7-sonnet");
    let f = n("claude-fable-5-1[1m]");
    assert_eq!(f.base, "claude-fable-5-1");
    assert!(f.one_m);
    assert!(!n("claude-fable-5-1").one_m);
    assert_eq!(n("gpt-6.2-sol").base, "gpt-6.2-sol");
    assert_eq!(n("o3").base, "o3");
}

#[test]
fn lookup_exact_rows() {
    let opus = lookup("claude-opus-5-5").unwrap();
    assert_eq!(opus.context_window, 1_000_000);
    assert_eq!(opus.max_output, 128_000);
    assert_eq!(
        opus.price,
        Some(Price {
            input: 4.0,
            output: 20.0,
            cache_read: 0.20,
            cache_write: 5.0
        })
    );
    let sol = lookup("gpt-6.2-sol").unwrap();
    assert_eq!(sol.context_window, 1_050_000);
    assert_eq!(sol.max_output, 128_000);
    assert_eq!(sol.price.unwrap().input, 2.0);
    let codex = lookup("gpt-5-codex").unwrap();
    assert_eq!(codex.context_window, 400_000);
    assert!(codex.price.is_some());
    assert_eq!(lookup("gpt-4.1").unwrap().context_window, 1_047_576);
    assert_eq!(lookup("gpt-4o-mini").unwrap().context_window, 128_000);
    assert_eq!(lookup("claude-haiku-4-5").unwrap().context_window, 200_000);
    assert_eq!(lookup("o3").unwrap().context_window, 200_000);
    // Every row is sane.
    for (id, info) in builtin_models() {
        assert!(info.max_output < info.context_window, "{id}");
        let p = info.price.unwrap();
        assert!(p.output >= p.input && p.input >= p.cache_read, "{id}");
        assert_eq!(normalize(id).base, id, "{id} is its own key");
        assert_eq!(lookup(id), Some(info), "{id}");
    }
}

#[test]
fn lookup_strips_dates_and_honours_1m() {
    let dated = lookup("claude-sonnet-4-5-20250929").unwrap();
    assert_eq!(dated, lookup("claude-sonnet-4-5").unwrap());
    assert_eq!(dated.context_window, 200_000);
    assert_eq!(dated.price.unwrap().input, 3.0);
    assert_eq!(lookup("gpt-4.1-2025-04-14"), lookup("gpt-4.1"));
    assert_eq!(lookup("gpt-4o-mini-2024-07-18"), lookup("gpt-4o-mini"));
    // [1m]: a 1M window for Claude, same price.
    let s1m = lookup("claude-sonnet-4-5[1m]").unwrap();
    assert_eq!(s1m.context_window, 1_000_000);
    assert_eq!(s1m.price, dated.price);
    assert_eq!(
        lookup("claude-fable-5-1[1m]").unwrap().context_window,
        1_000_000
    );
    assert_eq!(
        lookup("claude-fable-5-1").unwrap().price.unwrap().input,
        10.0
    );
    assert_eq!(
        lookup("claude-unknown-9[1m]").unwrap().context_window,
        1_000_000
    );
    // The beta header is turned into the suffix.
    let beta = Some("claude-code-20250219,context-1m-2025-08-07");
    assert_eq!(
        with_context_1m("claude-sonnet-4-5", beta),
        "claude-sonnet-4-5[1m]"
    );
    assert_eq!(
        with_context_1m("claude-sonnet-4-5[1m]", beta),
        "claude-sonnet-4-5[1m]"
    );
    assert_eq!(
        with_context_1m("claude-sonnet-4-5", Some("interleaved-thinking-2025-05-14")),
        "claude-sonnet-4-5"
    );
    assert_eq!(
        with_context_1m("claude-sonnet-4-5", None),
        "claude-sonnet-4-5"
    );
    assert_eq!(
        lookup(&with_context_1m("claude-haiku-4-5", beta))
            .unwrap()
            .context_window,
        1_000_000
    );
}

#[test]
fn lookup_family_fallbacks() {
    let fam = |m: &str| lookup(m).map(|i| (i.context_window, i.price.is_some()));
    assert_eq!(fam("claude-opus-9-9"), Some((200_000, false)));
    assert_eq!(fam("claude-sonnet-4-5-thinking"), Some((200_000, false)));
    assert_eq!(fam("gpt-6.9-nova"), Some((400_000, false)));
    assert_eq!(fam("gpt-5.7-terra"), Some((400_000, false)));
    assert_eq!(fam("gpt-5-codex-max"), Some((400_000, false)));
    assert_eq!(fam("gpt-4.1-preview"), Some((1_047_576, false)));
    assert_eq!(fam("o3-pro"), Some((200_000, false)));
    assert_eq!(fam("o4-mini-high"), Some((200_000, false)));
    assert_eq!(fam("gpt-4o-audio-preview"), Some((128_000, false)));
    assert_eq!(fam("my-custom-model"), None);
    assert_eq!(fam("o1"), None);
    assert_eq!(fam("gpt-4"), None);
    assert_eq!(fam(""), None);
    // A [1m] suffix does not invent a window for a non-Claude model.
    assert_eq!(fam("my-custom-model[1m]"), None);
    assert_eq!(fam("gpt-5[1m]"), Some((400_000, true)));
}

#[test]
fn price_cost() {
    let p = lookup("claude-opus-5-5").unwrap().price.unwrap();
    assert!((p.cost_usd(1_000_000, 1_000_000, 0, 0) - 24.0).abs() < 1e-9);
    assert!((p.cost_usd(0, 0, 1_000_000, 0) - 0.20).abs() < 1e-9);
    assert!((p.cost_usd(0, 0, 0, 1_000_000) - 5.0).abs() < 1e-9);
    // 2k input, 500 output, 100k cache read, 10k cache write.
    let expected = (2_000.0 * 4.0 + 500.0 * 20.0 + 100_000.0 * 0.2 + 10_000.0 * 5.0) / 1e6;
    assert!((p.cost_usd(2_000, 500, 100_000, 10_000) - expected).abs() < 1e-12);
    assert_eq!(p.cost_usd(0, 0, 0, 0), 0.0);
}

#[test]
fn context_window_precedence() {
    let cfg = parse(
        r#"{"providers":{"openai":{"models":[
             {"id":"gpt-6.2-sol","context_window":500000,"max_output":64000},
             {"id":"my-custom-model","context_window":32000,
              "price":{"input":1,"output":2}}]}}}"#,
    )
    .unwrap()
    .config;
    let plain = Config::default();
    let env = env_of(&[("OCEANCODE_CONTEXT_TOKENS", "1.5m")]);

    // 1. env wins over everything.
    assert_eq!(
        context_window("gpt-6.2-sol", &cfg, &env, Some(9)),
        Some(1_500_000)
    );
    assert_eq!(
        context_window("unknown-model", &plain, &env, None),
        Some(1_500_000)
    );
    // 2. config over learned and table (any provider, id matched after normalization).
    assert_eq!(
        context_window("gpt-6.2-sol", &cfg, &no_env, Some(300_000)),
        Some(500_000)
    );
    assert_eq!(
        context_window("my-custom-model", &cfg, &no_env, None),
        Some(32_000)
    );
    assert_eq!(
        context_window("MY-CUSTOM-MODEL-20260101", &cfg, &no_env, None),
        Some(32_000)
    );
    // 3. learned over table.
    assert_eq!(
        context_window("claude-opus-5-5", &cfg, &no_env, Some(950_000)),
        Some(950_000)
    );
    // 4. table.
    assert_eq!(
        context_window("claude-opus-5-5", &cfg, &no_env, None),
        Some(1_000_000)
    );
    assert_eq!(
        context_window("gpt-6.2-sol", &plain, &no_env, None),
        Some(1_050_000)
    );
    // Unknown.
    assert_eq!(context_window("other-model", &cfg, &no_env, None), None);
    // A bad or zero env value is ignored.
    for bad in ["lots", "40%", "0", ""] {
        let env = env_of(&[("OCEANCODE_CONTEXT_TOKENS", bad)]);
        assert_eq!(
            context_window("claude-opus-5-5", &plain, &env, None),
            Some(1_000_000),
            "{bad:?}"
        );
    }

    // max_output: config, then table.
    assert_eq!(max_output("gpt-6.2-sol", &cfg), Some(64_000));
    assert_eq!(max_output("gpt-6.2-sol", &plain), Some(128_000));
    assert_eq!(
        max_output("my-custom-model", &cfg),
        None,
        "config entry without max_output, not in the table"
    );
    assert_eq!(max_output("claude-sonnet-4-5", &plain), Some(64_000));
    assert_eq!(max_output("nothing", &plain), None);

    // price: config (cache prices default to input), then table.
    let p = price("my-custom-model", &cfg).unwrap();
    assert_eq!(
        (p.input, p.output, p.cache_read, p.cache_write),
        (1.0, 2.0, 1.0, 1.0)
    );
    assert_eq!(
        price("gpt-6.2-sol", &cfg),
        lookup("gpt-6.2-sol").unwrap().price
    );
    assert_eq!(price("claude-opus-9", &plain), None);
}

// ---------------------------------------------------------------- tideline command

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn tideline_command_values() {
    let c = |s: &str| tideline_command(&words(s));
    assert_eq!(c(""), Ok(TidelineCommand::Show));
    assert_eq!(c("50%"), Ok(TidelineCommand::Set(LineSpec::Percent(50.0))));
    assert_eq!(
        c("500k"),
        Ok(TidelineCommand::Set(LineSpec::Tokens(500_000)))
    );
    assert_eq!(
        c("1.5m"),
        Ok(TidelineCommand::Set(LineSpec::Tokens(1_500_000)))
    );
    assert_eq!(
        c("20000"),
        Ok(TidelineCommand::Set(LineSpec::Tokens(20_000)))
    );
    assert_eq!(c("now"), Ok(TidelineCommand::Now));
    assert_eq!(c("NOW"), Ok(TidelineCommand::Now));
    assert_eq!(c("default"), Ok(TidelineCommand::Default));
    assert_eq!(
        c("tideline 40%"),
        Ok(TidelineCommand::Set(LineSpec::Percent(40.0)))
    );
    assert_eq!(c("tideline"), Ok(TidelineCommand::Show));
}

#[test]
fn tideline_command_usage_errors() {
    for (args, why) in [
        ("50% 500k", "one value"),
        ("now default", "one value"),
        ("wide", "removed"),
        ("narrow", "removed"),
        ("strict", "removed"),
        ("auto", "removed"),
        ("5k", "at least 20k"),
        ("19999", "at least 20k"),
        // A share written without its `%`: both readings offered.
        (
            "20",
            "20 would be 20 tokens (a fixed tideline is at least 20k): did you mean 20% (a share of the model's context) or 20k (20,000 tokens)?",
        ),
        ("100", "did you mean 100% "),
        ("101", "at least 20k"),
        ("0", "config file"),
        ("junk", "not a tideline value"),
        ("150%", "not a tideline value"),
        ("--session s1 50%", "unknown option --session"),
        ("--force", "unknown option"),
    ] {
        let err = tideline_command(&words(args)).unwrap_err();
        assert!(err.reason.contains(why), "{args}: {}", err.reason);
        assert!(!err.reason.contains('\n'), "the reason is one line");
        let shown = err.to_string();
        assert_eq!(
            shown,
            format!(
                "{}\nusage: oceancode-proxy tideline [--session S] [50% | 500k | now | default]",
                err.reason
            )
        );
        assert_eq!(shown.lines().count(), 2);
    }
    assert_eq!(
        TIDELINE_USAGE,
        "usage: oceancode-proxy tideline [--session S] [50% | 500k | now | default]"
    );
}

#[test]
fn tideline_args_with_session() {
    let a = |s: &str| tideline_args(&words(s));
    assert_eq!(
        a("--session abc 50%"),
        Ok(TidelineArgs {
            session: Some("abc".into()),
            command: TidelineCommand::Set(LineSpec::Percent(50.0))
        })
    );
    assert_eq!(
        a("now --session=abc"),
        Ok(TidelineArgs {
            session: Some("abc".into()),
            command: TidelineCommand::Now
        })
    );
    assert_eq!(
        a(""),
        Ok(TidelineArgs {
            session: None,
            command: TidelineCommand::Show
        })
    );
    for (bad, why) in [
        ("--session", "needs a session id"),
        ("--session=", "needs a session id"),
        ("--session --x", "needs a session id"),
        ("--session a --session b", "twice"),
        ("--sess a", "unknown option"),
        ("--session a wide", "removed"),
    ] {
        let err = a(bad).unwrap_err();
        assert!(err.reason.contains(why), "{bad}: {}", err.reason);
        assert!(err.to_string().ends_with(TIDELINE_USAGE));
    }
}

// ---------------------------------------------------------------- properties

proptest::proptest! {
    #[test]
    fn amount_tokens_round_trip(t in 0u64..=(1u64 << 52)) {
        let a = Amount::Tokens(t);
        proptest::prop_assert_eq!(a.to_string().parse::<Amount>(), Ok(a));
    }

    #[test]
    fn amount_k_and_m_suffixes(n in 0u64..=1_000_000_000u64) {
        proptest::prop_assert_eq!(format!("{n}k").parse::<Amount>(), Ok(Amount::Tokens(n * 1_000)));
        proptest::prop_assert_eq!(format!("{n}M").parse::<Amount>(), Ok(Amount::Tokens(n * 1_000_000)));
    }

    #[test]
    fn line_spec_tokens_round_trip(t in MIN_FIXED_LINE..=(1u64 << 52)) {
        let spec = LineSpec::Tokens(t);
        proptest::prop_assert_eq!(spec.to_string().parse::<LineSpec>(), Ok(spec));
        proptest::prop_assert_eq!(
            tideline_command(&[spec.to_string()]),
            Ok(TidelineCommand::Set(spec))
        );
    }

    #[test]
    fn config_tokens_string_and_number_agree(t in MIN_FIXED_LINE..=10_000_000u64) {
        let a = parse(&format!(r#"{{"ledger":{{"tideline":{{"tokens":{t}}}}}}}"#)).unwrap().config;
        let b = parse(&format!(r#"{{"ledger":{{"tideline":{{"tokens":"{t}"}}}}}}"#)).unwrap().config;
        proptest::prop_assert_eq!(a.ledger.line_spec(), LineSpec::Tokens(t));
        proptest::prop_assert_eq!(a, b);
    }
}

#[test]
fn documented_examples_load_and_validate() {
    let doc = include_str!("../../docs/configuration.md");
    let mut n = 0;
    for block in doc.split("```json\n").skip(1) {
        let json = block.split("```").next().unwrap_or_default();
        let l = parse(json).unwrap_or_else(|e| panic!("{e}\n{json}"));
        l.config
            .validate()
            .unwrap_or_else(|e| panic!("{e}\n{json}"));
        assert!(l.warnings.is_empty());
        n += 1;
    }
    assert_eq!(n, 5, "every JSON example was checked");
}

// ---------------------------------------------------------------- session limits

#[test]
fn session_limits_layer_file_env_flags_and_are_checked() {
    let origin = Path::new("c.json");
    let l = Config::from_json(
        r#"{"limits":{"session":{"spend_usd":2.5,"steps":40,"time":"1h30m"}}}"#,
        origin,
    )
    .unwrap();
    let b = &l.config.limits.session;
    assert_eq!(b.spend_usd, Some(2.5));
    assert_eq!(b.steps, Some(40));
    assert_eq!(b.time, Some(std::time::Duration::from_secs(5400)));
    l.config.validate().unwrap();
    // Seconds as a number; the connection bounds beside it are untouched.
    let l = Config::from_json(r#"{"limits":{"session":{"time":90}}}"#, origin).unwrap();
    assert_eq!(l.config.limits.session.time.map(|d| d.as_secs()), Some(90));
    assert_eq!(l.config.limits.max_connections, 512);
    // Written back the way it is read.
    let text = serde_json::to_string(&l.config.limits.session).unwrap();
    assert_eq!(text, r#"{"time":"1m30s"}"#);

    // Env over file, flags over env.
    let mut c = Config::from_json(r#"{"limits":{"session":{"steps":40}}}"#, origin)
        .unwrap()
        .config;
    let env = |k: &str| match k {
        "OCEANCODE_MAX_SPEND" => Some("$0.75".to_string()),
        "OCEANCODE_MAX_STEPS" => Some("12".to_string()),
        "OCEANCODE_MAX_TIME" => Some("30m".to_string()),
        _ => None,
    };
    c.apply_env(&env).unwrap();
    assert_eq!(c.limits.session.spend_usd, Some(0.75));
    assert_eq!(c.limits.session.steps, Some(12));
    assert_eq!(c.limits.session.time.map(|d| d.as_secs()), Some(1800));
    c.apply(&Overrides {
        max_steps: Some(3),
        max_time: Some(std::time::Duration::from_secs(7200)),
        ..Overrides::default()
    });
    assert_eq!(c.limits.session.steps, Some(3));
    assert_eq!(c.limits.session.spend_usd, Some(0.75));
    assert_eq!(c.limits.session.time.map(|d| d.as_secs()), Some(7200));
    c.validate().unwrap();

    // Bad values name their key or variable.
    for (json, key) in [
        (
            r#"{"limits":{"session":{"spend_usd":0}}}"#,
            "limits.session.spend_usd",
        ),
        (
            r#"{"limits":{"session":{"spend_usd":-1}}}"#,
            "limits.session.spend_usd",
        ),
        (
            r#"{"limits":{"session":{"steps":0}}}"#,
            "limits.session.steps",
        ),
        (
            r#"{"limits":{"session":{"time":"0m"}}}"#,
            "limits.session.time",
        ),
    ] {
        let err = Config::from_json(json, origin)
            .unwrap()
            .config
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{json}: {err}");
    }
    let err = Config::from_json(r#"{"limits":{"session":{"time":"soon"}}}"#, origin)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a duration"), "{err}");
    let err = Config::from_json(r#"{"limits":{"session":{"usd":1}}}"#, origin)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field"), "{err}");
    for (var, value) in [
        ("OCEANCODE_MAX_SPEND", "lots"),
        ("OCEANCODE_MAX_SPEND", "0"),
        ("OCEANCODE_MAX_STEPS", "0"),
        ("OCEANCODE_MAX_STEPS", "ten"),
        ("OCEANCODE_MAX_TIME", "2 hours"),
    ] {
        let env = |k: &str| (k == var).then(|| value.to_string());
        let err = Config::default().apply_env(&env).unwrap_err().to_string();
        assert!(err.contains(var), "{var}={value}: {err}");
    }
}

#[test]
fn recall_tool_is_a_flag_or_an_object_off_by_default() {
    let c: Config = serde_json::from_str("{}").unwrap();
    assert_eq!(c.ledger.recall_tool, RecallToolConfig::default());
    assert!(!c.ledger.recall_tool.enabled);
    assert_eq!(c.ledger.recall_tool.max_rounds, 4);
    let c: Config = serde_json::from_str(r#"{"ledger":{"recall_tool":true}}"#).unwrap();
    assert!(c.ledger.recall_tool.enabled);
    assert_eq!(c.ledger.recall_tool.max_rounds, 4);
    let c: Config =
        serde_json::from_str(r#"{"ledger":{"recall_tool":{"enabled":true,"max_rounds":2}}}"#)
            .unwrap();
    assert_eq!(c.ledger.recall_tool.max_rounds, 2);
    assert_eq!(c.ledger.recall_tool.search, RecallSearchScope::Related);
    let c: Config =
        serde_json::from_str(r#"{"ledger":{"recall_tool":{"enabled":true,"search":"all"}}}"#)
            .unwrap();
    assert_eq!(c.ledger.recall_tool.search, RecallSearchScope::All);
    assert!(serde_json::from_str::<Config>(
        r#"{"ledger":{"recall_tool":{"enabled":true,"search":"everyone"}}}"#
    )
    .is_err());
    assert!(serde_json::from_str::<Config>(r#"{"ledger":{"recall_tool":{"rounds":2}}}"#).is_err());
    let mut c = Config::default();
    c.apply_env(&|k: &str| (k == "OCEANCODE_RECALL_TOOL").then(|| "on".to_string()))
        .unwrap();
    assert!(c.ledger.recall_tool.enabled);
    assert!(c
        .apply_env(&|k: &str| (k == "OCEANCODE_RECALL_TOOL").then(|| "maybe".to_string()))
        .is_err());
    c.ledger.recall_tool.max_rounds = 0;
    assert!(c.validate().is_err());
}

#[test]
fn every_entry_point_reads_a_line_value_by_one_rule() {
    // The config file, the environment, `serve --tideline` and the
    // `tideline` command (CLI and admin API) accept and refuse the same
    // values; only 0 (the ceiling) is the config's alone.
    for (v, ok) in [
        ("40%", true),
        ("100%", true),
        ("0.0001%", false),
        ("0.2%", true),
        ("150%", false),
        ("0%", false),
        ("-5%", false),
        ("19999", false),
        ("19.9k", false),
        ("20k", true),
        ("1.5m", true),
        ("junk", false),
    ] {
        let parsed = v.parse::<LineSpec>();
        assert_eq!(parsed.is_ok(), ok, "{v}: {parsed:?}");
        let command = tideline_command(&[v.to_string()]);
        assert_eq!(command.is_ok(), ok, "tideline {v}: {command:?}");
        let mut cfg = Config::default();
        let env = env_of(&[("OCEANCODE_TIDELINE", v)]);
        let from_env = cfg.apply_env(&env);
        assert_eq!(from_env.is_ok(), ok, "OCEANCODE_TIDELINE={v}: {from_env:?}");
        if let Ok(spec) = parsed {
            let mut cfg = Config::default();
            cfg.ledger.tideline.set_line(spec);
            assert!(cfg.validate().is_ok(), "config {v}");
            assert_eq!(command, Ok(TidelineCommand::Set(spec)));
        }
    }
    assert_eq!("0".parse::<LineSpec>(), Ok(LineSpec::Tokens(0)));
    assert!(tideline_command(&["0".to_string()]).is_err());
    for (percent, tokens) in [(Some(150.0), None), (None, Some(19_999))] {
        let mut cfg = Config::default();
        cfg.ledger.tideline.percent = percent;
        cfg.ledger.tideline.tokens = tokens;
        assert!(cfg.validate().is_err(), "{percent:?} {tokens:?}");
    }
}

#[test]
fn compress_config_forms_env_and_flags() {
    let d = Config::default();
    assert!(d.ledger.compress.enabled, "on by default");
    assert_eq!(d.ledger.compress.min_tokens, 500);
    assert_eq!(d.ledger.compress.protect_tokens(80_000), 8_000);
    let c: LedgerConfig = serde_json::from_str(r#"{"compress": false}"#).unwrap();
    assert!(!c.compress.enabled);
    let c: LedgerConfig =
        serde_json::from_str(r#"{"compress": {"protect": "25%", "min_tokens": 1000}}"#).unwrap();
    assert!(c.compress.enabled);
    assert_eq!(c.compress.protect_tokens(80_000), 20_000);
    assert_eq!(c.compress.min_tokens, 1000);
    let c: LedgerConfig = serde_json::from_str(r#"{"compress": {"protect": "12k"}}"#).unwrap();
    assert_eq!(c.compress.protect_tokens(80_000), 12_000);
    // Masking first only with `free` (issue 34).
    assert!(!d.ledger.compress.first());
    assert!(!c.compress.first());
    let c: LedgerConfig = serde_json::from_str(r#"{"compress": {"free": "50%"}}"#).unwrap();
    assert!(c.compress.first());
    assert_eq!(c.compress.free_tokens(80_000), 40_000);
    let c: LedgerConfig = serde_json::from_str(r#"{"compress": {"free": "90k"}}"#).unwrap();
    assert_eq!(c.compress.free_tokens(80_000), 80_000, "at most the line");
    assert!(serde_json::from_str::<LedgerConfig>(r#"{"compress": {"protekt": 1}}"#).is_err());
    let l = Config::load(None, &env_of(&[("OCEANCODE_COMPRESS", "off")])).unwrap();
    assert!(!l.config.ledger.compress.enabled);
    assert!(Config::load(None, &env_of(&[("OCEANCODE_COMPRESS", "maybe")])).is_err());
    let mut cfg = l.config;
    cfg.apply(&Overrides {
        compress: Some(true),
        ..Overrides::default()
    });
    assert!(cfg.ledger.compress.enabled);
}

#[test]
fn the_state_block_budget_is_validated_and_defaults_to_2000() {
    let d = Config::default();
    assert!(d.ledger.state.enabled);
    assert_eq!(d.ledger.state.max_tokens, 2_000);
    assert_eq!(d.ledger.merge.key_env(), "OCEANCODE_MERGE_API_KEY");
    let check = |text: &str| parse(text).unwrap().config.validate();
    for ok in [200, 2_000, 20_000] {
        let text = format!(r#"{{"ledger":{{"state":{{"max_tokens":{ok}}}}}}}"#);
        check(&text).unwrap();
        assert_eq!(parse(&text).unwrap().config.ledger.state.max_tokens, ok);
    }
    for bad in [0, 199, 20_001] {
        let text = format!(r#"{{"ledger":{{"state":{{"max_tokens":{bad}}}}}}}"#);
        match check(&text) {
            Err(ConfigError::Invalid { key, message }) => {
                assert_eq!(key, "ledger.state.max_tokens");
                assert!(message.contains("200 to 20000"), "{message}");
            }
            other => panic!("{bad}: expected Invalid, got {other:?}"),
        }
    }
    let off = parse(r#"{"ledger":{"state":{"enabled":false}}}"#)
        .unwrap()
        .config;
    off.validate().unwrap();
    assert!(!off.ledger.state.enabled);
    assert_eq!(off.ledger.state.max_tokens, 2_000);
    let err = parse(r#"{"ledger":{"state":{"budget":10}}}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `budget`"), "{err}");
    let m =
        parse(r#"{"ledger":{"merge":{"model":"claude-haiku-4-5","api_key_env":"CI_MERGE_KEY"}}}"#)
            .unwrap()
            .config;
    m.validate().unwrap();
    assert_eq!(m.ledger.merge.key_env(), "CI_MERGE_KEY");
}

#[test]
fn context_seq_tags_is_off_by_default() {
    let c = Config::default();
    assert!(!c.context.seq_tags);
    let c: Config = serde_json::from_str(r#"{"context":{"seq_tags":true}}"#).unwrap();
    assert!(c.context.seq_tags);
    assert!(serde_json::from_str::<Config>(r#"{"context":{"seq_tag":true}}"#).is_err());
}

#[test]
fn a_percentage_under_the_floor_on_every_window_is_refused_everywhere() {
    // D18: 0.0001% of any window is a line of a few tokens.
    for bad in ["0.0001%", "0.1%", "0.19%"] {
        let e = bad.parse::<LineSpec>().unwrap_err();
        assert!(e.to_string().contains("20k-token floor"), "{bad}: {e}");
        let e = Config::load(None, &env_of(&[("OCEANCODE_TIDELINE", bad)])).unwrap_err();
        assert!(e.to_string().contains("20k-token floor"), "{bad}: {e}");
    }
    assert_eq!("0.2%".parse::<LineSpec>(), Ok(LineSpec::Percent(0.2)));
    // The `tideline` command and the admin API say so too.
    let e = tideline_command(&["0.0001%".to_string()]).unwrap_err();
    assert!(e.to_string().contains("20k-token floor"), "{e}");
    let e = parse(r#"{"ledger":{"tideline":{"percent":0.0001}}}"#)
        .unwrap()
        .config
        .validate()
        .unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, message }
            if key == "ledger.tideline.percent" && message.contains("20k-token floor")),
        "{e:?}"
    );
}

#[test]
fn url_credentials_never_reach_an_error() {
    // D20: from the environment, a flag and the config file alike.
    for (var, value) in [
        (
            "OCEANCODE_ANTHROPIC_UPSTREAM",
            "https://user:SECRETPASS2@api.example.com",
        ),
        (
            "OCEANCODE_OPENAI_UPSTREAM",
            "https://api.example.com/v1?key=SECRETQ9",
        ),
        (
            "OCEANCODE_OPENAI_UPSTREAM",
            "https://SECRETTOKEN@api.example.com",
        ),
        ("OCEANCODE_DATABASE_URL", "mysql://u:SECRETDB@h/x"),
    ] {
        let e = Config::load(None, &env_of(&[(var, value)])).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(shown.contains(var), "{shown}");
        assert!(!shown.contains("SECRET"), "{shown}");
    }
    let mut c = Config::default();
    c.apply(&Overrides {
        openai_upstream: Some("http://u:SECRETFLAG@example.com/?key=SECRETQ".into()),
        ..Default::default()
    });
    let e = c.validate().unwrap_err();
    let shown = format!("{e} {e:?}");
    assert!(shown.contains("providers.openai.upstream"), "{shown}");
    assert!(!shown.contains("SECRET"), "{shown}");
    for bad in [
        "https://user:SECRETPASS@example.com",
        "https://example.com/?key=SECRETQ",
        "http://u:SECRET@example.com",
        "user:SECRET@example.com",
        "https://u:SECRET @example.com",
    ] {
        let err = check_upstream_url(bad).unwrap_err();
        assert!(!err.contains("SECRET"), "{bad}: {err}");
    }
}

// ---------------------------------------------------------------- telemetry

#[test]
fn telemetry_is_off_by_default_and_layers_file_env_flag() {
    let c = Config::default();
    assert_eq!(c.telemetry.otlp.endpoint, None);
    assert!(!c.telemetry.otlp.capture_content);
    assert_eq!(c.telemetry.otlp.headers_env, "OCEANCODE_OTLP_HEADERS");
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.json",
        r#"{"telemetry":{"otlp":{"endpoint":"http://collector:4318","headers_env":"MY_OTLP_AUTH","max_queue":64}}}"#,
    );
    let l = Config::load(Some(&file), &no_env).unwrap();
    let o = &l.config.telemetry.otlp;
    assert_eq!(o.endpoint.as_deref(), Some("http://collector:4318"));
    assert_eq!(o.headers_env, "MY_OTLP_AUTH");
    assert_eq!(o.max_queue, 64);
    let env = env_of(&[
        ("OCEANCODE_OTLP_ENDPOINT", "http://127.0.0.1:6006"),
        ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
    ]);
    let mut l = Config::load(Some(&file), &env).unwrap();
    assert_eq!(
        l.config.telemetry.otlp.endpoint.as_deref(),
        Some("http://127.0.0.1:6006")
    );
    assert!(l.config.telemetry.otlp.capture_content);
    l.config.apply(&Overrides {
        otlp: Some("https://otel.example.com/api/public/otel".into()),
        ..Overrides::default()
    });
    assert_eq!(
        l.config.telemetry.otlp.endpoint.as_deref(),
        Some("https://otel.example.com/api/public/otel")
    );
    l.config.validate().unwrap();
}

#[test]
fn telemetry_refuses_bad_endpoints_without_echoing_credentials() {
    let env = env_of(&[("OCEANCODE_OTLP_ENDPOINT", "ftp://x")]);
    let err = Config::load(None, &env).unwrap_err().to_string();
    assert!(err.contains("OCEANCODE_OTLP_ENDPOINT"), "{err}");
    let err = parse(r#"{"telemetry":{"otlp":{"endpoint":"https://user:s3cret@h/otel"}}}"#)
        .and_then(|l| l.config.validate().map(|_| l))
        .unwrap_err()
        .to_string();
    assert!(err.contains("telemetry.otlp.endpoint"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    let err = parse(r#"{"telemetry":{"otlp":{"max_queue":0}}}"#)
        .and_then(|l| l.config.validate().map(|_| l))
        .unwrap_err()
        .to_string();
    assert!(err.contains("telemetry.otlp.max_queue"), "{err}");
    assert!(parse(r#"{"telemetry":{"otlp":{"headers":"x"}}}"#).is_err());
}

#[test]
fn gemini_models_and_upstream() {
    let pro = lookup("gemini-2.5-pro").expect("in the table");
    assert_eq!((pro.context_window, pro.max_output), (1_048_576, 65_536));
    let p = pro.price.expect("priced");
    // Implicit caching: a cache read costs a tenth of the input.
    assert_eq!((p.input, p.output, p.cache_read), (1.25, 10.0, 0.125));
    assert!(lookup("models/gemini-2.5-flash").is_some_and(|i| i.price.is_some()));
    let fam = lookup("gemini-9-ultra").expect("the family fallback");
    assert_eq!((fam.context_window, fam.price), (1_048_576, None));

    let mut c = Config::default();
    assert_eq!(
        c.gemini_upstream(),
        "https://generativelanguage.googleapis.com"
    );
    c.apply(&Overrides {
        gemini_upstream: Some("http://127.0.0.1:7003".into()),
        ..Overrides::default()
    });
    assert_eq!(c.gemini_upstream(), "http://127.0.0.1:7003");
    c.apply_env(&env_of(&[(
        "OCEANCODE_GEMINI_UPSTREAM",
        "http://127.0.0.1:7004",
    )]))
    .expect("a valid URL");
    assert_eq!(c.gemini_upstream(), "http://127.0.0.1:7004");
}

#[test]
fn cold_cut_is_on_by_default_and_turns_off() {
    let l = Config::load(None, &env_of(&[])).unwrap();
    assert!(l.config.ledger.tideline.cold_cut());
    let c: LedgerConfig = serde_json::from_str(r#"{"tideline": {"cold_cut": false}}"#).unwrap();
    assert!(!c.tideline.cold_cut());
    let l = Config::load(None, &env_of(&[("OCEANCODE_COLD_CUT", "off")])).unwrap();
    assert!(!l.config.ledger.tideline.cold_cut());
    assert!(Config::load(None, &env_of(&[("OCEANCODE_COLD_CUT", "maybe")])).is_err());
}
