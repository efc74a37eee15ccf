//! Plays a member that breaks the channel policy: prints (raw bytes on stdout) a commit
//! an honest engine refuses to build, for the test suite to send to a running relay.
//!
//! ```text
//! rogue_commit <data_dir> <identity> <group id> remove-owner|promote-self|update|add <key package file>
//! ```
//! The data_dir must not be open in another process; nothing in it changes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use _native::attacker::Attack;
use _native::Engine;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let attack = match (args.get(3).map(String::as_str), args.get(4)) {
        (Some("remove-owner"), None) => Attack::RemoveOwner,
        (Some("promote-self"), None) => Attack::PromoteSelf,
        (Some("update"), None) => Attack::Update,
        (Some("add"), Some(file)) => match std::fs::read(file) {
            Ok(kp) => Attack::Add(kp),
            Err(e) => return fail(&format!("cannot read {file}: {e}")),
        },
        _ => {
            return fail(
                "usage: rogue_commit <data_dir> <identity> <group id> remove-owner|promote-self|update|add <file>",
            )
        }
    };
    let engine = match Engine::open(&PathBuf::from(&args[0]), args[1].as_bytes(), None) {
        Ok(engine) => engine,
        Err(e) => return fail(&e.to_string()),
    };
    match engine.rogue_commit(args[2].as_bytes(), attack) {
        Ok(commit) => match std::io::stdout().write_all(&commit) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e.to_string()),
        },
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(why: &str) -> ExitCode {
    eprintln!("rogue_commit: {why}");
    ExitCode::FAILURE
}
