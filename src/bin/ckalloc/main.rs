//! The `ckalloc` command-line tool (feature `cli`).
//!
//! ```text
//! ckalloc probe                       huge-page state, and what each tier does right now
//! ckalloc pack MODEL.safetensors -o DIR [--version 4|5] [--align N]
//! ckalloc inspect DIR/weights.bump    header, checksum, tensor table, gaps/overlaps
//! ckalloc load DIR/weights.bump [--mode auto|anon|mixed] [--activations SIZE]
//! ckalloc demo [MODEL.safetensors]    pack, load three ways, verify, compute
//! ckalloc synth DIR                   write the demo's synthetic model
//! ckalloc run [--] CMD ARGS...        run a program with libckalloc_preload.so preloaded
//! ```
//!
//! Every command but `run` takes `--json` (one JSON document on stdout). Errors are one
//! line on stderr (and `{"error": ...}` on stdout with `--json`), exit status 1
//! (2 for a usage error); the tool never shows a panic or a backtrace.
//! See docs/cli.md.

mod access;
mod arena_load;
mod args;
mod commands;
mod error;
mod format;
mod model;
mod output;
mod packing;
mod resident;
mod settings;
mod sigbus;
mod synthetic;
mod weights_file;

use clap::{Args, Parser, Subcommand};
use commands::{demo, inspect, load, pack, probe, run as run_cmd, synth};
use error::CliError;
use std::process::ExitCode;

/// Huge-page memory, weights.bump arenas and the caching allocator, from the shell.
#[derive(Parser, Debug)]
#[command(name = "ckalloc", version, about, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand accepts.
#[derive(Args, Debug, Clone, Copy)]
struct Global {
    /// Print one JSON document on stdout instead of text (every command but `run`).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the system's huge-page state and time a 64 MiB first touch on each tier.
    Probe(probe::ProbeArgs),
    /// Pack a safetensors model into weights.bump + weights_manifest.{json,map}.
    Pack(pack::PackArgs),
    /// Show a weights.bump: header, checksum, tensor table, gaps and overlaps.
    Inspect(inspect::InspectArgs),
    /// Build an arena on a weights.bump, materialize, verify, report mode, timing and coverage.
    Load(load::LoadArgs),
    /// The main job: pack a model, load it three ways, verify every tensor, compute on it.
    Demo(demo::DemoArgs),
    /// Write the synthetic demo model (model.safetensors + config.json) into DIR.
    Synth(synth::SynthArgs),
    /// Run a program with the preload library (libckalloc_preload.so) in LD_PRELOAD; exits
    /// with the program's status.
    Run(run_cmd::RunArgs),
}

fn run(cli: Cli) -> Result<(), CliError> {
    let g = cli.global;
    match cli.command {
        Command::Probe(a) => probe::run(g, a),
        Command::Pack(a) => pack::run(g, a),
        Command::Inspect(a) => inspect::run(g, a),
        Command::Load(a) => load::run(g, a),
        Command::Demo(a) => demo::run(g, a),
        Command::Synth(a) => synth::run(g, a),
        // Handled in `main`: it becomes the program.
        Command::Run(_) => Ok(()),
    }
}

/// Whether the arguments (after the program's name) hold `--json` as an
/// option of `ckalloc`: before a `--`, and under `run` before the program,
/// whose arguments are its own. The subcommand is the first argument that
/// is not an option (no option of `ckalloc` itself takes a value).
fn json_asked(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let mut subcommand = None;
    for a in args {
        if a == "--" {
            break;
        }
        if a == "--json" {
            return true;
        }
        if a.as_encoded_bytes().starts_with(b"-") {
            continue;
        }
        match subcommand {
            None => subcommand = Some(a),
            // The program `run` starts: the rest is its arguments.
            Some(ref c) if c == "run" => break,
            Some(_) => {}
        }
    }
    false
}

/// The usage error `e` as clap reports it for this process's arguments
/// with every control or formatting character escaped (`\n`, `\u{1b}`):
/// clap quotes an argument as it is, so a line break in one would split
/// the message that [`error::usage_error`] puts on one line, and clap's
/// rendering drops an escape sequence. The escaped arguments fail the same
/// way, as no name, option or keyword of the tool holds such a character;
/// `e` itself for help and version, or when they do not fail alike.
fn with_escaped_args(e: clap::Error) -> clap::Error {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        return e;
    }
    let escaped = std::env::args_os()
        .map(|a| std::ffi::OsString::from(ckalloc::Escaped::new(&a.to_string_lossy()).to_string()));
    match Cli::try_parse_from(escaped) {
        Err(same) if same.kind() == e.kind() => same,
        _ => e,
    }
}

fn main() -> ExitCode {
    error::install_panic_hook();
    // `--json` is global; look for it before parsing so usage errors can be JSON too.
    let json = json_asked(std::env::args_os().skip(1));
    sigbus::set_json(json);
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return error::usage_error(with_escaped_args(e), json),
    };
    if let Command::Run(a) = cli.command {
        if cli.global.json {
            crate::errln!(
                "ckalloc: error: --json does not apply to run (the program's output is its own)"
            );
            return ExitCode::from(2);
        }
        return run_cmd::run(a);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_asked_before_run_s_program_and_never_after_it() {
        let asked = |args: &[&str]| json_asked(args.iter().map(std::ffi::OsString::from));
        assert!(asked(&["--json", "probe"]));
        assert!(asked(&["probe", "--json"]));
        assert!(asked(&["inspect", "w.bump", "--json"]));
        assert!(asked(&["run", "--json", "--", "prog"]));
        assert!(asked(&["run", "--jsn", "--json", "prog"]));
        assert!(!asked(&["probe"]));
        assert!(!asked(&["probe", "--", "--json"]));
        assert!(!asked(&["run", "--", "prog", "--json"]));
        assert!(!asked(&["run", "prog", "--json"]));
        assert!(!asked(&["run", "--jsn", "prog", "--json"]));
    }
}
