//! Every decoder of bytes from outside the process, fed random and mutated bytes: peer
//! payloads (what `raft::service` opens for each `Peer` method, and what `raft::network`
//! opens from an answer), WAL entries and the vote, snapshots, claim-journal records and
//! queued settles. Each must answer `Err` or a value, never panic, abort or allocate what a
//! length prefix claims. Seeded, so a failure replays; the frames that once aborted a node
//! are kept as regression cases.

use std::sync::Arc;

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, EntryPayload, Vote};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::de::DeserializeOwned;
use serde::Serialize;

use ankusa_fleet::codec;
use ankusa_fleet::local::settle_queue::QueuedSettle;
use ankusa_fleet::raft::snapshot::{self, SnapshotBody};
use ankusa_fleet::raft::{Entry, LogId, NodeId, ProposeRequest, ProposeResponse, TypeConfig};
use ankusa_fleet::state::{
    BucketKey, Charge, ClaimKey, ClaimRecord, ClaimRequest, ClaimState, Command, EncodedCommand,
    FleetRequest, HookId, Kind, SettleOutcome, SourceId, TenantId,
};

/// Cases per decoder: random bytes and mutations of a valid encoding, half each.
const CASES: u32 = 3_000;

/// The frames that aborted a node before decoding had a limit (issue 14).
const PROPOSE_THAT_ABORTED: [u8; 13] = [
    0x01, 0x01, 0x01, 0x01, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40,
];
const INSTALL_SNAPSHOT_THAT_ABORTED: [u8; 25] = [0xff; 25];

fn key() -> ClaimKey {
    ClaimKey {
        tenant: TenantId::from("acme"),
        source_id: SourceId::from("stripe"),
        key: "evt_1".into(),
    }
}

fn commands() -> Vec<Command> {
    let charge = Charge {
        bucket: BucketKey::Tenant {
            kind: Kind::Hooks,
            tenant: TenantId::from("acme"),
        },
        increment_us: 1_000,
        capacity_us: 10_000,
    };
    vec![
        Command::Hit {
            charges: vec![charge],
            claim: Some(ClaimRequest {
                key: key(),
                hook_id: HookId::from("hook-1"),
                ttl_ms: 60_000,
                pending_ttl_ms: 5_000,
            }),
            node: 2,
        },
        Command::Settle {
            key: key(),
            hook_id: HookId::from("hook-1"),
            outcome: SettleOutcome::Commit,
            ttl_ms: 60_000,
            node: 2,
        },
        Command::Reset {
            tenant: TenantId::from("acme"),
        },
    ]
}

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(3, 1), index)
}

fn entry() -> Entry {
    Entry {
        log_id: log_id(7),
        payload: EntryPayload::Normal(FleetRequest {
            now_us: 1_700_000_000_000_000,
            limits: ankusa_fleet::state::StateLimits::UNLIMITED,
            commands: Arc::from(EncodedCommand::encode_all(&commands()).expect("encode")),
        }),
    }
}

fn snapshot_bytes() -> Vec<u8> {
    snapshot::encode(&SnapshotBody::default()).expect("encode a snapshot")
}

/// Random bytes, or `valid` with a few bytes flipped, overwritten with a large varint
/// marker, cut short, or with bytes inserted.
fn inputs(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let random = proptest::collection::vec(any::<u8>(), 0..512);
    let edits =
        proptest::collection::vec((any::<prop::sample::Index>(), 0u8..5, any::<u8>()), 1..6);
    let mutated = edits.prop_map(move |edits| {
        let mut bytes = valid.clone();
        for (at, kind, byte) in edits {
            if bytes.is_empty() {
                bytes.push(byte);
                continue;
            }
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] ^= 1 << (byte % 8),
                1 => bytes[i] = [0xfb, 0xfc, 0xfd, 0xff][usize::from(byte % 4)],
                2 => bytes.truncate(i),
                3 => bytes.insert(i, byte),
                _ => bytes[i] = byte,
            }
        }
        bytes
    });
    prop_oneof![random, mutated]
}

