//! `ringlet-hollow-child`: the program every hollow container runs (see `ringlet_hollow::child`).
//! A binary of its own rather than a mode of `ringlet-hollow`: a process of the server's binary
//! dirties about 700 KiB (its relocated data and heap, `RssAnon` of a debug build) before it does
//! anything, this one 140 KiB (`/bin/sleep`: 108 KiB), which at 10,000 containers is 7 GiB
//! against 1.4 GiB.

use std::process::ExitCode;

use ringlet_hollow::child::{self, ChildArgs};

fn main() -> ExitCode {
    match ChildArgs::from_args(std::env::args_os().skip(1)) {
        // Nothing to unwind or flush: exit with the container's code.
        Ok(args) => std::process::exit(child::run(&args)),
        Err(e) => {
            eprintln!("ringlet-hollow-child: {e}");
            ExitCode::from(2)
        }
    }
}
