//! Backup and restore of the fleet's state, as etcd's `snapshot save` and `snapshot restore`.
//!
//! `save` asks any node's `Admin` service (on `raft_addr`, with a fleet certificate) for a
//! snapshot that covers everything the fleet answered before the call, checks it and writes
//! it to a file durably. The file is the node's own snapshot format: a header with the
//! body's length and CRC-32, then the body (the log position it covers, the membership,
//! every live bucket and claim).
//!
//! `restore` seeds one node's empty data dir from that file, offline: the snapshot is
//! installed as if the leader had sent it, and the vote is set to the snapshot's term, so
//! the restored fleet elects its next leader in a later term than any entry the snapshot
//! covers (a leader of an earlier term would append entries that sort below the ones
//! already applied). Every node of the fleet is restored from the same file; the file's
//! membership is the restored fleet's, so each node must keep its id and addresses.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use openraft::storage::{RaftLogStorage, RaftStateMachine};

use crate::cmd::cluster::{AdminTarget, Credentials};
use crate::config::NodeConfig;
use crate::pb::internal::SaveSnapshotRequest;
use crate::raft::faults::Faults;
use crate::raft::log_store::LogStore;
use crate::raft::snapshot::{self, SnapshotBody};
use crate::raft::state_machine::{members, StateMachineStore};
use crate::raft::{LogId, NodeId, SnapshotMeta};
use crate::storage::layout::{RAFT_LOG_FILE, RESTORE_MARKER, STATE_SLED_DIR};
use crate::storage::sled_disk::SledDisk;

/// The largest snapshot a backup takes, as the largest a node installs from a peer.
const SNAPSHOT_FILE_BYTES_MAX: u64 = crate::raft::snapshot::intake::SNAPSHOT_BYTES_MAX;
/// The sled cache of the short-lived store `restore` writes into.
const RESTORE_SLED_CACHE_BYTES: u64 = 8 * 1024 * 1024;

/// Where `snapshot save` reaches the fleet: a node's `api_addr` (its `raft_addr` is read
/// from its `Status`), its `raft_addr`, or its config; and the fleet certificate to call
/// `Admin` there with.
#[derive(Debug, clap::Args)]
pub struct SaveTarget {
    /// A node's api_addr: its raft_addr is looked up in its Status (plaintext: a node with
    /// `[api_tls]` is named by --raft-addr or --config).
    #[arg(long, conflicts_with = "raft_addr")]
    pub addr: Option<String>,
    /// A node's raft_addr (default: that of --config's node).
    #[arg(long)]
    pub raft_addr: Option<String>,
    #[command(flatten)]
    pub credentials: Credentials,
}

impl SaveTarget {
    /// The `Admin` target: `--raft-addr`, or the raft_addr `--addr`'s node lists for
    /// itself, or `--config`'s.
    ///
    /// # Errors
    /// When `--addr`'s node cannot be reached or does not list itself as a member.
    pub async fn admin(&self) -> anyhow::Result<AdminTarget> {
        let raft_addr = match (&self.raft_addr, &self.addr) {
            (Some(raft_addr), _) => Some(raft_addr.clone()),
            (None, Some(api_addr)) => Some(raft_addr_of(api_addr).await?),
            (None, None) => None,
        };
        Ok(AdminTarget {
            addr: raft_addr,
            credentials: self.credentials.clone(),
        })
    }
}

/// The raft_addr the node at `api_addr` lists for itself.
async fn raft_addr_of(api_addr: &str) -> anyhow::Result<String> {
    let status = crate::cmd::cluster::status(api_addr).await?;
    status
        .members
        .iter()
        .find(|member| member.id == status.node_id)
        .map(|member| member.raft_addr.clone())
        .with_context(|| {
            format!(
                "--addr {api_addr}: node {} is not a member of a fleet yet (its Status lists no \
                 raft_addr for it)",
                status.node_id
            )
        })
}

/// What a snapshot file holds, for the operator to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The last log index the snapshot covers.
    pub index: u64,
    /// The term of that entry.
    pub term: u64,
    pub buckets: usize,
    pub claims: usize,
    /// The members it names: (id, voter).
    pub members: Vec<(u64, bool)>,
    pub size_bytes: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|(id, voter)| {
                if *voter {
                    id.to_string()
                } else {
                    format!("{id} (learner)")
                }
            })
            .collect();
        write!(
            f,
            "log index {} (term {}), {} buckets, {} claims, members {}, {} bytes",
            self.index,
            self.term,
            self.buckets,
            self.claims,
            members.join(", "),
            self.size_bytes
        )
    }
}

fn summary(body: &SnapshotBody, size_bytes: u64) -> Summary {
    Summary {
        index: body.last_applied.map_or(0, |log_id| log_id.index),
        term: body.last_applied.map_or(0, |log_id| log_id.leader_id.term),
        buckets: body.image.buckets.len(),
        claims: body.image.claims.len(),
        members: members(&body.membership)
            .into_iter()
            .map(|(id, _, voter)| (id, voter))
            .collect(),
        size_bytes,
    }
}

