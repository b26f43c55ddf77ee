use super::*;

const MINIMAL: &str = r#"
node_id = 1
api_addr = "127.0.0.1:7101"
raft_addr = "127.0.0.1:7201"
data_dir = "data/node1"

[[members]]
id = 1
api_addr = "127.0.0.1:7101"
raft_addr = "127.0.0.1:7201"
"#;

#[test]
fn the_minimal_file_gets_defaults() {
    let config = NodeConfig::from_toml(MINIMAL).expect("valid");
    assert_eq!(config.node_id, 1);
    assert_eq!(config.voters_max, Defaults::VOTERS_MAX);
    assert_eq!(config.timeout_default, Duration::from_millis(1_000));
    assert!(config.is_initial_member());
}

fn with_key(line: &str) -> String {
    MINIMAL.replace(
        "data_dir = \"data/node1\"\n",
        &format!("data_dir = \"data/node1\"\n{line}\n"),
    )
}

fn refused_key(line: &str) -> String {
    match NodeConfig::from_toml(&with_key(line)).expect_err(line) {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("{line}: not a key error: {other}"),
    }
}

#[test]
fn the_state_limits_have_defaults_and_are_set_by_their_keys() {
    let config = NodeConfig::from_toml(MINIMAL).expect("valid");
    assert_eq!(config.state_limits.claims_max, Defaults::CLAIMS_MAX);
    assert_eq!(config.state_limits.buckets_max, Defaults::BUCKETS_MAX);
    assert_eq!(config.ceilings.ttl_ms_max, Defaults::TTL_MS_MAX);
    assert_eq!(config.ceilings.capacity_us_max, Defaults::CAPACITY_US_MAX);
    let small =
        NodeConfig::from_toml(&with_key("claims_max = 2000\nbuckets_max = 300")).expect("valid");
    assert_eq!(small.state_limits.claims_max, 2_000);
    assert_eq!(
        small.state_limits.tenant_claims_max, 2_000,
        "the tenant default never exceeds the fleet's"
    );
    assert_eq!(small.state_limits.tenant_buckets_max, 300);
}

#[test]
fn every_state_limit_key_is_validated_by_name() {
    for key in [
        "claims_max",
        "buckets_max",
        "tenant_claims_max",
        "tenant_buckets_max",
        "ttl_ms_max",
    ] {
        assert_eq!(refused_key(&format!("{key} = 0")), key);
    }
    assert_eq!(
        refused_key("claims_max = 10\ntenant_claims_max = 11"),
        "tenant_claims_max"
    );
    assert_eq!(
        refused_key("buckets_max = 10\ntenant_buckets_max = 11"),
        "tenant_buckets_max"
    );
    assert_eq!(refused_key("ttl_ms_max = 2592000001"), "ttl_ms_max");
    assert_eq!(refused_key("capacity_us_max = 999999"), "capacity_us_max");
    assert_eq!(
        refused_key("capacity_us_max = 31536000000001"),
        "capacity_us_max"
    );
    assert_eq!(
        refused_key("ttl_ms_max = 1000\nclaim_ttl_ms_default = 1001"),
        "claim_ttl_ms_default"
    );
    let at_contract = "ttl_ms_max = 2592000000\ncapacity_us_max = 31536000000000";
    let config = NodeConfig::from_toml(&with_key(at_contract)).expect("the contract's maxima");
    assert_eq!(config.ceilings, Ceilings::CONTRACT);
}

/// `log_format` is text unless it says json; anything else is refused by name.
#[test]
fn log_format_is_text_or_json() {
    assert_eq!(
        NodeConfig::from_toml(MINIMAL).expect("valid").log_format,
        LogFormat::Text
    );
    let with = |value: &str| {
        MINIMAL.replace(
            "data_dir = \"data/node1\"\n",
            &format!("data_dir = \"data/node1\"\nlog_format = {value}\n"),
        )
    };
    let json = NodeConfig::from_toml(&with("\"json\"")).expect("valid");
    assert_eq!(json.log_format, LogFormat::Json);
    let err = NodeConfig::from_toml(&with("\"xml\""))
        .expect_err("refused")
        .to_string();
    assert!(err.contains("log_format"), "{err}");
}

