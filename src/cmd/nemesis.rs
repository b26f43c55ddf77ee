//! `ankusa-fleet nemesis …`: the nemesis is a crate and binary of its own
//! (`ankusa-fleet-nemesis`, in `nemesis/`), so the node carries none of it; this command
//! replaces the process with that binary, found beside this one, with the same arguments.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use anyhow::Context;

/// The nemesis's binary name, as cargo and an install place it beside `ankusa-fleet`.
pub const NEMESIS_BIN: &str = "ankusa-fleet-nemesis";

/// Execs `ankusa-fleet-nemesis` with `args`; returns only when that fails, with why.
pub fn exec(args: &[OsString]) -> anyhow::Error {
    let nemesis = match std::env::current_exe().context("finding this executable") {
        Ok(exe) => exe.with_file_name(NEMESIS_BIN),
        Err(e) => return e,
    };
    if !nemesis.is_file() {
        return anyhow::anyhow!(
            "the nemesis is a binary of its own: no {} at {} (build it beside this one with \
             `cargo build -p ankusa-fleet-nemesis`, adding --release for a release build, or \
             install both with `cargo install --path . && cargo install --path nemesis`)",
            NEMESIS_BIN,
            nemesis.display()
        );
    }
    let e = std::process::Command::new(&nemesis).args(args).exec();
    anyhow::Error::new(e).context(format!("running {}", nemesis.display()))
}