/// Takes a backup through `target` (a follower forwards to the leader) and writes it to
/// `file`: first to `FILE.partial`, fsynced, then renamed over `file`, so a file by that
/// name is always a whole snapshot.
///
/// # Errors
/// When the node cannot be reached or refuses, the snapshot it sends fails its checks, or
/// the file cannot be written.
pub async fn save(target: &SaveTarget, file: &Path) -> anyhow::Result<Summary> {
    let target = target.admin().await?;
    let request = SaveSnapshotRequest {
        cluster_id: target.cluster_id()?,
    };
    let mut chunks = crate::cmd::cluster::on_leader(&target, |mut admin| {
        let request = request.clone();
        async move { Ok(admin.save_snapshot(request).await?.into_inner()) }
    })
    .await
    .context("asking for a snapshot")?;
    let mut data = Vec::new();
    while let Some(chunk) = chunks.message().await.context("receiving the snapshot")? {
        if (data.len() + chunk.data.len()) as u64 > SNAPSHOT_FILE_BYTES_MAX {
            bail!("the snapshot is over {SNAPSHOT_FILE_BYTES_MAX} bytes; not saved");
        }
        data.extend_from_slice(&chunk.data);
    }
    let body = snapshot::decode(&data).context("the snapshot the node sent")?;
    let summary = summary(&body, data.len() as u64);
    write_durably(file, &data)?;
    Ok(summary)
}

/// Writes `data` to `file` through `FILE.partial`: written, fsynced, renamed, and the
/// directory fsynced, so the name reaches the disk with the whole content behind it.
fn write_durably(file: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let partial = with_suffix(file, ".partial");
    // A file left by an earlier save is removed: a new one is made, never one that is
    // there (it would keep its mode, or be a link elsewhere).
    let _ = std::fs::remove_file(&partial);
    // Only its owner reads it: it holds every tenant's state.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut out| {
            out.write_all(data)?;
            out.sync_all()
        })
        .with_context(|| format!("writing {}", partial.display()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, file)
        .with_context(|| format!("renaming {} to {}", partial.display(), file.display()))?;
    sync_dir(crate::storage::parent_dir(file))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    crate::storage::sync_dir(dir).with_context(|| format!("syncing directory {}", dir.display()))
}

/// Reads and checks a snapshot file: its size, header, checksum and body; the error names
/// the file and what is wrong.
///
/// # Errors
/// When the file cannot be read or is not a whole, intact snapshot.
pub fn read_file(file: &Path) -> anyhow::Result<(Vec<u8>, SnapshotBody)> {
    let size = std::fs::metadata(file)
        .with_context(|| format!("reading {}", file.display()))?
        .len();
    if size > SNAPSHOT_FILE_BYTES_MAX {
        bail!(
            "{}: {size} bytes is over the {SNAPSHOT_FILE_BYTES_MAX} a snapshot may have",
            file.display()
        );
    }
    let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let body = snapshot::decode(&data).with_context(|| format!("{}", file.display()))?;
    Ok((data, body))
}

/// Seeds the empty data dir of the node `config` describes from the snapshot in `file`.
/// The node then starts with the snapshot's state and membership and replays nothing.
///
/// The data dir is written in place (it may be a mount point of its own), behind the
/// [`RESTORE_MARKER`] file: a restore cut short leaves the marker, and the node refuses to
/// start from that data dir.
///
/// # Errors
/// When the file is not an intact snapshot, covers no entry, does not list this node with
/// the config's addresses, the data dir holds anything, or a store cannot be written.
pub async fn restore(config: &NodeConfig, file: &Path) -> anyhow::Result<Summary> {
    let (data, body) = read_file(file)?;
    let Some(last) = body.last_applied else {
        bail!("{}: the snapshot covers no log entry", file.display());
    };
    check_member(config, &body, file)?;
    let data_dir = &config.data_dir;
    ensure_empty(data_dir)?;
    crate::storage::create_private_dir(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    sync_dir(crate::storage::parent_dir(data_dir))?;
    // Written first and removed last: a node refuses to start while it is there, so a
    // restore cut short never passes for a data dir.
    let marker = data_dir.join(RESTORE_MARKER);
    std::fs::File::create(&marker)
        .and_then(|file| file.sync_all())
        .with_context(|| format!("writing {}", marker.display()))?;
    sync_dir(data_dir)?;
    let summary = summary(&body, data.len() as u64);
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: body.membership,
        snapshot_id: format!("restored-{}-{}", last.leader_id, last.index),
    };
    seed(data_dir, config.node_id, &meta, data).await?;
    crate::storage::make_tree_private(data_dir)
        .with_context(|| format!("making {} private", data_dir.display()))?;
    sync_dir(data_dir)?;
    std::fs::remove_file(&marker).with_context(|| format!("removing {}", marker.display()))?;
    sync_dir(data_dir)?;
    Ok(summary)
}