/// `api_socket` is optional; a path no socket address can hold is refused by name.
#[test]
fn api_socket_must_fit_a_socket_address() {
    assert_eq!(
        NodeConfig::from_toml(MINIMAL).expect("valid").api_socket,
        None
    );
    let with = |value: &str| {
        MINIMAL.replace(
            "data_dir = \"data/node1\"\n",
            &format!("data_dir = \"data/node1\"\napi_socket = {value:?}\n"),
        )
    };
    let config = NodeConfig::from_toml(&with("/run/ankusa-fleet/api.sock")).expect("valid");
    assert_eq!(
        config.api_socket.as_deref(),
        Some(std::path::Path::new("/run/ankusa-fleet/api.sock"))
    );
    let long = format!("/run/{}.sock", "a".repeat(SOCKET_PATH_BYTES_MAX));
    for bad in ["", "/", long.as_str()] {
        let err = NodeConfig::from_toml(&with(bad))
            .expect_err("refused")
            .to_string();
        assert!(err.contains("`api_socket`"), "{bad:?}: {err}");
    }
}

#[test]
fn errors_name_the_key() {
    let bad = MINIMAL.replace(
        "raft_addr = \"127.0.0.1:7201\"\ndata_dir",
        "raft_addr = \"nowhere\"\ndata_dir",
    );
    let err = NodeConfig::from_toml(&bad)
        .expect_err("invalid")
        .to_string();
    assert!(err.contains("`raft_addr`"), "{err}");
    let twice = format!(
        "{MINIMAL}\n[[members]]\nid = 1\napi_addr = \"127.0.0.1:1\"\nraft_addr = \"127.0.0.1:2\"\n"
    );
    let err = NodeConfig::from_toml(&twice)
        .expect_err("invalid")
        .to_string();
    assert!(err.contains("members[1].id"), "{err}");
    let unknown = format!("{MINIMAL}\nsurprise = 1\n");
    assert!(NodeConfig::from_toml(&unknown).is_err());
}

#[test]
fn a_raft_addr_off_loopback_needs_peer_tls_or_the_insecure_key() {
    let exposed = MINIMAL.replace("127.0.0.1:7201", "0.0.0.0:7201");
    let err = NodeConfig::from_toml(&exposed)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("`peer_tls`"), "{err}");
    assert!(err.contains("insecure_peer_traffic"), "{err}");
    let insecure = exposed.replace("data_dir", "insecure_peer_traffic = true\ndata_dir");
    assert!(
        NodeConfig::from_toml(&insecure)
            .expect("allowed")
            .insecure_peer_traffic
    );
    let with_tls = format!(
            "{exposed}\n[peer_tls]\nca_file = \"ca.pem\"\ncert_file = \"n.pem\"\nkey_file = \"n.key\"\n"
        );
    let config = NodeConfig::from_toml(&with_tls).expect("allowed");
    assert_eq!(
        config.peer_tls.map(|tls| tls.ca_file),
        Some(PathBuf::from("ca.pem"))
    );
    let misspelled = with_tls.replace("ca_file", "ca_path");
    let err = NodeConfig::from_toml(&misspelled)
        .expect_err("unknown key")
        .to_string();
    assert!(err.contains("ca_path"), "{err}");
}

#[test]
fn an_api_addr_off_loopback_needs_client_certificates_or_the_insecure_key() {
    let exposed = MINIMAL.replace("127.0.0.1:7101", "0.0.0.0:7101");
    let err = NodeConfig::from_toml(&exposed)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("`api_tls`"), "{err}");
    assert!(err.contains("insecure_edge_api"), "{err}");
    let server_only =
        format!("{exposed}\n[api_tls]\ncert_file = \"n.pem\"\nkey_file = \"n.key\"\n");
    let err = NodeConfig::from_toml(&server_only)
        .expect_err("TLS without client certificates is refused")
        .to_string();
    assert!(err.contains("client_ca_file"), "{err}");
    let with_clients = format!("{server_only}client_ca_file = \"edge-ca.pem\"\n");
    let config = NodeConfig::from_toml(&with_clients).expect("allowed");
    assert!(!config.insecure_edge_api);
    let insecure = exposed.replace("data_dir", "insecure_edge_api = true\ndata_dir");
    assert!(
        NodeConfig::from_toml(&insecure)
            .expect("allowed")
            .insecure_edge_api
    );
    // On loopback nothing is needed; the key, if set, still warns.
    let local = MINIMAL.replace("data_dir", "insecure_edge_api = true\ndata_dir");
    assert!(
        NodeConfig::from_toml(&local)
            .expect("allowed")
            .insecure_edge_api
    );
    assert!(
        !NodeConfig::from_toml(MINIMAL)
            .expect("valid")
            .insecure_edge_api
    );
}