/// Runs `decode` on [`CASES`] seeded inputs derived from `valid`; it must return (any
/// value or error) without panicking. `name` seeds the run, so each decoder sees its own
/// inputs and a failure replays.
fn never_panics<T>(name: &str, valid: Vec<u8>, decode: impl Fn(&[u8]) -> Option<T>) {
    let mut seed = [0u8; 32];
    for (i, byte) in name.bytes().enumerate() {
        seed[i % 32] ^= byte;
    }
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let decoded = std::cell::Cell::new(0u32);
    runner
        .run(&inputs(valid), |bytes| {
            if decode(&bytes).is_some() {
                decoded.set(decoded.get() + 1);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // Not every mutation breaks a value (a flipped bit in a number is still a number), but
    // the run must have exercised the decoder rather than refused everything up front.
    assert!(decoded.get() > 0, "{name}: no input decoded at all");
}

/// The valid encoding of `value`, checked to decode back.
fn valid<T: Serialize + DeserializeOwned>(value: &T) -> Vec<u8> {
    let bytes = codec::encode(value).expect("encode");
    codec::decode::<T>(&bytes).expect("a valid encoding decodes");
    bytes
}

fn decodes<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    codec::decode::<T>(bytes).ok()
}

#[test]
fn the_frames_that_aborted_a_node_are_errors() {
    assert!(codec::decode::<ProposeRequest>(&PROPOSE_THAT_ABORTED).is_err());
    assert!(
        codec::decode::<InstallSnapshotRequest<TypeConfig>>(&INSTALL_SNAPSHOT_THAT_ABORTED)
            .is_err()
    );
    for bytes in [
        &PROPOSE_THAT_ABORTED[..],
        &INSTALL_SNAPSHOT_THAT_ABORTED[..],
    ] {
        assert!(codec::decode::<AppendEntriesRequest<TypeConfig>>(bytes).is_err());
        assert!(codec::decode::<VoteRequest<NodeId>>(bytes).is_err());
        assert!(codec::decode::<Entry>(bytes).is_err());
        assert!(snapshot::decode(bytes).is_err());
    }
}

#[test]
fn peer_requests_never_panic() {
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(6)),
        entries: vec![entry(), entry()],
        leader_commit: Some(log_id(6)),
    };
    never_panics(
        "AppendEntries",
        valid(&append),
        decodes::<AppendEntriesRequest<TypeConfig>>,
    );
    let vote = VoteRequest::<NodeId> {
        vote: Vote::new(4, 2),
        last_log_id: Some(log_id(9)),
    };
    never_panics("Vote", valid(&vote), decodes::<VoteRequest<NodeId>>);
    let install = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        meta: Default::default(),
        offset: 0,
        data: snapshot_bytes(),
        done: true,
    };
    never_panics(
        "InstallSnapshot",
        valid(&install),
        decodes::<InstallSnapshotRequest<TypeConfig>>,
    );
    let propose = ProposeRequest {
        commands: EncodedCommand::encode_all(&commands()).expect("encode"),
        timeout_ms: 1_000,
    };
    never_panics("Propose", valid(&propose), decodes::<ProposeRequest>);
    // The bytes of one command, which the leader decodes to re-check a forwarded one, a
    // follower to check an AppendEntries entry, and apply to apply it.
    for (i, command) in commands().iter().enumerate() {
        let bytes = EncodedCommand::encode(command)
            .expect("encode")
            .as_bytes()
            .to_vec();
        never_panics(&format!("command {i}"), bytes, |bytes| {
            EncodedCommand::from_bytes(bytes.to_vec().into())
                .decode()
                .ok()
        });
    }
}

#[test]
fn peer_answers_never_panic() {
    type Answer<T> = Result<T, openraft::error::RaftError<NodeId>>;
    let append: Answer<AppendEntriesResponse<NodeId>> =
        Ok(AppendEntriesResponse::HigherVote(Vote::new(5, 2)));
    never_panics(
        "AppendEntries answer",
        valid(&append),
        decodes::<Answer<AppendEntriesResponse<NodeId>>>,
    );
    let vote: Answer<VoteResponse<NodeId>> = Ok(VoteResponse {
        vote: Vote::new(4, 2),
        vote_granted: true,
        last_log_id: Some(log_id(9)),
    });
    never_panics(
        "Vote answer",
        valid(&vote),
        decodes::<Answer<VoteResponse<NodeId>>>,
    );
    let proposed: ProposeResponse = Ok(vec![ankusa_fleet::state::Answer::Reset]);
    never_panics(
        "Propose answer",
        valid(&proposed),
        decodes::<ProposeResponse>,
    );
}

#[test]
fn disk_records_never_panic() {
    never_panics("WAL entry", valid(&entry()), decodes::<Entry>);
    never_panics(
        "vote",
        valid(&Vote::<NodeId>::new_committed(3, 1)),
        decodes::<Vote<NodeId>>,
    );
    never_panics(
        "committed",
        valid(&Some(log_id(5))),
        decodes::<Option<LogId>>,
    );
    let record = ClaimRecord {
        hook_id: HookId::from("hook-1"),
        node: 1,
        state: ClaimState::Committed,
        expires_at_us: 1_700_000_000_000_000,
        ttl_ms: 60_000,
    };
    never_panics(
        "claim journal record",
        valid(&(key(), Some(record))),
        decodes::<(ClaimKey, Option<ClaimRecord>)>,
    );
    let settle = QueuedSettle {
        key: key(),
        hook_id: HookId::from("hook-1"),
        outcome: SettleOutcome::Commit,
        ttl_ms: 60_000,
    };
    never_panics(
        "settle queue record",
        valid(&(7u64, Some(settle))),
        decodes::<(u64, Option<QueuedSettle>)>,
    );
    // A snapshot checks its checksum first: mutations are refused there, random bytes at the
    // magic; both must be errors, and the valid one must decode.
    let bytes = snapshot_bytes();
    assert!(snapshot::decode(&bytes).is_ok());
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    runner
        .run(&inputs(bytes.clone()), |input| {
            if input != bytes {
                prop_assert!(snapshot::decode(&input).is_err());
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("snapshot: {e}"));
    // The body behind a header that matches it (a sender that computed the checksum over
    // its own garbage): the body decoder itself must refuse, not panic.
    let body = bytes[snapshot::HEADER_LEN..].to_vec();
    never_panics("snapshot body", body, |mutated| {
        let mut resealed = bytes[..snapshot::HEADER_LEN].to_vec();
        resealed[8..16].copy_from_slice(&(mutated.len() as u64).to_le_bytes());
        resealed[16..20].copy_from_slice(&crc32fast::hash(mutated).to_le_bytes());
        resealed.extend_from_slice(mutated);
        snapshot::decode(&resealed).ok()
    });
}