/// The file must list this node, with the addresses its config gives it: the other nodes
/// reach it at the addresses the membership names.
fn check_member(config: &NodeConfig, body: &SnapshotBody, file: &Path) -> anyhow::Result<()> {
    let listed = members(&body.membership);
    let Some((_, node, _)) = listed.iter().find(|(id, _, _)| *id == config.node_id) else {
        let ids: Vec<String> = listed.iter().map(|(id, _, _)| id.to_string()).collect();
        bail!(
            "node_id: {} is not a member in {} (its members are {}); restore each member \
             from the file with its own config",
            config.node_id,
            file.display(),
            ids.join(", ")
        );
    };
    for (field, config_addr, listed_addr) in [
        ("api_addr", config.api_addr.to_string(), &node.api_addr),
        ("raft_addr", config.raft_addr.to_string(), &node.raft_addr),
    ] {
        if &config_addr != listed_addr {
            bail!(
                "{field}: the config says {config_addr}, but {} lists node {} at {listed_addr}; \
                 the restored fleet's members are the file's",
                file.display(),
                config.node_id
            );
        }
    }
    Ok(())
}

fn ensure_empty(data_dir: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(data_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", data_dir.display())),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", data_dir.display()))?;
        // A file system's own root (a data dir of its own mount) holds it from the start.
        if entry.file_name() != "lost+found" {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    if names.iter().any(|name| name == RESTORE_MARKER) {
        bail!(
            "data_dir: {} holds an earlier restore that did not finish ({RESTORE_MARKER}): \
             empty it and restore again",
            data_dir.display()
        );
    }
    if let Some(name) = names.first() {
        bail!(
            "data_dir: {} is not empty (it holds {name}); restore seeds an empty data dir \
             only: stop the node and move what is there away first",
            data_dir.display()
        );
    }
    Ok(())
}

/// Writes the stores of node `node_id` in `dir`: the snapshot installed (its file in
/// `snapshot/`, its record in `state.sled`) and, in the log store, a vote in the term of the
/// snapshot's last entry.
async fn seed(
    dir: &Path,
    node_id: NodeId,
    meta: &SnapshotMeta,
    data: Vec<u8>,
) -> anyhow::Result<()> {
    let term = meta
        .last_log_id
        .map_or(0, |log_id: LogId| log_id.leader_id.term);
    let log_path = dir.join(RAFT_LOG_FILE);
    let mut log = LogStore::open(&log_path, node_id, Faults::new(false))
        .with_context(|| format!("creating {}", log_path.display()))?;
    let sled_path = dir.join(STATE_SLED_DIR);
    let disk = SledDisk::open(&sled_path, RESTORE_SLED_CACHE_BYTES)
        .with_context(|| format!("creating {}", sled_path.display()))?;
    let mut state =
        StateMachineStore::open(&disk, log.durable(), crate::planted::Planted::default())
            .with_context(|| format!("opening {}", sled_path.display()))?;
    state
        .install_snapshot(meta, Box::new(Cursor::new(data)))
        .await
        .with_context(|| format!("writing the snapshot into {}", dir.display()))?;
    log.save_vote(&openraft::Vote::new(term, node_id))
        .await
        .with_context(|| format!("writing the vote into {}", log_path.display()))?;
    drop(state);
    drop(log);
    // sled's files and every directory under state.sled: the marker goes only after.
    disk.flush_to_disk()
        .with_context(|| format!("syncing {}", sled_path.display()))?;
    Ok(())
}

/// The `snapshot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCmd {
    /// Write a snapshot covering everything the fleet answered before the call to FILE,
    /// taken on the leader through any node (its Admin service on raft_addr, with a fleet
    /// certificate).
    Save {
        #[command(flatten)]
        target: SaveTarget,
        file: PathBuf,
    },
    /// Seed the empty data dir of the node NODE.toml describes from FILE (every member is
    /// restored from the same file, then started).
    Restore {
        #[arg(long)]
        config: PathBuf,
        file: PathBuf,
    },
}

/// Runs one `snapshot` subcommand and prints what it did.
///
/// # Errors
/// When the snapshot cannot be taken, checked, written or restored.
pub async fn run(command: SnapshotCmd) -> anyhow::Result<()> {
    match command {
        SnapshotCmd::Save { target, file } => {
            let summary = save(&target, &file).await?;
            println!("saved {}: {summary}", file.display());
        }
        SnapshotCmd::Restore { config, file } => {
            let config = NodeConfig::load(&config)?;
            let summary = restore(&config, &file).await?;
            println!(
                "restored node {} in {} from {}: {summary}",
                config.node_id,
                config.data_dir.display(),
                file.display()
            );
        }
    }
    Ok(())
}