/// `key` defaults to `default`, takes 0 (off), and refuses `too_large` by name.
fn defaults_turns_off_and_is_bounded(
    key: &str,
    read: fn(&NodeConfig) -> u64,
    default: u64,
    too_large: u64,
) {
    let with = |value: u64| MINIMAL.replace("data_dir", &format!("{key} = {value}\ndata_dir"));
    let config = NodeConfig::from_toml(MINIMAL).expect("valid");
    assert_eq!(read(&config), default, "{key}");
    let off = NodeConfig::from_toml(&with(0)).expect("valid");
    assert_eq!(read(&off), 0, "{key}");
    let err = NodeConfig::from_toml(&with(too_large))
        .expect_err("too large")
        .to_string();
    assert!(err.contains(&format!("`{key}`")), "{err}");
}

#[test]
fn batch_linger_defaults_turns_off_and_is_bounded() {
    defaults_turns_off_and_is_bounded(
        "batch_linger_us",
        |config| config.batch_linger_us,
        Defaults::BATCH_LINGER_US,
        BATCH_LINGER_US_MAX + 1,
    );
}

#[test]
fn max_clock_offset_defaults_to_half_a_second_and_refuses_zero_and_past_a_minute() {
    let with = |value: u64| {
        MINIMAL.replace(
            "data_dir",
            &format!("max_clock_offset_ms = {value}\ndata_dir"),
        )
    };
    let config = NodeConfig::from_toml(MINIMAL).expect("valid");
    assert_eq!(config.max_clock_offset_ms, 500);
    assert_eq!(
        NodeConfig::from_toml(&with(2_000))
            .expect("valid")
            .max_clock_offset_ms,
        2_000
    );
    for bad in [0, MAX_CLOCK_OFFSET_MS_MAX + 1] {
        let err = NodeConfig::from_toml(&with(bad))
            .expect_err("out of range")
            .to_string();
        assert!(err.contains("`max_clock_offset_ms`"), "{bad}: {err}");
    }
}

#[test]
fn snapshot_log_percent_defaults_turns_off_and_is_bounded() {
    defaults_turns_off_and_is_bounded(
        "snapshot_log_percent",
        |config| config.snapshot_log_percent,
        Defaults::SNAPSHOT_LOG_PERCENT,
        SNAPSHOT_LOG_PERCENT_MAX + 1,
    );
}

#[test]
fn a_planted_bug_needs_fault_injection() {
    assert_eq!(refused_key("planted_bug = \"own_clock\""), "planted_bug");
}

/// With the `planted-bugs` feature (the nemesis's test builds) a fault-injection node may
/// play a known bug.
#[cfg(feature = "planted-bugs")]
#[test]
fn a_planted_bug_is_played_in_a_build_that_has_them() {
    let config = NodeConfig::from_toml(&with_key(
        "fault_injection = true\nplanted_bug = \"own_clock\"",
    ))
    .expect("valid");
    assert!(config.planted_bug.is(PlantedBug::OwnClock));
    assert!(!config.planted_bug.is(PlantedBug::OneChargeOver));
}

/// Without the `planted-bugs` feature (a release build) the key is refused at load, with a
/// reason that names the feature.
#[cfg(not(feature = "planted-bugs"))]
#[test]
fn a_planted_bug_is_refused_by_a_build_without_them() {
    let line = "fault_injection = true\nplanted_bug = \"own_clock\"";
    match NodeConfig::from_toml(&with_key(line)).expect_err(line) {
        ConfigError::Invalid { field, reason } => {
            assert_eq!(field, "planted_bug");
            assert!(reason.contains("`planted-bugs` cargo feature"), "{reason}");
        }
        other => panic!("not a key error: {other}"),
    }
}
